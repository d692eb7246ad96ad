//! Exactly-once delivery without Kafka transactions: the output is the progress record.
//!
//! # The argument
//! In `--delivery exactly-once` mode every record carries `outbox.source`
//! (`<slot>@<Postgres system identifier>`), `outbox.lsn` (the commit LSN of its
//! transaction) and `outbox.seq` (its index within the transaction), and its
//! partition is fixed by its key (Java-compatible murmur2; the event id when the
//! key is NULL), so a replayed event goes to the same partition as before.
//! With the idempotent producer each partition holds, for one producer session,
//! a gap-free prefix of the relay's records for it, in commit order. A new
//! session replays from the slot's confirmed position, which is at or before
//! everything the broker holds. So before the relay sends anything to a
//! partition after (re)starting, it reads that partition's tail back (once,
//! lazily, cached) to find the last record with its own `outbox.source`, and
//! skips every event at or below that `(lsn, seq)`: those are exactly the
//! events the previous session delivered and did not get to acknowledge.
//!
//! # Limits, each detected at start-up of a partition
//! - The partition count changed: the last record found would not hash to the
//!   partition it is in. Replays would land elsewhere; refused.
//! - The tail was removed by retention (the partition's log start is above 0
//!   and no record of ours remains): the relay cannot prove what was sent.
//! - Another writer uses the same `outbox.source`: a record of "ours" lies past
//!   the current end of the WAL. Refused.
//!
//! In each case the relay stops, unless `--exactly-once-fallback at-least-once`
//! lets it continue for that partition without skipping (duplicates possible).
//! The window that remains: a produce request of a killed relay that the broker
//! appends after the new relay has read the tail. Kafka transactions close it
//! by fencing; this design narrows it by reading tails only when needed.

use std::cmp::Ordering;

use crate::lsn::Lsn;

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

/// What the tail of one partition says about a replayed event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Already in the partition: skip it.
    Delivered,
    /// Not there yet: send it.
    Send,
}

