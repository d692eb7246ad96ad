//! [`ExactlyOnce`]: pins and tags each record and decides, from the tails a [`ReadBack`]
//! reads, which replayed events are already in their partition.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;

use super::{
    CHANGE_HEADER, LSN_HEADER, Position, ReadBack, SOURCE_HEADER, TailError, partition_for,
};
use crate::config::ExactlyOnceFallback;
use crate::lsn::Lsn;
use crate::observability::Chain;
use crate::observability::metrics::TAIL_RECORDS_READ_TOTAL;
use crate::outbox::OutboxRecord;

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

    /// Takes the source of a stream on the cluster `system_id`, on `timeline`; returns whether
    /// it changed (the first stream, or a promotion), so the tails must be read again.
    pub fn follow(&mut self, system_id: &str, timeline: u32) -> bool {
        let source_id = format!("{}@{system_id}/{timeline}", self.slot);
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
        sink: &impl ReadBack,
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
            (CHANGE_HEADER, Bytes::from(position.change_header())),
        ] {
            record.headers.push((Arc::from(name), Some(value)));
        }
        Ok(Some(record))
    }

    /// The topic's partition count, read once.
    async fn partition_count(
        &mut self,
        sink: &impl ReadBack,
        topic: &str,
    ) -> Result<i32, TailError> {
        if let Some(n) = self.partitions.get(topic) {
            return Ok(*n);
        }
        let n = sink.partition_count(topic).await?;
        self.partitions.insert(topic.to_owned(), n);
        Ok(n)
    }

    /// Reads the tails of all the topic's partitions at once (the others are
    /// likely needed next); `wanted` is the one needed now.
    async fn read_tails(
        &mut self,
        sink: &impl ReadBack,
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
                Ok(tail) => {
                    let labels = [("topic", topic.to_owned()), ("partition", p.to_string())];
                    metrics::counter!(TAIL_RECORDS_READ_TOTAL, &labels).increment(tail.read);
                    self.delivered.insert((topic.to_owned(), p), tail.delivered);
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
            error = %Chain(&e),
            "exactly-once cannot be guaranteed for this partition; continuing \
             at-least-once for it (--exactly-once-fallback at-least-once)"
        );
        self.delivered
            .entry((topic.to_owned(), wanted))
            .or_default();
        Ok(())
    }
}
