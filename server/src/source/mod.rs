//! Where a configuration comes from, besides the files [`crate::load`] reads: each source
//! yields loaded configurations ([`crate::load::Loaded`]), nothing else; the service swaps
//! them in force.
//!
//! - [`xds`]: pushed by an xDS management server (`CONFIG_TYPE=GRPC_XDS_SOTW`).

pub mod xds;
