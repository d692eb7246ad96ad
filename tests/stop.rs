//! Clean stops and memory at the edges: SIGTERM in the middle of a large
//! transaction, and read-ahead of huge rows while the broker is down.

use std::collections::HashSet;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::reliability::peak_rss_mb;
use crate::support::relay::Relay;
use crate::support::world::{World, wait_until};

const SLOT: &str = "outbox_relay";

/// Records in every partition of `topic` (the sum of the high watermarks).
fn records_in(bootstrap: &str, topic: &str, partitions: i32) -> i64 {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    (0..partitions)
        .map(|p| {
            let (low, high) = consumer
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .unwrap();
            assert_eq!(low, 0, "nothing aged out");
            high
        })
        .sum()
}

#[tokio::test(flavor = "current_thread")]
async fn sigterm_mid_transaction_reads_to_its_commit_and_a_restart_resends_nothing() {
    const ROWS: i64 = 60_000;
    let world = World::start().await;
    world.broker.create_topic("Bulk", 4);
    let bootstrap = world.broker.bootstrap();
    // A small event cap: the transaction streams in many batches.
    let args = ["--max-in-flight-events", "200"];
    let mut relay = Relay::spawn(&world.pg.url(), &bootstrap, &args);
    relay.wait_streaming();

    world
        .pg
        .execute(&format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
             SELECT 'order', 'agg-' || (i % 100), 'Bulk', jsonb_build_object('i', i)
             FROM generate_series(1, {ROWS}) AS i"
        ))
        .await;
    // SIGTERM once the first records of the transaction are acknowledged.
    let relayed = |r: &Relay| r.metric("outbox_relay_events_relayed_total").unwrap_or(0.0);
    let started = relay.wait_for(Duration::from_secs(60), |r| relayed(r) > 0.0);
    assert!(started, "nothing acknowledged; log:\n{}", relay.log());
    let acked = relayed(&relay);
    relay.signal("TERM");
    assert!(
        acked < ROWS as f64,
        "the whole transaction was acknowledged before SIGTERM ({acked}): the test proves nothing"
    );
    let status = relay.wait_exit(Duration::from_secs(60)).expect("exits");
    assert_eq!(status.code(), Some(0), "{}", relay.log());
    // A restart streams on from there: one more event, then count.
    let mut relay = Relay::spawn(&world.pg.url(), &bootstrap, &args);
    relay.wait_streaming();
    let marker = world.insert_tx(&[("Bulk", "marker", "{}")]).await;
    let end = world.current_lsn().await;
    world
        .wait_confirmed(SLOT, end, Duration::from_secs(60))
        .await;
    let total = records_in(&bootstrap, "Bulk", 4);
    let records = world.broker.consume(
        &["Bulk"],
        usize::try_from(total).unwrap(),
        Duration::from_secs(120),
    );
    let ids: HashSet<String> = records.iter().map(|r| r.id()).collect();
    assert!(ids.contains(&marker[0]));
    assert_eq!(ids.len() as i64, ROWS + 1, "every event arrived");
    assert_eq!(
        records.len() - ids.len(),
        0,
        "duplicates after a clean stop and restart ({total} records)"
    );
    assert_eq!(total, ROWS + 1);
}

