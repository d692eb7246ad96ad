//! The seams: the simulated world behind the pipeline's `Source`, `Stream`
//! and `Sink` traits, and the driver that runs the real pipeline over it,
//! restarting it as a supervisor would, until the schedule has recovered.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::future::BoxFuture;
use outbox_relay::config::{Cli, Config};
use outbox_relay::lsn::Lsn;
use outbox_relay::outbox::connect::ColumnFacts;
use outbox_relay::outbox::{OutboxRecord, TableName};
use outbox_relay::pipeline::{Pipeline, RelayError};
use outbox_relay::postgres::catalog::publication::Publication;
use outbox_relay::sink::exactly_once::{ReadBack, Tail, TailError, window};
use outbox_relay::sink::{Blame, Delivery, DeliveryFailure, Sink, SinkError, Ticket};
use outbox_relay::source::{ServerId, Source, SourceError, SourceEvent, Stream, resume_point};
use outbox_relay::startup::Started;
use rand::Rng;
use tokio::time::Instant;

use super::broker::{Outcome, TopicLog};
use super::registry::SimRegistry;
use super::{Shared, Step};

/// The relay's configuration for this schedule, from its flags: small caps,
/// so backpressure is exercised. Parsed once per policy combination (clap
/// is the slowest part of a small schedule); the caps are then set.
fn config(plan: &super::Plan) -> Config {
    static PARSED: OnceLock<Vec<Config>> = OnceLock::new();
    let parsed = PARSED.get_or_init(|| {
        let mut configs = Vec::new();
        for (registry, exactly_once, dead_letter) in [
            (false, false, false),
            (false, false, true),
            (false, true, false),
            (false, true, true),
            (true, false, false),
            (true, false, true),
            (true, true, false),
            (true, true, true),
        ] {
            let mut args: Vec<&str> = vec![
                "outbox-relay",
                "--postgres-url",
                "postgres://sim@127.0.0.1:9/sim",
                "--kafka-brokers",
                "127.0.0.1:9",
                "--table",
                "public.outbox",
                "--reconnect-backoff-min",
                "10ms",
                "--reconnect-backoff-max",
                "1s",
                "--max-in-flight-events",
                "1",
                "--max-in-flight-bytes",
                "1024",
            ];
            if dead_letter {
                args.extend([
                    "--on-poison",
                    "dead-letter",
                    "--dead-letter-topic",
                    super::DLQ,
                ]);
            }
            if exactly_once {
                args.extend(["--delivery", "exactly-once"]);
            }
            if !registry {
                args.extend(["--message-prefix", super::wal::PREFIX]);
            }
            if registry {
                args.extend([
                    "--key-converter",
                    "avro",
                    "--value-converter",
                    "avro",
                    "--schema-registry-url",
                    "http://127.0.0.1:9",
                ]);
            }
            let cli = Cli::try_parse_global_from(args).expect("the simulation's flags parse");
            configs.push(Config::from_cli(&cli).expect("the simulation's flags are valid"));
        }
        configs
    });
    let index = usize::from(plan.registry) * 4
        + usize::from(plan.exactly_once) * 2
        + usize::from(plan.dead_letter);
    let mut config = parsed[index].clone();
    config.flags.max_in_flight_events = plan.max_events;
    config.flags.max_in_flight_bytes = plan.max_bytes;
    // Each schedule has its own registry, so none of the ids another one's gave.
    if let Some(connect) = config.mapping.connect.as_mut() {
        connect.registry.ids = Default::default();
    }
    config
}

/// Postgres: sessions over the simulated WAL.
pub struct SimSource {
    shared: Shared,
    /// The server and timeline of the last session (a promotion changes it).
    previous: Option<ServerId>,
}

/// One replication session.
pub struct SimStream {
    shared: Shared,
    id: u64,
    start: Lsn,
    server: ServerId,
}

fn broken() -> SourceError {
    SourceError::StreamEnded {
        slot: "outbox_relay".to_owned(),
    }
}

impl Source for SimSource {
    type Stream = SimStream;
    type Check = ();

