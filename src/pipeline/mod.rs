//! Ordering and acknowledgement: the only code that moves the slot.
//!
//! # Invariants
//! 1. Every committed transaction enters the [`AckTracker`] in commit order,
//!    even one with no outbox rows; the frontier is the end LSN of the longest
//!    fully delivered prefix, and only the frontier is reported to Postgres.
//! 2. A keepalive's position is acknowledged only when nothing is in flight
//!    and no transaction is open; otherwise an idle outbox would pin WAL.
//! 3. Backpressure is a chain: when the in-flight caps are reached the
//!    pipeline stops reading the stream, pgwire-replication's bounded channel
//!    fills, and TCP flow control slows the walsender. Memory stays bounded
//!    however large one transaction is.
//! 4. A delivery that fails for good is never acknowledged: the relay stops,
//!    and a restart replays from the confirmed position (at-least-once).
//!
//! Records are enqueued to the producer in stream order, which for pgoutput
//! is commit order, so with the idempotent producer each partition receives
//! events in commit order, and so does each aggregate (one key, one partition).

pub mod ack;

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use pgwire_replication::ReplicationEvent;
use tokio::sync::mpsc;

use crate::config::Config;
use crate::lsn::Lsn;
use crate::outbox::{BindError, EventError, TableMapping, TableName, values};
use crate::pgoutput::{self, DecodeError, Message, RelationCache};
use crate::sink::{Delivery, KafkaSink, SinkError};
use crate::source::{ReplicationStream, SourceError, setup};
use ack::{AckError, AckTracker, Ticket};

/// Process exit codes, distinct per failure class so a supervisor can tell
/// them apart.
pub mod exit_code {
    /// A flag or the environment is wrong; fix the configuration.
    pub const CONFIG: u8 = 2;
    /// Postgres refused or failed in a way a retry will not fix.
    pub const POSTGRES: u8 = 3;
    /// Kafka failed permanently (delivery failed, producer unusable).
    pub const KAFKA: u8 = 4;
    /// An outbox row cannot become a record.
    pub const POISON: u8 = 5;
    /// The replication stream broke protocol rules (a bug: please report).
    pub const INTERNAL: u8 = 70;
}

/// Why the relay stopped.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// Postgres side.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// Kafka producer could not be created or refused a record.
    #[error("{source} (commit LSN {lsn}, table {table}); the slot was not moved past it")]
    Sink {
        /// Commit LSN of the event's transaction.
        lsn: Lsn,
        /// Outbox table.
        table: String,
        /// The refusal.
        #[source]
        source: SinkError,
    },
    /// The producer could not be created.
    #[error(transparent)]
    Producer(SinkError),
    /// The broker did not accept an event.
    #[error(
        "delivery of event id {id} (commit LSN {lsn}) to topic {topic:?} failed: {error}. \
         The slot was not moved past it; fix the cause (topic, ACLs, broker limits) and restart: \
         the relay resumes from the last acknowledged transaction"
    )]
    Delivery {
        /// Commit LSN of the event's transaction.
        lsn: Lsn,
        /// Event id.
        id: String,
        /// Topic.
        topic: String,
        /// librdkafka's error.
        error: rdkafka::error::KafkaError,
    },
    /// The outbox table's columns no longer fit the mapping.
    #[error("at commit LSN {lsn}: {source}. Nothing at or after this transaction was acknowledged")]
    Bind {
        /// Commit LSN of the transaction that announced the new layout.
        lsn: Lsn,
        /// The mismatch.
        #[source]
        source: BindError,
    },
    /// One outbox row cannot become a record.
    #[error(
        "outbox row id {id} in {table} (commit LSN {lsn}) cannot be relayed: {source}. \
         Nothing at or after this transaction was acknowledged; fix or delete the row's \
         cause and restart"
    )]
    Event {
        /// Commit LSN.
        lsn: Lsn,
        /// Table.
        table: String,
        /// Event id, or `?` when unknown.
        id: String,
        /// What is wrong.
        #[source]
        source: EventError,
    },
    /// A WAL message did not decode.
    #[error("cannot decode the pgoutput message at WAL {lsn}: {source}")]
    Decode {
        /// Where.
        lsn: Lsn,
        /// What.
        #[source]
        source: DecodeError,
    },
    /// The stream violated transaction framing.
    #[error("replication stream out of order: {0}")]
    Protocol(#[from] AckError),
    /// The server ended the stream.
    #[error(
        "Postgres ended the replication stream (was the walsender terminated or the server shut down?)"
    )]
    StreamEnded,
}

