//! `Rule`: a named limit, the key it counts by, what a request costs, and which requests it
//! applies to.

use std::sync::Arc;

use http::{Method, StatusCode, Uri};

use crate::algorithm::error::ConfigError;
use crate::algorithm::Limit;
use crate::algorithm::{Algorithm, Lease, Mode, Penalty, ReserveBound};
use crate::key::{Key, RequestHead};
use crate::rules::cost::Cost;
use crate::rules::path;
use crate::rules::per_request::{LimitResolver, LimitSource};
use crate::rules::queue::Queue;
use crate::rules::settle::{CountIf, Settle};

/// A named limit applied per key to the requests in its scope.
///
/// ```
/// use std::time::Duration;
/// use http::Method;
/// use tollgate::{Key, Limit, Rule};
///
/// let login = Rule::new("login", Limit::per_minute(5))
///     .key(Key::client_ip())
///     .methods([Method::POST])
///     .path("/login");
/// ```
#[derive(Clone, Debug)]
pub struct Rule {
    name: Option<String>,
    limit: Limit,
    key: Key,
    cost: Cost,
    scope: Scope,
    missing_key: MissingKey,
    queue: Option<Queue>,
    shadow: bool,
    source: Option<LimitSource>,
    penalty: Option<Penalty>,
    count_if: Option<CountIf>,
    settle: Option<Settle>,
    lease: Option<Lease>,
    overridable: bool,
}

/// What a rule does with a request whose key is missing (no API key header, no user id, no peer
/// address).
#[derive(Clone, Debug, Default)]
pub enum MissingKey {
    /// Answer `400 Bad Request` with a problem+json body naming the rule and the key (default).
    #[default]
    Reject,
    /// Answer with this status (e.g. `401 Unauthorized` for a missing API key).
    RejectWith(StatusCode),
    /// Let the request through without this rule.
    Skip,
    /// Use this key instead (e.g. the client IP when there is no API key).
    Fallback(Key),
}

/// The shortcuts from a limit to a rule (`Limit::per_minute(60).key(Key::peer_ip())`), kept with
/// the rule: the algorithm stage knows nothing of rules.
impl Limit {
    /// A rule with this limit, keyed by `key`.
    pub fn key(self, key: impl Into<Key>) -> Rule {
        Rule::from(self).key(key)
    }

    /// A rule with this limit and `cost` per request.
    pub fn cost(self, cost: impl Into<Cost>) -> Rule {
        Rule::from(self).cost(cost)
    }

    /// A rule with this limit, named `name` (the name appears in headers and logs).
    pub fn named(self, name: impl Into<String>) -> Rule {
        Rule::new(name, self)
    }
}

impl Rule {
    /// A rule named `name` (used in the `RateLimit` headers, in logs and as the store namespace)
    /// with `limit`, one global key and a cost of 1.
    pub fn new(name: impl Into<String>, limit: Limit) -> Rule {
        Rule {
            name: Some(name.into()),
            ..Rule::from(limit)
        }
    }

    /// Counts per `key` (default: one global key).
    pub fn key(mut self, key: impl Into<Key>) -> Rule {
        self.key = key.into();
        self
    }

    /// Charges `cost` per request (default 1).
    pub fn cost(mut self, cost: impl Into<Cost>) -> Rule {
        self.cost = cost.into();
        self
    }

    /// Names the rule (default: derived from the key, e.g. `client-ip`).
    pub fn named(mut self, name: impl Into<String>) -> Rule {
        self.name = Some(name.into());
        self
    }

    /// Applies only to these methods (default: all).
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Rule {
        self.scope.methods.extend(methods);
        self
    }

