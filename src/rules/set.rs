//! `RuleSet`: the rules in force, validated and compiled, plus the allow and deny lists; it routes
//! a request to its plan. A reload replaces the whole set atomically, under a new generation,
//! by which the later stages know when to refresh what they prepared per rule.

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use http::{Request, StatusCode};
use ipnet::IpNet;

use crate::algorithm::error::ConfigError;
use crate::algorithm::CostTooLarge;
use crate::key::protocol::Protocol;
use crate::key::{peer_addr, Key, KeyFault, KeyValue, RequestHead};
use crate::rules::cost::CostError;
use crate::rules::per_request::Applied;

use crate::rules::rule::{CompiledRule, MissingKey, Rule};

/// Rules, compiled, with everything per rule that never changes between requests.
pub(crate) struct RuleSet {
    pub(crate) rules: Box<[CompiledRule]>,
    /// Unique to this set (counted per process): what the response and observe stages prepared
    /// for a set is theirs to keep until the generation changes.
    pub(crate) generation: u64,
    /// Whether any rule is corrected once the response is known (the others pay nothing).
    pub(crate) settles: bool,
    /// Whether any rule is a concurrency limit, whose slots are held until the response ends
    /// (the others pay nothing for them).
    pub(crate) slots: bool,
    allow: Vec<AccessList>,
    deny: Vec<AccessList>,
}

/// A request answered before the store is asked.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The rule's key is missing and the rule rejects such requests.
    MissingKey {
        rule: std::sync::Arc<str>,
        key: String,
        status: StatusCode,
    },
    /// The request's cost could not be read.
    BadCost {
        rule: std::sync::Arc<str>,
        error: CostError,
    },
    /// The request's cost can never pass.
    CostTooLarge {
        rule: std::sync::Arc<str>,
        error: CostTooLarge,
    },
    /// The request matched a deny list.
    Denied { list: String },
    /// The rule's key is the peer's address, and the server passes none on: its
    /// misconfiguration, not the request's fault.
    NoPeer {
        rule: std::sync::Arc<str>,
        key: String,
    },
    /// The rule's key is a route's path parameter, and the layer runs before any route matched:
    /// the server's misconfiguration.
    NoRoute {
        rule: std::sync::Arc<str>,
        key: String,
    },
    /// The rule's key is in the request but cannot be read (a path parameter that is not UTF-8
    /// once percent-decoded).
    BadKey {
        rule: std::sync::Arc<str>,
        key: String,
    },
}

/// Where routing writes the charges a request makes: the engine's decision, filled in place as the
/// request goes through (the rules, then the store), so that it is moved once.
pub(crate) trait Charges {
    /// Adds rule `index`'s charge of `cost` to `key`, under a limit the request brought if any.
    fn push(
        &mut self,
        index: usize,
        rule: std::sync::Arc<str>,
        key: KeyValue,
        cost: u64,
        applied: Option<Applied>,
    );
    /// Whether no charge was added.
    fn is_empty(&self) -> bool;
    /// Records the gRPC method the request calls.
    fn set_grpc_method(&mut self, method: std::sync::Arc<str>);
}

/// What a request's way through the rules is.
pub(crate) enum Route {
    /// On an allow list: forwarded, not limited.
    Allowed,
    /// The rules that apply are planned (enforced and shadow ones apart).
    Planned,
}

/// The next rule set's generation.
static GENERATIONS: AtomicU64 = AtomicU64::new(0);

impl RuleSet {
    pub(crate) fn new(
        rules: Vec<Rule>,
        allow: Vec<AccessList>,
        deny: Vec<AccessList>,
    ) -> Result<Self, ConfigError> {
        let mut compiled: Vec<CompiledRule> = Vec::with_capacity(rules.len());
        for rule in rules {
            let rule = rule.compile()?;
            if compiled.iter().any(|r| r.name == rule.name) {
                return Err(ConfigError::new(
                    &rule.name,
                    "name",
                    "another rule has the same name (names are the rules' namespaces)",
                ));
            }
            compiled.push(rule);
        }
        let settles = compiled.iter().any(CompiledRule::settles);
        let slots = compiled
            .iter()
            .any(|rule| rule.algorithm().is_concurrency());
        Ok(RuleSet {
            rules: compiled.into_boxed_slice(),
            generation: GENERATIONS.fetch_add(1, Ordering::Relaxed),
            settles,
            slots,
            allow,
            deny,
        })
    }

