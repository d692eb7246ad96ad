//! The lost-slot guard: the slot's lineage is recorded in a Kafka topic, so a slot
//! missing where the relay streamed before stops it (exit 7) in every deployment:
//! the least-privilege role of `sql/03`, a slot on a hot standby, a plain restart
//! after exit 7. The relay never streams from a slot whose creation is not recorded.

use std::time::Duration;

use crate::support::kafka::{Broker, consume_until};
use crate::support::postgres::{PgCluster, PgOptions};
use crate::support::relay::{Relay, run_command};
use crate::support::world::{SCHEMA, World, wait_until};

const SLOT: &str = "outbox_relay";
const LINEAGE_TOPIC: &str = "outbox-relay.lineage";
const SLOT_LOST_EXIT: Option<i32> = Some(7);
const KAFKA_EXIT: Option<i32> = Some(4);

/// Starts the relay and waits until it streams or exits: its exit code (`None`
/// while it streams) and log.
fn start(url: &str, brokers: &str, args: &[&str]) -> (Relay, Option<i32>) {
    let mut relay = Relay::spawn(url, brokers, args);
    let streaming = relay.wait_streaming_for(Duration::from_secs(60));
    let code = match streaming {
        true => None,
        false => relay
            .wait_exit(Duration::from_secs(30))
            .and_then(|s| s.code()),
    };
    (relay, code)
}

/// The relay must refuse with exit 7, naming the remedy.
fn assert_refused(url: &str, brokers: &str) {
    let (relay, code) = start(url, brokers, &[]);
    let log = relay.log();
    assert_eq!(code, SLOT_LOST_EXIT, "{log}");
    for needle in [
        "--allow-new-slot",
        "outbox-relay backfill --since",
        LINEAGE_TOPIC,
    ] {
        assert!(log.contains(needle), "{needle:?} missing from:\n{log}");
    }
}

async fn slot_exists(pg: &PgCluster) -> bool {
    let sql = format!("SELECT 1 FROM pg_replication_slots WHERE slot_name = '{SLOT}'");
    !pg.execute(&sql).await.is_empty()
}

/// Commits `n` outbox rows, one transaction each; returns their ids.
async fn insert(pg: &PgCluster, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let sql = format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('order', 'o{i}', 'Evt', '{{}}') RETURNING id::text"
        );
        ids.extend(
            pg.execute(&sql)
                .await
                .into_iter()
                .filter_map(|r| r[0].clone()),
        );
    }
    ids
}

/// The lineage topic's records, as JSON values (`null` for a tombstone), with their keys.
fn lineage(broker: &Broker) -> Vec<(String, serde_json::Value)> {
    broker.ensure_topic(LINEAGE_TOPIC);
    let records = consume_until(
        &broker.bootstrap(),
        &[LINEAGE_TOPIC],
        Duration::from_secs(10),
        Duration::from_secs(1),
        |_| true,
    );
    records
        .iter()
        .map(|r| {
            // A record the relay did not write stays text.
            let value = r.payload_text().map_or(serde_json::Value::Null, |v| {
                serde_json::from_str(&v).unwrap_or(serde_json::Value::String(v))
            });
            (r.key_text().unwrap_or_default(), value)
        })
        .collect()
}

/// Relays 10 events with `url`, stops, commits 10 more, and drops the slot as a
/// promotion without it would lose it.
async fn relay_then_lose_the_slot(
    url: &str,
    writer: &PgCluster,
    slot_home: &PgCluster,
    broker: &Broker,
) {
    let mut relay = Relay::spawn_streaming(url, &broker.bootstrap(), &[]);
    let ids = insert(writer, 10).await;
    let got = broker.consume_ids(&["Evt"], &ids, Duration::from_secs(60));
    assert_eq!(got.len(), 10, "{}", relay.log());
    relay.stop();
    insert(writer, 10).await;
    let drop = format!("SELECT pg_drop_replication_slot('{SLOT}')");
    slot_home.execute(&drop).await;
}

