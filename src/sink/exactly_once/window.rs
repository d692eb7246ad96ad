//! PURE: how far back a partition is read after a (re)connect, over any [`PartitionLog`]
//! ([`TailReader`](super::TailReader), or the simulation's broker).
//!
//! From the end, in windows growing fourfold, until one of: a record the running source wrote
//! below the floor, a record of this relay's slot on this server from before the running
//! source ([`Seen::Earlier`]: an earlier timeline, or the header scheme before `outbox.change`),
//! the log's start, or [`FOREIGN_BUDGET`] records of other producers older than the oldest
//! record of ours found. Reading less never loses an event, as only a record with an event's
//! own position is proof; it can only leave a record of ours unseen, and its event sent twice.
//! So a partition without records of ours in reach costs at most 5,376 records, whatever it
//! holds; beyond that, what is read grows with the records the running source wrote at or
//! above the floor.

use std::collections::{HashMap, HashSet};

use super::{Position, Seen, TailError, partition_for};
use crate::lsn::Lsn;

/// Records read back at first from each partition's end; quadrupled each time more is needed.
pub const TAIL_WINDOW: i64 = 256;

/// Records of other producers (none of this relay's) after which a partition is read back
/// no further: a first use over a populated topic, or records of ours that aged out.
pub const FOREIGN_BUDGET: u64 = 4096;

/// Reading one topic's partitions by offset: what [`tails`] needs of Kafka.
pub trait PartitionLog {
    /// The partition's first offset and the offset after its last record.
    fn watermarks(&self, partition: i32) -> Result<(i64, i64), TailError>;

    /// Per `(partition, start, end)`, its records in `[start, end)` in offset order, as
    /// `source` sees them ([`Seen::classify`]).
    fn read(
        &self,
        ranges: &[(i32, i64, i64)],
        source: &str,
    ) -> Result<HashMap<i32, Vec<Seen>>, TailError>;
}

/// What one partition's tail showed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tail {
    /// The positions of the running source's records at or above the floor: the events
    /// still to come that are already there.
    pub delivered: HashSet<Position>,
    /// Records read (the `outbox_relay_exactly_once_tail_records_read_total` metric).
    pub read: u64,
}

/// Per partition of `topic`, what the window algorithm finds of `source`'s records at or
/// above `floor`. The first windows of all partitions are read in one round; a partition that
/// needs more is read further back alone.
pub fn tails(
    log: &impl PartitionLog,
    topic: &str,
    source: &str,
    partitions: i32,
    floor: Lsn,
    wal_end: Lsn,
) -> Vec<Result<Tail, TailError>> {
    let marks: Vec<_> = (0..partitions).map(|p| log.watermarks(p)).collect();
    let ends: Vec<_> = (0..)
        .zip(&marks)
        .filter_map(|(p, mark)| {
            let &(low, high) = mark.as_ref().ok()?;
            Some((p, (high - TAIL_WINDOW).max(low), high))
        })
        .collect();
    // A failed joint read is retried per partition.
    let mut joint = log.read(&ends, source).unwrap_or_default();
    let scan = Scan {
        topic,
        source,
        partitions,
        floor,
        wal_end,
    };
    (0..)
        .zip(marks)
        .map(|(partition, mark)| {
            let (low, high) = mark?;
            let first = joint.remove(&partition);
            scan.partition(partition, low, high, first, |range| {
                let read = log.read(&[range], source)?;
                Ok(read.into_values().flatten().collect())
            })
        })
        .collect()
}

/// The window algorithm's fixed inputs.
struct Scan<'a> {
    topic: &'a str,
    source: &'a str,
    partitions: i32,
    floor: Lsn,
    wal_end: Lsn,
}

