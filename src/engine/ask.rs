//! Asking the store: a request's plan becomes the store's charges (under the limit that applies
//! to each, the rule's own or one the request brought), a per-request limit still to be looked
//! up is looked up first, and the outcomes come back into the decision, at once (the memory
//! store) or through a future (a store that needs I/O).
//!
//! Functions of the rule set, written here rather than as its methods: the rules know nothing
//! of stores.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use smallvec::SmallVec;

use super::charge;
use super::decision::{Plan, RuleDecision};
use super::ledger::Ledger;
use crate::algorithm::error::ConfigError;
use crate::algorithm::{Algorithm, Limit, Mode, Outcome};
use crate::rules::per_request::{LimitResolver, LimitSource};
use crate::rules::set::RuleSet;
use crate::store::{Charge, Outcomes, Store, StoreError, StoreFuture};

/// A store's answer to a planned decision.
pub(crate) enum Answer {
    /// Decided at once (the memory store): the outcomes are in the decision.
    Now(Result<(), StoreError>),
    /// Deciding needs I/O; [`Plan::answer`](super::decision::Plan::answer) takes the outcomes.
    Later(Pending),
}

/// The outcomes still to come: one charge's (the usual request, through the store's
/// `apply_one`) or a batch's. Kept apart rather than wrapping the single charge's future in a
/// second, boxed one that makes it a batch.
pub(crate) enum Pending {
    One(StoreFuture<Outcome>),
    Batch(StoreFuture<Outcomes>),
}

impl Future for Pending {
    type Output = Result<Outcomes, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Pending::One(one) => Pin::new(one)
                .poll(cx)
                .map(|answer| answer.map(Outcomes::from)),
            Pending::Batch(batch) => Pin::new(batch).poll(cx),
        }
    }
}

/// Lets the store refuse rules it cannot decide exactly (e.g. numbers too large for its
/// arithmetic).
pub(crate) fn check_store(rules: &RuleSet, store: &dyn Store) -> Result<(), ConfigError> {
    rules.rules.iter().try_for_each(|rule| {
        store.validate(&rule.name, rule.algorithm())?;
        if rule.overridable {
            store.validate_overrides(&rule.name)?;
        }
        match &rule.penalty {
            Some(penalty) => store.validate_penalty(&rule.name, penalty),
            None => Ok(()),
        }
    })
}

/// Asks the store for the outcomes of a planned decision: filled in now, or the
/// future of a store that needs I/O (or of a per-request limit still being looked up). A
/// plan of one charge (the usual case) takes the store's single-charge path.
pub(crate) fn ask_store(rules: &Arc<RuleSet>, ledger: &Ledger, plan: &mut Plan) -> Answer {
    let store = ledger.store_ref();
    if plan.has_applied() {
        if let Some(later) = per_request(rules, ledger, plan) {
            return Answer::Later(Pending::Batch(later));
        }
    }
    if let [one] = plan.rules() {
        return match store.decide_one(&charge::charge_of(rules, one)) {
            Ok(result) => Answer::Now(result.map(|outcome| plan.answer_one(outcome))),
            Err(pending) => Answer::Later(Pending::One(pending)),
        };
    }
    let answer = store.as_dyn().apply(&charge::charges(rules, plan));
    match answer.into_ready() {
        Ok(result) => Answer::Now(result.and_then(|outcomes| plan.answer(outcomes))),
        Err(pending) => Answer::Later(Pending::Batch(pending)),
    }
}

/// Per-request limits: a limit the request brought that cannot work is replaced by the
/// rule's own; limits still to be looked up give the future that looks them up, then asks
/// the store.
#[cold]
fn per_request(
    rules: &Arc<RuleSet>,
    ledger: &Ledger,
    plan: &mut Plan,
) -> Option<StoreFuture<Outcomes>> {
    let mut waiting = false;
    for entry in plan.rules_mut() {
        let rule = &rules.rules[entry.index];
        let cost = Some((entry.cost, rule.mode));
        match entry.applied.as_ref().map(|cell| cell.get()) {
            Some(Some(Some(limit))) => {
                if let Err(why) = usable(&rule.name, rule.algorithm(), limit, cost, ledger.store())
                {
                    LimitResolver::unusable(&rule.name, &why);
                    entry.applied = None;
                }
            }
            Some(None) => waiting = true,
            Some(Some(None)) | None => {}
        }
    }
    if !waiting {
        return None;
    }
    // The charges, owned by the future (their cells are shared with the plan).
    let owned: SmallVec<[RuleDecision; 2]> = plan.rules().iter().cloned().collect();
    let (rules, ledger) = (rules.clone(), ledger.clone());
    Some(StoreFuture::pending(async move {
        for entry in &owned {
            let Some(cell) = entry.applied.as_ref().filter(|cell| cell.get().is_none()) else {
                continue;
            };
            let rule = &rules.rules[entry.index];
            let Some(LimitSource::Resolver(resolver)) = &rule.source else {
                continue;
            };
            let store = ledger.store();
            let resolved = resolver
                .resolve(&rule.name, &entry.key, |limit| {
                    usable(&rule.name, rule.algorithm(), limit, None, store)
                })
                .await;
            // A cost the key's limit cannot take falls back too (the rule's own limit takes
            // every cost that reached the store).
            let limit = resolved.filter(|limit| {
                usable(
                    &rule.name,
                    rule.algorithm(),
                    limit,
                    Some((entry.cost, rule.mode)),
                    store,
                )
                .map_err(|why| LimitResolver::unusable(&rule.name, &why))
                .is_ok()
            });
            let _ = cell.set(limit);
        }
        let charges: SmallVec<[Charge<'_>; 2]> = owned
            .iter()
            .map(|entry| charge::charge_of(&rules, entry))
            .collect();
        ledger.store().apply(&charges).await
    }))
}

/// Whether `limit` can decide, in place of the rule's `own` algorithm, a request of `cost` in
/// `mode` on `store`; the reason if not.
pub(crate) fn usable(
    rule: &str,
    own: &Algorithm,
    limit: &Limit,
    cost: Option<(u64, Mode)>,
    store: &dyn Store,
) -> Result<(), String> {
    // A slot is given back by the guard of a concurrency rule only: a rate rule must not take
    // one, nor a concurrency rule charge a quota over time.
    match (own.is_concurrency(), limit.algorithm().is_concurrency()) {
        (true, false) => {
            return Err("a concurrency rule's limit must be `Limit::concurrent`".into())
        }
        (false, true) => {
            return Err("`Limit::concurrent` can only replace a concurrency rule's limit".into())
        }
        _ => {}
    }
    let checked = limit
        .check(rule)
        .and_then(|()| store.validate(rule, limit.algorithm()));
    checked.map_err(|e| e.to_string())?;
    if let Some((cost, mode)) = cost {
        limit
            .algorithm()
            .check_cost(cost, mode)
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}
