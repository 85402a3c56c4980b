//! From the file's shape to tollgate's values: `Rule`s, `AccessList`s, the layer's builder.
//!
//! Every check that needs more than one field happens here, and every error names its place in
//! the file (`rules[2].tiers.plans.pro.rate`). A rule is validated as soon as it is built, so a
//! [`ConfigError`] of the rule (which names the rule and the field) becomes the place of the
//! field in the file.

use std::sync::Arc;

use http::StatusCode;

use super::schema::{
    AccessSpec, AlgorithmName, BlockSpec, CalendarName, CdnHeaderName, ClientIpSpec, CostSpec,
    CountIfSpec, File, ForwardedHeaderName, KeySpec, LimitFields, MissingKeySpec, OnFailure,
    PlanSource, QueueSpec, RedactKeysSpec, ResponseSpec, RuleSpec, SharedSecretSpec, StoreKind,
    StoreSpec, TiersSpec,
};
use super::PlanName;
use super::UnlimitedPlan;
use crate::algorithm::error::ConfigError;
use crate::algorithm::Limit;
use crate::algorithm::{Lease, Penalty};
use crate::engine::limiter::Limiter;
use crate::key::{CdnHeader, ForwardedHeader, Key, RequestHead};
use crate::middleware::layer::{RateLimitLayer, RateLimitLayerBuilder};
use crate::observe::redact::MIN_SECRET;
use crate::rules::cost::Cost;
use crate::rules::queue::Queue;
use crate::rules::rule::{MissingKey, Rule};
use crate::rules::set::AccessList;
use crate::rules::settle::{CountIf, Settle};
use crate::store::FailurePolicy;
use crate::store::MemoryStore;
use crate::store::Store;

/// A value that cannot work, at its place in the file.
#[derive(Debug)]
pub(crate) struct Invalid {
    pub(crate) path: String,
    pub(crate) message: String,
}

fn invalid<T>(path: impl Into<String>, message: impl Into<String>) -> Result<T, Invalid> {
    Err(Invalid {
        path: path.into(),
        message: message.into(),
    })
}

/// What a reload replaces: the rules and the allow and deny lists.
pub(crate) struct Rules {
    pub(crate) rules: Vec<Rule>,
    pub(crate) allow: Vec<AccessList>,
    pub(crate) deny: Vec<AccessList>,
}

/// The whole layer, for a file whose store needs no connecting.
pub(crate) fn layer(file: &File) -> Result<RateLimitLayer, Invalid> {
    finish(file, builder(file)?)
}

pub(crate) fn finish(
    file: &File,
    builder: RateLimitLayerBuilder,
) -> Result<RateLimitLayer, Invalid> {
    builder.build().map_err(|error| built_error(file, &error))
}

/// An error of building a limiter from `file`'s rules (two rules of one name, a rule the store
/// cannot decide) at the place of its rule's field, when the rule is one of the file's.
pub(crate) fn built_error(file: &File, error: &ConfigError) -> Invalid {
    let name = error.rule();
    // A tiered rule's rules are named `rule:plan`.
    let index = file.rules.iter().position(|rule| {
        name == rule.name
            || (rule.tiers.is_some()
                && name
                    .strip_prefix(rule.name.as_str())
                    .is_some_and(|rest| rest.starts_with(':')))
    });
    match index {
        Some(index) => Invalid {
            path: format!("rules[{index}].{}", error.field()),
            message: error.message().to_owned(),
        },
        None => Invalid {
            path: "rules".into(),
            message: error.to_string(),
        },
    }
}

/// The limiter a file describes: its rules (none is allowed), lists, store and failure policy.
/// A Redis store connects asynchronously, so a file naming one is refused here: see
/// [`limiter_connected`].
pub(crate) fn limiter(file: &File) -> Result<Limiter, Invalid> {
    match file.store.as_ref().map(|spec| spec.kind) {
        Some(StoreKind::Redis) => invalid(
            "store.kind",
            "a Redis store connects asynchronously: build the limiter with `Config::connect_limiter(..).await`",
        ),
        Some(StoreKind::Postgres) => invalid(
            "store.kind",
            "a Postgres store connects asynchronously: build the limiter with `Config::connect_limiter(..).await`",
        ),
        _ => limiter_with(file, None::<MemoryStore>),
    }
}

/// [`limiter`], connecting to Redis or Postgres when the file names such a store.
pub(crate) async fn limiter_connected(file: &File) -> Result<Limiter, Invalid> {
    if let Some(spec) = file
        .store
        .as_ref()
        .filter(|s| s.kind == StoreKind::Postgres)
    {
        check_store(spec)?;
        let store = postgres_store(spec)
            .await
            .map_err(|(field, message)| Invalid {
                path: format!("store.{field}"),
                message,
            })?;
        return limiter_with(file, Some(store));
    }
    let redis = match file.store.as_ref() {
        Some(spec) if spec.kind == StoreKind::Redis => {
            let url = spec.url.as_deref().unwrap_or_default();
            Some(
                redis_store(url, spec)
                    .await
                    .map_err(|(field, message)| Invalid {
                        path: format!("store.{field}"),
                        message,
                    })?,
            )
        }
        _ => None,
    };
    limiter_with(file, redis)
}

/// The limiter `file` describes, deciding with `remote` when given (the file's Redis store).
fn limiter_with<S: Store>(file: &File, remote: Option<S>) -> Result<Limiter, Invalid> {
    check_others(file)?;
    let Rules { rules, allow, deny } = rules_of(file)?;
    let mut builder = Limiter::builder().rules(rules);
    for list in allow {
        builder = builder.allow(list);
    }
    for list in deny {
        builder = builder.deny(list);
    }
    if let Some(spec) = &file.store {
        check_store(spec)?;
        builder = builder.on_store_failure(failure_policy(spec));
        if let (StoreKind::Memory, Some(max_keys)) = (spec.kind, spec.max_keys) {
            builder = builder.store(MemoryStore::builder().max_keys(max_keys).build());
        }
    }
    if let Some(store) = remote {
        builder = builder.store(store);
    }
    builder.build().map_err(|error| built_error(file, &error))
}

