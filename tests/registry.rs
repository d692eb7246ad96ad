//! The Schema Registry as a dependency that fails (`--key-converter avro --value-converter
//! avro`, without Debezium): down for 10 s mid-stream (events wait, nothing is acknowledged past
//! them or dead-lettered, `/readyz` and the metric say why, the relay goes on), a refused schema
//! (409: poison, named), a refused relay (401: exit 2, named, the credentials never logged),
//! and one registry request per new schema, not per event.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::support::kafka::Consumed;
use crate::support::registry::Registry;
use crate::support::relay::Relay;
use crate::support::world::World;

const SLOT: &str = "outbox_relay";
const DLQ: &str = "outbox.dlq";

/// The relay with avro keys and values through `registry`, and `extra` flags.
pub fn avro_relay(world: &World, registry: &Registry, extra: &[&str]) -> Relay {
    let url = registry.url();
    let mut args = vec![
        "--key-converter",
        "avro",
        "--value-converter",
        "avro",
        "--schema-registry-url",
        &url,
    ];
    args.extend_from_slice(extra);
    Relay::spawn(&world.pg.url(), &world.broker.bootstrap(), &args)
}

/// A record's schema id and Avro body: Confluent's framing.
pub fn framed(bytes: Option<&Vec<u8>>) -> (u32, Vec<u8>) {
    let bytes = bytes.expect("a key or value");
    assert_eq!(bytes[0], 0, "magic byte");
    let id = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    (id, bytes[5..].to_vec())
}

/// The Avro body of an optional string: union branch 1, length, bytes.
fn optional_string(text: &str) -> Vec<u8> {
    let mut body = vec![2];
    let mut n = (text.len() as u64) << 1;
    while n >= 0x80 {
        body.push((n as u8) | 0x80);
        n >>= 7;
    }
    body.push(n as u8);
    body.extend_from_slice(text.as_bytes());
    body
}

