#![doc = include_str!("CONFIG.md")]

mod build;
mod duration;
mod error;
mod locate;
mod schema;
mod watch;

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::engine::limiter::Limiter;
use crate::middleware::layer::{RateLimitLayer, RateLimitLayerBuilder};
use crate::rules::rule::Rule;
use crate::store::Store;

pub use build::LIMIT_FIELDS;
pub use error::ConfigFileError;
pub use watch::ConfigWatch;

/// The line and column (1-based) of `place` — a path such as `rules[2].period`, as
/// [`ConfigFileError::path`] names it — in a configuration's `text`, or of the deepest part of it
/// the text holds. For tools that hand [`Config::parse`] a document derived from a user's file:
/// they report the library's error at its place in the file the user wrote. Public because
/// `tollgate-server` is such a tool (it adds and removes fields of its own before parsing) and
/// is built on this crate's public API only.
///
/// ```
/// use tollgate::config::{locate, ConfigFormat};
///
/// let text = "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1 fortnight\"\n";
/// assert_eq!(locate(ConfigFormat::Toml, text, "rules[0].period"), Some((4, 10)));
/// ```
pub fn locate(format: ConfigFormat, text: &str, place: &str) -> Option<(usize, usize)> {
    locate::locate(format, text, place)
}

/// The name of a request's plan (tier), put in its extensions by an earlier layer — typically the one
/// that authenticates the caller — for rules whose tiers say `from = "extension"`.
///
/// ```
/// use tollgate::config::PlanName;
///
/// let mut request = http::Request::new(());
/// // In your authentication layer, once you know the customer:
/// request.extensions_mut().insert(PlanName::new("pro"));
/// assert_eq!(request.extensions().get::<PlanName>().unwrap().as_str(), "pro");
/// ```
///
/// A plan the rule does not list counts as the rule's `default` plan.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PlanName(String);

impl PlanName {
    /// The plan named `name`, as the configuration file names it.
    pub fn new(name: impl Into<String>) -> PlanName {
        PlanName(name.into())
    }

    /// The plan's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PlanName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The language of a configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigFormat {
    /// TOML (`.toml`).
    Toml,
    /// YAML (`.yaml`, `.yml`); one document.
    Yaml,
}

impl ConfigFormat {
    /// The format a file's extension names: `.toml`, `.yaml` or `.yml` (any case).
    pub fn from_path(path: impl AsRef<Path>) -> Option<ConfigFormat> {
        let extension = path.as_ref().extension()?.to_str()?.to_ascii_lowercase();
        match extension.as_str() {
            "toml" => Some(ConfigFormat::Toml),
            "yaml" | "yml" => Some(ConfigFormat::Yaml),
            _ => None,
        }
    }
}

/// Loading and reloading a layer from a configuration file (feature `config`).
#[cfg_attr(docsrs, doc(cfg(feature = "config")))]
/// A configuration (TOML or YAML), parsed and checked: the one way from a file to a layer.
///
/// [`read`](Self::read) or [`parse`](Self::parse) it, then build a [`layer`](Self::layer) — or a
/// [`builder`](Self::builder) for settings that code adds — or [`reload`](Self::reload) a running
/// layer with it. Code that decides without the middleware takes a [`limiter`](Self::limiter),
/// or the [`rules`](Self::rules) alone. Every error names the file, the place in it and, when
/// known, the line and the rule (see [`ConfigFileError`]).
///
/// ```
/// use tollgate::config::{Config, ConfigFormat};
///
/// let config = Config::parse(ConfigFormat::Toml, r#"
///     [[rules]]
///     name = "per-ip"
///     rate = 60
///     period = "1m"
///     key = "peer_ip"
/// "#)?;
/// let limits = config.layer()?;
/// assert_eq!(limits.limiter().rules_in_force()[0].name, "per-ip");
/// # Ok::<(), tollgate::config::ConfigFileError>(())
/// ```
pub struct Config {
    format: ConfigFormat,
    text: String,
    /// The file it was read from, named in every error.
    path: Option<PathBuf>,
    file: schema::File,
}

