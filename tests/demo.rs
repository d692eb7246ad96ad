//! `outbox-relay demo`: events travel from Postgres to Kafka and are printed;
//! the end of `--duration` stops everything with exit code 0, removing the
//! throwaway cluster, or on a user's own server dropping the demo's slot.

use std::path::Path;
use std::time::Duration;

use crate::support::postgres::PgCluster;
use crate::support::relay::run_command;

/// Runs the demo for a few seconds at 10 events/s; returns (exit code, stdout, stderr).
fn demo(extra: &[&str]) -> (Option<i32>, String, String) {
    let mut args = vec![
        "demo",
        "--duration",
        "6s",
        "--rate",
        "10",
        // A port the system picks: one chosen beforehand may be taken by then.
        "--http-addr",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    run_command(&args)
}

/// The printed records: `topic pP@O key=K id=... {...}` lines.
fn records(out: &str) -> Vec<&str> {
    out.lines().filter(|l| l.starts_with("order.")).collect()
}

/// The final tally line's numbers: written, relayed, received.
fn tally(out: &str) -> [u64; 3] {
    let line = out
        .lines()
        .find(|l| l.starts_with("demo: stopped;"))
        .unwrap_or_else(|| panic!("no tally in:\n{out}"));
    let numbers: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect();
    [numbers[0], numbers[1], numbers[2]]
}

#[test]
fn the_demo_relays_and_prints_events_then_removes_its_cluster() {
    let (code, out, err) = demo(&[]);
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    let [written, relayed, received] = tally(&out);
    assert!(written > 0, "{out}");
    assert_eq!(relayed, written, "{out}");
    assert_eq!(received, written, "{out}");
    let printed = records(&out);
    assert_eq!(printed.len() as u64, written, "{out}");
    assert!(
        printed.iter().any(|l| l.starts_with("order.created p")
            && l.contains(" key=order-1 ")
            && l.contains(r#""status": "created""#)),
        "{out}"
    );
    assert!(out.contains("/metrics"), "{out}");
    let dir = out
        .lines()
        .find_map(|l| l.strip_prefix("demo: removed the throwaway PostgreSQL in "))
        .unwrap_or_else(|| panic!("no removal line in:\n{out}"));
    assert!(dir.starts_with("/tmp/outbox-relay-demo-"), "{dir}");
    assert!(!Path::new(dir).exists(), "{dir} is still there");
}

#[tokio::test(flavor = "current_thread")]
async fn the_demo_runs_against_a_given_server_and_drops_its_slot() {
    let pg = PgCluster::start();
    let url = pg.url();
    let (code, out, err) = demo(&["--postgres-url", &url]);
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    let [written, relayed, received] = tally(&out);
    assert!(
        written > 0 && relayed == written && received == written,
        "{out}"
    );
    assert!(!out.contains("throwaway"), "{out}");
    let rows = pg
        .execute("SELECT count(*)::text FROM outbox_demo.outbox")
        .await;
    assert_eq!(rows[0][0].as_deref(), Some(written.to_string().as_str()));
    let slots = pg
        .execute("SELECT slot_name FROM pg_replication_slots")
        .await;
    assert!(slots.is_empty(), "the demo left {slots:?} behind");
}

/// The demo against a user's server and Kafka leaves no slot and no lineage record, so it
/// runs again.
#[tokio::test(flavor = "current_thread")]
async fn a_second_demo_against_the_same_server_and_kafka_runs() {
    let pg = PgCluster::start();
    let broker = crate::support::kafka::Broker::start();
    let (url, brokers) = (pg.url(), broker.bootstrap());
    for run in 0..2 {
        let (code, out, err) = demo(&["--postgres-url", &url, "--kafka-brokers", &brokers]);
        assert_eq!(code, Some(0), "run {run}\nstdout:\n{out}\nstderr:\n{err}");
        let slots = pg
            .execute("SELECT slot_name FROM pg_replication_slots")
            .await;
        assert!(slots.is_empty(), "run {run} left {slots:?} behind");
        // Nor a lineage record: per run, created (by the demo's setup), written again (by its
        // relay's start), then a tombstone.
        let topic = ["outbox-relay.lineage"];
        let lineage = broker.consume(&topic, 3 * (run + 1), Duration::from_secs(10));
        assert_eq!(lineage.len(), 3 * (run + 1), "{lineage:?}");
        assert!(
            lineage.last().is_some_and(|r| r.payload.is_none()),
            "{lineage:?}"
        );
    }
}

/// A demo that fails part-way (Kafka refuses its events) still drops its slot.
#[tokio::test(flavor = "current_thread")]
async fn a_demo_that_fails_part_way_drops_its_slot() {
    let pg = PgCluster::start();
    let broker = crate::support::kafka::Broker::start();
    let (url, brokers) = (pg.url(), broker.bootstrap());
    broker.topic_error(
        "order.created",
        rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
    );
    let (code, out, err) = demo(&["--postgres-url", &url, "--kafka-brokers", &brokers]);
    assert_ne!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    let slots = pg
        .execute("SELECT slot_name FROM pg_replication_slots")
        .await;
    assert!(
        slots.is_empty(),
        "the failed demo left {slots:?} behind:\n{out}\n{err}"
    );
}
