//! `ResponseFuture`: waits for the store when it needs I/O, then for the inner service.

use crate::engine::ask;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::body::ResponseBody;
use super::decide::{decide, AwaitSlot, Hold, Next};
use super::shared::{InForce, Shared};
use crate::engine::decision::Decision;
use crate::engine::settlement::Settlement;
use crate::engine::slot::{Slots, Ticket, Woken};
use crate::key::protocol::Protocol;
use crate::response::AllowedHeaders;
use ask::{Answer, Pending};

pin_project! {
    /// The response future of [`RateLimit`](crate::middleware::RateLimit).
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B>,
    }
}

pin_project! {
    #[project = StateProj]
    pub(crate) enum State<S, B>
    where
        S: Service<Request<B>>,
    {
        // The store is deciding (only stores that need I/O get here).
        // (Boxed: the slow paths' state would otherwise make every request's future larger.)
        Checking {
            store: Pending,
            deciding: Option<Box<Deciding<S, B>>>,
        },
        // Queue mode: the request waits for its reserved slot.
        Waiting {
            sleep: Pin<Box<tokio::time::Sleep>>,
            queued: Option<Box<Queued<S, B>>>,
        },
        // Queue mode on a concurrency rule: the request waits in line for a slot.
        AwaitingSlot {
            ticket: Option<Ticket>,
            waiting: Option<Box<InLine<S, B>>>,
        },
        // The request passed: the inner service is running.
        Calling {
            #[pin]
            future: S::Future,
            headers: Option<AllowedHeaders>,
            delayed: Option<Duration>,
            settlement: Option<Box<Settlement>>,
            slots: Option<Box<Slots>>,
        },
        // The layer answers itself.
        Respond {
            response: Option<Response<Bytes>>,
        },
    }
}

/// What a queued request keeps while it waits.
pub(crate) struct Queued<S, B> {
    inner: S,
    request: Request<B>,
    headers: Option<AllowedHeaders>,
    hold: Box<Hold>,
    wait: Duration,
    settlement: Option<Box<Settlement>>,
    slots: Option<Box<Slots>>,
}

/// What a request waiting in line for a concurrency slot keeps.
pub(crate) struct InLine<S, B> {
    inner: S,
    request: Request<B>,
    waiting: AwaitSlot,
}

/// What a request waiting for the store keeps.
pub(crate) struct Deciding<S, B> {
    inner: S,
    request: Request<B>,
    /// The decision whose plan the store is answering (filled where it lies, then handed on).
    decision: Decision,
    in_force: Arc<InForce>,
    shared: Arc<Shared>,
    started: tokio::time::Instant,
    /// The place in line of a request that waited for a slot and asks again.
    ticket: Option<Ticket>,
}