impl Config {
    /// The file at `path`: TOML or YAML by its extension.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), tollgate::config::ConfigFileError> {
    /// let limits = tollgate::config::Config::read("ratelimits.toml")?.layer()?;
    /// # Ok(()) }
    /// ```
    pub fn read(path: impl AsRef<Path>) -> Result<Config, ConfigFileError> {
        let path = path.as_ref();
        let (format, text) = read(path)?;
        let mut config = Config::parse(format, &text).map_err(|error| error.in_file(path))?;
        config.path = Some(path.to_owned());
        Ok(config)
    }

    /// `text`, in `format`.
    pub fn parse(format: ConfigFormat, text: &str) -> Result<Config, ConfigFileError> {
        Ok(Config {
            format,
            file: parse(format, text)?,
            text: text.to_owned(),
            path: None,
        })
    }

    /// A layer with this configuration. A Redis or Postgres store is refused here (building is
    /// synchronous): [`connect`](Self::connect) builds one that connects.
    pub fn layer(&self) -> Result<RateLimitLayer, ConfigFileError> {
        build::layer(&self.file).map_err(|error| self.locate(error))
    }

    /// The plans of tiered rules that are `unlimited`: their requests are not limited by the
    /// rule, which has no limit in the layer for them (tools that describe a configuration list
    /// them beside [`Limiter::rules_in_force`](crate::Limiter::rules_in_force)).
    pub fn unlimited_plans(&self) -> Vec<UnlimitedPlan> {
        build::unlimited_plans(&self.file)
    }

    /// A layer with this configuration, with any store: connects to Redis or Postgres when the
    /// file names such a store (`[store]` with `kind = "postgres"`, or a `postgres://` url, and
    /// optionally `create_schema = true` and `table`: see `PostgresStore`).
    pub async fn connect(&self) -> Result<RateLimitLayer, ConfigFileError> {
        let builder = build::builder_connected(&self.file)
            .await
            .map_err(|error| self.locate(error))?;
        build::finish(&self.file, builder).map_err(|error| self.locate(error))
    }

    /// A builder with this configuration, for settings that code adds or overrides before
    /// building — e.g. a store the file cannot describe:
    /// `.store(MemoryStore::with_clock(TokioClock::new()))`.
    pub fn builder(&self) -> Result<RateLimitLayerBuilder, ConfigFileError> {
        build::builder(&self.file).map_err(|error| self.locate(error))
    }

    /// A layer with this configuration that decides with `store`, whatever store the file names
    /// (the file's store settings are still checked, and a Redis store is not connected to). For
    /// running a configuration offline, e.g. over an access log with a
    /// [`ManualClock`](crate::clock::ManualClock), as the `tollgate` command does.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use tollgate::clock::ManualClock;
    /// use tollgate::config::Config;
    /// use tollgate::MemoryStore;
    ///
    /// let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
    /// let store = MemoryStore::with_clock(clock.clone());
    /// let limits = Config::read("ratelimits.toml")?.layer_with_store(store)?;
    /// # Ok::<(), tollgate::config::ConfigFileError>(())
    /// ```
    pub fn layer_with_store(&self, store: impl Store) -> Result<RateLimitLayer, ConfigFileError> {
        if let Some(spec) = &self.file.store {
            build::check_store(spec).map_err(|error| self.locate(error))?;
        }
        let builder = build::without_redis(&self.file).map_err(|error| self.locate(error))?;
        build::finish(&self.file, builder.store(store)).map_err(|error| self.locate(error))
    }

    /// The rules this configuration defines, in order, each validated (a tiered rule gives one
    /// per plan), for a front end that builds its [`Limiter`] itself and may add rules of its
    /// own: `Limiter::builder().rules(config.rules()?)`, or
    /// [`with_rules`](Limiter::with_rules) on a limiter in force. Unlike a layer, a
    /// configuration read this way may define no rule. The whole configuration is checked, its
    /// store, response and key redaction settings too.
    ///
    /// ```
    /// use tollgate::config::{Config, ConfigFormat};
    ///
    /// let config = Config::parse(ConfigFormat::Toml, r#"
    ///     [[rules]]
    ///     name = "per-ip"
    ///     rate = 60
    ///     period = "1m"
    /// "#)?;
    /// let rules = config.rules()?;
    /// assert_eq!(rules[0].name(), "per-ip");
    /// assert!(Config::parse(ConfigFormat::Toml, "rules = []")?.rules()?.is_empty());
    /// # Ok::<(), tollgate::config::ConfigFileError>(())
    /// ```
    pub fn rules(&self) -> Result<Vec<Rule>, ConfigFileError> {
        build::check_others(&self.file).map_err(|error| self.locate(error))?;
        build::rules_of(&self.file)
            .map(|rules| rules.rules)
            .map_err(|error| self.locate(error))
    }