#[tokio::test(flavor = "current_thread")]
async fn a_shutdown_timeout_before_the_commit_says_what_will_be_sent_again() {
    let world = World::start().await;
    let args = ["--max-in-flight-events", "100", "--shutdown-timeout", "1s"];
    let mut relay = Relay::spawn(&world.pg.url(), &world.broker.bootstrap(), &args);
    relay.wait_streaming();
    world.broker.down();
    world
        .pg
        .execute(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
             SELECT 'order', 'agg-' || i, 'Bulk', '{}' FROM generate_series(1, 5000) AS i",
        )
        .await;
    // Reading paused at the event cap, in the middle of the transaction.
    let paused = relay.wait_for(Duration::from_secs(60), |r| {
        r.metric("outbox_relay_in_flight_events").unwrap_or(0.0) >= 100.0
    });
    assert!(paused, "{}", relay.log());
    relay.signal("TERM");
    let status = relay.wait_exit(Duration::from_secs(60)).expect("exits");
    let log = relay.log();
    assert_eq!(status.code(), Some(0), "{log}");
    let warning = log
        .lines()
        .find(|l| l.contains("WARN") && l.contains("before the open transaction's commit"))
        .unwrap_or_else(|| panic!("no warning naming the open transaction: {log}"));
    assert!(
        warning.contains("sent=100") && warning.contains("lsn=") && warning.contains("frontier="),
        "{warning}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn huge_rows_with_the_broker_down_stay_within_the_byte_cap_plus_32_mib_over_the_streaming_relay()
 {
    const CAP: u64 = 16 * 1024 * 1024;
    const ROWS: usize = 150;
    let world = World::start().await;
    let bootstrap = world.broker.bootstrap();
    world.broker.create_topic("Big", 1);
    let cap = CAP.to_string();
    let mut relay = Relay::spawn(
        &world.pg.url(),
        &bootstrap,
        &[
            "--max-in-flight-bytes",
            &cap,
            "-X",
            "message.max.bytes=2000000",
        ],
    );
    relay.wait_streaming();
    // What the relay holds before any row: the allowance is over it, so that a relay whose
    // code and libraries grew (AWS SDK, registry client) is not mistaken for read-ahead.
    let streaming = peak_rss_mb(relay.pid());
    world.broker.down();

    // 150 rows of ~900 kB (incompressible text) in one transaction.
    world
        .pg
        .execute(&format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
             SELECT 'order', 'big-' || i, 'Big', jsonb_build_object('blob',
                 (SELECT string_agg(md5(random()::text || j), '') FROM generate_series(1, 28000) j))
             FROM generate_series(1, {ROWS}) AS i"
        ))
        .await;
    let end = world.current_lsn().await;
    // Reading pauses at the byte cap (less two rows reserved for read-ahead) ...
    let paused = relay.wait_for(Duration::from_secs(120), |r| {
        r.metric("outbox_relay_in_flight_bytes").unwrap_or(0.0) >= (CAP - 3_000_000) as f64
    });
    assert!(
        paused,
        "in-flight bytes never reached the cap; log:\n{}",
        relay.log()
    );
    // ... and read-ahead gets its chance to fill: the walsender has sent
    // everything (unbounded read-ahead) or stopped short of it.
    wait_until(Duration::from_secs(15), || async {
        let sent = world
            .pg
            .execute("SELECT sent_lsn::text FROM pg_stat_replication")
            .await;
        sent.first()
            .and_then(|r| r.first().cloned().flatten())
            .and_then(|t| t.parse::<outbox_relay::lsn::Lsn>().ok())
            .is_some_and(|lsn| lsn >= end)
    })
    .await;
    let during_outage = peak_rss_mb(relay.pid());

    world.broker.up();
    world
        .wait_confirmed(SLOT, end, Duration::from_secs(300))
        .await;
    let peak = peak_rss_mb(relay.pid());
    let limit = streaming + CAP as f64 / 1048576.0 + 32.0;
    eprintln!(
        "read-ahead: {ROWS} rows of ~900 kB with the broker down: relay peak RSS \
         {streaming:.1} MiB streaming, {during_outage:.1} MiB during the outage, {peak:.1} MiB \
         after catching up (cap {:.0} MiB, limit {limit:.0} MiB)",
        CAP as f64 / 1048576.0
    );
    assert!(peak <= limit, "peak RSS {peak:.1} MiB > {limit:.0} MiB");
}

/// Issue 21 §7: SIGTERM while the stream is down (waiting to reconnect) still confirms what
/// the broker acknowledged meanwhile; before, the stop confirmed nothing and a restart sent
/// those events again.
#[tokio::test(flavor = "current_thread")]
async fn sigterm_while_reconnecting_confirms_what_was_acknowledged_meanwhile() {
    let world = World::start().await;
    let backoff = [
        "--reconnect-backoff-min",
        "120s",
        "--reconnect-backoff-max",
        "120s",
    ];
    let mut relay = Relay::spawn(&world.pg.url(), &world.broker.bootstrap(), &backoff);
    relay.wait_streaming();
    world.broker.down();
    let before = world.current_lsn().await;
    world
        .insert_tx(&[("Evt", "a", "{}"), ("Evt", "b", "{}")])
        .await;
    let in_flight = |r: &Relay| r.metric("outbox_relay_in_flight_events").unwrap_or(0.0) >= 2.0;
    assert!(
        relay.wait_for(Duration::from_secs(60), in_flight),
        "{}",
        relay.log()
    );
    // The stream breaks; the relay waits two minutes before reconnecting.
    assert!(world.pg.kill_walsenders().await >= 1);
    let broke = |r: &Relay| r.metric("outbox_relay_reconnects_total").unwrap_or(0.0) >= 1.0;
    assert!(
        relay.wait_for(Duration::from_secs(60), broke),
        "{}",
        relay.log()
    );
    world.broker.up();
    let acked = |r: &Relay| r.metric("outbox_relay_events_relayed_total").unwrap_or(0.0) >= 2.0;
    assert!(
        relay.wait_for(Duration::from_secs(60), acked),
        "{}",
        relay.log()
    );
    assert!(world.confirmed_flush(SLOT).await.unwrap() <= before);

    relay.signal("TERM");
    let status = relay.wait_exit(Duration::from_secs(60)).expect("exits");
    assert_eq!(status.code(), Some(0), "{}", relay.log());
    let confirmed = world.confirmed_flush(SLOT).await.unwrap();
    assert!(
        confirmed > before,
        "confirmed {confirmed}, events after {before}\n{}",
        relay.log()
    );
}
