//! Bad input: `--on-poison fail` stops before acknowledging the event;
//! `--on-poison dead-letter` diverts it with headers saying why, and goes on.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

use crate::support::kafka::Consumed;
use crate::support::relay::Relay;
use crate::support::world::World;

const SLOT: &str = "outbox_relay";
const DLQ: &str = "outbox.dlq";

/// A table without NOT NULL constraints, so every bad row can be written.
const LOOSE: &str = "
    CREATE TABLE public.loose (
        id text, aggregate_type text, aggregate_id text, event_type text,
        payload jsonb, created_at timestamptz
    );";

async fn insert_loose(
    world: &World,
    id: Option<&str>,
    event_type: Option<&str>,
    payload: &str,
    created_at: &str,
) {
    let lit = |v: Option<&str>| v.map_or("NULL".to_owned(), |v| format!("'{v}'"));
    world
        .pg
        .execute(&format!(
            "INSERT INTO loose VALUES ({}, 'order', 'agg-1', {}, {payload}, {created_at})",
            lit(id),
            lit(event_type)
        ))
        .await;
}

fn header(r: &Consumed, name: &str) -> String {
    r.header(name).unwrap_or_default()
}

#[tokio::test(flavor = "current_thread")]
async fn poison_events_are_dead_lettered_with_the_reason_and_the_stream_goes_on() {
    poison_events_are_dead_lettered(&World::start().await).await;
}

