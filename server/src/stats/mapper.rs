//! A statsd name made a Prometheus series, as prometheus/statsd_exporter's mapper makes it (the
//! version the reference service embeds, v0.26): the format of `PROMETHEUS_MAPPER_YAML` and of
//! Envoy Gateway's `statsd_conf.yaml`, read as that exporter reads it.
//!
//! - A mapping `match`es a name with a glob (`*` is one whole dot-separated part, captured) or,
//!   with `match_type: regex`, a regular expression (searched anywhere in the name, as Go's
//!   `FindStringSubmatchIndex` does). Globs are tried first, in the file's order, then the
//!   regular expressions in order: the first that matches wins.
//! - `match_metric_type` (`counter`, `gauge`, `observer`; `timer` is `observer`) restricts a
//!   mapping to one kind of event; `action: drop` drops what it matches.
//! - `name` and `labels` are templates: `$1` or `${1}` is the first capture (a regular
//!   expression's named groups too); the name is then escaped (every character but letters,
//!   digits and `_` becomes `_`, a leading digit gets a `_` first).
//! - A timer's observations are a histogram (`observer_type` or the older `timer_type:
//!   histogram`, with `histogram_options.buckets` or `buckets`, else the defaults', else
//!   Prometheus' default buckets) or a summary, each value multiplied by `scale` when given.
//! - A name no mapping matches is not dropped: it becomes its own escaped name, with no labels.
//! - Keys this server has no use for are ignored, and so are keys the exporter does not know, as
//!   it ignores them: `ttl` (a series here never goes stale), `honor_labels` (the reference's
//!   names carry no tags), `glob_disable_ordering` (the file's order always decides: one of the
//!   orders the exporter may take), `summary_options` (a summary here is its count and sum).

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use regex::Regex;
use serde::de::IgnoredAny;
use serde::Deserialize;
use tollgate::config::ConfigFormat;

use crate::document::{placed_error, yaml_error, Error};

/// Prometheus' default histogram buckets (client_golang's `DefBuckets`), which the exporter
/// uses when neither a mapping nor the defaults give any.
pub const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The kind of a statsd event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// `|c`.
    Counter,
    /// `|g`.
    Gauge,
    /// `|ms`, `|h`, `|d`: a timer's observations.
    Observer,
}

/// How a timer's observations are shown.
#[derive(Clone, Debug, PartialEq)]
pub enum Observer {
    /// Cumulative buckets with these upper bounds (increasing; `+Inf` is implied).
    Histogram(Vec<f64>),
    /// A count and a sum (the exporter's default, when a mapping names no type).
    Summary,
}

/// What one statsd name becomes.
#[derive(Clone, Debug, PartialEq)]
pub enum Mapped {
    /// Not shown: `action: drop`, or a mapping whose name came out empty.
    Drop,
    /// A series.
    Series(Series),
}

/// A Prometheus series a statsd name is shown as.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// The metric's name, escaped.
    pub name: String,
    /// Its labels, sorted by name.
    pub labels: Vec<(String, String)>,
    /// The mapping's `help`, if it has one.
    pub help: Option<String>,
    /// For a timer: histogram or summary.
    pub observer: Observer,
    /// What each observed value is multiplied by.
    pub scale: Option<f64>,
}

/// A mapping file's rules, ready to map names.
#[derive(Clone, Debug)]
pub struct Mapper {
    /// Glob mappings, in the file's order; tried first.
    globs: Vec<Rule>,
    /// Regular-expression mappings, in the file's order.
    regexes: Vec<Rule>,
    /// How a timer no mapping matches is shown.
    unmatched_observer: Observer,
    /// What the mapper was made from, to compare two of them.
    source: String,
}

impl PartialEq for Mapper {
    fn eq(&self, other: &Mapper) -> bool {
        self.source == other.source
    }
}

#[derive(Clone, Debug)]
struct Rule {
    matcher: Matcher,
    name: String,
    labels: Vec<(String, String)>,
    only: Option<EventKind>,
    drop: bool,
    help: Option<String>,
    observer: Observer,
    scale: Option<f64>,
}

#[derive(Clone, Debug)]
enum Matcher {
    /// Each part a literal, or `None` for `*`.
    Glob(Vec<Option<String>>),
    Regex(Regex),
}

