//! PostgreSQL 18 publication checks: on 18, pgoutput decodes on past a
//! dropped publication with only a warning, so the relay checks the
//! publication itself. These pin their version, so they live outside the
//! modules CI runs once per PostgreSQL version (`.ci/run`).

use std::time::Duration;

use crate::support::relay::Relay;
use crate::support::world::World;

const POSTGRES_EXIT: i32 = outbox_relay::pipeline::exit_code::POSTGRES as i32;

const INSERT: &str = "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                      VALUES ('order', 'a', 'Evt', '{}')";

/// Rows inserted while the outbox table is out of the publication are never
/// decoded, on every version; the relay sees the table's new catalog row.
#[tokio::test(flavor = "current_thread")]
async fn a_table_dropped_from_the_publication_and_added_again_stops_the_relay() {
    let world = World::start_on(18).await;
    // Checks 10 s apart: after the one that confirms the first row, none
    // falls between the DROP and the ADD.
    let args = ["--status-interval", "10s"];
    let mut relay = world.relay(&args);
    let before = world.current_lsn().await;
    world.pg.execute(INSERT).await;
    // On 18 the frontier shown moves only after a check.
    let checked = relay.wait_for(Duration::from_secs(30), |r| {
        r.metric("outbox_relay_ack_frontier_lsn")
            .is_some_and(|lsn| lsn > before.0 as f64)
    });
    assert!(checked, "{}", relay.log());
    world
        .pg
        .execute("ALTER PUBLICATION outbox_relay DROP TABLE outbox")
        .await;
    world.pg.execute(INSERT).await;
    world
        .pg
        .execute("ALTER PUBLICATION outbox_relay ADD TABLE outbox")
        .await;
    world.pg.execute(INSERT).await;
    let status = relay.wait_exit(Duration::from_secs(60));
    let log = relay.log();
    assert_eq!(status.and_then(|s| s.code()), Some(POSTGRES_EXIT), "{log}");
    assert!(log.contains("published it again"), "{log}");
    assert!(log.contains("backfill"), "{log}");
}

/// A relay that found the publication at start-up (here one waiting for the
/// slot) notices it was dropped and re-created before its first check.
#[tokio::test(flavor = "current_thread")]
async fn a_publication_re_created_before_the_first_check_stops_the_relay() {
    let world = World::start_on(18).await;
    let (url, bootstrap) = (world.pg.url(), world.broker.bootstrap());
    let backoff = [
        "--reconnect-backoff-min",
        "200ms",
        "--reconnect-backoff-max",
        "1s",
    ];
    let mut active = Relay::spawn_streaming(&url, &bootstrap, &backoff);
    let mut waiting = Relay::spawn(&url, &bootstrap, &backoff);
    // Its producer is up (so its start-up checks are done) but it cannot stream.
    waiting.wait_standing_by();
    world.pg.execute("DROP PUBLICATION outbox_relay").await;
    world.pg.execute(INSERT).await;
    world
        .pg
        .execute(
            "CREATE PUBLICATION outbox_relay FOR TABLE public.outbox \
         WITH (publish = 'insert', publish_via_partition_root = true)",
        )
        .await;
    world.pg.execute(INSERT).await;
    // The active relay stops on its own check, releasing the slot.
    assert!(
        active.wait_exit(Duration::from_secs(60)).is_some(),
        "{}",
        active.log()
    );
    let status = waiting.wait_exit(Duration::from_secs(60));
    let log = waiting.log();
    assert_eq!(status.and_then(|s| s.code()), Some(POSTGRES_EXIT), "{log}");
    assert!(log.contains("was dropped and re-created"), "{log}");
}
