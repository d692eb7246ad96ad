//! The central tests against a broker in its own process (tansu, see `support::tansu`),
//! reached through a real socket, and that broker behind a loopback fault proxy: responses
//! held past `socket.timeout.ms`, connections dropped mid-batch, the broker unreachable for
//! 30 s, the broker process killed and started again. Nothing is lost, and the idempotent
//! producer's retries duplicate nothing. What tansu does differently from Apache Kafka, and
//! so which tests stay on the mock cluster, is in docs/development.md.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::support::relay::Relay;
use crate::support::tansu::Tansu;
use crate::support::world::World;

const SLOT: &str = "outbox_relay";
const TOPIC: &str = "Evt";

/// Short request timeouts, so a held response times out within seconds.
const SOCKET_TIMEOUT: [&str; 2] = ["-X", "socket.timeout.ms=2000"];

#[tokio::test(flavor = "current_thread")]
async fn sigkill_mid_stream_then_restart_loses_nothing() {
    let world = World::on(Tansu::start()).await;
    crate::failures::sigkill_mid_stream_then_restart(&world).await;
}

/// One record per batch: tansu's high watermark is the last batch's base offset + 1, so the
/// records after the first of a batch would lie past the end the tail read asks for
/// (docs/development.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exactly_once_crash_loop_delivers_every_event_once() {
    let world = World::on(Tansu::start()).await;
    let one_per_batch = ["-X", "batch.num.messages=1"];
    crate::exactly_once::sigkill_crash_loop(&world, 5, &one_per_batch).await;
}