    pub(crate) fn allow(&self) -> &[AccessList] {
        &self.allow
    }

    pub(crate) fn deny(&self) -> &[AccessList] {
        &self.deny
    }

    /// The rule named `name`, with its index.
    pub(crate) fn find(&self, name: &str) -> Option<(usize, &CompiledRule)> {
        self.rules
            .iter()
            .enumerate()
            .find(|(_, r)| &*r.name == name)
    }

    /// Plans the charges a request makes: which rules apply, with which key and cost, into
    /// `enforced` and `shadow` (recorded, never blocking; `shadow_all` makes every rule one). The
    /// shadow plan is made only when a shadow rule applies: most requests make one plan.
    /// (Filled in place: a decision is a few hundred bytes, and each move is a copy.)
    pub(crate) fn route<B, C: Charges + Default>(
        &self,
        request: &Request<B>,
        shadow_all: bool,
        enforced: &mut C,
        shadow: &mut Option<C>,
    ) -> Result<Route, Refusal> {
        // The head is read once, for the lists and the rules.
        let head = RequestHead::of(request);
        if let Some(list) = self.deny.iter().find(|list| list.matches(&head)) {
            return Err(Refusal::Denied {
                list: list.describe(),
            });
        }
        if self.allow.iter().any(|list| list.matches(&head)) {
            return Ok(Route::Allowed);
        }
        for (index, rule) in self.rules.iter().enumerate() {
            if !rule.applies_to(&head) {
                continue;
            }
            let key = match rule
                .key
                .read(&head)
                .map_err(|fault| key_fault(rule, &rule.key, fault))?
            {
                Some(key) => key,
                // Whatever the rule does with missing keys: without the peer address no
                // request would ever have this key, and skipping or sharing one would
                // silently turn the limit off.
                None if rule.key.reads_peer() && peer_addr(head.extensions).is_none() => {
                    return Err(no_peer(rule, &rule.key));
                }
                None => match &rule.missing_key {
                    MissingKey::Skip => continue,
                    MissingKey::Fallback(fallback) => match fallback
                        .read(&head)
                        .map_err(|fault| key_fault(rule, fallback, fault))?
                    {
                        Some(key) => key,
                        None if fallback.reads_peer() && peer_addr(head.extensions).is_none() => {
                            return Err(no_peer(rule, fallback));
                        }
                        None => return Err(missing(rule, StatusCode::BAD_REQUEST)),
                    },
                    MissingKey::Reject => return Err(missing(rule, StatusCode::BAD_REQUEST)),
                    MissingKey::RejectWith(status) => return Err(missing(rule, *status)),
                },
            };
            let cost = rule.cost.of(&head).map_err(|error| Refusal::BadCost {
                rule: rule.name.clone(),
                error,
            })?;
            if cost > rule.cost_bound {
                return Err(Refusal::CostTooLarge {
                    rule: rule.name.clone(),
                    error: CostTooLarge {
                        cost,
                        max: rule.cost_bound,
                    },
                });
            }
            let is_shadow = shadow_all || rule.shadow;
            // Shadow rules are decided apart, with no response to hold a slot until:
            // concurrency rules are left out of shadow mode.
            if is_shadow && rule.algorithm().is_concurrency() {
                continue;
            }
            let applied = match &rule.source {
                None => None,
                Some(source) => source.applied(request.extensions(), &key),
            };
            let name = rule.name.clone();
            if is_shadow {
                let plan = shadow.get_or_insert_with(C::default);
                plan.push(index, name, key, cost, applied);
            } else {
                enforced.push(index, name, key, cost, applied);
            }
        }
        if Protocol::of(request).is_grpc() {
            let method: std::sync::Arc<str> = request.uri().path().into();
            if let Some(shadow) = shadow {
                shadow.set_grpc_method(method.clone());
            }
            if !enforced.is_empty() {
                enforced.set_grpc_method(method);
            }
        }
        Ok(Route::Planned)
    }
}

