//! The answer's `dynamic_metadata` (`RESPONSE_DYNAMIC_METADATA`), in the reference's shape: Envoy
//! puts it in the request's dynamic metadata for later filters and access logs.
//!
//! ```text
//! domain: "rl"
//! descriptors: [{ entries: ["service=service_1"], hitsAddend: 2, limit: "requests_per_unit:10 unit:DAY" }, …]
//! hitsAddend: 3                       (the request's, when not 0)
//! metadata: { … }                     (the limits that passed: their `metadata`, merged)
//! ```
//!
//! A descriptor's `limit` is written as the reference writes it, the message in protobuf's text
//! format. The metadata of the limits that passed (answered OK) are merged in the request's
//! order: a field already present stays, two structs under one name are merged the same way.

use std::collections::BTreeMap;

use super::decide::Answer;
use super::protocol::{
    code, DescriptorStatus, Kind, ListValue, RateLimitDescriptor, RateLimitRequest, Struct, Value,
};
use crate::unit::Unit;

/// The `dynamic_metadata` of `answer` to `request`, whose descriptors were answered `statuses`.
pub(crate) fn dynamic_metadata(
    request: &RateLimitRequest,
    answer: &Answer<'_>,
    statuses: &[DescriptorStatus],
) -> Struct {
    let mut fields = BTreeMap::new();
    fields.insert("domain".to_owned(), string(answer.domain.to_owned()));
    let descriptors = request.descriptors.iter().map(descriptor).collect();
    fields.insert(
        "descriptors".to_owned(),
        Value::of(Kind::ListValue(ListValue {
            values: descriptors,
        })),
    );
    if request.hits_addend != 0 {
        let addend = Kind::NumberValue(f64::from(request.hits_addend));
        fields.insert("hitsAddend".to_owned(), Value::of(addend));
    }
    let mut passed = Struct::default();
    for (j, status) in answer.judged.iter().zip(statuses) {
        if status.code == code::OVER_LIMIT {
            continue;
        }
        if let Some(metadata) = j.limit.as_ref().and_then(|l| l.metadata.as_ref()) {
            merge(&mut passed, to_struct(metadata));
        }
    }
    if !passed.fields.is_empty() {
        fields.insert("metadata".to_owned(), Value::of(Kind::StructValue(passed)));
    }
    Struct { fields }
}

/// One request descriptor: its entries as `key=value`, its own limit and `hits_addend`.
fn descriptor(d: &RateLimitDescriptor) -> Value {
    let mut fields = BTreeMap::new();
    let entries = d
        .entries
        .iter()
        .map(|e| {
            let key = String::from_utf8_lossy(&e.key);
            let value = String::from_utf8_lossy(&e.value);
            string(format!("{key}={value}"))
        })
        .collect();
    fields.insert(
        "entries".to_owned(),
        Value::of(Kind::ListValue(ListValue { values: entries })),
    );
    if let Some(limit) = d.limit {
        // Protobuf's text format of the message, fields at their default left out.
        let mut text = Vec::new();
        if limit.requests_per_unit != 0 {
            text.push(format!("requests_per_unit:{}", limit.requests_per_unit));
        }
        if let Some(unit) = Unit::from_number(limit.unit) {
            text.push(format!("unit:{}", unit.name().to_ascii_uppercase()));
        }
        fields.insert("limit".to_owned(), string(text.join(" ")));
    }
    if let Some(addend) = d.hits_addend {
        fields.insert(
            "hitsAddend".to_owned(),
            Value::of(Kind::NumberValue(addend.value as f64)),
        );
    }
    Value::of(Kind::StructValue(Struct { fields }))
}

fn string(s: String) -> Value {
    Value::of(Kind::StringValue(s))
}

/// Merges `from` into `into`: a field `into` has stays, unless both are structs (merged so).
fn merge(into: &mut Struct, from: Struct) {
    for (name, value) in from.fields {
        match into.fields.get_mut(&name) {
            Some(Value {
                kind: Some(Kind::StructValue(existing)),
            }) => {
                if let Some(Kind::StructValue(more)) = value.kind {
                    merge(existing, more);
                }
            }
            Some(_) => {}
            None => {
                into.fields.insert(name, value);
            }
        }
    }
}

/// A configuration's `metadata` as a protobuf struct.
fn to_struct(map: &serde_json::Map<String, serde_json::Value>) -> Struct {
    Struct {
        fields: map.iter().map(|(k, v)| (k.clone(), to_value(v))).collect(),
    }
}

fn to_value(value: &serde_json::Value) -> Value {
    use serde_json::Value as Json;
    Value::of(match value {
        Json::Null => Kind::NullValue(0),
        Json::Bool(b) => Kind::BoolValue(*b),
        Json::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        Json::String(s) => Kind::StringValue(s.clone()),
        Json::Array(list) => Kind::ListValue(ListValue {
            values: list.iter().map(to_value).collect(),
        }),
        Json::Object(map) => Kind::StructValue(to_struct(map)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Value {
        string(s.to_owned())
    }

    fn object(fields: &[(&str, Value)]) -> Struct {
        Struct {
            fields: fields
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
        }
    }

    #[test]
    fn the_first_value_stays_and_structs_merge() {
        let mut into = object(&[
            ("name", text("service_1")),
            (
                "inner",
                Value::of(Kind::StructValue(object(&[("a", text("1"))]))),
            ),
        ]);
        merge(
            &mut into,
            object(&[
                ("name", text("service_2")),
                ("other", text("x")),
                (
                    "inner",
                    Value::of(Kind::StructValue(object(&[
                        ("a", text("2")),
                        ("b", text("3")),
                    ]))),
                ),
            ]),
        );
        let expected = object(&[
            ("name", text("service_1")),
            ("other", text("x")),
            (
                "inner",
                Value::of(Kind::StructValue(object(&[
                    ("a", text("1")),
                    ("b", text("3")),
                ]))),
            ),
        ]);
        assert_eq!(into, expected);
    }
}
