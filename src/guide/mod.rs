// The guide's chapters: each is a page of markdown beside this file, shown on docs.rs as a module
// of its own. The module exists only for rustdoc (`cfg(doc)`) and for the doc tests
// (`cfg(doctest)`), so every example in a chapter compiles, and runs unless marked, in
// `cargo test --doc --all-features`; nothing here is code a program links.
#![doc = include_str!("index.md")]

pub mod algorithms {
    #![doc = include_str!("algorithms.md")]
}

pub mod rules {
    #![doc = include_str!("rules.md")]
}

pub mod keys {
    #![doc = include_str!("keys.md")]
}

pub mod headers {
    #![doc = include_str!("headers.md")]
}

pub mod per_customer {
    #![doc = include_str!("per_customer.md")]
}

pub mod queueing {
    #![doc = include_str!("queueing.md")]
}

pub mod concurrency {
    #![doc = include_str!("concurrency.md")]
}

pub mod abuse {
    #![doc = include_str!("abuse.md")]
}

pub mod limiter {
    #![doc = include_str!("limiter.md")]
}

#[cfg(feature = "tonic")]
pub mod grpc {
    #![doc = include_str!("grpc.md")]
}

#[cfg(feature = "redis")]
pub mod redis {
    #![doc = include_str!("redis.md")]
}

#[cfg(feature = "postgres")]
pub mod postgres {
    #![doc = include_str!("postgres.md")]
}

#[cfg(feature = "config")]
pub mod config {
    #![doc = include_str!("config.md")]
}

pub mod testing {
    #![doc = include_str!("testing.md")]
}

pub mod cli {
    #![doc = include_str!("cli.md")]
}

pub mod server {
    #![doc = include_str!("server.md")]
}
