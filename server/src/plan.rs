//! What a request's descriptors charge: the limit each one reaches (once `replaces` has removed
//! the limits it names), and the enforced limits merged into one charge per (rule, key), for one
//! atomic step of the store. The service answers from it; tools that replay traffic through a
//! configuration (the `tollgate` command) charge the same plan.
//!
//! A descriptor may bring its own limit (`RateLimitDescriptor.limit`: a number per unit). As in
//! the reference, it applies in any configured domain whatever the tree says, counted per the
//! descriptor's entries. Such a limit is not in the file, so it has no rule of its own: the
//! configuration holds one rule per unit ([`override_rule`]), a fixed window aligned to the
//! clock, and each charge is decided under the number the descriptor brought
//! ([`tollgate::Limiter::charge_all_under`]: the key's count is kept and compared with the
//! number given). Seven rules whatever the traffic, rather than a rule per number created when
//! first seen: that set would grow with what callers send, each new number would rebuild the
//! limiter's rules on the request path, and a reload would have to carry them over. The counter is
//! the reference's too: one per domain, entries and unit, whatever the number (two numbers for
//! the same entries share it).

use std::sync::Arc;

use smallvec::SmallVec;
use tollgate::Limit;

use crate::tree::{Domain, Entry, LimitKind, LimitSpec, Matched, Policy, Reached};
use crate::unit::Unit;

/// Per descriptor of a request (Envoy sends a handful): up to four kept in place, not allocated.
pub type PerDescriptor<T> = SmallVec<[T; 4]>;

/// The names of the rules a descriptor's own limit is counted under begin with this; the rest is
/// the unit's name (`tollgate-server:override:day`).
pub const OVERRIDE_RULE_PREFIX: &str = "tollgate-server:override:";

/// The rule a descriptor's own limit of `unit` is counted under.
pub fn override_rule(unit: Unit) -> String {
    format!("{OVERRIDE_RULE_PREFIX}{}", unit.name())
}

/// One descriptor of a request: its entries and the units it costs.
#[derive(Debug)]
pub struct Descriptor<'a> {
    /// The entries, in order (up to two kept in place: most descriptors Envoy sends have one or
    /// two).
    pub entries: SmallVec<[Entry<'a>; 2]>,
    /// The units it costs (0 only looks).
    pub cost: u64,
    /// Its own limit, `(requests_per_unit, unit)`, in place of the configuration's.
    pub limit: Option<(u32, Unit)>,
    /// `is_negative_hits`: the cost is given back, not charged.
    pub negative: bool,
}

impl<'a> Descriptor<'a> {
    /// A descriptor of `entries` costing `cost`, with no limit of its own.
    pub fn new(entries: SmallVec<[Entry<'a>; 2]>, cost: u64) -> Self {
        Descriptor {
            entries,
            cost,
            limit: None,
            negative: false,
        }
    }
}

/// One charge of a plan, for the store.
#[derive(Debug)]
pub struct Charge<'p> {
    /// The library rule.
    pub rule: &'p str,
    /// The key.
    pub key: &'p [u8],
    /// The units.
    pub cost: u64,
    /// A quota limit's: the request is not refused for it alone.
    pub quota: bool,
    /// The limit reached (a charge stays a few words: a request's charges are kept in place).
    spec: &'p LimitSpec,
}

impl Charge<'_> {
    /// The limit it is decided under in place of the rule's own (a descriptor's own limit).
    pub fn limit(&self) -> Option<Limit> {
        request_limit(self.spec)
    }
}

