//! The real pipeline against an in-memory source and sink, on a paused clock.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use futures_util::future::BoxFuture;
use tokio::sync::mpsc;

use super::{Pipeline, RelayError, Summary};
use crate::config::{Cli, Config};
use crate::lsn::Lsn;
use crate::observability::health::Health;
use crate::outbox::OutboxRecord;
use crate::postgres::catalog::publication::Publication;
use crate::sink::exactly_once::{ReadBack, Tail, TailError};
use crate::sink::{Delivery, Sink, SinkError, Ticket};
use crate::source::{ServerId, Source, SourceError, SourceEvent, Stream};
use crate::startup::Started;

const START: Lsn = Lsn(0x10);

type Script = Arc<Mutex<VecDeque<Result<SourceEvent, SourceError>>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Replays a script across sessions; an exhausted script idles like a quiet server.
#[derive(Default)]
struct FakeSource {
    script: Script,
    /// `(from, acked)` of every session started.
    starts: Arc<Mutex<Vec<(Lsn, Lsn)>>>,
    /// Every position confirmed, in order.
    acks: Arc<Mutex<Vec<Lsn>>>,
    /// Sessions that open; later attempts never answer (an unreachable host).
    answered: Option<usize>,
    /// Publication checks never answer (a control connection gone silent).
    check_hangs: bool,
}

struct FakeStream {
    script: Script,
    acks: Arc<Mutex<Vec<Lsn>>>,
    from: Lsn,
    server: ServerId,
}

impl Source for FakeSource {
    type Stream = FakeStream;
    type Check = ();

    async fn start(&mut self, from: Lsn, acked: Lsn) -> Result<FakeStream, SourceError> {
        let attempts = {
            let mut starts = lock(&self.starts);
            starts.push((from, acked));
            starts.len()
        };
        if self.answered.is_some_and(|n| attempts > n) {
            std::future::pending::<()>().await;
        }
        Ok(FakeStream {
            script: Arc::clone(&self.script),
            acks: Arc::clone(&self.acks),
            from,
            server: ServerId {
                addr: "sim:5432".into(),
                system_id: "1".into(),
                timeline: 1,
            },
        })
    }

    async fn partition_root(
        &mut self,
        _: u32,
    ) -> Result<Option<crate::outbox::TableName>, SourceError> {
        Ok(None)
    }

    fn check_publication(&mut self) -> BoxFuture<'static, ()> {
        match self.check_hangs {
            true => Box::pin(std::future::pending()),
            false => Box::pin(std::future::ready(())),
        }
    }

    fn publication_checked(&mut self, (): ()) -> Result<bool, SourceError> {
        Ok(true)
    }

    async fn wal_end(&mut self) -> Lsn {
        Lsn(u64::MAX)
    }
}

impl Stream for FakeStream {
    fn started_at(&self) -> Lsn {
        self.from
    }

    fn server(&self) -> &ServerId {
        &self.server
    }

    async fn recv(&mut self) -> Result<SourceEvent, SourceError> {
        let next = lock(&self.script).pop_front();
        match next {
            Some(event) => event,
            None => std::future::pending().await,
        }
    }

    fn ack(&self, lsn: Lsn) {
        lock(&self.acks).push(lsn);
    }

    async fn close(self, _: Lsn, _: Duration) {}
}

/// Records what it is given; acknowledges after `ack_delay` when `auto_ack`.
struct FakeSink {
    deliveries: mpsc::UnboundedSender<Delivery>,
    sent: Mutex<Vec<(Ticket, OutboxRecord)>>,
    auto_ack: bool,
    ack_delay: Duration,
}

impl Sink for FakeSink {
    async fn send(&self, ticket: Ticket, record: &OutboxRecord) -> Result<(), SinkError> {
        lock(&self.sent).push((ticket, record.clone()));
        if self.auto_ack {
            let delivery = Delivery {
                ticket,
                outcome: Ok(()),
            };
            let (deliveries, delay) = (self.deliveries.clone(), self.ack_delay);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = deliveries.send(delivery);
            });
        }
        Ok(())
    }

    async fn send_alone(&self, ticket: Ticket, record: &OutboxRecord) -> Result<(), SinkError> {
        self.send(ticket, record).await
    }

    fn in_flight(&self) -> usize {
        0
    }
}

impl ReadBack for FakeSink {
    async fn partition_count(&self, _: &str) -> Result<i32, TailError> {
        Ok(1)
    }

    async fn tails(
        &self,
        _: &str,
        _: &str,
        partitions: i32,
        _: Lsn,
        _: Lsn,
    ) -> Vec<Result<Tail, TailError>> {
        (0..partitions).map(|_| Ok(Tail::default())).collect()
    }
}

fn begin(commit: u64) -> Result<SourceEvent, SourceError> {
    Ok(SourceEvent::Begin {
        commit_lsn: Lsn(commit),
        commit_time_us: 0,
    })
}

fn event(lsn: u64, id: &str) -> Result<SourceEvent, SourceError> {
    Ok(SourceEvent::Message {
        transactional: true,
        lsn: Lsn(lsn),
        prefix: "outbox".into(),
        content: Bytes::from(format!(
            r#"{{"id": "{id}", "event_type": "Order", "payload": "{{}}"}}"#
        )),
    })
}

