//! A request's charges decided exactly: answered by the deny cache when it can, else by one
//! script call (the fast path for a lone charge, the general script for any batch), or a leased
//! slice of the quota (`quota`).

use std::sync::Arc;

use smallvec::SmallVec;

use super::cache::CacheView;
use super::fast::Fast;
use super::leases::Leases;
use super::quota;
use super::record::{Item, Missing, Op, Record};
use super::reply::Applied;
use super::Inner;
use super::RedisStore;
use crate::algorithm::{Micros, Mode};
use crate::store::{Charge, Outcomes, StoreError, StoreFuture};

impl RedisStore {
    /// [`Store::apply`], with `finish` applied to the outcomes inside the one future (a single
    /// charge's caller gets its outcome without a second boxed future around the first).
    pub(super) fn decide<T>(
        &self,
        batch: &[Charge<'_>],
        finish: impl FnOnce(Outcomes) -> Result<T, StoreError> + Send + 'static,
    ) -> StoreFuture<T> {
        let inner = &self.inner;
        if let [charge] = batch {
            // A hot key's rule may lease a slice of its quota (a sharded rule spreads it instead).
            if let Some(lease) = charge.lease {
                if charge.mode == Mode::Charge
                    && charge.cost > 0
                    && !charge.read_overrides
                    && !inner.shards.contains_key(charge.rule.as_str())
                {
                    return quota::charge(self, lease, charge, finish);
                }
            }
        }
        self.decide_exactly(batch, finish)
    }

    /// [`decide`](Self::decide) without quota leases: every charge as Redis decides it (or the
    /// deny cache, which answers exactly as Redis would).
    pub(super) fn decide_exactly<T>(
        &self,
        batch: &[Charge<'_>],
        finish: impl FnOnce(Outcomes) -> Result<T, StoreError> + Send + 'static,
    ) -> StoreFuture<T> {
        let inner = &self.inner;
        let views: SmallVec<[CacheView; 2]> = match &inner.cache {
            Some(cache) => batch
                .iter()
                .map(|charge| CacheView {
                    hash: cache.hash(charge.rule, charge.key),
                    cost: charge.cost,
                    mode: charge.mode,
                    limit_id: cache.limit_id(charge.algorithm),
                    // A penalised rule's denials are cached only once the key is blocked (a
                    // charge denied then is a blocked answer, exact until the block ends): the
                    // offence itself may outlast its block, and a later denial is an offence.
                    // A slot's denial ends when a response does, not with the clock.
                    // An override set through another instance applies on the next decision.
                    cacheable: !inner.shards.contains_key(charge.rule.as_str())
                        && !charge.algorithm.is_concurrency()
                        && !charge.read_overrides
                        && (charge.penalty.is_none()
                            || (charge.mode == Mode::Charge && charge.cost > 0)),
                    penalised: charge.penalty.is_some(),
                })
                .collect(),
            None => SmallVec::new(),
        };
        if let Some(cache) = &inner.cache {
            if let Some(outcomes) = cache.answer(batch, &views, inner.local.now()) {
                return StoreFuture::ready(finish(outcomes));
            }
        }
        if batch.is_empty() {
            return StoreFuture::ready(finish(Outcomes::new()));
        }
        let now = match inner.injected_now() {
            Ok(now) => now,
            Err(error) => return StoreFuture::ready(Err(error)),
        };
        if let [charge] = batch {
            let sharded = inner.shards.contains_key(charge.rule.as_str());
            if let Some(fast) = Fast::new(&inner.prefix, charge, sharded) {
                let packed = fast.packed(charge, now);
                let inner = self.inner.clone();
                return StoreFuture::pending(async move {
                    let (outcome, missing) = inner.timed(inner.fast(&fast, now, packed)).await?;
                    let outcomes = Outcomes::from(outcome);
                    if let Some(cache) = &inner.cache {
                        cache.learn(&views, &outcomes, &[missing], inner.local.now());
                    }
                    finish(outcomes)
                });
            }
        }
        let records: Vec<Record> = batch.iter().map(|c| inner.record(c, false)).collect();
        let inner = self.inner.clone();
        StoreFuture::pending(async move {
            let (mut outcomes, missing, applied) = inner.timed(inner.decide(now, &records)).await?;
            // Only a charge that reads overrides has one applied (`Charge::read_overrides`).
            for (outcome, limit) in outcomes.iter_mut().zip(applied) {
                outcome.overridden = limit.map(Arc::new);
            }
            if outcomes.iter().all(|o| o.verdict.is_admitted()) {
                // The batch was charged: this instance now holds its leases, and renews them.
                for record in &records {
                    for candidate in &record.candidates {
                        if let Some(id) = candidate.lease {
                            Leases::hold(&inner, candidate.name.clone(), id);
                        }
                    }
                }
            }
            if let Some(cache) = &inner.cache {
                cache.learn(&views, &outcomes, &missing, inner.local.now());
            }
            finish(outcomes)
        })
    }
}

impl Inner {
    /// Decides a batch: one script call, or one per slot on a cluster. Beside each outcome:
    /// whether its key holds no state after the call (its answer then does not move with the
    /// clock, which the deny cache must know).
    /// And per record: the override it was charged under, if any.
    pub(super) async fn decide(
        &self,
        now: Option<Micros>,
        records: &[Record],
    ) -> Result<(Outcomes, Missing, Applied), StoreError> {
        let groups = if self.is_cluster() {
            self.groups(records)
        } else {
            Vec::new()
        };
        if groups.len() <= 1 {
            let items: SmallVec<[Item<'_>; 2]> = records.iter().map(Item::apply).collect();
            let (results, applied) = self.call(Op::Apply, now, &items).await?;
            let (outcomes, missing) = results
                .into_iter()
                .map(|(o, taken)| (o, taken.missing))
                .unzip();
            return Ok((outcomes, missing, applied));
        }
        self.cross_slot(now, records, &groups).await
    }
}
