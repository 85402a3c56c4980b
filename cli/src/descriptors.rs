//! Log lines as the descriptors Envoy would send, for replaying traffic through a configuration
//! of `tollgate-server` (`tollgate replay --descriptor ... [--domain ...]`).
//!
//! Each `--descriptor` is one descriptor of every request: its entries, comma-separated, each
//! `KEY=SOURCE`, where SOURCE is `peer` (the client's address, as Envoy's `remote_address`
//! action gives it), `path` (without the query), `method`, `header:NAME`, or `literal:VALUE`
//! (Envoy's `generic_key`). A descriptor with an entry the line lacks (no peer, no such header)
//! is left out of that request, as Envoy leaves it out.

use std::net::SocketAddr;

use http::header::HeaderName;
use http::Request;
use tollgate::engine::Ruling;
use tollgate::{Decision, Limiter};
use tollgate_server::plan::{Descriptor, RequestCharges};
use tollgate_server::tree::{Domains, Entry};

/// Where an entry's value comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Source {
    Peer,
    Path,
    Method,
    Header(HeaderName),
    Literal(String),
}

/// The descriptors of every request, and the domain they are sent in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DescriptorMap {
    domain: Option<String>,
    descriptors: Vec<Vec<(String, Source)>>,
}

impl DescriptorMap {
    /// The map `--descriptor` and `--domain` give.
    pub fn parse(domain: Option<String>, specs: &[String]) -> Result<DescriptorMap, String> {
        let descriptors = specs
            .iter()
            .map(|spec| spec.split(',').map(entry).collect::<Result<Vec<_>, _>>())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(DescriptorMap {
            domain,
            descriptors,
        })
    }

    /// Whether no `--descriptor` was given.
    pub fn is_empty(&self) -> bool {
        self.descriptors.is_empty()
    }

    /// The domain the requests are sent in: `--domain`, or the configuration's only one.
    pub fn domain(&self, domains: &Domains) -> Result<String, String> {
        if let Some(domain) = &self.domain {
            return match domains.get(domain) {
                Some(_) => Ok(domain.clone()),
                None => Err(format!(
                    "--domain {domain:?}: the configuration has no such domain"
                )),
            };
        }
        let names: Vec<&str> = domains.names().collect();
        match names[..] {
            [only] => Ok(only.to_owned()),
            _ => Err(format!(
                "the configuration has {} domains: say which with --domain",
                names.len()
            )),
        }
    }

    /// The descriptors of `request`: (key, value) entries.
    fn values<'a>(&'a self, request: &Request<()>) -> Vec<Vec<(&'a str, String)>> {
        self.descriptors
            .iter()
            .filter_map(|entries| {
                entries
                    .iter()
                    .map(|(key, source)| Some((key.as_str(), value(source, request)?)))
                    .collect()
            })
            .collect()
    }
}

fn entry(spec: &str) -> Result<(String, Source), String> {
    let bad = || {
        format!(
            "--descriptor {spec:?}: expected KEY=SOURCE, SOURCE one of peer, path, method, \
             header:NAME, literal:VALUE"
        )
    };
    let (key, source) = spec.split_once('=').ok_or_else(bad)?;
    if key.is_empty() {
        return Err(bad());
    }
    let source = match source {
        "peer" => Source::Peer,
        "path" => Source::Path,
        "method" => Source::Method,
        other => match other.split_once(':') {
            Some(("header", name)) => {
                Source::Header(HeaderName::try_from(name).map_err(|_| bad())?)
            }
            Some(("literal", value)) if !value.is_empty() => Source::Literal(value.to_owned()),
            _ => return Err(bad()),
        },
    };
    Ok((key.to_owned(), source))
}

fn value(source: &Source, request: &Request<()>) -> Option<String> {
    match source {
        Source::Peer => request
            .extensions()
            .get::<SocketAddr>()
            .map(|peer| peer.ip().to_string()),
        Source::Path => Some(request.uri().path().to_owned()),
        Source::Method => Some(request.method().as_str().to_owned()),
        Source::Header(name) => request
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        Source::Literal(value) => Some(value.clone()),
    }
}

/// A configuration of tollgate-server, and how log lines become its descriptors.
pub struct ServerRun {
    /// The domains of the configuration, each with its descriptor tree.
    pub domains: Domains,
    /// The domain the log's requests are decided in.
    pub domain: String,
    /// How a log line's request becomes the descriptors tollgate-server would be sent.
    pub map: DescriptorMap,
}

impl ServerRun {
    /// What tollgate-server decides for `request`'s descriptors (each costs 1): the enforced
    /// limits charged together, all or nothing; the shadow limits together, apart from them.
    pub fn decide(&self, limiter: &Limiter, request: &Request<()>) -> Ruling {
        let values = self.map.values(request);
        let descriptors: Vec<Descriptor<'_>> = values
            .iter()
            .map(|entries| {
                let entries = entries
                    .iter()
                    .map(|(key, value)| Entry { key, value })
                    .collect();
                Descriptor::new(entries, 1)
            })
            .collect();
        let plan = RequestCharges::new(self.domains.get(&self.domain), &descriptors, false);
        if plan.cannot_pass() {
            return Ruling::Refused {
                status: http::StatusCode::TOO_MANY_REQUESTS,
                rule: None,
                reason: "a limit of 0 per unit".into(),
            };
        }
        let shadow: Vec<_> = plan
            .shadow()
            .map(|(_, rule, key, limit)| (rule, key, 1, limit))
            .collect();
        // Quota limits are charged with the others, all or nothing (the server takes a step
        // again without a quota limit that has no room).
        let enforced = charge(
            limiter,
            plan.charges().map(|c| (c.rule, c.key, c.cost, c.limit())),
        );
        let shadow = charge(limiter, shadow);
        match (enforced, shadow) {
            (Ok(enforced), Ok(shadow)) => Ruling::Decided { enforced, shadow },
            (Err(reason), _) | (_, Err(reason)) => Ruling::Refused {
                status: http::StatusCode::SERVICE_UNAVAILABLE,
                rule: None,
                reason,
            },
        }
    }
}

/// `charges` in one step of the (memory) store; none is an empty decision.
fn charge<'a>(
    limiter: &Limiter,
    charges: impl IntoIterator<Item = (&'a str, &'a [u8], u64, Option<tollgate::Limit>)>,
) -> Result<Decision, String> {
    let mut charges = charges.into_iter().peekable();
    if charges.peek().is_none() {
        return Ok(Decision::default());
    }
    match crate::ready::now(limiter.charge_all_under(charges)) {
        Some(Ok(decision)) => Ok(decision),
        Some(Err(error)) => Err(error.to_string()),
        None => Err("store error".into()),
    }
}
