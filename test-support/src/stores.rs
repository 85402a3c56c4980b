//! Test stores standing in for networked ones: one that always fails, one that answers late.

use std::time::Duration;

use tollgate::store::Store;

/// A store that fails every call: stands in for an unreachable backend.
#[derive(Debug)]
pub struct Broken;

impl Store for Broken {
    fn apply(
        &self,
        _: &[tollgate::store::Charge<'_>],
    ) -> tollgate::store::StoreFuture<tollgate::store::Outcomes> {
        tollgate::store::StoreFuture::ready(Err(down()))
    }
    fn refund(&self, _: &tollgate::store::Charge<'_>) -> tollgate::store::StoreFuture<()> {
        tollgate::store::StoreFuture::ready(Err(down()))
    }
    fn reset(
        &self,
        _: &str,
        _: &tollgate::algorithm::Algorithm,
        _: &[u8],
    ) -> tollgate::store::StoreFuture<()> {
        tollgate::store::StoreFuture::ready(Err(down()))
    }
}

/// The error [`Broken`] answers: the store is unreachable.
pub fn down() -> tollgate::store::StoreError {
    tollgate::store::StoreError::new(
        tollgate::store::StoreErrorKind::Unavailable,
        "connection refused",
    )
}

/// A store that answers after a delay, like a networked one: exercises the layer's async path.
#[derive(Debug, Clone, Default)]
pub struct Slow(pub tollgate::MemoryStore);

impl Store for Slow {
    fn apply(
        &self,
        batch: &[tollgate::store::Charge<'_>],
    ) -> tollgate::store::StoreFuture<tollgate::store::Outcomes> {
        let answer = self.0.apply(batch);
        tollgate::store::StoreFuture::pending(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            answer.await
        })
    }
    fn refund(&self, charge: &tollgate::store::Charge<'_>) -> tollgate::store::StoreFuture<()> {
        self.0.refund(charge)
    }
    fn reset(
        &self,
        rule: &str,
        algorithm: &tollgate::algorithm::Algorithm,
        key: &[u8],
    ) -> tollgate::store::StoreFuture<()> {
        self.0.reset(rule, algorithm, key)
    }
}
