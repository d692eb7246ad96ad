//! The pipeline's side of `--delivery exactly-once` (the argument is in
//! [`crate::sink::exactly_once`]): pin each record's partition, tag it with
//! its position, and skip what a partition's tail shows was already delivered.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;

use crate::config::ExactlyOnceFallback;
use crate::lsn::Lsn;
use crate::outbox::OutboxRecord;
use crate::sink::KafkaSink;
use crate::sink::exactly_once::{
    LSN_HEADER, Position, SEQ_HEADER, SOURCE_HEADER, TailError, TailReader, Verdict, partition_for,
    verdict,
};

/// Per-run exactly-once state.
pub(super) struct ExactlyOnce {
    source_id: Bytes,
    /// Shared with the blocking-pool task that reads a tail: the relay's
    /// runtime has one thread, which must not block.
    tail: Arc<Mutex<TailReader>>,
    wal_end: Lsn,
    fallback: ExactlyOnceFallback,
    partitions: HashMap<String, i32>,
    /// Last position of ours per partition, read once per (re)connect.
    last: HashMap<(String, i32), Option<Position>>,
    /// Events skipped because a previous run had delivered them.
    pub(super) skipped: u64,
}

impl ExactlyOnce {
    pub(super) fn new(
        source_id: String,
        tail: TailReader,
        wal_end: Lsn,
        fallback: ExactlyOnceFallback,
    ) -> Self {
        ExactlyOnce {
            source_id: Bytes::from(source_id),
            tail: Arc::new(Mutex::new(tail)),
            wal_end,
            fallback,
            partitions: HashMap::new(),
            last: HashMap::new(),
            skipped: 0,
        }
    }

    /// Forgets what the tails said: after a reconnect they are read again
    /// (once the in-flight records have landed).
    pub(super) fn reset(&mut self, wal_end: Lsn) {
        self.last.clear();
        self.wal_end = wal_end;
    }

    /// Pins and tags `record`, or returns `None` when its partition already holds it.
    pub(super) async fn prepare(
        &mut self,
        sink: &Arc<KafkaSink>,
        mut record: OutboxRecord,
        position: Position,
    ) -> Result<Option<OutboxRecord>, TailError> {
        let partitions = match self.partitions.get(&record.topic) {
            Some(n) => *n,
            None => {
                let (sink, topic) = (Arc::clone(sink), record.topic.clone());
                let n = blocking(&record.topic, -1, move || {
                    sink.partition_count(&topic)
                        .map_err(|e| format!("cannot read the topic's partition count: {e}"))
                })
                .await?
                .map_err(|reason| TailError::Read {
                    topic: record.topic.clone(),
                    partition: -1,
                    reason,
                })?;
                self.partitions.insert(record.topic.clone(), n);
                n
            }
        };
        let key = record.key.as_ref().unwrap_or(&record.id);
        let partition = partition_for(key, partitions);
        let slot = (record.topic.clone(), partition);
        let last = match self.last.get(&slot) {
            Some(last) => *last,
            None => {
                // The first record for this partition since the (re)connect:
                // read the tails of all the topic's partitions at once, as
                // the others are likely needed next.
                let (tail, topic, wal_end) =
                    (Arc::clone(&self.tail), record.topic.clone(), self.wal_end);
                let read = blocking(&record.topic, partition, move || {
                    tail.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .last_positions(&topic, partitions, wal_end)
                })
                .await?;
                let mut wanted = None;
                for (p, result) in (0..partitions).zip(read) {
                    if p == partition {
                        wanted = Some(result);
                    } else if let Ok(last) = result {
                        // A failed read of another partition is retried,
                        // and reported, when that partition is needed.
                        self.last.insert((record.topic.clone(), p), last);
                    }
                }
                let read = wanted.unwrap_or_else(|| {
                    Err(TailError::Read {
                        topic: record.topic.clone(),
                        partition,
                        reason: "the partition was not read".to_owned(),
                    })
                });
                let last = match read {
                    Ok(last) => last,
                    Err(e) if self.fallback == ExactlyOnceFallback::AtLeastOnce => {
                        tracing::warn!(
                            error = %e,
                            "exactly-once cannot be guaranteed for this partition; continuing \
                             at-least-once for it (--exactly-once-fallback at-least-once)"
                        );
                        None
                    }
                    Err(e) => return Err(e),
                };
                tracing::debug!(topic = %record.topic, partition, last = ?last, "read partition tail");
                self.last.insert(slot, last);
                last
            }
        };
        if verdict(last, position) == Verdict::Delivered {
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
}

/// Runs a blocking Kafka call on tokio's blocking pool.
async fn blocking<T: Send + 'static>(
    topic: &str,
    partition: i32,
    call: impl FnOnce() -> T + Send + 'static,
) -> Result<T, TailError> {
    tokio::task::spawn_blocking(call)
        .await
        .map_err(|e| TailError::Read {
            topic: topic.to_owned(),
            partition,
            reason: format!("the blocking read stopped: {e}"),
        })
}
