//! Operating the relay: /healthz, /readyz and /metrics on a running relay, and
//! the `status`, `setup` and `drop-slot` subcommands against a live server.

use std::time::{Duration, Instant};

use crate::support::http::get;
use crate::support::postgres::{PgCluster, PgOptions};
use crate::support::relay::{Relay, run_command as run};
use crate::support::world::World;

const SLOT: &str = "outbox_relay";

/// Polls `GET path` until `check(status, body)` holds; returns the last answer.
async fn wait_http(
    port: u16,
    path: &str,
    timeout: Duration,
    check: impl Fn(u16, &str) -> bool,
) -> Option<(u16, String)> {
    let deadline = Instant::now() + timeout;
    let mut last = None;
    while Instant::now() < deadline {
        last = get(port, path);
        if let Some((status, body)) = &last
            && check(*status, body)
        {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    last
}

/// A relay on an HTTP port the system picks, with the slot polled every second: the relay
/// and its port.
fn spawn_with_http(world: &World, extra: &[&str]) -> (Relay, u16) {
    let mut args = vec!["--slot-poll-interval", "1s"];
    args.extend_from_slice(extra);
    let mut relay = Relay::spawn(&world.pg.url(), &world.broker.bootstrap(), &args);
    let port = relay.wait_http_port();
    (relay, port)
}

#[tokio::test(flavor = "current_thread")]
async fn http_endpoint_serves_health_readiness_and_metrics() {
    let world = World::start().await;
    let (mut relay, port) = spawn_with_http(&world, &[]);

    let healthz = wait_http(port, "/healthz", Duration::from_secs(30), |s, _| s == 200).await;
    assert_eq!(
        healthz.as_ref().map(|(s, b)| (*s, b.trim())),
        Some((200, "ok")),
        "{}",
        relay.log()
    );
    relay.wait_streaming();
    let ready = wait_http(port, "/readyz", Duration::from_secs(30), |s, _| s == 200).await;
    let (status, body) = ready.expect("/readyz answers");
    assert_eq!(status, 200, "{body}\n{}", relay.log());
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["ready"], true, "{json}");
    assert_eq!(json["streaming"], true, "{json}");
    assert_eq!(json["producer_connected"], true, "{json}");

    world
        .insert_tx(&[("OrderCreated", "order-1", r#"{"total": 10}"#)])
        .await;
    let expected = "outbox_relay_events_relayed_total{topic=\"OrderCreated\"} 1";
    let metrics = wait_http(port, "/metrics", Duration::from_secs(30), |s, b| {
        s == 200 && b.contains(expected) && b.contains("outbox_relay_slot_lag_bytes")
    })
    .await;
    let (_, text) = metrics.expect("/metrics answers");
    for name in [
        expected,
        "outbox_relay_bytes_relayed_total ",
        "outbox_relay_commit_to_ack_seconds_bucket{le=\"0.001\"}",
        "outbox_relay_commit_to_ack_seconds_count 1",
        "outbox_relay_in_flight_events 0",
        "outbox_relay_received_lsn ",
        "outbox_relay_ack_frontier_lsn ",
        "outbox_relay_slot_lag_bytes ",
        "outbox_relay_slot_wal_status{wal_status=\"reserved\"} 1",
        "outbox_relay_slot_wal_status{wal_status=\"lost\"} 0",
        "outbox_relay_build_info{version=\"",
        "# TYPE outbox_relay_commit_to_ack_seconds histogram",
    ] {
        assert!(text.contains(name), "missing {name:?} in:\n{text}");
    }

    // The slot poller's view reaches /readyz too.
    let (_, body) = wait_http(port, "/readyz", Duration::from_secs(10), |_, b| {
        b.contains("\"wal_status\":\"reserved\"")
    })
    .await
    .unwrap();
    assert!(body.contains("\"lag_bytes\""), "{body}");

    relay.signal("TERM");
    let status = relay.wait_exit(Duration::from_secs(30));
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", relay.log());
}

#[tokio::test(flavor = "current_thread")]
async fn readiness_fails_while_deliveries_are_stuck_and_recovers() {
    let world = World::start().await;
    let (mut relay, port) = spawn_with_http(&world, &["--ready-max-ack-staleness", "2s"]);
    relay.wait_streaming();
    let ready = wait_http(port, "/readyz", Duration::from_secs(30), |s, _| s == 200).await;
    assert_eq!(ready.map(|r| r.0), Some(200), "{}", relay.log());

    world.broker.down();
    world
        .insert_tx(&[("OrderCreated", "stuck-1", r#"{"n": 1}"#)])
        .await;
    let stuck = wait_http(port, "/readyz", Duration::from_secs(30), |s, b| {
        s == 503 && b.contains("deliveries are stuck")
    })
    .await;
    let (status, body) = stuck.expect("/readyz answers");
    assert_eq!(status, 503, "{body}\n{}", relay.log());
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["ready"], false);
    let reasons = json["reasons"].as_array().unwrap();
    assert!(
        reasons
            .iter()
            .any(|r| r.as_str().unwrap().contains("--ready-max-ack-staleness 2s")),
        "{json}"
    );

    world.broker.up();
    let recovered = wait_http(port, "/readyz", Duration::from_secs(90), |s, _| s == 200).await;
    assert_eq!(
        recovered.as_ref().map(|r| r.0),
        Some(200),
        "{recovered:?}\n{}",
        relay.log()
    );
    let records = world
        .broker
        .consume(&["OrderCreated"], 1, Duration::from_secs(30));
    assert_eq!(records.len(), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn status_setup_and_drop_slot_subcommands() {
    let world = World::start().await;
    let url = world.pg.url();
    let brokers = world.broker.bootstrap();
    let slot_exists = async |world: &World| {
        !world
            .pg
            .execute(&format!(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = '{SLOT}'"
            ))
            .await
            .is_empty()
    };
    let publication_exists = async |world: &World| {
        !world
            .pg
            .execute("SELECT 1 FROM pg_publication WHERE pubname = 'outbox_relay'")
            .await
            .is_empty()
    };

    // setup --print needs only the flags.
    let (code, out, err) = run(&["setup", "--print"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(
            "CREATE PUBLICATION \"outbox_relay\" FOR TABLE \"public\".\"outbox\" WITH (publish = 'insert', publish_via_partition_root = true);"
        ),
        "{out}"
    );
    assert!(
        out.contains("pg_create_logical_replication_slot('outbox_relay', 'pgoutput');"),
        "{out}"
    );

    // status before setup: nothing exists yet, and it says so.
    let (code, out, err) = run(&["status", "--postgres-url", &url]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("slot outbox_relay: does not exist"), "{out}");
    assert!(
        out.contains("publication outbox_relay: does not exist"),
        "{out}"
    );

    // setup applies it, then keeps what exists.
    let (code, out, err) = run(&["setup", "--postgres-url", &url, "--kafka-brokers", &brokers]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("publication \"outbox_relay\": created"),
        "{out}"
    );
    assert!(out.contains("slot \"outbox_relay\": created at"), "{out}");
    assert!(slot_exists(&world).await && publication_exists(&world).await);
    let (code, out, err) = run(&["setup", "--postgres-url", &url, "--kafka-brokers", &brokers]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("exists and covers the outbox tables; kept"),
        "{out}"
    );
    assert!(out.contains("slot \"outbox_relay\": exists"), "{out}");

    // status text, with no relay connected.
    let (code, out, err) = run(&["status", "--postgres-url", &url]);
    assert_eq!(code, Some(0), "{err}");
    for needle in [
        "slot outbox_relay\n",
        "logical pgoutput (database postgres)",
        "none (no relay connected)",
        "confirmed lsn",
        "wal_status      reserved",
        "unlimited (max_slot_wal_keep_size = -1)",
        "publishes       insert\n",
        "tables          public.outbox\n",
        "wal_level               logical",
        "max_slot_wal_keep_size  -1",
        "max_replication_slots",
        "wal_sender_timeout",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }

    // status --json against a live slot.
    let mut relay = Relay::spawn(&url, &world.broker.bootstrap(), &[]);
    relay.wait_streaming();
    world
        .insert_tx(&[("OrderCreated", "order-1", r#"{"total": 1}"#)])
        .await;
    let (code, out, err) = run(&["status", "--json", "--postgres-url", &url]);
    assert_eq!(code, Some(0), "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).expect(&out);
    let slot = &json["slot"];
    assert_eq!(slot["exists"], true, "{json}");
    assert_eq!(slot["plugin"], "pgoutput", "{json}");
    assert!(slot["active_pid"].is_i64(), "{json}");
    assert!(
        slot["confirmed_flush_lsn"].as_str().unwrap().contains('/'),
        "{json}"
    );
    assert!(slot["lag_bytes"].as_i64().unwrap() >= 0, "{json}");
    assert_eq!(slot["wal_status"], "reserved", "{json}");
    assert!(slot["safe_wal_size_bytes"].is_null(), "{json}");
    assert_eq!(
        json["publication"]["publishes"],
        serde_json::json!(["insert"])
    );
    assert_eq!(
        json["publication"]["tables"],
        serde_json::json!(["public.outbox"])
    );
    assert_eq!(json["settings"]["wal_level"], "logical", "{json}");
    assert_eq!(json["settings"]["max_slot_wal_keep_size"], "-1", "{json}");
    assert_eq!(json["warnings"], serde_json::json!([]), "{json}");

    // drop-slot refuses while a relay streams from the slot.
    let (code, _, err) = run(&[
        "drop-slot",
        "--yes-i-know",
        "--postgres-url",
        &url,
        "--kafka-brokers",
        &brokers,
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("is in use by server process"), "{err}");
    relay.kill();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let active = world
            .pg
            .execute(&format!(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = '{SLOT}' AND active"
            ))
            .await;
        if active.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Without the confirmation flag: refused, with what would be lost, and nothing dropped.
    let (code, out, err) = run(&["drop-slot", "--postgres-url", &url]);
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(err.contains("--yes-i-know"), "{err}");
    assert!(err.contains("position"), "{err}");
    assert!(err.contains("releases the WAL"), "{err}");
    assert!(slot_exists(&world).await);

    // With it: the slot goes, and the publication with --drop-publication.
    let (code, out, err) = run(&[
        "drop-slot",
        "--yes-i-know",
        "--drop-publication",
        "--postgres-url",
        &url,
        "--kafka-brokers",
        &brokers,
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("dropped slot \"outbox_relay\""), "{out}");
    assert!(!slot_exists(&world).await);
    assert!(!publication_exists(&world).await);
}

/// `status` judges safe_wal_size by the --slot-min-safe-wal-size it is given, as the relay
/// does, not by the default (it used the default whatever the flag said).
#[tokio::test(flavor = "current_thread")]
async fn status_warns_by_the_given_min_safe_wal_size() {
    let keep = ("max_slot_wal_keep_size".to_owned(), "64MB".to_owned());
    let options = PgOptions {
        extra_conf: vec![keep],
        ..PgOptions::default()
    };
    let world = World::with(PgCluster::start_with(options)).await;
    let url = world.pg.url();
    let brokers = world.broker.bootstrap();
    let (code, _, err) = run(&["setup", "--postgres-url", &url, "--kafka-brokers", &brokers]);
    assert_eq!(code, Some(0), "{err}");
    let safe_wal_warnings = |min: &str| {
        let args = ["status", "--json", "--postgres-url", &url];
        let (code, out, err) = run(&[&args[..], &["--slot-min-safe-wal-size", min]].concat());
        assert_eq!(code, Some(0), "{err}");
        let json: serde_json::Value = serde_json::from_str(&out).expect(&out);
        let warnings = json["warnings"].as_array().cloned().unwrap_or_default();
        let safe = warnings
            .iter()
            .filter(|w| w.to_string().contains("safe_wal_size"));
        safe.count()
    };
    // About 64 MB can still be written: below 1 GiB, above 1 MiB.
    assert_eq!(safe_wal_warnings("1GiB"), 1);
    assert_eq!(safe_wal_warnings("1MiB"), 0);
}