/// Every record's key and value are the aggregate id and payload, framed with the ids the
/// registry holds for their topic's subjects.
pub fn assert_avro(records: &[Consumed], registry: &Registry) {
    let subjects = registry.dump();
    for record in records {
        let (key_id, key) = framed(record.key.as_ref());
        let (value_id, value) = framed(record.payload.as_ref());
        let id_of = |suffix: &str| subjects[&format!("{}-{suffix}", record.topic)][0].0;
        assert_eq!(
            (key_id, value_id),
            (id_of("key"), id_of("value")),
            "{record:?}"
        );
        assert!(key.starts_with(&[2]), "{key:?}");
        assert_eq!(value, optional_string(r#"{"n": 1}"#), "{record:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_down_for_10_s_mid_stream_loses_nothing_and_the_relay_goes_on() {
    let world = World::start().await;
    let mut registry = Registry::spawn().await;
    let extra = ["--on-poison", "dead-letter", "--dead-letter-topic", DLQ];
    let mut relay = avro_relay(&world, &registry, &extra);
    tokio::task::block_in_place(|| relay.wait_streaming());
    let mut ids = world.insert_tx(&[("Known", "a", r#"{"n": 1}"#)]).await;
    let healthy = world.current_lsn().await;
    world
        .wait_confirmed(SLOT, healthy, Duration::from_secs(30))
        .await;
    let requests = registry.requests();

    registry.stop().await;
    // A schema whose id the relay has not seen (a new topic's subjects), then events of a
    // known one behind it: all wait, in order.
    ids.extend(world.insert_tx(&[("New", "b", r#"{"n": 1}"#)]).await);
    let after_new = world.current_lsn().await;
    let outage = Instant::now() + Duration::from_secs(10);
    let mut n = 0;
    while Instant::now() < outage {
        let key = format!("k{}", n % 5);
        ids.extend(world.insert_tx(&[("Known", &key, r#"{"n": 1}"#)]).await);
        n += 1;
        let confirmed = world.confirmed_flush(SLOT).await.unwrap();
        assert!(
            confirmed < after_new,
            "slot passed events waiting for the registry"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    world
        .wait_replies_past(SLOT, after_new, Duration::from_secs(30))
        .await;
    assert!(world.confirmed_flush(SLOT).await.unwrap() < after_new);
    let waiting = relay.metric("outbox_relay_schema_registry_waiting_events");
    assert!(
        waiting.is_some_and(|w| w >= 1.0),
        "waiting events: {waiting:?}"
    );
    let readyz = relay.readyz().unwrap_or_default();
    assert_eq!(readyz["ready"], false, "{readyz}");
    assert!(readyz.to_string().contains("Schema Registry"), "{readyz}");
    assert!(
        relay.wait_exit(Duration::from_millis(10)).is_none(),
        "the relay waits it out"
    );

    registry.start().await.unwrap();
    let end = world.current_lsn().await;
    world
        .wait_confirmed(SLOT, end, Duration::from_secs(60))
        .await;
    let records = tokio::task::block_in_place(|| {
        world
            .broker
            .consume_ids(&["Known", "New"], &ids, Duration::from_secs(60))
    });
    let got: HashSet<String> = records.iter().map(Consumed::id).collect();
    let lost: Vec<_> = ids.iter().filter(|id| !got.contains(*id)).collect();
    assert!(
        lost.is_empty(),
        "{} of {} lost; log:\n{}",
        lost.len(),
        ids.len(),
        relay.log()
    );
    assert_avro(&records, &registry);
    // Each key's records in the order they were written (ids are in insert order).
    let mut last_by_key = std::collections::HashMap::new();
    let position: std::collections::HashMap<&String, usize> =
        ids.iter().enumerate().map(|(i, id)| (id, i)).collect();
    for record in &records {
        let at = position[&record.id()];
        let previous = last_by_key.insert(record.key.clone(), at);
        assert!(
            previous.is_none_or(|p| p < at),
            "{} out of order",
            record.id()
        );
    }
    let dead =
        tokio::task::block_in_place(|| world.broker.consume(&[DLQ], 1, Duration::from_secs(2)));
    assert!(dead.is_empty(), "dead-lettered: {dead:?}");
    assert!(
        relay.wait_for(Duration::from_secs(30), |r| {
            r.readyz().is_some_and(|z| z["ready"] == true)
        }),
        "ready again; log:\n{}",
        relay.log()
    );
    // The new topic's two subjects took a request each, the outage its retries; the many
    // events of the known topic none.
    let unavailable = relay.metric_samples("outbox_relay_schema_registry_requests_total");
    assert!(
        unavailable
            .iter()
            .any(|(labels, v)| labels.contains("unavailable") && *v >= 1.0),
        "{unavailable:?}"
    );
    assert_eq!(
        registry.requests() - requests,
        2,
        "requests after the outage"
    );
    relay.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_the_registry_refuses_is_poison_named_by_subject() {
    let world = World::start().await;
    let registry = Registry::spawn().await;
    registry.refuse_subject("Refused-value");
    let mut relay = avro_relay(&world, &registry, &[]);
    tokio::task::block_in_place(|| relay.wait_streaming());
    world.insert_tx(&[("Fine", "a", r#"{"n": 1}"#)]).await;
    let before = world.current_lsn().await;
    world.insert_tx(&[("Refused", "b", r#"{"n": 1}"#)]).await;
    let status = tokio::task::block_in_place(|| relay.wait_exit(Duration::from_secs(60)));
    assert_eq!(status.and_then(|s| s.code()), Some(5), "{}", relay.log());
    let log = relay.log();
    for needle in [
        "\"Refused-value\"",
        "HTTP 409",
        "Schema being registered is incompatible",
        "compatibility",
    ] {
        assert!(log.contains(needle), "{needle:?} in:\n{log}");
    }
    let confirmed = world.confirmed_flush(SLOT).await.unwrap();
    assert!(confirmed <= before, "the slot moved past the refused event");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_that_refuses_the_relay_stops_it_with_the_configuration_code() {
    let world = World::start().await;
    let registry = Registry::spawn().await;
    let secret = "relay:s3cret-pass";
    registry.require_auth(secret);
    let mut relay = avro_relay(&world, &registry, &[]);
    tokio::task::block_in_place(|| relay.wait_streaming());
    let before = world.current_lsn().await;
    world.insert_tx(&[("Evt", "a", r#"{"n": 1}"#)]).await;
    let status = tokio::task::block_in_place(|| relay.wait_exit(Duration::from_secs(60)));
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{}", relay.log());
    let log = relay.log();
    assert!(log.contains("refused the relay (HTTP 401)"), "{log}");
    assert!(log.contains("--schema-registry-user-info"), "{log}");
    assert!(world.confirmed_flush(SLOT).await.unwrap() <= before);

    // With the credentials (in the URL here), it relays; they appear in no log line.
    let url = registry
        .url()
        .replace("http://", &format!("http://{secret}@"));
    let args = [
        "--key-converter",
        "avro",
        "--value-converter",
        "avro",
        "--schema-registry-url",
        &url,
    ];
    let mut relay = Relay::spawn(&world.pg.url(), &world.broker.bootstrap(), &args);
    let end = world.current_lsn().await;
    world
        .wait_confirmed(SLOT, end, Duration::from_secs(60))
        .await;
    relay.stop();
    assert!(!relay.log().contains("s3cret-pass"), "{}", relay.log());
}