    /// Applies only to paths matching `pattern` (may be called several times; default: all paths).
    ///
    /// A pattern is matched segment by segment: `*` matches one segment, and a final `*` matches
    /// one or more remaining segments. `/login` matches only `/login`; `/users/*/avatar` matches
    /// `/users/7/avatar`; `/api/*` matches `/api/v1/chat` but not `/api` itself.
    ///
    /// The path is the one the layer sees (under axum's `Router::nest`, the nested part), read
    /// as routers and proxies read it, so that no spelling they take for a path in scope steps
    /// around the rule: a percent-encoded segment matches what it decodes to (`/%6Cogin` is in
    /// `/login`'s scope), repeated slashes count as one (`//login`, as nginx's `merge_slashes`),
    /// and dot segments are removed as RFC 3986 §5.2.4 says (`/./login`, `/login/.`,
    /// `/x/../login`, and with encoded dots `/%2e/login`, are in `/login`'s scope; `..` at the
    /// root stays there). The pattern is read the same way.
    pub fn path(mut self, pattern: impl Into<String>) -> Rule {
        self.scope.paths.push(pattern.into());
        self
    }

    /// Applies only to calls of a gRPC method, `/package.Service/Method`, or of every method of a
    /// service, `/package.Service/*` (may be called several times, and mixed with
    /// [`path`](Self::path): a request in any of them is in scope).
    ///
    /// A gRPC call's path is its method's name, so this matches the path like `path` does; a
    /// pattern of another form (no service, a `*` anywhere but as the whole method, a query) is an
    /// error when the layer is built, naming the rule and the field `grpc`.
    ///
    /// ```
    /// use tollgate::{Key, Limit, Rule};
    ///
    /// let greet = Rule::new("greet", Limit::per_minute(5))
    ///     .key(Key::peer_ip())
    ///     .grpc("/helloworld.Greeter/SayHello");
    /// let admin = Rule::new("admin", Limit::per_second(1)).grpc("/acme.Admin/*");
    /// ```
    pub fn grpc(mut self, pattern: impl Into<String>) -> Rule {
        self.scope.grpc.push(pattern.into());
        self
    }