/// Checks the settings of `file` that only a layer reads (a limiter, a reload, the rules alone
/// leave them as they are, but a file is valid whole or not at all).
pub(crate) fn check_others(file: &File) -> Result<(), Invalid> {
    if let Some(store) = &file.store {
        check_store(store)?;
    }
    if let Some(response) = &file.response {
        check_response(response)?;
    }
    check_redact_keys(&file.redact_keys)
}

/// Everything the file says, as a builder code can still adjust. A Redis store connects
/// asynchronously, so a file naming one is refused here: see [`builder_connected`].
pub(crate) fn builder(file: &File) -> Result<RateLimitLayerBuilder, Invalid> {
    let builder = without_redis(file)?;
    match file.store.as_ref().map(|spec| spec.kind) {
        Some(StoreKind::Redis) => invalid(
            "store.kind",
            "a Redis store connects asynchronously: build the layer with `Config::connect(..).await`",
        ),
        Some(StoreKind::Postgres) => invalid(
            "store.kind",
            "a Postgres store connects asynchronously: build the layer with `Config::connect(..).await`",
        ),
        _ => Ok(builder),
    }
}

/// [`builder`], connecting to Redis when the file names a Redis store.
pub(crate) async fn builder_connected(file: &File) -> Result<RateLimitLayerBuilder, Invalid> {
    let builder = without_redis(file)?;
    match file.store.as_ref() {
        Some(spec) if spec.kind == StoreKind::Redis => {
            let url = spec.url.as_deref().unwrap_or_default();
            let store = redis_store(url, spec)
                .await
                .map_err(|(field, message)| Invalid {
                    path: format!("store.{field}"),
                    message,
                })?;
            Ok(builder.store(store))
        }
        Some(spec) if spec.kind == StoreKind::Postgres => {
            let store = postgres_store(spec)
                .await
                .map_err(|(field, message)| Invalid {
                    path: format!("store.{field}"),
                    message,
                })?;
            Ok(builder.store(store))
        }
        _ => Ok(builder),
    }
}

/// The builder with everything but a Redis store.
pub(crate) fn without_redis(file: &File) -> Result<RateLimitLayerBuilder, Invalid> {
    let Rules { rules, allow, deny } = rules(file)?;
    let mut builder = RateLimitLayer::builder().shadow(file.shadow);
    builder = match &file.redact_keys {
        RedactKeysSpec::Off => builder,
        RedactKeysSpec::PerProcess => builder.redact_keys(true),
        RedactKeysSpec::Shared(shared) => {
            check_redact_keys(&file.redact_keys)?;
            builder.redact_keys_secret(&shared.secret.0)
        }
    };
    if let Some(capacity) = file.top_offenders {
        builder = builder.top_offenders(capacity);
    }
    for rule in rules {
        builder = builder.rule(rule);
    }
    for list in allow {
        builder = builder.allow(list);
    }
    for list in deny {
        builder = builder.deny(list);
    }
    builder = store(builder, file.store.as_ref())?;
    if let Some(response) = &file.response {
        builder = response_options(builder, response)?;
    }
    Ok(builder)
}

/// The rules and the lists of a layer, each validated: a layer limits something.
pub(crate) fn rules(file: &File) -> Result<Rules, Invalid> {
    if file.rules.is_empty() && file.deny.is_empty() {
        return invalid(
            "rules",
            "is empty: a layer without rules limits nothing (only a layer with a deny list may have no rules)",
        );
    }
    rules_of(file)
}

/// The rules and the lists, each validated; there may be none.
pub(crate) fn rules_of(file: &File) -> Result<Rules, Invalid> {
    let mut rules: Vec<(Rule, String)> = Vec::new();
    for (index, spec) in file.rules.iter().enumerate() {
        for (rule, at) in rule(spec, &format!("rules[{index}]"))? {
            let name = rule.name();
            if let Some((_, first)) = rules.iter().find(|(r, _)| r.name() == name) {
                return invalid(
                    at,
                    format!("the rule name {name:?} is already used by {first} (names are the rules' namespaces)"),
                );
            }
            rules.push((rule, at));
        }
    }
    Ok(Rules {
        rules: rules.into_iter().map(|(rule, _)| rule).collect(),
        allow: access_lists(&file.allow, "allow")?,
        deny: access_lists(&file.deny, "deny")?,
    })
}

/// The rules of one entry: one rule, or one per plan; each with the place of its name.
fn rule(spec: &RuleSpec, at: &str) -> Result<Vec<(Rule, String)>, Invalid> {
    let common = Common::of(spec, at)?;
    let fields = spec.limit_fields();
    let Some(tiers) = &spec.tiers else {
        let limit = limit(&fields, &|_| at.to_owned(), at)?;
        let rule = common.apply(Rule::new(spec.name.clone(), limit));
        rule.validate()
            .map_err(|error| from_rule_error(&error, &|_| at.to_owned()))?;
        return Ok(vec![(rule, format!("{at}.name"))]);
    };
    tiered(spec, tiers, &common, &fields, at)
}

/// What every rule of an entry shares, whatever its plan.
struct Common {
    key: Key,
    cost: Option<Cost>,
    methods: Vec<http::Method>,
    paths: Vec<String>,
    grpc: Vec<String>,
    missing_key: Option<MissingKey>,
    queue: Option<Queue>,
    penalty: Option<Penalty>,
    count_if: Option<CountIf>,
    settle: Option<Settle>,
    lease: Option<Lease>,
    shadow: bool,
    overrides: bool,
}

