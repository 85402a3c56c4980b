//! gRPC-shaped answers.
//!
//! A gRPC client reads a call's outcome from `grpc-status`, never from the HTTP status: a `429`
//! with a JSON body reaches a tonic client as `Internal` ("invalid compression flag"). So a
//! request that speaks gRPC gets a *trailers-only* response instead: HTTP `200`, the gRPC content
//! type, `grpc-status` and a percent-encoded `grpc-message` in the headers, and no body.

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};

use crate::key::protocol::Protocol;

/// `grpc-status`.
pub(crate) static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-message`.
pub(crate) static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// `grpc-retry-pushback-ms`: how long a client should wait before retrying, as gRPC's retry
/// design (A6) reads it.
///
/// A6 defines the value as an ASCII signed 32-bit integer and tells a client that cannot parse
/// it never to retry, so a longer wait (a key blocked for 30 days) is sent as `2147483647`
/// (about 24.8 days); the HTTP `Retry-After` of the same refusal keeps the true wait.
pub static GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// The longest `grpc-message` the layer sends, in bytes once encoded; a longer message is cut
/// and ends with `...` (rule names are the user's, and could be long).
pub(crate) const MAX_MESSAGE: usize = 1024;

/// The `content-type` of a protocol's answers.
fn content_type(protocol: Protocol) -> HeaderValue {
    HeaderValue::from_static(match protocol {
        Protocol::GrpcWeb => "application/grpc-web",
        Protocol::GrpcWebText => "application/grpc-web-text",
        Protocol::Grpc | Protocol::Http => "application/grpc",
    })
}

/// The gRPC status codes the layer answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Code {
    InvalidArgument = 3,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

impl Code {
    /// The code for a refusal the HTTP answer would give `status`.
    pub(crate) fn of_status(status: StatusCode) -> Code {
        match status {
            StatusCode::UNAUTHORIZED => Code::Unauthenticated,
            StatusCode::FORBIDDEN => Code::PermissionDenied,
            StatusCode::TOO_MANY_REQUESTS => Code::ResourceExhausted,
            StatusCode::SERVICE_UNAVAILABLE => Code::Unavailable,
            s if s.is_server_error() => Code::Internal,
            _ => Code::InvalidArgument,
        }
    }
}

/// A trailers-only gRPC response: `200`, the protocol's content type, `grpc-status` and
/// `grpc-message`, no body. `code` is a gRPC status code number (e.g. 8 for
/// `RESOURCE_EXHAUSTED`).
pub(crate) fn trailers_only(protocol: Protocol, code: i32, message: &str) -> Response<Bytes> {
    let mut response = Response::new(Bytes::new());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, content_type(protocol));
    headers.insert(GRPC_STATUS.clone(), HeaderValue::from(code));
    if !message.is_empty() {
        headers.insert(GRPC_MESSAGE.clone(), encode_message(message));
    }
    response
}

/// The largest `grpc-retry-pushback-ms` a client can read: A6's value is a signed 32-bit integer.
pub(crate) const MAX_PUSHBACK_MS: u32 = i32::MAX as u32;

/// `grpc-retry-pushback-ms` for a wait: whole milliseconds, rounded up, at most
/// [`MAX_PUSHBACK_MS`].
pub(crate) fn pushback_value(wait: Duration) -> HeaderValue {
    let millis = wait.as_nanos().div_ceil(1_000_000);
    HeaderValue::from(u32::try_from(millis).map_or(MAX_PUSHBACK_MS, |ms| ms.min(MAX_PUSHBACK_MS)))
}

/// `message` percent-encoded as gRPC's HTTP/2 protocol asks (every byte outside printable ASCII,
/// and `%` itself, as `%XX` of its UTF-8), at most [`MAX_MESSAGE`] bytes long.
pub(crate) fn encode_message(message: &str) -> HeaderValue {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    const CUT: &[u8] = b"...";
    let mut out = Vec::with_capacity(message.len().min(MAX_MESSAGE));
    for &byte in message.as_bytes() {
        let width = if (0x20..0x7f).contains(&byte) && byte != b'%' {
            1
        } else {
            3
        };
        if out.len() + width > MAX_MESSAGE - CUT.len() {
            out.extend_from_slice(CUT);
            break;
        }
        if width == 1 {
            out.push(byte);
        } else {
            out.extend_from_slice(&[
                b'%',
                HEX[usize::from(byte >> 4)],
                HEX[usize::from(byte & 15)],
            ]);
        }
    }
    // Only visible ASCII and spaces were written, which a field value always accepts.
    HeaderValue::from_maybe_shared(Bytes::from(out))
        .unwrap_or_else(|_| HeaderValue::from_static("rate limited"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(encode_message("retry in 2 s"), "retry in 2 s");
        assert_eq!(encode_message("100% \"used\""), "100%25 \"used\"");
        assert_eq!(encode_message("tab\there"), "tab%09here");
        assert_eq!(encode_message("quota épuisée"), "quota %C3%A9puis%C3%A9e");
    }

    #[test]
    fn long_messages_are_cut() {
        let long = "x".repeat(10 * MAX_MESSAGE);
        let value = encode_message(&long);
        assert_eq!(value.len(), MAX_MESSAGE);
        assert!(value.as_bytes().ends_with(b"..."));
        let wide = "é".repeat(MAX_MESSAGE);
        let value = encode_message(&wide);
        assert!(value.len() <= MAX_MESSAGE);
        // Cut between escapes, never inside one.
        let text = value.to_str().unwrap();
        let body = text.strip_suffix("...").unwrap();
        assert!(body.len() % 6 == 0 && body.starts_with("%C3%A9"));
    }

    /// Percent-decodes an encoded message.
    fn decode(encoded: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < encoded.len() {
            if encoded[i] == b'%' {
                let hex = std::str::from_utf8(&encoded[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 3;
            } else {
                out.push(encoded[i]);
                i += 1;
            }
        }
        out
    }

    proptest::proptest! {
        #[test]
        fn any_message_encodes_to_a_bounded_prefix(message in ".{0,1500}") {
            let value = encode_message(&message);
            let bytes = value.as_bytes();
            proptest::prop_assert!(bytes.len() <= MAX_MESSAGE);
            proptest::prop_assert!(bytes.iter().all(|b| (0x20..0x7f).contains(b)));
            let (body, cut) = match bytes.strip_suffix(b"...") {
                Some(body) if bytes.len() + 3 > MAX_MESSAGE => (body, true),
                _ => (bytes, false),
            };
            let decoded = decode(body);
            if cut {
                proptest::prop_assert!(message.as_bytes().starts_with(&decoded));
            } else {
                proptest::prop_assert_eq!(decoded, message.as_bytes());
            }
        }
    }

    #[test]
    fn pushback_rounds_up_to_milliseconds() {
        assert_eq!(pushback_value(Duration::from_secs(12)), "12000");
        assert_eq!(pushback_value(Duration::from_micros(1)), "1");
        assert_eq!(pushback_value(Duration::from_micros(1500)), "2");
        assert_eq!(pushback_value(Duration::ZERO), "0");
    }

    #[test]
    fn pushback_is_capped_at_a_signed_32_bit_integer() {
        let thirty_days = Duration::from_secs(30 * 24 * 3600);
        assert_eq!(pushback_value(thirty_days), "2147483647");
        assert_eq!(pushback_value(Duration::MAX), "2147483647");
        assert_eq!(
            pushback_value(Duration::from_millis(2_147_483_647)),
            "2147483647"
        );
        assert_eq!(
            pushback_value(Duration::from_millis(2_147_483_646)),
            "2147483646"
        );
    }

    #[test]
    fn refusal_statuses_map_to_codes() {
        assert_eq!(
            Code::of_status(StatusCode::BAD_REQUEST),
            Code::InvalidArgument
        );
        assert_eq!(
            Code::of_status(StatusCode::UNAUTHORIZED),
            Code::Unauthenticated
        );
        assert_eq!(
            Code::of_status(StatusCode::FORBIDDEN),
            Code::PermissionDenied
        );
        assert_eq!(
            Code::of_status(StatusCode::INTERNAL_SERVER_ERROR),
            Code::Internal
        );
        assert_eq!(
            Code::of_status(StatusCode::SERVICE_UNAVAILABLE),
            Code::Unavailable
        );
    }
}
