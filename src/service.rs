//! `RateLimit<S>`: the middleware service.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;

use http::{Request, Response};
use smallvec::SmallVec;
use tower_service::Service;

use crate::algorithm::Algorithm;
use crate::body::ResponseBody;
use crate::decision::{Decision, RuleDecision};
use crate::future::{ResponseFuture, State};
use crate::layer::{RateLimitLayer, Shared};
use crate::limiter::Limiter;
use crate::observe;
use crate::response::grpc::Protocol;
use crate::response::AllowedHeaders;
use crate::rule::Rule;
use crate::ruleset::{Answer, Refusal, Route, RuleSet};
use crate::settle::Settlement;
use crate::slot::{Slots, Ticket};
use crate::store::{FailurePolicy, StoreError};

/// Rate-limits requests to the inner service `S`; built by [`RateLimitLayer`].
///
/// For each request it finds the rules that apply, derives their keys and costs, charges the store
/// in one atomic step, and then calls the inner service (adding `RateLimit` fields to its response)
/// or answers `429` itself. A rejection is a response, so `Error = S::Error`.
pub struct RateLimit<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> RateLimit<S> {
    pub(crate) fn from_shared(inner: S, shared: Arc<Shared>) -> Self {
        RateLimit { inner, shared }
    }

    /// A layer with one rule and an in-memory store (see [`RateLimitLayer::new`]).
    pub fn layer(rule: impl Into<Rule>) -> RateLimitLayer {
        RateLimitLayer::new(rule)
    }

    /// The limiter this service asks.
    pub fn limiter(&self) -> &Limiter {
        &self.shared.limiter
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone> Clone for RateLimit<S> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("limiter", &self.shared.limiter)
            .finish()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        let shared = &self.shared;
        let rules = shared.limiter.rules();
        let (mut enforced, mut shadow) = (Decision::default(), Decision::default());
        match rules.route(&request, shared.shadow_all, &mut enforced, &mut shadow) {
            Ok(Route::Planned) => {}
            Ok(Route::Allowed) => {
                return ResponseFuture::new(State::calling(
                    self.inner.call(request),
                    None,
                    None,
                    None,
                ))
            }
            Err(refusal) => {
                match &refusal {
                    Refusal::NoPeer { rule, key } => report_no_peer(shared, rule, key),
                    Refusal::NoRoute { rule, key } => report_no_route(shared, rule, key),
                    _ => tracing::debug!(?refusal, "rate limit: request refused before counting"),
                }
                let protocol = Protocol::of(&request);
                let response = shared.responder.refused(&refusal, protocol);
                return ResponseFuture::new(State::respond(response));
            }
        }
        if !shadow.rules().is_empty() {
            record_shadow(shared, &rules, shadow);
        } else if shadow.grpc_method().is_none() {
            // Without rules or a method it owns nothing: forgetting it spares the call to its
            // drop (measured: 27 instructions per request).
            std::mem::forget(shadow);
        }
        if enforced.rules().is_empty() {
            return ResponseFuture::new(State::calling(self.inner.call(request), None, None, None));
        }
        if let Some(line) = Ticket::behind(&shared.limiter, &rules, &enforced) {
            // Others already wait for a slot of this key: queue behind them.
            let rules = arc_swap::Guard::into_inner(rules);
            let next = Next::AwaitSlot(Box::new(AwaitSlot {
                plan: enforced,
                rules,
                shared: shared.clone(),
                line,
            }));
            return ResponseFuture::new(next.into_state(&mut self.inner, request, None));
        }
        match rules.ask(&shared.limiter, &mut enforced) {
            Answer::Now(result) => {
                match decide(shared, &rules, &mut request, &mut enforced, result) {
                    // The usual path, spelled out: built here, the inner future goes straight
                    // into the returned one; through `into_state` it is built, then copied
                    // whole (measured: ~130 instructions per request, `#[inline(always)]` or not).
                    Next::Forward(headers, settlement, slots) => ResponseFuture::new(
                        State::calling(self.inner.call(request), headers, settlement, slots),
                    ),
                    next => ResponseFuture::new(next.into_state(&mut self.inner, request, None)),
                }
            }
            Answer::Later(store) => {
                // The store needs I/O: the ready inner service goes into the future and a clone
                // takes its place (the contract of `poll_ready` is per instance).
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                let rules = arc_swap::Guard::into_inner(rules);
                ResponseFuture::new(State::checking(
                    store,
                    inner,
                    request,
                    enforced,
                    rules,
                    shared.clone(),
                    None,
                ))
            }
        }
    }
}

