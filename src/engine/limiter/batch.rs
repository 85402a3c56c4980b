//! The batch API: one key under each of several rules, charged or checked all or nothing.

use crate::engine::ask;
use crate::engine::charge;
use std::sync::Arc;

use smallvec::SmallVec;

use super::{unknown, LimitError, Limiter, Reservation};
use crate::algorithm::{Limit, Mode};
use crate::engine::decision::Decision;
use crate::key::KeyValue;
use crate::store::Charge;

impl Limiter {
    /// Charges several rules at once, all or nothing, as the middleware charges the rules of a
    /// request: each `(rule, key, cost)` is admitted, or none is charged, and the
    /// [`Decision`] holds every rule's outcome (a denial's `retry_after` is the longest). A batch
    /// that names no rule is [`LimitError::EmptyBatch`], for this call and the other two batch
    /// calls alike.
    ///
    /// ```
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::{Limit, Limiter, Rule};
    ///
    /// let limiter = Limiter::builder()
    ///     .rule(Rule::new("per-user", Limit::per_minute(10)))
    ///     .rule(Rule::new("global", Limit::per_minute(15)))
    ///     .build()?;
    /// let first = limiter.charge_all([("per-user", "alice", 10), ("global", "", 10)]).await?;
    /// assert!(first.is_allowed());
    /// // Bob fits his own limit but not the global one: neither is charged.
    /// let bob = limiter.charge_all([("per-user", "bob", 6), ("global", "", 6)]).await?;
    /// assert!(!bob.is_allowed());
    /// assert_eq!(limiter.check("per-user", "bob", 0).await?.remaining, 10);
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn charge_all<R, K>(
        &self,
        charges: impl IntoIterator<Item = (R, K, u64)>,
    ) -> Result<Decision, LimitError>
    where
        R: AsRef<str>,
        K: AsRef<[u8]>,
    {
        let charges = charges.into_iter().map(|(r, k, c)| (r, k, c, None));
        self.many(charges, Some(Mode::Charge)).await
    }

    /// The decision [`charge_all`](Self::charge_all) would make, with nothing charged.
    pub async fn check_all<R, K>(
        &self,
        charges: impl IntoIterator<Item = (R, K, u64)>,
    ) -> Result<Decision, LimitError>
    where
        R: AsRef<str>,
        K: AsRef<[u8]>,
    {
        let charges = charges.into_iter().map(|(r, k, c)| (r, k, c, None));
        self.many(charges, Some(Mode::Check)).await
    }

    /// [`charge_all`](Self::charge_all), each charge decided under the limit given with it
    /// (`None`: the rule's own), as a rule whose limit comes from the request is decided
    /// ([`Rule::limit_from`](crate::Rule::limit_from)): the key's state is the rule's, read under
    /// the limit given (a window keeps its count and compares it with the limit). For
    /// services whose callers bring a limit with each request, e.g. Envoy's descriptor `limit`
    /// override: one rule per period, the number per request. A limit the rule cannot use is
    /// [`LimitError::BadLimit`], nothing charged.
    ///
    /// ```
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tollgate::{Limit, Limiter, Rule};
    ///
    /// let day = Duration::from_secs(86_400);
    /// let limiter = Limiter::builder()
    ///     .rule(Rule::new("per-day", Limit::fixed_window(u64::from(u32::MAX), day)))
    ///     .build()?;
    /// let ten = Some(Limit::fixed_window(10, day));
    /// let first = limiter.charge_all_under([("per-day", "acme", 8, ten.clone())]).await?;
    /// assert_eq!(first.rules()[0].outcome.remaining, 2);
    /// // The same key under a limit of 20 keeps its count of 8.
    /// let twenty = Some(Limit::fixed_window(20, day));
    /// let next = limiter.charge_all_under([("per-day", "acme", 1, twenty)]).await?;
    /// assert_eq!(next.rules()[0].outcome.remaining, 11);
    /// // A concurrency limit cannot decide a rate rule's charge.
    /// let slots = Some(Limit::concurrent(2));
    /// let refused = limiter.charge_all_under([("per-day", "acme", 1, slots)]).await;
    /// assert!(matches!(refused, Err(tollgate::LimitError::BadLimit { .. })));
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn charge_all_under<R, K>(
        &self,
        charges: impl IntoIterator<Item = (R, K, u64, Option<Limit>)>,
    ) -> Result<Decision, LimitError>
    where
        R: AsRef<str>,
        K: AsRef<[u8]>,
    {
        self.many(charges, Some(Mode::Charge)).await
    }

