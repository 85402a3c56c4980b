//! `RateLimitLayer` and its builder.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use tower_layer::Layer;

use super::service::RateLimit;
use super::shared::{InForce, Shared};
use crate::algorithm::error::ConfigError;
use crate::algorithm::Mode;
use crate::engine::limiter::{LimitError, Limiter, LimiterBuilder};
use crate::observe::offenders::{self, TopOffenders};
use crate::observe::redact::Redactor;
use crate::response::{Rejection, Responder};
use crate::rules::rule::Rule;
use crate::rules::set::AccessList;
use crate::store::{CircuitBreaker, FailurePolicy, Store};
use arc_swap::ArcSwap;

/// Rate-limits the services it wraps.
///
/// Every clone of the layer, and every service it builds, shares the same limits (they live
/// behind an `Arc`), so axum's per-connection clones all count against one budget.
///
/// ```
/// use axum::{routing::get, Router};
/// use tollgate::{Key, Limit, RateLimitLayer};
///
/// let app: Router = Router::new()
///     .route("/", get(|| async { "hello" }))
///     .layer(RateLimitLayer::new(Limit::per_minute(60).key(Key::peer_ip())));
/// ```
#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    pub(crate) shared: Arc<Shared>,
}

impl RateLimitLayer {
    /// A layer with one rule and a new in-memory store: the common case.
    ///
    /// # Panics
    /// If the rule cannot work (a zero rate or period, a cost above the capacity…), with a message
    /// naming the rule and the field. Use [`builder`](Self::builder) to get the error instead.
    pub fn new(rule: impl Into<Rule>) -> Self {
        match Self::builder().rule(rule).build() {
            Ok(layer) => layer,
            Err(error) => panic!("invalid rate-limit rule: {error}"),
        }
    }

    /// Configures a layer: several rules, a store, response options.
    pub fn builder() -> RateLimitLayerBuilder {
        RateLimitLayerBuilder::on(Limiter::builder())
    }

    /// Configures a layer on an existing limiter, its rules, lists and store: several layers can
    /// then share one limiter (one budget), or a handler can hold the same limiter as the layer.
    /// The builder takes the layer's own settings (responses, shadow mode, redaction, top
    /// offenders, the failure policy) and none of the limiter's: those are the limiter's, set on
    /// its builder.
    ///
    /// ```
    /// use tollgate::{Limit, Limiter, RateLimitLayer, Rule};
    ///
    /// let limiter = Limiter::builder()
    ///     .rule(Rule::new("per-ip", Limit::per_minute(60)))
    ///     .build()?;
    /// let public = RateLimitLayer::from_limiter(limiter.clone()).build()?;
    /// let admin = RateLimitLayer::from_limiter(limiter).shadow(true).build()?;
    /// # let _ = (public, admin);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    ///
    /// A rule (or a store, a list, a circuit breaker) given to this builder does not compile:
    ///
    /// ```compile_fail
    /// use tollgate::{Limit, Limiter, RateLimitLayer, Rule};
    ///
    /// let limiter = Limiter::builder().rule(Limit::per_minute(60)).build().unwrap();
    /// let layer = RateLimitLayer::from_limiter(limiter).rule(Limit::per_second(1));
    /// ```
    pub fn from_limiter(limiter: Limiter) -> RateLimitLayerBuilder<Limiter> {
        RateLimitLayerBuilder::on(limiter)
    }

    /// The limiter behind this layer: check, charge, refund or reset keys from handlers and jobs.
    pub fn limiter(&self) -> &Limiter {
        &self.shared.limiter
    }

    /// Replaces the rules while requests flow (see [`Limiter::reload`]): validated first, swapped
    /// atomically, and rules that keep their name keep their state.
    pub fn reload(&self, rules: impl IntoIterator<Item = Rule>) -> Result<(), ConfigError> {
        self.shared.limiter.reload(rules)
    }

