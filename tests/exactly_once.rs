//! `--delivery exactly-once`: after any number of SIGKILLs, every committed
//! event is in Kafka exactly once.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use outbox_relay::sink::exactly_once::partition_for;

use crate::support::relay::Relay;
use crate::support::world::{Schedule, World};

const SLOT: &str = "outbox_relay";
const EO: [&str; 6] = [
    "--delivery",
    "exactly-once",
    "--reconnect-backoff-min",
    "200ms",
    "--reconnect-backoff-max",
    "2s",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_crash_loop_delivers_every_event_exactly_once() {
    let world = World::start().await;
    world.broker.ensure_topic("Evt");
    let url = world.pg.url();
    let bootstrap = world.broker.bootstrap();
    let kills = 20;
    let mut schedule = Schedule::new(0xD1B5_4A32_D192_ED03);
    let mut committed = Vec::new();
    let mut n = 0u64;
    for kill in 0..=kills {
        let mut relay = Relay::spawn(&url, &bootstrap, &EO);
        if kill == 0 {
            relay.wait_streaming();
        }
        // Let most runs stream for a while, so kills land mid-delivery.
        let until = Instant::now() + Duration::from_millis(300 + schedule.next() % 900);
        while Instant::now() < until {
            let events = 1 + (schedule.next() % 4) as usize;
            let rows: Vec<(String, String, String)> = (0..events)
                .map(|k| {
                    let key = if (n + k as u64).is_multiple_of(7) {
                        String::new()
                    } else {
                        format!("agg-{}", n % 6)
                    };
                    ("Evt".to_owned(), key, format!(r#"{{"n": {n}, "k": {k}}}"#))
                })
                .collect();
            committed.extend(world.insert_tx(&rows).await);
            n += 1;
        }
        if kill < kills {
            relay.signal("KILL");
            relay.wait_exit(Duration::from_secs(10)).expect("killed");
        } else {
            let end = world.current_lsn().await;
            world
                .wait_confirmed(SLOT, end, Duration::from_secs(90))
                .await;
            let records = world
                .broker
                .consume_ids(&["Evt"], &committed, Duration::from_secs(60));
            let mut counts: HashMap<String, usize> = HashMap::new();
            for r in &records {
                *counts.entry(r.id()).or_default() += 1;
                // The partition is fixed by the key (the id when the key is empty text here).
                let key = r.key.clone().filter(|k| !k.is_empty());
                if let Some(key) = key {
                    assert_eq!(r.partition, partition_for(&key, 4), "{r:?}");
                }
                assert!(
                    r.header("outbox.source")
                        .unwrap()
                        .starts_with("outbox_relay@")
                );
            }
            let lost: Vec<&String> = committed
                .iter()
                .filter(|id| !counts.contains_key(*id))
                .collect();
            let duplicated: Vec<(&String, &usize)> =
                counts.iter().filter(|(_, c)| **c > 1).collect();
            eprintln!(
                "exactly-once crash loop: {kills} SIGKILLs, {} events committed, {} records, {} duplicated",
                committed.len(),
                records.len(),
                duplicated.len()
            );
            assert!(
                lost.is_empty(),
                "{} lost: {lost:?}\n{}",
                lost.len(),
                relay.log()
            );
            assert!(duplicated.is_empty(), "duplicates: {duplicated:?}");
            assert_eq!(records.len(), committed.len());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_partitioner_matches_the_java_client() {
    let world = World::start().await;
    world.broker.ensure_topic("Evt");
    let mut relay = Relay::spawn(&world.pg.url(), &world.broker.bootstrap(), &[]);
    relay.wait_streaming();
    let keys: Vec<String> = (0..40).map(|i| format!("order-{i}")).collect();
    let rows: Vec<(&str, &str, &str)> = keys.iter().map(|k| ("Evt", k.as_str(), "{}")).collect();
    world.insert_tx(&rows).await;
    let records = world.broker.consume(&["Evt"], 40, Duration::from_secs(30));
    assert_eq!(records.len(), 40, "{}", relay.log());
    for r in &records {
        let key = r.key.clone().unwrap();
        assert_eq!(
            r.partition,
            partition_for(&key, 4),
            "key {:?}",
            r.key_text()
        );
    }
}

/// Writes one record that claims to come from this relay (`outbox.source`).
fn forge(bootstrap: &str, topic: &str, partition: i32, key: &str, source: &str, lsn: &str) {
    use rdkafka::config::ClientConfig;
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "id",
            value: Some("forged"),
        })
        .insert(Header {
            key: "outbox.source",
            value: Some(source),
        })
        .insert(Header {
            key: "outbox.lsn",
            value: Some(lsn),
        })
        .insert(Header {
            key: "outbox.seq",
            value: Some("0"),
        });
    producer
        .send(
            BaseRecord::to(topic)
                .partition(partition)
                .key(key)
                .payload("{}")
                .headers(headers),
        )
        .map_err(|(e, _)| e)
        .unwrap();
    producer.flush(Duration::from_secs(10)).unwrap();
}

async fn source_id(world: &World) -> String {
    let rows = world
        .pg
        .execute("SELECT system_identifier::text FROM pg_control_system()")
        .await;
    format!("outbox_relay@{}", rows[0][0].clone().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_writer_with_the_same_source_is_refused() {
    let world = World::start().await;
    world.broker.ensure_topic("Evt");
    let mut relay = Relay::spawn(&world.pg.url(), &world.broker.bootstrap(), &EO);
    relay.wait_streaming();
    let source = source_id(&world).await;
    // A record "from us" at an LSN the WAL has not reached.
    let partition = partition_for(b"agg-x", 4);
    forge(
        &world.broker.bootstrap(),
        "Evt",
        partition,
        "agg-x",
        &source,
        "FFFF/0",
    );
    world.insert_tx(&[("Evt", "agg-x", "{}")]).await;
    let status = relay
        .wait_exit(Duration::from_secs(30))
        .expect("relay stops");
    let log = relay.log();
    assert_eq!(status.code(), Some(4), "{log}");
    assert!(
        log.contains("another writer uses the same source header"),
        "{log}"
    );
    assert!(
        log.contains("--exactly-once-fallback at-least-once"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_partition_count_is_detected_and_the_fallback_continues() {
    let world = World::start().await;
    world.broker.ensure_topic("Evt");
    let source = source_id(&world).await;
    // The next event's partition holds, as the last record "from us", one
    // whose key hashes to another partition: as if the topic had been resized.
    let key = "order-1".to_owned();
    let target = partition_for(key.as_bytes(), 4);
    let planted_key = (0..100)
        .map(|i| format!("m-{i}"))
        .find(|k| partition_for(k.as_bytes(), 4) != target)
        .unwrap();
    forge(
        &world.broker.bootstrap(),
        "Evt",
        target,
        &planted_key,
        &source,
        "0/1",
    );

    let mut relay = Relay::spawn(&world.pg.url(), &world.broker.bootstrap(), &EO);
    relay.wait_streaming();
    world.insert_tx(&[("Evt", &key, "{}")]).await;
    let status = relay
        .wait_exit(Duration::from_secs(30))
        .expect("relay stops");
    let log = relay.log();
    assert_eq!(status.code(), Some(4), "{log}");
    assert!(log.contains("partition count"), "{log}");

    // With the fallback allowed, the same event goes through (at-least-once for that partition).
    let mut args = EO.to_vec();
    args.extend(["--exactly-once-fallback", "at-least-once"]);
    let mut relay = Relay::spawn(&world.pg.url(), &world.broker.bootstrap(), &args);
    relay.wait_streaming();
    let end = world.current_lsn().await;
    world
        .wait_confirmed(SLOT, end, Duration::from_secs(30))
        .await;
    assert!(
        relay.log().contains("continuing at-least-once"),
        "{}",
        relay.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tail_removed_by_retention_is_detected() {
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let world = World::start().await;
    world.broker.ensure_topic("Evt");
    let bootstrap = world.broker.bootstrap();
    let mut relay = Relay::spawn(&world.pg.url(), &bootstrap, &EO);
    relay.wait_streaming();
    world.insert_tx(&[("Evt", "order-1", "{}")]).await;
    let end = world.current_lsn().await;
    world
        .wait_confirmed(SLOT, end, Duration::from_secs(30))
        .await;
    relay.signal("TERM");
    relay.wait_exit(Duration::from_secs(30)).expect("stops");

    // Other writers fill the partition until the mock broker's retention
    // (about 5 MB per partition) has dropped the relay's record.
    let partition = partition_for(b"order-1", 4);
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "retention-check")
        .create()
        .unwrap();
    let blob = "x".repeat(200_000);
    for i in 0..80 {
        forge_payload(&bootstrap, "Evt", partition, &format!("other-{i}"), &blob);
        let (low, _) = consumer
            .fetch_watermarks("Evt", partition, Duration::from_secs(5))
            .unwrap();
        if low > 0 {
            break;
        }
    }
    let (low, _) = consumer
        .fetch_watermarks("Evt", partition, Duration::from_secs(5))
        .unwrap();
    assert!(low > 0, "retention did not drop anything");

    let mut relay = Relay::spawn(&world.pg.url(), &bootstrap, &EO);
    relay.wait_streaming();
    world.insert_tx(&[("Evt", "order-1", "{}")]).await;
    let status = relay
        .wait_exit(Duration::from_secs(60))
        .expect("relay stops");
    let log = relay.log();
    assert_eq!(status.code(), Some(4), "{log}");
    assert!(log.contains("retention removed older records"), "{log}");
}

/// Writes a record from another producer (no relay headers).
fn forge_payload(bootstrap: &str, topic: &str, partition: i32, key: &str, payload: &str) {
    use rdkafka::config::ClientConfig;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("message.max.bytes", "1000000")
        .create()
        .unwrap();
    producer
        .send(
            BaseRecord::to(topic)
                .partition(partition)
                .key(key)
                .payload(payload),
        )
        .map_err(|(e, _)| e)
        .unwrap();
    producer.flush(Duration::from_secs(10)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_reads_many_partition_tails_promptly() {
    let world = World::start().await;
    let topics: Vec<String> = (0..5).map(|i| format!("Evt{i}")).collect();
    for t in &topics {
        world.broker.ensure_topic(t);
    }
    let bootstrap = world.broker.bootstrap();
    let mut relay = Relay::spawn(&world.pg.url(), &bootstrap, &EO);
    relay.wait_streaming();
    let rows: Vec<(String, String, &str)> = (0..100)
        .map(|i| (topics[i % 5].clone(), format!("agg-{i}"), "{}"))
        .collect();
    let mut ids = world.insert_tx(&rows).await;
    let end = world.current_lsn().await;
    world
        .wait_confirmed(SLOT, end, Duration::from_secs(30))
        .await;
    relay.signal("TERM");
    relay.wait_exit(Duration::from_secs(30)).expect("stops");

    let mut relay = Relay::spawn(&world.pg.url(), &bootstrap, &EO);
    relay.wait_streaming();
    let started = Instant::now();
    ids.extend(world.insert_tx(&rows).await);
    let end = world.current_lsn().await;
    world
        .wait_confirmed(SLOT, end, Duration::from_secs(60))
        .await;
    let took = started.elapsed();
    eprintln!("exactly-once restart: 20 partition tails read and 100 events confirmed in {took:?}");
    let topic_refs: Vec<&str> = topics.iter().map(String::as_str).collect();
    let records = world
        .broker
        .consume_ids(&topic_refs, &ids, Duration::from_secs(30));
    assert_eq!(records.len(), 200, "{}", relay.log());
    assert!(
        took < Duration::from_secs(4),
        "20 partition tails took {took:?} to read; log:\n{}",
        relay.log()
    );
}
