//! The reference service's (envoyproxy/ratelimit) YAML, read as it is.
//!
//! One file is one domain:
//!
//! ```yaml
//! domain: edge
//! descriptors:
//!   - key: remote_address
//!     rate_limit: { unit: minute, requests_per_unit: 3 }
//! ```
//!
//! Its limits stay what they were: fixed windows of their unit, aligned to the clock as the
//! reference aligns them (windows start at multiples of the unit since the Unix epoch; a month is
//! 30 days, a year 365). Unknown fields are errors naming the file, line and column.

use std::path::Path;

use serde::Deserialize;
use tollgate::config::ConfigFormat;

use crate::document::{fixed_window, placed_error, yaml_error, Error, LibraryRules};
use crate::tree::{Domains, LimitKind, LimitSpec, Node, Policy};
use crate::unit::Unit;

/// A reference configuration file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    domain: String,
    #[serde(default)]
    descriptors: Vec<Descriptor>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Descriptor {
    key: String,
    value: Option<String>,
    rate_limit: Option<RateLimit>,
    #[serde(default)]
    descriptors: Vec<Descriptor>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
    /// Every value matching a wildcard counts under one counter.
    #[serde(default)]
    share_threshold: bool,
    /// Statistics name the request's value at this level (a key alone or a wildcard), not the
    /// configured one.
    #[serde(default)]
    value_to_metric: bool,
    /// Over this limit, the request is OVER_LIMIT only when every quota descriptor is.
    #[serde(default)]
    quota_mode: bool,
    /// Free-form: returned in the answer's `dynamic_metadata` when this level's limit passes.
    metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimit {
    unit: Option<String>,
    #[serde(default)]
    requests_per_unit: u32,
    name: Option<String>,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    replaces: Vec<Replaces>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Replaces {
    name: String,
}

/// Whether `text` (YAML) looks like a reference file rather than tollgate's: it has a top-level
/// `descriptors` and no `rules`.
pub(crate) fn looks_like_reference(value: &serde_json::Value) -> bool {
    value.get("descriptors").is_some() && value.get("rules").is_none()
}

/// Reads the reference file `text` (from `path`) into `domains`, adding a library rule to
/// `rules` for each counted limit. A domain another file configured is refused, or with
/// `merge` (the reference's `MERGE_DOMAIN_CONFIG`) its descriptors join that domain's.
pub(crate) fn read(
    path: &Path,
    text: &str,
    domains: &mut Domains,
    rules: &mut LibraryRules,
    merge: bool,
) -> Result<(), Error> {
    let file: File = yaml_serde::from_str(text).map_err(|error| yaml_error(path, &error))?;
    add(&file, domains, rules, merge)
        .map_err(|message| placed_error(path, ConfigFormat::Yaml, text, &message))
}

/// Reads one domain's configuration in the reference's structure, given as a value rather than
/// as YAML text (what an xDS management server pushes: `RateLimitConfig` is that structure), as
/// [`read`] does; errors begin with `origin` (the resource's name).
pub(crate) fn read_value(
    origin: &str,
    value: serde_json::Value,
    domains: &mut Domains,
    rules: &mut LibraryRules,
    merge: bool,
) -> Result<(), Error> {
    let file: File =
        serde_json::from_value(value).map_err(|error| Error(format!("{origin}: {error}")))?;
    add(&file, domains, rules, merge).map_err(|message| Error(format!("{origin}: {message}")))
}

/// One domain's descriptors into `domains`; an error begins with the place it is about.
fn add(
    file: &File,
    domains: &mut Domains,
    rules: &mut LibraryRules,
    merge: bool,
) -> Result<(), String> {
    if file.domain.is_empty() {
        return Err("domain: is empty".into());
    }
    if domains.contains(&file.domain) && !merge {
        return Err(format!(
            "domain: {:?} is configured twice (each domain lives in one file)",
            file.domain
        ));
    }
    let domain = domains.entry(&file.domain);
    let mut walk = Walk {
        domain: &file.domain,
        rules,
        value_to_metric: &mut domain.value_to_metric,
    };
    walk.level(&mut domain.root, &file.descriptors, "descriptors", None)
}

struct Walk<'a> {
    domain: &'a str,
    rules: &'a mut LibraryRules,
    /// Set when a level has `value_to_metric`.
    value_to_metric: &'a mut bool,
}

impl Walk<'_> {
    fn level(
        &mut self,
        node: &mut Node,
        descriptors: &[Descriptor],
        at: &str,
        parent: Option<&str>,
    ) -> Result<(), String> {
        // The reference's own check: one key and value once per level (`a_b` alone and `a`
        // with the value `b` are two descriptors, although their statistics keys read alike),
        // across the files of a merged domain too.
        for (i, descriptor) in descriptors.iter().enumerate() {
            let at = format!("{at}[{i}]");
            if descriptor.key.is_empty() {
                return Err(format!("{at}.key: is empty"));
            }
            let level = match &descriptor.value {
                Some(value) => format!("{}_{value}", descriptor.key),
                None => descriptor.key.clone(),
            };
            if node.has_child(&descriptor.key, descriptor.value.as_deref()) {
                return Err(format!(
                    "{at}: duplicate descriptor {level:?} at this level"
                ));
            }
            let stat_key = match parent {
                Some(parent) => format!("{parent}.{level}"),
                None => level,
            };
            let child = node.child_mut(&descriptor.key, descriptor.value.as_deref());
            child.set_share_threshold(descriptor.share_threshold);
            child.value_to_metric = descriptor.value_to_metric;
            *self.value_to_metric |= descriptor.value_to_metric;
            if let Some(rate_limit) = &descriptor.rate_limit {
                let spec = self
                    .limit(rate_limit, descriptor, &stat_key)
                    .map_err(|message| format!("{at}.rate_limit.{message}"))?;
                child.limit = Some(spec);
            }
            let nested = format!("{at}.descriptors");
            self.level(child, &descriptor.descriptors, &nested, Some(&stat_key))?;
        }
        Ok(())
    }

    fn limit(
        &mut self,
        rate_limit: &RateLimit,
        descriptor: &Descriptor,
        stat_key: &str,
    ) -> Result<LimitSpec, String> {
        // The library rule's name is also the name clients see when the limit has none: a
        // level whose name another already has is told apart by its suffix there too.
        let mut shown_name = rule_name(self.domain, stat_key);
        let (kind, unit) = if rate_limit.unlimited {
            if rate_limit.unit.is_some() {
                return Err("unit: an unlimited limit has no unit".into());
            }
            (LimitKind::Unlimited, Unit::Second)
        } else {
            let name = rate_limit
                .unit
                .as_deref()
                .ok_or("unit: missing (second, minute, hour, day, week, month or year)")?;
            let unit = Unit::parse(name).ok_or_else(|| {
                format!(
                    "unit: unknown unit {name:?} (second, minute, hour, day, week, month or year)"
                )
            })?;
            if rate_limit.requests_per_unit == 0 {
                (LimitKind::Blocked, unit)
            } else {
                shown_name = self.rules.unique_name(shown_name);
                self.rules.list.push(fixed_window(
                    &shown_name,
                    rate_limit.requests_per_unit,
                    unit,
                ));
                (LimitKind::Rule(shown_name.as_str().into()), unit)
            }
        };
        Ok(LimitSpec {
            kind,
            name: rate_limit.name.clone().unwrap_or(shown_name),
            requests_per_unit: rate_limit.requests_per_unit,
            unit,
            policy: Policy {
                quota: u64::from(rate_limit.requests_per_unit),
                window_seconds: unit.duration().as_secs(),
            },
            max_cost: u64::from(rate_limit.requests_per_unit),
            shadow: descriptor.shadow_mode,
            detailed_metric: descriptor.detailed_metric,
            replaces: rate_limit.replaces.iter().map(|r| r.name.clone()).collect(),
            stat_key: stat_key.to_owned(),
            quota: descriptor.quota_mode,
            metadata: descriptor
                .metadata
                .clone()
                .filter(|m| !m.is_empty())
                .map(std::sync::Arc::new),
            from_request: false,
            memo: Default::default(),
        })
    }
}

/// The library rule's name for a configured level: `domain.key_value.key`, the reference's
/// statistics key, with every byte outside printable ASCII (which rule names must be)
/// percent-encoded.
pub(crate) fn rule_name(domain: &str, stat_key: &str) -> String {
    let mut name = String::new();
    for byte in format!("{domain}.{stat_key}").bytes() {
        if (0x20..0x7f).contains(&byte) && byte != b'%' {
            name.push(char::from(byte));
        } else {
            name.push_str(&format!("%{byte:02X}"));
        }
    }
    name
}
