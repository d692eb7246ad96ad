//! `--cloudevents`: a CloudEvents SDK reads the relay's records back as the
//! events they describe.
//!
//! The `cloudevents-sdk` crate's own Kafka binding is built on another rdkafka
//! release than ours (its `MessageExt` is sealed to those types), so the record
//! is handed to the SDK's binary-mode deserializer the way that binding does it:
//! `ce_*` headers are attributes, `content-type` is `datacontenttype`.

use std::collections::HashMap;
use std::time::{Duration, UNIX_EPOCH};

use cloudevents::message::{
    BinaryDeserializer, BinarySerializer, Encoding, Error, MessageAttributeValue,
    MessageDeserializer, Result, StructuredDeserializer, StructuredSerializer,
};
use cloudevents::{Event, EventBuilder, EventBuilderV10};

use crate::support::kafka::Consumed;
use crate::support::relay::Relay;
use crate::support::world::World;

/// A consumed record in the Kafka binding's binary content mode.
struct KafkaRecord {
    headers: HashMap<String, String>,
    payload: Option<Vec<u8>>,
}

impl KafkaRecord {
    fn new(record: &Consumed) -> Self {
        KafkaRecord {
            headers: record
                .headers
                .iter()
                .map(|(k, v)| {
                    let v = v
                        .as_deref()
                        .map(String::from_utf8_lossy)
                        .unwrap_or_default();
                    (k.clone(), v.into_owned())
                })
                .collect(),
            payload: record.payload.clone(),
        }
    }
}

impl BinaryDeserializer for KafkaRecord {
    fn deserialize_binary<R: Sized, V: BinarySerializer<R>>(mut self, visitor: V) -> Result<R> {
        let version = self
            .headers
            .remove("ce_specversion")
            .ok_or(Error::WrongEncoding {})?;
        let version = cloudevents::event::SpecVersion::try_from(version.as_str())?;
        let attributes = version.attribute_names();
        let mut visitor = visitor.set_spec_version(version)?;
        if let Some(content_type) = self.headers.remove("content-type") {
            visitor = visitor.set_attribute(
                "datacontenttype",
                MessageAttributeValue::String(content_type),
            )?;
        }
        for (name, value) in self.headers {
            let Some(name) = name.strip_prefix("ce_") else {
                continue;
            };
            visitor = if attributes.contains(&name) {
                visitor.set_attribute(name, MessageAttributeValue::String(value))?
            } else {
                visitor.set_extension(name, MessageAttributeValue::String(value))?
            };
        }
        match self.payload {
            Some(payload) => visitor.end_with_data(payload),
            None => visitor.end(),
        }
    }
}

impl StructuredDeserializer for KafkaRecord {
    fn deserialize_structured<R: Sized, V: StructuredSerializer<R>>(self, _: V) -> Result<R> {
        Err(Error::WrongEncoding {})
    }
}

impl MessageDeserializer for KafkaRecord {
    fn encoding(&self) -> Encoding {
        if self.headers.contains_key("ce_specversion") {
            Encoding::BINARY
        } else {
            Encoding::UNKNOWN
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn cloudevents_sdk_reads_the_relayed_event() {
    let world = World::start().await;
    let mut relay = Relay::spawn(
        &world.pg.url(),
        &world.broker.bootstrap(),
        &["--cloudevents"],
    );
    relay.wait_streaming();
    let ids = world
        .insert_tx(&[("OrderCreated", "order-7", r#"{"total": 10}"#)])
        .await;
    let records = world
        .broker
        .consume(&["OrderCreated"], 1, Duration::from_secs(30));
    assert_eq!(records.len(), 1, "{}", relay.log());
    let record = &records[0];
    let event: Event = MessageDeserializer::into_event(KafkaRecord::new(record))
        .unwrap_or_else(|e| panic!("{e}: {:?}", record.headers));

    // The record timestamp is the commit time too (no --timestamp-column).
    let commit = UNIX_EPOCH + Duration::from_millis(record.timestamp.unwrap() as u64);
    let database = world.pg.execute("SELECT current_database()").await[0][0]
        .clone()
        .unwrap();
    let expected = EventBuilderV10::new()
        .id(ids[0].as_str())
        .ty("OrderCreated")
        .source(format!("/{database}/public/outbox"))
        .time(humantime::format_rfc3339_millis(commit).to_string())
        .subject("order-7")
        .data("application/json", br#"{"total": 10}"#.to_vec())
        .build()
        .unwrap();
    assert_eq!(event, expected);
    assert_eq!(record.id(), ids[0], "the id header stays");
}
