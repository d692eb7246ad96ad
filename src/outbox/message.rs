//! PURE: the table-less outbox. A transactional logical decoding message
//! (`pg_logical_emit_message(true, 'outbox', '{...}')`) whose content is a JSON
//! object is mapped like a row, with JSON fields in place of columns.
//!
//! Field values become record bytes the way column text does: a JSON string
//! gives its contents (like a `text` column), any other value its JSON text
//! exactly as written (like a `jsonb` column), `null` or a missing field gives
//! NULL. The payload is a zero-copy slice of the message.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::value::RawValue;

use super::{EventError, MappingConfig, OutboxRecord, RawParts, Segment, valid_topic, values};

/// A [`MappingConfig`] applied to messages with one prefix.
#[derive(Clone, Debug)]
pub struct MessageMapping {
    config: MappingConfig,
    source: Arc<str>,
    /// `ce_source`, with `--cloudevents`.
    ce_source: Option<Arc<str>>,
}

/// A message's top-level fields, borrowed from its content.
struct Fields<'a> {
    content: &'a Bytes,
    fields: HashMap<String, &'a RawValue>,
}

impl<'a> Fields<'a> {
    fn parse(content: &'a Bytes) -> Result<Self, EventError> {
        let fields: HashMap<String, &RawValue> =
            serde_json::from_slice(content).map_err(|e| EventError::InvalidValue {
                column: "(message content)".to_owned(),
                // serde_json's own message may quote the content.
                reason: format!(
                    "not a JSON object (line {}, column {})",
                    e.line(),
                    e.column()
                ),
            })?;
        Ok(Fields { content, fields })
    }

    /// The field as record bytes; `None` when missing or null.
    fn bytes(&self, name: &str) -> Result<Option<Bytes>, EventError> {
        let Some(raw) = self.fields.get(name) else {
            return Ok(None);
        };
        let text = raw.get();
        if text == "null" {
            return Ok(None);
        }
        if text.starts_with('"') {
            let s: String = serde_json::from_str(text).map_err(|e| EventError::InvalidValue {
                column: name.to_owned(),
                reason: e.to_string(),
            })?;
            return Ok(Some(Bytes::from(s)));
        }
        // The raw text lies inside the content buffer: slice it without copying.
        let start = (text.as_ptr() as usize).wrapping_sub(self.content.as_ptr() as usize);
        match self.content.get(start..start + text.len()) {
            Some(slice) if slice == text.as_bytes() => {
                Ok(Some(self.content.slice(start..start + text.len())))
            }
            _ => Ok(Some(Bytes::copy_from_slice(text.as_bytes()))),
        }
    }

    fn text(&self, name: &str) -> Result<Option<String>, EventError> {
        self.bytes(name)?
            .map(|b| {
                String::from_utf8(b.to_vec()).map_err(|_| EventError::InvalidValue {
                    column: name.to_owned(),
                    reason: "not UTF-8".to_owned(),
                })
            })
            .transpose()
    }
}

impl MessageMapping {
    /// Maps messages with `prefix` through `config`.
    pub fn new(config: MappingConfig, prefix: &str) -> Self {
        MessageMapping {
            ce_source: config
                .cloudevents
                .as_ref()
                .map(|ce| ce.source_for(&format!("message/{prefix}"))),
            config,
            source: Arc::from(format!("message:{prefix}").as_str()),
        }
    }

    /// What errors and dead letters name as the event's table: `message:<prefix>`.
    pub fn source(&self) -> &Arc<str> {
        &self.source
    }

    fn topic(&self, f: &Fields<'_>) -> Result<String, EventError> {
        let mut topic = String::new();
        for seg in self.config.topic_template.segments() {
            match seg {
                Segment::Literal(s) => topic.push_str(s),
                Segment::RoutedByValue | Segment::Column(_) => {
                    let field = match seg {
                        Segment::Column(c) => c.as_str(),
                        _ => self.config.route_by.as_str(),
                    };
                    let value = f.text(field)?.filter(|v| !v.is_empty()).ok_or_else(|| {
                        EventError::EmptyRoutingValue {
                            column: field.to_owned(),
                        }
                    })?;
                    topic.push_str(&value);
                }
            }
        }
        Ok(topic)
    }

