//! `outbox-relay backfill`: rows stream from the table through the relay's mapping (memory
//! stays bounded whatever the table holds), and a row that cannot be delivered is handled by
//! `--on-poison` as the relay would handle its event.

use std::time::Duration;

use crate::support::relay::binary;
use crate::support::world::World;

const DLQ: &str = "outbox.dlq";

/// Runs `backfill --since 2000-01-01` with `extra`: exit code, stdout, stderr, and the
/// highest resident set size (KiB) seen while it ran.
fn backfill(world: &World, extra: &[&str]) -> (Option<i32>, String, String, u64) {
    let (url, brokers) = (world.pg.url(), world.broker.bootstrap());
    let mut child = std::process::Command::new(binary())
        .args(["backfill", "--since", "2000-01-01 00:00:00+00"])
        .args(["--postgres-url", &url, "--kafka-brokers", &brokers])
        .args(extra)
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    for _ in 0..6_000 {
        // VmHWM: the kernel's high-water mark of the resident set.
        let text = std::fs::read_to_string(&status).unwrap_or_default();
        let hwm = text.lines().find_map(|l| l.strip_prefix("VmHWM:"));
        let kib = hwm.and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok());
        peak = peak.max(kib.unwrap_or(0));
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    (out.status.code(), text(out.stdout), text(out.stderr), peak)
}

#[tokio::test(flavor = "current_thread")]
async fn backfill_streams_the_rows_in_bounded_memory() {
    const ROWS: usize = 400;
    const PAYLOAD: usize = 500_000;
    let world = World::start().await;
    // 200 MB of payloads.
    world
        .pg
        .execute(&format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             SELECT 'order', g::text, 'Big', jsonb_build_object('pad', repeat('x', {PAYLOAD})) \
             FROM generate_series(1, {ROWS}) g"
        ))
        .await;
    let (code, out, err, peak_kib) = backfill(&world, &["--max-in-flight-events", "8"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains(&format!("backfill: {ROWS} events")), "{out}");
    let held = ROWS * PAYLOAD / 1024;
    eprintln!("backfill of {held} KiB of rows peaked at {peak_kib} KiB resident");
    assert!(
        peak_kib < held as u64 / 2,
        "backfill's resident set peaked at {peak_kib} KiB for {held} KiB of rows"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn backfill_applies_on_poison_to_rows_that_cannot_be_delivered() {
    let world = World::start().await;
    let insert = |aggregate: &str, event_type: &str, payload: &str| {
        format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('order', '{aggregate}', {event_type}, '{payload}') RETURNING id::text;"
        )
    };
    let big = format!(r#"{{"pad": "{}"}}"#, "y".repeat(30_000));
    let mut sql = insert("good-1", "'Evt'", "{}");
    sql += &insert("null-route", "NULL", "{}");
    sql += &insert("too-large", "'Evt'", &big);
    sql += &insert("good-2", "'Evt'", "{}");
    let ids: Vec<String> = world
        .pg
        .execute(&sql)
        .await
        .into_iter()
        .filter_map(|r| r[0].clone())
        .collect();
    let small = ["-X", "message.max.bytes=20000"];

    // --on-poison fail: stops at the first, naming it (exit 5, as the relay).
    let (code, out, err, _) = backfill(&world, &small);
    assert_eq!(code, Some(5), "{out}{err}");
    assert!(err.contains(&ids[1]), "{err}");

    // dead-letter: both go to the dead-letter topic, saying why, and the rest is relayed.
    let dead_letter = ["--on-poison", "dead-letter", "--dead-letter-topic", DLQ];
    let (code, out, err, _) = backfill(&world, &[&small[..], &dead_letter[..]].concat());
    assert_eq!(code, Some(0), "{out}{err}");
    let good = [ids[0].clone(), ids[3].clone()];
    let relayed = world
        .broker
        .consume_ids(&["Evt"], &good, Duration::from_secs(30));
    assert!(
        good.iter().all(|id| relayed.iter().any(|r| &r.id() == id)),
        "{relayed:?}"
    );
    let dead = world.broker.consume(&[DLQ], 2, Duration::from_secs(30));
    let dead_ids: Vec<String> = dead.iter().map(|r| r.id()).collect();
    assert_eq!(dead_ids, [ids[1].clone(), ids[2].clone()], "{dead:?}");
    assert!(
        dead.iter().all(|r| r.header("outbox.error").is_some()),
        "{dead:?}"
    );
    assert!(
        dead[1].header("outbox.payload.omitted").is_some(),
        "{dead:?}"
    );
    assert!(out.contains("2 dead-lettered"), "{out}");
}
