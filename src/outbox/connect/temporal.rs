//! PURE: Postgres dates and times in their ISO text output (the replication session pins
//! `DateStyle=ISO` and `TimeZone=UTC`) as the numbers Debezium's temporal types hold, and the
//! ISO text Java's `DateTimeFormatter`s print for `isostring` and `ZonedTimestamp`.
//!
//! What Debezium encodes in ways the relay does not reproduce (`infinity`, dates before the
//! common era, `24:00:00`) does not parse: the event is refused by name, never written
//! differently.

use chrono::{Datelike, NaiveDate};

/// Microseconds in a day.
const DAY_MICROS: i64 = 86_400_000_000;

/// `YYYY-MM-DD` as days since 1970-01-01.
pub fn parse_date(text: &str) -> Option<i64> {
    let (year, rest) = split_year(text)?;
    let month = two_digits(rest.get(1..3)?)?;
    let day = two_digits(rest.get(4..6)?)?;
    if rest.len() != 6 || !rest.starts_with('-') || rest.as_bytes()[3] != b'-' {
        return None;
    }
    let date = NaiveDate::from_ymd_opt(year, month, day)?;
    let epoch = NaiveDate::from_ymd_opt(1970, 1, 1)?;
    Some(date.signed_duration_since(epoch).num_days())
}

/// `HH:MM[:SS[.ffffff]]` as microseconds of the day (before `24:00:00`).
pub fn parse_time(text: &str) -> Option<i64> {
    let hours = i64::from(two_digits(text.get(0..2)?)?);
    let minutes = i64::from(two_digits(text.get(3..5)?)?);
    if text.as_bytes().get(2) != Some(&b':') || hours > 23 || minutes > 59 {
        return None;
    }
    let rest = &text[5..];
    let micros = match rest.strip_prefix(':') {
        None if rest.is_empty() => 0,
        None => return None,
        Some(seconds) => {
            let (whole, fraction) = seconds.split_once('.').unwrap_or((seconds, ""));
            let whole = i64::from(two_digits(whole).filter(|s| *s < 60)?);
            whole * 1_000_000 + fraction_micros(fraction)?
        }
    };
    Some((hours * 60 + minutes) * 60_000_000 + micros)
}

/// `YYYY-MM-DD[ HH:MM[:SS[.ffffff]]]` as microseconds since 1970-01-01T00:00.
pub fn parse_timestamp(text: &str) -> Option<i64> {
    let (date, time) = text.split_once(' ').unwrap_or((text, "00:00"));
    Some(parse_date(date)? * DAY_MICROS + parse_time(time)?)
}

/// `YYYY-MM-DD HH:MM:SS[.ffffff]±HH[:MM[:SS]]` as microseconds since the epoch; a date
/// alone (the default Debezium gives a column whose default is computed) is midnight UTC.
pub fn parse_timestamptz(text: &str) -> Option<i64> {
    let Some((date, time)) = text.split_once(' ') else {
        return Some(parse_date(text)? * DAY_MICROS);
    };
    let at = time.find(['+', '-'])?;
    let (local, offset) = time.split_at(at);
    let local = parse_date(date)? * DAY_MICROS + parse_time(local)?;
    Some(local - offset_micros(offset)?)
}

/// `±HH[:MM[:SS]]` in microseconds.
fn offset_micros(text: &str) -> Option<i64> {
    let sign = if text.starts_with('-') { -1 } else { 1 };
    let mut seconds = 0;
    for (i, part) in text[1..].split(':').enumerate() {
        let limit = if i == 0 { 15 } else { 59 };
        let part = i64::from(two_digits(part).filter(|p| *p <= limit)?);
        seconds += part * [3600, 60, 1].get(i)?;
    }
    Some(sign * seconds * 1_000_000)
}

/// The year of `YYYY-...` (four digits or more, as Postgres prints it) and the rest.
fn split_year(text: &str) -> Option<(i32, &str)> {
    let end = text.find('-').filter(|end| *end >= 4)?;
    let year = &text[..end];
    if !year.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((year.parse().ok()?, &text[end..]))
}

