//! What a request's descriptors charge: the limit each one reaches (once `replaces` has removed
//! the limits it names), and the enforced limits merged into one charge per (rule, key), for one
//! atomic step of the store. The service answers from it; tools that replay traffic through a
//! configuration (the `tollgate` command) charge the same plan.

use smallvec::SmallVec;

use crate::tree::{Domain, Entry, LimitKind, LimitSpec, Matched};

/// Per descriptor of a request (Envoy sends a handful): up to four kept in place, not allocated.
pub type PerDescriptor<T> = SmallVec<[T; 4]>;

/// One descriptor of a request: its entries and the units it costs.
#[derive(Debug)]
pub struct Descriptor<'a> {
    /// The entries, in order (up to two kept in place: most descriptors Envoy sends have one or
    /// two).
    pub entries: SmallVec<[Entry<'a>; 2]>,
    /// The units it costs (0 only looks).
    pub cost: u64,
}

/// The charges of one request.
#[derive(Debug)]
pub struct Plan<'t> {
    /// Per descriptor, the limit that applies, if any.
    pub matched: PerDescriptor<Option<Matched<'t>>>,
    /// Per descriptor, the enforced charge it is part of (an index into [`Plan::charges`]).
    pub slots: PerDescriptor<Option<usize>>,
    /// Per descriptor, whether it is over its limit whatever the store counts:
    /// `requests_per_unit: 0`, or a cost above what the limit can ever hold.
    pub over_regardless: PerDescriptor<bool>,
    /// The enforced charges: rule, the first descriptor with that key, the summed cost.
    charges: PerDescriptor<(&'t str, usize, u64)>,
}

impl<'t> Plan<'t> {
    /// The plan of `descriptors` in `domain` (`None`: an unknown domain, nothing applies).
    pub fn new(domain: Option<&'t Domain>, descriptors: &[Descriptor<'_>]) -> Plan<'t> {
        let mut matched: PerDescriptor<Option<Matched<'t>>> = descriptors
            .iter()
            .map(|d| domain.and_then(|domain| domain.find(&d.entries)))
            .collect();
        // A limit that another applying limit `replaces` does not apply.
        let replaced: Vec<String> = matched
            .iter()
            .flatten()
            .flat_map(|m| m.limit.replaces.iter().cloned())
            .collect();
        if !replaced.is_empty() {
            for m in &mut matched {
                if m.as_ref().is_some_and(|m| replaced.contains(&m.limit.name)) {
                    *m = None;
                }
            }
        }
        let n = matched.len();
        let mut plan = Plan {
            slots: smallvec::smallvec![None; n],
            over_regardless: smallvec::smallvec![false; n],
            charges: SmallVec::new(),
            matched,
        };
        for (i, descriptor) in descriptors.iter().enumerate() {
            let Some(m) = &plan.matched[i] else { continue };
            let limit: &'t LimitSpec = m.limit;
            match &limit.kind {
                LimitKind::Unlimited => {}
                LimitKind::Blocked => plan.over_regardless[i] = true,
                LimitKind::Rule(rule) if !limit.shadow => {
                    // One charge per (rule, key): the library refuses a key twice in one batch.
                    // A linear search beats hashing for the few descriptors of a request.
                    let found = plan.charges.iter().position(|(r, first, _)| {
                        *r == &**rule
                            && plan.matched[*first]
                                .as_ref()
                                .is_some_and(|f| f.key == m.key)
                    });
                    let slot = found.unwrap_or_else(|| {
                        plan.charges.push((rule, i, 0));
                        plan.charges.len() - 1
                    });
                    let cost = &mut plan.charges[slot].2;
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
                plan.over_regardless[i] = plan.charges[slot].2 > m.limit.max_cost;
            }
        }
        plan
    }

    /// The enforced charges, `(rule, key, cost)`, for one atomic step.
    pub fn charges(&self) -> impl Iterator<Item = (&str, &[u8], u64)> + use<'_, 't> {
        self.charges.iter().map(|(rule, first, cost)| {
            let key = self.matched[*first].as_ref().map_or(&[][..], |m| &m.key);
            (*rule, key, *cost)
        })
    }

    /// Whether an enforced limit is over whatever the store counts: the request cannot pass, and
    /// is only looked at (nothing is charged).
    pub fn cannot_pass(&self) -> bool {
        self.over_regardless
            .iter()
            .zip(&self.matched)
            .any(|(over, m)| *over && m.as_ref().is_some_and(|m| !m.limit.shadow))
    }

    /// The shadow limits: `(descriptor, rule, key)`, each charged on its own.
    pub fn shadow(&self) -> impl Iterator<Item = (usize, &str, &[u8])> + use<'_, 't> {
        self.matched.iter().enumerate().filter_map(|(i, m)| {
            let m = m.as_ref()?;
            match &m.limit.kind {
                LimitKind::Rule(rule) if m.limit.shadow => Some((i, &**rule, &m.key[..])),
                _ => None,
            }
        })
    }
}