    /// Applies only to requests for which `predicate` holds, on top of methods and paths (e.g. the
    /// requests of one plan: `.when(|head| head.headers.get("x-plan").is_some_and(|v| v == "pro"))`).
    /// [`when_described`](Self::when_described) also says in words which requests they are.
    pub fn when<F>(mut self, predicate: F) -> Rule
    where
        F: Fn(&RequestHead<'_>) -> bool + Send + Sync + 'static,
    {
        self.scope.when = Some(Predicate {
            test: Arc::new(predicate),
            description: None,
        });
        self
    }

    /// Like [`when`](Self::when), with the condition in words for people reading the rules
    /// ([`RuleSummary::condition`], which `tollgate check` prints after "only for"): a phrase such
    /// as `requests whose x-plan header is "pro"`.
    ///
    /// ```
    /// use tollgate::{Limit, Rule};
    ///
    /// let pro = Rule::new("api:pro", Limit::per_minute(1_000)).when_described(
    ///     "requests whose x-plan header is \"pro\"",
    ///     |head| head.headers.get("x-plan").is_some_and(|v| v == "pro"),
    /// );
    /// ```
    pub fn when_described<F>(mut self, description: impl Into<String>, predicate: F) -> Rule
    where
        F: Fn(&RequestHead<'_>) -> bool + Send + Sync + 'static,
    {
        self.scope.when = Some(Predicate {
            test: Arc::new(predicate),
            description: Some(description.into().into()),
        });
        self
    }

    /// Shadow mode: the rule is decided and counted (metrics, logs) but never blocks a request, and
    /// its fields are not sent — for rolling out a new limit safely, like nginx's
    /// `limit_req_dry_run` or Envoy's `shadow_mode`.
    pub fn shadow(mut self, shadow: bool) -> Rule {
        self.shadow = shadow;
        self
    }

    /// Queues requests that would be denied until their slot, within the queue's bound, instead of
    /// rejecting them (token buckets and fixed windows; see [`Queue`]).
    pub fn queue(mut self, queue: Queue) -> Rule {
        self.queue = Some(queue);
        self
    }

    /// Takes the limit from the request's extensions, where an auth layer put what it knows of
    /// the caller: `read` turns the value of type `T` there into this rule's limit (e.g. a
    /// customer's plan into `Limit::per_minute(plan.rpm)`). A request without a `T`, or for which
    /// `read` gives `None`, is charged under the rule's own limit.
    ///
    /// A key keeps its state when its limit changes, and is never locked out by the change: a
    /// token bucket keeps what it has, at most the new capacity (with 40 of 100 left, a capacity of
    /// 20 leaves 20 at once; a larger capacity keeps the 40; an idle key is full under the smaller
    /// limit), and the time accrued since it was empty is read at the new rate (40 of 100 a
    /// minute, then 20 a minute, leaves 8). A change refills nothing.
    /// `RateLimit-Policy` reports the limit that applied. The rule's own limit is
    /// also the fallback for a limit that cannot work (zero rate or period, numbers the store
    /// cannot count, a capacity below the request's cost, a limit of the other kind than the
    /// rule's — slots for a rate rule, a rate for a [`Limit::concurrent`] rule; logged at most
    /// once per 10 seconds), and a request's cost must fit it. On a concurrency rule this gives
    /// each key its own number of slots. [`queue`](Self::queue), [`count_if`](Self::count_if) and
    /// [`settle`](Self::settle) are not available with per-request limits (an error from `build()`).
    ///
    /// ```
    /// use tollgate::{Key, Limit, Rule};
    ///
    /// #[derive(Clone)]
    /// struct Plan { requests_per_minute: u64 }
    ///
    /// let rule = Rule::new("per-customer", Limit::per_minute(60))
    ///     .key(Key::header(http::HeaderName::from_static("x-api-key")))
    ///     .limit_from_extension(|plan: &Plan| Some(Limit::per_minute(plan.requests_per_minute)));
    /// ```
    pub fn limit_from_extension<T, F>(mut self, read: F) -> Rule
    where
        T: Send + Sync + 'static,
        F: Fn(&T) -> Option<Limit> + Send + Sync + 'static,
    {
        self.source = Some(LimitSource::Extension(Arc::new(move |extensions| {
            extensions.get::<T>().and_then(&read)
        })));
        self
    }

    /// Looks the limit up by the rule's key with `resolver` (cached; see [`LimitResolver`] for
    /// what happens when it fails or is slow). The rule's own limit is the fallback, as for
    /// [`limit_from_extension`](Self::limit_from_extension).
    pub fn limit_from(mut self, resolver: LimitResolver) -> Rule {
        self.source = Some(LimitSource::Resolver(resolver));
        self
    }

    /// Blocks keys this rule denies as `penalty` says: for a fixed time each denial
    /// ([`Penalty::fixed`]), or escalating: 1 minute, then 10, then an hour, forgiven a day after
    /// the last block ([`Penalty::escalating`]). While blocked, every request of the key under
    /// this rule is denied with `Retry-After` = what is left of the block, its counters
    /// untouched; denials during a block do not extend it. Blocks live in the store, so every
    /// instance sees them. Also lets [`Limiter::block`](crate::Limiter::block) block keys of this
    /// rule by hand.
    ///
    /// A zero duration is an error when the layer is built.
    pub fn block(mut self, penalty: Penalty) -> Rule {
        self.penalty = Some(penalty);
        self
    }

    /// Lets [`Limiter::set_override`](crate::Limiter::set_override) give one key of this rule
    /// a limit of its own for a while (a customer raised tenfold for a day), kept in the store
    /// so that every instance sees it on its next decision for the key. An override takes
    /// precedence over the rule's own limit and over one the request brings, and the key's
    /// state carries over as for any limit change.
    ///
    /// Off by default: every decision of an overridable rule reads the key's override in the
    /// same step as its charge, which costs a lookup in memory and a little Redis work per call
    /// (the charge takes the general script). Rules that are not overridable pay nothing.
    /// In files: `overrides = true`.
    pub fn overridable(mut self) -> Rule {
        self.overridable = true;
        self
    }

    /// Counts only the requests whose response matches, e.g. failed logins:
    /// `.count_if(CountIf::status([401, 403]))`. Every request is charged when it arrives — so
    /// concurrent attempts can never get past the limit — and given its charge back when its
    /// response does not match. A request whose response never comes (the client went away
    /// first) keeps its charge. For gRPC the predicate sees `grpc-status`, from the response
    /// head or, when the body ends, its trailers.
    pub fn count_if(mut self, count_if: CountIf) -> Rule {
        self.count_if = Some(count_if);
        self
    }

    /// Charges the rule's [`cost`](Self::cost) as an estimate when the request arrives and
    /// settles it to the real cost read from the response, e.g. the tokens an LLM
    /// call used: `.settle(Settle::header(HeaderName::from_static("x-tokens-used")))`. The
    /// difference is charged — possibly into debt, which later requests of the key wait for or
    /// are denied until it is repaid, `Retry-After` counting it — or given back, after the
    /// response has left: settling never delays it. See [`Settle`] for missing or bad values; a
    /// request whose response never comes keeps its estimate.
    ///
    /// Token buckets and fixed windows only (debt is a negative balance, which only they can
    /// hold): any other algorithm is an error when the layer is built.
    pub fn settle(mut self, settle: Settle) -> Rule {
        self.settle = Some(settle);
        self
    }

    /// Lets each instance lease a slice of a key's quota from a shared store (the Redis store)
    /// and decide locally until it is spent or expires: one round trip per `units` charges on a
    /// hot key instead of one per charge, for the bounded error [`Lease`] states. The memory
    /// store is exact and ignores it. A token bucket, fixed window or sliding window only.
    pub fn lease(mut self, lease: Lease) -> Rule {
        self.lease = Some(lease);
        self
    }

    /// What to do when the request has no key (default: [`MissingKey::Reject`]).
    pub fn on_missing_key(mut self, missing: MissingKey) -> Rule {
        self.missing_key = missing;
        self
    }

    /// The rule's name (derived from the key when not set).
    pub fn name(&self) -> String {
        self.name.clone().unwrap_or_else(|| self.key.describe())
    }

    /// The limit.
    pub fn limit(&self) -> &Limit {
        &self.limit
    }

    /// Checks that the rule can work; the error names the rule and the field.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let name = self.name();
        let err =
            |field: &'static str, message: String| Err(ConfigError::new(&name, field, message));
        if name.is_empty() || !name.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return err(
                "name",
                "must be non-empty printable ASCII (it is sent in headers)".into(),
            );
        }
        let capacity = match &self.queue {
            Some(queue) => self
                .limit
                .algorithm()
                .capacity()
                .saturating_add(queue.immediate())
                .saturating_add(queue.bound().max_units.unwrap_or(u64::MAX)),
            None => self.limit.algorithm().capacity(),
        };
        self.limit.check(&name)?;
        if self.limit.algorithm().is_concurrency() {
            self.check_concurrency(&name)?;
        }
        if self.source.is_some() || self.overridable {
            // Each of these charges again later, by rule and key, under the rule's own limit.
            let later = [
                ("queue", self.queue.is_some()),
                ("count_if", self.count_if.is_some()),
                ("settle", self.settle.is_some()),
            ];
            if let Some((field, _)) = later.into_iter().find(|(_, set)| *set) {
                let whose = if self.source.is_some() {
                    "not available on a rule whose limit comes from the request"
                } else {
                    "not available on a rule with overrides"
                };
                return err(field, whose.into());
            }
        }
        if let Some(cost) = self.cost.as_fixed() {
            if cost > capacity {
                return err(
                    "cost",
                    format!("{cost} exceeds the capacity ({capacity}): no request could ever pass"),
                );
            }
        }
        for pattern in &self.scope.grpc {
            if let Err(message) = check_grpc_pattern(pattern) {
                return err("grpc", message);
            }
        }
        if let Some(queue) = &self.queue {
            queue
                .validate(self.limit.algorithm(), self.cost.as_fixed())
                .or_else(|(field, message)| err(field, message))?;
        }
        if let Some((field, message)) = self.penalty.as_ref().and_then(Penalty::problem) {
            return err(field, message);
        }
        if let Some(lease) = &self.lease {
            if let Some((field, message)) = lease.problem(self.limit.algorithm()) {
                return err(field, message);
            }
            // A queued charge reserves (waits are always exact); a limit chosen per request may
            // change between two charges of a lease; and under a penalty, a lease's larger
            // charge that Redis cannot grant whole would count as an offence and block the key.
            let exact = [
                ("queue", self.queue.is_some()),
                ("limit_from", self.source.is_some()),
                ("block", self.penalty.is_some()),
                ("overrides", self.overridable),
            ];
            if let Some((field, _)) = exact.into_iter().find(|(_, set)| *set) {
                return err(
                    field,
                    "not available on a rule with a lease: its charges are decided exactly".into(),
                );
            }
        }
        if self.settle.is_some() && !self.limit.algorithm().reserves() {
            return err(
                "settle",
                "needs a token bucket or a fixed window: a settlement may leave a debt, which \
                 only they can hold"
                    .into(),
            );
        }
        if let MissingKey::RejectWith(status) = self.missing_key {
            if !status.is_client_error() && !status.is_server_error() {
                return err(
                    "on_missing_key",
                    format!("status {status} is not an error status"),
                );
            }
        }
        Ok(())
    }