    /// The keys `rule` denied most, from a sketch of fixed size kept per rule (see
    /// [`TopOffenders`] for its guarantees and [`RateLimitLayerBuilder::top_offenders`] for its size).
    ///
    /// The sketch counts this layer's denials, and a shadow rule's "would deny" (every rule's
    /// under the layer's [`shadow`](RateLimitLayerBuilder::shadow) switch): the limiter's own
    /// [`charge`](Limiter::charge), [`check`](Limiter::check) and [`decide`](Limiter::decide)
    /// are not counted, nor are other layers sharing the limiter (each keeps its own lists).
    /// Allowed requests never touch it. Keys are redacted as the logs redact them when the layer
    /// has [`redact_keys`](RateLimitLayerBuilder::redact_keys) on.
    ///
    /// Reading it also checks the most denied key in the store (cost 0: nothing is charged) for
    /// [`utilisation`](TopOffenders::utilisation), and sets the gauge
    /// `tollgate_top_offender_utilisation{rule}` to it (0 when the rule has denied nothing).
    ///
    /// ```
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use tower::{Layer, Service, ServiceExt};
    /// use tollgate::{Key, Limit, RateLimitLayer, Rule};
    ///
    /// let key = Key::header(http::HeaderName::from_static("x-api-key"));
    /// let layer = RateLimitLayer::new(Rule::new("per-key", Limit::per_minute(1)).key(key));
    /// let mut app = layer.layer(tower::service_fn(|_: http::Request<()>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(()))
    /// }));
    /// for _ in 0..3 {
    ///     let request = http::Request::builder().header("x-api-key", "alice").body(())?;
    ///     app.ready().await?.call(request).await?;
    /// }
    /// let top = layer.top_offenders("per-key").await?;
    /// assert_eq!((top.offenders[0].key.as_str(), top.offenders[0].denied), ("alice", 2));
    /// assert_eq!(top.utilisation, Some(1.0)); // alice has used all of her minute's request
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn top_offenders(&self, rule: &str) -> Result<TopOffenders, LimitError> {
        let (mut top, hottest, gauge) = {
            let in_force = self.shared.in_force.load();
            let Some((index, compiled)) = in_force.rules.find(rule) else {
                return Err(LimitError::UnknownRule(rule.to_owned()));
            };
            let metrics = &in_force.meters.rules[index];
            let (top, hottest) =
                offenders::list(metrics, &compiled.name, self.shared.redact_keys.as_ref());
            (top, hottest, metrics.utilisation.clone())
        };
        let Some(hottest) = hottest else {
            gauge.set(0.0);
            return Ok(top);
        };
        let now = self
            .shared
            .limiter
            .one(rule, hottest.as_bytes(), 0, Some(Mode::Check))
            .await;
        if let Ok(now) = now {
            if now.limit > 0 {
                let used = 1.0 - now.remaining.min(now.limit) as f64 / now.limit as f64;
                gauge.set(used);
                top.utilisation = Some(used);
            }
        }
        Ok(top)
    }
}

impl<S> RateLimit<S> {
    /// A layer with one rule and an in-memory store (see [`RateLimitLayer::new`]).
    pub fn layer(rule: impl Into<Rule>) -> RateLimitLayer {
        RateLimitLayer::new(rule)
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::from_shared(inner, self.shared.clone())
    }
}

/// Builds a [`RateLimitLayer`]: on the builder of its limiter ([`RateLimitLayer::builder`], the
/// default `L`), with the limiter's settings (rules, store, lists) beside the layer's, or on a
/// limiter built already ([`RateLimitLayer::from_limiter`], `L` = [`Limiter`]), with the layer's
/// settings only.
// The limiter's setters exist only on the first kind, so a setting a given limiter would ignore
// cannot be written (0.2 refused it when the layer was built).
#[must_use]
pub struct RateLimitLayerBuilder<L = LimiterBuilder> {
    limiter: L,
    status: StatusCode,
    on_allowed: bool,
    legacy: bool,
    jitter: Duration,
    rejection: Option<Arc<crate::response::RespondFn>>,
    failure: FailurePolicy,
    shadow_all: bool,
    redact_keys: bool,
    redact_keys_secret: Option<Box<[u8]>>,
    top_offenders: usize,
    decision_in_extensions: bool,
}

impl<L> RateLimitLayerBuilder<L> {
    fn on(limiter: L) -> Self {
        RateLimitLayerBuilder {
            limiter,
            status: StatusCode::TOO_MANY_REQUESTS,
            on_allowed: true,
            legacy: false,
            jitter: Duration::ZERO,
            rejection: None,
            failure: FailurePolicy::default(),
            shadow_all: false,
            redact_keys: false,
            redact_keys_secret: None,
            top_offenders: offenders::DEFAULT_CAPACITY,
            decision_in_extensions: true,
        }
    }
}

impl RateLimitLayerBuilder<LimiterBuilder> {
    /// Adds a rule; a request is charged by every rule whose scope it is in, all or nothing.
    pub fn rule(mut self, rule: impl Into<Rule>) -> Self {
        self.limiter = self.limiter.rule(rule);
        self
    }

    /// The store (default: a new [`MemoryStore`](crate::MemoryStore)).
    pub fn store(mut self, store: impl Store) -> Self {
        self.limiter = self.limiter.store(store);
        self
    }

    /// Requests matching `list` are never limited (no rule is charged, no fields are added).
    pub fn allow(mut self, list: AccessList) -> Self {
        self.limiter = self.limiter.allow(list);
        self
    }

    /// Requests matching `list` are refused with `403 Forbidden` and a problem+json body (gRPC
    /// requests: `PERMISSION_DENIED`).
    pub fn deny(mut self, list: AccessList) -> Self {
        self.limiter = self.limiter.deny(list);
        self
    }

