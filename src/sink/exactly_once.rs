//! Exactly-once delivery without Kafka transactions: the output is the progress record.
//!
//! All of it lives here: [`ExactlyOnce`] decides (pin, tag, skip) and reads
//! through the [`Sink`] trait's `partition_count` and `tails`, which
//! [`KafkaSink`](super::KafkaSink) serves with a [`TailReader`].
//!
//! # The argument
//! In `--delivery exactly-once` mode every record carries `outbox.source`
//! (`<slot>@<Postgres system identifier>/<timeline>`), `outbox.lsn` (the commit LSN of its
//! transaction) and `outbox.seq` (its index within the transaction): a
//! position that names one event exactly. Its partition is fixed by its key
//! (Java-compatible murmur2; the event id when the key is NULL), so a replayed
//! event goes to the same partition as before. A new session replays from the
//! slot's confirmed position, in commit order. So before the relay sends the
//! first event to a topic after (re)starting, it reads the topic's partitions
//! back from their ends (once, lazily) until each meets a record of ours
//! below that event's commit LSN (the *floor*: no event still to come sits
//! below it), or the log's start, and collects the positions of the records
//! of ours at or above it. A replayed event is skipped only when its
//! own position is among them: a partition is not assumed to hold a gap-free
//! run of our records (one refused delivery while a later one is accepted, a
//! `message.timeout.ms` expiry, or a dead-letter record lost in a crash each
//! leave a gap), so a record of ours above an event proves nothing about it.
//!
//! # Limits, each detected when a topic's tails are read
//! - The partition count changed: a record of ours at or above the floor does
//!   not hash to the partition it is in. Replays would land elsewhere (and be
//!   sent again); refused for the whole topic.
//! - Another writer uses the same `outbox.source`: a record of "ours" lies past
//!   the current end of the WAL. Refused.
//!
//! In each case the relay stops, unless `--exactly-once-fallback at-least-once`
//! lets it continue for that partition without skipping (duplicates possible).
//! What remains open (each a duplicate, never a loss): a produce request of a
//! killed relay that the broker appends after the new relay has read the tail
//! (Kafka transactions close it by fencing; reading tails only when needed
//! narrows it); records of ours at or above the floor that retention removed
//! before the restart; and a refused event re-sent above later records of
//! ours that are still unacknowledged when the relay stops again (the next
//! read-back may stop at the re-sent record and send those later ones again).
//! After a promotion, only records of the new timeline count: the new
//! primary's WAL diverges from the old one's at the switch point, so an old
//! record above it may share a position with a new event. Events below the
//! switch point that the old timeline had delivered are sent again.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::Sink;
use crate::config::ExactlyOnceFallback;
use crate::lsn::Lsn;
use crate::outbox::OutboxRecord;
use crate::source::ServerId;

/// Header naming the relay instance that wrote a record.
pub const SOURCE_HEADER: &str = "outbox.source";
/// Header with the commit LSN of the record's transaction.
pub const LSN_HEADER: &str = "outbox.lsn";
/// Header with the record's index within its transaction.
pub const SEQ_HEADER: &str = "outbox.seq";

