//! Column values in Postgres' text output format, turned into record bytes and times. The
//! replication session pins `DateStyle=ISO` and `TimeZone=UTC`.

use bytes::Bytes;
use chrono::{DateTime, NaiveDateTime};

/// Decodes bytea's hex output (`\x0102ff`, the default `bytea_output`); `None` for anything else.
pub fn decode_bytea_hex(text: &[u8]) -> Option<Bytes> {
    hex::decode(text.strip_prefix(b"\\x")?)
        .ok()
        .map(Bytes::from)
}

/// ISO timestamp text (`2026-11-22 13:05:54.123456+00`, UTC without offset) as Unix ms.
pub fn parse_timestamp_ms(text: &str) -> Option<i64> {
    let text = text.replacen('T', " ", 1);
    match DateTime::parse_from_str(&text, "%Y-%m-%d %H:%M:%S%.f%#z") {
        Ok(time) => Some(time.timestamp_millis()),
        Err(_) => NaiveDateTime::parse_from_str(&text, "%Y-%m-%d %H:%M:%S%.f")
            .ok()
            .map(|time| time.and_utc().timestamp_millis()),
    }
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
