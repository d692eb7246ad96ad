//! Exactly-once delivery without Kafka transactions: the output is the progress record.
//!
//! Each record carries its position (`outbox.source`, `outbox.lsn`, `outbox.seq`) and is
//! pinned to a partition by its key, so a replay lands where it went before. After a
//! (re)connect, each partition is read back to a record of ours below the first event's
//! commit LSN (the *floor*); a replayed event is skipped only when its own position is
//! there, as a partition may hold gaps. The limits are in docs/guarantees.md.
//! [`ExactlyOnce`] decides; [`TailReader`] reads back for [`KafkaSink`](super::KafkaSink).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::{Sink, SinkError};
use crate::config::ExactlyOnceFallback;
use crate::lsn::Lsn;
use crate::outbox::{ID_HEADER, OutboxRecord};
use crate::source::ServerId;

/// Header naming the relay instance that wrote a record.
pub const SOURCE_HEADER: &str = "outbox.source";
/// Header with the commit LSN of the record's transaction.
pub const LSN_HEADER: &str = "outbox.lsn";
/// Header with the record's index within its transaction.
pub const SEQ_HEADER: &str = "outbox.seq";

/// The partition the Java client (and librdkafka's `murmur2_random`) picks for `key`.
pub fn partition_for(key: &[u8], partitions: i32) -> i32 {
    let positive = murmur2::murmur2(key, murmur2::KAFKA_SEED) & 0x7fff_ffff;
    let count = u32::try_from(partitions.max(1)).unwrap_or(1);
    i32::try_from(positive % count).unwrap_or(0)
}

/// Where an event sits in the commit order: its transaction's commit LSN, then its index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    /// Commit LSN of the event's transaction.
    pub lsn: Lsn,
    /// The event's index within its transaction, from 0.
    pub seq: u32,
}

impl Position {
    /// Parses the `outbox.lsn` / `outbox.seq` header values.
    pub fn from_headers(lsn: &[u8], seq: &[u8]) -> Option<Position> {
        let lsn = std::str::from_utf8(lsn).ok()?.parse().ok()?;
        let seq = std::str::from_utf8(seq).ok()?.parse().ok()?;
        Some(Position { lsn, seq })
    }
}

/// Metadata reads of a topic the broker is still creating before giving up.
const TOPIC_ATTEMPTS: u32 = 20;

/// The pipeline's side: pins each record's partition, tags it with its
/// position, and skips what a partition's tail shows was already delivered.
pub struct ExactlyOnce {
    slot: String,
    /// The `outbox.source` of the stream running now (see [`ExactlyOnce::follow`]).
    source_id: Bytes,
    wal_end: Lsn,
    fallback: ExactlyOnceFallback,
    partitions: HashMap<String, i32>,
    /// Per partition, the positions still to come that are already there;
    /// read once per (re)connect, each used once.
    delivered: HashMap<(String, i32), HashSet<Position>>,
}

impl ExactlyOnce {
    /// The source is set by [`ExactlyOnce::follow`] when the first stream comes up.
    pub fn new(slot: String, fallback: ExactlyOnceFallback) -> Self {
        ExactlyOnce {
            slot,
            source_id: Bytes::new(),
            wal_end: Lsn(u64::MAX),
            fallback,
            partitions: HashMap::new(),
            delivered: HashMap::new(),
        }
    }

    /// Takes the source of a stream on `server`; returns whether it changed
    /// (the first stream, or a promotion), so the tails must be read again.
    pub fn follow(&mut self, server: &ServerId) -> bool {
        let source_id = format!("{}@{}/{}", self.slot, server.system_id, server.timeline);
        if self.source_id == source_id.as_bytes() {
            return false;
        }
        tracing::info!(source = %source_id, "exactly-once delivery: records carry outbox.source/lsn/seq");
        self.source_id = Bytes::from(source_id);
        self.delivered.clear();
        true
    }

    /// Forgets the tails (read again after a reconnect or a takeover, once
    /// the in-flight records have landed), judged against `wal_end` now.
    pub fn reset(&mut self, wal_end: Lsn) {
        self.delivered.clear();
        self.wal_end = wal_end;
    }