impl Mapper {
    /// The reference service's own mapping (its `default_mapper.yaml`, used when
    /// `PROMETHEUS_MAPPER_YAML` is not set): the per-descriptor counters with labels `domain`,
    /// `key1` and (for deeper keys) `key2`, the calls' errors by `err_type`, the requests and
    /// their response time by `grpc_method`, the configuration's loads. The response time is
    /// in seconds unless `milliseconds` (`PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`), which
    /// keeps the timer's milliseconds, under the same name, as the reference does.
    pub fn reference(milliseconds: bool) -> Mapper {
        const COUNTERS: [&str; 5] = [
            "near_limit",
            "over_limit",
            "total_hits",
            "within_limit",
            "shadow_mode",
        ];
        let labels = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            let mut labels: Vec<_> = pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            labels.sort();
            labels
        };
        let rule = |matcher: Matcher, name: &str, labels: Vec<(String, String)>| Rule {
            matcher,
            name: name.to_owned(),
            labels,
            only: None,
            drop: false,
            help: None,
            observer: Observer::Histogram(DEFAULT_BUCKETS.to_vec()),
            scale: None,
        };
        let glob = |pattern: &str| Matcher::Glob(parse_glob(pattern).expect("a valid glob"));
        let mut globs = Vec::new();
        let mut regexes = Vec::new();
        for counter in COUNTERS {
            let name = format!("ratelimit_service_rate_limit_{counter}");
            globs.push(rule(
                glob(&format!("ratelimit.service.rate_limit.*.*.{counter}")),
                &name,
                labels(&[("domain", "$1"), ("key1", "$2")]),
            ));
            // Two keys or more: the first two are labels, the rest is left out.
            let pattern = format!(
                r"ratelimit\.service\.rate_limit\.([^\.]*)\.([^\.]*)\.([^\.]*)(\..*)?\.{counter}"
            );
            regexes.push(rule(
                Matcher::Regex(Regex::new(&pattern).expect("a valid regex")),
                &name,
                labels(&[("domain", "$1"), ("key1", "$2"), ("key2", "$3")]),
            ));
        }
        let counter = |matcher, name: &str, labels| Rule {
            only: Some(EventKind::Counter),
            observer: Observer::Summary,
            ..rule(matcher, name, labels)
        };
        globs.push(counter(
            glob("ratelimit.service.call.should_rate_limit.*"),
            "ratelimit_service_should_rate_limit_error",
            labels(&[("err_type", "$1")]),
        ));
        globs.push(counter(
            glob("ratelimit_server.*.total_requests"),
            "ratelimit_service_total_requests",
            labels(&[("grpc_method", "$1")]),
        ));
        globs.push(Rule {
            scale: (!milliseconds).then_some(0.001),
            ..rule(
                glob("ratelimit_server.*.response_time"),
                "ratelimit_service_response_time_seconds",
                labels(&[("grpc_method", "$1")]),
            )
        });
        for load in ["config_load_success", "config_load_error"] {
            globs.push(counter(
                glob(&format!("ratelimit.service.{load}")),
                &format!("ratelimit_service_{load}"),
                Vec::new(),
            ));
        }
        Mapper {
            globs,
            regexes,
            unmatched_observer: Observer::Summary,
            source: format!("the reference's mapping (milliseconds: {milliseconds})"),
        }
    }

    /// Reads the mapping file `path`, whose content is `text`. An error names the file, and
    /// the line and column where it can.
    pub fn from_yaml(path: &Path, text: &str) -> Result<Mapper, Error> {
        let file: Option<File> =
            yaml_serde::from_str(text).map_err(|error| yaml_error(path, &error))?;
        let file = file.unwrap_or_default();
        let placed = |message: String| placed_error(path, ConfigFormat::Yaml, text, &message);
        let defaults = &file.defaults;
        let default_observer = match (&defaults.observer_type, &defaults.timer_type) {
            (Some(kind), _) => Some(
                observer_type(kind).map_err(|e| placed(format!("defaults.observer_type: {e}")))?,
            ),
            (None, Some(kind)) => {
                Some(observer_type(kind).map_err(|e| placed(format!("defaults.timer_type: {e}")))?)
            }
            (None, None) => None,
        };
        let default_buckets = match defaults
            .histogram_options
            .as_ref()
            .and_then(|options| options.buckets.clone())
            .filter(|buckets| !buckets.is_empty())
            .or_else(|| defaults.buckets.clone().filter(|b| !b.is_empty()))
        {
            Some(buckets) => {
                buckets_in_order(buckets).map_err(|e| placed(format!("defaults.buckets: {e}")))?
            }
            None => DEFAULT_BUCKETS.to_vec(),
        };
        let regex_by_default = match defaults.match_type.as_deref() {
            None | Some("" | "glob") => false,
            Some("regex") => true,
            Some(other) => {
                return Err(placed(format!(
                    "defaults.match_type: invalid match type {other:?} (glob or regex)"
                )))
            }
        };
        let mut mapper = Mapper {
            globs: Vec::new(),
            regexes: Vec::new(),
            unmatched_observer: match &default_observer {
                Some(Kind::Histogram) => Observer::Histogram(default_buckets.clone()),
                _ => Observer::Summary,
            },
            source: text.to_owned(),
        };
        for (i, mapping) in file.mappings.iter().enumerate() {
            let at =
                |field: &str, message: String| placed(format!("mappings[{i}].{field}: {message}"));
            for key in mapping.labels.keys() {
                if !label_name(key) {
                    return Err(at(
                        &format!("labels.{key}"),
                        format!("invalid label key: {key}"),
                    ));
                }
            }
            if mapping.name.is_empty() {
                return Err(at("name", "the mapping sets no metric name".into()));
            }
            if !name_template(&mapping.name) {
                return Err(at(
                    "name",
                    format!(
                        "metric name {:?} is not letters, digits, `_` and `$n` references",
                        mapping.name
                    ),
                ));
            }
            let regex = match mapping.match_type.as_deref() {
                None => regex_by_default,
                Some("" | "glob") => false,
                Some("regex") => true,
                Some(other) => {
                    return Err(at(
                        "match_type",
                        format!("invalid match type {other:?} (glob or regex)"),
                    ))
                }
            };
            let matcher = if regex {
                Matcher::Regex(
                    Regex::new(&mapping.r#match)
                        .map_err(|e| at("match", format!("invalid regex: {e}")))?,
                )
            } else {
                Matcher::Glob(parse_glob(&mapping.r#match).ok_or_else(|| {
                    at(
                        "match",
                        format!(
                            "invalid match {:?}: dot-separated parts, each `*` or a name",
                            mapping.r#match
                        ),
                    )
                })?)
            };
            let only = match mapping.match_metric_type.as_deref() {
                None => None,
                Some("counter") => Some(EventKind::Counter),
                Some("gauge") => Some(EventKind::Gauge),
                Some("observer" | "timer") => Some(EventKind::Observer),
                Some(other) => {
                    return Err(at(
                        "match_metric_type",
                        format!("invalid metric type {other:?} (counter, gauge or observer)"),
                    ))
                }
            };
            let drop = match mapping.action.as_deref() {
                None | Some("" | "map") => false,
                Some("drop") => true,
                Some(other) => {
                    return Err(at(
                        "action",
                        format!("invalid action {other:?} (map or drop)"),
                    ))
                }
            };
            let kind = match (&mapping.observer_type, &mapping.timer_type) {
                (Some(kind), _) => Some(observer_type(kind).map_err(|e| at("observer_type", e))?),
                (None, Some(kind)) => Some(observer_type(kind).map_err(|e| at("timer_type", e))?),
                (None, None) => default_observer,
            };
            let histogram_buckets = mapping
                .histogram_options
                .as_ref()
                .and_then(|options| options.buckets.clone())
                .filter(|b| !b.is_empty());
            let legacy_buckets = mapping.buckets.clone().filter(|b| !b.is_empty());
            if histogram_buckets.is_some() && legacy_buckets.is_some() {
                return Err(at(
                    "buckets",
                    "cannot use buckets in both the top level and histogram_options".into(),
                ));
            }
            let observer = match kind {
                Some(Kind::Histogram) => {
                    if mapping.summary_options.is_some() {
                        return Err(at(
                            "summary_options",
                            "cannot use a histogram observer and summary options at the same time"
                                .into(),
                        ));
                    }
                    let buckets = match legacy_buckets.or(histogram_buckets) {
                        Some(buckets) => buckets_in_order(buckets)
                            .map_err(|e| at("histogram_options.buckets", e))?,
                        None => default_buckets.clone(),
                    };
                    Observer::Histogram(buckets)
                }
                Some(Kind::Summary) | None => {
                    if mapping.histogram_options.is_some() && kind.is_some() {
                        return Err(at(
                            "histogram_options",
                            "cannot use a summary observer and histogram options at the same time"
                                .into(),
                        ));
                    }
                    Observer::Summary
                }
            };
            let mut labels: Vec<(String, String)> = mapping
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            labels.sort();
            let rule = Rule {
                matcher,
                name: mapping.name.clone(),
                labels,
                only,
                drop,
                help: mapping.help.clone().filter(|help| !help.is_empty()),
                observer,
                scale: mapping.scale,
            };
            if regex {
                mapper.regexes.push(rule);
            } else {
                mapper.globs.push(rule);
            }
        }
        Ok(mapper)
    }

    /// What the statsd name `name`, an event of `kind`, becomes.
    pub fn map(&self, name: &str, kind: EventKind) -> Mapped {
        let allowed = |rule: &Rule| rule.only.is_none_or(|only| only == kind);
        let parts: Vec<&str> = name.split('.').collect();
        for rule in self.globs.iter().filter(|rule| allowed(rule)) {
            let Matcher::Glob(pattern) = &rule.matcher else {
                continue;
            };
            if pattern.len() != parts.len() {
                continue;
            }
            let mut captures = Vec::new();
            let matched = pattern.iter().zip(&parts).all(|(want, part)| match want {
                None => {
                    captures.push(*part);
                    true
                }
                Some(literal) => literal == part,
            });
            if matched {
                return rule.mapped(|template| glob_expand(template, &captures));
            }
        }
        for rule in self.regexes.iter().filter(|rule| allowed(rule)) {
            let Matcher::Regex(regex) = &rule.matcher else {
                continue;
            };
            if let Some(captures) = regex.captures(name) {
                return rule.mapped(|template| {
                    let mut out = String::new();
                    captures.expand(template, &mut out);
                    out
                });
            }
        }
        Mapped::Series(Series {
            name: escape(name),
            labels: Vec::new(),
            help: None,
            observer: self.unmatched_observer.clone(),
            scale: None,
        })
    }
}

