//! Faults: the broker down, the relay killed or stopped. Nothing is lost, and
//! the slot never moves past an event the broker has not acknowledged.

use std::collections::HashSet;
use std::time::Duration;

use crate::support::relay::Relay;
use crate::support::world::World;

const SLOT: &str = "outbox_relay";
const POSTGRES_EXIT: i32 = outbox_relay::pipeline::exit_code::POSTGRES as i32;

#[tokio::test(flavor = "current_thread")]
async fn slot_holds_while_the_broker_is_down_and_catches_up_after() {
    let world = World::start().await;
    let mut relay = Relay::spawn(&world.pg.url(), &world.broker.bootstrap(), &[]);
    relay.wait_streaming();
    world.insert_tx(&[("Evt", "a-1", r#"{"n": 0}"#)]).await;
    assert_eq!(
        world
            .broker
            .consume(&["Evt"], 1, Duration::from_secs(30))
            .len(),
        1
    );
    let warm = world.current_lsn().await;
    world
        .wait_confirmed(SLOT, warm, Duration::from_secs(20))
        .await;

    world.broker.down();
    let ids = world
        .insert_tx(&[("Evt", "a-1", r#"{"n": 1}"#), ("Evt", "a-2", r#"{"n": 2}"#)])
        .await;
    let after_commit = world.current_lsn().await;
    world
        .wait_replies_past(SLOT, after_commit, Duration::from_secs(30))
        .await;
    let confirmed = world.confirmed_flush(SLOT).await.unwrap();
    assert!(
        confirmed < after_commit,
        "slot confirmed {confirmed} past the undelivered transaction ending at {after_commit}\n{}",
        relay.log()
    );

    world.broker.up();
    let records = world.broker.consume(&["Evt"], 3, Duration::from_secs(60));
    let got: HashSet<String> = records.iter().map(|r| r.id()).collect();
    for id in &ids {
        assert!(
            got.contains(id),
            "id {id} lost; relay log:\n{}",
            relay.log()
        );
    }
    world
        .wait_confirmed(SLOT, after_commit, Duration::from_secs(30))
        .await;
}

#[tokio::test(flavor = "current_thread")]
async fn sigkill_mid_stream_then_restart_loses_nothing() {
    sigkill_mid_stream_then_restart(&World::start().await).await;
}

/// Kills the relay mid-stream and starts it again: every event arrives (`broker_process`
/// runs it against a broker in its own process too).
pub(crate) async fn sigkill_mid_stream_then_restart(world: &World) {
    let url = world.pg.url();
    let bootstrap = world.broker.bootstrap();
    let mut relay = Relay::spawn(&url, &bootstrap, &[]);
    relay.wait_streaming();

    let mut committed = Vec::new();
    for n in 0..150 {
        let rows: Vec<(String, String, String)> = (0..(1 + n % 3))
            .map(|k| {
                (
                    format!("Evt{}", k % 2),
                    format!("agg-{}", n % 7),
                    format!(r#"{{"n": {n}, "k": {k}}}"#),
                )
            })
            .collect();
        committed.extend(world.insert_tx(&rows).await);
        if n == 60 {
            relay.kill();
        }
        if n == 100 {
            relay = Relay::spawn(&url, &bootstrap, &[]);
            relay.wait_streaming();
        }
    }
    let end = world.current_lsn().await;
    let records = world
        .broker
        .consume_ids(&["Evt0", "Evt1"], &committed, Duration::from_secs(60));
    let got: HashSet<String> = records.iter().map(|r| r.id()).collect();
    let lost: Vec<&String> = committed.iter().filter(|id| !got.contains(*id)).collect();
    assert!(
        lost.is_empty(),
        "{} ids lost: {lost:?}\nrelay log:\n{}",
        lost.len(),
        relay.log()
    );
    eprintln!(
        "sigkill test: {} events committed, {} records read, {} duplicates after one SIGKILL",
        committed.len(),
        records.len(),
        records.len() - got.len()
    );
    world
        .wait_confirmed(SLOT, end, Duration::from_secs(20))
        .await;
}

#[tokio::test(flavor = "current_thread")]
async fn sigterm_exits_zero_with_the_slot_at_the_last_delivered_commit() {
    let world = World::start().await;
    let url = world.pg.url();
    let bootstrap = world.broker.bootstrap();
    let mut relay = Relay::spawn(&url, &bootstrap, &[]);
    relay.wait_streaming();
    let mut ids = Vec::new();
    for n in 0..20 {
        ids.extend(
            world
                .insert_tx(&[("Evt", "a", &format!(r#"{{"n": {n}}}"#))])
                .await,
        );
    }
    let before_last = world.current_lsn().await;
    ids.extend(world.insert_tx(&[("Evt", "a", r#"{"n": "last"}"#)]).await);
    let after_last = world.current_lsn().await;
    assert!(after_last > before_last);
    assert_eq!(
        world
            .broker
            .consume(&["Evt"], ids.len(), Duration::from_secs(30))
            .len(),
        ids.len()
    );

    relay.signal("TERM");
    let status = relay
        .wait_exit(Duration::from_secs(40))
        .expect("relay exits after SIGTERM");
    let log = relay.log();
    assert_eq!(
        status.code(),
        Some(0),
        "exit status {status:?}; log:\n{log}"
    );
    assert!(log.contains("stopped cleanly"), "{log}");
    let confirmed = world.confirmed_flush(SLOT).await.unwrap();
    assert!(
        confirmed > before_last,
        "slot at {confirmed}, before the last delivered commit (which started after {before_last})"
    );

    // A restart re-sends nothing: the slot was exactly at the delivered position.
    // A marker committed after the restart is delivered after anything the
    // restart re-sends, so once it is in the topic every duplicate would be too.
    let mut relay = Relay::spawn(&url, &bootstrap, &[]);
    relay.wait_streaming();
    let marker = world.insert_tx(&[("Evt", "a", r#"{"n": "marker"}"#)]).await;
    let records = world
        .broker
        .consume_ids(&["Evt"], &marker, Duration::from_secs(30));
    assert_eq!(records.last().map(|r| r.id()), Some(marker[0].clone()));
    assert_eq!(
        records.len(),
        ids.len() + 1,
        "no duplicates after a clean stop; log:\n{}",
        relay.log()
    );
}

#[tokio::test(flavor = "current_thread")]
async fn permanent_delivery_failure_exits_non_zero_without_acknowledging() {
    let world = World::start().await;
    let mut relay = Relay::spawn(
        &world.pg.url(),
        &world.broker.bootstrap(),
        &["-X", "message.timeout.ms=3000"],
    );
    relay.wait_streaming();
    world.insert_tx(&[("Evt", "a", "{}")]).await;
    assert_eq!(
        world
            .broker
            .consume(&["Evt"], 1, Duration::from_secs(30))
            .len(),
        1
    );
    world.broker.down();
    let ids = world.insert_tx(&[("Evt", "b", r#"{"lost": false}"#)]).await;
    let after_commit = world.current_lsn().await;
    let status = relay
        .wait_exit(Duration::from_secs(60))
        .expect("relay exits once the delivery times out");
    let log = relay.log();
    assert_eq!(
        status.code(),
        Some(4),
        "exit code for a Kafka failure; log:\n{log}"
    );
    assert!(
        log.contains(&ids[0]),
        "the error names the event id:\n{log}"
    );
    assert!(log.contains("Evt"), "the error names the topic:\n{log}");
    assert!(
        log.contains("commit LSN"),
        "the error names the LSN:\n{log}"
    );
    let confirmed = world.confirmed_flush(SLOT).await.unwrap();
    assert!(confirmed < after_commit, "slot moved past the failed event");

    // Restarted with the broker back, the event is delivered.
    world.broker.up();
    let _relay = Relay::spawn(&world.pg.url(), &world.broker.bootstrap(), &[]);
    let records = world.broker.consume(&["Evt"], 2, Duration::from_secs(60));
    assert!(records.iter().any(|r| r.id() == ids[0]));
}

#[tokio::test(flavor = "current_thread")]
async fn a_dropped_publication_stops_the_relay_instead_of_retrying() {
    let world = World::start().await;
    let mut relay = Relay::spawn(&world.pg.url(), &world.broker.bootstrap(), &[]);
    relay.wait_streaming();
    world.pg.execute("DROP PUBLICATION outbox_relay").await;
    let before = world.current_lsn().await;
    world.insert_tx(&[("Evt", "a-1", r#"{"n": 1}"#)]).await;
    let status = relay.wait_exit(Duration::from_secs(60));
    let log = relay.log();
    assert_eq!(status.and_then(|s| s.code()), Some(POSTGRES_EXIT), "{log}");
    assert!(
        log.contains("publication \\\"outbox_relay\\\" does not exist")
            || log.contains("publication \"outbox_relay\" does not exist"),
        "{log}"
    );
    assert!(world.confirmed_flush(SLOT).await.unwrap() <= before);
}
