//! Both forms of configuration into what the server runs: the domains' descriptor trees, the
//! library's rules (one for every counted limit) and the library's configuration of the store.
//!
//! - A reference YAML file, or a directory of them (`*.yaml`, `*.yml`): see [`crate::reference`].
//! - tollgate's own file (TOML or YAML, the library's format), with a top-level `domain` and a
//!   `descriptors` match on every rule, so every algorithm of the library applies:
//!
//! ```toml
//! domain = "edge"
//! headers = "draft"                        # draft | legacy | both | off (default: draft)
//! reference = ["ratelimit/config"]         # optional: reference files or directories, too
//! domain_headers = { other = "legacy" }    # optional: the headers of the other domains
//!
//! [store]                                  # optional, the library's: memory, Redis or Postgres
//! kind = "memory"
//!
//! [[rules]]
//! name = "per-address"
//! algorithm = "sliding_window"
//! limit = 3
//! period = "1m"
//! descriptors = [{ key = "remote_address" }]   # a value is optional: one counter per value
//! # tollgate-server's own fields: detailed_metric = true, replaces = ["other"], unlimited = true
//! ```
//!
//! The library's checks apply to the rules as written (errors name the rule and the field).
//! Fields of tollgate-server's are taken out before the library reads the rest, and the server
//! takes the library's `Rule`s from it; the reference's limits are `Rule`s built here.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Map, Value};
use tollgate::algorithm::{Algorithm, Mode};
use tollgate::config::{Config, ConfigFileError, ConfigFormat};
use tollgate::store::Store;
use tollgate::{ConfigError, Limiter, Rule};

pub use crate::document::Error;
use crate::document::{fixed_window, placed_error, yaml_error, LibraryRules};
use crate::reference;
use crate::tree::{Domain, Domains, Headers, LimitKind, LimitSpec, Policy};
use crate::unit::Unit;

/// A configuration, read and checked whole.
pub struct Loaded {
    /// The domains and their descriptor trees.
    pub domains: Domains,
    /// The library's rules: one per counted limit, and one per unit for the limits descriptors
    /// bring (see [`crate::plan::override_rule`]). The trees name them.
    pub rules: Vec<Rule>,
    /// The library's configuration of the store (the `[store]` table, from the file or the
    /// reference's variables; no rule): what the server connects to when it starts. A reload
    /// keeps the store in force.
    pub store: Config,
    /// What a descriptor is answered when the store fails (the file's `store.on_failure`; with
    /// `local`, the library decides in-process and the store's failure never reaches here).
    pub on_store_failure: StoreFailure,
}

/// What a descriptor is answered when the store fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum StoreFailure {
    /// OK with no limit (the library's `on_failure = "open"`, its default).
    #[default]
    Open,
    /// OVER_LIMIT (`on_failure = "closed"`).
    Closed,
}

impl Loaded {
    /// Nothing configured yet, served by `store` when the source names one (the reference's
    /// variables do), else in memory: what a server forced to start without its configuration
    /// holds until the configuration can be read (`path`: what errors are about).
    pub fn nothing(store: Option<&Value>, path: &Path) -> Loaded {
        let built = finish(Domains::default(), LibraryRules::default(), store, path);
        // A store table the library refuses is refused again, with its reason, when the
        // configuration is read; meanwhile, memory.
        built.unwrap_or_else(|_| {
            finish(Domains::default(), LibraryRules::default(), None, path)
                .expect("an empty configuration in memory is valid")
        })
    }

    /// A limiter deciding with `store` under these rules, whatever store the configuration
    /// names: for running it offline, as the `tollgate` command does.
    pub fn limiter_with_store(&self, store: impl Store) -> Result<Limiter, ConfigError> {
        Limiter::builder()
            .rules(self.rules.iter().cloned())
            .store(store)
            .build()
    }

    /// The limiter this configuration is served with when the server starts: its store
    /// connected (read from `origin`), its rules in force. A reload then builds the next one
    /// from it ([`Limiter::with_rules`]): same store, same counts.
    pub async fn connect(&self, origin: &Path) -> Result<Limiter, Error> {
        let store = self
            .store
            .connect_limiter()
            .await
            .map_err(|error| library_error(origin, &error))?;
        store
            .with_rules(self.rules.iter().cloned())
            .map_err(|error| rules_error(origin, &error))
    }