impl Common {
    fn of(spec: &RuleSpec, at: &str) -> Result<Common, Invalid> {
        for (i, path) in spec.paths.iter().enumerate() {
            if !path.starts_with('/') {
                return invalid(
                    format!("{at}.paths[{i}]"),
                    format!("{path:?} does not start with '/'"),
                );
            }
        }
        for (i, pattern) in spec.grpc.iter().enumerate() {
            if let Err(message) = crate::rules::rule::check_grpc_pattern(pattern) {
                return invalid(format!("{at}.grpc[{i}]"), message);
            }
        }
        Ok(Common {
            key: match &spec.key {
                Some(key) => self::key(key, &format!("{at}.key"))?,
                None => Key::global(),
            },
            cost: spec.cost.as_ref().map(|cost| match cost {
                CostSpec::Fixed(units) => Cost::fixed(*units),
                CostSpec::Header(header) => match header.default {
                    Some(default) => Cost::header(header.header.0.clone()).or(default),
                    None => Cost::header(header.header.0.clone()),
                },
            }),
            methods: spec.methods.iter().map(|m| m.0.clone()).collect(),
            paths: spec.paths.clone(),
            grpc: spec.grpc.clone(),
            missing_key: spec
                .on_missing_key
                .as_ref()
                .map(|missing| missing_key(missing, &format!("{at}.on_missing_key")))
                .transpose()?,
            queue: spec
                .queue
                .as_ref()
                .map(|queue| self::queue(queue, &format!("{at}.queue")))
                .transpose()?,
            penalty: spec.block.as_ref().map(|block| match block {
                BlockSpec::Fixed(d) => Penalty::fixed(d.0),
                BlockSpec::Escalate(e) => {
                    Penalty::escalating(e.escalate.iter().map(|d| d.0), e.forget_after.0)
                }
            }),
            count_if: spec
                .count_if
                .as_ref()
                .map(|count_if| self::count_if(count_if, &format!("{at}.count_if")))
                .transpose()?,
            settle: spec
                .settle
                .as_ref()
                .map(|settle| Settle::header(settle.header.0.clone())),
            lease: spec
                .lease
                .as_ref()
                .map(|lease| Lease::new(lease.units, lease.ttl.0)),
            shadow: spec.shadow,
            overrides: spec.overrides,
        })
    }

    fn apply(&self, mut rule: Rule) -> Rule {
        rule = rule
            .key(self.key.clone())
            .methods(self.methods.iter().cloned())
            .shadow(self.shadow);
        if self.overrides {
            rule = rule.overridable();
        }
        for path in &self.paths {
            rule = rule.path(path.clone());
        }
        for pattern in &self.grpc {
            rule = rule.grpc(pattern.clone());
        }
        if let Some(cost) = &self.cost {
            rule = rule.cost(cost.clone());
        }
        if let Some(missing) = &self.missing_key {
            rule = rule.on_missing_key(missing.clone());
        }
        if let Some(queue) = self.queue {
            rule = rule.queue(queue);
        }
        if let Some(penalty) = &self.penalty {
            rule = rule.block(penalty.clone());
        }
        if let Some(count_if) = &self.count_if {
            rule = rule.count_if(count_if.clone());
        }
        if let Some(settle) = &self.settle {
            rule = rule.settle(settle.clone());
        }
        if let Some(lease) = self.lease {
            rule = rule.lease(lease);
        }
        rule
    }
}

/// The unlimited plans of `file`'s tiered rules: no rule is built for them, so the limiter does
/// not know them. (Read from a file whose rules were built: its tiers are valid.)
pub(crate) fn unlimited_plans(file: &File) -> Vec<UnlimitedPlan> {
    let mut found = Vec::new();
    for spec in &file.rules {
        let Some(tiers) = &spec.tiers else { continue };
        let source = tiers.from.as_ref().unwrap_or(&PlanSource::Key);
        for (plan, plan_spec) in &tiers.plans.0 {
            if !plan_spec.unlimited {
                continue;
            }
            let listed = tiers
                .keys
                .iter()
                .flatten()
                .filter(|(_, p)| *p == plan)
                .count();
            found.push(UnlimitedPlan {
                rule: spec.name.clone(),
                plan: plan.clone(),
                condition: plan_condition(source, plan, &tiers.default, listed),
            });
        }
    }
    found
}

/// One rule per plan, each applying to the requests of its plan.
fn tiered(
    spec: &RuleSpec,
    tiers: &TiersSpec,
    common: &Common,
    fields: &LimitFields,
    at: &str,
) -> Result<Vec<(Rule, String)>, Invalid> {
    let at_tiers = format!("{at}.tiers");
    let plans = &tiers.plans.0;
    if plans.is_empty() {
        return invalid(format!("{at_tiers}.plans"), "has no plans");
    }
    let names: Vec<&str> = plans.iter().map(|(name, _)| name.as_str()).collect();
    let known = |plan: &str| names.contains(&plan);
    let listing = names.join(", ");
    for name in &names {
        let valid = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !valid {
            return invalid(
                format!("{at_tiers}.plans.{name}"),
                "a plan name is letters, digits, '-', '_' and '.'",
            );
        }
    }
    if !known(&tiers.default) {
        return invalid(
            format!("{at_tiers}.default"),
            format!("{:?} is not a plan (plans: {listing})", tiers.default),
        );
    }
    let source = tiers.from.as_ref().unwrap_or(&PlanSource::Key);
    let table = match (source, &tiers.keys) {
        (PlanSource::Key, None) => {
            return invalid(
                format!("{at_tiers}.keys"),
                "is required when plans come from the key (`from = \"key\"`, the default): a table from key to plan",
            )
        }
        (PlanSource::Key, Some(keys)) => {
            for (key, plan) in keys {
                if !known(plan) {
                    return invalid(
                        format!("{at_tiers}.keys.{key}"),
                        format!("{plan:?} is not a plan (plans: {listing})"),
                    );
                }
            }
            keys.clone()
        }
        (_, Some(_)) => {
            return invalid(
                format!("{at_tiers}.keys"),
                "is only used when plans come from the key (`from = \"key\"`)",
            )
        }
        (_, None) => Default::default(),
    };
    let listed = |plan: &str| table.values().filter(|p| *p == plan).count();
    let conditions: Vec<String> = names
        .iter()
        .map(|plan| plan_condition(source, plan, &tiers.default, listed(plan)))
        .collect();
    let selector = Arc::new(PlanSelector {
        source: match source {
            PlanSource::Key => Selector::Key(common.key.clone()),
            PlanSource::Extension => Selector::Extension,
            PlanSource::Header(name) => Selector::Header(name.clone()),
        },
        plans: names.iter().map(|name| Arc::from(*name)).collect(),
        default: Arc::from(tiers.default.as_str()),
        table: table
            .into_iter()
            .map(|(key, plan)| (key.into_bytes().into_boxed_slice(), Arc::from(plan)))
            .collect(),
    });
    let mut rules = Vec::new();
    for ((plan, plan_spec), condition) in plans.iter().zip(conditions) {
        let at_plan = format!("{at_tiers}.plans.{plan}");
        let own = plan_spec.limit_fields();
        if plan_spec.unlimited {
            if let Some(field) = LIMIT_FIELDS.iter().find(|f| own.has(f)) {
                return invalid(
                    format!("{at_plan}.{field}"),
                    "an unlimited plan has no limit",
                );
            }
            continue;
        }
        // A limit field's place: on the plan if the plan sets it or nobody does, else on the
        // rule. Every other field is the rule's.
        let place = |field: &str| {
            let limit_field = LIMIT_FIELDS.contains(&field) || field.starts_with("pool.");
            if own.has(field) || (limit_field && !fields.has(field)) {
                at_plan.clone()
            } else {
                at.to_owned()
            }
        };
        let limit = limit(&own.over(fields), &place, &at_plan)?;
        let selector = selector.clone();
        let this: Arc<str> = Arc::from(plan.as_str());
        let rule = common
            .apply(Rule::new(format!("{}:{plan}", spec.name), limit))
            .when_described(condition, move |head| selector.plan_of(head) == &*this);
        rule.validate().map_err(|error| {
            // The plan's suffix is valid, so a bad name is the rule's.
            from_rule_error(&error, &place)
        })?;
        rules.push((rule, at_plan));
    }
    Ok(rules)
}