    /// Maps one message's content.
    pub fn map(&self, content: &Bytes, commit_time_ms: i64) -> Result<OutboxRecord, EventError> {
        let f = Fields::parse(content)?;
        let id = f
            .bytes(&self.config.id_column)?
            .ok_or_else(|| EventError::NullId {
                column: self.config.id_column.clone(),
            })?;
        let topic = valid_topic(self.topic(&f)?)?;
        let timestamp_ms = match &self.config.timestamp_column {
            None => commit_time_ms,
            Some(field) => match f.text(field)? {
                None => commit_time_ms,
                Some(v) => v
                    .parse::<i64>()
                    .ok()
                    .or_else(|| values::parse_timestamp_ms(&v))
                    .ok_or_else(|| EventError::InvalidValue {
                        column: field.clone(),
                        reason: "not epoch milliseconds or an ISO 8601 time".to_owned(),
                    })?,
            },
        };
        let mut headers = Vec::with_capacity(self.config.header_columns.len());
        for h in &self.config.header_columns {
            headers.push((Arc::from(h.header.as_str()), f.bytes(&h.column)?));
        }
        let key = f.bytes(&self.config.key_column)?;
        if let Some(source) = &self.ce_source {
            let route = &self.config.route_by;
            let event_type = f.bytes(route)?.filter(|v| !v.is_empty()).ok_or_else(|| {
                EventError::EmptyRoutingValue {
                    column: route.clone(),
                }
            })?;
            let json = f
                .fields
                .get(&self.config.payload_column)
                .is_some_and(|raw| raw.get() != "null" && !raw.get().starts_with('"'));
            headers.extend(super::cloudevents::headers(
                &super::cloudevents::Attributes {
                    source,
                    id: &id,
                    event_type,
                    subject: key.as_ref(),
                    time_ms: commit_time_ms,
                    json,
                },
            ));
        }
        Ok(OutboxRecord {
            topic,
            key,
            payload: f.bytes(&self.config.payload_column)?,
            id,
            headers,
            timestamp_ms,
            partition: None,
        })
    }