    /// Pins and tags `record`, or returns `None` when its partition already holds it.
    pub async fn prepare(
        &mut self,
        sink: &impl Sink,
        mut record: OutboxRecord,
        position: Position,
    ) -> Result<Option<OutboxRecord>, TailError> {
        let partitions = self.partition_count(sink, &record.topic).await?;
        let key = record.key.as_ref().unwrap_or(&record.id);
        let partition = partition_for(key, partitions);
        let slot = (record.topic.clone(), partition);
        if !self.delivered.contains_key(&slot) {
            // Events come in commit order: none still to come sits below this one.
            self.read_tails(sink, &record.topic, partitions, partition, position.lsn)
                .await?;
        }
        let already = self
            .delivered
            .get_mut(&slot)
            .is_some_and(|d| d.remove(&position));
        if already {
            return Ok(None);
        }
        record.partition = Some(partition);
        for (name, value) in [
            (SOURCE_HEADER, self.source_id.clone()),
            (LSN_HEADER, Bytes::from(position.lsn.to_string())),
            (SEQ_HEADER, Bytes::from(position.seq.to_string())),
        ] {
            record.headers.push((Arc::from(name), Some(value)));
        }
        Ok(Some(record))
    }

    /// The topic's partition count, waiting a little for a topic the broker
    /// is still creating (the first event to it must not stop the relay).
    async fn partition_count(&mut self, sink: &impl Sink, topic: &str) -> Result<i32, TailError> {
        use RDKafkaErrorCode as C;
        if let Some(n) = self.partitions.get(topic) {
            return Ok(*n);
        }
        let mut wait = Duration::from_millis(100);
        let mut attempt = 1;
        loop {
            let e = match sink.partition_count(topic).await {
                Ok(n) => {
                    self.partitions.insert(topic.to_owned(), n);
                    return Ok(n);
                }
                Err(e) => e,
            };
            let creating = matches!(
                e.rdkafka_error_code(),
                Some(C::UnknownTopicOrPartition | C::UnknownTopic | C::LeaderNotAvailable)
            );
            if !creating || attempt == TOPIC_ATTEMPTS {
                let reason = format!("cannot read the topic's partition count: {e}");
                return Err(TailError::read(topic, -1, &reason));
            }
            tracing::debug!(topic, error = %e, "topic not there yet; asking again");
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(2));
            attempt += 1;
        }
    }

    /// Reads the tails of all the topic's partitions at once (the others are
    /// likely needed next); `wanted` is the one needed now.
    async fn read_tails(
        &mut self,
        sink: &impl Sink,
        topic: &str,
        partitions: i32,
        wanted: i32,
        floor: Lsn,
    ) -> Result<(), TailError> {
        let source = String::from_utf8_lossy(&self.source_id);
        let read = sink
            .tails(topic, &source, partitions, floor, self.wal_end)
            .await;
        let mut failure = None;
        for (p, result) in (0..partitions).zip(read) {
            match result {
                Ok(delivered) => {
                    self.delivered.insert((topic.to_owned(), p), delivered);
                }
                // A changed partition count concerns every event of the topic;
                // another partition is read again when needed.
                Err(e) if p == wanted || matches!(e, TailError::PartitionCountChanged { .. }) => {
                    failure.get_or_insert(e);
                }
                Err(_) => {}
            }
        }
        let Some(e) = failure else {
            return Ok(());
        };
        if self.fallback == ExactlyOnceFallback::Fail {
            return Err(e);
        }
        tracing::warn!(
            error = %e,
            "exactly-once cannot be guaranteed for this partition; continuing \
             at-least-once for it (--exactly-once-fallback at-least-once)"
        );
        self.delivered
            .entry((topic.to_owned(), wanted))
            .or_default();
        Ok(())
    }
}