/// Which requests the rule of `plan` applies to, in words: a phrase that follows "only for".
fn plan_condition(source: &PlanSource, plan: &str, default: &str, listed: usize) -> String {
    let is_default = plan == default;
    let requests = match (source, is_default) {
        (PlanSource::Header(name), false) => format!("requests whose {name} header is {plan:?}"),
        (PlanSource::Header(name), true) => {
            format!("requests whose {name} header is {plan:?}, names no other plan, or is absent")
        }
        (PlanSource::Extension, false) => {
            format!("requests whose `PlanName` extension (set by the application) is {plan:?}")
        }
        (PlanSource::Extension, true) => format!(
            "requests whose `PlanName` extension (set by the application) is {plan:?}, names no \
             other plan, or is absent"
        ),
        (PlanSource::Key, true) => {
            "requests whose key is not listed for another plan in `tiers.keys`".to_owned()
        }
        (PlanSource::Key, false) => match listed {
            0 => "no request: no key is listed for it in `tiers.keys`".to_owned(),
            1 => "requests whose key is the one listed for it in `tiers.keys`".to_owned(),
            n => format!("requests whose key is one of the {n} listed for it in `tiers.keys`"),
        },
    };
    let default = if is_default { ", the default" } else { "" };
    format!("plan {plan:?}{default} ({requests})")
}

/// The fields of a rule that make its limit over time (its algorithm and its numbers): what a
/// tool that takes a limit in a file's words (an override's, say) may accept, and no more.
pub const LIMIT_FIELDS: &[&str] = &[
    "algorithm",
    "rate",
    "limit",
    "period",
    "capacity",
    "initial",
    "pool",
    "aligned",
    "aligned_at",
    "calendar",
    "utc_offset",
];

/// How a tiered rule finds a request's plan.
struct PlanSelector {
    source: Selector,
    plans: Vec<Arc<str>>,
    default: Arc<str>,
    table: std::collections::HashMap<Box<[u8]>, Arc<str>>,
}

enum Selector {
    Key(Key),
    Extension,
    Header(http::HeaderName),
}

impl PlanSelector {
    /// The request's plan: the one its source names if that is a plan, else the default.
    fn plan_of(&self, head: &RequestHead<'_>) -> &str {
        let named = match &self.source {
            Selector::Key(key) => key
                .extract_head(head)
                .and_then(|key| self.table.get(key.as_bytes()))
                .map(|plan| &**plan),
            Selector::Extension => head.extensions.get::<PlanName>().map(PlanName::as_str),
            Selector::Header(name) => head.headers.get(name).and_then(|v| v.to_str().ok()),
        };
        named
            .and_then(|name| self.plans.iter().find(|plan| &***plan == name))
            .unwrap_or(&self.default)
    }
}