/// Every kind of poison event is dead-lettered with its reason and the stream goes on
/// (`broker_process` runs it against a broker in its own process too).
pub(crate) async fn poison_events_are_dead_lettered(world: &World) {
    world.pg.execute(LOOSE).await;
    let mut relay = Relay::spawn(
        &world.pg.url(),
        &world.broker.bootstrap(),
        &[
            "--table",
            "public.loose",
            "--on-poison",
            "dead-letter",
            "--dead-letter-topic",
            DLQ,
            "--timestamp-column",
            "created_at",
            "-X",
            "message.max.bytes=20000",
        ],
    );
    relay.wait_streaming();
    let long_topic = "x".repeat(250);
    let big = format!("'{{\"blob\": \"{}\"}}'", "y".repeat(30_000));
    insert_loose(world, Some("good-1"), Some("Evt"), "'{}'", "NULL").await;
    insert_loose(world, Some("null-route"), None, "'{}'", "NULL").await;
    insert_loose(world, Some("empty-route"), Some(""), "'{}'", "NULL").await;
    insert_loose(world, Some("bad-chars"), Some("bad topic!"), "'{}'", "NULL").await;
    insert_loose(world, Some("too-long"), Some(&long_topic), "'{}'", "NULL").await;
    insert_loose(world, None, Some("Evt"), "'{\"null\": \"id\"}'", "NULL").await;
    insert_loose(world, Some("too-big"), Some("Evt"), &big, "NULL").await;
    insert_loose(world, Some("bad-time"), Some("Evt"), "'{}'", "'infinity'").await;
    insert_loose(world, Some("good-2"), Some("Evt"), "'{}'", "NULL").await;
    let end = world.current_lsn().await;

    let good = world.broker.consume(&["Evt"], 3, Duration::from_secs(20));
    let good_ids: Vec<String> = good.iter().map(Consumed::id).collect();
    assert_eq!(good_ids, ["good-1", "good-2"], "{}", relay.log());

    let dead = world.broker.consume(&[DLQ], 7, Duration::from_secs(30));
    assert_eq!(dead.len(), 7, "{}", relay.log());
    let by_id: HashMap<String, &Consumed> = dead.iter().map(|r| (r.id(), r)).collect();
    for r in &dead {
        assert_eq!(header(r, "outbox.table"), "public.loose");
        assert!(header(r, "outbox.lsn").contains('/'), "an LSN: {r:?}");
        assert!(!header(r, "outbox.error").is_empty());
        assert_eq!(
            r.key_text().as_deref(),
            Some("agg-1"),
            "the original key is kept"
        );
    }
    assert!(header(by_id["null-route"], "outbox.error").contains("NULL or empty"));
    assert!(header(by_id["empty-route"], "outbox.error").contains("NULL or empty"));
    assert_eq!(header(by_id["bad-chars"], "outbox.topic"), "bad topic!");
    assert!(header(by_id["bad-chars"], "outbox.error").contains("not valid in Kafka"));
    assert_eq!(header(by_id["too-long"], "outbox.topic"), long_topic);
    assert!(
        header(by_id[""], "outbox.error").contains("NULL"),
        "NULL id: {:?}",
        by_id[""]
    );
    assert_eq!(
        by_id[""].payload_text().as_deref(),
        Some(r#"{"null": "id"}"#)
    );
    let too_big = by_id["too-big"];
    assert_eq!(
        too_big.payload, None,
        "the payload is the reason, so it is left out"
    );
    assert!(header(too_big, "outbox.payload.omitted").contains("message.max.bytes"));
    assert_eq!(header(too_big, "outbox.topic"), "Evt");
    assert!(header(by_id["bad-time"], "outbox.error").contains("timestamp"));
    assert_eq!(
        by_id["bad-time"].payload_text().as_deref(),
        Some("{}"),
        "payload kept"
    );

    world
        .wait_confirmed(SLOT, end, Duration::from_secs(20))
        .await;
    assert!(
        relay.wait_exit(Duration::from_millis(10)).is_none(),
        "still running"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_broker_side_rejection_is_dead_lettered() {
    let world = World::start().await;
    let mut relay = Relay::spawn(
        &world.pg.url(),
        &world.broker.bootstrap(),
        &["--on-poison", "dead-letter", "--dead-letter-topic", DLQ],
    );
    relay.wait_streaming();
    let first = world.insert_tx(&[("Evt", "a", "{}")]).await;
    assert_eq!(
        world
            .broker
            .consume(&["Evt"], 1, Duration::from_secs(20))
            .len(),
        1
    );
    // The broker rejects the next produce request for good.
    world.broker.ensure_topic(DLQ);
    world.broker.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_INVALID_RECORD],
    );
    let rejected = world.insert_tx(&[("Evt", "a", r#"{"r": 1}"#)]).await;
    let end = world.current_lsn().await;
    let dead = world.broker.consume(&[DLQ], 1, Duration::from_secs(30));
    assert_eq!(dead.len(), 1, "{}", relay.log());
    assert_eq!(dead[0].id(), rejected[0]);
    assert!(
        header(&dead[0], "outbox.error")
            .to_lowercase()
            .contains("invalid"),
        "{:?}",
        dead[0]
    );
    assert_eq!(dead[0].payload_text().as_deref(), Some(r#"{"r": 1}"#));
    world
        .wait_confirmed(SLOT, end, Duration::from_secs(20))
        .await;
    let _ = first;
}

#[tokio::test(flavor = "current_thread")]
async fn under_fail_a_poison_event_stops_the_relay_before_it_is_acknowledged() {
    let world = World::start().await;
    let mut relay = Relay::spawn(&world.pg.url(), &world.broker.bootstrap(), &[]);
    relay.wait_streaming();
    world.insert_tx(&[("Evt", "a", "{}")]).await;
    let rows = world
        .pg
        .execute(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
             VALUES ('order', 'a', NULL, '{}') RETURNING id::text",
        )
        .await;
    let id = rows[0][0].clone().unwrap();
    let after = world.current_lsn().await;
    let status = relay
        .wait_exit(Duration::from_secs(30))
        .expect("relay stops");
    let log = relay.log();
    assert_eq!(status.code(), Some(5), "{log}");
    assert!(log.contains(&id), "names the event id: {log}");
    assert!(log.contains("public.outbox"), "names the table: {log}");
    assert!(log.contains("commit LSN"), "names the LSN: {log}");
    assert!(
        log.contains("--on-poison dead-letter"),
        "says the remedy: {log}"
    );
    let confirmed = world.confirmed_flush(SLOT).await.unwrap();
    assert!(confirmed < after, "slot moved past the poison event");
}

#[tokio::test(flavor = "current_thread")]
async fn a_batch_refused_for_its_size_is_sent_again_record_by_record() {
    let world = World::start().await;
    world.broker.create_topic("Evt", 1);
    world.broker.ensure_topic(DLQ);
    let mut relay = Relay::spawn(
        &world.pg.url(),
        &world.broker.bootstrap(),
        &[
            "--on-poison",
            "dead-letter",
            "--dead-letter-topic",
            DLQ,
            "-X",
            "linger.ms=100",
        ],
    );
    relay.wait_streaming();
    // The broker refuses the next batch as too large, as it does when a batch
    // of small records exceeds the topic's max.message.bytes.
    world.broker.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE],
    );
    let rows: Vec<_> = (0..5)
        .map(|n| ("Evt", "a".to_owned(), format!(r#"{{"n": {n}}}"#)))
        .collect();
    let ids = world.insert_tx(&rows).await;
    let end = world.current_lsn().await;
    world
        .wait_confirmed(SLOT, end, Duration::from_secs(60))
        .await;
    // Acknowledged, so each event is in Evt or in the dead-letter topic by now.
    let got: Vec<String> = world
        .broker
        .consume_ids(&["Evt"], &ids, Duration::from_secs(20))
        .iter()
        .map(Consumed::id)
        .collect();
    assert_eq!(
        got,
        ids,
        "every healthy event delivered, in order; log:\n{}",
        relay.log()
    );
    assert_eq!(
        relay
            .metric("outbox_relay_dead_lettered_total")
            .unwrap_or(0.0),
        0.0
    );

    // A record the broker refuses on its own as well is poison.
    world.broker.request_errors(
        RDKafkaApiKey::Produce,
        &[
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE,
        ],
    );
    let big = world.insert_tx(&[("Evt", "b", r#"{"big": true}"#)]).await;
    let dead = world.broker.consume(&[DLQ], 1, Duration::from_secs(30));
    assert_eq!(dead.len(), 1, "{}", relay.log());
    assert_eq!(dead[0].id(), big[0]);
    assert!(header(&dead[0], "outbox.payload.omitted").contains("message.max.bytes"));
    assert_eq!(relay.metric("outbox_relay_dead_lettered_total"), Some(1.0));
}

#[tokio::test(flavor = "current_thread")]
async fn a_dead_letter_record_refused_like_its_event_stops_the_relay() {
    let world = World::start().await;
    world.broker.ensure_topic("Evt");
    world.broker.ensure_topic(DLQ);
    let mut relay = Relay::spawn(
        &world.pg.url(),
        &world.broker.bootstrap(),
        &["--on-poison", "dead-letter", "--dead-letter-topic", DLQ],
    );
    relay.wait_streaming();
    // Every produce is refused for good, the dead-letter records' too.
    world.broker.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_INVALID_RECORD; 40],
    );
    let ids = world.insert_tx(&[("Evt", "a", "{}")]).await;
    let after = world.current_lsn().await;
    let status = relay
        .wait_exit(Duration::from_secs(60))
        .expect("the relay stops instead of dead-lettering the dead-letter record again");
    let log = relay.log();
    assert_eq!(status.code(), Some(6), "{log}");
    assert!(
        log.contains(&ids[0]) && log.contains("dead-letter record"),
        "{log}"
    );
    let confirmed = world.confirmed_flush(SLOT).await.unwrap();
    assert!(confirmed < after, "slot moved past the refused event");
}