    /// What a concurrency rule cannot have: each request takes one slot, held until its
    /// response ends, so nothing may charge or give back slots on other terms.
    fn check_concurrency(&self, name: &str) -> Result<(), ConfigError> {
        let err = |field: &'static str, message: &str| Err(ConfigError::new(name, field, message));
        if self.cost.as_fixed() != Some(1) {
            return err(
                "cost",
                "a concurrency rule takes one slot per request: it has no cost",
            );
        }
        let others = [
            ("count_if", self.count_if.is_some()),
            ("block", self.penalty.is_some()),
            // A shadow rule is decided apart, after the fact: nothing would give its slots back.
            ("shadow", self.shadow),
        ];
        match others.into_iter().find(|(_, set)| *set) {
            Some((field, _)) => err(field, "not available on a concurrency rule"),
            None => Ok(()),
        }
    }

    pub(crate) fn compile(self) -> Result<CompiledRule, ConfigError> {
        self.validate()?;
        let name: std::sync::Arc<str> = self.name().into();
        let (limit, mode) = match &self.queue {
            Some(queue) => {
                let (algorithm, mode) = queue.apply(self.limit.algorithm());
                (Limit::from(algorithm), mode)
            }
            None => (self.limit, Mode::Charge),
        };
        let cost_bound = match (self.cost.as_fixed(), limit.algorithm().max_cost(mode)) {
            (Some(cost), max) if cost <= max => u64::MAX,
            (_, max) => max,
        };
        Ok(CompiledRule {
            digest: crate::key::namespace(&name),
            name,
            limit,
            key: self.key,
            cost: self.cost,
            cost_bound,
            scope: self.scope.compile(),
            missing_key: self.missing_key,
            mode,
            shadow: self.shadow,
            source: self.source,
            penalty: self.penalty,
            count_if: self.count_if,
            settle: self.settle,
            lease: self.lease,
            overridable: self.overridable,
        })
    }
}