/// The limit of `fields`; `place(field)` is where a field is written, `at` where a missing one
/// belongs.
fn limit(fields: &LimitFields, place: &dyn Fn(&str) -> String, at: &str) -> Result<Limit, Invalid> {
    let algorithm = fields.algorithm.unwrap_or(AlgorithmName::TokenBucket);
    let here = |field: &str| format!("{}.{field}", place(field));
    let unused = |field: &str, why: &str| -> Result<(), Invalid> {
        if fields.has(field) {
            invalid(here(field), why.to_owned())
        } else {
            Ok(())
        }
    };
    let required = |field: &str, value: Option<u64>| -> Result<u64, Invalid> {
        value.map_or_else(
            || {
                invalid(
                    format!("{at}.{field}"),
                    format!("is required by a {algorithm}"),
                )
            },
            Ok,
        )
    };
    let period = fields.period.map_or_else(
        || {
            invalid(
                format!("{at}.period"),
                format!("is required by a {algorithm}"),
            )
        },
        Ok,
    );
    if let Some(n) = fields.concurrent {
        // A concurrency limit counts requests in flight, not units over time: none of the
        // fields of a limit over time applies.
        for field in LIMIT_FIELDS {
            unused(
                field,
                "a concurrency rule (`concurrent`) counts requests in flight, not units over \
                 time: it takes no rate, limit, period or algorithm",
            )?;
        }
        return Ok(Limit::concurrent(n));
    }
    let not_used = format!("is not used by a {algorithm}");
    if algorithm != AlgorithmName::FixedWindow {
        unused("calendar", "only a fixed_window follows the calendar")?;
    }
    if fields.calendar.is_none() {
        unused("utc_offset", "only a calendar window has a UTC offset")?;
    }
    let limit = match algorithm {
        AlgorithmName::TokenBucket => {
            unused("limit", "a token_bucket takes `rate`, not `limit`")?;
            unused("aligned", "only windows are aligned")?;
            unused("aligned_at", "only windows are aligned")?;
            let mut limit = Limit::token_bucket(required("rate", fields.rate)?, period?);
            if let Some(capacity) = fields.capacity {
                limit = limit.capacity(capacity);
            }
            if let Some(initial) = fields.initial {
                limit = limit.initial(initial);
            }
            if let Some(pool) = &fields.pool {
                limit = limit.pool(pool.capacity, pool.rate, pool.period.0);
            }
            limit
        }
        window => {
            unused("rate", "windows take `limit`, not `rate`")?;
            unused("initial", &not_used)?;
            unused("pool", &not_used)?;
            if window != AlgorithmName::FixedWindow {
                unused("capacity", &not_used)?;
            }
            let count = required("limit", fields.limit)?;
            if let Some(calendar) = fields.calendar {
                let why = "a calendar window follows the calendar";
                unused("period", why)?;
                unused("aligned", why)?;
                unused("aligned_at", why)?;
                let offset = match fields.utc_offset.as_deref() {
                    None => 0,
                    Some(text) => utc_offset(text).ok_or_else(|| Invalid {
                        path: here("utc_offset"),
                        message: format!(
                            "invalid UTC offset {text:?}: write \"+02:00\", \"-05:30\" or \"Z\", \
                             within 18 hours"
                        ),
                    })?,
                };
                let limit = match calendar {
                    CalendarName::Month => Limit::calendar_month(count, offset),
                    CalendarName::Week => Limit::calendar_week(count, offset),
                };
                return Ok(match fields.capacity {
                    Some(capacity) => limit.capacity(capacity),
                    None => limit,
                });
            }
            let period = period?;
            let mut limit = match window {
                AlgorithmName::FixedWindow => {
                    let limit = Limit::fixed_window(count, period);
                    match fields.capacity {
                        Some(capacity) => limit.capacity(capacity),
                        None => limit,
                    }
                }
                AlgorithmName::SlidingWindow => Limit::sliding_window(count, period),
                _ => {
                    unused("aligned", "a sliding_log has no windows to align")?;
                    unused("aligned_at", "a sliding_log has no windows to align")?;
                    Limit::sliding_log(count, period)
                }
            };
            match (fields.aligned, fields.aligned_at) {
                (Some(true), Some(_)) => {
                    return invalid(
                        here("aligned_at"),
                        "give `aligned = true` or `aligned_at`, not both",
                    )
                }
                (_, Some(offset)) => limit = limit.aligned_at(offset),
                (Some(true), None) => limit = limit.aligned(),
                _ => {}
            }
            limit
        }
    };
    Ok(limit)
}

/// `"+HH:MM"`, `"-HH:MM"` or `"Z"`: seconds east of UTC, within 18 hours.
fn utc_offset(text: &str) -> Option<i32> {
    if text == "Z" {
        return Some(0);
    }
    let (sign, rest) = match text.as_bytes().first()? {
        b'+' => (1, &text[1..]),
        b'-' => (-1, &text[1..]),
        _ => return None,
    };
    let (hours, minutes) = rest.split_once(':')?;
    let digits = |part: &str| part.len() == 2 && part.bytes().all(|b| b.is_ascii_digit());
    if !digits(hours) || !digits(minutes) {
        return None;
    }
    let (hours, minutes): (i32, i32) = (hours.parse().ok()?, minutes.parse().ok()?);
    let seconds = hours * 3600 + minutes * 60;
    (minutes < 60 && seconds <= 18 * 3600).then_some(sign * seconds)
}

/// A rule's own validation error, at the place of the field in the file.
fn from_rule_error(error: &ConfigError, place: &dyn Fn(&str) -> String) -> Invalid {
    let field = error.field();
    Invalid {
        path: format!("{}.{field}", place(field)),
        message: error.message().to_owned(),
    }
}

fn count_if(spec: &CountIfSpec, at: &str) -> Result<CountIf, Invalid> {
    Ok(match spec {
        CountIfSpec::Failures => CountIf::failures(),
        CountIfSpec::ServerErrors => CountIf::server_errors(),
        CountIfSpec::Successes => CountIf::successes(),
        CountIfSpec::Status(statuses) => {
            if statuses.is_empty() {
                return invalid(
                    format!("{at}.status"),
                    "lists no status: nothing would count",
                );
            }
            if let Some((i, bad)) = statuses
                .iter()
                .enumerate()
                .find(|(_, s)| StatusCode::from_u16(**s).is_err())
            {
                return invalid(
                    format!("{at}.status[{i}]"),
                    format!("{bad} is not an HTTP status"),
                );
            }
            CountIf::status(statuses.iter().copied())
        }
    })
}

/// A route's path parameter: read through axum's router, so only with the `axum` feature.
fn path_param(name: &str, at: &str) -> Result<Key, Invalid> {
    if name.is_empty() {
        return invalid(format!("{at}.path_param"), "names no path parameter");
    }
    #[cfg(feature = "axum")]
    return Ok(Key::path_param(name));
    #[cfg(not(feature = "axum"))]
    invalid(
        format!("{at}.path_param"),
        "path parameters are read from axum's router: build tollgate with its `axum` feature",
    )
}