impl RelayError {
    /// The process exit code for this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            RelayError::Source(SourceError::Connect { .. })
            | RelayError::Source(SourceError::TlsUnsupported { .. })
            | RelayError::Source(SourceError::WalLevel { .. })
            | RelayError::Source(SourceError::TableMissing { .. })
            | RelayError::Source(SourceError::ColumnMissing { .. })
            | RelayError::Source(SourceError::PublicationNoInsert { .. })
            | RelayError::Source(SourceError::PublicationMissingTables { .. })
            | RelayError::Source(SourceError::SlotPhysical { .. })
            | RelayError::Source(SourceError::SlotWrongPlugin { .. })
            | RelayError::Source(SourceError::SlotOtherDatabase { .. })
            | RelayError::Source(SourceError::NoReplicationPrivilege { .. })
            | RelayError::Producer(_) => exit_code::CONFIG,
            RelayError::Source(_) | RelayError::StreamEnded | RelayError::Decode { .. } => {
                exit_code::POSTGRES
            }
            RelayError::Sink { .. } | RelayError::Delivery { .. } => exit_code::KAFKA,
            RelayError::Bind { .. } | RelayError::Event { .. } => exit_code::POISON,
            RelayError::Protocol(_) => exit_code::INTERNAL,
        }
    }
}

/// What a clean shutdown reports.
#[derive(Debug, Clone)]
pub struct Summary {
    /// The final ack frontier (reported to Postgres).
    pub frontier: Lsn,
    /// Events the broker acknowledged this run.
    pub events_acked: u64,
    /// Events still unacknowledged when the shutdown timeout ran out.
    pub abandoned: usize,
}

/// Per-relation state: the announced layout and, for outbox tables, the bound mapping.
struct Outbox {
    tables: Vec<TableName>,
    relations: RelationCache,
    mappings: HashMap<u32, TableMapping>,
    warned_non_insert: bool,
    non_insert_changes: u64,
}

/// The running relay: source, tracker and sink.
pub struct Pipeline {
    config: Config,
    stream: ReplicationStream,
    sink: KafkaSink,
    deliveries: mpsc::UnboundedReceiver<Delivery>,
    tracker: AckTracker,
    outbox: Outbox,
    reported: Lsn,
    commit_lsn: Lsn,
    commit_time_ms: i64,
    events_acked: u64,
    observer: crate::observability::observer::PipelineObserver,
}

/// Start-up checks, then streams until `shutdown` resolves or a fatal error.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()>,
) -> Result<Summary, RelayError> {
    let mut pipeline = Pipeline::start(config).await?;
    let outcome = pipeline.stream_until(shutdown).await;
    let timeout = pipeline.config.shutdown_timeout;
    let summary = pipeline.finish(timeout).await;
    outcome.map(|()| summary)
}

