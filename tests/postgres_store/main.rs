//! The Postgres store against real `postgres` servers, each started by its test in a temporary
//! directory on a free loopback port (`test-support/src/postgres_server.rs`): the differential tests
//! that keep its answers the memory store's, concurrent instances on one hot key, a crash and a
//! restart of the database, and what it keeps besides counters (blocks, overrides, idle rows).

use tollgate_test_support as support;

mod concurrency;
mod differential;
mod durability;
mod store;
