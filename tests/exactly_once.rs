//! `--delivery exactly-once`: after any number of SIGKILLs, every committed
//! event is in Kafka exactly once.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use outbox_relay::lsn::Lsn;
use outbox_relay::sink::exactly_once::partition_for;

use crate::support::kafka::Consumed;
use crate::support::relay::{Relay, run_command};
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
    sigkill_crash_loop(&World::start().await, 20, &[]).await;
}

/// `kills` SIGKILLs of an exactly-once relay (with `args` too) while events are written: each
/// event is in Kafka once (`broker_process` runs it against a broker in its own process too).
pub(crate) async fn sigkill_crash_loop(world: &World, kills: u32, args: &[&str]) {
    world.broker.ensure_topic("Evt");
    let url = world.pg.url();
    let bootstrap = world.broker.bootstrap();
    let mut schedule = Schedule::new(0xD1B5_4A32_D192_ED03);
    let mut committed = Vec::new();
    let mut n = 0u64;
    for kill in 0..=kills {
        let mut relay = Relay::spawn(&url, &bootstrap, &[&EO[..], args].concat());
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
            relay.kill();
        } else {
            world.wait_caught_up(SLOT, Duration::from_secs(90)).await;
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
    let relay = world.relay(&[]);
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
fn forge(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    key: &str,
    source: &str,
    position: (&str, &str),
) {
    let (lsn, change) = position;
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
            key: "outbox.change",
            value: Some(change),
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

/// The commit LSN (as `outbox.lsn` spells it) of the first transaction the
/// slot will replay, read with the relay stopped.
async fn commit_lsn_of_next_replay(world: &World) -> String {
    let rows = world
        .pg
        .execute(&format!(
            "SELECT encode(substr(data, 2, 8), 'hex') FROM pg_logical_slot_peek_binary_changes(\
             '{SLOT}', NULL, NULL, 'proto_version', '1', 'publication_names', 'outbox_relay') \
             WHERE get_byte(data, 0) = ascii('B') LIMIT 1"
        ))
        .await;
    let hex = rows[0][0].clone().unwrap();
    outbox_relay::lsn::Lsn(u64::from_str_radix(&hex, 16).unwrap()).to_string()
}

/// The `outbox.change` values of the first two inserts the slot will replay.
async fn changes_of_next_replay(world: &World) -> (String, String) {
    let rows = world
        .pg
        .execute(&format!(
            "SELECT lsn::text FROM pg_logical_slot_peek_binary_changes('{SLOT}', NULL, NULL, \
             'proto_version', '1', 'publication_names', 'outbox_relay') \
             WHERE get_byte(data, 0) = ascii('I') LIMIT 2"
        ))
        .await;
    let change = |row: &Vec<Option<String>>| format!("{}:0", row[0].clone().unwrap());
    (change(&rows[0]), change(&rows[1]))
}

async fn source_id(world: &World) -> String {
    let rows = world
        .pg
        .execute(
            "SELECT system_identifier::text || '/' || timeline_id \
             FROM pg_control_system(), pg_control_checkpoint()",
        )
        .await;
    format!("outbox_relay@{}", rows[0][0].clone().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_writer_with_the_same_source_is_refused() {
    let world = World::start().await;
    world.broker.ensure_topic("Evt");
    let mut relay = world.relay(&EO);
    let source = source_id(&world).await;
    // A record "from us" at an LSN the WAL has not reached.
    let partition = partition_for(b"agg-x", 4);
    forge(
        &world.broker.bootstrap(),
        "Evt",
        partition,
        "agg-x",
        &source,
        ("FFFF/0", "FFFF/0:0"),
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
async fn a_partition_count_change_below_the_last_record_is_detected_and_the_fallback_continues() {
    let world = World::start().await;
    world.broker.ensure_topic("Evt");
    let bootstrap = world.broker.bootstrap();
    let source = source_id(&world).await;
    // A first run creates the slot.
    let mut relay = Relay::spawn_streaming(&world.pg.url(), &bootstrap, &EO);
    relay.signal("TERM");
    relay.wait_exit(Duration::from_secs(30)).expect("stops");
    // A transaction a previous run delivered while the topic had 3 partitions
    // and did not get to confirm: both events sit in partition `q`, the first
    // with a key that hashes elsewhere with 4 partitions, the last (the tail
    // of `q`) with one that hashes to `q` either way.
    let find = |ok: &dyn Fn(&[u8]) -> bool| {
        (0..1000)
            .map(|i| format!("k-{i}"))
            .find(|k| ok(k.as_bytes()))
            .unwrap()
    };
    let moved = find(&|k| partition_for(k, 3) != partition_for(k, 4));
    let q = partition_for(moved.as_bytes(), 3);
    let stayed = find(&|k| partition_for(k, 3) == q && partition_for(k, 4) == q);
    world
        .insert_tx(&[("Evt", &moved, "{}"), ("Evt", &stayed, "{}")])
        .await;
    let lsn = commit_lsn_of_next_replay(&world).await;
    let (first, second) = changes_of_next_replay(&world).await;
    forge(&bootstrap, "Evt", q, &moved, &source, (&lsn, &first));
    forge(&bootstrap, "Evt", q, &stayed, &source, (&lsn, &second));

    let mut relay = Relay::spawn(&world.pg.url(), &bootstrap, &EO);
    let status = relay
        .wait_exit(Duration::from_secs(30))
        .expect("relay stops");
    let log = relay.log();
    assert_eq!(status.code(), Some(4), "{log}");
    assert!(log.contains("partition count"), "{log}");

    // With the fallback allowed, the same event goes through (at-least-once for that partition).
    let mut args = EO.to_vec();
    args.extend(["--exactly-once-fallback", "at-least-once"]);
    let relay = Relay::spawn_streaming(&world.pg.url(), &bootstrap, &args);
    world.wait_caught_up(SLOT, Duration::from_secs(30)).await;
    assert!(
        relay.log().contains("continuing at-least-once"),
        "{}",
        relay.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tail_aged_out_by_retention_is_not_an_error() {
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let world = World::start().await;
    world.broker.ensure_topic("Evt");
    let bootstrap = world.broker.bootstrap();
    let mut relay = Relay::spawn_streaming(&world.pg.url(), &bootstrap, &EO);
    world.insert_tx(&[("Evt", "order-1", "{}")]).await;
    world.wait_caught_up(SLOT, Duration::from_secs(30)).await;
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

    // Everything of ours that aged out was confirmed: the next event goes through.
    let mut relay = Relay::spawn_streaming(&world.pg.url(), &bootstrap, &EO);
    let ids = world.insert_tx(&[("Evt", "order-1", "{}")]).await;
    world.wait_caught_up(SLOT, Duration::from_secs(60)).await;
    let records = world
        .broker
        .consume_ids(&["Evt"], &ids, Duration::from_secs(30));
    assert_eq!(
        records.iter().filter(|r| r.id() == ids[0]).count(),
        1,
        "{}",
        relay.log()
    );
    assert!(
        relay.wait_exit(Duration::from_millis(10)).is_none(),
        "still running"
    );
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
async fn a_restart_reads_many_partition_tails_and_resends_nothing() {
    let world = World::start().await;
    let topics: Vec<String> = (0..5).map(|i| format!("Evt{i}")).collect();
    for t in &topics {
        world.broker.ensure_topic(t);
    }
    let bootstrap = world.broker.bootstrap();
    let mut relay = Relay::spawn_streaming(&world.pg.url(), &bootstrap, &EO);
    let rows: Vec<(String, String, &str)> = (0..100)
        .map(|i| (topics[i % 5].clone(), format!("agg-{i}"), "{}"))
        .collect();
    let mut ids = world.insert_tx(&rows).await;
    world.wait_caught_up(SLOT, Duration::from_secs(30)).await;
    relay.signal("TERM");
    relay.wait_exit(Duration::from_secs(30)).expect("stops");

    let mut relay = Relay::spawn_streaming(&world.pg.url(), &bootstrap, &EO);
    ids.extend(world.insert_tx(&rows).await);
    world.wait_caught_up(SLOT, Duration::from_secs(60)).await;
    let topic_refs: Vec<&str> = topics.iter().map(String::as_str).collect();
    let records = world
        .broker
        .consume_ids(&topic_refs, &ids, Duration::from_secs(30));
    assert_eq!(records.len(), 200, "{}", relay.log());
    assert!(
        relay.wait_exit(Duration::from_millis(10)).is_none(),
        "still running"
    );
}

/// One record per produce request, so the broker can refuse one and accept the next.
const ONE_PER_REQUEST: [&str; 4] = ["-X", "batch.num.messages=1", "-X", "linger.ms=0"];

/// Makes the next produce request fail for good while a later one, sent
/// before the refusal is known (slow answers), is accepted: the two records
/// for `key` of the returned transaction. Returns their ids and the WAL
/// position after them.
async fn refuse_one_accept_the_next(world: &World, key: &str) -> (Vec<String>, Lsn) {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    world.broker.round_trip_time(Duration::from_millis(500));
    world.broker.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_INVALID_RECORD],
    );
    let ids = world
        .insert_tx(&[("Evt", key, r#"{"n": 1}"#), ("Evt", key, r#"{"n": 2}"#)])
        .await;
    (ids, world.current_lsn().await)
}

/// After a relay stopped on the refusal (`--on-poison fail`): answers are
/// prompt again and the second record is in Kafka. Returns what was read.
fn the_second_landed(world: &World, relay: &mut Relay, ids: &[String]) -> Vec<Consumed> {
    let status = relay.wait_exit(Duration::from_secs(30)).expect("stops");
    assert_eq!(status.code(), Some(5), "{}", relay.log());
    world.broker.round_trip_time(Duration::ZERO);
    let before = world
        .broker
        .consume_ids(&["Evt"], &ids[1..], Duration::from_secs(30));
    assert!(before.iter().any(|r| r.id() == ids[1]), "{}", relay.log());
    before
}

/// Asserts each of `ids` is in `Evt` exactly once.
fn each_once(world: &World, ids: &[String], relay: &Relay) {
    let records = world
        .broker
        .consume_ids(&["Evt"], ids, Duration::from_secs(30));
    for id in ids {
        let n = records.iter().filter(|r| &r.id() == id).count();
        assert_eq!(n, 1, "event {id} delivered {n} times\n{}", relay.log());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_event_below_a_later_record_of_the_same_key_is_sent_after_restart() {
    let world = World::start().await;
    world.broker.ensure_topic("Evt");
    let (url, bootstrap) = (world.pg.url(), world.broker.bootstrap());
    let mut args = EO.to_vec();
    args.extend(ONE_PER_REQUEST);
    let mut relay = Relay::spawn_streaming(&url, &bootstrap, &args);
    let mut ids = world.insert_tx(&[("Evt", "agg", "{}")]).await;
    world.wait_caught_up(SLOT, Duration::from_secs(30)).await;

    let (refused, end) = refuse_one_accept_the_next(&world, "agg").await;
    let before = the_second_landed(&world, &mut relay, &refused);
    assert!(
        before.iter().all(|r| r.id() != refused[0]),
        "{}",
        relay.log()
    );
    assert!(world.confirmed_flush(SLOT).await.unwrap() < end);
    ids.extend(refused);

    let relay = Relay::spawn(&url, &bootstrap, &args);
    world
        .wait_confirmed(SLOT, end, Duration::from_secs(30))
        .await;
    each_once(&world, &ids, &relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_the_unconfirmed_records_of_an_exactly_once_relay() {
    let world = World::start().await;
    world.broker.ensure_topic("Evt");
    let (url, bootstrap) = (world.pg.url(), world.broker.bootstrap());
    let mut args = EO.to_vec();
    args.extend(ONE_PER_REQUEST);
    let mut active = Relay::spawn_streaming(&url, &bootstrap, &args);
    let mut ids = world.insert_tx(&[("Evt", "a", "{}")]).await;
    world.wait_caught_up(SLOT, Duration::from_secs(30)).await;

    let mut standby = Relay::spawn(&url, &bootstrap, &args);
    // Its producer is up (so its start-up checks are done) but it cannot stream.
    standby.wait_standing_by();
    // The active relay now leaves, unconfirmed, a record at a position past
    // the WAL end the standby saw at start-up: its own source, not a foreign writer.
    let (refused, _) = refuse_one_accept_the_next(&world, "a").await;
    the_second_landed(&world, &mut active, &refused);
    ids.extend(refused);

    standby.wait_streaming();
    ids.extend(world.insert_tx(&[("Evt", "a", "{}")]).await);
    world.wait_caught_up(SLOT, Duration::from_secs(30)).await;
    each_once(&world, &ids, &standby);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_event_to_a_topic_the_broker_creates_is_retried_until_it_exists() {
    use rdkafka::types::RDKafkaRespErr;
    let world = World::start().await;
    let mut relay = world.relay(&EO);
    // The topic is being created: metadata does not know it yet.
    world.broker.topic_error(
        "Fresh",
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART,
    );
    let before = world.current_lsn().await;
    let ids = world.insert_tx(&[("Fresh", "a", "{}")]).await;
    let received = relay.wait_for(Duration::from_secs(30), |r| {
        r.metric("outbox_relay_received_lsn")
            .is_some_and(|l| l > before.as_u64() as f64)
    });
    assert!(received, "{}", relay.log());
    world
        .broker
        .topic_error("Fresh", RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR);
    world.wait_caught_up(SLOT, Duration::from_secs(60)).await;
    let records = world
        .broker
        .consume_ids(&["Fresh"], &ids, Duration::from_secs(30));
    assert_eq!(records.len(), 1, "{}", relay.log());
    assert!(
        relay.wait_exit(Duration::from_millis(10)).is_none(),
        "{}",
        relay.log()
    );
}

/// `backfill --delivery exactly-once` sends the rows no relay saw and skips
/// those whose event ids are already in the topic, by the relay or by an
/// earlier backfill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_exactly_once_sends_only_the_events_not_in_kafka() {
    const N: usize = 30;
    const M: usize = 20;
    let world = World::start().await;
    world.broker.ensure_topic("Evt");
    let since = world.pg.execute("SELECT now()::text").await[0][0]
        .clone()
        .unwrap();
    let rows = |prefix: &str, n: usize| -> Vec<(String, String, String)> {
        (0..n)
            .map(|i| ("Evt".to_owned(), format!("{prefix}{i}"), "{}".to_owned()))
            .collect()
    };
    let mut relay = world.relay(&[]);
    let relayed = world.insert_tx(&rows("relayed-", N)).await;
    let records = world
        .broker
        .consume_ids(&["Evt"], &relayed, Duration::from_secs(60));
    assert_eq!(records.len(), N, "{}", relay.log());
    relay.stop();
    // Rows no slot ever sees.
    world
        .pg
        .execute(&format!("SELECT pg_drop_replication_slot('{SLOT}')"))
        .await;
    let missed = world.insert_tx(&rows("missed-", M)).await;

    let backfill = [
        "backfill",
        "--since",
        &since,
        "--delivery",
        "exactly-once",
        "--postgres-url",
        &world.pg.url(),
        "--kafka-brokers",
        &world.broker.bootstrap(),
    ];
    for run in 0..2 {
        let (code, _, stderr) = run_command(&backfill);
        assert_eq!(code, Some(0), "backfill run {run}: {stderr}");
    }
    let all: Vec<String> = relayed.iter().chain(&missed).cloned().collect();
    let records = world
        .broker
        .consume_ids(&["Evt"], &all, Duration::from_secs(60));
    let mut counts: HashMap<String, usize> = HashMap::new();
    for r in &records {
        *counts.entry(r.id()).or_default() += 1;
    }
    let wrong: Vec<(&String, usize)> = all
        .iter()
        .map(|id| (id, counts.get(id).copied().unwrap_or(0)))
        .filter(|(_, n)| *n != 1)
        .collect();
    assert!(wrong.is_empty(), "ids not exactly once: {wrong:?}");
    assert_eq!(records.len(), N + M);
}

/// Positions name an event whatever the relay is configured to relay: a restart that also
/// relays logical messages must not renumber the events of a transaction it delivered in part
/// (issue 21 §3: with per-transaction numbering, the refused event took the delivered one's
/// position and was skipped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_that_relays_more_kinds_of_events_skips_none() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let world = World::start().await;
    world.broker.ensure_topic("Evt");
    let (url, bootstrap) = (world.pg.url(), world.broker.bootstrap());
    let mut args = EO.to_vec();
    args.extend(ONE_PER_REQUEST);
    let mut relay = Relay::spawn_streaming(&url, &bootstrap, &args);
    let mut ids = world.insert_tx(&[("Evt", "agg", "{}")]).await;
    world.wait_caught_up(SLOT, Duration::from_secs(30)).await;

    // A message this run does not relay, then two rows: the first refused, the second accepted.
    world.broker.round_trip_time(Duration::from_millis(500));
    world.broker.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_INVALID_RECORD],
    );
    let message = r#"{"id": "m-1", "aggregate_type": "order", "aggregate_id": "agg", "event_type": "Evt", "payload": {}}"#;
    let rows = world
        .pg
        .execute(&format!(
            "BEGIN; SELECT pg_logical_emit_message(true, 'evt', '{message}'); \
             INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('order', 'agg', 'Evt', '{{\"n\": 1}}') RETURNING id::text; \
             INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('order', 'agg', 'Evt', '{{\"n\": 2}}') RETURNING id::text; COMMIT;"
        ))
        .await;
    let refused: Vec<String> = rows
        .into_iter()
        .skip(1)
        .filter_map(|r| r[0].clone())
        .collect();
    let end = world.current_lsn().await;
    let before = the_second_landed(&world, &mut relay, &refused);
    assert!(
        before.iter().all(|r| r.id() != refused[0]),
        "{}",
        relay.log()
    );
    ids.extend(refused);
    ids.push("m-1".to_owned());

    // The same slot, now also relaying the messages of prefix `evt`.
    args.extend(["--message-prefix", "evt"]);
    let relay = Relay::spawn(&url, &bootstrap, &args);
    world
        .wait_confirmed(SLOT, end, Duration::from_secs(30))
        .await;
    each_once(&world, &ids, &relay);
}

/// A multi-insert (`COPY`) logs its rows in one WAL record: pgoutput sends them all at that
/// record's position, so their positions differ by their index there. A COPY whose first row
/// the broker refused and whose others it took is completed after restart, each row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rows_of_one_copy_share_a_wal_position_and_each_keeps_its_own() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let world = World::start().await;
    world.broker.ensure_topic("Evt");
    let (url, bootstrap) = (world.pg.url(), world.broker.bootstrap());
    let mut args = EO.to_vec();
    args.extend(ONE_PER_REQUEST);
    let mut relay = Relay::spawn_streaming(&url, &bootstrap, &args);
    let mut ids = world.insert_tx(&[("Evt", "agg", "{}")]).await;
    world.wait_caught_up(SLOT, Duration::from_secs(30)).await;

    world.broker.round_trip_time(Duration::from_millis(500));
    world.broker.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_INVALID_RECORD],
    );
    // Ids given, so no volatile default stops COPY from batching the rows.
    let copied: Vec<String> = (1..=3)
        .map(|i| format!("00000000-0000-0000-0000-00000000000{i}"))
        .collect();
    let lines: Vec<String> = copied
        .iter()
        .map(|id| format!("{id} order agg Evt {{}}"))
        .collect();
    world
        .pg
        .execute(&format!(
            "COPY outbox (id, aggregate_type, aggregate_id, event_type, payload) FROM PROGRAM \
             'printf ''%s\\t%s\\t%s\\t%s\\t%s\\n'' {}'",
            lines.join(" ")
        ))
        .await;
    let end = world.current_lsn().await;
    let before = the_second_landed(&world, &mut relay, &copied);
    assert!(
        before.iter().all(|r| r.id() != copied[0]),
        "{}",
        relay.log()
    );
    let changes: Vec<String> = copied[1..]
        .iter()
        .map(|id| before.iter().find(|r| &r.id() == id).unwrap())
        .map(|r| r.header("outbox.change").unwrap())
        .collect();
    let at = changes[0].split_once(':').unwrap().0;
    assert_eq!(changes, [format!("{at}:1"), format!("{at}:2")]);
    ids.extend(copied);

    let relay = Relay::spawn(&url, &bootstrap, &args);
    world
        .wait_confirmed(SLOT, end, Duration::from_secs(30))
        .await;
    each_once(&world, &ids, &relay);
}

/// Per partition of `topic`, the records the relay read back from its end so far.
pub fn tail_records_read(relay: &Relay, topic: &str, partitions: i32) -> Vec<f64> {
    let samples = relay.metric_samples("outbox_relay_exactly_once_tail_records_read_total");
    (0..partitions)
        .map(|p| {
            let labels = |l: &str| {
                l.contains(&format!("topic=\"{topic}\""))
                    && l.contains(&format!("partition=\"{p}\""))
            };
            samples
                .iter()
                .filter(|(l, _)| labels(l))
                .map(|(_, v)| v)
                .sum()
        })
        .collect()
}

/// Issue 21 §5: the first start in exactly-once mode over a topic other producers filled (as
/// many records as the broker keeps) reads a bounded tail of each partition, not all of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_start_over_a_populated_topic_reads_a_bounded_tail() {
    use rdkafka::config::ClientConfig;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let world = World::start().await;
    world.broker.create_topic("Evt", 2);
    let bootstrap = world.broker.bootstrap();
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("linger.ms", "20")
        .create()
        .unwrap();
    // About 5 MB per partition, the mock broker's retention: 20,000 records of 250 bytes.
    let blob = "x".repeat(250);
    for i in 0..40_000 {
        let mut record = BaseRecord::<str, str>::to("Evt")
            .partition(i % 2)
            .key("other")
            .payload(&blob);
        while let Err((e, back)) = producer.send(record) {
            assert!(e.to_string().contains("Queue full"), "{e}");
            producer.poll(Duration::from_millis(50));
            record = back;
        }
    }
    producer.flush(Duration::from_secs(60)).unwrap();

    let relay = Relay::spawn_streaming(&world.pg.url(), &bootstrap, &EO);
    let keys: Vec<String> = (0..2)
        .map(|p| {
            (0..100)
                .map(|i| format!("agg-{i}"))
                .find(|k| partition_for(k.as_bytes(), 2) == p)
                .unwrap()
        })
        .collect();
    let rows: Vec<(&str, &str, &str)> = keys.iter().map(|k| ("Evt", k.as_str(), "{}")).collect();
    let ids = world.insert_tx(&rows).await;
    world.wait_caught_up(SLOT, Duration::from_secs(60)).await;
    each_once(&world, &ids, &relay);
    let read = tail_records_read(&relay, "Evt", 2);
    eprintln!("records read back per partition at the first start: {read:?}");
    for (p, n) in read.iter().enumerate() {
        assert!(
            *n > 0.0 && *n <= 5_376.0,
            "partition {p}: {n} records read\n{}",
            relay.log()
        );
    }
}

/// Issue 32: 20 times, a standby takes over an exactly-once relay (killed) during a 2 s broker
/// blip, replaying every event since the slot's creation (the slot confirms nothing: the status
/// interval is longer than the test). Each takeover reads the partitions' tails while the
/// broker is away and must wait the blip out, find every replayed event there and send none
/// again; no read may leave the reader unusable (librdkafka aborted on assigning partitions a
/// failed read had left assigned). Before, a read during the blip failed: exit 4, or with
/// `--exactly-once-fallback at-least-once` every unconfirmed record sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exactly_once_standby_takes_over_after_a_broker_blip_twenty_times() {
    let world = World::start().await;
    world.broker.ensure_topic("Evt");
    let url = world.pg.url();
    let bootstrap = world.broker.bootstrap();
    let mut args = EO.to_vec();
    args.extend(["--exactly-once-fallback", "at-least-once"]);
    args.extend(["--status-interval", "1h"]);
    let mut active = Relay::spawn_streaming(&url, &bootstrap, &args);
    let mut ids = Vec::new();
    for round in 0..20 {
        let mut standby = Relay::spawn(&url, &bootstrap, &args);
        standby.wait_standing_by();
        let rows: Vec<(String, String, String)> = (0..10)
            .map(|k| {
                (
                    "Evt".into(),
                    format!("agg-{k}"),
                    format!(r#"{{"round": {round}}}"#),
                )
            })
            .collect();
        ids.extend(world.insert_tx(&rows).await);
        let end = world.current_lsn().await;
        let acked = active.wait_for(Duration::from_secs(30), |r| {
            r.metric("outbox_relay_ack_frontier_lsn")
                .is_some_and(|lsn| lsn >= end.0 as f64)
        });
        assert!(acked, "round {round}\n{}", active.log());
        world.broker.down();
        active.kill();
        // The standby takes the slot while the broker is away.
        standby.wait_streaming();
        std::thread::sleep(Duration::from_secs(2));
        world.broker.up();
        let caught_up = standby.wait_for(Duration::from_secs(60), |r| {
            r.metric("outbox_relay_ack_frontier_lsn")
                .is_some_and(|lsn| lsn >= end.0 as f64)
        });
        assert!(caught_up, "round {round}\n{}", standby.log());
        active = standby;
    }
    assert!(active.wait_exit(Duration::from_millis(10)).is_none());
    each_once(&world, &ids, &active);
}