    /// A [`Limiter`] with this configuration's rules (there may be none), allow and deny lists,
    /// store and failure policy: for code that decides without the middleware. A Redis or
    /// Postgres store is refused here (building is synchronous):
    /// [`connect_limiter`](Self::connect_limiter)
    /// builds one that connects. The `response`, `shadow`, `redact_keys` and `top_offenders`
    /// settings are a layer's: checked, and not read.
    pub fn limiter(&self) -> Result<Limiter, ConfigFileError> {
        build::limiter(&self.file).map_err(|error| self.locate(error))
    }

    /// [`limiter`](Self::limiter), with any store: connects to Redis or Postgres when the file
    /// names such a store.
    pub async fn connect_limiter(&self) -> Result<Limiter, ConfigFileError> {
        build::limiter_connected(&self.file)
            .await
            .map_err(|error| self.locate(error))
    }

    /// Replaces `layer`'s rules and allow and deny lists with this configuration's, while
    /// requests flow.
    ///
    /// The whole configuration is checked first; on error nothing changes. The new rules take
    /// over atomically: a request in flight finishes under the rules it started with, the next
    /// one sees the new set. Rules that keep their name keep their counts (a tiered rule's rules
    /// are named `rule:plan`). The `store`, `response`, `shadow`, `redact_keys` and
    /// `top_offenders` settings are checked but only read when a layer is built.
    pub fn reload(&self, layer: &RateLimitLayer) -> Result<(), ConfigFileError> {
        reload(layer.limiter(), self)
            .map(drop)
            .map_err(|error| self.in_file(error))
    }

    /// Watches the file at `path` for `layer`: every `interval` it is read again, and when its
    /// content has changed the layer reloads it (as [`reload`](Self::reload)).
    ///
    /// A file that cannot be read or is invalid is reported with a `tracing` warning, once per
    /// change, and the rules in force stay. The watch ends by itself once every clone of the
    /// layer (and every service built from it) is dropped, or with [`ConfigWatch::stop`];
    /// dropping the handle leaves it running. Content is compared rather than modification
    /// times, which some file systems keep to the second. Start the watch right after loading
    /// the layer: the file's content at that moment is the one considered in force.
    ///
    /// # Errors
    /// When the file's format is unknown, the file cannot be read now, or there is no tokio
    /// runtime to run the watch on.
    pub fn watch(
        layer: &RateLimitLayer,
        path: impl AsRef<Path>,
        interval: Duration,
    ) -> Result<ConfigWatch, ConfigFileError> {
        watch::spawn(layer, path.as_ref(), interval)
    }

    /// An error found after parsing, at its place in the text and file.
    fn locate(&self, error: build::Invalid) -> ConfigFileError {
        self.in_file(self.in_text(error))
    }

    /// An error found after parsing, at its place in the text.
    fn in_text(&self, error: build::Invalid) -> ConfigFileError {
        located(self.format, &self.text, &self.file, error)
    }

    fn in_file(&self, error: ConfigFileError) -> ConfigFileError {
        match &self.path {
            Some(path) => error.in_file(path),
            None => error,
        }
    }