/// The server passes no peer address: its misconfiguration, said loudly once per layer.
#[cold]
fn report_no_peer(shared: &Shared, rule: &str, key: &str) {
    if !shared.no_peer_logged.swap(true, Ordering::Relaxed) {
        tracing::error!(
            %rule,
            %key,
            "rate limit: requests carry no peer address, so rule \"{rule}\" cannot key them by \
             {key}; answering 500. With axum, serve with \
             `app.into_make_service_with_connect_info::<SocketAddr>()`; with hyper, insert the \
             connection's `SocketAddr` into each request's extensions"
        );
    }
}

/// The layer runs before the router, so a path-parameter key has nothing to read: the server's
/// misconfiguration, said loudly once per layer.
#[cold]
fn report_no_route(shared: &Shared, rule: &str, key: &str) {
    if !shared.no_route_logged.swap(true, Ordering::Relaxed) {
        tracing::error!(
            %rule,
            %key,
            "rate limit: rule \"{rule}\" counts requests by {key}, but the layer runs before the \
             router has matched a route, so no request has one; answering 500. With axum, add the \
             layer to the router (`Router::layer` or `Router::route_layer`) instead of around it"
        );
    }
}

/// Decides shadow rules: counted and logged like the others, never blocking. A store that needs
/// I/O answers in the background, so shadow rules add no latency.
fn record_shadow(shared: &Arc<Shared>, rules: &Arc<RuleSet>, mut plan: Decision) {
    let record = |shared: &Shared,
                  rules: &RuleSet,
                  decision: &Decision,
                  result: Result<(), StoreError>| match result {
        Ok(()) => {
            for entry in decision.rules() {
                rules.metrics[entry.index].record_shadow(entry.outcome.verdict, &entry.key);
                observe::event(entry, decision.grpc_method(), true, shared.redact_keys);
            }
        }
        Err(error) => {
            for entry in decision.rules() {
                rules.metrics[entry.index].store_error();
            }
            // The store's circuit breaker logs failures, one line per interval with a count.
            tracing::debug!(%error, "rate limit: store failed deciding shadow rules");
        }
    };
    match rules.ask(&shared.limiter, &mut plan) {
        Answer::Now(result) => record(shared, rules, &plan, result),
        Answer::Later(pending) => {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let (shared, rules) = (shared.clone(), rules.clone());
                runtime.spawn(async move {
                    let result = pending.await.and_then(|outcomes| plan.answer(outcomes));
                    record(&shared, &rules, &plan, result)
                });
            }
        }
    }
}

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
    pub(crate) plan: Decision,
    pub(crate) rules: Arc<RuleSet>,
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
        if let Some(Algorithm::Concurrency(c)) = self.rules.rules.get(index).map(|r| r.algorithm())
        {
            let no_slot = c.evaluate(c.max(), 1);
            for entry in self.plan.rules_mut() {
                entry.outcome = no_slot;
            }
            if let Some(metrics) = self.rules.metrics.get(index) {
                metrics.record(&no_slot, key);
            }
        }
        self.shared
            .responder
            .denied(&self.rules, &self.plan, protocol)
    }
}