impl From<Limit> for Rule {
    fn from(limit: Limit) -> Self {
        Rule {
            name: None,
            limit,
            key: Key::global(),
            cost: Cost::default(),
            scope: Scope::default(),
            missing_key: MissingKey::default(),
            queue: None,
            shadow: false,
            source: None,
            penalty: None,
            count_if: None,
            settle: None,
            lease: None,
            overridable: false,
        }
    }
}

/// Which requests a rule applies to.
#[derive(Clone, Debug, Default)]
struct Scope {
    methods: Vec<Method>,
    paths: Vec<String>,
    /// gRPC methods; matched as paths once checked.
    grpc: Vec<String>,
    when: Option<Predicate>,
}

/// A caller's condition on the request head, and its words when given.
#[derive(Clone)]
struct Predicate {
    test: Arc<dyn Fn(&RequestHead<'_>) -> bool + Send + Sync>,
    description: Option<Arc<str>>,
}

impl std::fmt::Debug for Predicate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.description {
            Some(description) => write!(f, "when({description:?})"),
            None => f.write_str("when(..)"),
        }
    }
}

impl Scope {
    fn compile(self) -> CompiledScope {
        CompiledScope {
            when: self.when,
            methods: self.methods,
            paths: self
                .paths
                .iter()
                .chain(&self.grpc)
                .map(|p| path::pattern(p))
                .collect(),
        }
    }
}

