//! The lineage topic (`--lineage-topic`): one record per (Postgres system identifier, slot)
//! saying the relay created that slot in that cluster, or that `drop-slot` dropped it. It
//! lives on the Kafka side because the relay can always write there (a least-privilege role
//! or a hot standby can write nothing in Postgres) and because it outlives a database
//! failover; a primary, its standbys and a promoted standby share the system identifier.
//! Read in full at start-up (it is small: compacted, one record per key), without a consumer
//! group; written with `acks=all` and awaited before the relay streams.

use std::time::{Duration, SystemTime};

use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::{Deserialize, Serialize};

use super::KafkaClients;
use super::exactly_once::TailReader;

/// How long one write may wait for the broker's acknowledgement.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// What happened to a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SlotState {
    /// The relay created (or first found and adopted) the slot and streams from it.
    Created,
    /// `drop-slot` dropped it on purpose: a new one is a fresh start, not a loss.
    Dropped,
}

/// A lineage record's value (JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotRecord {
    /// The slot name.
    pub slot: String,
    /// `pg_control_system().system_identifier`.
    pub system_identifier: String,
    /// Created or dropped.
    pub state: SlotState,
    /// When the relay created or adopted the slot (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    /// The slot's confirmed position then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_lsn: Option<String>,
    /// When `drop-slot` dropped it (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped_at: Option<String>,
    /// When a relay streaming from the slot last wrote the record again (RFC 3339), so that a
    /// topic with time-based retention keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refreshed_at: Option<String>,
    /// The relay version that wrote the record.
    pub relay_version: String,
}

impl SlotRecord {
    /// A record of `state` now; `lsn` is the created slot's position.
    pub fn now(slot: &str, system_identifier: &str, state: SlotState, lsn: Option<String>) -> Self {
        let now = rfc3339_now();
        let created = state == SlotState::Created;
        SlotRecord {
            slot: slot.to_owned(),
            system_identifier: system_identifier.to_owned(),
            state,
            created_at: now.clone().filter(|_| created),
            created_lsn: lsn.filter(|_| created),
            dropped_at: now.filter(|_| !created),
            refreshed_at: None,
            relay_version: env!("CARGO_PKG_VERSION").to_owned(),
        }
    }

    /// The same record, written again now by this relay.
    pub fn refreshed(mut self) -> Self {
        self.refreshed_at = rfc3339_now();
        self.relay_version = env!("CARGO_PKG_VERSION").to_owned();
        self
    }
}

fn rfc3339_now() -> Option<String> {
    Some(humantime::format_rfc3339_seconds(SystemTime::now()).to_string())
}

/// The record key of `slot` in the cluster `system_identifier`.
pub fn key(system_identifier: &str, slot: &str) -> String {
    format!("{system_identifier}/{slot}")
}

/// The commands that create the topic and let the relay's principal use it.
pub fn topic_commands(topic: &str) -> [String; 2] {
    [
        format!(
            "kafka-topics.sh --bootstrap-server BROKERS --create --topic {topic} --partitions 1 \
             --config cleanup.policy=compact"
        ),
        format!(
            "kafka-acls.sh --bootstrap-server BROKERS --add --allow-principal User:RELAY \
             --operation Describe --operation Read --operation Write --topic {topic}"
        ),
    ]
}

/// The lineage topic cannot be read or written: the relay does not stream.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot {action} the slot's lineage in Kafka topic {topic:?}: {reason}. The relay streams \
     from a slot only once its creation is recorded there, so that a slot lost in a failover \
     is refused instead of silently replaced by one starting at \"now\" (--allow-new-slot does \
     not skip this){kept}. Create the topic and let the relay's principal use it ({commands}), \
     or name another with --lineage-topic; the -X properties apply to it too"
)]
pub struct LineageError {
    /// `read` or `record`.
    action: &'static str,
    /// The topic.
    topic: String,
    /// What Kafka said.
    reason: String,
    /// What happened to the slot meanwhile.
    kept: &'static str,
    /// [`topic_commands`].
    commands: String,
}

impl LineageError {
    fn new(action: &'static str, topic: &str, reason: impl ToString) -> Self {
        LineageError {
            action,
            topic: topic.to_owned(),
            reason: reason.to_string(),
            kept: "",
            commands: topic_commands(topic).join("; "),
        }
    }