/// Kafka's murmur2 (the Java client's `Utils.murmur2`), as used by its default
/// partitioner and librdkafka's `murmur2_random`.
pub fn murmur2(data: &[u8]) -> u32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h: u32 = SEED ^ (data.len() as u32);
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        for (i, b) in tail.iter().enumerate().rev() {
            h ^= u32::from(*b) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

/// The partition the Java client (and librdkafka's `murmur2_random`) picks for `key`.
pub fn partition_for(key: &[u8], partitions: i32) -> i32 {
    let positive = murmur2(key) & 0x7fff_ffff;
    let count = u32::try_from(partitions.max(1)).unwrap_or(1);
    i32::try_from(positive % count).unwrap_or(0)
}

/// Where an event sits in the commit order: its transaction's commit LSN, then its index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    /// Commit LSN of the transaction.
    pub lsn: Lsn,
    /// Index within the transaction.
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

/// Metadata reads of a topic that does not exist yet (a broker creating it
/// on first use answers so for a moment) before the relay gives up.
const TOPIC_ATTEMPTS: u32 = 20;

/// The pipeline's side: per-run state that pins each record's partition,
/// tags it with its position, and skips what a partition's tail shows was
/// already delivered. Reads go through the [`Sink`], so a simulated broker serves them.
pub struct ExactlyOnce {
    slot: String,
    /// `<slot>@<system identifier>/<timeline>` of the stream running now:
    /// only records written on this timeline prove delivery, since a promoted
    /// standby's WAL diverges from the old primary's at the switch point and
    /// reuses its positions.
    source_id: Bytes,
    wal_end: Lsn,
    fallback: ExactlyOnceFallback,
    partitions: HashMap<String, i32>,
    /// Per partition, the positions of events still to come that are already
    /// there; read once per (re)connect, each entry used once.
    delivered: HashMap<(String, i32), HashSet<Position>>,
    /// Events skipped because a previous run had delivered them.
    pub skipped: u64,
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
            skipped: 0,
        }
    }

    /// Takes the source of a stream that came up on `server`; returns whether
    /// it changed (the first stream, or a promotion), so that the tails must
    /// be read again.
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

    /// Forgets what the tails said: after a reconnect or a takeover they are
    /// read again (once the in-flight records have landed), judged against
    /// the WAL's end now.
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
            // Events come in commit order: no later one sits below this one,
            // so records of ours below it need not be read.
            self.read_tails(sink, &record.topic, partitions, partition, position.lsn)
                .await?;
        }
        if self
            .delivered
            .get_mut(&slot)
            .is_some_and(|d| d.remove(&position))
        {
            self.skipped += 1;
            return Ok(None);
        }
        record.partition = Some(partition);
        record
            .headers
            .push((Arc::from(SOURCE_HEADER), Some(self.source_id.clone())));
        record.headers.push((
            Arc::from(LSN_HEADER),
            Some(Bytes::from(position.lsn.to_string())),
        ));
        record.headers.push((
            Arc::from(SEQ_HEADER),
            Some(Bytes::from(position.seq.to_string())),
        ));
        Ok(Some(record))
    }

    /// The topic's partition count, waiting a little for a topic the broker
    /// is still creating (the first event to it must not stop the relay).
    async fn partition_count(&mut self, sink: &impl Sink, topic: &str) -> Result<i32, TailError> {
        use rdkafka::types::RDKafkaErrorCode as C;
        if let Some(n) = self.partitions.get(topic) {
            return Ok(*n);
        }
        let mut wait = Duration::from_millis(100);
        let mut attempt = 1;
        loop {
            match sink.partition_count(topic).await {
                Ok(n) => {
                    self.partitions.insert(topic.to_owned(), n);
                    return Ok(n);
                }
                Err(e)
                    if attempt < TOPIC_ATTEMPTS
                        && matches!(
                            e.rdkafka_error_code(),
                            Some(
                                C::UnknownTopicOrPartition
                                    | C::UnknownTopic
                                    | C::LeaderNotAvailable
                            )
                        ) =>
                {
                    tracing::debug!(topic, error = %e, "topic not there yet; asking again");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(2));
                    attempt += 1;
                }
                Err(e) => {
                    return Err(TailError::Read {
                        topic: topic.to_owned(),
                        partition: -1,
                        reason: format!("cannot read the topic's partition count: {e}"),
                    });
                }
            }
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
                    tracing::debug!(
                        topic,
                        partition = p,
                        replayed_present = delivered.len(),
                        "read partition tail"
                    );
                    self.delivered.insert((topic.to_owned(), p), delivered);
                }
                // A changed partition count moves replayed events between
                // partitions: it concerns every event of the topic.
                Err(e) if p == wanted || matches!(e, TailError::PartitionCountChanged { .. }) => {
                    failure.get_or_insert(e);
                }
                // Another partition is read again, and its failure reported, when needed.
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
                murmur2(input) as i32,
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

/// Why a partition's tail cannot be trusted for deduplication.
#[derive(Debug, thiserror::Error)]
pub enum TailError {
    /// Reading the partition failed.
    #[error("cannot read the tail of {topic}/{partition}: {reason}")]
    Read {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// What went wrong.
        reason: String,
    },
    /// The partition count changed since the record was written.
    #[error(
        "{topic}/{partition}: a record from this relay not yet confirmed (key {key:?}) belongs to \
         another partition with the current partition count ({partitions}); the topic's \
         partition count changed, so replayed events would land elsewhere. Exactly-once cannot \
         be guaranteed for it"
    )]
    PartitionCountChanged {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// The record's key (or id).
        key: String,
        /// Current partition count.
        partitions: i32,
    },
    /// A record carries our source header but a position we cannot have written yet.
    #[error(
        "{topic}/{partition}: a record with outbox.source {source_id:?} is at commit LSN {lsn}, \
         past the end of the WAL ({wal_end}): another writer uses the same source header"
    )]
    ForeignWriter {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// The source header.
        source_id: String,
        /// The impossible LSN.
        lsn: Lsn,
        /// The current end of the WAL.
        wal_end: Lsn,
    },
}