/// Why a partition's tail cannot be trusted for deduplication.
#[derive(Debug, thiserror::Error)]
pub enum TailError {
    /// Reading the partition (`-1`: the topic) failed.
    #[error("cannot read the tail of {topic}/{partition}: {reason}")]
    Read {
        /// The topic.
        topic: String,
        /// The partition, or -1 for the whole topic.
        partition: i32,
        /// What went wrong.
        reason: String,
    },
    /// A record of ours hashes to another partition with the current count.
    #[error(
        "{topic}/{partition}: a record from this relay not yet confirmed (key {key:?}) belongs to \
         another partition with the current partition count ({partitions}); the topic's \
         partition count changed, so replayed events would land elsewhere. Exactly-once cannot \
         be guaranteed for it"
    )]
    PartitionCountChanged {
        /// The topic.
        topic: String,
        /// The partition the record was read from.
        partition: i32,
        /// The record's key (or id).
        key: String,
        /// The topic's partition count now.
        partitions: i32,
    },
    /// A record of ours is past the WAL's end: another writer uses our source.
    #[error(
        "{topic}/{partition}: a record with outbox.source {source_id:?} is at commit LSN {lsn}, \
         past the end of the WAL ({wal_end}): another writer uses the same source header"
    )]
    ForeignWriter {
        /// The topic.
        topic: String,
        /// The partition the record was read from.
        partition: i32,
        /// The `outbox.source` header it carries.
        source_id: String,
        /// The record's commit LSN.
        lsn: Lsn,
        /// The WAL's end when the tails were read.
        wal_end: Lsn,
    },
}

impl TailError {
    /// A failed read of `topic`/`partition`.
    pub fn read(topic: &str, partition: i32, reason: &impl ToString) -> Self {
        TailError::Read {
            topic: topic.to_owned(),
            partition,
            reason: reason.to_string(),
        }
    }
}

/// Records read back at first from each partition's end; quadrupled each
/// time nothing of ours below the floor is among them.
const TAIL_WINDOW: i64 = 256;

/// How long one metadata request or one tail read may take.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long `backfill` may spend reading back the records of one topic.
const BACKFILL_READ_TIMEOUT: Duration = Duration::from_secs(600);

/// Reads partitions back to find the records this relay wrote there.
pub struct TailReader {
    consumer: BaseConsumer,
}

