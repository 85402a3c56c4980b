//! One `ShouldRateLimit` call: the request checked, its descriptors matched, every counted limit
//! charged in one atomic step of the store, and the answer.
//!
//! A request is `INVALID_ARGUMENT` when it is malformed in itself, whatever the configuration:
//! an empty domain, no descriptors, more than [`MAX_DESCRIPTORS`] of them, a descriptor without
//! entries or with more than [`MAX_ENTRIES`], an empty key, a domain, key or value that is not
//! UTF-8, `is_negative_hits` (not supported). Everything else is answered: an unknown domain or descriptor is OK with no limit, a
//! cost above what a limit can ever hold is OVER_LIMIT (and nothing is charged).
//!
//! Shadow limits are charged apart from the others, each on its own, whatever the enforced ones
//! decide: they count what they would have done, and never refuse anything.

use std::borrow::Cow;
use std::time::Duration;

use smallvec::SmallVec;

use tollgate::algorithm::Outcome;
use tollgate::{LimitError, Limiter};
use tonic::Status;

use super::protocol::{self, code, DescriptorStatus, RateLimit, RateLimitRequest};
use crate::load::StoreFailure;
use crate::plan::{Descriptor, PerDescriptor, Plan};
use crate::tree::{Domains, Entry, Headers, LimitKind, LimitSpec};

/// The most descriptors one request may carry (Envoy sends a handful; each costs a key).
pub const MAX_DESCRIPTORS: usize = 1024;
/// The most entries one descriptor may have (the deepest tree of a real configuration is a few).
pub const MAX_ENTRIES: usize = 64;

/// What one descriptor was answered, for the answer and the statistics.
#[derive(Debug)]
pub(crate) struct Judged<'t> {
    /// The limit that applied, if any.
    pub(crate) limit: Option<&'t LimitSpec>,
    /// The units the descriptor asked for.
    pub(crate) cost: u64,
    /// Over the limit (for a shadow limit: would have been).
    pub(crate) over: bool,
    /// Over because its cost is more than the limit can ever hold: no wait lets it pass, so its
    /// answer carries no `Retry-After`, and its count is the key's real one (nothing was charged).
    pub(crate) unfit: bool,
    /// Whether the remaining count is at most a fifth of the limit after this call.
    pub(crate) near: bool,
    /// What the limit's store said, when it was asked.
    pub(crate) outcome: Option<Outcome>,
    /// The statistics key: the configured level's, or the values' with `detailed_metric`.
    pub(crate) stat_key: Cow<'t, str>,
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
    /// The trees matched a rule the limiter no longer (or not yet) has: a reload swapped one
    /// and not yet the other. Asking again with the trees in force then answers.
    RulesChanged(LimitError),
}

impl Answer<'_> {
    /// Whether any enforced limit is over.
    pub(crate) fn over_limit(&self) -> bool {
        self.judged
            .iter()
            .any(|j| j.over && j.limit.as_ref().is_some_and(|l| !l.shadow))
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
        if descriptor.is_negative_hits {
            return invalid(format!(
                "descriptors[{i}]: is_negative_hits is not supported (hits are only charged)"
            ));
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
        descriptors.push(Descriptor { entries, cost });
    }
    Ok((domain, descriptors))
}

/// Decides `request` under `domains`, charging `limiter`.
pub(crate) async fn decide<'t>(
    domains: &'t Domains,
    limiter: &Limiter,
    on_store_failure: StoreFailure,
    request: &'t RateLimitRequest,
) -> Result<Answer<'t>, Refusal> {
    let (domain_name, descriptors) = validate(request)?;
    let domain = domains.get(domain_name);
    let plan = Plan::new(domain, &descriptors);
    let mut judged: Vec<Judged<'t>> = descriptors
        .iter()
        .zip(&plan.matched)
        .zip(&plan.over_regardless)
        .map(|((d, m), over)| Judged {
            stat_key: m.as_ref().map(|m| stat_key(m.limit, d)).unwrap_or_default(),
            limit: m.as_ref().map(|m| m.limit),
            cost: d.cost,
            over: *over,
            unfit: *over
                && m.as_ref()
                    .is_some_and(|m| matches!(m.limit.kind, LimitKind::Rule(_))),
            near: false,
            outcome: None,
        })
        .collect();

    // The enforced limits, all in one atomic step; a request that cannot pass is only looked
    // at, nothing charged.
    let mut store_failed = false;
    if plan.charges().next().is_some() {
        let result = if plan.cannot_pass() {
            limiter
                .check_all(plan.charges().map(|(rule, key, _)| (rule, key, 0)))
                .await
        } else {
            limiter.charge_all(plan.charges()).await
        };
        match result {
            Ok(decision) => {
                for (j, slot) in judged.iter_mut().zip(&plan.slots) {
                    let Some(slot) = slot else { continue };
                    let outcome = decision.rules()[*slot].outcome;
                    j.over |= !outcome.is_allowed();
                    j.outcome = Some(outcome);
                }
            }
            Err(LimitError::Store(error)) => {
                // Counted per call (`tollgate_server_store_errors_total`); told by the store's
                // own bounded warnings (a line per 10 s with a count, the breaker's opening and
                // closing), never a line per call.
                tracing::debug!(%error, policy = ?on_store_failure, "store failed");
                store_failed = true;
                apply_failure_policy(&mut judged, &plan.slots, on_store_failure);
            }
            Err(error) => return Err(Refusal::RulesChanged(error)),
        }
    }

    // Shadow limits: charged each on its own, never blocking anything.
    for (i, rule, key) in plan.shadow() {
        let j = &mut judged[i];
        let result = if j.over {
            limiter.check(rule, key, 0).await
        } else {
            limiter.charge(rule, key, j.cost).await
        };
        match result {
            Ok(outcome) => {
                j.over |= !outcome.is_allowed();
                j.outcome = Some(outcome);
            }
            Err(error) => {
                store_failed = true;
                tracing::debug!(%error, "shadow limit: store failed");
            }
        }
    }
    for j in &mut judged {
        if let Some(outcome) = &j.outcome {
            j.near = !j.over && outcome.remaining.saturating_mul(5) <= outcome.limit;
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

/// Answers the descriptors of a failed store call by the failure policy.
fn apply_failure_policy(judged: &mut [Judged<'_>], slots: &[Option<usize>], policy: StoreFailure) {
    for (j, slot) in judged.iter_mut().zip(slots) {
        if slot.is_some() {
            match policy {
                StoreFailure::Open => j.limit = None,
                StoreFailure::Closed => j.over = true,
            }
        }
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
