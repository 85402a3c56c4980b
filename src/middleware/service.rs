//! `RateLimit<S>`: the middleware service.

use crate::engine::ask;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::body::ResponseBody;
use super::decide::{decide, AwaitSlot, Next};
use super::future::{ResponseFuture, State};
use super::shared::{InForce, Shared};
use crate::engine::decision::{Decision, Plan};
use crate::engine::limiter::Limiter;
use crate::engine::slot::Ticket;
use crate::key::protocol::Protocol;
use crate::observe;
use crate::rules::set::{Refusal, Route};
use crate::store::StoreError;
use ask::Answer;

/// Rate-limits requests to the inner service `S`; built by [`RateLimitLayer`](crate::RateLimitLayer).
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
        let in_force = shared.in_force.load();
        let rules = &in_force.rules;
        // The enforced rules' plan is made in the decision that answers it; the shadow plan only
        // if a shadow rule applies.
        let (mut enforced, mut shadow) = (Decision::default(), None);
        match rules.route(&request, shared.shadow_all, &mut enforced.plan, &mut shadow) {
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
        if let Some(shadow) = shadow {
            record_shadow(shared, &in_force, shadow);
        }
        if enforced.plan.rules().is_empty() {
            return ResponseFuture::new(State::calling(self.inner.call(request), None, None, None));
        }
        if let Some(line) = Ticket::behind(shared.limiter.ledger(), rules, &enforced.plan) {
            // Others already wait for a slot of this key: queue behind them.
            let next = Next::AwaitSlot(Box::new(AwaitSlot {
                plan: enforced.plan,
                in_force: arc_swap::Guard::into_inner(in_force),
                shared: shared.clone(),
                line,
            }));
            return ResponseFuture::new(next.into_state(&mut self.inner, request, None));
        }
        match ask::ask_store(rules, shared.limiter.ledger(), &mut enforced.plan) {
            Answer::Now(result) => {
                match decide(shared, &in_force, &mut request, &mut enforced, result) {
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
                ResponseFuture::new(State::checking(
                    store,
                    inner,
                    request,
                    enforced,
                    arc_swap::Guard::into_inner(in_force),
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
fn record_shadow(shared: &Arc<Shared>, in_force: &Arc<InForce>, mut plan: Plan) {
    let record = |shared: &Shared,
                  in_force: &InForce,
                  plan: &Plan,
                  result: Result<(), StoreError>| match result {
        Ok(()) => {
            for entry in plan.rules() {
                let metrics = &in_force.meters.rules[entry.index];
                metrics.record_shadow(entry.outcome.verdict, &entry.key);
                observe::event(entry, plan.grpc_method(), true, shared.redact_keys.as_ref());
            }
        }
        Err(error) => {
            for entry in plan.rules() {
                in_force.meters.rules[entry.index].store_error();
            }
            // The store's circuit breaker logs failures, one line per interval with a count.
            tracing::debug!(%error, "rate limit: store failed deciding shadow rules");
        }
    };
    match ask::ask_store(&in_force.rules, shared.limiter.ledger(), &mut plan) {
        Answer::Now(result) => record(shared, in_force, &plan, result),
        Answer::Later(pending) => {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let (shared, in_force) = (shared.clone(), in_force.clone());
                runtime.spawn(async move {
                    let result = pending.await.and_then(|outcomes| plan.answer(outcomes));
                    record(&shared, &in_force, &plan, result)
                });
            }
        }
    }
}