impl Pipeline {
    /// Checks Postgres, sets up the publication and slot, creates the producer, starts the stream.
    pub async fn start(config: Config) -> Result<Self, RelayError> {
        let control = setup::connect(&config).await?;
        let slot = setup::prepare(&control, &config).await?;
        drop(control);
        let (sink, deliveries) = KafkaSink::new(
            &config.kafka_brokers,
            &config.kafka_properties,
            config.max_in_flight_events,
        )
        .map_err(RelayError::Producer)?;
        let stream = ReplicationStream::start(&config, slot.confirmed_flush).await?;
        tracing::info!(
            slot = %config.slot,
            publication = %config.publication,
            lsn = %slot.confirmed_flush,
            tables = %config.tables.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
            "streaming from the slot's confirmed position"
        );
        crate::observability::health::global().set_streaming(true);
        Ok(Pipeline {
            observer: crate::observability::observer::PipelineObserver::new(),
            outbox: Outbox {
                tables: config.tables.clone(),
                relations: RelationCache::default(),
                mappings: HashMap::new(),
                warned_non_insert: false,
                non_insert_changes: 0,
            },
            tracker: AckTracker::new(slot.confirmed_flush),
            reported: slot.confirmed_flush,
            config,
            stream,
            sink,
            deliveries,
            commit_lsn: Lsn::ZERO,
            commit_time_ms: 0,
            events_acked: 0,
        })
    }

    async fn stream_until(&mut self, shutdown: impl Future<Output = ()>) -> Result<(), RelayError> {
        tokio::pin!(shutdown);
        loop {
            let can_read = self.tracker.window_len() < self.config.max_in_flight_events
                && self.tracker.in_flight_bytes() < self.config.max_in_flight_bytes;
            tokio::select! {
                biased;
                () = &mut shutdown => {
                    tracing::info!("shutdown requested: stopped reading, waiting for in-flight deliveries");
                    return Ok(());
                }
                Some(delivery) = self.deliveries.recv() => {
                    self.on_delivery(delivery)?;
                    while let Ok(delivery) = self.deliveries.try_recv() {
                        self.on_delivery(delivery)?;
                    }
                }
                event = self.stream.recv(), if can_read => match event? {
                    Some(event) => self.on_event(event).await?,
                    None => return Err(RelayError::StreamEnded),
                },
            }
            self.report_frontier();
        }
    }

    fn report_frontier(&mut self) {
        let frontier = self.tracker.frontier();
        self.observer.frontier(frontier);
        if frontier > self.reported {
            self.stream.ack(frontier);
            self.reported = frontier;
        }
    }