/// A rule in force, as the limiter holds it after validation: for tools that describe a
/// configuration (the `tollgate check` command prints these in plain words). See
/// [`Limiter::rules_in_force`](crate::Limiter::rules_in_force).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RuleSummary {
    /// The rule's name.
    pub name: String,
    /// The algorithm and its numbers (in queue mode, with the queue's allowance folded in).
    pub algorithm: Algorithm,
    /// What the rule counts by.
    pub key: Key,
    /// What one request costs.
    pub cost: Cost,
    /// The methods the rule applies to; empty for every method.
    pub methods: Vec<Method>,
    /// The path patterns the rule applies to; empty for every path.
    pub paths: Vec<String>,
    /// Whether a predicate of the caller's (`Rule::when`) narrows the scope further.
    pub conditional: bool,
    /// That predicate in words, when it was given with them
    /// ([`Rule::when_described`]; a configuration file's tiers say which plan and how it is
    /// chosen): a phrase that follows "only for", such as `requests whose x-plan header is "pro"`.
    pub condition: Option<String>,
    /// What happens to a request without the key.
    pub missing_key: MissingKey,
    /// For a rule that queues (delays) requests instead of denying them at once: how far the
    /// queue reaches (units waiting, longest wait); `None` for a rule that denies at once.
    pub queue: Option<ReserveBound>,
    /// Whether the rule is in shadow mode (recorded, never blocking).
    pub shadow: bool,
    /// How a key that is denied is blocked ([`Rule::block`]).
    pub penalty: Option<Penalty>,
    /// Which responses keep their charge ([`Rule::count_if`]); the others get it back.
    pub count_if: Option<CountIf>,
    /// Where the real cost is read from the response ([`Rule::settle`]).
    pub settle: Option<Settle>,
}

/// A validated rule, ready to serve requests.
#[derive(Debug)]
pub(crate) struct CompiledRule {
    pub(crate) name: std::sync::Arc<str>,
    /// The name's digest, for the stores that hash it with each key (`store::RuleName`).
    pub(crate) digest: u64,
    pub(crate) limit: Limit,
    pub(crate) key: Key,
    pub(crate) cost: Cost,
    /// The most a request's cost may be: the algorithm's bound, or no bound for a fixed cost
    /// (checked when the rule was built, so requests are not checked again).
    pub(crate) cost_bound: u64,
    scope: CompiledScope,
    pub(crate) missing_key: MissingKey,
    pub(crate) mode: Mode,
    pub(crate) shadow: bool,
    pub(crate) source: Option<LimitSource>,
    pub(crate) penalty: Option<Penalty>,
    pub(crate) count_if: Option<CountIf>,
    pub(crate) settle: Option<Settle>,
    pub(crate) lease: Option<Lease>,
    /// Whether the store reads the key's override with each charge.
    pub(crate) overridable: bool,
}

impl CompiledRule {
    #[inline]
    pub(crate) fn applies_to(&self, head: &RequestHead<'_>) -> bool {
        self.scope.matches(head.method, head.uri)
            && self
                .scope
                .when
                .as_ref()
                .is_none_or(|when| (when.test)(head))
    }

    /// Whether the rule's charge is corrected once the response is known.
    pub(crate) fn settles(&self) -> bool {
        self.count_if.is_some() || self.settle.is_some()
    }

    #[inline]
    pub(crate) fn algorithm(&self) -> &Algorithm {
        self.limit.algorithm()
    }

    pub(crate) fn summary(&self) -> RuleSummary {
        RuleSummary {
            name: self.name.to_string(),
            algorithm: self.algorithm().clone(),
            key: self.key.clone(),
            cost: self.cost.clone(),
            methods: self.scope.methods.clone(),
            paths: self
                .scope
                .paths
                .iter()
                .map(|segments| format!("/{}", segments.join("/")))
                .collect(),
            conditional: self.scope.when.is_some(),
            condition: self
                .scope
                .when
                .as_ref()
                .and_then(|when| when.description.as_deref().map(str::to_owned)),
            missing_key: self.missing_key.clone(),
            queue: match self.mode {
                Mode::Reserve(bound) => Some(bound),
                Mode::Charge | Mode::Check => None,
            },
            shadow: self.shadow,
            penalty: self.penalty.clone(),
            count_if: self.count_if.clone(),
            settle: self.settle.clone(),
        }
    }
}