    /// Says that the slot was created and kept: the next start records and adopts it.
    pub fn slot_kept(mut self) -> Self {
        self.kept = ". The slot was created and kept, so once the topic takes the record the \
                     next start relays from its creation (`outbox-relay drop-slot --yes-i-know` \
                     removes it meanwhile, releasing the WAL it pins)";
        self
    }
}

/// The latest record of `key` in `topic`; `None` when there is none or the last is a
/// tombstone.
pub async fn read(
    kafka: &KafkaClients,
    topic: &str,
    key: &str,
) -> Result<Option<SlotRecord>, LineageError> {
    let failed = |reason: String| LineageError::new("read", topic, reason);
    // Read on the blocking pool, which takes owned values.
    let kafka = kafka.clone();
    let owned_topic = topic.to_owned();
    let wanted = key.as_bytes().to_vec();
    let read = tokio::task::spawn_blocking(move || {
        let reader = TailReader::new(&kafka);
        let reader = reader.map_err(|e| e.to_string())?;
        // Several partitions: a key moves when their count changes; the newest write wins.
        let records = reader.read_all(&owned_topic, |msg| {
            let at = msg.timestamp().to_millis().unwrap_or(0);
            let value = msg.payload().map(<[u8]>::to_vec);
            (msg.key() == Some(&wanted[..])).then_some((at, value))
        });
        records.map_err(|e| e.to_string())
    });
    let records = read.await.map_err(|e| failed(e.to_string()))?;
    let records = records.map_err(failed)?;
    let Some((_, Some(value))) = records.into_iter().max_by_key(|(at, _)| *at) else {
        return Ok(None);
    };
    let record = serde_json::from_slice(&value).map_err(|e| {
        let text = String::from_utf8_lossy(&value).into_owned();
        failed(format!(
            "the record of key {key:?} is not one the relay writes ({e}): {text}"
        ))
    })?;
    Ok(Some(record))
}

/// Writes `record` (a tombstone when `None`) under `key` in `topic` and waits for the
/// broker's ack.
pub async fn write(
    kafka: &KafkaClients,
    topic: &str,
    key: &str,
    record: Option<&SlotRecord>,
) -> Result<(), LineageError> {
    let failed = |reason: String| LineageError::new("record", topic, reason);
    let mut client = kafka.config(&[("acks", "all")]);
    // Bounded, whatever the relay's own producer waits.
    client.set("message.timeout.ms", WRITE_TIMEOUT.as_millis().to_string());
    let producer: FutureProducer = client
        .create()
        .map_err(|e| failed(kafka.refused(e).to_string()))?;
    // A record of plain strings always serialises.
    let value = record.map(|r| serde_json::to_vec(r).unwrap_or_default());
    let mut message = FutureRecord::to(topic).key(key);
    if let Some(value) = &value {
        message = message.payload(value);
    }
    producer
        .send(message, WRITE_TIMEOUT)
        .await
        .map_err(|(e, _)| failed(e.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_say_what_happened_and_round_trip() {
        let created = SlotRecord::now("s", "7300", SlotState::Created, Some("0/10".into()));
        let json = serde_json::to_value(&created).unwrap();
        assert_eq!(json["state"], "created");
        assert_eq!(json["created_lsn"], "0/10");
        assert!(json.get("dropped_at").is_none(), "{json}");
        assert_eq!(serde_json::from_value::<SlotRecord>(json).unwrap(), created);
        let dropped = SlotRecord::now("s", "7300", SlotState::Dropped, Some("0/10".into()));
        let json = serde_json::to_value(&dropped).unwrap();
        assert_eq!(json["state"], "dropped");
        assert!(json.get("created_lsn").is_none() && json["dropped_at"].is_string());
        assert_eq!(key("7300", "s"), "7300/s");
    }

    #[test]
    fn the_error_names_the_topic_the_commands_and_the_flag() {
        let text = LineageError::new("read", "t.lineage", "denied").to_string();
        for needle in [
            "\"t.lineage\"",
            "kafka-topics.sh",
            "kafka-acls.sh",
            "--allow-new-slot",
        ] {
            assert!(text.contains(needle), "{needle}: {text}");
        }
        let kept = LineageError::new("record", "t", "x")
            .slot_kept()
            .to_string();
        assert!(kept.contains("drop-slot"), "{kept}");
    }
}
