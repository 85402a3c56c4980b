//! Timestamps as logs write them, to microseconds since the Unix epoch.
//!
//! Written here rather than taken from a date crate: the command needs three shapes only, and the
//! `combined` one is parsed for every line of a log, so it must be cheap.

/// Microseconds since the Unix epoch.
pub type Micros = u64;

/// A timestamp, and whether the log gave whole seconds only (such lines are spread over their
/// second, see [`crate::run`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stamp {
    /// When.
    pub at: Micros,
    /// Whether the log's resolution is one second.
    pub whole_second: bool,
}

/// `10/Oct/2000:13:55:36 -0700`, the `combined` format's `$time_local`.
pub fn parse_clf(text: &[u8]) -> Option<Stamp> {
    if text.len() != 26 || text[2] != b'/' || text[6] != b'/' || text[11] != b':' {
        return None;
    }
    let day = digits(&text[0..2])?;
    let month = month(&text[3..6])?;
    let year = digits(&text[7..11])?;
    let (h, m, s) = (
        digits(&text[12..14])?,
        digits(&text[15..17])?,
        digits(&text[18..20])?,
    );
    if text[14] != b':' || text[17] != b':' || text[20] != b' ' {
        return None;
    }
    let offset = offset(&text[21..26])?;
    let at = epoch_seconds(year, month, day, h, m, s)?.checked_add_signed(-offset)?;
    Some(Stamp {
        at: at.checked_mul(1_000_000)?,
        whole_second: true,
    })
}

/// A timestamp in a JSON or CSV field: seconds since the epoch (`1700000000`, `1700000000.25`),
/// or RFC 3339 / ISO 8601 (`2023-11-14T22:13:20Z`, `2023-11-14 22:13:20.5+01:00`), or the
/// `combined` shape.
pub fn parse_any(text: &str) -> Option<Stamp> {
    let text = text.trim();
    if let Some(stamp) = parse_clf(text.as_bytes()) {
        return Some(stamp);
    }
    if text.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return epoch_number(text);
    }
    parse_iso(text)
}

/// Seconds since the epoch, with an optional fraction.
pub fn epoch_number(text: &str) -> Option<Stamp> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let seconds: u64 = whole.parse().ok()?;
    let micros = fraction_micros(fraction)?;
    Some(Stamp {
        at: seconds.checked_mul(1_000_000)?.checked_add(micros)?,
        whole_second: fraction.is_empty(),
    })
}

fn parse_iso(text: &str) -> Option<Stamp> {
    let b = text.as_bytes();
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (year, month, day) = (digits(&b[0..4])?, digits(&b[5..7])?, digits(&b[8..10])?);
    let (h, m, s) = (
        digits(&b[11..13])?,
        digits(&b[14..16])?,
        digits(&b[17..19])?,
    );
    let mut rest = &text[19..];
    let mut micros = 0;
    let mut whole_second = true;
    if let Some(after) = rest.strip_prefix('.') {
        let end = after
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(after.len());
        micros = fraction_micros(&after[..end])?;
        whole_second = false;
        rest = &after[end..];
    }
    let offset = match rest {
        "" | "Z" | "z" => 0,
        zone => offset(zone.replace(':', "").as_bytes())?,
    };
    let at = epoch_seconds(year, month, day, h, m, s)?.checked_add_signed(-offset)?;
    Some(Stamp {
        at: at.checked_mul(1_000_000)?.checked_add(micros)?,
        whole_second,
    })
}

fn fraction_micros(fraction: &str) -> Option<u64> {
    if !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut micros = 0;
    for i in 0..6 {
        let digit = fraction
            .as_bytes()
            .get(i)
            .map_or(0, |b| u64::from(b - b'0'));
        micros = micros * 10 + digit;
    }
    Some(micros)
}

/// `+0200` / `-0700` as seconds east of UTC.
fn offset(text: &[u8]) -> Option<i64> {
    if text.len() != 5 {
        return None;
    }
    let sign = match text[0] {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let (h, m) = (digits(&text[1..3])?, digits(&text[3..5])?);
    Some(sign * (h * 3600 + m * 60) as i64)
}

fn digits(text: &[u8]) -> Option<u64> {
    text.iter().try_fold(0u64, |n, &b| {
        b.is_ascii_digit().then(|| n * 10 + u64::from(b - b'0'))
    })
}

fn month(name: &[u8]) -> Option<u64> {
    const MONTHS: [&[u8; 3]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    MONTHS
        .iter()
        .position(|m| &m[..] == name)
        .map(|i| i as u64 + 1)
}

/// Seconds since the epoch of a UTC date and time (days from the civil calendar, Howard
/// Hinnant's algorithm); `None` for impossible values or dates before 1970.
fn epoch_seconds(year: u64, month: u64, day: u64, h: u64, m: u64, s: u64) -> Option<u64> {
    if !(1970..=9999).contains(&year) || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    if h > 23 || m > 59 || s > 60 {
        return None;
    }
    let (y, mp) = if month > 2 {
        (year, month - 3)
    } else {
        (year - 1, month + 9)
    };
    let era = y / 400;
    let yoe = y - era * 400;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = (era * 146_097 + doe).checked_sub(719_468)?;
    Some(days * 86_400 + h * 3600 + m * 60 + s)
}

/// `2023-11-14 22:13:20 UTC` for seconds since the epoch (the inverse of the civil algorithm
/// above).
pub fn format_utc(seconds: u64) -> String {
    let days = seconds / 86_400;
    let rest = seconds % 86_400;
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combined_timestamps_with_offsets() {
        // 2000-10-10 20:55:36 UTC.
        let stamp = parse_clf(b"10/Oct/2000:13:55:36 -0700").unwrap();
        assert_eq!(stamp.at, 971_211_336_000_000);
        assert!(stamp.whole_second);
        assert_eq!(parse_clf(b"10/Oct/2000:20:55:36 +0000").unwrap(), stamp);
        assert_eq!(parse_clf(b"10/Foo/2000:20:55:36 +0000"), None);
        assert_eq!(parse_clf(b"10/Oct/2000:25:55:36 +0000"), None);
        assert_eq!(parse_clf(b"10/Oct/2000:20:55"), None);
    }

    #[test]
    fn iso_and_epoch_timestamps() {
        let at = 1_700_000_000_000_000;
        assert_eq!(parse_any("2023-11-14T22:13:20Z").unwrap().at, at);
        assert_eq!(parse_any("2023-11-14T23:13:20+01:00").unwrap().at, at);
        let fine = parse_any("2023-11-14 22:13:20.25Z").unwrap();
        assert_eq!((fine.at, fine.whole_second), (at + 250_000, false));
        assert_eq!(parse_any("1700000000").unwrap().at, at);
        assert_eq!(parse_any("1700000000.5").unwrap().at, at + 500_000);
        assert_eq!(parse_any("yesterday"), None);
        assert_eq!(parse_any("2023-13-14T22:13:20Z"), None);
    }

    #[test]
    fn formats_what_it_parses() {
        assert_eq!(format_utc(1_700_000_000), "2023-11-14 22:13:20 UTC");
        assert_eq!(format_utc(951_782_400), "2000-02-29 00:00:00 UTC");
    }
}
