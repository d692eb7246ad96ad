//! What the pipeline does with each input: a replication event (framing, relations, rows,
//! logical messages) and a delivery report (ack, batch-level re-send, poison).

use std::sync::Arc;

use bytes::Bytes;
use pgwire_replication::ReplicationEvent;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::{Pipeline, RelayError};
use crate::lsn::Lsn;
use crate::outbox::{
    DeadLetterInfo, EventError, OutboxRecord, RawParts, dead_letter_record, values,
};
use crate::pgoutput::{self, Message};
use crate::sink::exactly_once::Position;
use crate::sink::{Delivery, DeliveryFailure, Sink, SinkError, Ticket, is_batch_level, is_poison};
use crate::source::Source;

impl<S: Source, K: Sink> Pipeline<S, K> {
    pub(super) async fn on_delivery(&mut self, delivery: Delivery) -> Result<(), RelayError> {
        let ticket = delivery.ticket;
        let Err(DeliveryFailure { error, record }) = delivery.outcome else {
            return Ok(self.acked(ticket)?);
        };
        self.observer.delivery_failed(&error);
        let (lsn, _) = self.origin(ticket);
        if !delivery.alone && is_batch_level(&error) {
            // The broker blamed the whole batch: only a record refused alone is poison.
            tracing::warn!(
                lsn = %lsn,
                id = %record.id_text(),
                topic = %record.topic,
                error = %error,
                "the broker refused a batch; sending its records again one per batch"
            );
            return match self.sink.send_alone(ticket, &record).await {
                Ok(()) => Ok(()),
                Err(error) => self.refused(ticket, record, error).await,
            };
        }
        if is_poison(&error) {
            return self.condemned(ticket, record, error).await;
        }
        Err(RelayError::Delivery {
            lsn,
            id: record.id_text(),
            topic: record.topic,
            error,
        })
    }

    pub(super) async fn on_event(&mut self, event: ReplicationEvent) -> Result<(), RelayError> {
        self.observer.received(&event);
        match event {
            ReplicationEvent::Begin {
                final_lsn,
                commit_time_micros,
                ..
            } => {
                self.commit_lsn = final_lsn.into();
                self.commit_time_us = values::pg_micros_to_unix_micros(commit_time_micros);
                self.tx_seq = 0;
                self.tracker.begin(self.commit_lsn)?;
            }
            ReplicationEvent::Commit { end_lsn, .. } => {
                self.tracker.commit(end_lsn.into())?;
                if let Some(cleanup) = self.cleanup.as_mut() {
                    cleanup.commit(end_lsn.into());
                }
            }
            ReplicationEvent::KeepAlive { wal_end, .. } => {
                self.tracker.keepalive(wal_end.into());
            }
            ReplicationEvent::XLogData {
                wal_start, data, ..
            } => {
                self.saw_message(data.len());
                let message = pgoutput::decode(&data).map_err(|source| RelayError::Decode {
                    lsn: wal_start.into(),
                    source,
                })?;
                self.on_message(message).await?;
            }
            ReplicationEvent::Message {
                transactional,
                prefix,
                content,
                lsn,
            } => {
                self.saw_message(content.len());
                self.on_logical_message(transactional, &prefix, content, lsn.into())
                    .await?
            }
            ReplicationEvent::StoppedAt { .. } => {}
        }
        Ok(())
    }

