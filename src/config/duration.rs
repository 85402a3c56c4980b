//! Human durations in the file: `"500ms"`, `"1m"`, `"24h"`, `"1h30m"`.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

/// A duration written for people, parsed by `humantime`: a number and a unit, repeated
/// (`"1h30m"`, `"1h 30m"`); units `ms`, `s`, `m`, `h`, `d`, `w` and their long forms. A bare number
/// is refused: `60` could mean seconds or milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HumanDuration(pub(crate) Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(DurationVisitor)
    }
}

struct DurationVisitor;

impl Visitor<'_> for DurationVisitor {
    type Value = HumanDuration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a duration such as \"500ms\", \"1m\" or \"1h30m\"")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<HumanDuration, E> {
        parse(text).map(HumanDuration).map_err(E::custom)
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<HumanDuration, E> {
        Err(E::custom(format!(
            "a duration needs a unit: write \"{n}s\" or \"{n}ms\""
        )))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<HumanDuration, E> {
        Err(E::custom(format!(
            "a duration needs a unit: write \"{n}s\" or \"{n}ms\""
        )))
    }
}

/// Parses `text`; the error quotes it.
pub(crate) fn parse(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|_| {
        format!("invalid duration {text:?} (expected e.g. \"500ms\", \"1m\", \"24h\", \"1h30m\")")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_forms() {
        let secs = Duration::from_secs;
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("1s"), Ok(secs(1)));
        assert_eq!(parse("1m"), Ok(secs(60)));
        assert_eq!(parse("24h"), Ok(secs(86_400)));
        assert_eq!(parse("1h30m"), Ok(secs(5_400)));
        assert_eq!(parse("1h 30m"), Ok(secs(5_400)));
        assert_eq!(parse("2d"), Ok(secs(172_800)));
        assert_eq!(parse(" 10s "), Ok(secs(10)));
    }

    #[test]
    fn errors_quote_the_text() {
        assert_eq!(
            parse("1 fortnight").unwrap_err(),
            "invalid duration \"1 fortnight\" (expected e.g. \"500ms\", \"1m\", \"24h\", \"1h30m\")"
        );
        assert!(parse("").is_err());
        assert!(parse("10").is_err());
    }
}