    /// Whether nothing is configured: no domain, so every call is answered OK with no limit.
    pub fn is_empty(&self) -> bool {
        self.domains.names().next().is_none()
    }
}

/// An error of the library's about the rules read from `origin`, as a whole (the rule and the
/// field it names are the library's, not a place in one file).
pub fn rules_error(origin: &Path, error: &ConfigError) -> Error {
    Error(format!("{}: {error}", origin.display()))
}

/// What an empty configuration at `path` is told: where nothing was found, and what that means.
pub fn nothing_configured(path: &Path) -> String {
    let found = if path.is_dir() {
        "holds no configuration file (*.yaml, *.yml)"
    } else {
        "configures no domain"
    };
    format!("{}: {found}: no limit is configured", path.display())
}

impl fmt::Debug for Loaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Loaded")
            .field("domains", &self.domains)
            .finish_non_exhaustive()
    }
}

/// Reads the configuration at `path`: a reference file, a directory of them, or tollgate's own
/// file.
pub fn load(path: &Path) -> Result<Loaded, Error> {
    let mut domains = Domains::default();
    let mut rules = LibraryRules::default();
    if path.is_dir() {
        read_reference_dir(path, &mut domains, &mut rules)?;
        return finish(domains, rules, None, path);
    }
    let text = read_text(path)?;
    let format = ConfigFormat::from_path(path).ok_or_else(|| {
        Error(format!(
            "{}: unknown configuration format: name the file .toml, .yaml or .yml, or give a \
             directory of reference files",
            path.display()
        ))
    })?;
    let value = parse_value(path, format, &text)?;
    if format == ConfigFormat::Yaml && reference::looks_like_reference(&value) {
        reference::read(path, &text, &mut domains, &mut rules, false)?;
        return finish(domains, rules, None, path);
    }
    own(path, (format, &text), value, domains, rules)
}

/// The reference's configuration directory, as a Kubernetes ConfigMap volume lays it out:
/// every `*.yaml` (and `*.yml`) under it, in subdirectories too, symlinks followed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeDir {
    /// The directory: `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`.
    pub dir: PathBuf,
    /// Skip files and directories whose name starts with `.` (`RUNTIME_IGNOREDOTFILES`: a
    /// ConfigMap volume's `..data` and `..2024_…` hold the same files again).
    pub ignore_dotfiles: bool,
    /// Files naming one domain are merged rather than refused (`MERGE_DOMAIN_CONFIG`).
    pub merge_domains: bool,
}

/// Domains in the reference's structure, given as values (one per domain, each named by
/// `origin`, as the reference's files are by their path), served by the library's store
/// `store`: what an xDS push is read into. With `merge` (`MERGE_DOMAIN_CONFIG`), two naming one
/// domain are merged rather than refused.
pub fn load_reference_values(
    configs: impl IntoIterator<Item = (String, Value)>,
    store: &Value,
    merge: bool,
    origin: &Path,
) -> Result<Loaded, Error> {
    let mut domains = Domains::default();
    let mut rules = LibraryRules::default();
    for (name, value) in configs {
        reference::read_value(&name, value, &mut domains, &mut rules, merge)?;
    }
    finish(domains, rules, Some(store), origin)
}

/// Reads the reference files of `runtime`, served by the library's store `store` (its
/// `[store]` table, from the reference's variables).
pub fn load_runtime(runtime: &RuntimeDir, store: &Value) -> Result<Loaded, Error> {
    let mut domains = Domains::default();
    let mut rules = LibraryRules::default();
    for file in runtime_files(runtime)? {
        let text = read_text(&file)?;
        reference::read(
            &file,
            &text,
            &mut domains,
            &mut rules,
            runtime.merge_domains,
        )?;
    }
    finish(domains, rules, Some(store), &runtime.dir)
}

/// The files of `runtime` with their content, for reloads to compare.
pub fn runtime_fingerprint(runtime: &RuntimeDir) -> Vec<(PathBuf, Vec<u8>)> {
    runtime_files(runtime)
        .unwrap_or_default()
        .into_iter()
        .map(|file| {
            let content = std::fs::read(&file).unwrap_or_default();
            (file, content)
        })
        .collect()
}

