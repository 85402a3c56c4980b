//! `ResponseBody`: the inner service's body, or the body of a response the layer wrote itself.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::StatusCode;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::engine::settlement::Settlement;
use crate::engine::slot::Slots;

pin_project! {
    /// The body of a [`RateLimit`](crate::middleware::RateLimit) response.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
        // The request's concurrency slots, given back when the body ends or is dropped.
        slots: Option<Box<Slots>>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        // A gRPC response whose rules settle on the status its trailers bring.
        Settling {
            #[pin]
            body: B,
            status: StatusCode,
            settlement: Option<Box<Settlement>>,
        },
        Own { data: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        ResponseBody {
            kind: Kind::Inner { body },
            slots: None,
        }
    }

    pub(crate) fn settling(body: B, status: StatusCode, settlement: Box<Settlement>) -> Self {
        ResponseBody {
            kind: Kind::Settling {
                body,
                status,
                settlement: Some(settlement),
            },
            slots: None,
        }
    }

    pub(crate) fn own(data: Bytes) -> Self {
        ResponseBody {
            kind: Kind::Own {
                data: (!data.is_empty()).then_some(data),
            },
            slots: None,
        }
    }

    /// The same body, holding the request's concurrency slots until it ends or is dropped (a
    /// streaming body holds them to its last frame).
    pub(crate) fn holding(mut self, slots: Box<Slots>) -> Self {
        self.slots = Some(slots);
        self
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = poll_kind(this.kind, cx);
        if this.slots.is_some() && matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            // The body ended (or failed): its slots go back now, not when a server gets round
            // to dropping it.
            drop(this.slots.take());
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } | Kind::Settling { body, .. } => body.is_end_stream(),
            Kind::Own { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } | Kind::Settling { body, .. } => body.size_hint(),
            Kind::Own { data } => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
        }
    }
}

fn poll_kind<B>(
    kind: Pin<&mut Kind<B>>,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, B::Error>>>
where
    B: Body<Data = Bytes>,
{
    match kind.project() {
        KindProj::Inner { body } => body.poll_frame(cx),
        KindProj::Settling {
            body,
            status,
            settlement,
        } => {
            let polled = body.poll_frame(cx);
            match &polled {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(trailers) = frame.trailers_ref() {
                        if let Some(settlement) = settlement.take() {
                            settlement.on_trailers(*status, trailers);
                        }
                    }
                }
                // Ended (or failed) without trailers: nothing to settle on, the charge stays.
                Poll::Ready(None) | Poll::Ready(Some(Err(_))) => drop(settlement.take()),
                Poll::Pending => {}
            }
            polled
        }
        KindProj::Own { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            Kind::Inner { .. } | Kind::Settling { .. } => "inner",
            Kind::Own { .. } => "rate-limit response",
        };
        f.debug_tuple("ResponseBody").field(&kind).finish()
    }
}