/// Whether an event at `position` is already in a partition whose last
/// record of ours is `last`.
pub fn verdict(last: Option<Position>, position: Position) -> Verdict {
    match last.map(|l| position.cmp(&l)) {
        Some(Ordering::Less | Ordering::Equal) => Verdict::Delivered,
        _ => Verdict::Send,
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
    fn events_at_or_below_the_tail_are_skipped() {
        let last = Position {
            lsn: Lsn(100),
            seq: 2,
        };
        let at = |lsn, seq| Position { lsn: Lsn(lsn), seq };
        assert_eq!(verdict(Some(last), at(90, 9)), Verdict::Delivered);
        assert_eq!(verdict(Some(last), at(100, 1)), Verdict::Delivered);
        assert_eq!(verdict(Some(last), at(100, 2)), Verdict::Delivered);
        assert_eq!(verdict(Some(last), at(100, 3)), Verdict::Send);
        assert_eq!(verdict(Some(last), at(101, 0)), Verdict::Send);
        assert_eq!(verdict(None, at(1, 0)), Verdict::Send);
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
        "{topic}/{partition}: its last record from this relay (key {key:?}) belongs to another \
         partition with the current partition count ({partitions}); the topic's partition count \
         changed, so replayed events would land elsewhere. Exactly-once cannot be guaranteed \
         for it"
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
    /// Retention removed the records that would prove what was sent.
    #[error(
        "{topic}/{partition}: no record from this relay remains and the log starts at offset \
         {log_start} (retention removed older records), so what a previous run sent cannot be \
         proven"
    )]
    RetentionGap {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// First offset still present.
        log_start: i64,
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
    /// A reader using the relay's broker list and `-X` properties.
    pub fn new(
        brokers: &str,
        properties: &[(String, String)],
        source_id: String,
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
            source_id,
            timeout: std::time::Duration::from_secs(30),
        })
    }

    /// The last position this relay wrote to `topic`/`partition`, if any.
    pub fn last_position(
        &self,
        topic: &str,
        partition: i32,
        partitions: i32,
        wal_end: Lsn,
    ) -> Result<Option<Position>, TailError> {
        let (low, high) = self.watermarks(topic, partition)?;
        let deadline = std::time::Instant::now() + self.timeout;
        let mut window: i64 = TAIL_WINDOW;
        let mut end = high;
        while end > low {
            let start = (end - window).max(low);
            let found = self.scan(topic, &[(partition, start, end)], deadline)?;
            if let Some(Some(found)) = found.into_iter().next() {
                return self.check(topic, partition, partitions, wal_end, found);
            }
            end = start;
            window = window.saturating_mul(4);
        }
        nothing_of_ours(topic, partition, low)
    }

    /// [`Self::last_position`] of every partition of `topic`, reading their
    /// last records in one pass (one assignment, so one round of fetches
    /// rather than one per partition). A partition whose last records hold
    /// nothing of ours is then read further back on its own.
    pub fn last_positions(
        &self,
        topic: &str,
        partitions: i32,
        wal_end: Lsn,
    ) -> Vec<Result<Option<Position>, TailError>> {
        let deadline = std::time::Instant::now() + self.timeout;
        let mut marks = Vec::new();
        for partition in 0..partitions {
            marks.push(self.watermarks(topic, partition));
        }
        let ranges: Vec<(i32, i64, i64)> = marks
            .iter()
            .zip(0..)
            .filter_map(|(m, p)| m.as_ref().ok().map(|&(low, high)| (p, low, high)))
            .filter(|&(_, low, high)| high > low)
            .map(|(p, low, high)| (p, (high - TAIL_WINDOW).max(low), high))
            .collect();
        let scanned = self.scan(topic, &ranges, deadline);
        marks
            .into_iter()
            .zip(0..)
            .map(|(mark, partition)| {
                let (low, high) = mark?;
                if high <= low {
                    return nothing_of_ours(topic, partition, low);
                }
                let slot = ranges.iter().position(|r| r.0 == partition);
                let found = match (&scanned, slot) {
                    (Ok(found), Some(i)) => found.get(i).cloned().flatten(),
                    _ => None,
                };
                match found {
                    Some(found) => self.check(topic, partition, partitions, wal_end, found),
                    // Nothing of ours in the last records, or the joint read
                    // failed: read this partition on its own.
                    None => self.last_position(topic, partition, partitions, wal_end),
                }
            })
            .collect()
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
    /// returns, per range, the last record written by this relay.
    fn scan(
        &self,
        topic: &str,
        ranges: &[(i32, i64, i64)],
        deadline: std::time::Instant,
    ) -> Result<Vec<Option<Found>>, TailError> {
        use rdkafka::consumer::Consumer;
        use rdkafka::message::{Headers, Message};

        let read_err = |partition: i32, reason: String| TailError::Read {
            topic: topic.to_owned(),
            partition,
            reason,
        };
        let mut found: Vec<Option<Found>> = vec![None; ranges.len()];
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
            let Some(headers) = msg.headers() else {
                continue;
            };
            let (mut src, mut lsn, mut seq, mut id) = (None, None, None, None);
            for h in headers.iter() {
                match h.key {
                    SOURCE_HEADER => src = h.value,
                    LSN_HEADER => lsn = h.value,
                    SEQ_HEADER => seq = h.value,
                    crate::outbox::ID_HEADER => id = h.value,
                    _ => {}
                }
            }
            if src != Some(self.source_id.as_bytes()) {
                continue;
            }
            let Some(position) = lsn.zip(seq).and_then(|(l, s)| Position::from_headers(l, s))
            else {
                continue;
            };
            let key = msg.key().or(id).unwrap_or_default().to_vec();
            if found[i].as_ref().is_none_or(|f| msg.offset() > f.offset) {
                found[i] = Some(Found {
                    offset: msg.offset(),
                    position,
                    key,
                });
            }
        }
        // Stop fetching now rather than at the next assignment, which would
        // otherwise wait for these partitions' fetchers to wind down.
        let _ = self.consumer.unassign();
        Ok(found)
    }

    /// The checks a found position must pass before it is trusted.
    fn check(
        &self,
        topic: &str,
        partition: i32,
        partitions: i32,
        wal_end: Lsn,
        found: Found,
    ) -> Result<Option<Position>, TailError> {
        if partition_for(&found.key, partitions) != partition {
            return Err(TailError::PartitionCountChanged {
                topic: topic.to_owned(),
                partition,
                key: String::from_utf8_lossy(&found.key).into_owned(),
                partitions,
            });
        }
        if found.position.lsn > wal_end {
            return Err(TailError::ForeignWriter {
                topic: topic.to_owned(),
                partition,
                source_id: self.source_id.clone(),
                lsn: found.position.lsn,
                wal_end,
            });
        }
        Ok(Some(found.position))
    }
}

/// A partition with no record of ours left: never written to (fine), or
/// emptied by retention (what was sent cannot be proven).
fn nothing_of_ours(topic: &str, partition: i32, low: i64) -> Result<Option<Position>, TailError> {
    if low > 0 {
        return Err(TailError::RetentionGap {
            topic: topic.to_owned(),
            partition,
            log_start: low,
        });
    }
    Ok(None)
}

/// Records read back at first from each partition's end; doubled fourfold
/// each time nothing of ours is among them.
const TAIL_WINDOW: i64 = 256;

/// The last record of ours in a partition range.
#[derive(Debug, Clone)]
struct Found {
    offset: i64,
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
