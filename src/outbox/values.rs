//! Column values in Postgres' text output format, turned into record bytes.
//!
//! The replication session pins `DateStyle=ISO` and `TimeZone=UTC`, so the
//! timestamps parsed here always arrive as `YYYY-MM-DD HH:MM:SS[.ffffff]+00`.

use bytes::Bytes;

/// Well-known type OIDs (`pg_type.oid`), stable across Postgres versions.
pub mod oid {
    /// `bytea`
    pub const BYTEA: u32 = 17;
    /// `int8`
    pub const INT8: u32 = 20;
    /// `int4`
    pub const INT4: u32 = 23;
    /// `json`
    pub const JSON: u32 = 114;
    /// `jsonb`
    pub const JSONB: u32 = 3802;
    /// `timestamp`
    pub const TIMESTAMP: u32 = 1114;
    /// `timestamptz`
    pub const TIMESTAMPTZ: u32 = 1184;
}

/// Decodes bytea's hex text output (`\x0102ff`) into raw bytes.
///
/// Returns `None` for anything else (the legacy `escape` output is not used:
/// `bytea_output` defaults to `hex` and the relay never changes it).
pub fn decode_bytea_hex(text: &[u8]) -> Option<Bytes> {
    let hex = text.strip_prefix(b"\\x")?;
    if hex.len() % 2 != 0 {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    let mut out = Vec::with_capacity(hex.len() / 2);
    for pair in hex.chunks_exact(2) {
        let (hi, lo) = (pair.first().copied()?, pair.get(1).copied()?);
        out.push((nibble(hi)? << 4) | nibble(lo)?);
    }
    Some(Bytes::from(out))
}

/// Parses ISO timestamp text (`2026-11-22 13:05:54.123456+00`, offset
/// optional, then UTC) into milliseconds since the Unix epoch.
pub fn parse_timestamp_ms(text: &str) -> Option<i64> {
    let (date, rest) = text.split_once(' ').or_else(|| text.split_once('T'))?;
    let mut date_parts = date.splitn(3, '-');
    let year: i64 = date_parts.next()?.parse().ok()?;
    let month: u32 = date_parts.next()?.parse().ok()?;
    let day: u32 = date_parts.next()?.parse().ok()?;
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    // Split the time from a trailing +HH[:MM[:SS]] / -HH... offset.
    let offset_at = rest.find(['+', '-']);
    let (time, offset) = match offset_at {
        Some(i) => (&rest[..i], Some(&rest[i..])),
        None => (rest, None),
    };
    let (hms, frac) = match time.split_once('.') {
        Some((hms, frac)) => (hms, frac),
        None => (time, ""),
    };
    let mut hms_parts = hms.splitn(3, ':');
    let hour: i64 = hms_parts.next()?.parse().ok()?;
    let minute: i64 = hms_parts.next()?.parse().ok()?;
    let second: i64 = hms_parts.next()?.parse().ok()?;
    if hour > 24 || minute > 59 || second > 60 {
        return None;
    }
    let millis: i64 = if frac.is_empty() {
        0
    } else {
        if !frac.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let digits: String = frac.chars().chain("000".chars()).take(3).collect();
        digits.parse().ok()?
    };
    let offset_secs = match offset {
        None => 0,
        Some(o) => {
            let sign = if o.starts_with('-') { -1 } else { 1 };
            let mut parts = o[1..].splitn(3, ':');
            let h: i64 = parts.next()?.parse().ok()?;
            let m: i64 = parts.next().map_or(Some(0), |p| p.parse().ok())?;
            let s: i64 = parts.next().map_or(Some(0), |p| p.parse().ok())?;
            sign * (h * 3600 + m * 60 + s)
        }
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_secs;
    Some(secs * 1000 + millis)
}

/// Days since 1970-01-01 for a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Postgres' epoch (2000-01-01) in Unix milliseconds.
const PG_EPOCH_UNIX_MS: i64 = 946_684_800_000;

/// Postgres timestamp (microseconds since 2000-01-01 UTC) to Unix microseconds.
pub fn pg_micros_to_unix_micros(micros: i64) -> i64 {
    micros.saturating_add(PG_EPOCH_UNIX_MS * 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_bytea_hex() {
        assert_eq!(
            decode_bytea_hex(b"\\x00ff10Ab").unwrap().as_ref(),
            &[0x00, 0xff, 0x10, 0xab]
        );
        assert_eq!(decode_bytea_hex(b"\\x").unwrap().len(), 0);
        assert!(decode_bytea_hex(b"\\x0").is_none());
        assert!(decode_bytea_hex(b"\\xzz").is_none());
        assert!(decode_bytea_hex(b"00ff").is_none());
    }

    #[test]
    fn parses_iso_timestamps() {
        assert_eq!(parse_timestamp_ms("1970-01-01 00:00:00+00"), Some(0));
        assert_eq!(
            parse_timestamp_ms("2026-11-22 13:05:54.123456+00"),
            Some(1_795_352_754_123)
        );
        assert_eq!(
            parse_timestamp_ms("2026-11-22 14:05:54.1+01"),
            Some(1_795_352_754_100)
        );
        assert_eq!(
            parse_timestamp_ms("2026-11-22 08:35:54-04:30"),
            Some(1_795_352_754_000)
        );
        assert_eq!(
            parse_timestamp_ms("2000-01-01 00:00:00"),
            Some(PG_EPOCH_UNIX_MS)
        );
        assert_eq!(parse_timestamp_ms("1969-12-31 23:59:59+00"), Some(-1000));
        for bad in [
            "infinity",
            "2026-13-01 00:00:00",
            "2026-11-22",
            "x y",
            "2026-11-22 1:2",
        ] {
            assert_eq!(parse_timestamp_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn converts_pg_epoch_micros() {
        assert_eq!(pg_micros_to_unix_micros(0), PG_EPOCH_UNIX_MS * 1000);
        assert_eq!(
            pg_micros_to_unix_micros(1_500),
            PG_EPOCH_UNIX_MS * 1000 + 1_500
        );
    }
}
