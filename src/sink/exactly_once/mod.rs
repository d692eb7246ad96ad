//! Exactly-once delivery without Kafka transactions: the output is the progress record.
//!
//! Each record carries its position (`outbox.source`, `outbox.lsn`, `outbox.change`) and is
//! pinned to a partition by its key, so a replay lands where it went before. The position is
//! the WAL's own (the commit, then the change's LSN and index there), so it names one event
//! whatever the relay is configured to relay. After a (re)connect each partition is read back
//! ([`window`]) to a record of this relay's older than the first event's commit LSN (the
//! *floor*); a replayed event is skipped only when its own position is there, as a partition
//! may hold gaps. The limits are in docs/guarantees.md. [`ExactlyOnce`] decides (PURE but for
//! the reads it asks of a [`ReadBack`]); [`TailReader`] reads partitions for
//! [`KafkaSink`](super::KafkaSink).

mod decision;
mod tail;
pub mod window;

use std::future::Future;

use rdkafka::error::KafkaError;

use crate::lsn::Lsn;
use crate::outbox::ID_HEADER;
use crate::sink::cause::Cause;

pub use decision::ExactlyOnce;
pub use tail::{Attempt, READ_TIMEOUT, TailReader};
pub use window::Tail;

/// Header naming the relay instance that wrote a record: `<slot>@<system id>/<timeline>`.
pub const SOURCE_HEADER: &str = "outbox.source";
/// Header with the commit LSN of the record's transaction.
pub const LSN_HEADER: &str = "outbox.lsn";
/// Header with the event's own WAL position and its index there, `<LSN>:<index>`. It
/// replaced `outbox.seq` (an index among the configured events), so a record written
/// before never counts as another event delivered.
pub const CHANGE_HEADER: &str = "outbox.change";

/// The partition the Java client (and librdkafka's `murmur2_random`) picks for `key`.
pub fn partition_for(key: &[u8], partitions: i32) -> i32 {
    let positive = murmur2::murmur2(key, murmur2::KAFKA_SEED) & 0x7fff_ffff;
    let count = u32::try_from(partitions.max(1)).unwrap_or(1);
    i32::try_from(positive % count).unwrap_or(0)
}

/// Where an event sits in the WAL, whatever the relay is configured to relay: its
/// transaction's commit, then its own change. Ordered by commit, then change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    /// Commit LSN of the event's transaction.
    pub lsn: Lsn,
    /// The WAL position of the event's insert or message (pgoutput's XLogData start).
    pub change: Lsn,
    /// The event's index among its transaction's events at `change`: a multi-insert (`COPY`)
    /// logs many rows of one table in one WAL record.
    pub index: u32,
}

impl Position {
    /// Parses the `outbox.lsn` / `outbox.change` header values.
    pub fn from_headers(lsn: &[u8], change: &[u8]) -> Option<Position> {
        let lsn = std::str::from_utf8(lsn).ok()?.parse().ok()?;
        let (change, index) = std::str::from_utf8(change).ok()?.split_once(':')?;
        Some(Position {
            lsn,
            change: change.parse().ok()?,
            index: index.parse().ok()?,
        })
    }

    /// The `outbox.change` header value.
    pub fn change_header(&self) -> String {
        format!("{}:{}", self.change, self.index)
    }
}

/// A record read back, as the running source sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Written by the running source: its position, and its key (the id when it has none).
    Ours(Position, Vec<u8>),
    /// Written by this relay's slot on this server, but not by the running source: on an
    /// earlier timeline, or before `outbox.change`. It proves nothing, but what the
    /// running source wrote lies after it.
    Earlier,
    /// Anyone else's.
    Foreign,
}

impl Seen {
    /// How `source` (`<slot>@<system id>/<timeline>`) sees a record with these headers and key.
    pub fn classify<'a>(
        source: &str,
        headers: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>,
        key: Option<&[u8]>,
    ) -> Seen {
        let (mut src, mut lsn, mut change, mut id) = (None, None, None, None);
        for (name, value) in headers {
            match name {
                SOURCE_HEADER => src = value,
                LSN_HEADER => lsn = value,
                CHANGE_HEADER => change = value,
                ID_HEADER => id = id.or(value),
                _ => {}
            }
        }
        let Some(src) = src else {
            return Seen::Foreign;
        };
        // The slot on this server: the source up to its timeline.
        let lineage = source.rfind('/').map_or(source, |at| &source[..=at]);
        if src != source.as_bytes() {
            return match src.starts_with(lineage.as_bytes()) {
                true => Seen::Earlier,
                false => Seen::Foreign,
            };
        }
        match lsn
            .zip(change)
            .and_then(|(l, c)| Position::from_headers(l, c))
        {
            Some(position) => Seen::Ours(position, key.or(id).unwrap_or_default().to_vec()),
            None => Seen::Earlier,
        }
    }
}

