//! Sending one request through a layered service and reading the whole response.

#![allow(dead_code)]

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tower::{Service, ServiceExt};

/// What `RateLimitLayer` makes of a service answering with `B` bodies: the services these tests
/// send requests through.
pub(crate) trait Limited<B>:
    Service<
        Request<B>,
        Response = Response<tollgate::middleware::ResponseBody<B>>,
        Error = Infallible,
    > + Clone
{
}

impl<B, S> Limited<B> for S where
    S: Service<
            Request<B>,
            Response = Response<tollgate::middleware::ResponseBody<B>>,
            Error = Infallible,
        > + Clone
{
}

/// The response to `request`, with its body collected.
pub(crate) async fn send<S: Limited<Full<Bytes>>>(
    service: &S,
    request: Request<Full<Bytes>>,
) -> Response<Bytes> {
    let response = service.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
}