impl<S, B> State<S, B>
where
    S: Service<Request<B>>,
{
    pub(crate) fn checking(
        store: Pending,
        inner: S,
        request: Request<B>,
        decision: Decision,
        in_force: Arc<InForce>,
        shared: Arc<Shared>,
        ticket: Option<Ticket>,
    ) -> Self {
        State::Checking {
            store,
            deciding: Some(Box::new(Deciding {
                inner,
                request,
                decision,
                in_force,
                shared,
                started: tokio::time::Instant::now(),
                ticket,
            })),
        }
    }

    pub(crate) fn calling(
        future: S::Future,
        headers: Option<AllowedHeaders>,
        settlement: Option<Box<Settlement>>,
        slots: Option<Box<Slots>>,
    ) -> Self {
        State::Calling {
            future,
            headers,
            delayed: None,
            settlement,
            slots,
        }
    }

    pub(crate) fn awaiting_slot(
        ticket: Ticket,
        inner: S,
        request: Request<B>,
        waiting: AwaitSlot,
    ) -> Self {
        State::AwaitingSlot {
            ticket: Some(ticket),
            waiting: Some(Box::new(InLine {
                inner,
                request,
                waiting,
            })),
        }
    }

    pub(crate) fn waiting(
        wait: Duration,
        inner: S,
        request: Request<B>,
        headers: Option<AllowedHeaders>,
        hold: Box<Hold>,
        settlement: Option<Box<Settlement>>,
        slots: Option<Box<Slots>>,
    ) -> Self {
        State::Waiting {
            sleep: Box::pin(tokio::time::sleep(wait)),
            queued: Some(Box::new(Queued {
                inner,
                request,
                headers,
                hold,
                wait,
                settlement,
                slots,
            })),
        }
    }

    pub(crate) fn respond(response: Response<Bytes>) -> Self {
        State::Respond {
            response: Some(response),
        }
    }
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    pub(crate) fn new(state: State<S, B>) -> Self {
        ResponseFuture { state }
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let mut this = self.as_mut().project();
            let next = match this.state.as_mut().project() {
                StateProj::Checking { store, deciding } => {
                    let result = ready!(Pin::new(store).poll(cx));
                    let Some(deciding) = deciding.take() else {
                        // Polled again after completion.
                        return Poll::Pending;
                    };
                    let Deciding {
                        mut inner,
                        mut request,
                        mut decision,
                        in_force,
                        shared,
                        started,
                        ticket,
                    } = *deciding;
                    let latency = started.elapsed().as_secs_f64();
                    in_force.meters.store_latency.record(latency);
                    let result = result.and_then(|outcomes| decision.plan.answer(outcomes));
                    decide(&shared, &in_force, &mut request, &mut decision, result)
                        .into_state(&mut inner, request, ticket)
                }
                StateProj::AwaitingSlot { ticket, waiting } => {
                    let woken = match ticket.as_mut() {
                        Some(ticket) => ready!(ticket.poll_woken(cx)),
                        None => return Poll::Pending,
                    };
                    let (Some(ticket), Some(in_line)) = (ticket.take(), waiting.take()) else {
                        return Poll::Pending;
                    };
                    let InLine {
                        mut inner,
                        mut request,
                        waiting,
                    } = *in_line;
                    match woken {
                        Woken::TimedOut => State::respond(waiting.denied(Protocol::of(&request))),
                        Woken::Retry => {
                            let AwaitSlot {
                                plan,
                                in_force,
                                shared,
                                line: _,
                            } = waiting;
                            // Asked again, and answered where it lies.
                            let mut decision = Decision::from(plan);
                            let ledger = shared.limiter.ledger();
                            match ask::ask_store(&in_force.rules, ledger, &mut decision.plan) {
                                Answer::Now(result) => {
                                    let next = decide(
                                        &shared,
                                        &in_force,
                                        &mut request,
                                        &mut decision,
                                        result,
                                    );
                                    next.into_state(&mut inner, request, Some(ticket))
                                }
                                Answer::Later(store) => State::checking(
                                    store,
                                    inner,
                                    request,
                                    decision,
                                    in_force,
                                    shared,
                                    Some(ticket),
                                ),
                            }
                        }
                    }
                }
                StateProj::Waiting { sleep, queued } => {
                    ready!(sleep.as_mut().poll(cx));
                    let Some(queued) = queued.take() else {
                        return Poll::Pending;
                    };
                    let Queued {
                        mut inner,
                        request,
                        headers,
                        hold,
                        wait,
                        settlement,
                        slots,
                    } = *queued;
                    hold.release();
                    State::Calling {
                        future: inner.call(request),
                        headers,
                        delayed: Some(wait),
                        settlement,
                        slots,
                    }
                }
                StateProj::Calling {
                    future,
                    headers,
                    delayed,
                    settlement,
                    slots,
                } => {
                    // An error drops the slots here: given back.
                    let mut response = ready!(future.poll(cx))?;
                    // Settled on the head now; a gRPC status still to come is read from the
                    // trailers by the body.
                    let status = response.status();
                    let waiting = settlement
                        .take()
                        .and_then(|settlement| settlement.on_head(status, response.headers()));
                    if let Some(headers) = headers.take() {
                        headers.apply(response.headers_mut());
                    }
                    if let Some(wait) = delayed.take() {
                        crate::response::headers::insert_delay(response.headers_mut(), wait);
                    }
                    // Taken apart once: each `map` moves the whole response.
                    let (head, body) = response.into_parts();
                    let body = match waiting {
                        None => ResponseBody::inner(body),
                        Some(waiting) => ResponseBody::settling(body, status, waiting),
                    };
                    // The body holds the slots to its end.
                    let body = match slots.take() {
                        None => body,
                        Some(slots) => body.holding(slots),
                    };
                    return Poll::Ready(Ok(Response::from_parts(head, body)));
                }
                StateProj::Respond { response } => {
                    // A future polled again after it completed is the caller's bug: said at once
                    // (as tower-http's futures do), not hidden as a request that never ends.
                    let response = response
                        .take()
                        .expect("ResponseFuture polled after it completed");
                    return Poll::Ready(Ok(response.map(ResponseBody::own)));
                }
            };
            this.state.set(next);
        }
    }
}

impl<S, B> std::fmt::Debug for ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
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
                    Some(ticket) if ticket.waits_for(&waiting.in_force.rules, *index, key) => {
                        Some(ticket)
                    }
                    _ => Ticket::join(
                        waiting.shared.limiter.ledger(),
                        &waiting.in_force.rules,
                        *index,
                        key.clone(),
                    ),
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
