//! The store's view of a rule's charge: what a planned decision, one of its entries, or a charge
//! made by name asks the store (the rule's name and digest, its algorithm or the limit that
//! applies, the key, the cost, the mode, the penalty, the lease, whether overrides are read).
//! Apart from `ask.rs`, which sends the charges, so that the ledger (which gives units back)
//! builds them too without the two importing each other.

use smallvec::SmallVec;

use super::decision::{Plan, RuleDecision};
use crate::key::KeyValue;
use crate::rules::per_request::algorithm_of;
use crate::rules::set::RuleSet;
use crate::store::{Charge, RuleName};

/// The store's view of a planned decision.
pub(crate) fn charges<'a>(rules: &'a RuleSet, plan: &'a Plan) -> SmallVec<[Charge<'a>; 2]> {
    plan.rules().iter().map(|p| charge_of(rules, p)).collect()
}

/// The store's view of one planned charge, under the limit that applies to it.
#[inline]
pub(crate) fn charge_of<'a>(rules: &'a RuleSet, entry: &'a RuleDecision) -> Charge<'a> {
    let rule = &rules.rules[entry.index];
    Charge {
        algorithm: algorithm_of(&entry.applied, rule.algorithm()),
        read_overrides: rule.overridable,
        ..charge(rules, entry.index, &entry.key, entry.cost)
    }
}

pub(crate) fn charge<'a>(
    rules: &'a RuleSet,
    index: usize,
    key: &'a KeyValue,
    cost: u64,
) -> Charge<'a> {
    let rule = &rules.rules[index];
    Charge {
        rule: RuleName::known(&rule.name, rule.digest),
        algorithm: rule.algorithm(),
        key: key.as_bytes(),
        cost,
        mode: rule.mode,
        penalty: rule.penalty.as_ref(),
        lease: rule.lease.as_ref(),
        read_overrides: false,
    }
}