/// The `*.yaml` and `*.yml` files under `runtime.dir`, in path order.
fn runtime_files(runtime: &RuntimeDir) -> Result<Vec<PathBuf>, Error> {
    fn walk(
        dir: &Path,
        ignore_dotfiles: bool,
        files: &mut Vec<PathBuf>,
        depth: usize,
    ) -> std::io::Result<()> {
        // A ConfigMap volume is two levels deep; a symlink loop ends here.
        if depth > 16 {
            return Ok(());
        }
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            let hidden = path
                .file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with('.'));
            if hidden && ignore_dotfiles {
                continue;
            }
            // `is_dir` and `is_file` follow symlinks: a ConfigMap's files are links into
            // `..data`.
            if path.is_dir() {
                walk(&path, ignore_dotfiles, files, depth + 1)?;
            } else if path.is_file() && ConfigFormat::from_path(&path) == Some(ConfigFormat::Yaml) {
                files.push(path);
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    walk(&runtime.dir, runtime.ignore_dotfiles, &mut files, 0)
        .map_err(|error| Error(format!("{}: {error}", runtime.dir.display())))?;
    files.sort();
    Ok(files)
}

/// Whether `path` is a configuration of tollgate-server's rather than a plain one of the library:
/// a directory, a reference file, or tollgate's file with a `domain`.
pub fn is_server_config(path: &Path) -> bool {
    if path.is_dir() {
        return true;
    }
    let Some(format) = ConfigFormat::from_path(path) else {
        return false;
    };
    std::fs::read_to_string(path)
        .ok()
        .and_then(|text| parse_value(path, format, &text).ok())
        .is_some_and(|value| {
            value.get("domain").is_some() || reference::looks_like_reference(&value)
        })
}

/// The files a configuration at `path` is read from now, with their content: what a reload
/// compares.
pub fn fingerprint(path: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut add = |file: PathBuf| {
        let content = std::fs::read(&file).unwrap_or_default();
        files.push((file, content));
    };
    if path.is_dir() {
        reference_files(path)
            .into_iter()
            .flatten()
            .for_each(&mut add);
        return files;
    }
    add(path.to_owned());
    // tollgate's file may include reference files or directories.
    let included = std::fs::read_to_string(path)
        .ok()
        .and_then(|text| {
            let format = ConfigFormat::from_path(path)?;
            parse_value(path, format, &text).ok()
        })
        .map(|value| included_paths(path, &value))
        .unwrap_or_default();
    for path in included {
        if path.is_dir() {
            reference_files(&path)
                .into_iter()
                .flatten()
                .for_each(&mut add);
        } else {
            add(path);
        }
    }
    files
}

fn read_text(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(|error| Error(format!("{}: {error}", path.display())))
}

fn parse_value(path: &Path, format: ConfigFormat, text: &str) -> Result<Value, Error> {
    let located = |line: usize, column: usize, message: String| {
        Error(format!("{}:{line}:{column}: {message}", path.display()))
    };
    match format {
        ConfigFormat::Toml => toml::from_str::<Value>(text).map_err(|error| {
            let (line, column) = error
                .span()
                .map(|span| line_column(text, span.start))
                .unwrap_or((1, 1));
            located(line, column, error.message().to_owned())
        }),
        ConfigFormat::Yaml => {
            yaml_serde::from_str::<Value>(text).map_err(|error| yaml_error(path, &error))
        }
    }
}

/// The 1-based line and column of byte `at` in `text`.
fn line_column(text: &str, at: usize) -> (usize, usize) {
    let before = &text[..at.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, column)
}

/// The reference files of directory `dir`, in name order.
fn reference_files(dir: &Path) -> Result<Vec<PathBuf>, Error> {
    let entries =
        std::fs::read_dir(dir).map_err(|error| Error(format!("{}: {error}", dir.display())))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.is_file() && ConfigFormat::from_path(path) == Some(ConfigFormat::Yaml))
        .collect();
    files.sort();
    Ok(files)
}

fn read_reference_dir(
    dir: &Path,
    domains: &mut Domains,
    rules: &mut LibraryRules,
) -> Result<(), Error> {
    for file in reference_files(dir)? {
        reference::read(&file, &read_text(&file)?, domains, rules, false)?;
    }
    Ok(())
}

/// One entry of a rule's `descriptors` in tollgate's file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Match {
    key: String,
    value: Option<String>,
}

/// tollgate-server's fields of one rule of tollgate's file.
struct OwnRule {
    at: String,
    name: String,
    descriptors: Vec<Match>,
    shadow: bool,
    unlimited: bool,
    detailed_metric: bool,
    replaces: Vec<String>,
}