impl Next {
    /// The future's state that carries this out. (The request is moved once, here, into the
    /// inner service or the queue: the decision itself only borrows it.) `ticket` is the place
    /// in line of a request that already waited for a slot.
    #[inline]
    pub(crate) fn into_state<S, B>(
        self,
        inner: &mut S,
        request: Request<B>,
        ticket: Option<Ticket>,
    ) -> State<S, B>
    where
        S: Service<Request<B>> + Clone,
    {
        match self {
            Next::Forward(headers, settlement, slots) => {
                let mut state = State::calling(inner.call(request), headers, settlement, slots);
                // Admitted after waiting for a slot: `Tollgate-Delay` says how long.
                if let (State::Calling { delayed, .. }, Some(ticket)) = (&mut state, ticket) {
                    *delayed = Some(ticket.waited());
                }
                state
            }
            Next::Respond(response) => State::respond(response),
            Next::Wait {
                wait,
                headers,
                hold,
                settlement,
                slots,
            } => {
                // The ready service goes with the request (a clone takes its place): the contract
                // of `poll_ready` is per instance.
                let clone = inner.clone();
                let ready = std::mem::replace(inner, clone);
                State::waiting(wait, ready, request, headers, hold, settlement, slots)
            }
            Next::AwaitSlot(waiting) => {
                let (index, key) = &waiting.line;
                let ticket = match ticket {
                    Some(ticket) if ticket.waits_for(&waiting.rules, *index, key) => Some(ticket),
                    _ => Ticket::join(&waiting.shared.limiter, &waiting.rules, *index, key.clone()),
                };
                let Some(ticket) = ticket else {
                    // The line is full (the queue's burst): denied at once.
                    return State::respond(waiting.denied(Protocol::of(&request)));
                };
                let clone = inner.clone();
                let ready = std::mem::replace(inner, clone);
                State::awaiting_slot(ticket, ready, request, *waiting)
            }
        }
    }
}

/// Turns the store's answer into what happens next: forward, wait, or answer. An allowed
/// request's decision goes into its extensions for the handler.
pub(crate) fn decide<B>(
    shared: &Arc<Shared>,
    rules: &Arc<RuleSet>,
    request: &mut Request<B>,
    decision: &mut Decision,
    result: Result<(), StoreError>,
) -> Next {
    match result {
        Ok(()) => {}
        Err(error) => {
            for entry in decision.rules() {
                rules.metrics[entry.index].store_error();
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
    let allowed = decision.is_allowed();
    if !allowed {
        if let Some(line) = Ticket::line_for(rules, decision) {
            // Queue mode on a concurrency rule: the request waits in line for a slot (nothing
            // was charged) and asks again; it is counted once it is decided.
            return Next::AwaitSlot(Box::new(AwaitSlot {
                plan: std::mem::take(decision),
                rules: rules.clone(),
                shared: shared.clone(),
                line,
            }));
        }
    }
    for entry in decision.rules() {
        // A rule that would have admitted a request another rule denied was not charged.
        if allowed || !entry.outcome.is_allowed() {
            rules.metrics[entry.index].record(&entry.outcome, &entry.key);
        }
        observe::event(entry, decision.grpc_method(), false, shared.redact_keys);
    }
    if !allowed {
        let protocol = Protocol::of(request);
        return Next::Respond(shared.responder.denied(rules, decision, protocol));
    }
    let headers = shared.responder.allowed(rules, decision);
    let settlement = if rules.settles {
        Settlement::of(&shared.limiter, rules, decision)
    } else {
        None
    };
    let slots = Slots::of(&shared.limiter, rules, decision).map(Box::new);
    let wait = decision.wait();
    if wait.is_zero() {
        hand_over(shared, request, decision);
        return Next::Forward(headers, settlement, slots);
    }
    // Queue mode: the units go back to the store if the request is dropped while it waits.
    let hold = Box::new(Hold::new(shared.limiter.clone(), rules.clone(), decision));
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
    limiter: Limiter,
    rules: Arc<RuleSet>,
    /// (Whole entries: a per-request limit is given back under the limit it was charged under.)
    charged: SmallVec<[RuleDecision; 2]>,
}

impl Hold {
    fn new(limiter: Limiter, rules: Arc<RuleSet>, decision: &Decision) -> Self {
        // A concurrency slot is given back by the request's `Slots`, not here.
        let charged = decision
            .rules()
            .iter()
            .filter(|entry| !rules.rules[entry.index].algorithm().is_concurrency())
            .cloned()
            .collect();
        Hold {
            limiter,
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
            self.limiter.refund_decided_now(&self.rules, &self.charged);
        }
    }
}