    /// The decision [`charge_all_under`](Self::charge_all_under) would make, with nothing
    /// charged.
    pub async fn check_all_under<R, K>(
        &self,
        charges: impl IntoIterator<Item = (R, K, u64, Option<Limit>)>,
    ) -> Result<Decision, LimitError>
    where
        R: AsRef<str>,
        K: AsRef<[u8]>,
    {
        self.many(charges, Some(Mode::Check)).await
    }

    /// Charges several rules at once, all or nothing, each in its own mode, exactly as the
    /// middleware does: a queued rule reserves within its queue's bound, any other rule charges
    /// only what fits now. The reservation's [`wait`](Reservation::wait) is the longest of the
    /// rules'; [`cancel`](Reservation::cancel) gives every rule its units back.
    pub async fn reserve_all<R, K>(
        &self,
        charges: impl IntoIterator<Item = (R, K, u64)>,
    ) -> Result<Reservation, LimitError>
    where
        R: AsRef<str>,
        K: AsRef<[u8]>,
    {
        let charges = charges.into_iter().map(|(r, k, c)| (r, k, c, None));
        let decision = self.many(charges, None).await?;
        Ok(Reservation::new(decision, self))
    }

    /// Decides a batch in one atomic step of the store; a `mode` of `None` uses each rule's own,
    /// a limit of `None` each rule's own.
    pub(super) async fn many<R, K>(
        &self,
        charges: impl IntoIterator<Item = (R, K, u64, Option<Limit>)>,
        mode: Option<Mode>,
    ) -> Result<Decision, LimitError>
    where
        R: AsRef<str>,
        K: AsRef<[u8]>,
    {
        // The plan is filled where the answer lies: the decision returned is the plan, answered.
        let mut decision = Decision::default();
        let plan = &mut decision.plan;
        // The store's future is all that is held across the await (with the plan): what builds
        // it lives in this block, out of the caller's future, and the future is awaited as the
        // block's value (a named one would be held twice, as itself and as the awaited one).
        let outcomes = {
            let mut modes: SmallVec<[Mode; 2]> = SmallVec::new();
            let rules = self.rules();
            for (rule, key, cost, limit) in charges {
                let rule = rule.as_ref();
                let (index, compiled) = rules.find(rule).ok_or_else(|| unknown(rule))?;
                let mode = mode.unwrap_or(compiled.mode);
                if let Some(limit) = &limit {
                    ask::usable(rule, compiled.algorithm(), limit, None, self.store()).map_err(
                        |reason| LimitError::BadLimit {
                            rule: rule.to_owned(),
                            reason,
                        },
                    )?;
                }
                let algorithm = limit
                    .as_ref()
                    .map_or(compiled.algorithm(), Limit::algorithm);
                algorithm
                    .check_cost(cost, mode)
                    .map_err(|error| LimitError::CostTooLarge {
                        rule: rule.to_owned(),
                        error,
                    })?;
                let key = KeyValue::new(key.as_ref());
                // One key charged twice in one atomic step would be judged twice against the
                // same balance.
                if plan
                    .rules()
                    .iter()
                    .any(|r| r.index == index && r.key == key)
                {
                    return Err(LimitError::Repeated(rule.to_owned()));
                }
                let applied = limit.map(|limit| Arc::new(std::sync::OnceLock::from(Some(limit))));
                plan.add_charge(index, compiled.name.clone(), key, cost, applied);
                modes.push(mode);
            }
            if plan.rules().is_empty() {
                return Err(LimitError::EmptyBatch);
            }
            let batch: SmallVec<[Charge<'_>; 2]> = plan
                .rules()
                .iter()
                .zip(&modes)
                // A key's override holds here as in the key API and the layer (tollgate-server
                // charges every call so), over a limit given with the charge too, as over a
                // request's (`RuleDecision::limit`).
                .map(|(r, &mode)| Charge {
                    mode,
                    ..charge::charge_of(&rules, r)
                })
                .collect();
            self.store().apply(&batch)
        }
        .await?;
        plan.answer(outcomes)?;
        Ok(decision)
    }
}
