//! PURE: the table-less outbox. A transactional message (`pg_logical_emit_message(true,
//! 'outbox', '{...}')`) holding a JSON object maps like a row, its top-level fields as columns:
//! a string gives its contents (like `text`), other values their JSON text (like `jsonb`), `null`
//! or a missing field NULL.

use std::collections::HashMap;

use bytes::Bytes;
use serde_json::value::RawValue;

use super::{Event, EventError, invalid};

/// A message's top-level fields, borrowed from its content.
pub(super) struct Fields<'a> {
    content: &'a Bytes,
    fields: HashMap<String, &'a RawValue>,
}

impl<'a> Fields<'a> {
    /// Parses the content, which must be a JSON object.
    pub(super) fn parse(content: &'a Bytes) -> Result<Self, EventError> {
        let fields = serde_json::from_slice(content).map_err(|e| {
            // Not serde_json's own message: it may quote the content.
            let at = format!("line {}, column {}", e.line(), e.column());
            invalid(
                "(message content)".to_owned(),
                &format!("not a JSON object ({at})"),
            )
        })?;
        Ok(Fields { content, fields })
    }

    /// The field's JSON text; `None` when missing or `null`.
    fn raw(&self, field: &str) -> Option<&'a str> {
        let raw = self.fields.get(field)?.get();
        (raw != "null").then_some(raw)
    }
}

impl Event for Fields<'_> {
    type Column = String;

    fn name(&self, field: &String) -> String {
        field.clone()
    }

    fn value(&self, field: &String) -> Result<Option<Bytes>, EventError> {
        let Some(raw) = self.raw(field) else {
            return Ok(None);
        };
        if raw.starts_with('"') {
            let text: String =
                serde_json::from_str(raw).map_err(|e| invalid(field.clone(), &e.to_string()))?;
            Ok(Some(Bytes::from(text)))
        } else {
            // serde_json borrows each `&RawValue` from `content`: a zero-copy slice of it.
            Ok(Some(self.content.slice_ref(raw.as_bytes())))
        }
    }

    fn payload_is_json(&self, field: &String) -> bool {
        self.raw(field).is_some_and(|raw| !raw.starts_with('"'))
    }
}

#[cfg(test)]
mod tests {
    use crate::outbox::{
        EventError, EventMapper, HeaderColumn, MappingConfig, OutboxRecord, RawParts, Shard,
        TopicTemplate,
    };
    use bytes::Bytes;

    fn config() -> MappingConfig {
        MappingConfig {
            route_by: "event_type".into(),
            topic_template: TopicTemplate::parse("outbox.${routedByValue}").unwrap(),
            key_column: "aggregate_id".into(),
            id_column: "id".into(),
            payload_column: "payload".into(),
            timestamp_column: Some("ts".into()),
            header_columns: vec![HeaderColumn::parse("aggregate_type:type").unwrap()],
            cloudevents: None,
            connect: None,
        }
    }

    fn map(
        config: MappingConfig,
        content: &Bytes,
        commit_time_ms: i64,
    ) -> Result<OutboxRecord, (EventError, RawParts)> {
        let mapper = EventMapper::new(vec![], vec![("outbox".to_owned(), config)]);
        let (source, mapped) = mapper.message("outbox", content, commit_time_ms).unwrap();
        assert_eq!(source.as_ref(), "message:outbox");
        mapped.map(|record| record.expect("messages are never filtered"))
    }

    #[test]
    fn maps_json_fields_like_columns() {
        let content = Bytes::from_static(
            br#"{"id":"e-1","aggregate_type":"order","aggregate_id":"o-1","event_type":"OrderCreated","payload":{"total": 10},"ts":1700000000000}"#,
        );
        let rec = map(config(), &content, 5).unwrap();
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
        let mut config = config();
        config.cloudevents = Some(crate::outbox::cloudevents::CloudEventsConfig {
            source: None,
            database: "shop".into(),
        });
        let header = |content: &'static [u8], name: &str| {
            let rec = map(config.clone(), &Bytes::from_static(content), 2_000).unwrap();
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
        let rec = map(config(), &content, 5).unwrap();
        assert_eq!(rec.id_text(), "7");
        assert_eq!(rec.key, None);
        assert_eq!(rec.payload.as_deref(), Some(&br#"plain "text""#[..]));
        assert_eq!(rec.timestamp_ms, 5, "no ts field: the commit time");
    }

    #[test]
    fn each_message_belongs_to_one_shard_by_its_key_else_its_id() {
        let shards = [0, 1, 2].map(|index| {
            let mapper = EventMapper::new(vec![], vec![("outbox".to_owned(), config())]);
            mapper.sharded(Some(Shard { index, count: 3 }))
        });
        let owners = |content: String| {
            let content = Bytes::from(content);
            let owners = shards.iter().enumerate();
            let owners = owners.filter(|(_, m)| m.message("outbox", &content, 0).is_some());
            owners.map(|(i, _)| i as u32).collect::<Vec<_>>()
        };
        for n in 0..60 {
            let keyed = format!(
                r#"{{"id":"e-{n}","aggregate_id":"o-{}","event_type":"E"}}"#,
                n % 7
            );
            let key = format!("o-{}", n % 7);
            assert_eq!(owners(keyed), [Shard::of(Some(key.as_bytes()), None, 3)]);
            let unkeyed = format!(r#"{{"id":"e-{n}","event_type":"E"}}"#);
            let id = format!("e-{n}");
            assert_eq!(owners(unkeyed), [Shard::of(None, Some(id.as_bytes()), 3)]);
        }
        // One that does not map still goes to exactly one shard, which stops or dead-letters it.
        assert_eq!(owners("not json".to_owned()), [Shard::of(None, None, 3)]);
        let bad_topic = r#"{"id":"e-1","aggregate_id":"o-1","event_type":"a b"}"#;
        assert_eq!(
            owners(bad_topic.to_owned()),
            [Shard::of(Some(b"o-1"), None, 3)]
        );
    }

    #[test]
    fn bad_messages_are_event_errors() {
        let err = |s: &'static str| {
            map(config(), &Bytes::from_static(s.as_bytes()), 0)
                .unwrap_err()
                .0
        };
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
        let parts = map(config(), &Bytes::from_static(b"not json"), 0)
            .unwrap_err()
            .1;
        assert_eq!(parts.payload.as_deref(), Some(&b"not json"[..]));
        let content = br#"{"id":"1","aggregate_id":"k","event_type":"a b","payload":[1]}"#;
        let parts = map(config(), &Bytes::from_static(content), 0)
            .unwrap_err()
            .1;
        assert_eq!(parts.id.as_ref(), b"1");
        assert_eq!(parts.intended_topic.as_deref(), Some("outbox.a b"));
        assert_eq!(parts.payload.as_deref(), Some(&b"[1]"[..]));
    }
}