fn own(
    path: &Path,
    (format, text): (ConfigFormat, &str),
    value: Value,
    mut domains: Domains,
    mut rules: LibraryRules,
) -> Result<Loaded, Error> {
    let fail = |message: String| placed_error(path, format, text, &message);
    let included = included_paths(path, &value);
    let Value::Object(mut file) = value else {
        return Err(fail("expected a table of settings".into()));
    };
    let domain = match file.remove("domain") {
        Some(Value::String(domain)) if !domain.is_empty() => domain,
        Some(_) => return Err(fail("domain: expected a non-empty string".into())),
        None => {
            return Err(fail(
                "domain: missing (the domain this file's rules serve)".into(),
            ))
        }
    };
    let headers: Headers = take(&mut file, "headers")
        .map_err(fail)?
        .unwrap_or_default();
    let domain_headers: std::collections::BTreeMap<String, Headers> =
        take(&mut file, "domain_headers")
            .map_err(fail)?
            .unwrap_or_default();
    file.remove("reference");

    let mut own_rules = Vec::new();
    if let Some(Value::Array(list)) = file.get_mut("rules") {
        let mut kept = Vec::new();
        for (i, rule) in std::mem::take(list).into_iter().enumerate() {
            let Value::Object(mut rule) = rule else {
                kept.push(rule);
                continue;
            };
            let own = own_rule(i, &mut rule).map_err(fail)?;
            rules.reserve(&own.name);
            if !own.unlimited {
                kept.push(Value::Object(rule));
            }
            own_rules.push(own);
        }
        *list = kept;
    }
    for included in &included {
        if included.is_dir() {
            read_reference_dir(included, &mut domains, &mut rules)?;
        } else {
            reference::read(
                included,
                &read_text(included)?,
                &mut domains,
                &mut rules,
                false,
            )?;
        }
    }
    if domains.contains(&domain) {
        return Err(fail(format!(
            "domain: {domain:?} is also configured by a reference file"
        )));
    }
    // JSON is YAML: the library reads the document it would read from a file, and the server
    // takes its rules (there may be none: all unlimited, or all in reference files).
    file.entry("rules")
        .or_insert_with(|| Value::Array(Vec::new()));
    let store = file.get("store").cloned();
    let config = Config::parse(ConfigFormat::Yaml, &Value::Object(file).to_string())
        .map_err(|error| library_error(path, &error))?;
    let own_list = config
        .rules()
        .map_err(|error| library_error(path, &error))?;
    let algorithms: Algorithms = own_list
        .iter()
        .map(|rule| (rule.name(), rule.limit().algorithm().clone()))
        .collect();
    rules.list.splice(0..0, own_list);
    let mut loaded = finish(domains, rules, store.as_ref(), path)?;
    let tree = loaded.domains.entry(&domain);
    tree.headers = headers;
    for rule in own_rules {
        attach(tree, rule, &algorithms).map_err(fail)?;
    }
    for (name, headers) in domain_headers {
        match loaded.domains.get_mut(&name) {
            Some(domain) => domain.headers = headers,
            None => {
                return Err(fail(format!(
                    "domain_headers: no domain {name:?} is configured"
                )))
            }
        }
    }
    Ok(loaded)
}

