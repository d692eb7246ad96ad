//! PURE: the CloudEvents Kafka protocol binding, binary content mode. The attributes travel as
//! `ce_*` headers (and `content-type`), so a CloudEvents SDK reads the record as an event while
//! other consumers see the same key, value and `id` header as before.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;

/// `--cloudevents` settings, in the mapping so the relay and `peek` add the same headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloudEventsConfig {
    /// `--cloudevents-source`; `None` derives one per table.
    pub source: Option<String>,
    /// The database name, for the derived source.
    pub database: String,
}

impl CloudEventsConfig {
    /// `ce_source` for `origin` (`schema/table` or `message/<prefix>`), by default
    /// `/<database>/<origin>`.
    pub fn source_for(&self, origin: &str) -> Bytes {
        match &self.source {
            Some(source) => Bytes::from(source.clone()),
            None => Bytes::from(format!("/{}/{origin}", self.database)),
        }
    }
}

/// One event's attributes, as read from its row or message.
#[derive(Clone, Debug)]
pub struct Attributes<'a> {
    /// `ce_source`.
    pub source: &'a Bytes,
    /// `ce_id`: the event id.
    pub id: &'a Bytes,
    /// `ce_type`: the route-by value.
    pub event_type: Bytes,
    /// `ce_subject`: the key, when not null.
    pub subject: Option<&'a Bytes>,
    /// `ce_time`: the commit time, Unix milliseconds.
    pub time_ms: i64,
    /// Whether the payload is JSON (json/jsonb or a non-string JSON field): `content-type`.
    pub json: bool,
}

/// The `ce_*` and `content-type` headers of one event, in a fixed order, absent ones left out.
pub fn headers(attrs: &Attributes<'_>) -> Vec<(Arc<str>, Option<Bytes>)> {
    // Commit times are never before 1970; clamp rather than fail.
    let time = UNIX_EPOCH + Duration::from_millis(u64::try_from(attrs.time_ms).unwrap_or(0));
    let time = humantime::format_rfc3339_millis(time).to_string();
    let json = Bytes::from_static(b"application/json");
    [
        ("ce_specversion", Some(Bytes::from_static(b"1.0"))),
        ("ce_id", Some(attrs.id.clone())),
        ("ce_type", Some(attrs.event_type.clone())),
        ("ce_source", Some(attrs.source.clone())),
        ("ce_time", Some(Bytes::from(time))),
        ("ce_subject", attrs.subject.cloned()),
        ("content-type", attrs.json.then_some(json)),
    ]
    .into_iter()
    .filter_map(|(name, value)| Some((Arc::from(name), Some(value?))))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(headers: &[(Arc<str>, Option<Bytes>)], name: &str) -> Option<String> {
        headers
            .iter()
            .find(|(n, _)| &**n == name)
            .and_then(|(_, v)| v.as_ref())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    #[test]
    fn binary_mode_headers() {
        let source = CloudEventsConfig {
            source: None,
            database: "shop".into(),
        }
        .source_for("public/outbox");
        let id = Bytes::from_static(b"e-1");
        let key = Bytes::from_static(b"order-7");
        let h = headers(&Attributes {
            source: &source,
            id: &id,
            event_type: Bytes::from_static(b"OrderCreated"),
            subject: Some(&key),
            time_ms: 1_700_000_000_123,
            json: true,
        });
        assert_eq!(text(&h, "ce_specversion").as_deref(), Some("1.0"));
        assert_eq!(text(&h, "ce_id").as_deref(), Some("e-1"));
        assert_eq!(text(&h, "ce_type").as_deref(), Some("OrderCreated"));
        assert_eq!(
            text(&h, "ce_source").as_deref(),
            Some("/shop/public/outbox")
        );
        assert_eq!(
            text(&h, "ce_time").as_deref(),
            Some("2023-11-14T22:13:20.123Z")
        );
        assert_eq!(text(&h, "ce_subject").as_deref(), Some("order-7"));
        assert_eq!(
            text(&h, "content-type").as_deref(),
            Some("application/json")
        );
    }

    #[test]
    fn null_key_and_non_json_payload_leave_their_headers_out() {
        let source = CloudEventsConfig {
            source: Some("urn:shop".into()),
            database: "shop".into(),
        }
        .source_for("public/outbox");
        let id = Bytes::from_static(b"1");
        let h = headers(&Attributes {
            source: &source,
            id: &id,
            event_type: Bytes::from_static(b"E"),
            subject: None,
            time_ms: 0,
            json: false,
        });
        assert_eq!(text(&h, "ce_source").as_deref(), Some("urn:shop"));
        assert_eq!(
            text(&h, "ce_time").as_deref(),
            Some("1970-01-01T00:00:00.000Z")
        );
        assert!(text(&h, "ce_subject").is_none());
        assert!(text(&h, "content-type").is_none());
    }
}