/// Exactly two ASCII digits.
fn two_digits(text: &str) -> Option<u32> {
    if text.len() != 2 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Up to six fraction digits as microseconds.
fn fraction_micros(digits: &str) -> Option<i64> {
    if digits.len() > 6 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    format!("{digits:0<6}").parse().ok()
}

/// `ISO_LOCAL_DATE`: the year in four digits, or more with a `+` (Java's `EXCEEDS_PAD`).
pub fn iso_date(days: i64) -> Option<String> {
    let epoch = NaiveDate::from_ymd_opt(1970, 1, 1)?;
    let date = epoch.checked_add_signed(chrono::Duration::try_days(days)?)?;
    let year = date.year();
    let sign = if year > 9999 { "+" } else { "" };
    Some(format!(
        "{sign}{year:04}-{:02}-{:02}",
        date.month(),
        date.day()
    ))
}

/// `ISO_LOCAL_TIME` of microseconds of the day: seconds always, the fraction only when not
/// zero and then with as few digits as it needs; or with exactly `width` digits (1 to 9), as
/// Debezium's `ZonedTimestamp` formatter for a column of that precision prints it.
pub fn iso_time(micros: i64, width: Option<usize>) -> String {
    let seconds = micros.div_euclid(1_000_000);
    let fraction = micros.rem_euclid(1_000_000);
    let (h, m, s) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    let mut out = format!("{h:02}:{m:02}:{s:02}");
    let nanos = format!("{:09}", fraction * 1000);
    match width {
        Some(width @ 1..=9) => {
            out.push('.');
            out.push_str(&nanos[..width]);
        }
        _ if fraction != 0 => {
            out.push('.');
            out.push_str(nanos.trim_end_matches('0'));
        }
        _ => {}
    }
    out
}

/// `ISO_LOCAL_DATE_TIME` of microseconds since the epoch (see [`iso_time`] for `width`).
pub fn iso_timestamp(micros: i64, width: Option<usize>) -> Option<String> {
    let date = iso_date(micros.div_euclid(DAY_MICROS))?;
    let time = iso_time(micros.rem_euclid(DAY_MICROS), width);
    Some(format!("{date}T{time}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_days_since_the_epoch() {
        for (text, days) in [
            ("1970-01-01", 0),
            ("2024-02-29", 19782),
            ("1900-01-01", -25567),
            ("0001-01-01", -719162),
            ("2038-01-19", 24855),
        ] {
            assert_eq!(parse_date(text), Some(days), "{text}");
            assert_eq!(iso_date(days).as_deref(), Some(text), "{days}");
        }
        let far = iso_date(3_000_000).unwrap_or_default();
        assert!(far.starts_with("+10183-"), "{far}");
        for bad in [
            "infinity",
            "2024-02-30",
            "0044-03-15 BC",
            "24-01-01",
            "2024-1-01",
        ] {
            assert_eq!(parse_date(bad), None, "{bad}");
        }
    }

    #[test]
    fn times_are_microseconds_of_the_day() {
        for (text, micros) in [
            ("13:14:15.123456", 47_655_123_456),
            ("00:00:00", 0),
            ("23:59:59.999999", 86_399_999_999),
            ("12:34:56.78", 45_296_780_000),
            ("12:00", 43_200_000_000),
        ] {
            assert_eq!(parse_time(text), Some(micros), "{text}");
        }
        for bad in [
            "24:00:00",
            "12:60:00",
            "1:00:00",
            "12:00:00.1234567",
            "12:00:",
        ] {
            assert_eq!(parse_time(bad), None, "{bad}");
        }
        assert_eq!(iso_time(45_296_780_000, None), "12:34:56.78");
        assert_eq!(iso_time(43_200_500_000, None), "12:00:00.5");
        assert_eq!(iso_time(0, None), "00:00:00");
        assert_eq!(iso_time(1, Some(6)), "00:00:00.000001");
        assert_eq!(iso_time(0, Some(3)), "00:00:00.000");
    }

    #[test]
    fn timestamps_and_zones() {
        assert_eq!(
            parse_timestamp("1969-12-31 23:59:59.999999"),
            Some(-1),
            "before the epoch"
        );
        assert_eq!(parse_timestamp("2020-01-01"), Some(1_577_836_800_000_000));
        assert_eq!(
            parse_timestamptz("2024-06-01 00:00:00+02"),
            parse_timestamp("2024-05-31 22:00:00")
        );
        assert_eq!(
            parse_timestamptz("2000-01-01 00:00:00.000001+05:30"),
            parse_timestamp("1999-12-31 18:30:00.000001")
        );
        assert_eq!(
            parse_timestamptz("1900-01-01 00:00:00-00:09:21"),
            parse_timestamp("1900-01-01 00:09:21")
        );
        assert_eq!(parse_timestamptz("1970-01-01"), Some(0));
        for bad in [
            "infinity",
            "-infinity",
            "2024-06-01 00:00:00",
            "2024-06-01 00:00:00+2",
        ] {
            assert_eq!(parse_timestamptz(bad), None, "{bad}");
        }
        let micros = parse_timestamp("2024-02-29 13:14:15.123").unwrap_or_default();
        assert_eq!(
            iso_timestamp(micros, None).as_deref(),
            Some("2024-02-29T13:14:15.123")
        );
        assert_eq!(
            iso_timestamp(-1, Some(6)).as_deref(),
            Some("1969-12-31T23:59:59.999999")
        );
    }
}
