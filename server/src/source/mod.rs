//! Where a configuration comes from: files ([`crate::load`] reads them) or an xDS management
//! server ([`xds`], `CONFIG_TYPE=GRPC_XDS_SOTW`). Each source yields loaded configurations
//! ([`Loaded`]), nothing else; the service swaps them in force.

pub mod xds;

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::load::{self, Error, Loaded, RuntimeDir};

/// Where a server's configuration comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// `--config PATH`: a reference file, a directory of them, or tollgate's own file.
    Path(PathBuf),
    /// The reference's variables: its runtime directory, and the store they name.
    Runtime {
        /// The directory and how it is read.
        dir: RuntimeDir,
        /// The library's `[store]` table.
        store: Value,
    },
    /// The reference's `CONFIG_TYPE=GRPC_XDS_SOTW`: pushed by an xDS management server (see
    /// [`xds`]), each push a whole configuration, never read from a file.
    Xds(Box<xds::XdsSettings>),
}

impl Source {
    /// The configuration, read and checked whole.
    pub fn load(&self) -> Result<Loaded, Error> {
        match self {
            Source::Path(path) => load::load(path),
            Source::Runtime { dir, store } => load::load_runtime(dir, store),
            Source::Xds(xds) => Err(Error(format!(
                "{}: the configuration is pushed by the xDS management server, not read",
                xds.server_url
            ))),
        }
    }

    /// The files read now, with their content: what a reload compares (none for xDS).
    pub fn fingerprint(&self) -> Vec<(PathBuf, Vec<u8>)> {
        match self {
            Source::Path(path) => load::fingerprint(path),
            Source::Runtime { dir, .. } => load::runtime_fingerprint(dir),
            Source::Xds(_) => Vec::new(),
        }
    }

    /// The file or directory errors are about (for xDS, the management server's address).
    pub fn path(&self) -> &Path {
        match self {
            Source::Path(path) => path,
            Source::Runtime { dir, .. } => &dir.dir,
            Source::Xds(xds) => Path::new(&xds.server_url),
        }
    }

    /// The library's `[store]` table the reference's variables name, if this source has one.
    pub fn store(&self) -> Option<&Value> {
        match self {
            Source::Path(_) => None,
            Source::Runtime { store, .. } => Some(store),
            Source::Xds(xds) => Some(&xds.store),
        }
    }
}
