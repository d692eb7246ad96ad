//! Start-up waits out outages (issue 32): a relay restarted while the broker or Postgres is
//! away waits, says once what it waits for (and on /readyz at every try), and relays every
//! event committed meanwhile once they are back, without exiting; a SIGTERM during the wait
//! stops it at once with exit 0. Before, a broker down at start-up exited 4 after 30 s (or
//! within 0.2 s of its return), and Postgres down exited 3 at once.

use std::time::Duration;

use crate::support::relay::Relay;
use crate::support::world::World;

const SLOT: &str = "outbox_relay";

/// At most this many log lines at the default level (info) while the broker is away, whatever
/// the outage's length.
pub(crate) const MAX_LINES_PER_OUTAGE: usize = 10;

/// `/readyz`'s reasons, as one string (empty while nothing answers).
fn reasons(relay: &Relay) -> String {
    relay
        .readyz()
        .map(|json| json["reasons"].to_string())
        .unwrap_or_default()
}

/// How many times the relay logged that start-up waits for `what`.
fn waiting_lines(relay: &Relay, what: &str) -> usize {
    let line = format!("start-up waits: {what}");
    relay
        .log()
        .lines()
        .filter(|l| l.contains(&line) && l.contains("WARN"))
        .count()
}

/// A world whose relay streamed once and stopped: the slot and its lineage record exist, so a
/// restart resumes and the events committed while it waits are in the slot.
async fn streamed_once() -> World {
    let world = World::start().await;
    world.relay(&[]).stop();
    world
}

/// Restarts the relay with every broker down, keeps them down for `outage` once start-up has
/// begun, committing events meanwhile, then checks that it streamed them all without exiting,
/// having said what it waited for. `waits_for_kafka`: the outage is long enough that a try
/// failed (then /readyz names Kafka); else /readyz only says that start-up has not finished.
async fn broker_down_at_start(world: &World, outage: Duration, waits_for_kafka: bool) {
    let bootstrap = world.broker.bootstrap();
    world.broker.down();
    let mut relay = Relay::spawn(&world.pg.url(), &bootstrap, &[]);
    let starting = relay.wait_for(Duration::from_secs(30), |r| {
        reasons(r).contains("starting: start-up")
    });
    assert!(starting, "{}", relay.log());
    let lines_before = relay.log_lines();
    let mut ids = world.insert_tx(&[("Evt", "a", r#"{"n": 1}"#)]).await;
    if waits_for_kafka {
        let named = format!("start-up waits: Kafka at {bootstrap} does not answer");
        let waiting = relay.wait_for(Duration::from_secs(30), |r| reasons(r).contains(&named));
        assert!(waiting, "{:?}\n{}", relay.readyz(), relay.log());
    }
    std::thread::sleep(outage);
    ids.extend(world.insert_tx(&[("Evt", "b", r#"{"n": 2}"#)]).await);
    // Log noise: a handful of lines for the whole outage, however long (before, about 580
    // identical librdkafka lines within 47 ms).
    let during = relay.shown_since(lines_before);
    assert!(
        during.len() <= MAX_LINES_PER_OUTAGE,
        "{} lines during a {outage:?} outage:\n{}",
        during.len(),
        during.join("\n")
    );
    world.broker.up();
    relay.wait_streaming_for(Duration::from_secs(60));
    assert!(relay.streaming(), "{}", relay.log());
    ids.extend(world.insert_tx(&[("Evt", "c", r#"{"n": 3}"#)]).await);
    let got = world
        .broker
        .consume_ids(&["Evt"], &ids, Duration::from_secs(60));
    for id in &ids {
        assert!(
            got.iter().any(|r| r.id() == *id),
            "{id} lost\n{}",
            relay.log()
        );
    }
    // One line for however many tries (a try waits up to 5, 10, 20, 30 s).
    let lines = waiting_lines(&relay, "Kafka");
    assert_eq!(lines, usize::from(waits_for_kafka), "{}", relay.log());
    world.wait_caught_up(SLOT, Duration::from_secs(30)).await;
    relay.stop();
}

#[tokio::test(flavor = "current_thread")]
async fn the_broker_down_for_40_seconds_at_start_up_is_waited_out() {
    let world = streamed_once().await;
    broker_down_at_start(&world, Duration::from_secs(40), true).await;
}

/// The shorter outages, one after the other on one world: 1 s (waited out within the first
/// try), 20 s (past it), then a SIGTERM during the wait, which stops the relay at once with
/// exit 0 (before, it was ignored for about 28 s, then the relay exited 4).
#[tokio::test(flavor = "current_thread")]
async fn the_broker_down_for_1_and_20_seconds_at_start_up_is_waited_out_and_sigterm_stops_the_wait()
{
    let world = streamed_once().await;
    broker_down_at_start(&world, Duration::from_secs(1), false).await;
    broker_down_at_start(&world, Duration::from_secs(20), true).await;

    world.broker.down();
    let mut relay = Relay::spawn(&world.pg.url(), &world.broker.bootstrap(), &[]);
    let waiting = relay.wait_for(Duration::from_secs(30), |r| {
        reasons(r).contains("start-up waits: Kafka")
    });
    assert!(waiting, "{}", relay.log());
    relay.signal("TERM");
    let status = relay.wait_exit(Duration::from_secs(10));
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", relay.log());
}

/// Postgres down when the relay starts: it waits (one line for every try), says so on /readyz
/// with the URL, password hidden, and streams once Postgres is back. Before, it exited 3 at
/// once.
#[tokio::test(flavor = "current_thread")]
async fn postgres_down_at_start_up_is_waited_out() {
    let mut world = streamed_once().await;
    world.pg.stop();
    let mut relay = Relay::spawn(&world.pg.url(), &world.broker.bootstrap(), &[]);
    // Several tries: 0.5, 1, 2 s apart.
    let tried = relay.wait_for(Duration::from_secs(60), |r| {
        let reasons = reasons(r);
        reasons.contains("start-up waits: Postgres at") && reasons.contains("failed tries: 4,")
    });
    assert!(tried, "{:?}\n{}", relay.readyz(), relay.log());
    assert_eq!(waiting_lines(&relay, "Postgres at"), 1, "{}", relay.log());
    world.pg.restart();
    relay.wait_streaming();
    let ids = world.insert_tx(&[("Evt", "a", r#"{"n": 1}"#)]).await;
    let got = world
        .broker
        .consume_ids(&["Evt"], &ids, Duration::from_secs(60));
    assert_eq!(got.len(), 1, "{}", relay.log());
    assert!(
        relay.log().contains("start-up no longer waits"),
        "{}",
        relay.log()
    );
}
