//! The protocol a request speaks, read from its head: it decides the shape of the answers the
//! layer writes itself, and which rules' gRPC scopes a request can be in.

use http::header::CONTENT_TYPE;
use http::{HeaderMap, Method, Request};

/// The protocol a request speaks, read from its `content-type`: it decides the shape of the
/// answers the layer writes itself.
///
/// | request `content-type` (case-insensitive) | protocol |
/// |---|---|
/// | `application/grpc`, `application/grpc+proto`, `application/grpc; charset=…` | [`Grpc`](Protocol::Grpc) |
/// | `application/grpc-web`, `application/grpc-web+proto` | [`GrpcWeb`](Protocol::GrpcWeb) |
/// | `application/grpc-web-text`, `application/grpc-web-text+proto` | [`GrpcWebText`](Protocol::GrpcWebText) |
/// | anything else (`application/grpcx`, none), or a method other than `POST` | [`Http`](Protocol::Http) |
///
/// gRPC and gRPC-Web calls are always `POST`s, so other methods are HTTP whatever their
/// `content-type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Protocol {
    /// Plain HTTP: `429` with `Retry-After` and a problem+json body.
    Http,
    /// gRPC: a trailers-only response, `content-type: application/grpc`.
    Grpc,
    /// gRPC-Web (binary): the same trailers-only response with `content-type:
    /// application/grpc-web`; gRPC-Web clients read `grpc-status` from the headers of a response
    /// without a body, as its protocol allows.
    GrpcWeb,
    /// gRPC-Web text (base64): as [`GrpcWeb`](Protocol::GrpcWeb), with `content-type:
    /// application/grpc-web-text`.
    GrpcWebText,
}

impl Protocol {
    /// The protocol of a request.
    #[inline]
    pub fn of<B>(request: &Request<B>) -> Protocol {
        // Most HTTP requests are not POSTs: they are told apart without a header lookup.
        if request.method() != Method::POST {
            return Protocol::Http;
        }
        Protocol::of_headers(request.headers())
    }

    /// The protocol a `content-type` among `headers` names (the method is not checked).
    pub fn of_headers(headers: &HeaderMap) -> Protocol {
        headers.get(CONTENT_TYPE).map_or(Protocol::Http, |value| {
            Protocol::of_content_type(value.as_bytes())
        })
    }

    fn of_content_type(value: &[u8]) -> Protocol {
        const GRPC: &[u8] = b"application/grpc";
        let value = value.trim_ascii_start();
        let Some(rest) = value
            .get(..GRPC.len())
            .filter(|head| head.eq_ignore_ascii_case(GRPC))
            .map(|_| &value[GRPC.len()..])
        else {
            return Protocol::Http;
        };
        // What may follow a media type's name: its end, a suffix (`+proto`) or parameters.
        let ends = |rest: &[u8]| matches!(rest.first(), None | Some(b'+' | b';' | b' ' | b'\t'));
        if ends(rest) {
            Protocol::Grpc
        } else if after(rest, b"-web-text").is_some_and(ends) {
            Protocol::GrpcWebText
        } else if after(rest, b"-web").is_some_and(ends) {
            Protocol::GrpcWeb
        } else {
            Protocol::Http
        }
    }

    /// Whether answers take the gRPC shape (gRPC or gRPC-Web).
    #[inline]
    pub fn is_grpc(self) -> bool {
        self != Protocol::Http
    }
}

/// `rest` after `prefix`, compared case-insensitively.
fn after<'a>(rest: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    rest.get(..prefix.len())
        .filter(|head| head.eq_ignore_ascii_case(prefix))
        .map(|_| &rest[prefix.len()..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn protocol(content_type: &str) -> Protocol {
        let request = Request::post("/pkg.Service/Method")
            .header(CONTENT_TYPE, content_type)
            .body(())
            .unwrap();
        Protocol::of(&request)
    }

    #[test]
    fn content_types_name_the_protocol() {
        assert_eq!(protocol("application/grpc"), Protocol::Grpc);
        assert_eq!(protocol("application/grpc+proto"), Protocol::Grpc);
        assert_eq!(protocol("application/grpc+json"), Protocol::Grpc);
        assert_eq!(protocol("application/grpc;charset=utf-8"), Protocol::Grpc);
        assert_eq!(protocol("application/grpc; charset=utf-8"), Protocol::Grpc);
        assert_eq!(protocol("Application/GRPC"), Protocol::Grpc);
        assert_eq!(protocol("application/grpc-web"), Protocol::GrpcWeb);
        assert_eq!(protocol("application/grpc-web+proto"), Protocol::GrpcWeb);
        assert_eq!(protocol("application/grpc-web-text"), Protocol::GrpcWebText);
        assert_eq!(
            protocol("application/grpc-web-text+proto"),
            Protocol::GrpcWebText
        );
        assert_eq!(protocol("application/grpcx"), Protocol::Http);
        assert_eq!(protocol("application/grpc-webby"), Protocol::Http);
        assert_eq!(protocol("application/json"), Protocol::Http);
        assert_eq!(protocol("application/grp"), Protocol::Http);
        assert_eq!(protocol(""), Protocol::Http);
        let get = Request::get("/")
            .header(CONTENT_TYPE, "application/grpc")
            .body(())
            .unwrap();
        assert_eq!(Protocol::of(&get), Protocol::Http);
        let none = Request::post("/").body(()).unwrap();
        assert_eq!(Protocol::of(&none), Protocol::Http);
    }

    #[test]
    fn non_ascii_content_types_are_http() {
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_bytes(b"application/grpc\xff").unwrap(),
        );
        assert_eq!(Protocol::of_headers(&headers), Protocol::Http);
        headers.insert(CONTENT_TYPE, HeaderValue::from_bytes(b"\xff\xfe").unwrap());
        assert_eq!(Protocol::of_headers(&headers), Protocol::Http);
    }
}