    /// As the real source: on another timeline, from no later than the slot's position
    /// there; the session confirms `acked` up to where it starts.
    async fn start(&mut self, from: Lsn, acked: Lsn) -> Result<SimStream, SourceError> {
        let mut world = self.shared.lock();
        if world.held > 0 {
            // The standby relay holding the slot relays while this one waits.
            world.rival();
            world.held -= 1;
            return Err(SourceError::Stream {
                slot: "outbox_relay".to_owned(),
                source: pgwire_replication::PgWireError::Server(
                    "replication slot \"outbox_relay\" is active for PID 42 (SQLSTATE 55006)"
                        .to_owned(),
                ),
            });
        }
        if world.fault_now() {
            world.note("fault: connect refused".into());
            return Err(broken());
        }
        let server = ServerId {
            addr: "127.0.0.1:9".to_owned(),
            system_id: super::SYSTEM_ID.to_owned(),
            timeline: world.timeline,
        };
        let confirmed = Some(Lsn(world.confirmed));
        let from = resume_point(self.previous.as_ref(), &server, from, confirmed);
        let (id, start) = world.start_session(from.0);
        world.on_ack(acked.0.min(start), true, server.timeline);
        self.previous = Some(server.clone());
        Ok(SimStream {
            shared: self.shared.clone(),
            id,
            start: Lsn(start),
            server,
        })
    }

    async fn partition_root(
        &mut self,
        _relation_id: u32,
    ) -> Result<Option<TableName>, SourceError> {
        Ok(None)
    }

    fn check_publication(&mut self) -> BoxFuture<'static, ()> {
        Box::pin(std::future::ready(()))
    }

    fn publication_checked(&mut self, (): ()) -> Result<bool, SourceError> {
        Ok(true)
    }

    /// The outbox's catalog, for the avro converters: `id` and `aggregate_type` NOT NULL.
    async fn column_facts(&mut self, _relation_id: u32) -> Result<Vec<ColumnFacts>, SourceError> {
        let fact = |name: &str, not_null: bool| ColumnFacts {
            name: name.to_owned(),
            not_null,
            default: None,
        };
        Ok(vec![
            fact("id", true),
            fact("aggregate_type", true),
            fact("aggregate_id", false),
            fact("event_type", false),
            fact("payload", false),
        ])
    }

    async fn wal_end(&mut self) -> Lsn {
        Lsn(self.shared.lock().wal.end())
    }
}

impl Stream for SimStream {
    fn started_at(&self) -> Lsn {
        self.start
    }

    fn server(&self) -> &ServerId {
        &self.server
    }

    async fn recv(&mut self) -> Result<SourceEvent, SourceError> {
        // The sleeps here and in `broker` are the simulated world's own time on
        // a paused clock (a walsender's idle keepalive interval, a scheduled
        // delay): they advance instantly and deterministically, and nothing
        // waits on them for progress.
        loop {
            let step = self.shared.lock().recv(self.id);
            match step {
                Step::Event(event) => return Ok(event),
                Step::Idle(event) => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    return Ok(event);
                }
                Step::Wait(pause) => tokio::time::sleep(pause).await,
                Step::Break => return Err(broken()),
                Step::Crash => {
                    self.shared.stop.notify_one();
                    std::future::pending::<()>().await;
                }
            }
        }
    }

    fn ack(&self, lsn: Lsn) {
        let mut world = self.shared.lock();
        let live = world.session.as_ref().is_some_and(|(id, _)| *id == self.id);
        world.on_ack(lsn.0, live, self.server.timeline);
        self.shared.progress.notify_one();
    }

    async fn close(self, wait_for: Lsn, _timeout: Duration) {
        self.ack(wait_for);
        let mut world = self.shared.lock();
        if world.session.as_ref().is_some_and(|(id, _)| *id == self.id) {
            world.session = None;
        }
    }
}

/// Kafka: the simulated producer.
pub struct SimSink(pub Shared);