impl Rule {
    fn mapped(&self, expand: impl Fn(&str) -> String) -> Mapped {
        if self.drop {
            return Mapped::Drop;
        }
        let name = expand(&self.name);
        if name.is_empty() {
            return Mapped::Drop;
        }
        Mapped::Series(Series {
            name: escape(&name),
            labels: self
                .labels
                .iter()
                .map(|(key, value)| (key.clone(), expand(value)))
                .collect(),
            help: self.help.clone(),
            observer: self.observer.clone(),
            scale: self.scale,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Histogram,
    Summary,
}

fn observer_type(text: &str) -> Result<Kind, String> {
    match text {
        "histogram" => Ok(Kind::Histogram),
        "summary" | "" => Ok(Kind::Summary),
        other => Err(format!(
            "invalid observer type {other:?} (histogram or summary)"
        )),
    }
}

/// Buckets as a histogram takes them: increasing, a last `+Inf` left implied.
fn buckets_in_order(mut buckets: Vec<f64>) -> Result<Vec<f64>, String> {
    if buckets.last() == Some(&f64::INFINITY) {
        buckets.pop();
    }
    if buckets.windows(2).any(|pair| pair[0] >= pair[1]) || buckets.iter().any(|b| b.is_nan()) {
        return Err(format!("histogram buckets must increase: {buckets:?}"));
    }
    Ok(buckets)
}

/// A glob's parts (`None` for `*`), or `None` when it is not one: the first part `*` or a name
/// starting with a letter or `_`, the later ones `*` or a name of letters, digits, `_` and `-`.
fn parse_glob(pattern: &str) -> Option<Vec<Option<String>>> {
    pattern
        .split('.')
        .enumerate()
        .map(|(i, part)| {
            if part == "*" {
                return Some(None);
            }
            let mut chars = part.chars();
            let first = chars.next()?;
            let first_ok =
                first.is_ascii_alphabetic() || first == '_' || (i > 0 && first.is_ascii_digit());
            let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            (first_ok && rest_ok).then(|| Some(part.to_owned()))
        })
        .collect()
}

/// A label name as the exporter accepts one: a letter or `_`, then at least one letter, digit
/// or `_`.
fn label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.len() >= 2
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A metric name template: letters, digits and `_` (not a digit first), and `$n` or `${n}`.
fn name_template(name: &str) -> bool {
    let bytes = name.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        let byte = bytes[at];
        if byte == b'$' {
            let mut end = at + 1;
            let braced = bytes.get(end) == Some(&b'{');
            if braced {
                end += 1;
            }
            let digits = bytes[end..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
            if digits == 0 {
                return false;
            }
            end += digits;
            if bytes.get(end) == Some(&b'}') {
                end += 1;
            }
            at = end;
        } else if byte.is_ascii_alphabetic() || byte == b'_' || (at > 0 && byte.is_ascii_digit()) {
            at += 1;
        } else {
            return false;
        }
    }
    true
}

/// A glob mapping's template with its captures: `$n` or `${n}` (the longest run of letters,
/// digits, `_` and `$` after the `$`) is the n-th capture, or nothing when there is none.
fn glob_expand(template: &str, captures: &[&str]) -> String {
    let bytes = template.as_bytes();
    let mut out = String::with_capacity(template.len());
    let mut at = 0;
    let mut copied = 0;
    while at < bytes.len() {
        if bytes[at] != b'$' {
            at += 1;
            continue;
        }
        let mut end = at + 1;
        if bytes.get(end) == Some(&b'{') {
            end += 1;
        }
        let start = end;
        while end < bytes.len()
            && (bytes[end].is_ascii_alphanumeric() || b"_$".contains(&bytes[end]))
        {
            end += 1;
        }
        if end == start {
            at += 1;
            continue;
        }
        let reference = &template[start..end];
        if bytes.get(end) == Some(&b'}') {
            end += 1;
        }
        out.push_str(&template[copied..at]);
        if let Some(capture) = reference
            .parse::<usize>()
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|n| captures.get(n))
        {
            out.push_str(capture);
        }
        at = end;
        copied = end;
    }
    out.push_str(&template[copied..]);
    out
}

/// A metric name as the exporter escapes it: every character but ASCII letters, digits and `_`
/// becomes `_` (the second of two `-` in a row is left out), and a leading digit gets a `_`.
pub fn escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 1);
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        out.push('_');
    }
    let mut previous = None;
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            out.push(c);
        } else if !(c == '-' && previous == Some('-')) {
            out.push('_');
        }
        previous = Some(c);
    }
    out
}