impl TailReader {
    /// A reader with the relay's brokers and `-X` connection properties.
    pub fn new(brokers: &str, properties: &[(String, String)]) -> Result<Self, SinkError> {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", brokers)
            .set("group.id", "outbox-relay-tail-reader")
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "true")
            // A tail read ends at the partition's end: do not hold fetches open.
            .set("fetch.wait.max.ms", "10")
            .set("log_level", "3");
        // Connection and security properties, which the reader shares with the producer.
        let shared = [
            "security.",
            "ssl.",
            "sasl.",
            "socket.",
            "broker.",
            "test.mock.",
        ];
        for (k, v) in properties {
            if k == "client.id" || shared.iter().any(|prefix| k.starts_with(prefix)) {
                config.set(k, v);
            }
        }
        let consumer = config
            .create()
            .map_err(|e| SinkError::create(e, properties))?;
        Ok(TailReader { consumer })
    }

    /// Per partition of `topic`, the positions of `source`'s records at or above
    /// `floor`: the events still to come that are already there. The ends of all
    /// partitions are read in one round of fetches; one that needs more is read
    /// further back alone.
    pub fn delivered(
        &self,
        topic: &str,
        source: &str,
        partitions: i32,
        floor: Lsn,
        wal_end: Lsn,
    ) -> Vec<Result<HashSet<Position>, TailError>> {
        let deadline = Instant::now() + READ_TIMEOUT;
        let keep = |msg: &BorrowedMessage<'_>| ours(msg, source);
        let marks: Vec<_> = (0..partitions).map(|p| self.watermarks(topic, p)).collect();
        let ends: Vec<_> = (0..)
            .zip(&marks)
            .filter_map(|(p, mark)| {
                let &(low, high) = mark.as_ref().ok()?;
                Some((p, (high - TAIL_WINDOW).max(low), high))
            })
            .collect();
        // A failed joint read is retried per partition.
        let mut joint = self.scan(topic, &ends, deadline, keep).unwrap_or_default();
        (0..)
            .zip(marks)
            .map(|(partition, mark)| {
                let (low, mut end) = mark?;
                let mut first = joint.remove(&partition);
                let (mut found, mut window) = (HashSet::new(), TAIL_WINDOW);
                // Back from the end in growing windows until a record of ours below the
                // floor. At the log's start without one (never written, or aged out),
                // what was collected is what matters.
                while end > low {
                    let start = (end - window).max(low);
                    let records = match first.take() {
                        Some(records) => records,
                        None => {
                            let range = [(partition, start, end)];
                            let mut alone = self.scan(topic, &range, deadline, keep)?;
                            alone.remove(&partition).unwrap_or_default()
                        }
                    };
                    let mut reached_floor = false;
                    for (position, key) in records {
                        if position.lsn < floor {
                            reached_floor = true;
                            continue;
                        }
                        if partition_for(&key, partitions) != partition {
                            return Err(TailError::PartitionCountChanged {
                                topic: topic.to_owned(),
                                partition,
                                key: String::from_utf8_lossy(&key).into_owned(),
                                partitions,
                            });
                        }
                        if position.lsn > wal_end {
                            return Err(TailError::ForeignWriter {
                                topic: topic.to_owned(),
                                partition,
                                source_id: source.to_owned(),
                                lsn: position.lsn,
                                wal_end,
                            });
                        }
                        found.insert(position);
                    }
                    if reached_floor {
                        break;
                    }
                    end = start;
                    window = window.saturating_mul(4);
                }
                Ok(found)
            })
            .collect()
    }

    /// The event ids of the records of `topic` from `since_ms` (Kafka timestamps) on:
    /// what `backfill --delivery exactly-once` must not send again. A partition that
    /// cannot answer by time (an error, or no offset while its last record is that
    /// recent) is read from its start: reading more only finds more ids.
    pub fn event_ids_since(
        &self,
        topic: &str,
        partitions: i32,
        since_ms: i64,
    ) -> Result<HashSet<Vec<u8>>, TailError> {
        let mut query = TopicPartitionList::new();
        for partition in 0..partitions {
            query
                .add_partition_offset(topic, partition, Offset::Offset(since_ms))
                .map_err(|e| TailError::read(topic, partition, &e))?;
        }
        let by_time = self.consumer.offsets_for_times(query, READ_TIMEOUT).ok();
        let deadline = Instant::now() + BACKFILL_READ_TIMEOUT;
        let mut ranges = Vec::new();
        for partition in 0..partitions {
            let (low, high) = self.watermarks(topic, partition)?;
            let answer = by_time
                .as_ref()
                .and_then(|tpl| tpl.find_partition(topic, partition))
                .filter(|e| e.error().is_ok())
                .map(|e| e.offset());
            let start = match answer {
                Some(Offset::Offset(offset)) => offset.clamp(low, high),
                // No record from that time on, if the last one is older.
                Some(Offset::End) if high > low => {
                    let last = [(partition, high - 1, high)];
                    let read = self.scan(topic, &last, deadline, |m| m.timestamp().to_millis())?;
                    match read.into_values().flatten().next() {
                        Some(at) if at < since_ms => high,
                        _ => low,
                    }
                }
                _ => low,
            };
            ranges.push((partition, start, high));
        }
        let ids = self.scan(topic, &ranges, deadline, |m| {
            event_id(m).map(<[u8]>::to_vec)
        })?;
        Ok(ids.into_values().flatten().collect())
    }

    fn watermarks(&self, topic: &str, partition: i32) -> Result<(i64, i64), TailError> {
        self.consumer
            .fetch_watermarks(topic, partition, READ_TIMEOUT)
            .map_err(|e| TailError::read(topic, partition, &e))
    }

    /// Reads `[start, end)` of each `(partition, start, end)` of `topic`; per
    /// partition, what `keep` takes from its records.
    fn scan<T>(
        &self,
        topic: &str,
        ranges: &[(i32, i64, i64)],
        deadline: Instant,
        keep: impl Fn(&BorrowedMessage<'_>) -> Option<T>,
    ) -> Result<HashMap<i32, Vec<T>>, TailError> {
        let mut found: HashMap<i32, Vec<T>> = ranges.iter().map(|r| (r.0, Vec::new())).collect();
        // The partitions still being read, each with its end.
        let mut pending: HashMap<i32, i64> = ranges
            .iter()
            .filter(|&&(_, start, end)| start < end)
            .map(|&(partition, _, end)| (partition, end))
            .collect();
        let Some(&(first, _, _)) = ranges.first() else {
            return Ok(found);
        };
        let mut tpl = TopicPartitionList::new();
        for &(partition, start, _) in ranges {
            tpl.add_partition_offset(topic, partition, Offset::Offset(start))
                .map_err(|e| TailError::read(topic, partition, &e))?;
        }
        self.consumer
            .assign(&tpl)
            .map_err(|e| TailError::read(topic, first, &e))?;
        while let Some(&partition) = pending.keys().next() {
            if Instant::now() > deadline {
                return Err(TailError::read(topic, partition, &"timed out"));
            }
            let msg = match self.consumer.poll(Duration::from_millis(200)) {
                None => continue,
                Some(Ok(msg)) => msg,
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    pending.remove(&p);
                    continue;
                }
                Some(Err(e)) => return Err(TailError::read(topic, first, &e)),
            };
            // Messages of a previously assigned partition may still arrive.
            let p = msg.partition();
            let Some(&end) = pending.get(&p).filter(|_| msg.topic() == topic) else {
                continue;
            };
            if msg.offset() + 1 >= end {
                pending.remove(&p);
            }
            if msg.offset() < end {
                found.entry(p).or_default().extend(keep(&msg));
            }
        }
        // Stop fetching now rather than at the next assignment, which would
        // otherwise wait for these partitions' fetchers to wind down.
        let _ = self.consumer.unassign();
        Ok(found)
    }
}

