//! An app whose every response streams until the test ends it: what concurrency tests need to
//! hold slots open and give them back at a chosen moment.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::channel::mpsc;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{Full, StreamBody};
use tollgate::middleware::ResponseBody;
use tollgate::RateLimitLayer;
use tower::{service_fn, Layer, Service};

/// The frames of one streamed body, as its body reads them.
pub type Frames = mpsc::UnboundedReceiver<Result<Frame<Bytes>, Infallible>>;
/// A response body streamed frame by frame, as the test sends them.
pub type Streaming = StreamBody<Frames>;
/// Where a test sends a streamed body's frames (dropping it ends the body).
pub type Sender = mpsc::UnboundedSender<Result<Frame<Bytes>, Infallible>>;

/// The bodies the inner service is streaming, by request id (its `x-id` header, 0 without one):
/// dropping a sender ends its body.
pub type Open = Arc<Mutex<Vec<(u32, Sender)>>>;

/// `layer` around a service that answers every request with a body streamed until the test
/// ends it; the senders of the bodies, in the order the service was called.
pub fn streaming(
    layer: &RateLimitLayer,
) -> (
    Open,
    impl Service<
            Request<Full<Bytes>>,
            Response = Response<ResponseBody<Streaming>>,
            Error = Infallible,
            Future: Send,
        > + Clone
        + Send
        + 'static,
) {
    let open = Open::default();
    let seen = open.clone();
    let service = service_fn(move |req: Request<Full<Bytes>>| {
        let id = req
            .headers()
            .get("x-id")
            .map_or(0, |v| v.to_str().unwrap().parse().unwrap());
        let (tx, rx) = mpsc::unbounded();
        seen.lock().unwrap().push((id, tx));
        async move { Ok::<_, Infallible>(Response::new(StreamBody::new(rx))) }
    });
    (open, layer.layer(service))
}

/// The ids of the requests whose bodies are still streaming.
pub fn called(open: &Open) -> Vec<u32> {
    open.lock().unwrap().iter().map(|(id, _)| *id).collect()
}

/// Ends the streamed body of request `id`.
pub fn end(open: &Open, id: u32) {
    open.lock().unwrap().retain(|(i, _)| *i != id);
}