/// A mapping file, as the exporter reads it.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct File {
    defaults: FileDefaults,
    mappings: Vec<FileMapping>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct FileDefaults {
    observer_type: Option<String>,
    timer_type: Option<String>,
    buckets: Option<Vec<f64>>,
    match_type: Option<String>,
    histogram_options: Option<HistogramOptions>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct HistogramOptions {
    buckets: Option<Vec<f64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct FileMapping {
    r#match: String,
    name: String,
    labels: BTreeMap<String, String>,
    observer_type: Option<String>,
    timer_type: Option<String>,
    buckets: Option<Vec<f64>>,
    match_type: Option<String>,
    help: Option<String>,
    action: Option<String>,
    match_metric_type: Option<String>,
    histogram_options: Option<HistogramOptions>,
    summary_options: Option<IgnoredAny>,
    scale: Option<f64>,
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EventKind::Counter => "counter",
            EventKind::Gauge => "gauge",
            EventKind::Observer => "observer",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapper(text: &str) -> Mapper {
        Mapper::from_yaml(Path::new("conf.yaml"), text).unwrap()
    }

    fn series(mapped: Mapped) -> (String, Vec<(String, String)>) {
        match mapped {
            Mapped::Series(series) => (series.name, series.labels),
            Mapped::Drop => panic!("dropped"),
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_glob_star_is_one_whole_part_and_its_captures_fill_the_templates() {
        let mapper = mapper(
            r#"
mappings:
  - match: "ratelimit.service.rate_limit.*.*.total_hits"
    name: "hits_${1}_$2"
    labels: { domain: "$1", key1: "$2", both: "$1/${2}", none: "$3" }
"#,
        );
        let (name, labels_of) = series(mapper.map(
            "ratelimit.service.rate_limit.shop.remote-address.total_hits",
            EventKind::Counter,
        ));
        assert_eq!(name, "hits_shop_remote_address");
        assert_eq!(
            labels_of,
            labels(&[
                ("both", "shop/remote-address"),
                ("domain", "shop"),
                ("key1", "remote-address"),
                ("none", ""),
            ])
        );
        // One part more or fewer: no match, so the name is converted whole.
        let (name, labels_of) = series(mapper.map(
            "ratelimit.service.rate_limit.shop.plan_free.user.total_hits",
            EventKind::Counter,
        ));
        assert_eq!(
            name,
            "ratelimit_service_rate_limit_shop_plan_free_user_total_hits"
        );
        assert!(labels_of.is_empty());
        // An empty part is a part.
        let (_, labels_of) = series(mapper.map(
            "ratelimit.service.rate_limit..k.total_hits",
            EventKind::Counter,
        ));
        assert_eq!(labels_of[1], ("domain".to_owned(), String::new()));
    }

    #[test]
    fn regex_captures_are_searched_anywhere_and_expanded_as_go_expands_them() {
        let mapper = mapper(
            r#"
mappings:
  - match: 'rate_limit\.([^\.]*)\.([^\.]*)\.([^\.]*)(\..*)?\.over_limit'
    match_type: regex
    name: "over_limit"
    labels: { domain: "$1", key1: "$2", key2: "${3}", rest: "$4", odd: "$3x" }
"#,
        );
        let (name, labels_of) = series(mapper.map(
            "ratelimit.service.rate_limit.d.k1_v1.k2_v2.k3_v3.over_limit",
            EventKind::Counter,
        ));
        assert_eq!(name, "over_limit");
        assert_eq!(
            labels_of,
            labels(&[
                ("domain", "d"),
                ("key1", "k1_v1"),
                ("key2", "k2_v2"),
                // `$3x` is the group named `3x`: none, so empty (Go's rule).
                ("odd", ""),
                ("rest", ".k3_v3"),
            ])
        );
    }

    #[test]
    fn the_first_match_wins_globs_before_regular_expressions() {
        let mapper = mapper(
            r#"
mappings:
  - match: 'a\.(.*)'
    match_type: regex
    name: "regex_first"
  - match: "a.*"
    name: "glob_one"
  - match: "a.b"
    name: "glob_two"
  - match: 'a\.b\.(.*)'
    match_type: regex
    name: "regex_$1"
  - match: 'a\.b\.c'
    match_type: regex
    name: "regex_last"
"#,
        );
        // Every glob is tried before any regular expression, each kind in the file's order.
        assert_eq!(series(mapper.map("a.b", EventKind::Counter)).0, "glob_one");
        assert_eq!(
            series(mapper.map("a.b.c", EventKind::Counter)).0,
            "regex_first"
        );
    }

    #[test]
    fn drop_and_metric_types() {
        let mapper = mapper(
            r#"
mappings:
  - match: "x.*.debug"
    name: "unused"
    action: drop
  - match: "x.*.count"
    name: "x_count"
    match_metric_type: counter
  - match: "x.*.count"
    name: "x_time"
    match_metric_type: timer
    timer_type: histogram
    buckets: [1, 2]
    scale: 0.5
"#,
        );
        assert_eq!(mapper.map("x.a.debug", EventKind::Counter), Mapped::Drop);
        assert_eq!(
            series(mapper.map("x.a.count", EventKind::Counter)).0,
            "x_count"
        );
        let Mapped::Series(timer) = mapper.map("x.a.count", EventKind::Observer) else {
            panic!("dropped")
        };
        assert_eq!(timer.name, "x_time");
        assert_eq!(timer.observer, Observer::Histogram(vec![1.0, 2.0]));
        assert_eq!(timer.scale, Some(0.5));
        // A gauge matches neither: its own name, escaped.
        assert_eq!(
            series(mapper.map("x.a.count", EventKind::Gauge)).0,
            "x_a_count"
        );
        // An unmatched timer is a summary, unless the defaults say histogram.
        let Mapped::Series(unmatched) = mapper.map("y.z", EventKind::Observer) else {
            panic!("dropped")
        };
        assert_eq!(unmatched.observer, Observer::Summary);
    }

    #[test]
    fn names_are_escaped_as_the_exporter_escapes_them() {
        assert_eq!(escape("a.b-c/d"), "a_b_c_d");
        assert_eq!(escape("1st.x"), "_1st_x");
        assert_eq!(escape("a--b"), "a_b");
        assert_eq!(escape("é"), "_");
        assert_eq!(glob_expand("${1}_${2}${9}$", &["a", "b"]), "a_b$");
        // `$1_x` is the reference `1_x`, not `$1` then `_x`: nothing (the exporter's rule).
        assert_eq!(glob_expand("$1_x.$2", &["a", "b"]), ".b");
    }

    #[test]
    fn the_references_own_mapping() {
        let seconds = Mapper::reference(false);
        let (name, labels_of) = series(seconds.map(
            "ratelimit.service.rate_limit.default/eg/http.route_route.rule-0_rule-0.k_v.within_limit",
            EventKind::Counter,
        ));
        assert_eq!(name, "ratelimit_service_rate_limit_within_limit");
        assert_eq!(
            labels_of,
            labels(&[
                ("domain", "default/eg/http"),
                ("key1", "route_route"),
                ("key2", "rule-0_rule-0")
            ])
        );
        let Mapped::Series(timer) = seconds.map(
            "ratelimit_server.ShouldRateLimit.response_time",
            EventKind::Observer,
        ) else {
            panic!("dropped")
        };
        assert_eq!(timer.name, "ratelimit_service_response_time_seconds");
        assert_eq!(timer.labels, labels(&[("grpc_method", "ShouldRateLimit")]));
        assert_eq!(
            timer.observer,
            Observer::Histogram(DEFAULT_BUCKETS.to_vec())
        );
        assert_eq!(timer.scale, Some(0.001));
        let Mapped::Series(timer) = Mapper::reference(true).map(
            "ratelimit_server.ShouldRateLimit.response_time",
            EventKind::Observer,
        ) else {
            panic!("dropped")
        };
        assert_eq!(timer.scale, None);
        // Counters only: a timer of that name would be converted.
        assert_eq!(
            series(seconds.map("ratelimit.service.config_load_success", EventKind::Counter)).0,
            "ratelimit_service_config_load_success"
        );
        assert_eq!(
            series(seconds.map(
                "ratelimit.service.call.should_rate_limit.redis_error",
                EventKind::Counter
            )),
            (
                "ratelimit_service_should_rate_limit_error".to_owned(),
                labels(&[("err_type", "redis_error")])
            )
        );
    }

    #[test]
    fn a_file_that_cannot_be_used_is_named_with_its_line_and_column() {
        let error = |text: &str| {
            Mapper::from_yaml(Path::new("conf.yaml"), text)
                .unwrap_err()
                .0
        };
        assert!(
            error("mappings:\n  - match: [\n").starts_with("conf.yaml:"),
            "{}",
            error("mappings:\n  - match: [\n")
        );
        assert_eq!(
            error("mappings:\n  - match: \"a.*\"\n    name: x\n  - match: '('\n    match_type: regex\n    name: y\n")
                .split(": ")
                .take(2)
                .collect::<Vec<_>>(),
            ["conf.yaml:4:12", "mappings[1].match"]
        );
        assert!(error("mappings:\n  - match: \"a..b*\"\n    name: x\n")
            .starts_with("conf.yaml:2:12: mappings[0].match: invalid match"));
        assert!(
            error("mappings:\n  - match: \"a\"\n    name: \"bad-name\"\n")
                .starts_with("conf.yaml:3:11: mappings[0].name: ")
        );
        assert!(
            error("mappings:\n  - match: \"a\"\n    name: x\n    labels: { a: b }\n")
                .contains("invalid label key: a")
        );
        assert!(
            error("mappings:\n  - match: \"a\"\n    name: x\n    action: keep\n")
                .starts_with("conf.yaml:4:13: mappings[0].action: ")
        );
        assert!(error(
            "mappings:\n  - match: \"a\"\n    name: x\n    timer_type: histogram\n    buckets: [2, 1]\n"
        )
        .contains("must increase"));
        // Empty: no mappings, every name converted.
        let empty = mapper("");
        assert_eq!(series(empty.map("a.b", EventKind::Counter)).0, "a_b");
        // Keys it has no use for are ignored, as the exporter ignores them.
        mapper("defaults:\n  ttl: 1m\n  glob_disable_ordering: true\nmappings:\n  - match: a\n    name: a\n    ttl: 5m\n    honor_labels: true\n");
    }
}
