//! Exactly-once delivery without Kafka transactions: the output is the progress record.
//!
//! Each record carries its position (`outbox.source`, `outbox.lsn`, `outbox.seq`) and is
//! pinned to a partition by its key, so a replay lands where it went before. After a
//! (re)connect, each partition is read back to a record of ours below the first event's
//! commit LSN (the *floor*); a replayed event is skipped only when its own position is
//! there, as a partition may hold gaps. The limits are in docs/guarantees.md.
//! [`ExactlyOnce`] decides (PURE but for the reads it asks of a [`ReadBack`]); [`TailReader`]
//! reads partitions back for [`KafkaSink`](super::KafkaSink).

mod decision;
mod tail;

use std::collections::HashSet;
use std::future::Future;

use crate::lsn::Lsn;

pub use decision::ExactlyOnce;
pub use tail::TailReader;

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

/// Reading partitions back: what exactly-once needs of Kafka beyond [`Sink`](super::Sink).
/// [`KafkaSink`](super::KafkaSink) or the simulation's in-memory broker.
pub trait ReadBack: Send + Sync + 'static {
    /// The partition count of `topic` (exactly-once pins partitions); fetching
    /// it creates the topic where the broker auto-creates topics.
    fn partition_count(&self, topic: &str) -> impl Future<Output = Result<i32, TailError>> + Send;

    /// Per partition of `topic`, the positions of `source`'s records at or
    /// above `floor` (see the module docs).
    fn tails(
        &self,
        topic: &str,
        source: &str,
        partitions: i32,
        floor: Lsn,
        wal_end: Lsn,
    ) -> impl Future<Output = Vec<Result<HashSet<Position>, TailError>>> + Send;
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
