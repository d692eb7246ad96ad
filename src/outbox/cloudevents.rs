//! PURE: the CloudEvents Kafka protocol binding, binary content mode.
//!
//! The record keeps its key, value and `id` header; the event's context
//! attributes travel as `ce_*` headers and its data content type as
//! `content-type`, so a CloudEvents SDK reads the record as an event while
//! consumers that ignore CloudEvents see the same record as before.

use std::sync::Arc;

use bytes::Bytes;

/// `--cloudevents` settings, part of the mapping so every path that maps
/// events (the relay, and tools that show what it would produce) adds the
/// same headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloudEventsConfig {
    /// `--cloudevents-source`; `None` derives one per table.
    pub source: Option<String>,
    /// The database name, for the derived source.
    pub database: String,
}

impl CloudEventsConfig {
    /// `ce_source` for events from `origin` (`schema/table`, or `message/<prefix>`):
    /// the flag's value, else `/<database>/<origin>`.
    pub fn source_for(&self, origin: &str) -> Arc<str> {
        match &self.source {
            Some(source) => Arc::from(source.as_str()),
            None => Arc::from(format!("/{}/{origin}", self.database).as_str()),
        }
    }
}

/// Header names of the binding.
pub mod headers {
    /// Always `1.0`.
    pub const SPEC_VERSION: &str = "ce_specversion";
    /// The event id.
    pub const ID: &str = "ce_id";
    /// The route-by value.
    pub const TYPE: &str = "ce_type";
    /// Where the event comes from.
    pub const SOURCE: &str = "ce_source";
    /// The commit time, RFC 3339.
    pub const TIME: &str = "ce_time";
    /// The record key, when not null.
    pub const SUBJECT: &str = "ce_subject";
    /// The data content type (`datacontenttype`).
    pub const CONTENT_TYPE: &str = "content-type";
}

/// One event's attributes, as read from its row or message.
#[derive(Clone, Debug)]
pub struct Attributes<'a> {
    /// `ce_source`.
    pub source: &'a Arc<str>,
    /// The id column's text.
    pub id: &'a Bytes,
    /// The route-by value.
    pub event_type: Bytes,
    /// The key, when not null.
    pub subject: Option<&'a Bytes>,
    /// Commit time, Unix milliseconds.
    pub time_ms: i64,
    /// Whether the payload is JSON (json/jsonb column, or a JSON non-string field).
    pub json: bool,
}

/// The `ce_*` (and `content-type`) headers for one event, in a fixed order.
pub fn headers(attrs: &Attributes<'_>) -> Vec<(Arc<str>, Option<Bytes>)> {
    use headers as h;
    let mut out: Vec<(Arc<str>, Option<Bytes>)> = vec![
        (Arc::from(h::SPEC_VERSION), Some(Bytes::from_static(b"1.0"))),
        (Arc::from(h::ID), Some(attrs.id.clone())),
        (Arc::from(h::TYPE), Some(attrs.event_type.clone())),
        (
            Arc::from(h::SOURCE),
            Some(Bytes::copy_from_slice(attrs.source.as_bytes())),
        ),
        (
            Arc::from(h::TIME),
            Some(Bytes::from(rfc3339(attrs.time_ms))),
        ),
    ];
    if let Some(subject) = attrs.subject {
        out.push((Arc::from(h::SUBJECT), Some(subject.clone())));
    }
    if attrs.json {
        out.push((
            Arc::from(h::CONTENT_TYPE),
            Some(Bytes::from_static(b"application/json")),
        ));
    }
    out
}

/// Unix milliseconds as RFC 3339 UTC with milliseconds; times before 1970
/// (never a commit time) clamp to the epoch.
fn rfc3339(ms: i64) -> String {
    let ms = u64::try_from(ms).unwrap_or(0);
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_millis(time).to_string()
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
