//! One `ShouldRateLimit` call: the request checked, its descriptors matched, every counted limit
//! charged in one atomic step of the store, and the answer.
//!
//! A request is `INVALID_ARGUMENT` when it is malformed in itself, whatever the configuration:
//! an empty domain, no descriptors, more than [`MAX_DESCRIPTORS`] of them, a descriptor without
//! entries or with more than [`MAX_ENTRIES`], an empty key, a domain, key or value that is not
//! UTF-8, a descriptor `limit` whose unit the protocol does not name. Everything else is
//! answered: an unknown domain or descriptor is OK with no limit, a cost above what a limit can
//! ever hold is OVER_LIMIT (and nothing is charged).
//!
//! Quota descriptors (`quota_mode`, or every one under the global quota mode) do not refuse the
//! request alone: it is OVER_LIMIT when an enforced limit is over, or when every quota descriptor
//! is. The enforced limits and the quota limits with room are charged in one atomic step; a quota
//! limit without room is reported OVER_LIMIT and not charged, and the step is taken again
//! without it (never more often than there are quota limits).
//!
//! Shadow limits are charged apart from the others, each on its own, whatever the enforced ones
//! decide: they count what they would have done, and never refuse anything. A descriptor with
//! `is_negative_hits` gives its cost back to its limit's key (never below an empty count), is
//! answered OK with what the key then has left, and refuses nothing, as the reference answers it.

use std::borrow::Cow;
use std::time::Duration;

use smallvec::SmallVec;

use tollgate::algorithm::Outcome;
use tollgate::{LimitError, Limiter};
use tonic::Status;

use super::protocol::{self, code, DescriptorStatus, RateLimit, RateLimitRequest};
use super::{Answering, Current};
use crate::load::StoreFailure;
use crate::plan::{Descriptor, PerDescriptor, RequestCharges};
use crate::tree::{Entry, Headers, LimitKind, LimitSpec, Reached};
use crate::unit::Unit;

/// The most descriptors one request may carry (Envoy sends a handful; each costs a key).
pub const MAX_DESCRIPTORS: usize = 1024;
/// The most entries one descriptor may have (the deepest tree of a real configuration is a few).
pub const MAX_ENTRIES: usize = 64;

/// What one descriptor was answered, for the answer and the statistics.
#[derive(Debug)]
pub(crate) struct Judged<'t> {
    /// The limit that applied, if any: the tree's, or one the descriptor brought.
    pub(crate) limit: Option<Reached<'t>>,
    /// The units the descriptor asked for.
    pub(crate) cost: u64,
    /// Over the limit (for a shadow limit: would have been).
    pub(crate) over: bool,
    /// Over because its cost is more than the limit can ever hold: no wait lets it pass, so its
    /// answer carries no `Retry-After`, and its count is the key's real one (nothing was charged).
    pub(crate) unfit: bool,
    /// Whether more than the near-limit ratio of the limit is used after this call (the
    /// reference's `near_limit`: 0.8 unless set).
    pub(crate) near: bool,
    /// What the limit's store said, when it was asked.
    pub(crate) outcome: Option<Outcome>,
    /// The statistics key: the configured level's, or the values' with `detailed_metric` or
    /// `value_to_metric`.
    pub(crate) stat_key: Cow<'t, str>,
    /// A quota descriptor: over its limit, it alone does not refuse the request.
    pub(crate) quota: bool,
    /// Its cost was given back (`is_negative_hits`).
    pub(crate) negative: bool,
}

impl Judged<'_> {
    /// Whether the descriptor is answered OVER_LIMIT.
    pub(crate) fn rejected(&self) -> bool {
        self.over && self.limit.as_ref().is_some_and(|l| !l.shadow)
    }
}

/// A request's answer, before it is written in the protocol's terms.
#[derive(Debug)]
pub(crate) struct Answer<'t> {
    pub(crate) domain: &'t str,
    /// No configuration has the domain.
    pub(crate) unknown_domain: bool,
    /// The fields the domain's answers carry.
    pub(crate) headers: Headers,
    pub(crate) judged: Vec<Judged<'t>>,
    /// Whether the store failed (its descriptors were answered by the failure policy).
    pub(crate) store_failed: bool,
}

