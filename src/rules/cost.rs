//! How many units one request costs.

use std::fmt;
use std::sync::Arc;

use http::HeaderName;

use crate::key::RequestHead;

/// The units a request costs under a rule: fixed, read from a header, or computed.
///
/// A cost of zero only looks (the request is decided but charges nothing).
#[derive(Clone)]
pub struct Cost(Kind);

#[derive(Clone)]
enum Kind {
    Fixed(u64),
    Header {
        name: HeaderName,
        default: Option<u64>,
    },
    Fn(Arc<CostFn>),
}

type CostFn = dyn Fn(&RequestHead<'_>) -> Option<u64> + Send + Sync;

/// Why a request's cost could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CostError {
    /// The cost header is absent and the rule has no default.
    Missing,
    /// The cost header is not a whole number of units.
    Invalid,
}

impl Cost {
    /// Every request costs `units`.
    pub const fn fixed(units: u64) -> Cost {
        Cost(Kind::Fixed(units))
    }

    /// The cost is the decimal number in header `name` (e.g. the LLM tokens a request will use).
    /// A request without the header is rejected with `400 Bad Request` unless
    /// [`or`](Self::or) gives a default; a value that is not a whole number is always rejected.
    pub fn header(name: HeaderName) -> Cost {
        Cost(Kind::Header {
            name,
            default: None,
        })
    }

    /// The cost used when the header is absent.
    pub fn or(self, default: u64) -> Cost {
        match self.0 {
            Kind::Header { name, .. } => Cost(Kind::Header {
                name,
                default: Some(default),
            }),
            other => Cost(other),
        }
    }

    /// The cost computed from the request head; `None` rejects the request as missing its cost.
    pub fn from_fn<F>(f: F) -> Cost
    where
        F: Fn(&RequestHead<'_>) -> Option<u64> + Send + Sync + 'static,
    {
        Cost(Kind::Fn(Arc::new(f)))
    }

    /// The fixed cost, if this cost does not depend on the request.
    pub fn as_fixed(&self) -> Option<u64> {
        match self.0 {
            Kind::Fixed(units) => Some(units),
            _ => None,
        }
    }

    /// The header the cost is read from, for a cost read from a header ([`Cost::header`]).
    ///
    /// ```
    /// use http::HeaderName;
    /// use tollgate::Cost;
    ///
    /// let cost = Cost::header(HeaderName::from_static("x-cost")).or(5);
    /// assert_eq!(cost.header_name().map(HeaderName::as_str), Some("x-cost"));
    /// assert_eq!(cost.header_default(), Some(5));
    /// assert_eq!(Cost::fixed(3).header_name(), None);
    /// ```
    pub fn header_name(&self) -> Option<&HeaderName> {
        match &self.0 {
            Kind::Header { name, .. } => Some(name),
            _ => None,
        }
    }

    /// The cost of a request without the header, for a cost read from a header that has one
    /// ([`Cost::or`]); `None` for any other cost, and for a header cost without a default (a
    /// request without the header is then refused).
    pub fn header_default(&self) -> Option<u64> {
        match self.0 {
            Kind::Header { default, .. } => default,
            _ => None,
        }
    }

    /// The cost of one request.
    #[inline]
    pub fn of(&self, head: &RequestHead<'_>) -> Result<u64, CostError> {
        match &self.0 {
            Kind::Fixed(units) => Ok(*units),
            Kind::Header { name, default } => match head.headers.get(name) {
                None => default.ok_or(CostError::Missing),
                Some(value) => parse_units(value.as_bytes()).ok_or(CostError::Invalid),
            },
            Kind::Fn(f) => f(head).ok_or(CostError::Missing),
        }
    }
}

/// A number of units in a header, the one rule for every header that carries units (a request's
/// cost, a response's real cost): a plain decimal number, ASCII digits only (surrounding spaces
/// allowed, no sign, no spaces inside), at most `u64::MAX`; anything else, a number too large
/// included, is refused rather than guessed.
pub(crate) fn parse_units(bytes: &[u8]) -> Option<u64> {
    let digits = bytes.trim_ascii();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // Digits only, so this is valid UTF-8; overflow is rejected by `parse`.
    std::str::from_utf8(digits).ok()?.parse().ok()
}

impl Default for Cost {
    fn default() -> Self {
        Cost::fixed(1)
    }
}

impl From<u64> for Cost {
    fn from(units: u64) -> Self {
        Cost::fixed(units)
    }
}

impl fmt::Debug for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Kind::Fixed(units) => write!(f, "Cost::fixed({units})"),
            Kind::Header { name, default } => {
                write!(f, "Cost::header({name:?}, default {default:?})")
            }
            Kind::Fn(_) => f.write_str("Cost::from_fn(..)"),
        }
    }
}

impl fmt::Display for CostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CostError::Missing => "the request does not say its cost",
            CostError::Invalid => "the request's cost is not a whole number of units",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost_of(cost: &Cost, header: Option<&[u8]>) -> Result<u64, CostError> {
        let mut req = http::Request::builder().uri("/");
        if let Some(value) = header {
            req = req.header("x-cost", http::HeaderValue::from_bytes(value).unwrap());
        }
        let req = req.body(()).unwrap();
        cost.of(&RequestHead::of(&req))
    }

    #[test]
    fn header_cost_parses_plain_numbers_only() {
        let cost = Cost::header(HeaderName::from_static("x-cost"));
        assert_eq!(cost_of(&cost, Some(b"42")), Ok(42));
        assert_eq!(cost_of(&cost, Some(b" 7 ")), Ok(7));
        assert_eq!(cost_of(&cost, Some(b"0")), Ok(0));
        for bad in [
            &b"-1"[..],
            b"1.5",
            b"",
            b"+3",
            b"1 2",
            b"\xff",
            b"99999999999999999999999",
        ] {
            assert_eq!(
                cost_of(&cost, Some(bad)),
                Err(CostError::Invalid),
                "{bad:?}"
            );
        }
        assert_eq!(cost_of(&cost, None), Err(CostError::Missing));
        assert_eq!(cost_of(&cost.or(3), None), Ok(3));
    }

    #[test]
    fn fixed_and_fn_costs() {
        assert_eq!(cost_of(&Cost::fixed(5), None), Ok(5));
        let by_method = Cost::from_fn(|head| (head.method == http::Method::GET).then_some(2));
        assert_eq!(cost_of(&by_method, None), Ok(2));
    }

    #[test]
    fn what_a_cost_is_made_of() {
        let header = Cost::header(HeaderName::from_static("x-cost"));
        assert_eq!(
            (
                header.as_fixed(),
                header.header_name(),
                header.header_default()
            ),
            (None, Some(&HeaderName::from_static("x-cost")), None)
        );
        assert_eq!(header.or(0).header_default(), Some(0));
        let fixed = Cost::fixed(2);
        assert_eq!(
            (
                fixed.as_fixed(),
                fixed.header_name(),
                fixed.header_default()
            ),
            (Some(2), None, None)
        );
        // Neither fixed nor from a header: computed.
        let computed = Cost::from_fn(|_| Some(1));
        assert_eq!((computed.as_fixed(), computed.header_name()), (None, None));
    }
}
