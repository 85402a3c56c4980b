//! Calendar months in a fixed UTC offset, for fixed windows that reset on the 1st.
//!
//! The proleptic Gregorian calendar from days since the Unix epoch and back (the "civil from
//! days" algorithms: eras of 400 years, years starting in March so that the leap day ends a
//! year). Twenty lines of integer arithmetic, which the Redis script repeats; a date crate would
//! bring time zones and formatting this never needs, and could not run inside the script.

use super::Micros;

const DAY: i128 = 86_400_000_000;

/// `(year, month 1..=12)` of the day `days` after 1970-01-01.
fn civil_from_days(days: i64) -> (i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month)
}

/// Days from 1970-01-01 to the 1st of `month` (1..=12) of `year`.
fn days_from_civil(year: i64, month: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year - era * 400;
    let doy = (153 * ((month + 9) % 12) + 2) / 5;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The month `t` falls in, at `offset` µs east of UTC, counted as `year·12 + month − 1`.
pub(crate) fn month_index(t: Micros, offset: i64) -> i64 {
    let days = (i128::from(t) + i128::from(offset)).div_euclid(DAY);
    let (year, month) = civil_from_days(days as i64);
    year * 12 + month - 1
}

/// The instant month `index` begins at `offset` µs east of UTC (clamped to the clock's range).
pub(crate) fn month_start(index: i64, offset: i64) -> Micros {
    let (year, month) = (index.div_euclid(12), index.rem_euclid(12) + 1);
    let at = i128::from(days_from_civil(year, month)) * DAY - i128::from(offset);
    at.clamp(0, i128::from(Micros::MAX)) as Micros
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn months_begin_on_the_first_in_their_offset() {
        // 2024-02-01T00:00:00Z, a leap year's February (29 days).
        let feb_2024 = 1_706_745_600_000_000;
        let index = month_index(feb_2024, 0);
        assert_eq!(index, 2024 * 12 + 1);
        assert_eq!(month_start(index, 0), feb_2024);
        assert_eq!(month_start(index + 1, 0) - feb_2024, 29 * 86_400_000_000);
        // February 2023 has 28 days, 2100 is not a leap year, 2000 is.
        for (year, days) in [(2023, 28), (2024, 29), (2100, 28), (2000, 29)] {
            let feb = year * 12 + 1;
            assert_eq!(
                month_start(feb + 1, 0) - month_start(feb, 0),
                days * 86_400_000_000,
                "{year}"
            );
        }
        // In UTC+2 the month begins two hours before UTC midnight; in UTC−5, five hours after.
        let hour = 3_600_000_000;
        assert_eq!(month_start(index, 2 * hour), feb_2024 - 2 * hour as u64);
        assert_eq!(month_start(index, -5 * hour), feb_2024 + 5 * hour as u64);
        assert_eq!(month_index(feb_2024 - 1, 0), index - 1);
        assert_eq!(month_index(feb_2024 - 2 * hour as u64, 2 * hour), index);
        assert_eq!(
            month_index(feb_2024 - 2 * hour as u64 - 1, 2 * hour),
            index - 1
        );
        // The epoch, and December → January.
        assert_eq!(month_index(0, 0), 1970 * 12);
        assert_eq!(month_start(2024 * 12 + 12, 0), 1_735_689_600_000_000); // 2025-01-01
    }

    #[test]
    fn every_day_of_four_centuries_round_trips() {
        let mut previous = month_index(0, 0);
        for day in 0..146_097i64 {
            let t = (day * 86_400_000_000) as u64;
            let index = month_index(t, 0);
            assert!(index == previous || index == previous + 1);
            assert!(month_start(index, 0) <= t && t < month_start(index + 1, 0));
            previous = index;
        }
    }
}