/// Why a request got no answer.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The request is malformed: `INVALID_ARGUMENT`.
    Invalid(Status),
    /// The limiter refused a charge the trees of its own configuration asked for (a rule they
    /// name that it lacks): a fault of the server's, never of the request.
    Internal(LimitError),
}

impl Answer<'_> {
    /// Whether the request is over the limit: an enforced limit that is not a quota limit is,
    /// or every quota descriptor is (the reference's rule).
    pub(crate) fn over_limit(&self) -> bool {
        let enforced = self.judged.iter().any(|j| !j.quota && j.rejected());
        let mut quota = self.judged.iter().filter(|j| j.quota).peekable();
        enforced || (quota.peek().is_some() && quota.all(Judged::rejected))
    }
}

/// Checks `request` and returns its domain and descriptors.
fn validate(request: &RateLimitRequest) -> Result<(&str, PerDescriptor<Descriptor<'_>>), Refusal> {
    let invalid = |message: String| Err(Refusal::Invalid(Status::invalid_argument(message)));
    let Ok(domain) = std::str::from_utf8(&request.domain) else {
        return invalid("domain: not UTF-8".into());
    };
    if domain.is_empty() {
        return invalid("domain: empty (every request names its domain)".into());
    }
    if request.descriptors.is_empty() {
        return invalid("descriptors: none (a request carries at least one)".into());
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return invalid(format!(
            "descriptors: {} in one request, at most {MAX_DESCRIPTORS}",
            request.descriptors.len()
        ));
    }
    let request_cost = u64::from(request.hits_addend.max(1));
    let mut descriptors = PerDescriptor::with_capacity(request.descriptors.len());
    for (i, descriptor) in request.descriptors.iter().enumerate() {
        if descriptor.entries.is_empty() {
            return invalid(format!("descriptors[{i}]: no entries"));
        }
        if descriptor.entries.len() > MAX_ENTRIES {
            return invalid(format!(
                "descriptors[{i}]: {} entries, at most {MAX_ENTRIES}",
                descriptor.entries.len()
            ));
        }
        let mut entries = SmallVec::with_capacity(descriptor.entries.len());
        for (j, entry) in descriptor.entries.iter().enumerate() {
            let at = || format!("descriptors[{i}].entries[{j}]");
            let Ok(key) = std::str::from_utf8(&entry.key) else {
                return invalid(format!("{}.key: not UTF-8", at()));
            };
            if key.is_empty() {
                return invalid(format!("{}.key: empty", at()));
            }
            let Ok(value) = std::str::from_utf8(&entry.value) else {
                return invalid(format!("{}.value: not UTF-8", at()));
            };
            entries.push(Entry { key, value });
        }
        let cost = descriptor
            .hits_addend
            .map_or(request_cost, |addend| addend.value);
        let limit = match descriptor.limit {
            Some(limit) => match Unit::from_number(limit.unit) {
                Some(unit) => Some((limit.requests_per_unit, unit)),
                None => {
                    return invalid(format!(
                        "descriptors[{i}].limit.unit: {} is no unit (1 second, 2 minute, 3 hour, \
                         4 day, 5 month, 6 year, 7 week)",
                        limit.unit
                    ))
                }
            },
            None => None,
        };
        descriptors.push(Descriptor {
            entries,
            cost,
            limit,
            negative: descriptor.is_negative_hits,
        });
    }
    Ok((domain, descriptors))
}