impl SimSink {
    fn enqueue(&self, ticket: u64, record: &OutboxRecord, alone: bool) -> Result<(), SinkError> {
        let mut world = self.0.lock();
        let world = &mut *world;
        if let Some(source) = world.broker.refuse_at_enqueue(record) {
            let id = record.id_text();
            world.note(format!("refused {id} at hand-over ({})", source.code));
            let topic = record.topic.clone();
            return Err(SinkError::Enqueue { topic, id, source });
        }
        world.note(format!("enqueue {} {}", record.id_text(), record.topic));
        world
            .broker
            .enqueue(&mut world.rng, ticket, record.clone(), alone);
        if record.topic != super::DLQ {
            world
                .sent
                .insert(String::from_utf8_lossy(&record.id).into_owned());
        }
        world.on_send();
        self.0.broker_wake.notify_one();
        Ok(())
    }
}

impl Sink for SimSink {
    async fn send(&self, ticket: Ticket, record: &OutboxRecord) -> Result<(), SinkError> {
        self.enqueue(ticket.0, record, false)
    }

    async fn send_alone(&self, ticket: Ticket, record: &OutboxRecord) -> Result<(), SinkError> {
        self.enqueue(ticket.0, record, true)
    }

    fn in_flight(&self) -> usize {
        self.0.lock().broker.in_flight()
    }
}

impl ReadBack for SimSink {
    async fn partition_count(&self, topic: &str) -> Result<i32, TailError> {
        Ok(self
            .0
            .lock()
            .broker
            .partitions
            .get(topic)
            .copied()
            .unwrap_or(1))
    }

    async fn tails(
        &self,
        topic: &str,
        source: &str,
        partitions: i32,
        floor: Lsn,
        wal_end: Lsn,
    ) -> Vec<Result<Tail, TailError>> {
        let world = self.0.lock();
        let log = TopicLog(&world.broker, topic);
        window::tails(&log, topic, source, partitions, floor, wal_end)
    }
}

/// Delivers what is due, in any order across partitions, until aborted.
async fn broker(shared: Shared) {
    loop {
        let next = shared.lock().broker.next_due();
        match next {
            Some(at) => {
                tokio::select! {
                    biased;
                    () = shared.broker_wake.notified() => {}
                    () = tokio::time::sleep_until(at) => {}
                }
            }
            None => shared.broker_wake.notified().await,
        }
        loop {
            let mut world = shared.lock();
            if world.crash {
                break;
            }
            let Some((pending, outcome)) = world.broker.pop_due(Instant::now()) else {
                break;
            };
            let outcome = match outcome {
                Outcome::Appended => Ok(()),
                Outcome::Failed(error) => {
                    let id = String::from_utf8_lossy(&pending.record.id).into_owned();
                    world.note(format!("refused {id} ({})", error.code));
                    if error.blame == Blame::Batch {
                        world.batch_refused.insert(id);
                    }
                    Err(DeliveryFailure {
                        refusal: error,
                        record: OutboxRecord {
                            partition: Some(pending.partition),
                            ..pending.record
                        },
                    })
                }
            };
            if world.fault_now() {
                if world.rng.random_bool(0.5) {
                    // Appended, but the report is lost with the process.
                    world.note("fault: crash before a delivery report".into());
                    world.crash = true;
                    shared.stop.notify_one();
                    break;
                }
                let end = Instant::now() + Duration::from_millis(world.rng.random_range(100..5000));
                world.note("fault: broker outage".into());
                world.broker.outage_until = Some(end);
            }
            if let Some(tx) = &world.deliveries {
                let _ = tx.send(Delivery {
                    ticket: Ticket(pending.ticket),
                    outcome,
                });
            }
        }
    }
}

