//! RFC 3339 date-times → epoch ms (CONTRACT.md: fractions below a millisecond truncated).
//!
//! Accepted: `YYYY-MM-DD(T|t| )hh:mm:ss[.fraction](Z|z|±hh:mm)`, ASCII digits, a real calendar
//! date (year ≥ 1), hour ≤ 23, minute and second ≤ 59 (no leap second), offset hour ≤ 23 and
//! minute ≤ 59. Written here rather than taken from a date crate because braid needs exactly
//! this grammar and truncation; the general parsers differ on leap seconds and rounding.

/// Epoch milliseconds of `s`, or `None` when it is no RFC 3339 date-time.
pub fn parse_ms(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (year, month, day) = (digits(&b[0..4])?, digits(&b[5..7])?, digits(&b[8..10])?);
    let (hour, minute, second) = (digits(&b[11..13])?, digits(&b[14..16])?, digits(&b[17..19])?);
    if year < 1 || !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let mut rest = &b[19..];
    let mut millis = 0;
    if rest.first() == Some(&b'.') {
        let n = rest[1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if n == 0 {
            return None;
        }
        for i in 0..3 {
            millis = millis * 10 + rest.get(1 + i).filter(|_| i < n).map_or(0, |c| i64::from(c - b'0'));
        }
        rest = &rest[1 + n..];
    }
    let offset_s = match rest {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let (oh, om) = (digits(&[*h1, *h2])?, digits(&[*m1, *m2])?);
            if oh > 23 || om > 59 {
                return None;
            }
            let offset = oh * 3600 + om * 60;
            if *sign == b'+' { offset } else { -offset }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_s;
    Some(seconds * 1000 + millis)
}

/// `ts` (ms since the Unix epoch) as `YYYY-MM-DDTHH:MM:SS.mmmZ` (Hinnant's `civil_from_days`).
pub fn format_ms(ts: i64) -> String {
    let (days, ms) = (ts.div_euclid(86_400_000), ts.rem_euclid(86_400_000));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s, milli) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{milli:03}Z")
}

fn digits(b: &[u8]) -> Option<i64> {
    b.iter().try_fold(0i64, |n, c| c.is_ascii_digit().then(|| n * 10 + i64::from(c - b'0')))
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::parse_ms;

    #[test]
    fn parses_and_truncates() {
        assert_eq!(parse_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_ms("1970-01-01t00:00:01.9999z"), Some(1999));
        assert_eq!(parse_ms("1970-01-01 01:00:00+01:00"), Some(0));
        assert_eq!(parse_ms("2026-11-30T12:00:00.5-00:30"), Some(1_796_041_800_500));
        assert_eq!(parse_ms("1969-12-31T23:59:59.999Z"), Some(-1));
        assert_eq!(parse_ms("2024-02-29T00:00:00Z"), Some(1_709_164_800_000));
    }

    #[test]
    fn refuses_what_is_not_a_date_time() {
        for bad in [
            "2023-02-29T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-01-01T24:00:00Z",
            "2026-01-01T23:59:60Z",
            "2026-01-01T00:00:00",
            "2026-01-01T00:00:00.Z",
            "2026-01-01T00:00:00+24:00",
            "0000-01-01T00:00:00Z",
            "2026-01-01X00:00:00Z",
            "２026-01-01T00:00:00Z",
        ] {
            assert_eq!(parse_ms(bad), None, "{bad}");
        }
    }
}