/// Decides `request` under the configuration in force, `current`: its domains' trees, its
/// limiter.
pub(crate) async fn decide<'t>(
    current: &'t Current,
    answering: &Answering,
    request: &'t RateLimitRequest,
) -> Result<Answer<'t>, Refusal> {
    let limiter = &current.limiter;
    // The request read, matched and planned in a scope of its own, the plan on the heap: the
    // descriptors are not kept across the store's awaits, and the call's future, allocated on
    // every call, stays within the sizes the allocator keeps at hand per thread (glibc's: up
    // to 1 KiB; a larger block costs hundreds of instructions per call, measured in
    // BENCHMARKS).
    let (domain_name, domain, plan, mut judged) = {
        let (domain_name, descriptors) = validate(request)?;
        let domain = current.domains.get(domain_name);
        let mut plan = Box::new(RequestCharges::new(
            domain,
            &descriptors,
            answering.quota_mode,
        ));
        let judged: Vec<Judged<'t>> = descriptors
            .iter()
            .zip(&mut plan.matched)
            .enumerate()
            .map(|(i, (d, m))| Judged {
                limit: None,
                stat_key: m.as_mut().map_or(Cow::Borrowed(""), |m| {
                    match (&m.limit, m.stat_key.take()) {
                        (_, Some(values)) => Cow::Owned(values),
                        (Reached::Configured(limit), None) => stat_key(limit, d),
                        (Reached::FromRequest(limit), None) => Cow::Owned(limit.stat_key.clone()),
                    }
                }),
                cost: d.cost,
                over: plan.over_regardless[i],
                unfit: plan.over_regardless[i]
                    && m.as_ref()
                        .is_some_and(|m| matches!(m.limit.kind, LimitKind::Rule(_))),
                near: false,
                outcome: None,
                quota: plan.quota[i],
                negative: d.negative,
            })
            .collect();
        (domain_name, domain, plan, judged)
    };

    // Costs given back first, each on its own: what a key then has left is what the charges
    // after it see. This step and the shadow limits' are rare, and their futures larger than
    // the usual request's: boxed only when taken, they leave the call's future (allocated on
    // every call) small.
    let mut store_failed = false;
    if plan.refunds().next().is_some() {
        store_failed |= Box::pin(refund(limiter, &plan, &mut judged)).await?;
    }
    // The failure policy "open" answered the enforced charges: their descriptors get no limit.
    let mut answered_open = false;
    // The enforced limits and the quota limits with room, all in one atomic step; a request
    // that cannot pass is only looked at, nothing charged.
    if plan.charge_count() > 0 {
        match charge(limiter, &plan, &mut judged).await {
            Ok(()) => {
                for i in 0..judged.len() {
                    let Some(c) = plan.slots[i] else { continue };
                    let first = plan.first_of(c);
                    if i != first {
                        judged[i].outcome = judged[first].outcome.clone();
                    }
                    let j = &mut judged[i];
                    if let Some(outcome) = &j.outcome {
                        j.over |= !outcome.is_allowed();
                    }
                }
            }
            Err(LimitError::Store(error)) => {
                // Counted per call (`tollgate_server_store_errors_total`); told by the store's
                // own bounded warnings (a line per 10 s with a count, the breaker's opening and
                // closing), never a line per call.
                tracing::debug!(%error, policy = ?current.on_store_failure, "store failed");
                store_failed = true;
                match current.on_store_failure {
                    StoreFailure::Open => answered_open = true,
                    StoreFailure::Closed => {
                        for (j, slot) in judged.iter_mut().zip(&plan.slots) {
                            j.over |= slot.is_some();
                        }
                    }
                }
            }
            Err(error) => return Err(Refusal::Internal(error)),
        }
    }

    if plan.shadow().next().is_some() {
        store_failed |= Box::pin(shadow(limiter, &plan, &mut judged)).await;
    }
    for ((j, m), slot) in judged.iter_mut().zip(plan.matched).zip(&plan.slots) {
        match m {
            // The failure policy "open" answers with no limit.
            Some(_) if answered_open && slot.is_some() => j.stat_key = Cow::Borrowed(""),
            Some(m) => j.limit = Some(m.limit),
            None => {}
        }
    }
    for j in &mut judged {
        if let Some(outcome) = &j.outcome {
            j.near = !j.over && !j.negative && near(outcome, answering.near_limit_ratio);
        }
    }
    Ok(Answer {
        domain: domain_name,
        unknown_domain: domain.is_none(),
        headers: domain.map(|domain| domain.headers).unwrap_or_default(),
        judged,
        store_failed,
    })
}