/// Puts `rule`'s limit at the level of its descriptors in `tree`.
fn attach(tree: &mut Domain, rule: OwnRule, algorithms: &Algorithms) -> Result<(), String> {
    let algorithm = algorithms.get(&rule.name);
    if algorithm.is_some_and(Algorithm::is_concurrency) {
        return Err(format!(
            "{}: a concurrency limit counts requests in flight, and tollgate-server never sees \
             a request end",
            rule.at
        ));
    }
    let (requests_per_unit, unit) = algorithm.map_or((u32::MAX, Unit::Second), |a| {
        Unit::nearest(a.capacity(), a.window())
    });
    // Rounding to the protocol's units is for `current_limit` alone; clients are told the
    // limit as written, as the library's layer tells them.
    let policy = algorithm.map_or(
        Policy {
            quota: u64::from(u32::MAX),
            window_seconds: 1,
        },
        |a| {
            let window = a.window();
            Policy {
                quota: a.capacity(),
                window_seconds: window.as_secs() + u64::from(window.subsec_nanos() > 0),
            }
        },
    );
    let stat_key = rule
        .descriptors
        .iter()
        .map(|m| match &m.value {
            Some(value) => format!("{}_{value}", m.key),
            None => m.key.clone(),
        })
        .collect::<Vec<_>>()
        .join(".");
    let mut node = &mut tree.root;
    for m in &rule.descriptors {
        node = node.child_mut(&m.key, m.value.as_deref());
    }
    if node.limit.is_some() {
        return Err(format!(
            "{}.descriptors: another rule has the same descriptors",
            rule.at
        ));
    }
    node.limit = Some(LimitSpec {
        // An unlimited rule has no rule in the library (nothing to count).
        kind: if rule.unlimited {
            LimitKind::Unlimited
        } else {
            LimitKind::Rule(rule.name.as_str().into())
        },
        max_cost: algorithm.map_or(u64::MAX, |a| a.max_cost(Mode::Charge)),
        name: rule.name,
        requests_per_unit,
        unit,
        policy,
        shadow: rule.shadow,
        detailed_metric: rule.detailed_metric,
        replaces: rule.replaces,
        stat_key,
        quota: false,
        metadata: None,
        from_request: false,
        memo: Default::default(),
    });
    Ok(())
}

/// The reference files or directories tollgate's file at `path` includes, relative to it.
fn included_paths(path: &Path, value: &Value) -> Vec<PathBuf> {
    let base = path.parent().unwrap_or(Path::new("."));
    value
        .get("reference")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(Value::as_str)
                .map(|p| base.join(p))
                .collect()
        })
        .unwrap_or_default()
}

/// Takes field `name` out of `table`, read as `T`.
fn take<T: serde::de::DeserializeOwned>(
    table: &mut Map<String, Value>,
    name: &str,
) -> Result<Option<T>, String> {
    table
        .remove(name)
        .map(|value| serde_json::from_value(value).map_err(|error| format!("{name}: {error}")))
        .transpose()
}

/// Takes tollgate-server's fields out of rule `i`.
fn own_rule(i: usize, rule: &mut Map<String, Value>) -> Result<OwnRule, String> {
    let at = format!("rules[{i}]");
    let name = match rule.get("name") {
        Some(Value::String(name)) => name.clone(),
        _ => {
            return Err(format!(
                "{at}.name: missing (tollgate-server names every limit)"
            ))
        }
    };
    let at = format!("{at} (rule {name:?})");
    if name.starts_with(crate::plan::OVERRIDE_RULE_PREFIX) {
        return Err(format!(
            "{at}.name: names beginning with {:?} are tollgate-server's own",
            crate::plan::OVERRIDE_RULE_PREFIX
        ));
    }
    if rule.contains_key("tiers") {
        return Err(format!(
            "{at}.tiers: a tollgate-server rule is chosen by its descriptors, not by plans"
        ));
    }
    let in_rule = |message: String| format!("{at}.{message}");
    let descriptors: Vec<Match> = take(rule, "descriptors").map_err(in_rule)?.ok_or_else(|| {
        format!("{at}.descriptors: missing (the descriptor entries this rule limits)")
    })?;
    if descriptors.is_empty() || descriptors.iter().any(|m| m.key.is_empty()) {
        return Err(format!(
            "{at}.descriptors: needs at least one entry, each with a non-empty key"
        ));
    }
    let unlimited: bool = take(rule, "unlimited").map_err(in_rule)?.unwrap_or(false);
    if unlimited {
        // An unlimited rule is a name and its descriptors: nothing for the library to count.
        rule.retain(|field, _| field == "name");
    }
    Ok(OwnRule {
        shadow: rule.get("shadow").and_then(Value::as_bool).unwrap_or(false),
        detailed_metric: take(rule, "detailed_metric")
            .map_err(in_rule)?
            .unwrap_or(false),
        replaces: take(rule, "replaces").map_err(in_rule)?.unwrap_or_default(),
        unlimited,
        descriptors,
        name,
        at,
    })
}

/// The algorithm of every rule in force, by name.
type Algorithms = HashMap<String, Algorithm>;