    /// What to do when the store fails, times out, or its circuit breaker is open (default:
    /// [`FailurePolicy::Open`]).
    pub fn on_store_failure(mut self, policy: FailurePolicy) -> Self {
        self.failure = policy;
        self.limiter = self.limiter.on_store_failure(policy);
        self
    }

    /// The circuit breaker in front of a remote store (default: [`CircuitBreaker::new`]; see
    /// [`LimiterBuilder::circuit_breaker`]).
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.limiter = self.limiter.circuit_breaker(breaker);
        self
    }

    /// Validates every rule and builds the layer.
    pub fn build(self) -> Result<RateLimitLayer, ConfigError> {
        self.failure.validate()?;
        let (limiter, layer) = self.split();
        layer.finish(|| limiter.build())
    }
}

impl RateLimitLayerBuilder<Limiter> {
    /// What to do when the store fails, times out, or its circuit breaker is open (default:
    /// [`FailurePolicy::Open`]). [`FailurePolicy::Local`] must be the limiter's own policy too
    /// (its store does the local deciding): [`build`](Self::build) refuses it otherwise.
    pub fn on_store_failure(mut self, policy: FailurePolicy) -> Self {
        self.failure = policy;
        self
    }

    /// Builds the layer on the limiter.
    pub fn build(self) -> Result<RateLimitLayer, ConfigError> {
        self.failure.validate()?;
        let failure = self.failure;
        let (limiter, layer) = self.split();
        layer.finish(|| {
            if matches!(failure, FailurePolicy::Local { .. }) && limiter.failure_policy() != failure
            {
                return Err(ConfigError::new(
                    "on_store_failure",
                    "local",
                    "a layer built on a given limiter fails to local only when that limiter \
                     was built with the same `on_store_failure(FailurePolicy::Local { .. })`",
                ));
            }
            Ok(limiter)
        })
    }
}

impl<L> RateLimitLayerBuilder<L> {
    /// The limiter's part, apart from the layer's own settings.
    fn split(self) -> (L, RateLimitLayerBuilder<()>) {
        let RateLimitLayerBuilder {
            limiter,
            status,
            on_allowed,
            legacy,
            jitter,
            rejection,
            failure,
            shadow_all,
            redact_keys,
            redact_keys_secret,
            top_offenders,
            decision_in_extensions,
        } = self;
        let layer = RateLimitLayerBuilder {
            limiter: (),
            status,
            on_allowed,
            legacy,
            jitter,
            rejection,
            failure,
            shadow_all,
            redact_keys,
            redact_keys_secret,
            top_offenders,
            decision_in_extensions,
        };
        (limiter, layer)
    }

    /// The status of a denied request (default `429 Too Many Requests`; some APIs prefer `503`).
    pub fn status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    /// Whether allowed responses carry `RateLimit` and `RateLimit-Policy` (default: yes).
    pub fn headers_on_allowed(mut self, on: bool) -> Self {
        self.on_allowed = on;
        self
    }

    /// Whether an allowed request carries its [`Decision`](crate::Decision) in its extensions, for
    /// handlers to read (default: yes). Off saves every request an allocation and a copy of the
    /// decision (about 380 instructions: BENCHMARKS.md) when no handler reads it.
    pub fn decision_in_extensions(mut self, on: bool) -> Self {
        self.decision_in_extensions = on;
        self
    }

    /// Adds the legacy `X-RateLimit-Limit`, `-Remaining` and `-Reset` (Unix seconds) fields for the
    /// most restrictive rule (default: off).
    pub fn legacy_headers(mut self, on: bool) -> Self {
        self.legacy = on;
        self
    }

    /// Adds a random delay of up to `max` to `Retry-After`, so that many denied clients don't all
    /// come back at the same instant (default: none).
    pub fn jitter(mut self, max: Duration) -> Self {
        self.jitter = max;
        self
    }

