//! Sending one request through a layered service and reading the whole response.

#![allow(dead_code)]

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tower::{Service, ServiceExt};

/// The response to `request`, with its body collected.
pub(crate) async fn send<S>(service: &S, request: Request<Full<Bytes>>) -> Response<Bytes>
where
    S: Service<
            Request<Full<Bytes>>,
            Response = Response<tollgate::ResponseBody<Full<Bytes>>>,
            Error = Infallible,
        > + Clone,
{
    let response = service.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
}