fn key(spec: &KeySpec, at: &str) -> Result<Key, Invalid> {
    Ok(match spec {
        KeySpec::Global => Key::global(),
        KeySpec::PeerIp => Key::peer_ip(),
        KeySpec::Bearer => Key::bearer(),
        KeySpec::Header(name) => Key::header(name.clone()),
        KeySpec::Cookie(name) => {
            if name.is_empty() {
                return invalid(format!("{at}.cookie"), "names no cookie");
            }
            Key::cookie(name)
        }
        KeySpec::PathParam(name) => path_param(name, at)?,
        KeySpec::ClientIp(spec) => client_ip(spec, &format!("{at}.client_ip"))?,
        KeySpec::FirstOf(keys) => {
            if keys.is_empty() {
                return invalid(format!("{at}.first_of"), "lists no key");
            }
            let keys = keys
                .iter()
                .enumerate()
                .map(|(i, spec)| key(spec, &format!("{at}.first_of[{i}]")))
                .collect::<Result<Vec<_>, _>>()?;
            Key::first_of(keys)
        }
    })
}

fn client_ip(spec: &ClientIpSpec, at: &str) -> Result<Key, Invalid> {
    let mut client = Key::client_ip().trust(spec.trust.iter().map(|net| net.0));
    if spec.trust_loopback {
        client = client.trust_loopback();
    }
    if let Some(header) = spec.header {
        client = client.header(match header {
            ForwardedHeaderName::XForwardedFor => ForwardedHeader::XForwardedFor,
            ForwardedHeaderName::Forwarded => ForwardedHeader::Forwarded,
            ForwardedHeaderName::XRealIp => ForwardedHeader::XRealIp,
        });
    }
    for (i, cdn) in spec.cdn.iter().enumerate() {
        if cdn.trust.is_empty() {
            return invalid(
                format!("{at}.cdn[{i}].trust"),
                "is empty: a CDN header is honoured only from the networks trusted for it",
            );
        }
        let header = match cdn.header {
            CdnHeaderName::CfConnecting => CdnHeader::CfConnectingIp,
            CdnHeaderName::TrueClient => CdnHeader::TrueClientIp,
            CdnHeaderName::FastlyClient => CdnHeader::FastlyClientIp,
            CdnHeaderName::FlyClient => CdnHeader::FlyClientIp,
        };
        client = client.trust_cdn(header, cdn.trust.iter().map(|net| net.0));
    }
    if let Some(len) = spec.ipv6_prefix {
        if len == 0 || len > 128 {
            return invalid(format!("{at}.ipv6_prefix"), "must be from 1 to 128");
        }
        client = client.ipv6_prefix(len as u8);
    }
    if let Some(len) = spec.ipv4_prefix {
        if len == 0 || len > 32 {
            return invalid(format!("{at}.ipv4_prefix"), "must be from 1 to 32");
        }
        client = client.ipv4_prefix(len as u8);
    }
    Ok(client.into())
}

fn missing_key(spec: &MissingKeySpec, at: &str) -> Result<MissingKey, Invalid> {
    Ok(match spec {
        MissingKeySpec::Reject => MissingKey::Reject,
        MissingKeySpec::Skip => MissingKey::Skip,
        MissingKeySpec::RejectWith(status) => {
            MissingKey::RejectWith(error_status(*status, &format!("{at}.reject"))?)
        }
        MissingKeySpec::Fallback(spec) => {
            MissingKey::Fallback(key(spec, &format!("{at}.fallback"))?)
        }
    })
}

/// A 4xx or 5xx status.
fn error_status(status: u16, at: &str) -> Result<StatusCode, Invalid> {
    match StatusCode::from_u16(status) {
        Ok(code) if code.is_client_error() || code.is_server_error() => Ok(code),
        _ => invalid(at, format!("{status} is not a 4xx or 5xx status")),
    }
}

fn queue(spec: &QueueSpec, at: &str) -> Result<Queue, Invalid> {
    let max_delay = spec.max_delay.map(|d| d.0);
    let mut queue = match (spec.burst, max_delay) {
        (Some(burst), Some(max)) => Queue::burst(burst).within(max),
        (Some(burst), None) => Queue::burst(burst),
        (None, Some(max)) => Queue::max_delay(max),
        (None, None) => return invalid(at, "needs a bound: a burst, a max_delay, or both"),
    };
    if spec.nodelay {
        if spec.delay.is_some() {
            return invalid(
                format!("{at}.nodelay"),
                "give `delay` or `nodelay`, not both",
            );
        }
        if spec.burst.is_none() {
            return invalid(
                format!("{at}.nodelay"),
                "needs a burst: nodelay lets the whole burst pass at once",
            );
        }
        queue = queue.nodelay();
    }
    if let Some(delay) = spec.delay {
        queue = queue.delay(delay);
    }
    Ok(queue)
}

fn access_lists(specs: &[AccessSpec], section: &str) -> Result<Vec<AccessList>, Invalid> {
    let mut lists = Vec::new();
    for (index, spec) in specs.iter().enumerate() {
        let at = format!("{section}[{index}]");
        let key = key(&spec.key, &format!("{at}.key"))?;
        if spec.values.is_empty() && spec.networks.is_empty() {
            return invalid(at, "lists nothing: give `values`, `networks`, or both");
        }
        if !spec.values.is_empty() {
            if let Some(i) = spec.values.iter().position(String::is_empty) {
                return invalid(
                    format!("{at}.values[{i}]"),
                    "is empty (an empty key is a missing key)",
                );
            }
            lists.push(AccessList::keys(key.clone(), &spec.values));
        }
        if !spec.networks.is_empty() {
            if !is_ip_key(&spec.key) {
                return invalid(
                    format!("{at}.networks"),
                    "need an IP key (peer_ip or client_ip)",
                );
            }
            lists.push(AccessList::networks(key, spec.networks.iter().map(|n| n.0)));
        }
    }
    Ok(lists)
}

fn is_ip_key(key: &KeySpec) -> bool {
    match key {
        KeySpec::PeerIp | KeySpec::ClientIp(_) => true,
        KeySpec::FirstOf(keys) => keys.iter().all(is_ip_key),
        _ => false,
    }
}

