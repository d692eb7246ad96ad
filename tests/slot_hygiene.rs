//! Slot hygiene: an outbox that sees no inserts while other tables are busy
//! does not pin WAL, and the optional heartbeat keeps the slot moving.

use std::time::{Duration, Instant};

use crate::support::relay::Relay;
use crate::support::world::World;

const SLOT: &str = "outbox_relay";
const MB: u64 = 1024 * 1024;

async fn lag(world: &World) -> u64 {
    let current = world.current_lsn().await;
    let confirmed = world.confirmed_flush(SLOT).await.unwrap();
    current.0.saturating_sub(confirmed.0)
}

#[tokio::test(flavor = "current_thread")]
async fn two_hundred_mb_of_wal_on_other_tables_leaves_the_slot_under_one_mb_behind() {
    let world = World::start().await;
    let mut relay = Relay::spawn(&world.pg.url(), &world.broker.bootstrap(), &[]);
    relay.wait_streaming();
    let start = world.current_lsn().await;
    let mut max_lag = 0;
    // About 10 MB of WAL per statement, 20 statements.
    while world.current_lsn().await.0 - start.0 < 200 * MB {
        world
            .pg
            .execute("INSERT INTO orders (note) SELECT repeat(md5(i::text), 30) FROM generate_series(1, 10000) AS i")
            .await;
        max_lag = max_lag.max(lag(&world).await);
    }
    let written = world.current_lsn().await.0 - start.0;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut settled = lag(&world).await;
    while settled >= MB && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        settled = lag(&world).await;
    }
    eprintln!(
        "slot hygiene: {} MB of WAL written to a non-outbox table; slot lag at most {:.1} MB while writing, {:.3} MB after",
        written / MB,
        max_lag as f64 / MB as f64,
        settled as f64 / MB as f64
    );
    assert!(
        settled < MB,
        "slot lag {settled} bytes; log:\n{}",
        relay.log()
    );
}

#[tokio::test(flavor = "current_thread")]
async fn the_heartbeat_keeps_the_slot_moving_in_an_idle_database() {
    let world = World::start().await;
    let mut relay = Relay::spawn(
        &world.pg.url(),
        &world.broker.bootstrap(),
        &["--heartbeat-interval", "300ms"],
    );
    relay.wait_streaming();
    let before = world.confirmed_flush(SLOT).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut moved = false;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let confirmed = world.confirmed_flush(SLOT).await.unwrap();
        if confirmed > before && lag(&world).await < 64 * 1024 {
            moved = true;
            break;
        }
    }
    assert!(
        moved,
        "the slot did not advance with nothing but heartbeats; log:\n{}",
        relay.log()
    );
    // Heartbeats are not outbox events: the relay produced nothing at all.
    assert_eq!(
        relay
            .metric("outbox_relay_events_relayed_total")
            .unwrap_or(0.0),
        0.0,
        "{}",
        relay.log()
    );
    assert!(
        relay.metric("outbox_relay_build_info").is_some(),
        "/metrics answers"
    );
}
