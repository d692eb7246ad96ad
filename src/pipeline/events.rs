//! What the pipeline does with each input: a replication event (framing, relations, rows,
//! logical messages) and a delivery report (an ack, or a failure judged by [`verdict`]).

use std::sync::Arc;

use bytes::Bytes;

use super::decide::{Failure, Origin, Verdict, verdict};
use super::{OpenTx, Pipeline, RelayError};
use crate::lsn::Lsn;
use crate::outbox::{EventError, Mapped, OutboxRecord};
use crate::pgoutput::{self, Message, Relation, TupleData};
use crate::sink::exactly_once::{Position, ReadBack};
use crate::sink::{Delivery, DeliveryFailure, Sink, Ticket};
use crate::source::{Source, SourceEvent};

impl<S: Source, K: Sink + ReadBack> Pipeline<S, K> {
    pub(super) async fn on_delivery(&mut self, delivery: Delivery) -> Result<(), RelayError> {
        let ticket = delivery.ticket;
        let Err(DeliveryFailure { refusal, record }) = delivery.outcome else {
            return Ok(self.acked(ticket)?);
        };
        self.observer.delivery_failed(&refusal.code);
        let failure = Failure::Refused(record, refusal, true);
        self.failed(ticket, failure).await
    }

    pub(super) async fn on_event(&mut self, event: SourceEvent) -> Result<(), RelayError> {
        self.observer.received(event.received());
        match event {
            SourceEvent::Begin {
                commit_lsn,
                commit_time_us,
            } => {
                self.tx = OpenTx {
                    commit_lsn,
                    commit_time_us,
                    ..OpenTx::default()
                };
                self.tracker.begin(commit_lsn)?;
            }
            SourceEvent::Commit(end_lsn) => {
                self.tracker.commit(end_lsn)?;
                if let Some(cleanup) = self.cleanup.as_mut() {
                    cleanup.ledger.commit(end_lsn);
                }
            }
            SourceEvent::KeepAlive(wal_end) => self.tracker.keepalive(wal_end),
            SourceEvent::Change { lsn, data, sent_us } => {
                self.gate.saw(data.len());
                self.pacer
                    .sent(sent_us.saturating_sub(self.tx.commit_time_us));
                let message =
                    pgoutput::decode(&data).map_err(|source| RelayError::Decode { lsn, source })?;
                self.on_message(message, lsn).await?;
            }
            SourceEvent::Message {
                lsn,
                transactional,
                prefix,
                content,
            } => {
                self.gate.saw(content.len());
                self.on_logical_message(transactional, &prefix, content, lsn)
                    .await?
            }
        }
        Ok(())
    }

    /// A pgoutput message; `change` is where it is in the WAL.
    async fn on_message(&mut self, message: Message, change: Lsn) -> Result<(), RelayError> {
        match message {
            Message::Relation(relation) => self.on_relation(relation).await?,
            Message::Insert { relation_id, new } => {
                self.on_insert(relation_id, &new, change).await?;
            }
            Message::Update { relation_id, .. } | Message::Delete { relation_id, .. } => {
                self.on_update_or_delete(relation_id);
            }
            _ => {}
        }
        Ok(())
    }

    /// A Relation message: an outbox table (or a partition of one, through its root) binds to
    /// the mapping and cleanup's key; any other relation is remembered as foreign.
    async fn on_relation(&mut self, relation: Relation) -> Result<(), RelayError> {
        let lsn = self.tx.commit_lsn;
        let id = relation.id;
        let name = format!("{}.{}", relation.namespace, relation.name);
        // Without publish_via_partition_root a partition arrives under its own name.
        let mapper = &self.routing.mapper;
        let root = match mapper.is_outbox(&relation.namespace, &relation.name) {
            true => None,
            false => self.source.partition_root(id).await?,
        };
        let bind_error = |source| RelayError::Bind { lsn, source };
        if let Some(cleanup) = self.cleanup.as_mut() {
            let bound = cleanup.tables.relation(&relation, root.as_ref());
            bound.map_err(bind_error)?;
        }
        let facts = match self.routing.mapper.reads_catalog(&relation, root.as_ref()) {
            true => self.source.column_facts(id).await?,
            false => Vec::new(),
        };
        let routing = &mut self.routing;
        let bound = routing.mapper.relation(relation, root, &facts);
        bound.map_err(bind_error)?;
        routing.foreign.remove(&id);
        if let Some(table) = routing.mapper.outbox_table(id) {
            tracing::debug!(table = %table, relation = %name, relation_id = id, "bound outbox table");
        } else {
            routing.foreign.insert(id, name);
        }
        Ok(())
    }

