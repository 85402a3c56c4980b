//! What every service of one layer shares: the limiter, the rules in force with what the layer
//! prepared for them, the responder, the failure policy and the layer's switches. The layer
//! builds it; the service, the decision and the future read it.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::engine::limiter::Limiter;
use crate::observe::redact::Redactor;
use crate::observe::Meters;
use crate::response::{Policies, Responder};
use crate::rules::set::RuleSet;
use crate::store::FailurePolicy;

/// What every service of one layer shares.
pub(crate) struct Shared {
    pub(crate) limiter: Limiter,
    /// The limiter's rules with this layer's policies and meters for them, replaced together.
    pub(crate) in_force: ArcSwap<InForce>,
    pub(crate) responder: Responder,
    pub(crate) failure: FailurePolicy,
    /// Every rule decides and records but none blocks.
    pub(crate) shadow_all: bool,
    /// With redaction on: what logs and top-offender lists show instead of each key.
    pub(crate) redact_keys: Option<Redactor>,
    /// Keys per rule in the top-offender lists.
    pub(crate) top_offenders: usize,
    /// An allowed request carries its `Decision` in its extensions.
    pub(crate) decision_in_extensions: bool,
    /// A missing peer address is logged once per layer, not once per request.
    pub(crate) no_peer_logged: AtomicBool,
    /// Whether the missing route of a path-parameter key was logged (once per layer).
    pub(crate) no_route_logged: AtomicBool,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The rules in force show in the limiter's; what the layer prepared for them is derived.
        f.debug_struct("Shared")
            .field("limiter", &self.limiter)
            .field("responder", &self.responder)
            .field("failure", &self.failure)
            .field("shadow_all", &self.shadow_all)
            .field("redact_keys", &self.redact_keys)
            .field("top_offenders", &self.top_offenders)
            .field("decision_in_extensions", &self.decision_in_extensions)
            .finish_non_exhaustive()
    }
}

/// A rule set with what the response and observe stages prepared for it (each stage's own type:
/// the rules hold neither), so that a request reads all three from one load and a reload
/// replaces them together.
pub(crate) struct InForce {
    pub(crate) rules: Arc<RuleSet>,
    /// Each rule's `RateLimit` items and the last 429s.
    pub(crate) policies: Policies,
    /// Each rule's counters and top-offender sketch.
    pub(crate) meters: Meters,
}

impl Shared {
    /// Keeps `in_force` following the limiter's rules: a new `InForce` for each rule set a reload
    /// brings, as long as the layer lives (the limiter holds only a weak reference to it, and
    /// outlives layers built on it).
    pub(crate) fn follow_reloads(self: &Arc<Self>) {
        let layer = Arc::downgrade(self);
        self.limiter
            .follow_rules(Box::new(move |rules: &Arc<RuleSet>| {
                let Some(shared) = layer.upgrade() else {
                    return false;
                };
                let current = shared.in_force.load();
                if current.rules.generation != rules.generation {
                    let next = InForce::new(rules.clone(), Some(&current), shared.top_offenders);
                    shared.in_force.store(Arc::new(next));
                }
                true
            }));
    }
}

impl InForce {
    /// `rules` with this layer's policies and meters (`top_offenders`: keys per rule's sketch),
    /// keeping the sketches of `previous`'s rules that keep their name.
    pub(crate) fn new(
        rules: Arc<RuleSet>,
        previous: Option<&InForce>,
        top_offenders: usize,
    ) -> Self {
        let previous = previous.map(|p| (&*p.rules, &p.meters));
        InForce {
            policies: Policies::of(&rules),
            meters: Meters::of(&rules, top_offenders, previous),
            rules,
        }
    }
}