    /// Builds the rejection response of every denied request yourself, HTTP or gRPC: the hook
    /// gets a [`Rejection`] with the decision, the request's [`Protocol`](crate::key::Protocol), the
    /// wait, and the layer's own answer. The layer still adds the wait (`Retry-After`, or
    /// `grpc-retry-pushback-ms` for gRPC) and the `RateLimit` fields unless your response sets
    /// them. To answer HTTP requests only, return `rejected.default_response()` for the others:
    ///
    /// ```
    /// use tollgate::{Limit, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Limit::per_minute(60))
    ///     .on_rejection(|rejected| {
    ///         if rejected.protocol().is_grpc() {
    ///             return rejected.default_response();
    ///         }
    ///         let wait = rejected.retry_after().as_secs();
    ///         http::Response::builder()
    ///             .status(429)
    ///             .body(bytes::Bytes::from(format!("slow down for {wait} s")))
    ///             .unwrap()
    ///     })
    ///     .build();
    /// ```
    pub fn on_rejection<F>(mut self, build: F) -> Self
    where
        F: Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.rejection = Some(Arc::new(build));
        self
    }

    /// Shadow mode for every rule: decide and record, never block (see [`Rule::shadow`]).
    /// Concurrency rules ([`Limit::concurrent`](crate::Limit::concurrent)) are left out: a
    /// shadow decision is made apart from the response, so nothing would give a slot back.
    pub fn shadow(mut self, on: bool) -> Self {
        self.shadow_all = on;
        self
    }

    /// Logs, and the layer's [`top_offenders`](RateLimitLayer::top_offenders) lists, show a
    /// keyed hash of each key instead of the key itself (default: off): `#` and 16 hex digits,
    /// the first 64 bits of HMAC-SHA-256 of the key under a secret, which nobody without the
    /// secret can reverse or test guesses against.
    ///
    /// The secret is this process's own, drawn at random from the operating system, unless one
    /// is given with [`redact_keys_secret`](Self::redact_keys_secret): a key then shows the same
    /// within this process only (every layer of it alike), and no longer after a restart.
    pub fn redact_keys(mut self, on: bool) -> Self {
        self.redact_keys = on;
        self
    }

    /// Redacts keys as [`redact_keys`](Self::redact_keys) does, under `secret` instead of a
    /// random secret of this process: every instance given the same secret shows a key the
    /// same way, so one key can be followed through the logs of a whole fleet, and across
    /// restarts. Keep the secret as secret as the keys: with it, redactions can be reversed by
    /// trying keys. At least 16 bytes (e.g. 32 random bytes in hex, `openssl rand -hex 32`), or
    /// [`build`](Self::build) fails naming the field `secret`; a secret given while
    /// `redact_keys(false)` is the last word is an error too.
    ///
    /// ```
    /// use tollgate::{Limit, RateLimitLayer};
    ///
    /// # std::env::set_var("TOLLGATE_REDACT_SECRET", "0f7c2a9e4b1d83c6a5e09b7d2f4c1a8e");
    /// // The fleet's secret, from wherever its secrets live (never from the code).
    /// let secret = std::env::var("TOLLGATE_REDACT_SECRET").expect("the redaction secret");
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Limit::per_minute(60))
    ///     .redact_keys_secret(secret)
    ///     .build()?;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn redact_keys_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.redact_keys = true;
        self.redact_keys_secret = Some(secret.as_ref().into());
        self
    }

    /// How many keys each rule's [`top_offenders`](RateLimitLayer::top_offenders) list holds
    /// (default 64; 0 turns the lists off). Memory is fixed by it: at most `capacity` keys per
    /// rule, whatever the number of keys denied.
    pub fn top_offenders(mut self, capacity: usize) -> Self {
        self.top_offenders = capacity;
        self
    }
}

impl RateLimitLayerBuilder<()> {
    /// The layer on the limiter `limiter` makes, with these settings (the limiter is made after
    /// the layer's own settings are checked, so that their errors come first, as they always
    /// have).
    fn finish(
        self,
        limiter: impl FnOnce() -> Result<Limiter, ConfigError>,
    ) -> Result<RateLimitLayer, ConfigError> {
        let redact_keys = match (self.redact_keys, &self.redact_keys_secret) {
            (true, Some(secret)) => Some(Redactor::with_secret(secret)?),
            (true, None) => Some(Redactor::per_process()?),
            (false, None) => None,
            (false, Some(_)) => {
                return Err(ConfigError::new(
                    "redact_keys",
                    "secret",
                    "is given, but keys are not redacted (`redact_keys(false)` came after it)",
                ))
            }
        };
        let limiter = limiter()?;
        let mut responder = Responder::new();
        responder.status = self.status;
        responder.on_allowed = self.on_allowed;
        responder.legacy = self.legacy;
        responder.jitter = self.jitter;
        responder.rejection = self.rejection;
        let in_force = InForce::new(limiter.rules().clone(), None, self.top_offenders);
        let shared = Arc::new(Shared {
            in_force: ArcSwap::from_pointee(in_force),
            limiter,
            responder,
            failure: self.failure,
            shadow_all: self.shadow_all,
            redact_keys,
            top_offenders: self.top_offenders,
            decision_in_extensions: self.decision_in_extensions,
            no_peer_logged: std::sync::atomic::AtomicBool::new(false),
            no_route_logged: std::sync::atomic::AtomicBool::new(false),
        });
        shared.follow_reloads();
        Ok(RateLimitLayer { shared })
    }
}

impl<L: std::fmt::Debug> std::fmt::Debug for RateLimitLayerBuilder<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .field("limiter", &self.limiter)
            .field("status", &self.status)
            .field("failure", &self.failure)
            .finish_non_exhaustive()
    }
}
