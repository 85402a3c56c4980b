//! The protocol's units of time, and the nearest one for a limit that is not a whole unit.

use std::time::Duration;

/// A unit of `RateLimitResponse.RateLimit.Unit` (the numbers are the protocol's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// 1 second.
    Second = 1,
    /// 60 seconds.
    Minute = 2,
    /// 3,600 seconds.
    Hour = 3,
    /// 86,400 seconds.
    Day = 4,
    /// 30 days, as the reference service counts a month.
    Month = 5,
    /// 365 days, as the reference service counts a year.
    Year = 6,
    /// 7 days; weeks start on Thursdays, the weekday of the Unix epoch, as in the reference.
    Week = 7,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The unit a reference configuration names (`second`, `MINUTE`, …; any case, as the
    /// reference reads it).
    pub fn parse(name: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|unit| unit.name().eq_ignore_ascii_case(name))
    }

    /// The unit of the protocol's number `n` (`RateLimitResponse.RateLimit.Unit`, and
    /// `envoy.type.v3.RateLimitUnit` for 1 to 6), if it names one.
    pub fn from_number(n: i32) -> Option<Unit> {
        Unit::ALL.into_iter().find(|unit| *unit as i32 == n)
    }

    /// The unit's name in a reference configuration.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// The unit's length: the reference's divider (windows start at multiples of it since the
    /// Unix epoch).
    pub fn duration(self) -> Duration {
        const DAY: u64 = 86_400;
        Duration::from_secs(match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => DAY,
            Unit::Week => 7 * DAY,
            Unit::Month => 30 * DAY,
            Unit::Year => 365 * DAY,
        })
    }

    /// `capacity` units per `window` in the protocol's terms: the unit nearest the window (on a
    /// log scale, so 90 s is a minute and 45 min an hour) and the count per that unit, rounded
    /// to the nearest whole number (at least 1) and capped at `u32::MAX`.
    pub fn nearest(capacity: u64, window: Duration) -> (u32, Unit) {
        let window = window.as_secs_f64().max(1e-6);
        let unit = Unit::ALL
            .into_iter()
            .min_by(|a, b| {
                let distance = |u: &Unit| (u.duration().as_secs_f64() / window).ln().abs();
                distance(a).total_cmp(&distance(b))
            })
            .unwrap_or(Unit::Second);
        let per_unit = (capacity as f64 * unit.duration().as_secs_f64() / window).round();
        (per_unit.clamp(1.0, f64::from(u32::MAX)) as u32, unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_units_stay_as_they_are() {
        assert_eq!(Unit::nearest(3, Duration::from_secs(60)), (3, Unit::Minute));
        assert_eq!(
            Unit::nearest(10, Duration::from_secs(86_400)),
            (10, Unit::Day)
        );
    }

    #[test]
    fn other_windows_take_the_nearest_unit() {
        assert_eq!(Unit::nearest(3, Duration::from_secs(90)), (2, Unit::Minute));
        assert_eq!(
            Unit::nearest(100, Duration::from_millis(500)),
            (200, Unit::Second)
        );
        assert_eq!(
            Unit::nearest(1, Duration::from_secs(7_200)),
            (1, Unit::Hour)
        );
    }

    #[test]
    fn names_are_read_in_any_case() {
        assert_eq!(Unit::parse("MINUTE"), Some(Unit::Minute));
        assert_eq!(Unit::parse("week"), Some(Unit::Week));
        assert_eq!(Unit::parse("fortnight"), None);
    }
}