    /// An insert: an outbox row's event, its row registered for `--cleanup delete`; another
    /// table's row is refused unless the publication is `FOR ALL TABLES`.
    async fn on_insert(
        &mut self,
        relation_id: u32,
        new: &TupleData,
        change: Lsn,
    ) -> Result<(), RelayError> {
        if let Some(cleanup) = self.cleanup.as_mut()
            && let Some(row) = cleanup.tables.row(relation_id, new)
        {
            // The ticket its event takes below, mapped or not.
            let ticket = self.tracker.next_ticket().0;
            cleanup.ledger.row(ticket, row, self.tracker.resume_lsn());
        }
        let time = self.tx.commit_time_ms();
        match self.routing.mapper.insert(relation_id, new, time) {
            Some((table, mapped)) => self.relay_event(mapped, table, change).await,
            // Never skip silently: only FOR ALL TABLES sends other tables' rows.
            None if self.routing.all_tables => Ok(()),
            None => {
                let table = self.routing.foreign.get(&relation_id).cloned();
                Err(RelayError::UnmappedRelation {
                    lsn: self.tx.commit_lsn,
                    publication: self.config.flags.publication.clone(),
                    table: table.unwrap_or_else(|| format!("relation OID {relation_id}")),
                })
            }
        }
    }

    /// An UPDATE or DELETE: ignored, and on an outbox table counted (warned of once).
    fn on_update_or_delete(&mut self, relation_id: u32) {
        let Some(table) = self.routing.mapper.outbox_table(relation_id) else {
            return;
        };
        // Warn on the first one only; the count is reported at shutdown.
        if self.routing.non_insert_changes == 0 {
            tracing::warn!(
                table = %table,
                lsn = %self.tx.commit_lsn,
                "ignoring UPDATE/DELETE on an outbox table: only inserts are relayed (create the \
                 publication WITH (publish = 'insert') to stop receiving them)"
            );
        }
        self.routing.non_insert_changes += 1;
    }

    /// A logical decoding message: an outbox event when its prefix is one of `--message-prefix`
    /// and it was emitted inside a transaction.
    async fn on_logical_message(
        &mut self,
        transactional: bool,
        prefix: &str,
        content: Bytes,
        lsn: Lsn,
    ) -> Result<(), RelayError> {
        let time = self.tx.commit_time_ms();
        let Some((source, mapped)) = self.routing.mapper.message(prefix, &content, time) else {
            return Ok(());
        };
        if transactional && self.tracker.in_transaction() {
            return self.relay_event(mapped, source, lsn).await;
        }
        if !self.routing.warned_non_transactional {
            self.routing.warned_non_transactional = true;
            tracing::warn!(
                prefix,
                lsn = %lsn,
                "ignoring a non-transactional message with an outbox prefix: emit outbox \
                 events with pg_logical_emit_message(true, ...) inside the business transaction"
            );
        }
        Ok(())
    }

    /// One outbox event (a row or a message) of the open transaction: the record it maps to,
    /// or why it does not and what could be read of it.
    /// `change` is where it is in the WAL.
    async fn relay_event(
        &mut self,
        mapped: Mapped,
        table: Arc<str>,
        change: Lsn,
    ) -> Result<(), RelayError> {
        // Every event takes a position, mapped or not, so a replay numbers a
        // multi-insert's events the same way (exactly-once relies on it).
        let position = self.tx.next_position(change);
        let (error, mut parts) = match mapped {
            Ok(Some(record)) => return self.enqueue(record, table, position).await,
            Ok(None) => {
                // A Kafka Connect Filter dropped it: nothing to deliver, so it is done.
                let ticket = self.tracker.push(0, &table)?;
                self.tracker.ack(ticket)?;
                return Ok(());
            }
            Err(unmapped) => unmapped,
        };
        if let EventError::InvalidTopic { topic, .. } = &error {
            parts.intended_topic = Some(topic.clone());
        }
        let ticket = self.tracker.push(0, &table)?;
        let failure = Failure::Unmapped(error, parts, self.tx.commit_time_ms());
        self.failed(ticket, failure).await
    }