/// Reads partitions back to find the last record this relay wrote there.
pub struct TailReader {
    consumer: rdkafka::consumer::BaseConsumer,
    source_id: String,
    timeout: std::time::Duration,
}

impl TailReader {
    /// A reader using the relay's broker list and `-X` properties; it knows
    /// records as its own once [`TailReader::set_source`] names them.
    pub fn new(
        brokers: &str,
        properties: &[(String, String)],
    ) -> Result<Self, rdkafka::error::KafkaError> {
        let mut config = rdkafka::ClientConfig::new();
        config
            .set("bootstrap.servers", brokers)
            .set("group.id", "outbox-relay-tail-reader")
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "true")
            // A tail read ends at the partition's end: do not let the broker
            // hold each fetch open waiting for more data.
            .set("fetch.wait.max.ms", "10")
            .set("log_level", "3");
        // Security settings apply to the reader too; producer-only properties
        // are ignored by librdkafka's consumer with a warning.
        for (k, v) in properties {
            if is_client_property(k) {
                config.set(k, v);
            }
        }
        Ok(TailReader {
            consumer: config.create()?,
            source_id: String::new(),
            timeout: std::time::Duration::from_secs(30),
        })
    }

    /// The `outbox.source` of the records that count as this relay's.
    pub fn set_source(&mut self, source_id: String) {
        self.source_id = source_id;
    }

    /// The positions of the records of ours at or above `floor` (the commit
    /// LSN of the next event to send) in each partition of `topic`: the
    /// events still to come that are already there. The last
    /// records of every partition are read in one pass (one assignment, so one
    /// round of fetches rather than one per partition); a partition that needs
    /// more is then read further back on its own.
    pub fn delivered(
        &self,
        topic: &str,
        partitions: i32,
        floor: Lsn,
        wal_end: Lsn,
    ) -> Vec<Result<HashSet<Position>, TailError>> {
        let deadline = std::time::Instant::now() + self.timeout;
        let marks: Vec<_> = (0..partitions).map(|p| self.watermarks(topic, p)).collect();
        let ranges: Vec<(i32, i64, i64)> = marks
            .iter()
            .zip(0..)
            .filter_map(|(m, p)| m.as_ref().ok().map(|&(low, high)| (p, low, high)))
            .filter(|&(_, low, high)| high > low)
            .map(|(p, low, high)| (p, (high - TAIL_WINDOW).max(low), high))
            .collect();
        let mut scanned = self.scan(topic, &ranges, deadline, |m| self.ours(m)).ok();
        let read = ReadBack {
            topic,
            partitions,
            floor,
            wal_end,
            deadline,
        };
        marks
            .into_iter()
            .zip(0..)
            .map(|(mark, partition)| {
                let (low, high) = mark?;
                // A failed joint read is retried per partition.
                let first = ranges
                    .iter()
                    .position(|r| r.0 == partition)
                    .and_then(|i| scanned.as_mut().map(|s| std::mem::take(&mut s[i])));
                self.read_back(&read, partition, (low, high), first)
            })
            .collect()
    }

    /// Reads `partition` back from its end in growing windows until a record
    /// of ours below the floor (or the log's start), starting with the
    /// records of the first window when the joint pass read them.
    fn read_back(
        &self,
        read: &ReadBack<'_>,
        partition: i32,
        (low, high): (i64, i64),
        mut first: Option<Vec<Found>>,
    ) -> Result<HashSet<Position>, TailError> {
        let mut delivered = HashSet::new();
        let (mut end, mut window) = (high, TAIL_WINDOW);
        while end > low {
            let start = (end - window).max(low);
            let records = match first.take() {
                Some(records) => records,
                None => self
                    .scan(read.topic, &[(partition, start, end)], read.deadline, |m| {
                        self.ours(m)
                    })?
                    .pop()
                    .unwrap_or_default(),
            };
            let mut reached_floor = false;
            for found in records {
                if found.position.lsn < read.floor {
                    reached_floor = true;
                } else {
                    self.check(read, partition, &found)?;
                    delivered.insert(found.position);
                }
            }
            if reached_floor {
                break;
            }
            end = start;
            window = window.saturating_mul(4);
        }
        // At the log's start with nothing of ours below the floor: never
        // written to, or older records aged out by retention. Either way the
        // records that matter (at or above the floor) are those collected.
        Ok(delivered)
    }

    fn watermarks(&self, topic: &str, partition: i32) -> Result<(i64, i64), TailError> {
        use rdkafka::consumer::Consumer;
        self.consumer
            .fetch_watermarks(topic, partition, self.timeout)
            .map_err(|e| TailError::Read {
                topic: topic.to_owned(),
                partition,
                reason: e.to_string(),
            })
    }

    /// Reads `[start, end)` of each `(partition, start, end)` of `topic` and
    /// returns, per range, what `keep` takes from its records.
    fn scan<T: Clone>(
        &self,
        topic: &str,
        ranges: &[(i32, i64, i64)],
        deadline: std::time::Instant,
        keep: impl Fn(&rdkafka::message::BorrowedMessage<'_>) -> Option<T>,
    ) -> Result<Vec<Vec<T>>, TailError> {
        use rdkafka::consumer::Consumer;
        use rdkafka::message::Message;

        let read_err = |partition: i32, reason: String| TailError::Read {
            topic: topic.to_owned(),
            partition,
            reason,
        };
        let mut found: Vec<Vec<T>> = vec![Vec::new(); ranges.len()];
        if ranges.is_empty() {
            return Ok(found);
        }
        let mut tpl = rdkafka::TopicPartitionList::new();
        for &(partition, start, _) in ranges {
            tpl.add_partition_offset(topic, partition, rdkafka::Offset::Offset(start))
                .map_err(|e| read_err(partition, e.to_string()))?;
        }
        self.consumer
            .assign(&tpl)
            .map_err(|e| read_err(ranges[0].0, e.to_string()))?;
        let mut done: Vec<bool> = ranges.iter().map(|&(_, start, end)| start >= end).collect();
        let index_of = |t: &str, p: i32| {
            if t == topic {
                ranges.iter().position(|r| r.0 == p)
            } else {
                None
            }
        };
        while done.iter().any(|d| !d) {
            if std::time::Instant::now() > deadline {
                let pending = ranges[done.iter().position(|d| !d).unwrap_or(0)].0;
                return Err(read_err(pending, "timed out".to_owned()));
            }
            let Some(result) = self.consumer.poll(std::time::Duration::from_millis(200)) else {
                continue;
            };
            let msg = match result {
                Ok(msg) => msg,
                Err(rdkafka::error::KafkaError::PartitionEOF(p)) => {
                    // The end of one of ours, or of a previously assigned partition.
                    if let Some(i) = index_of(topic, p) {
                        done[i] = true;
                    }
                    continue;
                }
                Err(e) => return Err(read_err(ranges[0].0, e.to_string())),
            };
            // Messages still buffered from a previously assigned partition.
            let Some(i) = index_of(msg.topic(), msg.partition()) else {
                continue;
            };
            let end = ranges[i].2;
            if msg.offset() + 1 >= end {
                done[i] = true;
            }
            if msg.offset() >= end {
                continue;
            }
            found[i].extend(keep(&msg));
        }
        // Stop fetching now rather than at the next assignment, which would
        // otherwise wait for these partitions' fetchers to wind down.
        let _ = self.consumer.unassign();
        Ok(found)
    }

    /// `msg` as a record of ours, when it is one.
    fn ours(&self, msg: &rdkafka::message::BorrowedMessage<'_>) -> Option<Found> {
        use rdkafka::message::Message;
        let (mut src, mut lsn, mut seq) = (None, None, None);
        for h in headers(msg) {
            match h.key {
                SOURCE_HEADER => src = h.value,
                LSN_HEADER => lsn = h.value,
                SEQ_HEADER => seq = h.value,
                _ => {}
            }
        }
        if src != Some(self.source_id.as_bytes()) {
            return None;
        }
        let position = Position::from_headers(lsn?, seq?)?;
        let key = msg.key().or(event_id(msg)).unwrap_or_default().to_vec();
        Some(Found { position, key })
    }

    /// The event ids (`id` headers) of the records of `topic`'s partitions
    /// from `since_ms` (Kafka timestamps, in Unix milliseconds) to their
    /// ends: what `backfill --delivery exactly-once` must not send again.
    ///
    /// A partition is read from the offset the broker gives for that time.
    /// One that cannot answer by time (an error, or no offset while the last
    /// record is that recent) is read from its start: reading more only finds
    /// more ids.
    pub fn event_ids_since(
        &self,
        topic: &str,
        partitions: i32,
        since_ms: i64,
    ) -> Result<HashSet<Vec<u8>>, TailError> {
        use rdkafka::consumer::Consumer;
        let read_err = |partition: i32, reason: String| TailError::Read {
            topic: topic.to_owned(),
            partition,
            reason,
        };
        let mut query = rdkafka::TopicPartitionList::new();
        for partition in 0..partitions {
            query
                .add_partition_offset(topic, partition, rdkafka::Offset::Offset(since_ms))
                .map_err(|e| read_err(partition, e.to_string()))?;
        }
        let by_time = self.consumer.offsets_for_times(query, self.timeout).ok();
        let deadline = std::time::Instant::now() + BACKFILL_READ_TIMEOUT;
        let mut ranges = Vec::new();
        for partition in 0..partitions {
            let (low, high) = self.watermarks(topic, partition)?;
            let answer = by_time
                .as_ref()
                .and_then(|tpl| tpl.find_partition(topic, partition))
                .filter(|e| e.error().is_ok())
                .map(|e| e.offset());
            let start = match answer {
                Some(rdkafka::Offset::Offset(offset)) => offset.clamp(low, high),
                // No record from that time on, if the last one is older.
                Some(rdkafka::Offset::End) if high > low => {
                    let last = self.scan(topic, &[(partition, high - 1, high)], deadline, |m| {
                        rdkafka::message::Message::timestamp(m).to_millis()
                    })?;
                    match last.concat().first() {
                        Some(&at) if at < since_ms => high,
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
        Ok(ids.into_iter().flatten().collect())
    }

    /// The checks a record of ours at or above the floor must pass.
    fn check(&self, read: &ReadBack<'_>, partition: i32, found: &Found) -> Result<(), TailError> {
        if partition_for(&found.key, read.partitions) != partition {
            return Err(TailError::PartitionCountChanged {
                topic: read.topic.to_owned(),
                partition,
                key: String::from_utf8_lossy(&found.key).into_owned(),
                partitions: read.partitions,
            });
        }
        if found.position.lsn > read.wal_end {
            return Err(TailError::ForeignWriter {
                topic: read.topic.to_owned(),
                partition,
                source_id: self.source_id.clone(),
                lsn: found.position.lsn,
                wal_end: read.wal_end,
            });
        }
        Ok(())
    }
}

/// What one read-back of a topic's tails judges against.
struct ReadBack<'a> {
    topic: &'a str,
    partitions: i32,
    floor: Lsn,
    wal_end: Lsn,
    deadline: std::time::Instant,
}

/// Records read back at first from each partition's end; doubled fourfold
/// each time nothing of ours is among them.
const TAIL_WINDOW: i64 = 256;

/// How long `backfill` may spend reading back the records of one topic.
const BACKFILL_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// A record's headers, none when it has none.
fn headers<'a>(
    msg: &'a rdkafka::message::BorrowedMessage<'_>,
) -> impl Iterator<Item = rdkafka::message::Header<'a, &'a [u8]>> {
    use rdkafka::message::{Headers, Message};
    msg.headers().into_iter().flat_map(|h| h.iter())
}

/// A record's event id (the mapping's `id` header).
fn event_id<'a>(msg: &'a rdkafka::message::BorrowedMessage<'_>) -> Option<&'a [u8]> {
    headers(msg)
        .find(|h| h.key == crate::outbox::ID_HEADER)
        .and_then(|h| h.value)
}

/// A record of ours read back.
#[derive(Debug, Clone)]
struct Found {
    position: Position,
    key: Vec<u8>,
}

/// Connection and security properties, which the tail reader shares with the producer.
fn is_client_property(key: &str) -> bool {
    key.starts_with("security.")
        || key.starts_with("ssl.")
        || key.starts_with("sasl.")
        || key.starts_with("socket.")
        || key.starts_with("broker.")
        || key == "client.id"
        || key.starts_with("test.mock.")
}