fn no_peer(rule: &CompiledRule, key: &Key) -> Refusal {
    Refusal::NoPeer {
        rule: rule.name.clone(),
        key: key.describe(),
    }
}

fn key_fault(rule: &CompiledRule, key: &Key, fault: KeyFault) -> Refusal {
    let (rule, key) = (rule.name.clone(), key.describe());
    match fault {
        KeyFault::NoRoute => Refusal::NoRoute { rule, key },
        KeyFault::Undecodable => Refusal::BadKey { rule, key },
    }
}

fn missing(rule: &CompiledRule, status: StatusCode) -> Refusal {
    Refusal::MissingKey {
        rule: rule.name.clone(),
        key: rule.key.describe(),
        status,
    }
}

impl fmt::Debug for RuleSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RuleSet")
            .field("rules", &self.rules)
            .field("allow", &self.allow)
            .field("deny", &self.deny)
            .finish()
    }
}

/// Keys or networks that are never limited ([allow](crate::RateLimitLayerBuilder::allow)) or
/// always refused with `403 Forbidden` ([deny](crate::RateLimitLayerBuilder::deny)).
///
/// ```
/// use tollgate::{AccessList, Key};
/// use http::HeaderName;
///
/// let monitoring = AccessList::networks(Key::peer_ip(), ["10.20.0.0/16".parse().unwrap()]);
/// let banned = AccessList::keys(Key::header(HeaderName::from_static("x-api-key")), ["leaked-key"]);
/// ```
#[derive(Clone, Debug)]
pub struct AccessList {
    key: Key,
    values: HashSet<Box<[u8]>>,
    networks: Vec<IpNet>,
}

impl AccessList {
    /// Matches requests whose `key` is one of `values`.
    pub fn keys<V: AsRef<[u8]>>(key: Key, values: impl IntoIterator<Item = V>) -> Self {
        AccessList {
            key,
            values: values
                .into_iter()
                .map(|v| KeyValue::new(v.as_ref()).as_bytes().into())
                .collect(),
            networks: Vec::new(),
        }
    }

    /// Matches requests whose `key` — an IP key such as [`Key::peer_ip`] or [`Key::client_ip`] — is
    /// inside one of `networks`. (An IPv6 key grouped by prefix matches when its prefix's network
    /// address is inside.)
    pub fn networks(key: impl Into<Key>, networks: impl IntoIterator<Item = IpNet>) -> Self {
        AccessList {
            key: key.into(),
            values: HashSet::new(),
            networks: networks.into_iter().collect(),
        }
    }

    fn matches(&self, head: &RequestHead<'_>) -> bool {
        // A list of networks over an IP key compares the address itself: no text written and
        // parsed back for every list on every request.
        if self.values.is_empty() && self.key.is_address() {
            return self
                .key
                .address(head)
                .is_some_and(|ip| self.networks.iter().any(|net| net.contains(&ip)));
        }
        let Some(key) = self.key.extract_head(head) else {
            return false;
        };
        if self.values.contains(key.as_bytes()) {
            return true;
        }
        if self.networks.is_empty() {
            return false;
        }
        let Ok(text) = std::str::from_utf8(key.as_bytes()) else {
            return false;
        };
        let ip = text
            .parse::<std::net::IpAddr>()
            .ok()
            .or_else(|| text.parse::<IpNet>().ok().map(|net| net.network()));
        ip.is_some_and(|ip| self.networks.iter().any(|net| net.contains(&ip)))
    }

    fn describe(&self) -> String {
        self.key.describe()
    }

    /// What the list reads from a request.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// How many key values are listed (the values themselves, often secrets, are not shown).
    pub fn listed_values(&self) -> usize {
        self.values.len()
    }

    /// The networks listed.
    pub fn listed_networks(&self) -> &[IpNet] {
        &self.networks
    }
}