/// Gives back the costs of the descriptors with `is_negative_hits`, each on its own, and reads
/// what their keys then have left; whether the store failed.
async fn refund(
    limiter: &Limiter,
    plan: &RequestCharges<'_>,
    judged: &mut [Judged<'_>],
) -> Result<bool, Refusal> {
    let mut store_failed = false;
    for (i, rule, key, limit) in plan.refunds() {
        let j = &mut judged[i];
        let refunded = match limiter.refund(rule, key, j.cost).await {
            Ok(()) => look(limiter, rule, key, limit).await,
            Err(error) => Err(error),
        };
        match refunded {
            Ok(outcome) => j.outcome = Some(outcome),
            Err(LimitError::Store(error)) => {
                store_failed = true;
                tracing::debug!(%error, "refund: store failed");
            }
            Err(error) => return Err(Refusal::Internal(error)),
        }
    }
    Ok(store_failed)
}

/// Charges the shadow limits, each on its own, never blocking anything (a descriptor already
/// over is only looked at); whether the store failed.
async fn shadow(limiter: &Limiter, plan: &RequestCharges<'_>, judged: &mut [Judged<'_>]) -> bool {
    let mut store_failed = false;
    for (i, rule, key, limit) in plan.shadow() {
        let j = &mut judged[i];
        let cost = if j.over { 0 } else { j.cost };
        let result = if j.over {
            limiter.check_all_under([(rule, key, cost, limit)]).await
        } else {
            limiter.charge_all_under([(rule, key, cost, limit)]).await
        };
        match result {
            Ok(decision) => {
                let outcome = decision.rules()[0].outcome.clone();
                j.over |= !outcome.is_allowed();
                j.outcome = Some(outcome);
            }
            Err(error) => {
                store_failed = true;
                tracing::debug!(%error, "shadow limit: store failed");
            }
        }
    }
    store_failed
}

/// The reference's near-limit test: more than `ratio` of the limit used after the call
/// (`floor(limit × ratio)`, in its single precision).
fn near(outcome: &Outcome, ratio: f32) -> bool {
    let used = outcome.limit.saturating_sub(outcome.remaining);
    let threshold = (outcome.limit as f32 * ratio).floor();
    used as f32 > threshold
}

/// What `key` has left under `rule` (and the limit a request brought, if any), with nothing
/// charged.
async fn look(
    limiter: &Limiter,
    rule: &str,
    key: &[u8],
    limit: Option<tollgate::Limit>,
) -> Result<Outcome, LimitError> {
    let decision = limiter.check_all_under([(rule, key, 0, limit)]).await?;
    Ok(decision.rules()[0].outcome.clone())
}

/// Decides the plan's charges; each charge's outcome is kept in the answer of its first
/// descriptor ([`RequestCharges::first_of`]), for the charges that were asked about.
///
/// All or nothing for the limits that are not quota limits; of the quota limits, those with
/// room are charged with them, and the request needs at least one (unless a quota descriptor
/// passes without a count: no limit, or a shadow one). Each attempt is one atomic step; one
/// that a quota limit without room denied is taken again without it.
async fn charge(
    limiter: &Limiter,
    plan: &RequestCharges<'_>,
    judged: &mut [Judged<'_>],
) -> Result<(), LimitError> {
    // Charge indices are below `MAX_DESCRIPTORS`: kept as `u16`, so that the lists the
    // future holds stay small.
    let count = u16::try_from(plan.charge_count()).unwrap_or(u16::MAX);
    let quota = |c: u16| plan.quota[plan.first_of(c.into())];
    // Without quota limits (the usual request), one step decides, all or nothing; a request
    // that cannot pass is only looked at, nothing charged.
    if !(0..count).any(quota) {
        let look = plan.cannot_pass();
        let decision = step(limiter, plan, 0..count, look).await?;
        read(plan, judged, 0..count, &decision);
        return Ok(());
    }
    // Whether charge `c` was allowed, once asked about.
    fn allowed(plan: &RequestCharges<'_>, judged: &[Judged<'_>], c: u16) -> Option<bool> {
        judged[plan.first_of(c.into())]
            .outcome
            .as_ref()
            .map(Outcome::is_allowed)
    }
    // Over whatever is counted: any descriptor of the charge is.
    let over_regardless = |c: u16| {
        plan.slots
            .iter()
            .position(|s| *s == Some(c.into()))
            .is_some_and(|i| plan.over_regardless[i])
    };
    // Quota descriptors that pass whatever is counted: no limit, a shadow limit, or one
    // refunded.
    let quota_free = (0..plan.matched.len())
        .any(|i| plan.quota[i] && plan.slots[i].is_none() && !plan.over_regardless[i]);
    let quota_needed = !quota_free;
    let mut with_room: SmallVec<[u16; 4]> = (0..count)
        .filter(|&c| quota(c) && !over_regardless(c))
        .collect();
    if plan.cannot_pass() || (quota_needed && with_room.is_empty()) {
        let decision = step(limiter, plan, 0..count, true).await?;
        read(plan, judged, 0..count, &decision);
        return Ok(());
    }
    loop {
        let picked: SmallVec<[u16; 4]> = (0..count)
            .filter(|&c| !quota(c))
            .chain(with_room.iter().copied())
            .collect();
        if picked.is_empty() {
            return Ok(());
        }
        let decision = step(limiter, plan, picked.iter().copied(), false).await?;
        read(plan, judged, picked.iter().copied(), &decision);
        if decision.is_allowed() {
            return Ok(());
        }
        let enforced_over = (0..count)
            .filter(|&c| !quota(c))
            .any(|c| allowed(plan, judged, c) == Some(false));
        if enforced_over {
            return Ok(());
        }
        with_room.retain(|c| allowed(plan, judged, *c) == Some(true));
        if quota_needed && with_room.is_empty() {
            // Every quota limit is over: the request is, and nothing was charged.
            return Ok(());
        }
    }
}