    /// As much as can be read of a message that failed to map, for a dead letter.
    pub fn raw_parts(&self, content: &Bytes) -> RawParts {
        let Ok(f) = Fields::parse(content) else {
            return RawParts {
                payload: Some(content.clone()),
                ..RawParts::default()
            };
        };
        RawParts {
            id: f
                .bytes(&self.config.id_column)
                .ok()
                .flatten()
                .unwrap_or_default(),
            key: f.bytes(&self.config.key_column).ok().flatten(),
            payload: f.bytes(&self.config.payload_column).ok().flatten(),
            intended_topic: self.topic(&f).ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::{HeaderColumn, TopicTemplate};

    fn mapping() -> MessageMapping {
        MessageMapping::new(
            MappingConfig {
                route_by: "event_type".into(),
                topic_template: TopicTemplate::parse("outbox.${routedByValue}").unwrap(),
                key_column: "aggregate_id".into(),
                id_column: "id".into(),
                payload_column: "payload".into(),
                timestamp_column: Some("ts".into()),
                header_columns: vec![HeaderColumn::parse("aggregate_type:type").unwrap()],
                cloudevents: None,
            },
            "outbox",
        )
    }

    #[test]
    fn maps_json_fields_like_columns() {
        let content = Bytes::from_static(
            br#"{"id":"e-1","aggregate_type":"order","aggregate_id":"o-1","event_type":"OrderCreated","payload":{"total": 10},"ts":1700000000000}"#,
        );
        let rec = mapping().map(&content, 5).unwrap();
        assert_eq!(rec.topic, "outbox.OrderCreated");
        assert_eq!(rec.id_text(), "e-1");
        assert_eq!(rec.key.as_deref(), Some(&b"o-1"[..]));
        assert_eq!(rec.payload.as_deref(), Some(&br#"{"total": 10}"#[..]));
        assert_eq!(rec.timestamp_ms, 1_700_000_000_000);
        assert_eq!(rec.headers[0].1.as_deref(), Some(&b"order"[..]));
        // The payload is a slice of the message, not a copy.
        let payload = rec.payload.unwrap();
        let within = content.as_ptr() as usize..content.as_ptr() as usize + content.len();
        assert!(within.contains(&(payload.as_ptr() as usize)));
    }

    #[test]
    fn cloudevents_headers_for_messages() {
        let mut config = mapping().config;
        config.cloudevents = Some(crate::outbox::cloudevents::CloudEventsConfig {
            source: None,
            database: "shop".into(),
        });
        let m = MessageMapping::new(config, "outbox");
        let header = |content: &'static [u8], name: &str| {
            let rec = m.map(&Bytes::from_static(content), 2_000).unwrap();
            rec.headers
                .iter()
                .find(|(n, _)| &**n == name)
                .and_then(|(_, v)| v.as_deref())
                .map(|v| String::from_utf8_lossy(v).into_owned())
        };
        let json = br#"{"id":"e-1","aggregate_id":"o-1","event_type":"E","payload":{"a":1}}"#;
        assert_eq!(header(json, "ce_type").as_deref(), Some("E"));
        assert_eq!(
            header(json, "ce_source").as_deref(),
            Some("/shop/message/outbox")
        );
        assert_eq!(header(json, "ce_subject").as_deref(), Some("o-1"));
        assert_eq!(
            header(json, "ce_time").as_deref(),
            Some("1970-01-01T00:00:02.000Z")
        );
        assert_eq!(
            header(json, "content-type").as_deref(),
            Some("application/json")
        );
        let text = br#"{"id":"e-1","event_type":"E","payload":"plain"}"#;
        assert_eq!(header(text, "content-type"), None);
        assert_eq!(header(text, "ce_subject"), None);
    }

    #[test]
    fn strings_give_their_contents_and_null_gives_null() {
        let content = Bytes::from_static(
            br#"{"id":7,"aggregate_id":null,"event_type":"E","payload":"plain \"text\""}"#,
        );
        let rec = mapping().map(&content, 5).unwrap();
        assert_eq!(rec.id_text(), "7");
        assert_eq!(rec.key, None);
        assert_eq!(rec.payload.as_deref(), Some(&br#"plain "text""#[..]));
        assert_eq!(rec.timestamp_ms, 5, "no ts field: the commit time");
    }

    #[test]
    fn bad_messages_are_event_errors() {
        let m = mapping();
        let err = |s: &'static str| m.map(&Bytes::from_static(s.as_bytes()), 0).unwrap_err();
        assert!(matches!(err("not json"), EventError::InvalidValue { .. }));
        assert!(matches!(err("[1,2]"), EventError::InvalidValue { .. }));
        assert!(matches!(
            err(r#"{"event_type":"E"}"#),
            EventError::NullId { .. }
        ));
        assert!(matches!(
            err(r#"{"id":"1"}"#),
            EventError::EmptyRoutingValue { .. }
        ));
        assert!(matches!(
            err(r#"{"id":"1","event_type":"a b"}"#),
            EventError::InvalidTopic { .. }
        ));
        assert!(matches!(
            err(r#"{"id":"1","event_type":"E","ts":"soon"}"#),
            EventError::InvalidValue { .. }
        ));
        let parts = m.raw_parts(&Bytes::from_static(b"not json"));
        assert_eq!(parts.payload.as_deref(), Some(&b"not json"[..]));
        let parts = m.raw_parts(&Bytes::from_static(
            br#"{"id":"1","aggregate_id":"k","event_type":"a b","payload":[1]}"#,
        ));
        assert_eq!(parts.id.as_ref(), b"1");
        assert_eq!(parts.intended_topic.as_deref(), Some("outbox.a b"));
        assert_eq!(parts.payload.as_deref(), Some(&b"[1]"[..]));
    }
}