/// Runs the pipeline, restarting it after each stop, until the WAL is
/// relayed and the faults are spent. Runs are bounded in count and in
/// (virtual) time.
pub async fn drive(shared: Shared) -> Result<(), String> {
    let config = config(&shared.lock().plan);
    for run in 0..50 {
        let (deliveries_tx, deliveries) = tokio::sync::mpsc::unbounded_channel();
        let (sigterm, shutdown) = tokio::sync::oneshot::channel::<()>();
        {
            let mut world = shared.lock();
            world.note(format!("run {run}"));
            world.runs = run;
            world.sigterm_at = None;
            world.sent.clear();
            world.deliveries = Some(deliveries_tx);
            world.sigterm = Some(sigterm);
            world.crash = false;
            world.session = None;
            world.broker.queue.clear();
            world.broker.failing.clear();
        }
        let broker = tokio::spawn(broker(shared.clone()));
        let health = Arc::new(outbox_relay::observability::health::Health::new(
            Default::default(),
        ));
        shared.lock().health = Some(health.clone());
        let (confirmed, all_tables, cleaning) = {
            let world = shared.lock();
            (world.confirmed, world.plan.all_tables, world.plan.cleanup)
        };
        let slot = Started::resuming(
            Lsn(confirmed),
            Publication {
                oid: 1,
                all_tables,
                server_version: 170_000,
                members: Vec::new(),
            },
        );
        let source = SimSource {
            shared: shared.clone(),
            previous: None,
        };
        let pipeline = Pipeline::new(
            config.clone(),
            source,
            Arc::new(SimSink(shared.clone())),
            deliveries,
            health,
            &slot,
            cleaning.then(|| super::cleanup::cleanup(&shared)),
        );
        let pipeline = match shared.lock().plan.registry {
            true => pipeline.with_registry(Arc::new(SimRegistry(shared.clone()))),
            false => pipeline,
        };
        let shutdown = async move {
            if shutdown.await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let done = caught_up(shared.clone());
        let outcome = tokio::select! {
            biased;
            () = shared.stop.notified() => None,
            () = done => unreachable!(),
            r = tokio::time::timeout(Duration::from_secs(3600), pipeline.run(shutdown)) => Some(r),
        };
        broker.abort();
        let mut world = shared.lock();
        world.deliveries = None;
        match outcome {
            None => world.note("crashed".into()),
            Some(Err(_)) => return Err("a run made no progress for an hour (virtual)".into()),
            Some(Ok(Ok(summary))) => {
                world.note(format!("stopped at {}", summary.frontier));
                let bound = super::cleanup::stop_bound(config.flags.shutdown_timeout);
                if let Some(at) = world.sigterm_at
                    && at.elapsed() > bound
                {
                    return Err(format!(
                        "stopped {:?} after SIGTERM (--shutdown-timeout {:?})",
                        at.elapsed(),
                        config.flags.shutdown_timeout
                    ));
                }
            }
            Some(Ok(Err(e))) => match e {
                // The operator fixes the cause (e.g. message.max.bytes) and restarts.
                RelayError::Poison { .. } if !world.plan.dead_letter => {
                    world.note(format!("stop: poison ({e})"));
                    world.broker.poison.clear();
                    world.broker.too_large.clear();
                }
                RelayError::Delivery { .. } => world.note(format!("stop: delivery ({e})")),
                // The operator fixes the cause (a trigger refusing deletes) and restarts.
                RelayError::Cleanup { .. }
                    if world.cleanup.as_ref().is_some_and(|c| c.refusing) =>
                {
                    world.note(format!("stop: cleanup ({e})"));
                    if let Some(rows) = world.cleanup.as_mut() {
                        rows.refusing = false;
                    }
                }
                RelayError::Sink { .. } => world.note(format!("stop: enqueue ({e})")),
                // Exit 6: the operator fixes the dead-letter topic and restarts.
                RelayError::DeadLetter { .. } => world.note(format!("stop: dead-letter ({e})")),
                e => return Err(format!("unexpected failure: {e}")),
            },
        }
        if !world.faults_on && world.finished() {
            return Ok(());
        }
    }
    Err("not recovered after 50 runs".into())
}

/// Resolves never; once the slot has confirmed the whole WAL, turns faults
/// off and sends SIGTERM. Woken by each confirmation, not by a clock.
async fn caught_up(shared: Shared) {
    loop {
        {
            let mut world = shared.lock();
            if world.finished() {
                world.faults_on = false;
                world.sigterm();
            }
        }
        shared.progress.notified().await;
    }
}