/// Keeps the outcomes of a step over the charges `picked`, each in its first descriptor's answer.
fn read(
    plan: &RequestCharges<'_>,
    judged: &mut [Judged<'_>],
    picked: impl Iterator<Item = u16>,
    decision: &tollgate::Decision,
) {
    for (c, rule) in picked.zip(decision.rules()) {
        judged[plan.first_of(c.into())].outcome = Some(rule.outcome.clone());
    }
}

/// One atomic step of the limiter over the plan's charges `picked`: charged, or only looked at.
/// The charges are handed to the limiter as it reads them, not gathered first: a gathered batch
/// is a few hundred bytes copied into the step's future.
async fn step(
    limiter: &Limiter,
    plan: &RequestCharges<'_>,
    picked: impl Iterator<Item = u16>,
    look: bool,
) -> Result<tollgate::Decision, LimitError> {
    let batch = picked.filter_map(|c| {
        let charge = plan.charge(c.into())?;
        let cost = if look { 0 } else { charge.cost };
        Some((charge.rule, charge.key, cost, charge.limit()))
    });
    if look {
        limiter.check_all_under(batch).await
    } else {
        limiter.charge_all_under(batch).await
    }
}

/// The statistics key of `descriptor` under `limit`.
fn stat_key<'t>(limit: &'t LimitSpec, descriptor: &Descriptor<'_>) -> Cow<'t, str> {
    if !limit.detailed_metric {
        return Cow::Borrowed(&limit.stat_key);
    }
    // Values are cut so one statistic's name stays small; the number of statistics is bounded
    // by the recorder.
    descriptor
        .entries
        .iter()
        .map(|e| {
            let value: String = e.value.chars().take(64).collect();
            format!("{}_{value}", e.key)
        })
        .collect::<Vec<_>>()
        .join(".")
        .into()
}

/// The answer in the protocol's terms (without headers).
pub(crate) fn statuses(answer: &Answer<'_>) -> Vec<DescriptorStatus> {
    answer
        .judged
        .iter()
        .map(|j| {
            let Some(limit) = &j.limit else {
                return DescriptorStatus {
                    code: code::OK,
                    ..Default::default()
                };
            };
            if limit.kind == LimitKind::Unlimited {
                return DescriptorStatus {
                    code: code::OK,
                    limit_remaining: u32::MAX,
                    ..Default::default()
                };
            }
            let enforced_over = j.over && !limit.shadow;
            let outcome = j.outcome.as_ref();
            let remaining = if j.over && !j.unfit {
                0
            } else {
                outcome.map_or(0, |o| o.remaining)
            };
            let reset = match outcome {
                Some(o) if !o.full_in.is_zero() => o.full_in,
                // A full key, or no store asked: the limit's own reset, its unit's window end
                // (a cost that can never fit is told when the window renews, not "now").
                _ => until_window_end(limit),
            };
            DescriptorStatus {
                code: if enforced_over {
                    code::OVER_LIMIT
                } else {
                    code::OK
                },
                current_limit: Some(RateLimit {
                    requests_per_unit: limit.requests_per_unit,
                    unit: limit.unit as i32,
                    name: limit.name.clone(),
                }),
                limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
                duration_until_reset: Some(protocol::Duration::from(reset)),
            }
        })
        .collect()
}

/// For a limit no store was asked about (`requests_per_unit: 0`): the end of the unit's
/// aligned window, as the reference reports it.
pub(crate) fn until_window_end(limit: &LimitSpec) -> Duration {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let unit = limit.unit.duration().as_secs().max(1);
    Duration::from_secs(unit - now % unit)
}