/// The configuration whole: the trees, the rules the files added with the rules of the limits
/// descriptors bring, and the library's configuration of `store` (a `[store]` table; none:
/// memory), checked.
fn finish(
    domains: Domains,
    mut rules: LibraryRules,
    store: Option<&Value>,
    path: &Path,
) -> Result<Loaded, Error> {
    // The rules a descriptor's own `limit` is counted under: one per unit, the number given
    // with each charge (see `crate::plan::OVERRIDE_RULE_PREFIX`).
    rules.list.extend(
        Unit::ALL
            .into_iter()
            .map(|unit| fixed_window(&crate::plan::override_rule(unit), u32::MAX, unit)),
    );
    let on_store_failure = match store.and_then(|s| s.get("on_failure")) {
        Some(Value::String(policy)) if policy == "closed" => StoreFailure::Closed,
        _ => StoreFailure::Open,
    };
    let mut document = Map::new();
    document.insert("rules".to_owned(), Value::Array(Vec::new()));
    if let Some(store) = store {
        document.insert("store".to_owned(), store.clone());
    }
    // JSON is YAML: the library reads the table it would read from a file, and checks it.
    let store = Config::parse(ConfigFormat::Yaml, &Value::Object(document).to_string())
        .and_then(|config| config.rules().map(|_| config))
        .map_err(|error| library_error(path, &error))?;
    Ok(Loaded {
        domains,
        rules: rules.list,
        store,
        on_store_failure,
    })
}