fn store(
    builder: RateLimitLayerBuilder,
    spec: Option<&StoreSpec>,
) -> Result<RateLimitLayerBuilder, Invalid> {
    let Some(spec) = spec else {
        return Ok(builder);
    };
    check_store(spec)?;
    let builder = builder.on_store_failure(failure_policy(spec));
    Ok(match spec.kind {
        StoreKind::Memory => match spec.max_keys {
            Some(max_keys) => builder.store(MemoryStore::builder().max_keys(max_keys).build()),
            None => builder,
        },
        // Connected by `builder_connected`.
        StoreKind::Redis | StoreKind::Postgres => builder,
    })
}

/// What the `[store]` section's `on_failure` says.
fn failure_policy(spec: &StoreSpec) -> FailurePolicy {
    match spec.on_failure {
        Some(OnFailure::Closed) => FailurePolicy::Closed,
        Some(OnFailure::Open) | None => FailurePolicy::Open,
        Some(OnFailure::Local { share }) => FailurePolicy::Local { share },
    }
}

/// Checks the `[store]` section, whichever stores this build has.
pub(crate) fn check_store(spec: &StoreSpec) -> Result<(), Invalid> {
    let only = |field: &str, present: bool, kind: &str| -> Result<(), Invalid> {
        if present {
            invalid(
                format!("store.{field}"),
                format!("is only used by the {kind} store"),
            )
        } else {
            Ok(())
        }
    };
    if spec.kind != StoreKind::Postgres {
        only("table", spec.table.is_some(), "postgres")?;
        only("create_schema", spec.create_schema.is_some(), "postgres")?;
    }
    match spec.kind {
        StoreKind::Postgres => {
            only("max_keys", spec.max_keys.is_some(), "memory")?;
            only("lease", spec.lease.is_some(), "redis")?;
            only("prefix", spec.prefix.is_some(), "redis")?;
            only("ca_file", spec.ca_file.is_some(), "redis")?;
            only("client_cert_file", spec.client_cert_file.is_some(), "redis")?;
            only("client_key_file", spec.client_key_file.is_some(), "redis")?;
            let Some(url) = &spec.url else {
                return invalid("store.url", "is required by the postgres store");
            };
            if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                return invalid(
                    "store.url",
                    format!("{url:?} is not a Postgres URL (expected postgres://user@host[:port]/database)"),
                );
            }
            if spec.timeout.is_some_and(|t| t.0.is_zero()) {
                return invalid("store.timeout", "must be greater than 0");
            }
            check_share(spec)?;
        }
        StoreKind::Memory => {
            only("url", spec.url.is_some(), "redis")?;
            only("timeout", spec.timeout.is_some(), "redis")?;
            only("lease", spec.lease.is_some(), "redis")?;
            only("ca_file", spec.ca_file.is_some(), "redis")?;
            only("client_cert_file", spec.client_cert_file.is_some(), "redis")?;
            only("client_key_file", spec.client_key_file.is_some(), "redis")?;
            if spec.max_keys == Some(0) {
                return invalid("store.max_keys", "must be greater than 0");
            }
        }
        StoreKind::Redis => {
            only("max_keys", spec.max_keys.is_some(), "memory")?;
            let Some(url) = &spec.url else {
                return invalid("store.url", "is required by the redis store");
            };
            check_redis_url(url).or_else(|message| invalid("store.url", message))?;
            if spec.timeout.is_some_and(|t| t.0.is_zero()) {
                return invalid("store.timeout", "must be greater than 0");
            }
            if spec.lease.is_some_and(|l| l.0.is_zero()) {
                return invalid("store.lease", "must be greater than 0");
            }
            check_tls(spec, url)?;
            check_share(spec)?;
        }
    }
    Ok(())
}

/// The share of each limit a remote store's local fallback decides with.
fn check_share(spec: &StoreSpec) -> Result<(), Invalid> {
    if let Some(OnFailure::Local { share }) = spec.on_failure {
        if !(share > 0.0 && share <= 1.0) {
            return invalid(
                "store.on_failure.local.share",
                format!("must be greater than 0 and at most 1, not {share}"),
            );
        }
    }
    Ok(())
}

/// Connects the Postgres store a file names; a failure names the field it comes from.
#[cfg(feature = "postgres")]
async fn postgres_store(
    spec: &StoreSpec,
) -> Result<crate::store::postgres::PostgresStore, (&'static str, String)> {
    // As for Redis: failing open (or to local limits), an app starts while Postgres is down.
    let lazily = !matches!(spec.on_failure, Some(OnFailure::Closed));
    let mut builder = crate::store::postgres::PostgresStore::builder()
        .url(spec.url.clone().unwrap_or_default())
        .connect_lazily(lazily)
        .create_schema(spec.create_schema.unwrap_or(false));
    if let Some(timeout) = spec.timeout {
        builder = builder.timeout(timeout.0);
    }
    if let Some(table) = &spec.table {
        builder = builder.table(table.clone());
    }
    builder
        .build()
        .await
        .map_err(|error| ("url", error.to_string()))
}

/// Without the `postgres` feature, a file naming a Postgres store cannot be served.
#[cfg(not(feature = "postgres"))]
async fn postgres_store(spec: &StoreSpec) -> Result<MemoryStore, (&'static str, String)> {
    let _ = spec;
    Err((
        "kind",
        "tollgate was built without the `postgres` feature".to_owned(),
    ))
}

