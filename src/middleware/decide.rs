//! What happens to a request once the store has answered: forward it (with its fields, its
//! settlement and its slots), hold it until its queued slot, wait in line for a concurrency slot,
//! or answer it. Beside the future that carries it out; it never builds the future's states.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use smallvec::SmallVec;

use super::shared::{InForce, Shared};
use crate::algorithm::Algorithm;
use crate::engine::decision::{Decision, Plan, RuleDecision};
use crate::engine::ledger::Ledger;
use crate::engine::settlement::Settlement;
use crate::engine::slot::{Slots, Ticket};
use crate::key::protocol::Protocol;
use crate::observe;
use crate::response::AllowedHeaders;
use crate::rules::set::RuleSet;
use crate::store::{FailurePolicy, StoreError};

/// What happens to a request once the store has answered.
pub(crate) enum Next {
    /// Forward it now, adding these fields to the response (settling its rules' charges once it
    /// is known, and holding its concurrency slots until the response ends).
    Forward(
        Option<AllowedHeaders>,
        Option<Box<Settlement>>,
        Option<Box<Slots>>,
    ),
    /// Queue mode: hold it until its slot. (The hold is boxed: queued requests are rare next to
    /// forwarded ones, and an inline hold would double the size of every `Next`.)
    Wait {
        wait: Duration,
        headers: Option<AllowedHeaders>,
        hold: Box<Hold>,
        settlement: Option<Box<Settlement>>,
        slots: Option<Box<Slots>>,
    },
    /// Queue mode on a concurrency rule: wait in line for a slot, then ask the store again.
    AwaitSlot(Box<AwaitSlot>),
    /// Answer it with this response.
    Respond(Response<Bytes>),
}

/// A request that waits for a concurrency slot: its plan, to ask the store again, and the line
/// it waits in (rule index, key).
pub(crate) struct AwaitSlot {
    pub(crate) plan: Plan,
    pub(crate) in_force: Arc<InForce>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) line: (usize, crate::key::KeyValue),
}

impl AwaitSlot {
    /// The answer to a request that waited too long or found the line full: denied by the
    /// rule it waited for (no slot free), told to come back in a second. The request's other
    /// rules are left out of the answer: a newcomer that joined the line never asked them, and
    /// what they said to one that did is as old as its wait.
    pub(crate) fn denied(mut self, protocol: Protocol) -> Response<Bytes> {
        let (index, ref key) = self.line;
        self.plan.retain(|entry| entry.index == index);
        let in_force = &self.in_force;
        if let Some(Algorithm::Concurrency(c)) =
            in_force.rules.rules.get(index).map(|r| r.algorithm())
        {
            let no_slot = c.evaluate(c.max(), 1);
            for entry in self.plan.rules_mut() {
                entry.outcome = no_slot.clone();
            }
            if let Some(metrics) = in_force.meters.rules.get(index) {
                metrics.record(&no_slot, key);
            }
        }
        let decision = Decision::from(self.plan);
        self.shared
            .responder
            .denied(&in_force.policies, &decision, protocol)
    }
}

