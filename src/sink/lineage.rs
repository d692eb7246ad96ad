//! The lineage topic (`--lineage-topic`): one record per (Postgres system identifier, slot)
//! saying the relay created that slot in that cluster, or that `drop-slot` dropped it. It
//! lives on the Kafka side because the relay can always write there (a least-privilege role
//! or a hot standby can write nothing in Postgres) and because it outlives a database
//! failover; a primary, its standbys and a promoted standby share the system identifier.
//! Read in full at start-up (it is small: compacted, one record per key), without a consumer
//! group; written with `acks=all` and awaited before the relay streams. A key's newest record
//! is the one with the highest offset (the topic has one partition), never a producer's
//! timestamp: a clock running ahead or behind must not decide about a slot.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::{Deserialize, Serialize};

use super::ClientCallbacks;
use super::KafkaClients;
use super::cause::Cause;
use super::exactly_once::{Attempt, READ_TIMEOUT, TailReader};

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
    /// The slot's confirmed position when it was dropped: where its relay had delivered
    /// everything (`reshard --finish` meets the new slots there, again when run again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped_lsn: Option<String>,
    /// The resharding that created the slot (a new shard's, before `--finish`) or dropped it
    /// (an old shard's, at `--finish`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reshard: Option<Reshard>,
    /// The relay version that wrote the record.
    pub relay_version: String,
}

/// `outbox-relay reshard --from K --to K'`: moving the outbox from `from` relays to `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reshard {
    /// K, the old relays' count (1: one relay without `--shard`).
    pub from: u32,
    /// K', the new relays' count.
    pub to: u32,
}

impl std::fmt::Display for Reshard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "outbox-relay reshard --from {} --to {}",
            self.from, self.to
        )
    }
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
            dropped_lsn: None,
            reshard: None,
            relay_version: env!("CARGO_PKG_VERSION").to_owned(),
        }
    }

    /// The same record, saying which resharding created or dropped the slot.
    pub fn resharding(mut self, reshard: Option<Reshard>) -> Self {
        self.reshard = reshard;
        self
    }

    /// The same `dropped` record, with the slot's confirmed position when it was dropped.
    pub fn dropped_at_lsn(mut self, lsn: Option<String>) -> Self {
        self.dropped_lsn = lsn.filter(|_| self.state == SlotState::Dropped);
        self
    }

    /// The resharding whose `--finish` dropped the slot, when it retired a fleet of `count`
    /// shards (1: a relay without `--shard`).
    pub fn retired_from(&self, count: u32) -> Option<Reshard> {
        let done = self.reshard?;
        (self.state == SlotState::Dropped && done.from == count).then_some(done)
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

/// What is wrong with the lineage topic, as far as the remedy is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Problem {
    /// Kafka failed the read or the write.
    Kafka(Cause),
    /// The slot's last record is not one the relay writes.
    Unreadable,
    /// The slot's records are in several partitions, which have no order but their producers'
    /// clocks.
    Unordered,
}

/// The lineage topic cannot be read or written, or its record of the slot cannot be used: the
/// relay does not stream.
#[derive(Debug, thiserror::Error)]
#[error("{}", self.describe())]
pub struct LineageError {
    /// `read` or `record`.
    action: &'static str,
    /// The topic.
    topic: String,
    /// What Kafka said, or what is wrong with the record.
    reason: String,
    problem: Problem,
    /// The slot was created and kept.
    kept: bool,
}

impl LineageError {
    fn new(action: &'static str, topic: &str, reason: impl ToString, problem: Problem) -> Self {
        LineageError {
            action,
            topic: topic.to_owned(),
            reason: reason.to_string(),
            problem,
            kept: false,
        }
    }

    /// The slot's last record in `topic` is not one the relay writes (`reason` says which).
    pub fn unreadable(topic: &str, reason: impl ToString) -> Self {
        LineageError::new("read", topic, reason, Problem::Unreadable)
    }

    /// Kafka failed to `action` the topic with `error`.
    fn kafka(action: &'static str, topic: &str, error: &KafkaError) -> Self {
        LineageError::new(action, topic, error, Problem::Kafka(Cause::of(error)))
    }

    /// Says that the slot was created and kept: the next start records and adopts it.
    pub fn slot_kept(mut self) -> Self {
        self.kept = true;
        self
    }

    /// What is wrong.
    pub fn problem(&self) -> Problem {
        self.problem
    }

    /// Whether waiting can fix it: the brokers could not be reached, or did not answer in time.
    pub fn transient(&self) -> bool {
        matches!(self.problem, Problem::Kafka(cause) if cause.transient())
    }