    /// Hands one record to the producer, in stream order: after the records waiting for
    /// schema ids, when there are any or it lacks one itself.
    async fn enqueue(
        &mut self,
        record: OutboxRecord,
        table: Arc<str>,
        position: Position,
    ) -> Result<(), RelayError> {
        if self.registering.holds(&record) {
            return self.register(record, table, position).await;
        }
        self.deliver(None, record, table, position).await
    }

    /// Hands a complete record to the producer under `ticket`, or a new one taken now.
    pub(super) async fn deliver(
        &mut self,
        ticket: Option<Ticket>,
        mut record: OutboxRecord,
        table: Arc<str>,
        position: Position,
    ) -> Result<(), RelayError> {
        if let Some(eo) = self.exactly_once.as_mut() {
            let lsn = position.lsn;
            let prepared = eo.prepare(&*self.sink, record, position).await;
            match prepared.map_err(|source| RelayError::ExactlyOnce { lsn, source })? {
                Some(prepared) => record = prepared,
                None => {
                    // Already in its partition from a previous run.
                    let ticket = match ticket {
                        Some(ticket) => ticket,
                        None => self.tracker.push(0, &table)?,
                    };
                    self.tracker.ack(ticket)?;
                    return Ok(());
                }
            }
        }
        let ticket: Ticket = match ticket {
            Some(ticket) => ticket,
            None => self.tracker.push(record.size(), &table)?,
        };
        match self.sink.send(ticket, &record).await {
            Ok(()) => {
                let sent = self
                    .observer
                    .event_sent(&record.topic, self.tx.commit_time_us);
                self.tracker.sent(ticket, sent, std::time::Instant::now());
                Ok(())
            }
            Err(error) => self.failed(ticket, Failure::enqueue(record, error)).await,
        }
    }

    /// The one place that does what [`verdict`] says about an event that did not reach Kafka.
    /// At most three rounds: the sink never blames the batch of a record sent alone, and a
    /// dead-letter record is never dead-lettered again. A dead-lettered event is acknowledged
    /// when its dead-letter record is.
    pub(super) async fn failed(
        &mut self,
        ticket: Ticket,
        mut failure: Failure,
    ) -> Result<(), RelayError> {
        loop {
            let (lsn, table) = self.tracker.origin(ticket).unzip();
            let origin = Origin {
                lsn: lsn.unwrap_or_default(),
                table: table.map(ToString::to_string).unwrap_or_default(),
                dead_letter_topic: self.config.dead_letter_topic.as_deref(),
            };
            let lsn = origin.lsn;
            let sent = match verdict(failure, origin) {
                Verdict::SendAlone(record, refusal) => {
                    tracing::warn!(
                        lsn = %lsn,
                        id = %record.id_text(),
                        topic = %record.topic,
                        error = %refusal.source,
                        "the broker refused a batch; sending its records again one per batch"
                    );
                    let sent = self.sink.send_alone(ticket, &record).await;
                    sent.map_err(|error| Failure::enqueue(record, error))
                }
                Verdict::DeadLetter(record, info) => {
                    tracing::warn!(
                        lsn = %lsn,
                        id = %record.id_text(),
                        table = %info.table,
                        topic = %info.intended_topic.as_deref().unwrap_or(""),
                        error = %info.error,
                        dead_letter_topic = %record.topic,
                        "event cannot be delivered; dead-lettering it"
                    );
                    if info.payload_omitted.is_some() {
                        self.keep_row(ticket, &record, &info);
                    }
                    self.summary.dead_lettered += 1;
                    metrics::counter!(crate::observability::metrics::DEAD_LETTERED_TOTAL)
                        .increment(1);
                    let sent = self.sink.send(ticket, &record).await;
                    sent.map_err(|error| Failure::enqueue(record, error))
                }
                Verdict::Stop(error) => return Err(error),
            };
            match sent {
                Ok(()) => return Ok(()),
                Err(next) => failure = next,
            }
        }
    }
}