/// The charges of one request.
#[derive(Debug)]
pub struct RequestCharges<'t> {
    /// Per descriptor, the limit that applies, if any.
    pub matched: PerDescriptor<Option<Matched<'t>>>,
    /// Per descriptor, the enforced charge it is part of (an index into [`RequestCharges::charges`]).
    pub slots: PerDescriptor<Option<usize>>,
    /// Per descriptor, whether it is over its limit whatever the store counts:
    /// `requests_per_unit: 0`, or a cost above what the limit can ever hold.
    pub over_regardless: PerDescriptor<bool>,
    /// Per descriptor, whether it is a quota descriptor (its limit's `quota_mode`, or every
    /// descriptor with a limit that is not `unlimited` under the global quota mode).
    pub quota: PerDescriptor<bool>,
    /// Per descriptor, whether its cost is given back (`is_negative_hits`).
    pub negative: PerDescriptor<bool>,
    /// The enforced charges: the first descriptor with that rule and key, the summed cost.
    charges: PerDescriptor<(usize, u64)>,
}

impl<'t> RequestCharges<'t> {
    /// The plan of `descriptors` in `domain` (`None`: an unknown domain, nothing applies), with
    /// every limit a quota limit when `quota_mode` (the reference's global `QUOTA_MODE`). The
    /// plan may borrow the descriptors' values (a key that is one value).
    pub fn new(
        domain: Option<&'t Domain>,
        descriptors: &[Descriptor<'t>],
        quota_mode: bool,
    ) -> RequestCharges<'t> {
        let mut matched: PerDescriptor<Option<Matched<'t>>> = descriptors
            .iter()
            .map(|d| {
                let domain = domain?;
                match d.limit {
                    Some((requests_per_unit, unit)) => {
                        Some(from_request(domain, d, requests_per_unit, unit))
                    }
                    None => domain.find(&d.entries),
                }
            })
            .collect();
        // A limit that another applying limit `replaces` does not apply (one a request brought
        // is never replaced: the reference's have no name).
        let replaced: Vec<String> = matched
            .iter()
            .flatten()
            .flat_map(|m| m.limit.replaces.iter().cloned())
            .collect();
        if !replaced.is_empty() {
            for m in &mut matched {
                if m.as_ref()
                    .is_some_and(|m| !m.limit.from_request && replaced.contains(&m.limit.name))
                {
                    *m = None;
                }
            }
        }
        // Filled by pushes in one pass: a request has a handful of descriptors, and a collect
        // per column cost more than the values themselves.
        let mut plan = RequestCharges {
            slots: SmallVec::new(),
            over_regardless: SmallVec::new(),
            negative: SmallVec::new(),
            quota: SmallVec::new(),
            charges: SmallVec::new(),
            matched,
        };
        for (m, d) in plan.matched.iter().zip(descriptors) {
            plan.quota.push(match m {
                Some(m) if m.limit.kind == LimitKind::Unlimited => false,
                Some(m) => quota_mode || m.limit.quota,
                None => quota_mode,
            });
            plan.negative.push(d.negative);
            plan.slots.push(None);
            plan.over_regardless.push(false);
        }
        for (i, descriptor) in descriptors.iter().enumerate() {
            let Some(m) = &plan.matched[i] else { continue };
            let limit: &LimitSpec = &m.limit;
            match &limit.kind {
                LimitKind::Unlimited => {}
                // Given back, not charged: nothing is over.
                _ if descriptor.negative => {}
                LimitKind::Blocked => plan.over_regardless[i] = true,
                LimitKind::Rule(rule) if !limit.shadow => {
                    // One charge per (rule, key): the library refuses a key twice in one batch.
                    // A linear search beats hashing for the few descriptors of a request. A
                    // quota descriptor and an enforced one never share a rule (a rule is one
                    // configured limit, or one unit of the requests' own limits, quota or not
                    // alike).
                    let found = plan.charges.iter().position(|(first, _)| {
                        plan.matched[*first].as_ref().is_some_and(|f| {
                            matches!(&f.limit.kind, LimitKind::Rule(r) if r == rule)
                                && f.key == m.key
                        })
                    });
                    let slot = found.unwrap_or_else(|| {
                        plan.charges.push((i, 0));
                        plan.charges.len() - 1
                    });
                    let cost = &mut plan.charges[slot].1;
                    *cost = cost.saturating_add(descriptor.cost);
                    plan.slots[i] = Some(slot);
                }
                LimitKind::Rule(_) => {
                    plan.over_regardless[i] = descriptor.cost > limit.max_cost;
                }
            }
        }
        for i in 0..plan.slots.len() {
            if let (Some(slot), Some(m)) = (plan.slots[i], &plan.matched[i]) {
                let max_cost = plan.matched[plan.charges[slot].0]
                    .as_ref()
                    .map_or(m.limit.max_cost, |first| first.limit.max_cost);
                plan.over_regardless[i] = plan.charges[slot].1 > max_cost;
            }
        }
        plan
    }