    fn describe(&self) -> String {
        let topic = &self.topic;
        let [create, acls] = topic_commands(topic);
        let head = format!(
            "cannot {} the slot's lineage in Kafka topic {topic:?}: {}",
            self.action, self.reason
        );
        let why = "The relay streams from a slot only once its creation is recorded there, so \
                   that a slot lost in a failover is refused instead of silently replaced by one \
                   starting at \"now\" (--allow-new-slot does not skip this)";
        let kept = match self.kept {
            true => {
                ". The slot was created and kept, so once the topic takes the record the \
                     next start relays from its creation (`outbox-relay drop-slot --yes-i-know` \
                     removes it meanwhile, releasing the WAL it pins)"
            }
            false => "",
        };
        let remedy = match self.problem {
            Problem::Kafka(Cause::Transport) => "Kafka did not answer: check --kafka-brokers, \
                 the network and the brokers; a start once they answer goes on (the slot keeps \
                 the WAL meanwhile, so nothing is lost)"
                .to_owned(),
            Problem::Kafka(Cause::MissingTopic) => format!(
                "The topic does not exist and the broker does not create it: create it \
                 ({create}), or name another with --lineage-topic"
            ),
            Problem::Kafka(Cause::TopicDenied) => {
                format!("The relay's principal may not use the topic: let it ({acls})")
            }
            Problem::Kafka(Cause::GroupDenied | Cause::Other) => format!(
                "Create the topic and let the relay's principal use it ({create}; {acls}), or \
                 name another with --lineage-topic; the -X properties apply to it too"
            ),
            Problem::Unreadable => "The slot does not exist, and the record cannot say whether \
                 it was dropped on purpose or lost. If it was dropped, or you accept that the \
                 events committed since it was lost are not relayed, `outbox-relay drop-slot \
                 --yes-i-know` records the drop over it (dropping nothing when no slot exists) \
                 and the next start creates a fresh slot; --allow-new-slot starts one at once"
                .to_owned(),
            Problem::Unordered => format!(
                "The topic's partition count changed, and records in different partitions have \
                 no order but their producers' clocks, which the relay does not trust. Read the \
                 key's records (kafka-console-consumer.sh --property print.partition=true \
                 --property print.key=true); if the newest says the slot was dropped, or the slot \
                 exists, re-create the topic with one partition ({create})"
            ),
        };
        format!("{head}. {why}{kept}. {remedy}")
    }
}

/// One record of the slot's key read back: where it is, and its value (`None`: a tombstone).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Found {
    partition: i32,
    offset: i64,
    value: Option<Vec<u8>>,
}

/// PURE: the key's newest record: the one with the highest offset, never its producer's
/// timestamp (a writer's clock may run ahead or behind). Records in several partitions (the
/// topic's partition count changed) have no order: those partitions, as the error.
fn newest(found: Vec<Found>) -> Result<Option<Found>, Vec<i32>> {
    let mut partitions: Vec<i32> = found.iter().map(|f| f.partition).collect();
    partitions.sort_unstable();
    partitions.dedup();
    if partitions.len() > 1 {
        return Err(partitions);
    }
    Ok(found.into_iter().max_by_key(|f| f.offset))
}

/// Stops a blocking read when the future waiting for it is dropped.
struct CancelOnDrop(Attempt);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// The latest record of `key` in `topic`; `None` when there is none or the last is a
/// tombstone.
pub async fn read(
    kafka: &KafkaClients,
    topic: &str,
    key: &str,
) -> Result<Option<SlotRecord>, LineageError> {
    read_within(kafka, topic, key, READ_TIMEOUT).await
}

/// [`read`] for at most `timeout`, transport failures waited out within it. Dropping the
/// future stops the read within a second (a shutdown need not wait for it).
pub async fn read_within(
    kafka: &KafkaClients,
    topic: &str,
    key: &str,
    timeout: Duration,
) -> Result<Option<SlotRecord>, LineageError> {
    read_keys(kafka, topic, key, &[], timeout).await?.own
}

/// What one read of several keys found ([`read_keys`]).
#[derive(Debug)]
pub struct KeysRead {
    /// The latest record of the key asked for, or why it cannot be used.
    pub own: Result<Option<SlotRecord>, LineageError>,
    /// The latest record of each other key asked for that has one the relay wrote (the
    /// others' unusable records are left out: they are another slot's to judge).
    pub others: Vec<SlotRecord>,
}