    fn on_delivery(&mut self, delivery: Delivery) -> Result<(), RelayError> {
        match delivery.outcome {
            Ok(_) => {
                self.observer.event_acked(delivery.ticket);
                self.tracker.ack(delivery.ticket)?;
                self.events_acked += 1;
                Ok(())
            }
            Err(failure) => {
                self.observer
                    .delivery_failed(delivery.ticket, &failure.error);
                let lsn = self
                    .tracker
                    .commit_lsn_of(delivery.ticket)
                    .unwrap_or(Lsn::ZERO);
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

    async fn on_event(&mut self, event: ReplicationEvent) -> Result<(), RelayError> {
        self.observer.received(&event);
        match event {
            ReplicationEvent::Begin {
                final_lsn,
                commit_time_micros,
                ..
            } => {
                self.commit_lsn = final_lsn.into();
                self.commit_time_ms = values::pg_micros_to_unix_ms(commit_time_micros);
                self.tracker.begin(self.commit_lsn)?;
            }
            ReplicationEvent::Commit { end_lsn, .. } => {
                self.tracker.commit(end_lsn.into())?;
            }
            ReplicationEvent::KeepAlive { wal_end, .. } => {
                self.tracker.keepalive(wal_end.into());
            }
            ReplicationEvent::XLogData {
                wal_start, data, ..
            } => {
                let message = pgoutput::decode(&data).map_err(|source| RelayError::Decode {
                    lsn: wal_start.into(),
                    source,
                })?;
                self.on_message(message).await?;
            }
            // Logical decoding messages and stop markers carry no outbox rows here.
            ReplicationEvent::Message { .. } | ReplicationEvent::StoppedAt { .. } => {}
        }
        Ok(())
    }

    async fn on_message(&mut self, message: Message) -> Result<(), RelayError> {
        match message {
            Message::Relation(relation) => {
                let is_outbox = self
                    .outbox
                    .tables
                    .iter()
                    .any(|t| t.schema == relation.namespace && t.name == relation.name);
                if is_outbox {
                    let mapping =
                        TableMapping::bind(&self.config.mapping, &relation).map_err(|source| {
                            RelayError::Bind {
                                lsn: self.commit_lsn,
                                source,
                            }
                        })?;
                    tracing::debug!(table = %mapping.table(), relation_id = relation.id, "bound outbox table");
                    self.outbox.mappings.insert(relation.id, mapping);
                } else {
                    self.outbox.mappings.remove(&relation.id);
                }
                self.outbox.relations.insert(relation);
            }
            Message::Insert { relation_id, new } => {
                let Some(mapping) = self.outbox.mappings.get(&relation_id) else {
                    return Ok(());
                };
                let Some(relation) = self.outbox.relations.get(relation_id) else {
                    return Ok(());
                };
                let record =
                    mapping
                        .map(relation, &new, self.commit_time_ms)
                        .map_err(|source| {
                            let id = mapping.id_text(&new).unwrap_or_else(|| "?".to_owned());
                            tracing::error!(
                                lsn = %self.commit_lsn,
                                table = %mapping.table(),
                                id = %id,
                                error = %source,
                                "outbox row cannot be relayed"
                            );
                            RelayError::Event {
                                lsn: self.commit_lsn,
                                table: mapping.table().to_string(),
                                id,
                                source,
                            }
                        })?;
                let ticket: Ticket = self.tracker.push(record.size())?;
                self.sink
                    .send(ticket, &record)
                    .await
                    .map_err(|source| RelayError::Sink {
                        lsn: self.commit_lsn,
                        table: mapping.table().to_string(),
                        source,
                    })?;
                self.observer
                    .event_sent(ticket, &record.topic, record.size(), self.commit_time_ms);
            }
            Message::Update { relation_id, .. } | Message::Delete { relation_id, .. } => {
                if let Some(mapping) = self.outbox.mappings.get(&relation_id) {
                    self.outbox.non_insert_changes += 1;
                    if !self.outbox.warned_non_insert {
                        self.outbox.warned_non_insert = true;
                        tracing::warn!(
                            table = %mapping.table(),
                            lsn = %self.commit_lsn,
                            "ignoring UPDATE/DELETE on an outbox table: only inserts are relayed \
                             (create the publication WITH (publish = 'insert') to stop receiving them)"
                        );
                    }
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

    /// Stops reading, waits up to `timeout` for in-flight deliveries, reports
    /// the final frontier and closes the stream.
    pub async fn finish(mut self, timeout: Duration) -> Summary {
        self.observer.streaming(false);
        let deadline = tokio::time::Instant::now() + timeout;
        while self.tracker.window_len() > 0 {
            match tokio::time::timeout_at(deadline, self.deliveries.recv()).await {
                Ok(Some(delivery)) => {
                    // A failure here is already reported or will be replayed;
                    // only successes can move the frontier.
                    if delivery.outcome.is_ok() && self.tracker.ack(delivery.ticket).is_ok() {
                        self.observer.event_acked(delivery.ticket);
                        self.events_acked += 1;
                    }
                    if delivery.outcome.is_err() {
                        break;
                    }
                }
                Ok(None) | Err(_) => break,
            }
        }
        self.report_frontier();
        let frontier = self.tracker.frontier();
        let abandoned = self.tracker.in_flight_events();
        if abandoned > 0 {
            tracing::warn!(
                in_flight = abandoned,
                "stopping with unacknowledged events; they will be sent again after restart"
            );
        }
        self.stream
            .close(
                frontier,
                self.config.status_interval * 2 + Duration::from_secs(1),
            )
            .await;
        tracing::info!(
            frontier = %frontier,
            acked = self.events_acked,
            "stopped; slot confirmed up to the final frontier"
        );
        Summary {
            frontier,
            events_acked: self.events_acked,
            abandoned,
        }
    }
}