    /// The enforced charges, quota ones included (marked), for one atomic step; the charge of
    /// [`RequestCharges::slots`]' index `c` is the `c`-th.
    pub fn charges(&self) -> impl Iterator<Item = Charge<'_>> + use<'_, 't> {
        (0..self.charges.len()).filter_map(|c| self.charge(c))
    }

    /// The number of enforced charges.
    pub fn charge_count(&self) -> usize {
        self.charges.len()
    }

    /// The enforced charge of index `c`: `None` past the last, or once its first descriptor's
    /// limit was taken out of [`RequestCharges::matched`].
    pub fn charge(&self, c: usize) -> Option<Charge<'_>> {
        let &(first, cost) = self.charges.get(c)?;
        let m = self.matched[first].as_ref()?;
        let LimitKind::Rule(rule) = &m.limit.kind else {
            return None;
        };
        Some(Charge {
            rule,
            key: &m.key,
            cost,
            quota: self.quota[first],
            spec: &m.limit,
        })
    }

    /// The first descriptor of charge `c`, the one whose answer holds the charge's outcome.
    pub fn first_of(&self, c: usize) -> usize {
        self.charges[c].0
    }

    /// Whether an enforced limit that is not a quota limit is over whatever the store counts:
    /// the request cannot pass, and is only looked at (nothing is charged).
    pub fn cannot_pass(&self) -> bool {
        (0..self.matched.len()).any(|i| {
            self.over_regardless[i]
                && !self.quota[i]
                && self.matched[i].as_ref().is_some_and(|m| !m.limit.shadow)
        })
    }

    /// The shadow limits: `(descriptor, rule, key, limit)`, each charged on its own (those whose
    /// cost is given back are in [`RequestCharges::refunds`]).
    pub fn shadow(
        &self,
    ) -> impl Iterator<Item = (usize, &str, &[u8], Option<Limit>)> + use<'_, 't> {
        self.matched.iter().enumerate().filter_map(|(i, m)| {
            let m = m.as_ref()?;
            match &m.limit.kind {
                LimitKind::Rule(rule) if m.limit.shadow && !self.negative[i] => {
                    Some((i, &**rule, &m.key[..], request_limit(&m.limit)))
                }
                _ => None,
            }
        })
    }

    /// The counted limits whose descriptor gives its cost back: `(descriptor, rule, key,
    /// limit)`, each refunded on its own.
    pub fn refunds(
        &self,
    ) -> impl Iterator<Item = (usize, &str, &[u8], Option<Limit>)> + use<'_, 't> {
        self.matched.iter().enumerate().filter_map(|(i, m)| {
            let m = m.as_ref()?;
            match &m.limit.kind {
                LimitKind::Rule(rule) if self.negative[i] => {
                    Some((i, &**rule, &m.key[..], request_limit(&m.limit)))
                }
                _ => None,
            }
        })
    }
}

/// The limit a charge of `limit` is decided under in place of its rule's: the number a request
/// brought, in a window of its unit aligned to the clock, as the reference counts it.
fn request_limit(limit: &LimitSpec) -> Option<Limit> {
    limit.from_request.then(|| {
        Limit::fixed_window(u64::from(limit.requests_per_unit), limit.unit.duration()).aligned()
    })
}