    async fn on_message(&mut self, message: Message) -> Result<(), RelayError> {
        let lsn = self.commit_lsn;
        match message {
            Message::Relation(relation) => {
                let id = relation.id;
                let name = format!("{}.{}", relation.namespace, relation.name);
                // Without publish_via_partition_root a partition arrives under its own name.
                let root = if self.mapper.is_outbox(&relation.namespace, &relation.name) {
                    None
                } else {
                    self.source.partition_root(id).await?
                };
                let bind_error = |source| RelayError::Bind { lsn, source };
                if let Some(cleanup) = self.cleanup.as_mut() {
                    cleanup
                        .relation(&relation, root.as_ref())
                        .map_err(bind_error)?;
                }
                let facts = match self.mapper.reads_catalog(&relation, root.as_ref()) {
                    true => self.source.column_facts(id).await?,
                    false => Vec::new(),
                };
                self.mapper
                    .relation(relation, root, &facts)
                    .map_err(bind_error)?;
                self.foreign.remove(&id);
                if let Some(table) = self.mapper.outbox_table(id) {
                    tracing::debug!(table = %table, relation = %name, relation_id = id, "bound outbox table");
                } else {
                    self.foreign.insert(id, name);
                }
            }
            Message::Insert { relation_id, new } => {
                if let Some(cleanup) = self.cleanup.as_mut() {
                    cleanup.row(relation_id, &new);
                }
                match self.mapper.insert(relation_id, &new, self.commit_time_ms()) {
                    Some((table, mapped)) => self.relay_event(mapped, table).await?,
                    // Never skip silently: only FOR ALL TABLES sends other tables' rows.
                    None if self.all_tables => {}
                    None => {
                        let table = self.foreign.get(&relation_id).cloned();
                        return Err(RelayError::UnmappedRelation {
                            lsn,
                            publication: self.config.flags.publication.clone(),
                            table: table.unwrap_or_else(|| format!("relation OID {relation_id}")),
                        });
                    }
                }
            }
            Message::Update { relation_id, .. } | Message::Delete { relation_id, .. } => {
                if let Some(table) = self.mapper.outbox_table(relation_id) {
                    // Warn on the first one only; the count is reported at shutdown.
                    if self.non_insert_changes == 0 {
                        tracing::warn!(
                            table = %table,
                            lsn = %lsn,
                            "ignoring UPDATE/DELETE on an outbox table: only inserts are relayed \
                             (create the publication WITH (publish = 'insert') to stop receiving them)"
                        );
                    }
                    self.non_insert_changes += 1;
                }
            }
            _ => {}
        }
        Ok(())
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
        let Some((source, mapped)) = self.mapper.message(prefix, &content, self.commit_time_ms())
        else {
            return Ok(());
        };
        if transactional && self.tracker.in_transaction() {
            return self.relay_event(mapped, source).await;
        }
        if !self.warned_non_transactional {
            self.warned_non_transactional = true;
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
    async fn relay_event(
        &mut self,
        mapped: Result<OutboxRecord, (EventError, RawParts)>,
        table: Arc<str>,
    ) -> Result<(), RelayError> {
        // Every event takes a sequence number, mapped or not, so a replayed
        // transaction numbers its events the same way (exactly-once relies on it).
        let seq = self.tx_seq;
        self.tx_seq = self.tx_seq.saturating_add(1);
        let (error, mut parts) = match mapped {
            Ok(record) => return self.enqueue(record, table, seq).await,
            Err(unmapped) => unmapped,
        };
        if let EventError::InvalidTopic { topic, .. } = &error {
            parts.intended_topic = Some(topic.clone());
        }
        let ticket = self.tracker.push(0, &table)?;
        let time = self.commit_time_ms();
        self.poison(ticket, parts, Vec::new(), time, error.to_string(), None)
            .await
    }

    /// Hands one record to the producer, in stream order.
    async fn enqueue(
        &mut self,
        mut record: OutboxRecord,
        table: Arc<str>,
        seq: u32,
    ) -> Result<(), RelayError> {
        if let Some(eo) = self.exactly_once.as_mut() {
            let lsn = self.commit_lsn;
            let position = Position { lsn, seq };
            let prepared = eo.prepare(&*self.sink, record, position).await;
            match prepared.map_err(|source| RelayError::ExactlyOnce { lsn, source })? {
                Some(prepared) => record = prepared,
                None => {
                    // Already in its partition from a previous run.
                    let ticket = self.tracker.push(0, &table)?;
                    self.tracker.ack(ticket)?;
                    return Ok(());
                }
            }
        }
        let ticket: Ticket = self.tracker.push(record.size(), &table)?;
        match self.sink.send(ticket, &record).await {
            Ok(()) => {
                let sent = self.observer.event_sent(&record.topic, self.commit_time_us);
                self.tracker.sent(ticket, sent);
                Ok(())
            }
            Err(error) => self.refused(ticket, record, error).await,
        }
    }

    /// A record the producer refused to take: poison when about the record, else the relay stops.
    async fn refused(
        &mut self,
        ticket: Ticket,
        record: OutboxRecord,
        error: SinkError,
    ) -> Result<(), RelayError> {
        let error = self.refusal(ticket, error)?;
        self.condemned(ticket, record, error).await
    }

    /// The cause of a refusal about the record itself; any other stops the relay.
    fn refusal(&self, ticket: Ticket, error: SinkError) -> Result<KafkaError, RelayError> {
        match error {
            SinkError::Enqueue { source, .. } if is_poison(&source) => Ok(source),
            source => {
                let (lsn, table) = self.origin(ticket);
                Err(RelayError::Sink { lsn, table, source })
            }
        }
    }

    /// The commit LSN and outbox table of an in-flight event, for errors.
    fn origin(&self, ticket: Ticket) -> (Lsn, String) {
        let origin = self.tracker.origin(ticket);
        origin.map_or_else(Default::default, |(lsn, table)| (lsn, table.to_string()))
    }

    /// A record refused for good for a reason about itself: poison, unless it is a dead-letter
    /// record (dead-lettering it again would loop).
    async fn condemned(
        &mut self,
        ticket: Ticket,
        record: OutboxRecord,
        error: KafkaError,
    ) -> Result<(), RelayError> {
        if self.config.dead_letter_topic.as_ref() == Some(&record.topic) {
            return Err(RelayError::DeadLetter {
                lsn: self.origin(ticket).0,
                id: record.id_text(),
                topic: record.topic,
                error,
            });
        }
        let too_large = matches!(
            error.rdkafka_error_code(),
            Some(
                RDKafkaErrorCode::MessageSizeTooLarge
                    | RDKafkaErrorCode::InvalidMessageSize
                    | RDKafkaErrorCode::MessageBatchTooLarge
            )
        );
        let size = record.payload.as_ref().map_or(0, Bytes::len);
        let payload_omitted = too_large.then(|| {
            format!(
                "payload of {size} bytes is the reason: larger than the producer's or \
                 broker's message.max.bytes"
            )
        });
        let parts = RawParts {
            id: record.id,
            key: record.key,
            payload: record.payload,
            intended_topic: Some(record.topic),
        };
        self.poison(
            ticket,
            parts,
            record.headers,
            record.timestamp_ms,
            error.to_string(),
            payload_omitted,
        )
        .await
    }

    /// An event that can never be delivered (a row that does not map, a record librdkafka
    /// refuses, or one the broker rejects for good), with what could be read of it and why:
    /// dead-letter it under that policy (acknowledged when the dead-letter record is), else stop.
    async fn poison(
        &mut self,
        ticket: Ticket,
        parts: RawParts,
        headers: Vec<(Arc<str>, Option<Bytes>)>,
        timestamp_ms: i64,
        error: String,
        payload_omitted: Option<String>,
    ) -> Result<(), RelayError> {
        let (lsn, table) = self.origin(ticket);
        let info = DeadLetterInfo {
            error,
            lsn,
            table,
            intended_topic: parts.intended_topic.clone(),
            payload_omitted,
        };
        let id = String::from_utf8_lossy(&parts.id).into_owned();
        let Some(topic) = self.config.dead_letter_topic.clone() else {
            return Err(RelayError::Poison { id, info });
        };
        tracing::warn!(
            lsn = %info.lsn,
            id,
            table = %info.table,
            topic = %info.intended_topic.as_deref().unwrap_or(""),
            error = %info.error,
            dead_letter_topic = %topic,
            "event cannot be delivered; dead-lettering it"
        );
        let record = dead_letter_record(&topic, parts, headers, &info, timestamp_ms);
        self.summary.dead_lettered += 1;
        metrics::counter!(crate::observability::metrics::DEAD_LETTERED_TOTAL).increment(1);
        match self.sink.send(ticket, &record).await {
            Ok(()) => Ok(()),
            Err(error) => Err(RelayError::DeadLetter {
                lsn: info.lsn,
                id,
                topic,
                error: self.refusal(ticket, error)?,
            }),
        }
    }
}
