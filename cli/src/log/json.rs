//! JSON lines: one object per line, fields named by the [`FieldMap`].

use std::io::{self, BufRead};

use serde_json::{Map, Value};

use super::lines::{Line, Lines};
use super::{Entry, FieldMap, Skip, Source};

pub(super) struct Reader<R> {
    lines: Lines<R>,
    fields: FieldMap,
}

impl<R: BufRead> Reader<R> {
    pub(super) fn new(input: R, fields: FieldMap) -> Self {
        Reader {
            lines: Lines::new(input),
            fields,
        }
    }
}

impl<R: BufRead> Source for Reader<R> {
    fn next_entry(&mut self) -> Option<io::Result<Result<Entry, Skip>>> {
        let fields = &self.fields;
        Some(self.lines.next_line()?.map(|line| match line {
            Line::Text(text) => parse(fields, text),
            Line::TooLong => Err(Skip::TooLong),
        }))
    }
}

fn parse(fields: &FieldMap, line: &[u8]) -> Result<Entry, Skip> {
    let text = std::str::from_utf8(line).map_err(|_| Skip::NotText)?;
    let object: Map<String, Value> = serde_json::from_str(text).map_err(|error| {
        if error.is_eof() {
            Skip::Truncated
        } else {
            Skip::BadRecord
        }
    })?;
    // Numbers (a timestamp in seconds) are read as their text.
    let numbers: Vec<(&str, String)> = object
        .iter()
        .filter_map(|(k, v)| v.as_number().map(|n| (k.as_str(), n.to_string())))
        .collect();
    fields.entry(|name| match object.get(name)? {
        Value::String(s) => Some(s.as_str()),
        Value::Number(_) => numbers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str()),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mapped_fields() {
        let fields = FieldMap::parse(&[
            "header:x-api-key=api_key".into(),
            "time=ts".into(),
            "peer=client".into(),
        ])
        .unwrap();
        let entry = parse(
            &fields,
            br#"{"ts": 1700000000.5, "client": "10.0.0.1:443", "request": "GET /v1/items HTTP/2.0", "api_key": "k1"}"#,
        )
        .unwrap();
        assert_eq!(entry.stamp.at, 1_700_000_000_500_000);
        assert_eq!(entry.uri, "/v1/items");
        assert_eq!(entry.peer, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(entry.headers[0].1, "k1");
        assert_eq!(
            parse(&fields, br#"{"ts": 1, "request": "GET /"#).unwrap_err(),
            Skip::Truncated
        );
        assert_eq!(parse(&fields, br#"[1, 2]"#).unwrap_err(), Skip::BadRecord);
        assert_eq!(
            parse(&fields, br#"{"request": "GET /"}"#).unwrap_err(),
            Skip::BadTime
        );
    }
}