#[tokio::test(flavor = "current_thread")]
async fn poison_events_are_dead_lettered() {
    let world = World::on(Tansu::start()).await;
    crate::poison::poison_events_are_dead_lettered(&world).await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_lost_slot_is_refused_until_allowed() {
    let world = World::on(Tansu::start()).await;
    crate::lineage::a_lost_slot_is_refused_across_restarts_until_allowed(&world).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_shards_relay_every_event_once() {
    let world = World::on(Tansu::start()).await;
    crate::shards::two_shards_relay_every_event_once(&world, 5_000).await;
}

/// One transaction of `n` events, keys spread over 13 aggregates; returns the ids.
async fn commit(world: &World, n: usize, tag: &str) -> Vec<String> {
    let payload = format!(r#"{{"tag": "{tag}", "pad": "{}"}}"#, "x".repeat(200));
    let rows: Vec<(&str, String, &str)> = (0..n)
        .map(|i| (TOPIC, format!("agg-{}", i % 13), payload.as_str()))
        .collect();
    world.insert_tx(&rows).await
}

/// A relay behind the proxy, streaming, with one event delivered and confirmed.
async fn streaming_behind_the_proxy(world: &World, args: &[&str]) -> (Relay, Vec<String>) {
    world.broker.create_topic(TOPIC, 4);
    let relay = world.relay(args);
    let ids = commit(world, 1, "warm").await;
    world.wait_caught_up(SLOT, Duration::from_secs(30)).await;
    (relay, ids)
}

/// Every id arrived, each once: the records read back per id.
fn each_once(world: &World, relay: &Relay, ids: &[String]) {
    let records = world
        .broker
        .consume_ids(&[TOPIC], ids, Duration::from_secs(120));
    let mut counts: HashMap<String, usize> = HashMap::new();
    for record in &records {
        *counts.entry(record.id()).or_default() += 1;
    }
    let lost = ids.iter().filter(|id| !counts.contains_key(*id)).count();
    let duplicated = counts.values().filter(|count| **count > 1).count();
    eprintln!(
        "{} events, {} records, {lost} lost, {duplicated} duplicated",
        ids.len(),
        records.len()
    );
    assert_eq!(lost, 0, "of {} events lost\n{}", ids.len(), relay.log());
    assert_eq!(duplicated, 0, "events duplicated\n{}", relay.log());
}

/// Responses held until the producer's requests time out: librdkafka reconnects and sends
/// them again with their sequence numbers, and the broker, which had written them, answers
/// the retry as a duplicate instead of writing it twice.
#[tokio::test(flavor = "current_thread")]
async fn responses_held_past_the_socket_timeout_are_retried_without_duplicates() {
    let world = World::on(Tansu::start_behind_proxy()).await;
    let (mut relay, mut ids) = streaming_behind_the_proxy(&world, &SOCKET_TIMEOUT).await;
    let proxy = world.broker.tansu().proxy();
    let connections = proxy.accepted();
    proxy.hold_responses(true);
    ids.extend(commit(&world, 200, "held").await);
    // The broker answered while held, and the client gave up on the connection and opened
    // another: its requests timed out.
    let timed_out = relay.wait_for(Duration::from_secs(60), |_| {
        proxy.held_reads() > 0 && proxy.accepted() > connections
    });
    assert!(timed_out, "no request timed out\n{}", relay.log());
    let before = world.confirmed_flush(SLOT).await;
    proxy.hold_responses(false);
    assert!(
        before < Some(world.current_lsn().await),
        "confirmed while held"
    );
    ids.extend(commit(&world, 5, "after").await);
    world.wait_caught_up(SLOT, Duration::from_secs(60)).await;
    each_once(&world, &relay, &ids);
}

/// Every connection dropped again and again while a large transaction is in flight.
#[tokio::test(flavor = "current_thread")]
async fn connections_dropped_mid_batch_lose_and_duplicate_nothing() {
    let world = World::on(Tansu::start_behind_proxy()).await;
    let (relay, mut ids) = streaming_behind_the_proxy(&world, &[]).await;
    ids.extend(commit(&world, 5_000, "big").await);
    let end = world.current_lsn().await;
    let proxy = world.broker.tansu().proxy();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut resets = 0;
    while world.confirmed_flush(SLOT).await < Some(end) && Instant::now() < deadline {
        // Only while records are in flight: once the relay is idle a reset drops nothing.
        if resets < 20 {
            proxy.reset();
            resets += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        resets > 1,
        "the transaction was delivered before the first reset"
    );
    world
        .wait_confirmed(SLOT, end, Duration::from_secs(60))
        .await;
    each_once(&world, &relay, &ids);
}

/// The broker unreachable for 30 s (connections dropped, new ones refused) while events are
/// written: the slot holds, and all arrive once the broker is back.
#[tokio::test(flavor = "current_thread")]
async fn the_broker_unreachable_for_30_seconds_loses_nothing() {
    let world = World::on(Tansu::start_behind_proxy()).await;
    let (mut relay, mut ids) = streaming_behind_the_proxy(&world, &[]).await;
    world.broker.tansu().proxy().cut();
    let lines_before = relay.log_lines();
    let first = commit(&world, 1, "first").await;
    let after_first = world.current_lsn().await;
    ids.extend(first);
    let outage = Instant::now() + Duration::from_secs(30);
    let mut n = 0;
    while Instant::now() < outage {
        ids.extend(commit(&world, 1 + n % 3, &format!("n{n}")).await);
        n += 1;
        let confirmed = world.confirmed_flush(SLOT).await;
        assert!(
            confirmed < Some(after_first),
            "confirmed past an undelivered event"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        relay.wait_exit(Duration::from_millis(10)).is_none(),
        "the relay waits the outage out\n{}",
        relay.log()
    );
    // Log noise: a handful of lines for the whole outage (librdkafka's folded).
    let during = relay.shown_since(lines_before);
    assert!(
        during.len() <= crate::outages::MAX_LINES_PER_OUTAGE,
        "{} lines during a 30 s outage:\n{}",
        during.len(),
        during.join("\n")
    );
    world.broker.tansu().proxy().restore();
    world.wait_caught_up(SLOT, Duration::from_secs(120)).await;
    each_once(&world, &relay, &ids);
}

/// The broker process killed (SIGKILL) mid-stream and started again on its durable log:
/// every event arrives, none twice.
#[tokio::test(flavor = "current_thread")]
async fn a_broker_process_killed_and_restarted_mid_stream_loses_nothing() {
    let mut world = World::on(Tansu::start_behind_proxy()).await;
    let (relay, mut ids) = streaming_behind_the_proxy(&world, &[]).await;
    ids.extend(commit(&world, 2_000, "before").await);
    world.broker.tansu_mut().kill();
    let during = commit(&world, 50, "during").await;
    let after_during = world.current_lsn().await;
    ids.extend(during);
    world
        .wait_replies_past(SLOT, after_during, Duration::from_secs(30))
        .await;
    let confirmed = world.confirmed_flush(SLOT).await;
    assert!(
        confirmed < Some(after_during),
        "confirmed while the broker was down"
    );
    world.broker.tansu_mut().restart();
    ids.extend(commit(&world, 50, "after").await);
    world.wait_caught_up(SLOT, Duration::from_secs(120)).await;
    assert!(relay.streaming(), "{}", relay.log());
    each_once(&world, &relay, &ids);
}