/// `msg` as a record of `source`, when it is one: its position and its key (or id).
fn ours(msg: &BorrowedMessage<'_>, source: &str) -> Option<(Position, Vec<u8>)> {
    let (mut src, mut lsn, mut seq) = (None, None, None);
    for h in msg.headers().into_iter().flat_map(|h| h.iter()) {
        match h.key {
            SOURCE_HEADER => src = h.value,
            LSN_HEADER => lsn = h.value,
            SEQ_HEADER => seq = h.value,
            _ => {}
        }
    }
    if src != Some(source.as_bytes()) {
        return None;
    }
    let position = Position::from_headers(lsn?, seq?)?;
    let key = msg.key().or(event_id(msg)).unwrap_or_default().to_vec();
    Some((position, key))
}

fn event_id<'a>(msg: &'a BorrowedMessage<'_>) -> Option<&'a [u8]> {
    let mut headers = msg.headers().into_iter().flat_map(|h| h.iter());
    headers.find(|h| h.key == ID_HEADER).and_then(|h| h.value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_the_java_client() {
        // Vectors from Kafka's UtilsTest.testMurmur2.
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ];
        for (input, expected) in cases {
            assert_eq!(
                murmur2::murmur2(input, murmur2::KAFKA_SEED) as i32,
                expected,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn partitions_are_stable_and_in_range() {
        for key in [&b"order-1"[..], b"", b"x"] {
            let p = partition_for(key, 7);
            assert!((0..7).contains(&p));
            assert_eq!(p, partition_for(key, 7));
        }
        assert_eq!(partition_for(b"anything", 1), 0);
    }

    #[test]
    fn a_refused_reader_property_shows_the_key_never_the_value() {
        let properties = [("sasl.pasword".to_owned(), "hunter2".to_owned())];
        let err = TailReader::new("127.0.0.1:1", &properties)
            .err()
            .map(|e| format!("{e} {e:?}"))
            .unwrap_or_default();
        assert!(err.contains("sasl.pasword"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn positions_parse_from_headers() {
        assert_eq!(
            Position::from_headers(b"0/64", b"2"),
            Some(Position {
                lsn: Lsn(100),
                seq: 2
            })
        );
        assert_eq!(Position::from_headers(b"junk", b"2"), None);
    }
}
