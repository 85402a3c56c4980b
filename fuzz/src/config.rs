//! The `config` target: arbitrary text as a TOML and as a YAML configuration.
//!
//! Input: the text of a configuration file (bytes that are not UTF-8 are replaced).
//!
//! Checked: nothing panics; an error renders as `[line L, column C: ][PLACE: ]MESSAGE` with a
//! message and a line inside the text; a text that builds a layer also reloads into it, and a
//! few requests pass through that layer.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::Full;
use tollgate::config::Config;
use tollgate::config::{ConfigFileError, ConfigFormat};
use tollgate::RateLimitLayer;
use tower::{service_fn, Layer, ServiceExt};

/// Runs one input.
pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    for format in [ConfigFormat::Toml, ConfigFormat::Yaml] {
        let built = Config::parse(format, &text).and_then(|config| Ok((config.layer()?, config)));
        match built {
            Ok((layer, config)) => {
                let _ = format!("{layer:?}");
                if let Err(error) = config.reload(&layer) {
                    panic!("{format:?}: built a layer but cannot reload it: {error}");
                }
                requests(&layer);
            }
            Err(error) => check_error(&error, &text),
        }
    }
}

fn check_error(error: &ConfigFileError, text: &str) {
    let shown = error.to_string();
    assert!(!error.message().is_empty(), "an error says what is wrong");
    assert!(shown.ends_with(error.message()), "{shown}");
    if !error.path().is_empty() {
        assert!(shown.contains(error.path()), "{shown}");
    }
    assert!(error.file().is_none());
    if let (Some(line), Some(column)) = (error.line(), error.column()) {
        assert!(line >= 1 && column >= 1, "{shown}");
        // YAML also ends a line at a bare `\r` (so every break counts; CRLF as two is fine), and
        // may place an error at the end of the stream, on the line after the last one.
        assert!(line <= text.matches(['\n', '\r']).count() + 2, "{shown}");
        assert!(shown.starts_with(&format!("line {line}, column {column}: ")));
    }
}

/// A few requests through the layer a configuration built: its numbers must not break the
/// request path.
fn requests(layer: &RateLimitLayer) {
    let inner = service_fn(|_: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    });
    let service = layer.layer(inner);
    super::runtime().block_on(async {
        for (method, path) in [
            (Method::GET, "/"),
            (Method::POST, "/login"),
            (Method::GET, "/api/v1/items"),
            (Method::GET, "/api/v1/items"),
        ] {
            let mut request = Request::builder()
                .method(method)
                .uri(path)
                .header("x-api-key", "key-abc")
                .header("x-forwarded-for", "203.0.113.7")
                .header("x-plan", "pro")
                .header("x-cost", "3")
                .body(Full::new(Bytes::new()))
                .unwrap();
            request
                .extensions_mut()
                .insert(SocketAddr::from(([10, 0, 0, 2], 40_000)));
            let response = service.clone().oneshot(request).await.unwrap();
            let status = response.status();
            assert!(
                status.is_success() || status.is_client_error() || status.is_server_error(),
                "{status}"
            );
        }
    });
}