    /// The settings a reload leaves alone.
    pub(crate) fn build_only(&self) -> BuildOnly {
        let file = &self.file;
        BuildOnly {
            store: file.store.clone(),
            response: file.response.clone(),
            shadow: file.shadow,
            redact_keys: file.redact_keys.clone(),
            top_offenders: file.top_offenders,
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("format", &self.format)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// The format and the text of the file at `path`.
fn read(path: &Path) -> Result<(ConfigFormat, String), ConfigFileError> {
    // A path that is not there is told so before its name is judged.
    let text = std::fs::read_to_string(path).map_err(|error| ConfigFileError::io(path, error))?;
    let format = format_of(path)?;
    Ok((format, text))
}

fn format_of(path: &Path) -> Result<ConfigFormat, ConfigFileError> {
    ConfigFormat::from_path(path).ok_or_else(|| {
        ConfigFileError::new(
            "",
            "unknown configuration format: name the file .toml, .yaml or .yml",
        )
        .in_file(path)
    })
}

/// A plan of a tiered rule whose requests that rule does not limit (`unlimited = true`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnlimitedPlan {
    /// The tiered rule's name.
    pub rule: String,
    /// The plan's name.
    pub plan: String,
    /// Which requests are of the plan, in words: a phrase that follows "only for", such as
    /// `plan "enterprise" (requests whose x-plan header is "enterprise")`.
    pub condition: String,
}

/// The settings a reload does not change.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct BuildOnly {
    store: Option<schema::StoreSpec>,
    response: Option<schema::ResponseSpec>,
    shadow: bool,
    redact_keys: schema::RedactKeysSpec,
    top_offenders: Option<usize>,
}

/// Checks `config` whole and swaps in its rules and lists; returns the settings it left alone.
/// (Errors name their place in the text, not the file.)
pub(crate) fn reload(limiter: &Limiter, config: &Config) -> Result<BuildOnly, ConfigFileError> {
    let file = &config.file;
    build::check_others(file).map_err(|error| config.in_text(error))?;
    let build::Rules { rules, allow, deny } =
        build::rules(file).map_err(|error| config.in_text(error))?;
    limiter
        .reload_with_lists(rules, allow, deny)
        .map_err(|error| config.in_text(build::built_error(file, &error)))?;
    Ok(config.build_only())
}

/// An error found after parsing, with the line and column of its place in `text` and the name
/// of its rule.
fn located(
    format: ConfigFormat,
    text: &str,
    file: &schema::File,
    error: build::Invalid,
) -> ConfigFileError {
    let rule = rule_index(&error.path)
        .and_then(|index| file.rules.get(index))
        .map(|rule| rule.name.clone());
    let location = locate::locate(format, text, &error.path);
    let mut located = ConfigFileError::new(error.path, error.message);
    if let Some(rule) = rule {
        located = located.of_rule(rule);
    }
    match location {
        Some((line, column)) => located.at_line(line, column),
        None => located,
    }
}

/// The index of the rule a place is in (`rules[2].rate`: 2), unless the place is the rule's
/// name (naming the rule would only repeat it).
fn rule_index(path: &str) -> Option<usize> {
    path.strip_prefix("rules[")
        .and_then(|rest| rest.split_once(']'))
        .filter(|(_, field)| *field != ".name")
        .and_then(|(index, _)| index.parse().ok())
}

/// A parser's error at `path`, with the name of its rule when the text gives it.
fn parse_error(
    format: ConfigFormat,
    text: &str,
    path: &str,
    message: &str,
    location: Option<(usize, usize)>,
) -> ConfigFileError {
    let (path, message) = error::refine(path, message);
    let rule = rule_index(&path).and_then(|index| locate::rule_name(format, text, index));
    let mut error = ConfigFileError::new(path, message);
    if let Some(rule) = rule {
        error = error.of_rule(rule);
    }
    match location {
        Some((line, column)) => error.at_line(line, column),
        None => error,
    }
}

/// The file's shape, with the place of the first error.
fn parse(format: ConfigFormat, text: &str) -> Result<schema::File, ConfigFileError> {
    match format {
        ConfigFormat::Toml => {
            let deserializer = toml::Deserializer::parse(text).map_err(|error| {
                let located = ConfigFileError::new("", error.message().trim_end());
                match error.span() {
                    Some(span) => {
                        let (line, column) = error::line_column(text, span.start);
                        located.at_line(line, column)
                    }
                    None => located,
                }
            })?;
            serde_path_to_error::deserialize(deserializer).map_err(|error| {
                let path = error.path().to_string();
                let inner = error.into_inner();
                let location = inner
                    .span()
                    .map(|span| error::line_column(text, span.start));
                parse_error(format, text, &path, inner.message().trim_end(), location)
            })
        }
        ConfigFormat::Yaml => {
            let deserializer = yaml_serde::Deserializer::from_str(text);
            serde_path_to_error::deserialize(deserializer).map_err(|error| {
                let path = error.path().to_string();
                let inner = error.into_inner();
                let location = inner.location().map(|at| (at.line(), at.column()));
                let mut message = inner.to_string();
                if let Some(tab) = location.and_then(|at| yaml_tab(text, at, &message)) {
                    // The parser's own words ("cannot start any token", "while scanning a
                    // plain scalar at ...") and its path are about where it was, not the tab.
                    return ConfigFileError::new("", YAML_TAB).at_line(tab.0, tab.1);
                }
                // The YAML error's text ends with its position and may start with its own
                // idea of the path; both are reported apart.
                if let Some((line, column)) = location {
                    let mark = format!(" at line {line} column {column}");
                    message = message.replacen(&mark, "", 1);
                }
                if let Some((first, rest)) = message.split_once(": ") {
                    if is_yaml_path(first) {
                        message = rest.to_owned();
                    }
                }
                parse_error(format, text, &path, &message, location)
            })
        }
    }
}

const YAML_TAB: &str =
    "found a tab character: YAML does not allow tabs for indentation (indent with spaces)";

/// The line and column of the tab that stopped the YAML parser at `at`, if a tab did: the
/// character there, or — when the parser says it met a tab but stopped further on — the first
/// tab in the indentation of a line up to that one.
fn yaml_tab(text: &str, at: (usize, usize), message: &str) -> Option<(usize, usize)> {
    let lines = text.lines();
    let here = lines.clone().nth(at.0.checked_sub(1)?)?;
    if here.chars().nth(at.1.checked_sub(1)?) == Some('\t') {
        return Some(at);
    }
    if !message.contains("tab character") {
        return None;
    }
    lines.take(at.0).enumerate().find_map(|(index, line)| {
        let indentation = line.len() - line.trim_start_matches([' ', '\t']).len();
        line[..indentation]
            .find('\t')
            .map(|column| (index + 1, column + 1))
    })
}

/// Whether `text` is a path as the YAML parser writes it (`rules[0].key`, `.`).
fn is_yaml_path(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-[]?".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_yaml_tab_is_found_where_the_parser_stopped_or_in_the_indentation_before() {
        let text = "a:\n  b: 1\n\t c: 2\n  d: 3\n";
        assert_eq!(yaml_tab(text, (3, 1), "anything"), Some((3, 1)));
        // The parser says it met a tab, further on: the first tab in an indentation.
        assert_eq!(
            yaml_tab(
                text,
                (4, 3),
                "found a tab character that violates indentation"
            ),
            Some((3, 1))
        );
        assert_eq!(yaml_tab(text, (4, 3), "did not find expected key"), None);
        // A tab after the indentation is not one.
        assert_eq!(
            yaml_tab("a:\n  b:\t1\n  c\n", (3, 3), "found a tab character"),
            None
        );
        assert_eq!(yaml_tab(text, (9, 1), "found a tab character"), None);
        assert_eq!(yaml_tab(text, (0, 0), "found a tab character"), None);
    }

    #[test]
    fn rules_are_named_from_the_text() {
        let toml =
            "[[rules]]\nname = \"a\"\n[[rules]]\nrat = 1\nname = \"b\"\n[[rules]]\nname = 5\n";
        assert_eq!(
            locate::rule_name(ConfigFormat::Toml, toml, 1).as_deref(),
            Some("b")
        );
        assert_eq!(locate::rule_name(ConfigFormat::Toml, toml, 2), None);
        assert_eq!(locate::rule_name(ConfigFormat::Toml, toml, 3), None);
        let yaml = "store: { kind: memory }\nrules:\n  - name: a\n  - { rat: 1, name: b }\n";
        assert_eq!(
            locate::rule_name(ConfigFormat::Yaml, yaml, 1).as_deref(),
            Some("b")
        );
        assert_eq!(locate::rule_name(ConfigFormat::Yaml, "rules: 5", 0), None);
        assert_eq!(rule_index("rules[12].rate"), Some(12));
        assert_eq!(rule_index("rules[1].name"), None);
        assert_eq!(rule_index("store.kind"), None);
    }
}