/// Reading partitions back: what exactly-once needs of Kafka beyond [`Sink`](super::Sink).
/// [`KafkaSink`](super::KafkaSink) or the simulation's in-memory broker.
pub trait ReadBack: Send + Sync + 'static {
    /// The partition count of `topic` (exactly-once pins partitions); fetching
    /// it creates the topic where the broker auto-creates topics.
    fn partition_count(&self, topic: &str) -> impl Future<Output = Result<i32, TailError>> + Send;

    /// Per partition of `topic`, what [`window::tails`] finds of `source`'s
    /// records at or above `floor`.
    fn tails(
        &self,
        topic: &str,
        source: &str,
        partitions: i32,
        floor: Lsn,
        wal_end: Lsn,
    ) -> impl Future<Output = Vec<Result<Tail, TailError>>> + Send;
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
        /// Its kind, for the remedy and whether waiting helps.
        cause: Cause,
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
    /// A failed read of `topic`/`partition`, for a reason other than Kafka's.
    pub fn read(topic: &str, partition: i32, reason: &impl ToString) -> Self {
        TailError::Read {
            topic: topic.to_owned(),
            partition,
            reason: reason.to_string(),
            cause: Cause::Other,
        }
    }

    /// A read of `topic`/`partition` that librdkafka failed with `error`, classified.
    pub fn kafka(topic: &str, partition: i32, error: &KafkaError) -> Self {
        TailError::Read {
            topic: topic.to_owned(),
            partition,
            reason: error.to_string(),
            cause: Cause::of(error),
        }
    }

    /// What kind of failure: [`Cause::Other`] for all but a failed read.
    pub fn cause(&self) -> Cause {
        match self {
            TailError::Read { cause, .. } => *cause,
            _ => Cause::Other,
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
        let position = Position {
            lsn: Lsn(100),
            change: Lsn(0x1_0000_0050),
            index: 2,
        };
        assert_eq!(position.change_header(), "1/50:2");
        assert_eq!(Position::from_headers(b"0/64", b"1/50:2"), Some(position));
        assert_eq!(Position::from_headers(b"junk", b"1/50:2"), None);
        // `outbox.seq`'s values, from before `outbox.change`.
        assert_eq!(Position::from_headers(b"0/64", b"2"), None);
    }

    #[test]
    fn records_are_ours_earlier_or_foreign_by_source_and_scheme() {
        let source = "outbox_relay@7300/2";
        let seen = |src: &str, lsn: &str, change: Option<&str>| {
            let mut headers = vec![
                (ID_HEADER, Some(b"id-1".as_slice())),
                (SOURCE_HEADER, Some(src.as_bytes())),
                (LSN_HEADER, Some(lsn.as_bytes())),
            ];
            if let Some(change) = change {
                headers.push((CHANGE_HEADER, Some(change.as_bytes())));
            }
            Seen::classify(source, headers, None)
        };
        let position = Position {
            lsn: Lsn(0x64),
            change: Lsn(0x50),
            index: 0,
        };
        assert_eq!(
            seen(source, "0/64", Some("0/50:0")),
            Seen::Ours(position, b"id-1".to_vec())
        );
        // The same slot and server: another timeline, or the scheme before outbox.change.
        assert_eq!(
            seen("outbox_relay@7300/1", "0/64", Some("0/50:0")),
            Seen::Earlier
        );
        assert_eq!(seen(source, "0/64", None), Seen::Earlier);
        // Another slot (a shard), another server, no source at all.
        for other in ["outbox_relay_shard_0_of_2@7300/2", "outbox_relay@73001/2"] {
            assert_eq!(seen(other, "0/64", Some("0/50:0")), Seen::Foreign);
        }
        assert_eq!(Seen::classify(source, [], Some(b"k")), Seen::Foreign);
    }
}