/// The TLS files of a Redis store: for a `rediss://` URL only, a certificate with its key, and a
/// build that has TLS.
fn check_tls(spec: &StoreSpec, url: &str) -> Result<(), Invalid> {
    let files = [
        ("ca_file", spec.ca_file.is_some()),
        ("client_cert_file", spec.client_cert_file.is_some()),
        ("client_key_file", spec.client_key_file.is_some()),
    ];
    let Some((field, _)) = files.iter().find(|(_, present)| *present) else {
        return Ok(());
    };
    if !url.starts_with("rediss://") {
        return invalid(
            format!("store.{field}"),
            "is only used with a rediss:// url (TLS)",
        );
    }
    match (&spec.client_cert_file, &spec.client_key_file) {
        (Some(_), None) => {
            return invalid("store.client_key_file", "is required with client_cert_file")
        }
        (None, Some(_)) => {
            return invalid("store.client_cert_file", "is required with client_key_file")
        }
        _ => {}
    }
    if !cfg!(feature = "redis-tls") {
        return invalid(
            format!("store.{field}"),
            "needs tollgate's `redis-tls` feature, which this build leaves out",
        );
    }
    Ok(())
}

/// `redis://[user[:password]@]host[:port][/db]`, `rediss://...`, `redis+unix:///path` or
/// `unix:///path`.
fn check_redis_url(url: &str) -> Result<(), String> {
    let expected = "(expected redis://host[:port][/db], rediss://..., \
                    redis+sentinel://host:port[,host:port...]/master, or unix:///path)";
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!("{url:?} is not a Redis URL {expected}"));
    };
    match scheme {
        "redis" | "rediss" => {
            let (authority, db) = rest.split_once('/').unwrap_or((rest, ""));
            let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            let (host, port) = match host_port.strip_prefix('[') {
                Some(v6) => match v6.split_once(']') {
                    Some((host, rest)) => (host, rest.strip_prefix(':')),
                    None => return Err(format!("{url:?} has an unclosed '[' {expected}")),
                },
                None => match host_port.split_once(':') {
                    Some((host, port)) => (host, Some(port)),
                    None => (host_port, None),
                },
            };
            if host.is_empty() {
                return Err(format!("{url:?} has no host {expected}"));
            }
            if port.is_some_and(|p| p.parse::<u16>().is_err()) {
                return Err(format!("{url:?} has an invalid port {expected}"));
            }
            if !db.is_empty() && db.parse::<u32>().is_err() {
                return Err(format!(
                    "{url:?}: the path must be a database number {expected}"
                ));
            }
            Ok(())
        }
        "redis+sentinel" => match rest.split_once('/') {
            Some((hosts, master)) if !hosts.is_empty() && !master.is_empty() => Ok(()),
            _ => Err(format!(
                "{url:?} names no sentinels or no master {expected}"
            )),
        },
        "redis+unix" | "unix" if rest.len() > 1 && rest.starts_with('/') => Ok(()),
        "redis+unix" | "unix" => Err(format!("{url:?} has no socket path {expected}")),
        other => Err(format!("unsupported scheme {other:?} {expected}")),
    }
}

/// Connects the Redis store a file names; a failure names the field it comes from.
#[cfg(feature = "redis")]
async fn redis_store(
    url: &str,
    spec: &StoreSpec,
) -> Result<crate::store::redis::RedisStore, (&'static str, String)> {
    // Failing open (or to local limits), an app starts while Redis is down and answers by its
    // policy until Redis does; failing closed, it does not start without Redis.
    let lazily = !matches!(spec.on_failure, Some(OnFailure::Closed));
    let mut builder = crate::store::redis::RedisStore::builder()
        .url(url)
        .connect_lazily(lazily);
    if let Some(timeout) = spec.timeout {
        builder = builder.timeout(timeout.0);
    }
    if let Some(lease) = spec.lease {
        builder = builder.lease(lease.0);
    }
    if let Some(prefix) = &spec.prefix {
        builder = builder.prefix(prefix.clone());
    }
    #[cfg(feature = "redis-tls")]
    {
        let read = |field: &'static str, path: &std::path::Path| {
            std::fs::read(path).map_err(|e| (field, format!("cannot read {}: {e}", path.display())))
        };
        if let Some(path) = &spec.ca_file {
            builder = builder.ca_certificate(read("ca_file", path)?);
        }
        if let (Some(cert), Some(key)) = (&spec.client_cert_file, &spec.client_key_file) {
            builder = builder.client_certificate(
                read("client_cert_file", cert)?,
                read("client_key_file", key)?,
            );
        }
    }
    builder
        .build()
        .await
        .map_err(|error| ("url", error.to_string()))
}

/// Without the `redis` feature, a file naming a Redis store cannot be served.
#[cfg(not(feature = "redis"))]
async fn redis_store(url: &str, spec: &StoreSpec) -> Result<MemoryStore, (&'static str, String)> {
    let _ = (url, spec);
    Err((
        "kind",
        "tollgate was built without the `redis` feature".to_owned(),
    ))
}

fn response_options(
    mut builder: RateLimitLayerBuilder,
    spec: &ResponseSpec,
) -> Result<RateLimitLayerBuilder, Invalid> {
    check_response(spec)?;
    if let Some(status) = spec.status {
        builder = builder.status(error_status(status, "response.status")?);
    }
    if let Some(on) = spec.headers_on_allowed {
        builder = builder.headers_on_allowed(on);
    }
    if let Some(on) = spec.legacy_headers {
        builder = builder.legacy_headers(on);
    }
    if let Some(jitter) = spec.jitter {
        builder = builder.jitter(jitter.0);
    }
    Ok(builder)
}

/// Checks `redact_keys`: a shared secret is long enough.
pub(crate) fn check_redact_keys(spec: &RedactKeysSpec) -> Result<(), Invalid> {
    let RedactKeysSpec::Shared(SharedSecretSpec { secret }) = spec else {
        return Ok(());
    };
    if secret.0.len() < MIN_SECRET {
        return invalid(
            "redact_keys.secret",
            format!(
                "is {} bytes; it must have at least {MIN_SECRET} (e.g. `openssl rand -hex 32`), \
                 or a short secret could be guessed",
                secret.0.len()
            ),
        );
    }
    Ok(())
}

/// Checks the `[response]` section.
pub(crate) fn check_response(spec: &ResponseSpec) -> Result<(), Invalid> {
    if let Some(status) = spec.status {
        error_status(status, "response.status")?;
    }
    Ok(())
}