fn commit(end: u64) -> Result<SourceEvent, SourceError> {
    Ok(SourceEvent::Commit(Lsn(end)))
}

fn keepalive(wal_end: u64) -> Result<SourceEvent, SourceError> {
    Ok(SourceEvent::KeepAlive(Lsn(wal_end)))
}

fn config(extra: &[&str]) -> Config {
    let cli = Cli::try_parse_from(
        [
            "outbox-relay",
            "--postgres-url",
            "postgres://relay@127.0.0.1:5432/app",
            "--kafka-brokers",
            "127.0.0.1:9092",
            "--table",
            "none",
            "--message-prefix",
            "outbox",
            "--shutdown-timeout",
            "5s",
        ]
        .iter()
        .chain(extra),
    );
    match cli
        .map_err(|e| e.to_string())
        .and_then(|cli| Config::from_cli(&cli).map_err(|e| e.to_string()))
    {
        Ok(config) => config,
        Err(e) => panic!("test configuration: {e}"),
    }
}

/// Runs the script through the real pipeline until a shutdown after ten
/// (paused) seconds; returns the outcome, the source and what the sink received.
async fn run(
    script: Vec<Result<SourceEvent, SourceError>>,
    auto_ack: bool,
) -> (
    Result<Summary, RelayError>,
    FakeSource,
    Vec<(Ticket, OutboxRecord)>,
) {
    run_with(script, auto_ack, Duration::ZERO, &[], FakeSource::default()).await
}

