//! What the pipeline does with each input: a replication event (framing,
//! relations, rows, logical messages) and a delivery report (ack, batch-level
//! re-send, poison).

use pgwire_replication::ReplicationEvent;

use super::poison::Poison;
use super::{Pipeline, RelayError};
use crate::lsn::Lsn;
use crate::outbox::{OutboxRecord, values};
use crate::pgoutput::{self, Message};
use crate::sink::{Delivery, Sink, SinkError, Ticket};
use crate::source::Source;

impl<S: Source, K: Sink> Pipeline<S, K> {
    pub(super) async fn on_delivery(&mut self, delivery: Delivery) -> Result<(), RelayError> {
        match delivery.outcome {
            Ok(_) => Ok(self.acked(delivery.ticket)?),
            Err(failure) => {
                self.observer.delivery_failed(&failure.error);
                let lsn = self
                    .tracker
                    .commit_lsn_of(delivery.ticket)
                    .unwrap_or(Lsn::ZERO);
                let table = self
                    .tracker
                    .table_of(delivery.ticket)
                    .map(ToString::to_string)
                    .unwrap_or_default();
                if !delivery.alone && crate::sink::is_batch_level(&failure.error) {
                    // The broker blamed the whole batch: only a record refused
                    // on its own is poison.
                    tracing::warn!(
                        lsn = %lsn,
                        id = %failure.id,
                        topic = %failure.topic,
                        error = %failure.error,
                        "the broker refused a batch; sending its records again one per batch"
                    );
                    let record = failure.to_record();
                    return match self.sink.send_alone(delivery.ticket, &record).await {
                        Ok(()) => Ok(()),
                        Err(error) => {
                            self.refused(delivery.ticket, record, error, lsn, table)
                                .await
                        }
                    };
                }
                if crate::sink::is_poison(&failure.error) {
                    if self.config.dead_letter_topic.as_ref() == Some(&failure.topic) {
                        return Err(RelayError::DeadLetter {
                            lsn,
                            id: failure.id,
                            topic: failure.topic,
                            error: failure.error,
                        });
                    }
                    return self
                        .poison(delivery.ticket, Poison::rejected(failure, lsn, table))
                        .await;
                }
                tracing::error!(
                    lsn = %lsn,
                    id = %failure.id,
                    topic = %failure.topic,
                    error = %failure.error,
                    "delivery failed for good; stopping without acknowledging it"
                );
                Err(RelayError::Delivery {
                    lsn,
                    id: failure.id,
                    topic: failure.topic,
                    error: failure.error,
                })
            }
        }
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
                    cleanup.commit(end_lsn.into(), self.config.status_interval);
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

    pub(super) async fn on_message(&mut self, message: Message) -> Result<(), RelayError> {
        match message {
            Message::Relation(relation) => {
                let id = relation.id;
                let name = format!("{}.{}", relation.namespace, relation.name);
                // A partition arrives under its own name when the publication
                // lacks publish_via_partition_root: map it to its root.
                let root = if self
                    .outbox
                    .mapper
                    .is_outbox(&relation.namespace, &relation.name)
                {
                    None
                } else {
                    self.source.partition_root(id).await?
                };
                if let Some(cleanup) = self.cleanup.as_mut() {
                    cleanup
                        .relation(&relation, root.as_ref())
                        .map_err(|source| RelayError::Bind {
                            lsn: self.commit_lsn,
                            source,
                        })?;
                }
                self.outbox
                    .mapper
                    .relation(relation, root)
                    .map_err(|source| RelayError::Bind {
                        lsn: self.commit_lsn,
                        source,
                    })?;
                self.outbox.foreign.remove(&id);
                if let Some(table) = self.outbox.mapper.outbox_table(id) {
                    tracing::debug!(table = %table, relation = %name, relation_id = id, "bound outbox table");
                } else {
                    self.outbox.foreign.insert(id, name);
                }
            }
            Message::Insert { relation_id, new } => {
                if let Some(cleanup) = self.cleanup.as_mut() {
                    cleanup.row(relation_id, &new);
                }
                let commit_time_ms = self.commit_time_ms();
                match self.outbox.mapper.insert(relation_id, &new, commit_time_ms) {
                    Some((table, mapped)) => self.relay_event(mapped, table).await?,
                    // Never skip silently: only FOR ALL TABLES sends other tables' rows.
                    None if self.outbox.all_tables => {}
                    None => {
                        return Err(RelayError::UnmappedRelation {
                            lsn: self.commit_lsn,
                            publication: self.config.publication.clone(),
                            table: self
                                .outbox
                                .foreign
                                .get(&relation_id)
                                .cloned()
                                .unwrap_or_else(|| format!("relation OID {relation_id}")),
                        });
                    }
                }
            }
            Message::Update { relation_id, .. } | Message::Delete { relation_id, .. } => {
                if let Some(table) = self.outbox.mapper.outbox_table(relation_id) {
                    // Warn on the first one only; the count is reported at shutdown.
                    if self.outbox.non_insert_changes == 0 {
                        tracing::warn!(
                            table = %table,
                            lsn = %self.commit_lsn,
                            "ignoring UPDATE/DELETE on an outbox table: only inserts are relayed \
                             (create the publication WITH (publish = 'insert') to stop receiving them)"
                        );
                    }
                    self.outbox.non_insert_changes += 1;
                }
            }
            Message::Begin { .. }
            | Message::Commit { .. }
            | Message::Origin { .. }
            | Message::Type { .. }
            | Message::Truncate { .. }
            | Message::Message { .. } => {}
        }
        Ok(())
    }

    /// A logical decoding message: an outbox event when its prefix is one of
    /// `--message-prefix` and it was emitted inside a transaction.
    pub(super) async fn on_logical_message(
        &mut self,
        transactional: bool,
        prefix: &str,
        content: bytes::Bytes,
        lsn: Lsn,
    ) -> Result<(), RelayError> {
        let commit_time_ms = self.commit_time_ms();
        let Some((source, mapped)) = self.outbox.mapper.message(prefix, &content, commit_time_ms)
        else {
            return Ok(());
        };
        if !transactional || !self.tracker.in_transaction() {
            if !self.outbox.warned_non_transactional {
                self.outbox.warned_non_transactional = true;
                tracing::warn!(
                    prefix,
                    lsn = %lsn,
                    "ignoring a non-transactional message with an outbox prefix: emit outbox \
                     events with pg_logical_emit_message(true, ...) inside the business transaction"
                );
            }
            return Ok(());
        }
        self.relay_event(mapped, source).await
    }

    /// One outbox event (a row or a message) of the open transaction: the
    /// record it maps to, or why it does not map and what could be read of it.
    pub(super) async fn relay_event(
        &mut self,
        mapped: Result<OutboxRecord, (crate::outbox::EventError, crate::outbox::RawParts)>,
        source: std::sync::Arc<str>,
    ) -> Result<(), RelayError> {
        // Every event takes a sequence number, mapped or not, so a replayed
        // transaction numbers its events the same way (exactly-once relies on it).
        let seq = self.tx_seq;
        self.tx_seq = self.tx_seq.saturating_add(1);
        match mapped {
            Ok(record) => self.enqueue(record, source, seq).await,
            Err((error, parts)) => {
                let poison = Poison::unmappable(
                    parts,
                    error,
                    self.commit_lsn,
                    source.to_string(),
                    self.commit_time_ms(),
                );
                let ticket = self.tracker.push(0, &source)?;
                self.poison(ticket, poison).await
            }
        }
    }

    /// Hands one record to the producer, in stream order.
    pub(super) async fn enqueue(
        &mut self,
        record: OutboxRecord,
        table: std::sync::Arc<str>,
        seq: u32,
    ) -> Result<(), RelayError> {
        let record = match self.exactly_once.as_mut() {
            None => record,
            Some(eo) => {
                let position = crate::sink::exactly_once::Position {
                    lsn: self.commit_lsn,
                    seq,
                };
                match eo.prepare(&*self.sink, record, position).await {
                    Ok(Some(record)) => record,
                    Ok(None) => {
                        // Already in its partition from a previous run.
                        let ticket = self.tracker.push(0, &table)?;
                        self.tracker.ack(ticket)?;
                        return Ok(());
                    }
                    Err(source) => {
                        return Err(RelayError::ExactlyOnce {
                            lsn: self.commit_lsn,
                            source,
                        });
                    }
                }
            }
        };
        let ticket: Ticket = self.tracker.push(record.size(), &table)?;
        match self.sink.send(ticket, &record).await {
            Ok(()) => {
                let sent = self.observer.event_sent(&record.topic, self.commit_time_us);
                self.tracker.sent(ticket, sent);
                Ok(())
            }
            Err(error) => {
                let lsn = self.commit_lsn;
                self.refused(ticket, record, error, lsn, table.to_string())
                    .await
            }
        }
    }

    /// A record the producer refused to take: poison when the refusal is about
    /// the record itself (dead-lettered or fatal per `--on-poison`), otherwise
    /// the relay stops without acknowledging it.
    async fn refused(
        &mut self,
        ticket: Ticket,
        record: OutboxRecord,
        error: SinkError,
        lsn: Lsn,
        table: String,
    ) -> Result<(), RelayError> {
        match error {
            SinkError::Enqueue {
                poison: true,
                source,
                ..
            } => {
                let poison = Poison::refused(record, source, lsn, table);
                self.poison(ticket, poison).await
            }
            source => Err(RelayError::Sink { lsn, table, source }),
        }
    }

    /// An event that can never be delivered: dead-letter it under that
    /// policy (acknowledged when the dead-letter record is), else stop.
    pub(super) async fn poison(
        &mut self,
        ticket: Ticket,
        poison: Poison,
    ) -> Result<(), RelayError> {
        let Some(topic) = self.config.dead_letter_topic.clone() else {
            tracing::error!(
                lsn = %poison.info.lsn,
                id = %poison.id_text(),
                table = %poison.info.table,
                topic = %poison.info.intended_topic.as_deref().unwrap_or(""),
                error = %poison.info.error,
                "event cannot be delivered; stopping before acknowledging it (--on-poison fail)"
            );
            return Err(poison.into_error());
        };
        tracing::warn!(
            lsn = %poison.info.lsn,
            id = %poison.id_text(),
            table = %poison.info.table,
            topic = %poison.info.intended_topic.as_deref().unwrap_or(""),
            error = %poison.info.error,
            dead_letter_topic = %topic,
            "event cannot be delivered; dead-lettering it"
        );
        let lsn = poison.info.lsn;
        let table = poison.info.table.clone();
        let id = poison.id_text();
        let record = poison.into_dead_letter(&topic);
        self.dead_lettered += 1;
        crate::observability::metrics::dead_lettered();
        match self.sink.send(ticket, &record).await {
            Ok(()) => Ok(()),
            Err(SinkError::Enqueue {
                poison: true,
                source,
                ..
            }) => Err(RelayError::DeadLetter {
                lsn,
                id,
                topic,
                error: source,
            }),
            Err(source) => Err(RelayError::Sink { lsn, table, source }),
        }
    }
}