/// The records of `key` and of `others`, read in one pass as [`read_within`] reads one; an
/// error only when the topic cannot be read.
pub async fn read_keys(
    kafka: &KafkaClients,
    topic: &str,
    key: &str,
    others: &[String],
    timeout: Duration,
) -> Result<KeysRead, LineageError> {
    let mut keys = vec![key.to_owned()];
    keys.extend(others.iter().cloned());
    let mut found = read_found(kafka, topic, keys, timeout).await?;
    let own = parse_newest(topic, key, found.remove(key).unwrap_or_default());
    let mut records = Vec::new();
    for other in others {
        let newest = parse_newest(topic, other, found.remove(other).unwrap_or_default());
        if let Ok(Some(record)) = newest {
            records.push(record);
        }
    }
    Ok(KeysRead {
        own,
        others: records,
    })
}

/// Every record of `keys` in `topic`, by key.
async fn read_found(
    kafka: &KafkaClients,
    topic: &str,
    keys: Vec<String>,
    timeout: Duration,
) -> Result<HashMap<String, Vec<Found>>, LineageError> {
    let attempt = Attempt::within(timeout);
    let _cancel = CancelOnDrop(attempt.clone());
    // Read on the blocking pool, which takes owned values.
    let kafka = kafka.clone();
    let reading = topic.to_owned();
    let read = tokio::task::spawn_blocking(move || {
        let reader = TailReader::new(&kafka)
            .map_err(|e| LineageError::new("read", &reading, e, Problem::Kafka(Cause::Other)))?;
        let found = reader.read_all(&reading, &attempt, |msg| {
            let key = keys.iter().find(|k| msg.key() == Some(k.as_bytes()))?;
            let found = Found {
                partition: msg.partition(),
                offset: msg.offset(),
                value: msg.payload().map(<[u8]>::to_vec),
            };
            Some((key.clone(), found))
        });
        found.map_err(|e| LineageError::new("read", &reading, &e, Problem::Kafka(e.cause())))
    });
    let found = read.await.map_err(|e| {
        let reason = format!("the blocking read stopped: {e}");
        LineageError::new("read", topic, reason, Problem::Kafka(Cause::Other))
    })??;
    let mut by_key: HashMap<String, Vec<Found>> = HashMap::new();
    for (key, record) in found {
        by_key.entry(key).or_default().push(record);
    }
    Ok(by_key)
}

