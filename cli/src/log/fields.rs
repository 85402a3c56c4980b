//! `--field TARGET=SOURCE`: which JSON field or CSV column gives each part of a request.

use http::{HeaderName, HeaderValue};

use super::{parse_method, parse_peer, parse_request_line, parse_uri, Entry, Skip};
use crate::time::parse_any;

/// Where each part of a request is read from.
#[derive(Clone, Debug)]
pub struct FieldMap {
    /// The timestamp (default `time`).
    pub time: String,
    /// The method (default `method`).
    pub method: String,
    /// The path and query (default `path`).
    pub path: String,
    /// The whole request line, `GET /a HTTP/1.1`, read when the method or path field is absent
    /// (default `request`).
    pub request: String,
    /// The client address (default `remote_addr`).
    pub peer: String,
    /// Headers, each from a field of its own.
    pub headers: Vec<(HeaderName, String)>,
}

impl Default for FieldMap {
    fn default() -> Self {
        FieldMap {
            time: "time".into(),
            method: "method".into(),
            path: "path".into(),
            request: "request".into(),
            peer: "remote_addr".into(),
            headers: Vec::new(),
        }
    }
}

impl FieldMap {
    /// The defaults with `specs` (`time=ts`, `peer=remote_addr`, `header:x-api-key=api_key`)
    /// applied.
    pub fn parse(specs: &[String]) -> Result<FieldMap, String> {
        let mut map = FieldMap::default();
        for spec in specs {
            let (target, source) = spec
                .split_once('=')
                .ok_or_else(|| format!("--field {spec:?}: expected TARGET=SOURCE"))?;
            let source = source.to_owned();
            match target {
                "time" => map.time = source,
                "method" => map.method = source,
                "path" => map.path = source,
                "request" => map.request = source,
                "peer" => map.peer = source,
                _ => {
                    let name = target.strip_prefix("header:").ok_or_else(|| {
                        format!("--field {spec:?}: the target is one of time, method, path, request, peer or header:NAME")
                    })?;
                    let name = HeaderName::try_from(name)
                        .map_err(|_| format!("--field {spec:?}: {name:?} is not a header name"))?;
                    map.headers.push((name, source));
                }
            }
        }
        Ok(map)
    }

    /// The entry of one record, reading fields through `get`.
    pub(super) fn entry<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> Result<Entry, Skip> {
        let stamp = get(&self.time).and_then(parse_any).ok_or(Skip::BadTime)?;
        let (method, path) = match (get(&self.method), get(&self.path)) {
            (Some(method), Some(path)) => (parse_method(method)?, parse_uri(path)?),
            _ => parse_request_line(get(&self.request).ok_or(Skip::BadRequest)?)?,
        };
        let peer = get(&self.peer).map_or(Ok(None), parse_peer)?;
        let headers = self
            .headers
            .iter()
            .filter_map(|(name, field)| {
                let value = HeaderValue::from_str(get(field)?).ok()?;
                Some((name.clone(), value))
            })
            .collect();
        Ok(Entry {
            stamp,
            method,
            uri: path,
            peer,
            headers,
        })
    }
}