impl Scan<'_> {
    /// Reads `partition` back from `high` (`first`: its first window, already read).
    fn partition(
        &self,
        partition: i32,
        low: i64,
        high: i64,
        mut first: Option<Vec<Seen>>,
        read: impl Fn((i32, i64, i64)) -> Result<Vec<Seen>, TailError>,
    ) -> Result<Tail, TailError> {
        let mut tail = Tail::default();
        let (mut end, mut window, mut foreign) = (high, TAIL_WINDOW, 0);
        while end > low && foreign < FOREIGN_BUDGET {
            let start = (end - window).max(low);
            let records = match first.take() {
                Some(records) => records,
                None => read((partition, start, end))?,
            };
            tail.read += u64::try_from(end - start).unwrap_or(0);
            let mut before = false;
            // Newest first: `foreign` counts the records older than the oldest of ours.
            for seen in records.into_iter().rev() {
                match seen {
                    Seen::Ours(position, key) if position.lsn >= self.floor => {
                        self.check(partition, position, &key)?;
                        tail.delivered.insert(position);
                        foreign = 0;
                    }
                    Seen::Ours(..) | Seen::Earlier => before = true,
                    Seen::Foreign => foreign += 1,
                }
            }
            if before {
                break;
            }
            end = start;
            window = window.saturating_mul(4);
        }
        Ok(tail)
    }

    /// A record of ours at or above the floor must hash to its partition and lie within the WAL.
    fn check(&self, partition: i32, position: Position, key: &[u8]) -> Result<(), TailError> {
        let topic = self.topic.to_owned();
        if partition_for(key, self.partitions) != partition {
            return Err(TailError::PartitionCountChanged {
                topic,
                partition,
                key: String::from_utf8_lossy(key).into_owned(),
                partitions: self.partitions,
            });
        }
        if position.lsn > self.wal_end {
            return Err(TailError::ForeignWriter {
                topic,
                partition,
                source_id: self.source.to_owned(),
                lsn: position.lsn,
                wal_end: self.wal_end,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = "outbox_relay@7300/2";

    /// Partitions as lists of records, oldest first; each read counted.
    struct Log(Vec<Vec<Seen>>, std::cell::Cell<u64>);

    impl PartitionLog for Log {
        fn watermarks(&self, partition: i32) -> Result<(i64, i64), TailError> {
            let len = self.0[partition as usize].len();
            Ok((0, len as i64))
        }

        fn read(
            &self,
            ranges: &[(i32, i64, i64)],
            _source: &str,
        ) -> Result<HashMap<i32, Vec<Seen>>, TailError> {
            self.1.set(self.1.get() + 1);
            Ok(ranges
                .iter()
                .map(|&(p, start, end)| {
                    let records = &self.0[p as usize][start as usize..end as usize];
                    (p, records.to_vec())
                })
                .collect())
        }
    }

    fn ours(lsn: u64, change: u64) -> Seen {
        let position = Position {
            lsn: Lsn(lsn),
            change: Lsn(change),
            index: 0,
        };
        // A key that hashes to partition 0 of 1.
        Seen::Ours(position, b"k".to_vec())
    }

    fn read(partition: Vec<Seen>, floor: u64) -> Tail {
        let log = Log(vec![partition], Default::default());
        let mut tails = tails(&log, "t", SOURCE, 1, Lsn(floor), Lsn(u64::MAX));
        tails.remove(0).unwrap()
    }

    fn positions(tail: &Tail) -> Vec<u64> {
        let mut found: Vec<u64> = tail.delivered.iter().map(|p| p.change.0).collect();
        found.sort_unstable();
        found
    }

    #[test]
    fn reads_back_to_a_record_of_ours_below_the_floor_through_any_number_of_ours() {
        let mut log: Vec<Seen> = (0..10_000).map(|_| Seen::Foreign).collect();
        log.push(ours(50, 40));
        // A huge transaction, unconfirmed, interleaved with other producers' records.
        for i in 0..20_000 {
            log.push(ours(100, 60 + i));
            log.push(Seen::Foreign);
        }
        let tail = read(log, 100);
        assert_eq!(tail.delivered.len(), 20_000);
        assert!(tail.read < 4 * 40_001, "{}", tail.read);
    }

    #[test]
    fn stops_at_this_relays_records_of_an_earlier_timeline_or_scheme() {
        let mut log: Vec<Seen> = (0..50_000).map(|_| Seen::Earlier).collect();
        log.extend([ours(200, 150), Seen::Foreign, ours(210, 205)]);
        let tail = read(log, 100);
        assert_eq!(positions(&tail), [150, 205]);
        assert_eq!(tail.read, TAIL_WINDOW as u64);
    }

    #[test]
    fn reads_at_most_about_five_budgets_of_other_producers_records() {
        let mut log = vec![ours(50, 40)];
        log.extend((0..100_000).map(|_| Seen::Foreign));
        let tail = read(log.clone(), 100);
        assert!(tail.delivered.is_empty());
        // 256 + 1,024 + 4,096: the window that passes the budget is the last.
        assert_eq!(tail.read, 5_376);
        // Records of ours past the budget's reach are not seen: sent again, never lost.
        log.push(ours(300, 290));
        assert_eq!(positions(&read(log, 100)), [290]);
    }

    #[test]
    fn an_empty_or_short_partition_is_read_once_to_its_start() {
        assert_eq!(read(Vec::new(), 100), Tail::default());
        let tail = read(vec![ours(150, 120), Seen::Foreign], 100);
        assert_eq!((positions(&tail), tail.read), (vec![120], 2));
    }

    #[test]
    fn the_first_windows_of_all_partitions_are_read_in_one_round() {
        let log = Log(
            vec![vec![ours(50, 40)], vec![Seen::Earlier], Vec::new()],
            Default::default(),
        );
        let tails = tails(&log, "t", SOURCE, 3, Lsn(100), Lsn(u64::MAX));
        assert!(tails.iter().all(Result::is_ok));
        assert_eq!(log.1.get(), 1);
    }

    #[test]
    fn a_record_of_ours_past_the_wal_or_in_the_wrong_partition_is_an_error() {
        let log = Log(vec![vec![ours(500, 450)]], Default::default());
        let past = tails(&log, "t", SOURCE, 1, Lsn(100), Lsn(400)).remove(0);
        assert!(
            matches!(past, Err(TailError::ForeignWriter { .. })),
            "{past:?}"
        );
        let misplaced = Log(vec![Vec::new(), vec![ours(150, 120)]], Default::default());
        let moved = tails(&misplaced, "t", SOURCE, 2, Lsn(100), Lsn(u64::MAX)).remove(1);
        // "k" hashes to partition 0 of 2, and the record sits in partition 1.
        assert_eq!(partition_for(b"k", 2), 0);
        assert!(
            matches!(moved, Err(TailError::PartitionCountChanged { .. })),
            "{moved:?}"
        );
    }
}