/// The newest of `found`, the records of `key`, parsed; `None` when there is none or it is a
/// tombstone.
fn parse_newest(
    topic: &str,
    key: &str,
    found: Vec<Found>,
) -> Result<Option<SlotRecord>, LineageError> {
    let newest = newest(found).map_err(|partitions| {
        let reason = format!("the records of key {key:?} are in partitions {partitions:?}");
        LineageError::new("read", topic, reason, Problem::Unordered)
    })?;
    let Some(Found {
        partition,
        offset,
        value: Some(value),
    }) = newest
    else {
        return Ok(None);
    };
    let record = serde_json::from_slice(&value).map_err(|e| {
        let text = String::from_utf8_lossy(&value).into_owned();
        let reason = format!(
            "the last record of key {key:?} (partition {partition}, offset {offset}) is not one \
             the relay writes ({e}): {text}"
        );
        LineageError::unreadable(topic, reason)
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
    let mut client = kafka.config(&[("acks", "all")]);
    // Bounded, whatever the relay's own producer waits.
    client.set("message.timeout.ms", WRITE_TIMEOUT.as_millis().to_string());
    let producer: FutureProducer<ClientCallbacks> =
        client.create_with_context(kafka.context()).map_err(|e| {
            let reason = kafka.refused(e);
            LineageError::new("record", topic, reason, Problem::Kafka(Cause::Other))
        })?;
    // A record of plain strings always serialises.
    let value = record.map(|r| serde_json::to_vec(r).unwrap_or_default());
    let mut message = FutureRecord::to(topic).key(key);
    if let Some(value) = &value {
        message = message.payload(value);
    }
    producer
        .send(message, WRITE_TIMEOUT)
        .await
        .map_err(|(e, _)| LineageError::kafka("record", topic, &e))?;
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
    fn a_resharding_is_recorded_and_says_which_fleet_it_retired() {
        let reshard = Reshard { from: 2, to: 4 };
        let dropped = SlotRecord::now("s", "7300", SlotState::Dropped, None)
            .resharding(Some(reshard))
            .dropped_at_lsn(Some("0/40".into()));
        let json = serde_json::to_value(&dropped).unwrap();
        assert_eq!(json["reshard"], serde_json::json!({"from": 2, "to": 4}));
        assert_eq!(json["dropped_lsn"], "0/40");
        assert_eq!(serde_json::from_value::<SlotRecord>(json).unwrap(), dropped);
        // An older relay's record, without either, still parses.
        let old =
            r#"{"slot":"s","system_identifier":"7300","state":"dropped","relay_version":"0.1.0"}"#;
        let old: SlotRecord = serde_json::from_str(old).unwrap();
        assert_eq!((old.reshard, old.dropped_lsn.as_deref()), (None, None));
        // A created record carries no dropped position.
        let created = SlotRecord::now("s", "7300", SlotState::Created, Some("0/10".into()))
            .resharding(Some(reshard))
            .dropped_at_lsn(Some("0/40".into()));
        assert_eq!(created.dropped_lsn, None);
        // (record, the fleet's K, the resharding that retired it)
        let cases = [
            (&dropped, 2, Some(reshard)),
            (&dropped, 4, None),
            (&created, 2, None),
            (&old, 2, None),
        ];
        for (record, count, retired) in cases {
            assert_eq!(record.retired_from(count), retired, "{record:?} {count}");
        }
        assert_eq!(reshard.to_string(), "outbox-relay reshard --from 2 --to 4");
    }

    #[test]
    fn each_problem_has_its_own_remedy() {
        let error = |problem| LineageError::new("read", "t.lineage", "why", problem).to_string();
        // (problem, what the message must say, what it must not)
        let table = [
            (
                Problem::Kafka(Cause::Transport),
                "--kafka-brokers",
                "kafka-topics.sh",
            ),
            (
                Problem::Kafka(Cause::MissingTopic),
                "kafka-topics.sh",
                "kafka-acls.sh",
            ),
            (
                Problem::Kafka(Cause::TopicDenied),
                "kafka-acls.sh",
                "kafka-topics.sh",
            ),
            (Problem::Kafka(Cause::Other), "kafka-acls.sh", "drop-slot"),
            (
                Problem::Unreadable,
                "drop-slot --yes-i-know",
                "kafka-acls.sh",
            ),
            (Problem::Unordered, "--partitions 1", "kafka-acls.sh"),
        ];
        for (problem, needle, absent) in table {
            let text = error(problem);
            assert!(text.contains("\"t.lineage\": why"), "{problem:?}: {text}");
            assert!(text.contains("--allow-new-slot"), "{problem:?}: {text}");
            assert!(text.contains(needle), "{problem:?} lacks {needle}: {text}");
            assert!(!text.contains(absent), "{problem:?} has {absent}: {text}");
        }
        let kept = LineageError::new("record", "t", "x", Problem::Kafka(Cause::Transport))
            .slot_kept()
            .to_string();
        assert!(kept.contains("drop-slot"), "{kept}");
    }

    #[test]
    fn only_a_transport_failure_is_worth_waiting_out() {
        let transient = |problem| LineageError::new("read", "t", "x", problem).transient();
        assert!(transient(Problem::Kafka(Cause::Transport)));
        for problem in [
            Problem::Kafka(Cause::MissingTopic),
            Problem::Kafka(Cause::TopicDenied),
            Problem::Kafka(Cause::GroupDenied),
            Problem::Kafka(Cause::Other),
            Problem::Unreadable,
            Problem::Unordered,
        ] {
            assert!(!transient(problem), "{problem:?}");
        }
    }

    #[test]
    fn the_newest_record_is_the_one_with_the_highest_offset() {
        let found = |partition, offset, value: Option<&str>| Found {
            partition,
            offset,
            value: value.map(|v| v.as_bytes().to_vec()),
        };
        // (records in the order read, the newest, or the partitions that make it unknowable)
        let table = [
            (vec![], Ok(None)),
            (
                vec![found(0, 3, Some("a"))],
                Ok(Some(found(0, 3, Some("a")))),
            ),
            (
                vec![found(0, 3, Some("a")), found(0, 9, Some("b"))],
                Ok(Some(found(0, 9, Some("b")))),
            ),
            // Read order is not offset order.
            (
                vec![found(0, 9, Some("b")), found(0, 3, Some("a"))],
                Ok(Some(found(0, 9, Some("b")))),
            ),
            (
                vec![found(0, 3, Some("a")), found(0, 4, None)],
                Ok(Some(found(0, 4, None))),
            ),
            (
                vec![
                    found(1, 3, Some("a")),
                    found(0, 9, Some("b")),
                    found(1, 5, None),
                ],
                Err(vec![0, 1]),
            ),
        ];
        for (records, expected) in table {
            assert_eq!(newest(records.clone()), expected, "{records:?}");
        }
    }
}
