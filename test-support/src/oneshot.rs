//! Sending one request through a layered service and reading the whole response.

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tollgate::{Limiter, RateLimitLayer};
use tower::{service_fn, Layer, Service, ServiceExt};

/// What `RateLimitLayer` makes of a service answering with `B` bodies: the services these tests
/// send requests through.
pub trait Limited<B>:
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
pub async fn send<S: Limited<Full<Bytes>>>(
    service: &S,
    request: Request<Full<Bytes>>,
) -> Response<Bytes> {
    let response = service.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
}

/// `limiter`'s layer around a service answering 200 with an empty body.
pub fn app(limiter: Limiter) -> impl Limited<Full<Bytes>> {
    let layer = RateLimitLayer::from_limiter(limiter).build().unwrap();
    layer.layer(service_fn(|_: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::default()))
    }))
}

/// A `GET /` carrying `key` in `x-api-key`.
pub fn keyed_request(key: &str) -> Request<Full<Bytes>> {
    Request::get("/")
        .header("x-api-key", key)
        .body(Full::default())
        .unwrap()
}

/// A response as `status | RateLimit-Policy | RateLimit` (a missing field reads as empty).
pub fn summary(response: &Response<Bytes>) -> String {
    let field = |name: &str| {
        response
            .headers()
            .get(name)
            .map_or(String::new(), |v| v.to_str().unwrap().to_owned())
    };
    format!(
        "{} | {} | {}",
        response.status().as_u16(),
        field("ratelimit-policy"),
        field("ratelimit")
    )
}