#[derive(Debug)]
struct CompiledScope {
    when: Option<Predicate>,
    methods: Vec<Method>,
    paths: Vec<Vec<String>>,
}

impl CompiledScope {
    /// (The path is read only when the scope names paths: most rules name none.)
    fn matches(&self, method: &Method, uri: &Uri) -> bool {
        (self.methods.is_empty() || self.methods.contains(method))
            && (self.paths.is_empty() || self.paths.iter().any(|p| path::matches(p, uri.path())))
    }
}

/// Why `pattern` is not a gRPC method (`/package.Service/Method`) or service
/// (`/package.Service/*`) pattern, if it is not.
pub(crate) fn check_grpc_pattern(pattern: &str) -> Result<(), String> {
    let fail = |why: &str| {
        Err(format!(
            "{pattern:?} {why}: write \"/package.Service/Method\" or \"/package.Service/*\""
        ))
    };
    let Some(rest) = pattern.strip_prefix('/') else {
        return fail("does not start with '/'");
    };
    let Some((service, method)) = rest.split_once('/') else {
        return fail("names no method");
    };
    let name = |part: &str| {
        !part.is_empty()
            && part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
    };
    if !name(service) {
        return fail("has no valid service name (letters, digits, '_' and '.')");
    }
    if method != "*" && !name(method) {
        return fail("has no valid method name (letters, digits and '_', or '*' for all)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn matches(pattern: &str, path: &str) -> bool {
        let scope = Scope {
            paths: vec![pattern.into()],
            ..Scope::default()
        }
        .compile();
        scope.matches(&Method::GET, &Uri::try_from(path).expect("a path"))
    }

    #[test]
    fn scopes_match_the_path_once_normalized() {
        assert!(matches("/login", "/login?next=/x/.."));
        assert!(matches("/login", "/./login"));
        assert!(matches("/login", "/login/."));
        assert!(matches("/login", "/x/../login?next=/"));
        assert!(matches("/login", "/%2E/%6Cogin"));
        assert!(matches("/login", "//login"));
        assert!(!matches("/login", "/login/../x"));
        assert!(matches("/v1/exports", "/v1/./exports"));
    }

    #[test]
    fn grpc_patterns_match_methods_and_services() {
        let scope = |pattern: &str| {
            Scope {
                grpc: vec![pattern.into()],
                ..Scope::default()
            }
            .compile()
        };
        let method = scope("/helloworld.Greeter/SayHello");
        let service = scope("/helloworld.Greeter/*");
        let call = |path: &'static str| Uri::from_static(path);
        assert!(method.matches(&Method::POST, &call("/helloworld.Greeter/SayHello")));
        assert!(!method.matches(&Method::POST, &call("/helloworld.Greeter/SayBye")));
        assert!(service.matches(&Method::POST, &call("/helloworld.Greeter/SayBye")));
        assert!(!service.matches(&Method::POST, &call("/helloworld.Other/SayHello")));
        assert!(!service.matches(&Method::POST, &call("/helloworld.Greeter")));
    }

    #[test]
    fn bad_grpc_patterns_are_errors_naming_the_field() {
        for pattern in [
            "helloworld.Greeter/SayHello",
            "/helloworld.Greeter",
            "/helloworld.Greeter/",
            "//SayHello",
            "/*/SayHello",
            "/helloworld.Greeter/Say*",
            "/helloworld.Greeter/SayHello/x",
            "/helloworld.Greeter/SayHello?x=1",
        ] {
            let error = Rule::new("g", Limit::per_second(1))
                .grpc(pattern)
                .validate()
                .unwrap_err();
            assert_eq!(error.field(), "grpc", "{pattern}");
            assert!(error.to_string().contains(pattern), "{error}");
        }
        assert!(Rule::new("g", Limit::per_second(1))
            .grpc("/Greeter/SayHello")
            .grpc("/a.b.C/*")
            .validate()
            .is_ok());
    }

    #[test]
    fn methods_narrow_the_scope() {
        let scope = Scope {
            methods: vec![Method::POST],
            ..Scope::default()
        }
        .compile();
        let uri = Uri::from_static("/anything");
        assert!(scope.matches(&Method::POST, &uri));
        assert!(!scope.matches(&Method::GET, &uri));
    }

    fn error_of(rule: Rule) -> String {
        rule.validate().unwrap_err().to_string()
    }

    /// A setting that does not apply to the algorithm would change nothing: an error naming it,
    /// not a setting silently dropped.
    #[test]
    fn settings_that_do_not_apply_to_the_algorithm_are_errors() {
        let minute = Duration::from_secs(60);
        let cases = [
            (
                Limit::sliding_window(10, minute).capacity(20),
                "capacity",
                "a sliding window",
            ),
            (
                Limit::sliding_log(10, minute).capacity(20),
                "capacity",
                "a sliding log",
            ),
            (
                Limit::concurrent(4).capacity(8),
                "capacity",
                "a concurrency limit",
            ),
            (
                Limit::fixed_window(10, minute).initial(5),
                "initial",
                "a fixed window",
            ),
            (
                Limit::per_second(5).pool(10, 1, minute).initial(5),
                "initial",
                "a burst pool",
            ),
            (
                Limit::sliding_window(10, minute).pool(10, 1, minute),
                "pool",
                "a sliding window",
            ),
            (Limit::per_second(5).aligned(), "aligned", "a token bucket"),
            // The first one given is named.
            (
                Limit::sliding_log(10, minute).initial(1).capacity(20),
                "initial",
                "a sliding log",
            ),
        ];
        for (limit, field, algorithm) in cases {
            assert_eq!(
                error_of(Rule::new("r", limit)),
                format!(
                    "rule \"r\": {field}: does not apply to {algorithm}: it would change nothing"
                )
            );
        }
        // Where they apply, they apply.
        assert!(
            Rule::new("r", Limit::fixed_window(10, minute).capacity(20).aligned())
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn invalid_rules_name_the_rule_and_field() {
        assert_eq!(
            error_of(Rule::new("api", Limit::per_second(0))),
            "rule \"api\": rate: must be greater than 0"
        );
        assert_eq!(
            error_of(Rule::new("api", Limit::token_bucket(5, Duration::ZERO))),
            "rule \"api\": period: must be at least 1 µs"
        );
        assert_eq!(
            error_of(Rule::new(
                "w",
                Limit::fixed_window(0, Duration::from_secs(1))
            )),
            "rule \"w\": limit: must be greater than 0"
        );
        assert_eq!(
            error_of(Rule::new("llm", Limit::per_minute(100)).cost(101)),
            "rule \"llm\": cost: 101 exceeds the capacity (100): no request could ever pass"
        );
        assert_eq!(
            error_of(Rule::new(
                "b",
                Limit::per_second(5).capacity(10).initial(11)
            )),
            "rule \"b\": initial: must be at most the capacity (10)"
        );
        assert_eq!(
            error_of(Rule::new(
                "p",
                Limit::per_second(5).pool(0, 1, Duration::from_secs(1))
            )),
            "rule \"p\": pool.capacity: must be greater than 0"
        );
        assert_eq!(
            error_of(Rule::new("bad\nname", Limit::per_second(1))),
            "rule \"bad\\nname\": name: must be non-empty printable ASCII (it is sent in headers)"
        );
        // A tab is no Structured Field string character either.
        assert!(error_of(Rule::new("tab\there", Limit::per_second(1))).contains(": name: "));
        assert!(Rule::new("ok", Limit::per_second(1)).validate().is_ok());
    }

    #[test]
    fn default_name_comes_from_the_key() {
        assert_eq!(Rule::from(Limit::per_second(1)).name(), "global");
        assert_eq!(Limit::per_second(1).key(Key::peer_ip()).name(), "peer-ip");
    }
}