/// Turns the store's answer into what happens next: forward, wait, or answer. An allowed
/// request's decision goes into its extensions for the handler.
pub(crate) fn decide<B>(
    shared: &Arc<Shared>,
    in_force: &Arc<InForce>,
    request: &mut Request<B>,
    decision: &mut Decision,
    result: Result<(), StoreError>,
) -> Next {
    match result {
        Ok(()) => {}
        Err(error) => {
            for entry in decision.rules() {
                in_force.meters.rules[entry.index].store_error();
            }
            // The store's circuit breaker logs failures, one line per interval with a count.
            return match shared.failure {
                // Fail to local answers in the store; an error reaching here (no local store
                // behind a given limiter) forwards, as fail open.
                FailurePolicy::Open | FailurePolicy::Local { .. } => {
                    tracing::debug!(%error, "rate limit: store failed; request forwarded unlimited (fail open)");
                    Next::Forward(None, None, None)
                }
                FailurePolicy::Closed => {
                    tracing::debug!(%error, "rate limit: store failed; request refused (fail closed)");
                    let protocol = Protocol::of(request);
                    Next::Respond(shared.responder.unavailable_in(&error, protocol))
                }
            };
        }
    }
    let (rules, meters, policies) = (&in_force.rules, &in_force.meters, &in_force.policies);
    let allowed = decision.is_allowed();
    if !allowed {
        if let Some(line) = Ticket::line_for(rules, decision) {
            // Queue mode on a concurrency rule: the request waits in line for a slot (nothing
            // was charged) and asks again; it is counted once it is decided.
            return Next::AwaitSlot(Box::new(AwaitSlot {
                plan: std::mem::take(&mut decision.plan),
                in_force: in_force.clone(),
                shared: shared.clone(),
                line,
            }));
        }
    }
    for entry in decision.rules() {
        // A rule that would have admitted a request another rule denied was not charged.
        if allowed || !entry.outcome.is_allowed() {
            meters.rules[entry.index].record(&entry.outcome, &entry.key);
        }
        observe::event(
            entry,
            decision.grpc_method(),
            false,
            shared.redact_keys.as_ref(),
        );
    }
    if !allowed {
        let protocol = Protocol::of(request);
        return Next::Respond(shared.responder.denied(policies, decision, protocol));
    }
    let headers = shared.responder.allowed(policies, decision);
    let settlement = if rules.settles {
        Settlement::of(shared.limiter.ledger(), rules, decision)
    } else {
        None
    };
    let slots = Slots::of(shared.limiter.ledger(), rules, decision).map(Box::new);
    let wait = decision.wait();
    if wait.is_zero() {
        hand_over(shared, request, decision);
        return Next::Forward(headers, settlement, slots);
    }
    // Queue mode: the units go back to the store if the request is dropped while it waits.
    let hold = Box::new(Hold::new(
        shared.limiter.ledger().clone(),
        rules.clone(),
        decision,
    ));
    hand_over(shared, request, decision);
    Next::Wait {
        wait,
        headers,
        hold,
        settlement,
        slots,
    }
}

/// Moves an allowed request's decision into its extensions for the handler, replacing one an
/// outer layer put there, unless the layer was built without. (Taken straight into its box:
/// `Extensions::insert` copies it once more on the way; measured, 46 instructions per request.)
#[inline]
fn hand_over<B>(shared: &Shared, request: &mut Request<B>, decision: &mut Decision) {
    if !shared.decision_in_extensions {
        return;
    }
    let mut inserted = false;
    let slot = request.extensions_mut().get_or_insert_with(|| {
        inserted = true;
        std::mem::take(decision)
    });
    if !inserted {
        *slot = std::mem::take(decision);
    }
}

/// The units a queued request holds; given back unless the request reaches the inner service.
pub(crate) struct Hold {
    ledger: Ledger,
    rules: Arc<RuleSet>,
    /// (Whole entries: a per-request limit is given back under the limit it was charged under.)
    charged: SmallVec<[RuleDecision; 2]>,
}

impl Hold {
    fn new(ledger: Ledger, rules: Arc<RuleSet>, decision: &Decision) -> Self {
        // A concurrency slot is given back by the request's `Slots`, not here.
        let charged = decision
            .rules()
            .iter()
            .filter(|entry| !rules.rules[entry.index].algorithm().is_concurrency())
            .cloned()
            .collect();
        Hold {
            ledger,
            rules,
            charged,
        }
    }

    /// The request reached its slot: the units are spent.
    pub(crate) fn release(mut self) {
        self.charged.clear();
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if !self.charged.is_empty() {
            tracing::debug!("rate limit: queued request cancelled, units given back");
            self.ledger.refund_decided_now(&self.rules, &self.charged);
        }
    }
}
