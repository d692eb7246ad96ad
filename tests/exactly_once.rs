//! `--delivery exactly-once`: after any number of SIGKILLs, every committed
//! event is in Kafka exactly once.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use outbox_relay::sink::exactly_once::partition_for;

use crate::support::relay::Relay;
use crate::support::world::World;

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
    let mut seed: u64 = 0xD1B5_4A32_D192_ED03;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut committed = Vec::new();
    let mut n = 0u64;
    for kill in 0..=kills {
        let mut relay = Relay::spawn(&url, &bootstrap, &EO);
        if kill == 0 {
            relay.wait_streaming();
        }
        // Let most runs stream for a while, so kills land mid-delivery.
        let until = Instant::now() + Duration::from_millis(300 + next() % 900);
        while Instant::now() < until {
            let events = 1 + (next() % 4) as usize;
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
            let refs: Vec<(&str, &str, &str)> = rows
                .iter()
                .map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str()))
                .collect();
            committed.extend(world.insert_tx(&refs).await);
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