/// [`run`] with acknowledgements after `ack_delay`, more flags, and the faults of `source`
/// (sessions that never open, checks that never answer).
async fn run_with(
    script: Vec<Result<SourceEvent, SourceError>>,
    auto_ack: bool,
    ack_delay: Duration,
    flags: &[&str],
    source: FakeSource,
) -> (
    Result<Summary, RelayError>,
    FakeSource,
    Vec<(Ticket, OutboxRecord)>,
) {
    let source = FakeSource {
        script: Arc::new(Mutex::new(script.into())),
        ..source
    };
    let observed = FakeSource {
        script: Arc::clone(&source.script),
        starts: Arc::clone(&source.starts),
        acks: Arc::clone(&source.acks),
        ..FakeSource::default()
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let sink = Arc::new(FakeSink {
        deliveries: tx,
        sent: Mutex::new(Vec::new()),
        auto_ack,
        ack_delay,
    });
    let slot = Started::resuming(
        START,
        Publication {
            oid: 1,
            all_tables: false,
            server_version: 180_000,
            members: Vec::new(),
        },
    );
    let health = Arc::new(Health::new(Default::default()));
    let pipeline = Pipeline::new(
        config(flags),
        source,
        Arc::clone(&sink),
        rx,
        health,
        &slot,
        None,
    );
    let outcome = pipeline
        .run(tokio::time::sleep(Duration::from_secs(10)))
        .await;
    let sent = std::mem::take(&mut *lock(&sink.sent));
    (outcome, observed, sent)
}

fn summary(outcome: Result<Summary, RelayError>) -> Summary {
    match outcome {
        Ok(summary) => summary,
        Err(e) => panic!("the pipeline failed: {e}"),
    }
}

#[tokio::test(start_paused = true)]
async fn the_slot_moves_to_a_transactions_end_once_the_broker_acknowledged_it() {
    let script = vec![begin(0x100), event(0x90, "e1"), commit(0x110)];
    let (outcome, source, sent) = run(script, true).await;
    let summary = summary(outcome);
    assert_eq!(sent.len(), 1);
    assert_eq!(summary.frontier, Lsn(0x110));
    assert_eq!(lock(&source.acks).last(), Some(&Lsn(0x110)));
}

/// A publication check the server never answers (a control connection gone silent) holds up
/// neither the acknowledgements nor a stop: the check runs beside the stream.
#[tokio::test(start_paused = true)]
async fn a_publication_check_that_never_answers_holds_up_nothing() {
    let script = vec![
        begin(0x100),
        event(0x90, "e1"),
        commit(0x110),
        begin(0x200),
        event(0x190, "e2"),
        commit(0x210),
    ];
    let silent = FakeSource {
        check_hangs: true,
        ..FakeSource::default()
    };
    // Acknowledgements come a second after each send: the check starts while the stream is
    // open, and never answers through the shutdown at ten seconds.
    let running = run_with(script, true, Duration::from_secs(1), &[], silent);
    let (outcome, _, sent) = tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the relay stops at the shutdown, not held by the check");
    let summary = summary(outcome);
    assert_eq!(sent.len(), 2);
    assert_eq!(summary.events_acked, 2);
}

#[tokio::test(start_paused = true)]
async fn nothing_past_an_unacknowledged_event_is_confirmed() {
    let script = vec![
        begin(0x100),
        event(0x90, "e1"),
        commit(0x110),
        keepalive(0x500),
    ];
    let (outcome, source, sent) = run(script, false).await;
    let summary = summary(outcome);
    assert_eq!(sent.len(), 1);
    assert_eq!(summary.frontier, START);
    assert_eq!(summary.abandoned, 1);
    assert!(lock(&source.acks).iter().all(|&lsn| lsn <= START));
}

#[tokio::test(start_paused = true)]
async fn an_idle_outbox_follows_keepalives() {
    let (outcome, source, _) = run(vec![keepalive(0x500)], false).await;
    assert_eq!(summary(outcome).frontier, Lsn(0x500));
    assert_eq!(lock(&source.acks).last(), Some(&Lsn(0x500)));
}

#[tokio::test(start_paused = true)]
async fn a_stream_break_mid_transaction_resumes_after_the_last_transaction_received() {
    let ended = || {
        Err(SourceError::StreamEnded {
            slot: "outbox_relay".into(),
        })
    };
    let script = vec![
        begin(0x100),
        event(0x90, "e1"),
        commit(0x110),
        begin(0x200),
        event(0x190, "e2"),
        ended(),
        begin(0x200),
        event(0x190, "e2"),
        commit(0x210),
    ];
    let (outcome, source, sent) = run(script, true).await;
    let summary = summary(outcome);
    assert_eq!(summary.reconnects, 1);
    assert_eq!(summary.frontier, Lsn(0x210));
    let starts = lock(&source.starts).clone();
    assert_eq!(starts.len(), 2);
    assert_eq!(
        starts[1].0,
        Lsn(0x110),
        "resumes after the last commit received"
    );
    // The open transaction's event is sent again: at-least-once.
    let ids: Vec<_> = sent.iter().map(|(_, r)| r.id_text()).collect();
    assert_eq!(ids, ["e1", "e2", "e2"]);
}

/// Issue 21 §7: a stop while the stream is down (waiting to reconnect) confirms what was
/// acknowledged meanwhile, on a session opened for it.
#[tokio::test(start_paused = true)]
async fn a_stop_while_reconnecting_confirms_the_frontier_acknowledged_meanwhile() {
    let ended = Err(SourceError::StreamEnded {
        slot: "outbox_relay".into(),
    });
    let script = vec![begin(0x100), event(0x90, "e1"), commit(0x110), ended];
    // The stream breaks at once; the broker acknowledges a second later, during the backoff,
    // and the stop comes before the next attempt.
    let backoff = [
        "--reconnect-backoff-min",
        "60s",
        "--reconnect-backoff-max",
        "60s",
    ];
    let (outcome, source, _) = run_with(
        script,
        true,
        Duration::from_secs(1),
        &backoff,
        FakeSource::default(),
    )
    .await;
    assert_eq!(summary(outcome).frontier, Lsn(0x110));
    assert_eq!(lock(&source.acks).last(), Some(&Lsn(0x110)));
    let starts = lock(&source.starts).clone();
    assert_eq!(starts, [(START, START), (Lsn(0x110), Lsn(0x110))]);
}

/// A stop while a connection attempt hangs (an unanswering host) does not wait for it.
#[tokio::test(start_paused = true)]
async fn a_stop_does_not_wait_for_a_hanging_connection_attempt() {
    let ended = Err(SourceError::StreamEnded {
        slot: "outbox_relay".into(),
    });
    let script = vec![begin(0x100), event(0x90, "e1"), commit(0x110), ended];
    let backoff = ["--reconnect-backoff-min", "1s"];
    let run = run_with(
        script,
        true,
        Duration::ZERO,
        &backoff,
        FakeSource {
            answered: Some(1),
            ..FakeSource::default()
        },
    );
    // The stop comes at 10 s; without it the attempt never ends.
    let outcome = tokio::time::timeout(Duration::from_secs(600), run).await;
    let (outcome, _, sent) = outcome.expect("the stop waited for the connection attempt");
    assert_eq!(summary(outcome).reconnects, 1);
    assert_eq!(sent.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_protocol_violation_stops_the_relay_without_confirming_it() {
    let script = vec![begin(0x100), begin(0x200)];
    let (outcome, source, _) = run(script, true).await;
    assert!(matches!(outcome, Err(RelayError::Protocol(_))));
    assert!(lock(&source.acks).iter().all(|&lsn| lsn <= START));
}

/// Issue 23: the source and the sink convert the drivers' types at the edge, so the pipeline and
/// observability name neither driver (a word of its own, not in `librdkafka`).
#[test]
fn the_pipeline_and_observability_name_no_driver() {
    let drivers = [concat!("rd", "kafka"), concat!("pgwire", "_replication")];
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut dirs = vec![src.join("pipeline"), src.join("observability")];
    let (mut files, mut named) = (0, Vec::new());
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            files += 1;
            let text = std::fs::read_to_string(&path).unwrap();
            let words = text.split(|c: char| !(c.is_alphanumeric() || c == '_'));
            if words.into_iter().any(|word| drivers.contains(&word)) {
                named.push(path.display().to_string());
            }
        }
    }
    assert!(files > 5, "the source tree was not found");
    assert!(named.is_empty(), "a driver named in {named:?}");
}