#[tokio::test(flavor = "current_thread")]
async fn the_least_privilege_role_refuses_a_lost_slot_across_restarts_until_allowed() {
    a_lost_slot_is_refused_across_restarts_until_allowed(&World::start_on(15).await).await;
}

/// The least-privilege role: a lost slot is refused (exit 7) at every start until
/// `--allow-new-slot` (`broker_process` runs it against a broker in its own process too).
pub(crate) async fn a_lost_slot_is_refused_across_restarts_until_allowed(world: &World) {
    let (pg, broker) = (&world.pg, &world.broker);
    // The documented deployment: the role and the publication from sql/.
    pg.execute(include_str!("../sql/03_relay_role.sql")).await;
    pg.execute(include_str!("../sql/02_publication.sql")).await;
    let url = pg.url_for("outbox_relay", "relay-password", "postgres");
    let brokers = broker.bootstrap();

    relay_then_lose_the_slot(&url, pg, pg, broker).await;
    assert_refused(&url, &brokers);
    assert!(!slot_exists(pg).await, "no slot may be created");
    // A supervisor's plain restart after exit 7 (restartPolicy: Always) refuses again.
    assert_refused(&url, &brokers);
    assert!(!slot_exists(pg).await, "no slot may be created");
    let first = lineage(broker);
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0].1["state"], "created", "{first:?}");
    assert_eq!(first[0].1["slot"], SLOT, "{first:?}");

    let (relay, code) = start(&url, &brokers, &["--allow-new-slot"]);
    assert_eq!(code, None, "{}", relay.log());
    let ids = insert(pg, 1).await;
    let got = broker.consume_ids(&["Evt"], &ids, Duration::from_secs(60));
    assert!(got.iter().any(|r| r.id() == ids[0]), "{}", relay.log());
    let records = lineage(broker);
    let (key, last) = records.last().expect("a lineage record");
    assert_eq!(key, &first[0].0, "the same cluster and slot");
    assert_eq!(last["state"], "created");
    assert_ne!(
        last["created_lsn"], first[0].1["created_lsn"],
        "{records:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_lost_on_a_hot_standby_stops_the_relay() {
    let mut primary = PgCluster::start_with(PgOptions {
        major: Some(16),
        ..PgOptions::default()
    });
    primary.execute(SCHEMA).await;
    primary
        .execute(
            "CREATE PUBLICATION outbox_relay FOR TABLE outbox \
             WITH (publish = 'insert', publish_via_partition_root = true)",
        )
        .await;
    let standby = primary
        .start_standby("standby1", &[("hot_standby_feedback", "on")])
        .await;
    let broker = Broker::start();
    // A standby creates a logical slot only after replaying a running-xacts record.
    let snapshots = tokio::spawn({
        let client = primary.client().await;
        async move {
            for _ in 0..3_000 {
                let _ = client
                    .simple_query("SELECT pg_log_standby_snapshot()")
                    .await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });
    let url = standby.url();
    relay_then_lose_the_slot(&url, &primary, &standby, &broker).await;
    assert_refused(&url, &broker.bootstrap());
    assert!(!slot_exists(&standby).await, "no slot may be created");
    snapshots.abort();
}

#[tokio::test(flavor = "current_thread")]
async fn a_slot_whose_creation_cannot_be_recorded_is_not_streamed_from() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let world = World::start().await;
    let (url, brokers) = (world.pg.url(), world.broker.bootstrap());

    // The topic cannot be read: nothing is created.
    world.broker.topic_error(
        LINEAGE_TOPIC,
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
    );
    let (relay, code) = start(&url, &brokers, &[]);
    let log = relay.log();
    assert_eq!(code, KAFKA_EXIT, "{log}");
    for needle in [LINEAGE_TOPIC, "kafka-acls", "--allow-new-slot"] {
        assert!(log.contains(needle), "{needle:?} missing from:\n{log}");
    }
    // Denied, not missing: the remedy is the ACL, not creating the topic (issue 32).
    assert!(!log.contains("kafka-topics"), "{log}");
    assert!(!slot_exists(&world.pg).await);

    // It can be read but not written: the slot is created and kept, nothing streams.
    world
        .broker
        .topic_error(LINEAGE_TOPIC, RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR);
    // One refusal: the relay's first produce is the lineage record.
    let refused = [RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED];
    world
        .broker
        .request_errors(RDKafkaApiKey::Produce, &refused);
    let (relay, code) = start(&url, &brokers, &[]);
    let log = relay.log();
    assert_eq!(code, KAFKA_EXIT, "{log}");
    assert!(log.contains(LINEAGE_TOPIC) && log.contains("kept"), "{log}");
    assert!(
        slot_exists(&world.pg).await,
        "the slot is kept for the next start"
    );
    assert!(lineage(&world.broker).is_empty());
    let before = world.current_lsn().await;
    let ids = insert(&world.pg, 3).await;

    // Once the topic takes it, the kept slot is recorded and relays from its creation.
    let (relay, code) = start(&url, &brokers, &[]);
    assert_eq!(code, None, "{}", relay.log());
    let got = world
        .broker
        .consume_ids(&["Evt"], &ids, Duration::from_secs(60));
    assert_eq!(got.len(), 3, "{}", relay.log());
    let records = lineage(&world.broker);
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].1["state"], "created");
    let created: outbox_relay::lsn::Lsn = records[0].1["created_lsn"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        created <= before,
        "{created} recorded, the slot predates {before}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn drop_slot_then_start_creates_a_fresh_slot() {
    let world = World::start().await;
    let (url, brokers) = (world.pg.url(), world.broker.bootstrap());
    let mut relay = world.relay(&[]);
    relay.stop();

    let args = [
        "drop-slot",
        "--yes-i-know",
        "--postgres-url",
        &url,
        "--kafka-brokers",
        &brokers,
    ];
    let (code, out, err) = run_command(&args);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(!slot_exists(&world.pg).await);

    // The runbook: drop-slot, then start.
    let (relay, code) = start(&url, &brokers, &[]);
    assert_eq!(code, None, "{}", relay.log());
    let ids = insert(&world.pg, 1).await;
    let got = world
        .broker
        .consume_ids(&["Evt"], &ids, Duration::from_secs(60));
    assert_eq!(got.len(), 1, "{}", relay.log());
    assert!(
        wait_until(Duration::from_secs(10), || async {
            lineage(&world.broker)
                .last()
                .is_some_and(|r| r.1["state"] == "created")
        })
        .await
    );
    let states: Vec<_> = lineage(&world.broker)
        .into_iter()
        .map(|r| r.1["state"].clone())
        .collect();
    assert_eq!(states, ["created", "dropped", "created"], "{states:?}");

    let mut relay = relay;
    relay.stop();
    // drop-slot records the drop in the lineage topic, so it needs the brokers.
    let (code, _, err) = run_command(&["drop-slot", "--yes-i-know", "--postgres-url", &url]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--kafka-brokers"), "{err}");
    assert!(slot_exists(&world.pg).await);
}

/// Deployments upgraded from a relay that recorded slots in `public.outbox_relay_slots`
/// keep their guard until the lineage topic has a record.
#[tokio::test(flavor = "current_thread")]
async fn a_slot_recorded_by_an_older_relay_in_postgres_is_still_guarded() {
    let world = World::start().await;
    let (url, brokers) = (world.pg.url(), world.broker.bootstrap());
    world
        .pg
        .execute(
            "CREATE TABLE public.outbox_relay_slots (slot_name text PRIMARY KEY, \
             system_identifier text NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), \
             created_lsn pg_lsn); \
             INSERT INTO public.outbox_relay_slots (slot_name, system_identifier) \
             SELECT 'outbox_relay', system_identifier::text FROM pg_control_system()",
        )
        .await;
    let (relay, code) = start(&url, &brokers, &[]);
    let log = relay.log();
    assert_eq!(code, SLOT_LOST_EXIT, "{log}");
    assert!(log.contains("public.outbox_relay_slots"), "{log}");
    assert!(!slot_exists(&world.pg).await);
}

/// A lineage topic with time-based retention (the broker's default when it auto-creates the
/// topic) would drop the record and with it the guard: a relay streaming from the slot writes
/// it again at every start, keeping when and where the slot was created.
#[tokio::test(flavor = "current_thread")]
async fn a_restart_writes_the_slots_record_again() {
    let world = World::start().await;
    let mut relay = world.relay(&[]);
    relay.stop();
    let mut relay = world.relay(&[]);
    relay.stop();
    let records = lineage(&world.broker);
    let created: Vec<_> = records.iter().map(|r| &r.1).collect();
    assert_eq!(created.len(), 2, "{records:?}");
    assert!(
        created.iter().all(|r| r["state"] == "created"),
        "{records:?}"
    );
    assert!(created[0].get("refreshed_at").is_none(), "{records:?}");
    assert!(created[1]["refreshed_at"].is_string(), "{records:?}");
    for field in ["created_at", "created_lsn"] {
        assert_eq!(created[0][field], created[1][field], "{records:?}");
    }
    assert_eq!(records[0].0, records[1].0, "one key: {records:?}");
}

/// This cluster's key in the lineage topic.
async fn lineage_key(pg: &PgCluster) -> String {
    let rows = pg
        .execute("SELECT system_identifier::text FROM pg_control_system()")
        .await;
    let id = rows[0][0].clone().expect("a system identifier");
    format!("{id}/{SLOT}")
}

/// Writes `value` under `key` to the lineage topic as another host would, its producer
/// timestamp `skew_ms` off this host's clock.
fn write_lineage(broker: &Broker, key: &str, value: &str, skew_ms: i64) {
    use rdkafka::config::ClientConfig;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .create()
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let at = i64::try_from(now.as_millis()).unwrap() + skew_ms;
    let record = BaseRecord::to(LINEAGE_TOPIC)
        .key(key)
        .payload(value)
        .timestamp(at);
    producer.send(record).map_err(|(e, _)| e).unwrap();
    producer.flush(Duration::from_secs(10)).unwrap();
}

const HOUR_MS: i64 = 3_600_000;

/// Issue 32: a `dropped` record from a host whose clock ran an hour ahead, then a slot created
/// and lost: the newer record (by offset) says `created`, so the relay refuses. It picked the
/// record with the latest producer timestamp before, and replaced the lost slot silently.
#[tokio::test(flavor = "current_thread")]
async fn a_drop_recorded_by_a_clock_running_ahead_does_not_hide_a_later_lost_slot() {
    let world = World::start().await;
    world.broker.create_topic(LINEAGE_TOPIC, 1);
    let key = lineage_key(&world.pg).await;
    let dropped =
        r#"{"slot":"outbox_relay","system_identifier":"x","state":"dropped","relay_version":"0"}"#;
    write_lineage(&world.broker, &key, dropped, HOUR_MS);
    let url = world.pg.url();
    relay_then_lose_the_slot(&url, &world.pg, &world.pg, &world.broker).await;
    assert_refused(&url, &world.broker.bootstrap());
    assert!(!slot_exists(&world.pg).await, "no slot may be created");
}

/// Issue 32: a `created` record from a host whose clock ran an hour ahead, then a deliberate
/// `drop-slot`: the drop is newer (by offset), so the next start creates a fresh slot. It
/// exited 7 before, trusting the timestamp.
#[tokio::test(flavor = "current_thread")]
async fn a_drop_slot_after_a_record_from_a_clock_running_ahead_starts_fresh() {
    let world = World::start().await;
    world.broker.create_topic(LINEAGE_TOPIC, 1);
    let url = world.pg.url();
    let brokers = world.broker.bootstrap();
    let mut relay = world.relay(&[]);
    relay.stop();
    let key = lineage_key(&world.pg).await;
    let (_, created) = lineage(&world.broker).pop().expect("the created record");
    write_lineage(&world.broker, &key, &created.to_string(), HOUR_MS);
    let args = [
        "drop-slot",
        "--yes-i-know",
        "--postgres-url",
        &url,
        "--kafka-brokers",
        &brokers,
    ];
    let (code, out, err) = run_command(&args);
    assert_eq!(code, Some(0), "{out}{err}");
    let (relay, code) = start(&url, &brokers, &[]);
    assert_eq!(code, None, "{}", relay.log());
}

/// Issue 32: a record the relay cannot parse, with the slot missing, is refused with the way
/// to clear it (`drop-slot`), which works; with the slot there, the relay writes its record
/// over it. Before, every start exited 4 with the create-the-topic remedy.
#[tokio::test(flavor = "current_thread")]
async fn an_unreadable_lineage_record_says_how_to_clear_it() {
    let world = World::start().await;
    world.broker.create_topic(LINEAGE_TOPIC, 1);
    let url = world.pg.url();
    let brokers = world.broker.bootstrap();
    let key = lineage_key(&world.pg).await;
    write_lineage(&world.broker, &key, "not json", 0);
    let (relay, code) = start(&url, &brokers, &[]);
    let log = relay.log();
    assert_eq!(code, KAFKA_EXIT, "{log}");
    for needle in ["not json", "drop-slot --yes-i-know", "offset 0"] {
        assert!(log.contains(needle), "{needle:?} missing from:\n{log}");
    }
    assert!(!log.contains("kafka-topics"), "{log}");
    assert!(!slot_exists(&world.pg).await);

    let args = [
        "drop-slot",
        "--yes-i-know",
        "--postgres-url",
        &url,
        "--kafka-brokers",
        &brokers,
    ];
    let (code, out, err) = run_command(&args);
    assert_eq!(code, Some(0), "{out}{err}");
    let (mut relay, code) = start(&url, &brokers, &[]);
    assert_eq!(code, None, "{}", relay.log());
    relay.stop();

    // With the slot there, an unreadable record is written over.
    write_lineage(&world.broker, &key, "{\"state\": 7}", 0);
    let (relay, code) = start(&url, &brokers, &[]);
    assert_eq!(code, None, "{}", relay.log());
    let last = lineage(&world.broker).pop().expect("a record");
    assert_eq!(last.1["state"], "created", "{last:?}");
}

/// Issue 32: the lineage and tail readers assign partitions without a consumer group, so a
/// principal denied every group (`GROUP_AUTHORIZATION_FAILED` from the coordinator look-up)
/// starts, relays, and reads its partitions' tails after a restart. Before, the read failed
/// (exit 4) and the message printed the topic-only ACL the operator had already granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_need_no_consumer_group() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let world = World::start().await;
    world.broker.ensure_topic("Evt");
    let denied = [RDKafkaRespErr::RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED; 10_000];
    world
        .broker
        .request_errors(RDKafkaApiKey::FindCoordinator, &denied);
    let url = world.pg.url();
    let brokers = world.broker.bootstrap();
    let exactly_once = ["--delivery", "exactly-once"];
    let (mut relay, code) = start(&url, &brokers, &exactly_once);
    assert_eq!(code, None, "{}", relay.log());
    let mut ids = insert(&world.pg, 10).await;
    world.wait_caught_up(SLOT, Duration::from_secs(60)).await;
    relay.kill();
    // Replayed from the slot's position: read back from the partitions' tails.
    let replay = "UPDATE pg_catalog.pg_class SET relname = relname WHERE false";
    world.pg.execute(replay).await;
    let (relay, code) = start(&url, &brokers, &exactly_once);
    assert_eq!(code, None, "{}", relay.log());
    ids.extend(insert(&world.pg, 10).await);
    let got = world
        .broker
        .consume_ids(&["Evt"], &ids, Duration::from_secs(60));
    assert_eq!(got.len(), 20, "{}", relay.log());
    assert!(relay.streaming(), "{}", relay.log());
}
