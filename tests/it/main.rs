//! The integration tests that run in one process: the layer in axum, hyper and tonic servers, the
//! configuration file, the examples, queue mode, per-request limits, penalties, outcomes, the
//! fuzz corpora and the soak. One binary, so the test command links tokio, hyper, tonic and axum
//! once for all of them (Redis-backed cases among them start their own `redis-server`).

use tollgate_test_support as support;

/// The names of the rules `limiter` has in force, in order: what most assertions about a
/// reload compare.
fn rule_names(limiter: &tollgate::Limiter) -> Vec<String> {
    limiter
        .rules_in_force()
        .into_iter()
        .map(|rule| rule.name)
        .collect()
}

mod axum;
mod concurrency;
mod config;
mod decide;
mod docs;
mod examples;
mod fuzz_corpus;
mod grpc;
mod hyper;
mod middleware;
mod operations;
mod outcomes;
mod overrides;
mod penalties;
mod per_request;
mod queue;
mod queue_example;
mod soak;
mod top_offenders;