/// The limit descriptor `d` brings, `requests_per_unit` per `unit`, made for this request: counted
/// per domain and entries, its statistics under the entries (`key1_value1.subkey1_something`,
/// the reference's key), never shadowed, no metadata.
fn from_request<'t>(
    domain: &Domain,
    d: &Descriptor<'_>,
    requests_per_unit: u32,
    unit: Unit,
) -> Matched<'t> {
    let stat_key = d
        .entries
        .iter()
        .map(|e| match e.value {
            "" => e.key.to_owned(),
            value => format!("{}_{value}", e.key),
        })
        .collect::<Vec<_>>()
        .join(".");
    // The domain, then each key and value: the rules are shared by every domain and every
    // descriptor, so the key says all that tells two counters apart.
    let mut key = Vec::new();
    push_escaped(&mut key, domain.name.as_bytes());
    for entry in &d.entries {
        key.push(b'/');
        push_escaped(&mut key, entry.key.as_bytes());
        key.push(b'=');
        push_escaped(&mut key, entry.value.as_bytes());
    }
    let kind = if requests_per_unit == 0 {
        LimitKind::Blocked
    } else {
        LimitKind::Rule(Arc::from(override_rule(unit)))
    };
    let limit = LimitSpec {
        kind,
        name: crate::reference::rule_name(&domain.name, &stat_key),
        requests_per_unit,
        unit,
        policy: Policy {
            quota: u64::from(requests_per_unit),
            window_seconds: unit.duration().as_secs(),
        },
        max_cost: u64::from(requests_per_unit),
        shadow: false,
        detailed_metric: false,
        replaces: Vec::new(),
        stat_key,
        quota: false,
        metadata: None,
        from_request: true,
        memo: Default::default(),
    };
    Matched {
        limit: Reached::FromRequest(Box::new(limit)),
        key: key.into(),
        stat_key: None,
    }
}

/// Appends `part` with `%`, `/` and `=` percent-encoded, so the parts of a key stay apart.
fn push_escaped(key: &mut Vec<u8>, part: &[u8]) {
    for &byte in part {
        match byte {
            b'%' => key.extend_from_slice(b"%25"),
            b'/' => key.extend_from_slice(b"%2F"),
            b'=' => key.extend_from_slice(b"%3D"),
            _ => key.push(byte),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_s_own_limit_is_counted_per_domain_and_entries() {
        let mut domains = crate::tree::Domains::default();
        domains.entry("d");
        let domain = domains.get("d");
        let entries = |pairs: &[(&'static str, &'static str)]| {
            pairs
                .iter()
                .map(|&(key, value)| Entry { key, value })
                .collect::<SmallVec<[Entry<'_>; 2]>>()
        };
        let with_limit = |pairs, n, unit| Descriptor {
            limit: Some((n, unit)),
            ..Descriptor::new(entries(pairs), 1)
        };
        let a = with_limit(&[("a", "b/c")], 10, Unit::Day);
        let b = with_limit(&[("a/b", "c")], 10, Unit::Day);
        let c = with_limit(&[("a=b", "c")], 10, Unit::Day);
        let plan = RequestCharges::new(domain, &[a, b, c], false);
        let keys: Vec<&[u8]> = plan.charges().map(|c| c.key).collect();
        assert_eq!(keys.len(), 3);
        assert_ne!(keys[0], keys[1]);
        assert_ne!(keys[1], keys[2]);
        let charge = plan.charges().next().unwrap();
        assert_eq!(charge.rule, "tollgate-server:override:day");
        assert!(charge.limit().is_some());
        // An unknown domain: no limit, the descriptor's own included (the reference's answer).
        let plan = RequestCharges::new(None, &[with_limit(&[("a", "b")], 10, Unit::Day)], false);
        assert!(plan.matched[0].is_none());
    }
}
