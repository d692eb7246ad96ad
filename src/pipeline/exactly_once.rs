//! The pipeline's side of `--delivery exactly-once` (the argument is in
//! [`crate::sink::exactly_once`]): pin each record's partition, tag it with
//! its position, and skip what a partition's tail shows was already delivered.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::config::ExactlyOnceFallback;
use crate::lsn::Lsn;
use crate::outbox::OutboxRecord;
use crate::sink::Sink;
use crate::sink::exactly_once::{
    LSN_HEADER, Position, SEQ_HEADER, SOURCE_HEADER, TailError, partition_for,
};
use crate::source::ServerId;

/// Metadata reads of a topic that does not exist yet (a broker creating it
/// on first use answers so for a moment) before the relay gives up.
const TOPIC_ATTEMPTS: u32 = 20;

/// Per-run exactly-once state.
pub(super) struct ExactlyOnce {
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
    pub(super) skipped: u64,
}

impl ExactlyOnce {
    /// The source is set by [`ExactlyOnce::follow`] when the first stream comes up.
    pub(super) fn new(slot: String, fallback: ExactlyOnceFallback) -> Self {
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
    pub(super) fn follow(&mut self, server: &ServerId) -> bool {
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
    pub(super) fn reset(&mut self, wal_end: Lsn) {
        self.delivered.clear();
        self.wal_end = wal_end;
    }

    /// Pins and tags `record`, or returns `None` when its partition already holds it.
    pub(super) async fn prepare(
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