/// An error of the library's about the configuration read from `path`: the line and column of
/// its place in that file (the library's own would be those of the document the server hands
/// it), its place as a path (`rules[2].period`, `store.url`) and the rule it names.
pub fn library_error(path: &Path, error: &ConfigFileError) -> Error {
    let rule = error
        .rule()
        .map(|rule| format!(" (rule {rule:?})"))
        .unwrap_or_default();
    let at = ConfigFormat::from_path(path)
        .zip(std::fs::read_to_string(path).ok())
        .and_then(|(format, text)| tollgate::config::locate(format, &text, error.path()))
        .map(|(line, column)| format!(":{line}:{column}"))
        .unwrap_or_default();
    Error(format!(
        "{}{at}: {}{rule}: {}",
        path.display(),
        error.path(),
        error.message()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error loading `text` as the file `name` gives, without the directory.
    fn error(name: &str, text: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let error = load(&path).expect_err("an invalid configuration").0;
        error.replace(&format!("{}/", dir.path().display()), "")
    }

    const RULE: &str = "[[rules]]\nname = \"r\"\nrate = 1\nperiod = \"1s\"\n";

    #[test]
    fn tollgate_files_say_what_tollgate_server_needs() {
        assert_eq!(
            error("a.toml", RULE),
            "a.toml:1:1: domain: missing (the domain this file's rules serve)"
        );
        assert_eq!(
            error("a.toml", &format!("domain = \"d\"\n{RULE}")),
            "a.toml:2:1: rules[0] (rule \"r\").descriptors: missing (the descriptor entries this rule limits)"
        );
        let twice = format!(
            "domain = \"d\"\n{RULE}descriptors = [{{ key = \"k\" }}]\n{}descriptors = [{{ key = \"k\" }}]\n",
            RULE.replace("\"r\"", "\"s\"")
        );
        assert_eq!(
            error("a.toml", &twice),
            "a.toml:11:15: rules[1] (rule \"s\").descriptors: another rule has the same descriptors"
        );
        let concurrent = "domain = \"d\"\n[[rules]]\nname = \"c\"\nconcurrent = 2\ndescriptors = [{ key = \"k\" }]\n";
        assert!(
            error("a.toml", concurrent).contains("a concurrency limit counts requests in flight")
        );
        // The library's own checks, at their place in the file: line 4, column 8 is `0`.
        let bad = "domain = \"d\"\n[[rules]]\nname = \"r\"\nrate = 0\nperiod = \"1s\"\ndescriptors = [{ key = \"k\" }]\n";
        assert_eq!(
            error("a.toml", bad),
            "a.toml:4:8: rules[0].rate (rule \"r\"): must be greater than 0"
        );
    }

    #[test]
    fn reference_files_say_where() {
        assert_eq!(
            error(
                "r.yaml",
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 1, nmae: x }\n"
            ),
            "r.yaml:4:55: descriptors[0].rate_limit: unknown field `nmae`, expected one of `unit`, `requests_per_unit`, `name`, `unlimited`, `replaces`"
        );
        // The fields the reference added later are read; a misspelt one is still an error.
        assert_eq!(
            error(
                "r.yaml",
                "domain: d\ndescriptors:\n  - key: k\n    quota_mod: true\n"
            ),
            "r.yaml:4:5: descriptors[0]: unknown field `quota_mod`, expected one of `key`, `value`, `rate_limit`, `descriptors`, `shadow_mode`, `detailed_metric`, `share_threshold`, `value_to_metric`, `quota_mode`, `metadata`"
        );
        assert_eq!(
            error(
                "r.yaml",
                "domain: d\ndescriptors:\n  - key: k\n  - key: k\n"
            ),
            "r.yaml:4:5: descriptors[1]: duplicate descriptor \"k\" at this level"
        );
        assert_eq!(
            error(
                "r.yaml",
                "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: k\n        value: v\n      - key: k\n        value: v\n"
            ),
            "r.yaml:7:9: descriptors[0].descriptors[1]: duplicate descriptor \"k_v\" at this level"
        );
    }

    #[test]
    fn the_later_fields_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("later.yaml");
        let file = "domain: later\ndescriptors:\n  - key: service\n    value: s1\n    quota_mode: true\n    value_to_metric: true\n    metadata:\n      owner: { team: payments, level: 2 }\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n";
        std::fs::write(&path, file).unwrap();
        let loaded = load(&path).expect("the reference loads it, so does tollgate-server");
        let domain = loaded.domains.get("later").unwrap();
        assert!(domain.value_to_metric);
        let limit = domain.limits()[0];
        assert!(limit.quota);
        let metadata = serde_json::Value::Object((**limit.metadata.as_ref().unwrap()).clone());
        assert_eq!(
            metadata,
            serde_json::json!({ "owner": { "team": "payments", "level": 2 } })
        );
    }

    /// The limits of a loaded configuration: (shown name, library rule) per statistics key.
    fn limits(loaded: &Loaded, domain: &str) -> Vec<(String, String, String)> {
        loaded
            .domains
            .get(domain)
            .unwrap()
            .limits()
            .into_iter()
            .map(|limit| {
                let rule = match &limit.kind {
                    LimitKind::Rule(rule) => rule.to_string(),
                    other => format!("{other:?}"),
                };
                (limit.stat_key.clone(), limit.name.clone(), rule)
            })
            .collect()
    }

    #[test]
    fn levels_whose_names_read_alike_are_counters_of_their_own() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("col.yaml");
        // The reference loads this file: its duplicate check is for one key and value at one
        // level. `x: "y.z"` and `x: "y"` then `z` have one statistics key; `a_b` alone and `a`
        // with the value `b` another.
        let file = "domain: col\ndescriptors:\n  - key: x\n    value: y.z\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n  - key: x\n    value: y\n    descriptors:\n      - key: z\n        rate_limit: { unit: hour, requests_per_unit: 2 }\n  - key: a_b\n    rate_limit: { unit: hour, requests_per_unit: 3 }\n  - key: a\n    value: b\n    rate_limit: { unit: hour, requests_per_unit: 4 }\n";
        std::fs::write(&path, file).unwrap();
        let loaded = load(&path).expect("the reference loads it, so does tollgate-server");
        let mut found = limits(&loaded, "col");
        found.sort();
        let owned = |a: &str, b: &str, c: &str| (a.to_owned(), b.to_owned(), c.to_owned());
        assert_eq!(
            found,
            [
                owned("a_b", "col.a_b", "col.a_b"),
                owned("a_b", "col.a_b#2", "col.a_b#2"),
                owned("x_y.z", "col.x_y.z", "col.x_y.z"),
                owned("x_y.z", "col.x_y.z#2", "col.x_y.z#2"),
            ]
        );
        // A rule of tollgate's own file keeps the name its author gave it.
        std::fs::write(dir.path().join("server.toml"), "domain = \"own\"\nreference = [\"col.yaml\"]\n[[rules]]\nname = \"col.a_b\"\nrate = 1\nperiod = \"1s\"\ndescriptors = [{ key = \"k\" }]\n").unwrap();
        let loaded = load(&dir.path().join("server.toml")).expect("no name is taken twice");
        assert_eq!(limits(&loaded, "own")[0].2, "col.a_b");
        let col = limits(&loaded, "col");
        assert!(col.iter().all(|(_, _, rule)| rule != "col.a_b"), "{col:?}");
    }
}
