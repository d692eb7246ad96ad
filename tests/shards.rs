//! Sharding (`--shard I/K`): K relays, each with its own slot and a publication whose row
//! filter sends it the rows whose key hashes to it, relay every event once between them, each
//! key's events in commit order in one partition; a killed shard holds no other back; the
//! filters agree with the relay's hash on every supported version; two shards decode on a hot
//! standby; and `reshard` moves the outbox from 2 shards to 4 while it is written.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use outbox_relay::lsn::Lsn;
use outbox_relay::outbox::Shard;
use outbox_relay::pgoutput::{self, Message, Value};

use crate::support::kafka::{Broker, Consumed, consume_until};
use crate::support::postgres::{PgCluster, PgOptions};
use crate::support::relay::{Relay, run_command, run_to_exit};
use crate::support::world::{SCHEMA, World, wait_until};

const TOPIC: &str = "Evt";
const PARTITIONS: i32 = 8;
const EVENTS: u64 = 100_000;
const CONFIG_EXIT: Option<i32> = Some(outbox_relay::pipeline::exit_code::CONFIG as i32);
const POSTGRES_EXIT: Option<i32> = Some(outbox_relay::pipeline::exit_code::POSTGRES as i32);
const KAFKA_EXIT: Option<i32> = Some(outbox_relay::pipeline::exit_code::KAFKA as i32);

/// The key of row `g`: one of 10,000, some non-ASCII, some empty, some NULL (then the id
/// places the row).
const KEY_SQL: &str = "CASE WHEN g % 1000 = 7 THEN NULL WHEN g % 1000 = 8 THEN '' \
     WHEN g % 10 = 9 THEN 'ключ-' || (g % 10000) ELSE 'k-' || (g % 10000) END";

fn slot(shard: Shard) -> String {
    shard.name("outbox_relay")
}

fn shards(count: u32) -> Vec<Shard> {
    (0..count).map(|index| Shard { index, count }).collect()
}

fn spawn(world: &World, shard: Shard) -> Relay {
    world.relay(&["--shard", &shard.to_string()])
}

/// Commits rows `first..first + n` (`g`), 100 per transaction on one connection, so `g` is
/// the commit order; a row's payload is `{"g": g}`.
async fn load(pg: &PgCluster, first: u64, n: u64) {
    let client = pg.client().await;
    let insert = format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'order', {KEY_SQL}, '{TOPIC}', jsonb_build_object('g', g) \
         FROM generate_series($1::bigint, $2::bigint) g"
    );
    let statement = client.prepare(&insert).await.unwrap();
    for start in (first..first + n).step_by(100) {
        let last = (start + 99).min(first + n - 1);
        let (start, last) = (start as i64, last as i64);
        client.execute(&statement, &[&start, &last]).await.unwrap();
    }
}

/// An outbox row: its id, key and commit order.
struct Row {
    id: String,
    key: Option<String>,
    g: i64,
}

impl Row {
    fn shard(&self, count: u32) -> u32 {
        Shard::of(
            self.key.as_deref().map(str::as_bytes),
            Some(self.id.as_bytes()),
            count,
        )
    }
}

async fn rows(pg: &PgCluster) -> Vec<Row> {
    let rows = pg
        .execute("SELECT id::text, aggregate_id, payload->>'g' FROM outbox ORDER BY (payload->>'g')::bigint")
        .await;
    rows.into_iter()
        .map(|r| Row {
            id: r[0].clone().unwrap(),
            key: r[1].clone(),
            g: r[2].as_deref().unwrap().parse().unwrap(),
        })
        .collect()
}

/// Reads the topic until every row's id arrived (then 2 s more for duplicates).
fn consume_all(broker: &Broker, rows: &[Row]) -> Vec<Consumed> {
    let wanted: HashSet<&str> = rows.iter().map(|r| r.id.as_str()).collect();
    let mut seen = HashSet::new();
    let mut read = 0;
    consume_until(
        &broker.bootstrap(),
        &[TOPIC],
        Duration::from_secs(180),
        Duration::from_secs(2),
        |records| {
            seen.extend(records[read..].iter().map(Consumed::id));
            read = records.len();
            wanted.iter().all(|id| seen.contains(*id))
        },
    )
}

/// Every row arrived (exactly once unless `duplicates`, and then a duplicate is the same
/// record again); each key's records are in one partition, their first occurrences in commit
/// order.
fn check(rows: &[Row], mut records: Vec<Consumed>, duplicates: bool) -> Vec<String> {
    let by_id: HashMap<&str, &Row> = rows.iter().map(|r| (r.id.as_str(), r)).collect();
    records.sort_by_key(|r| (r.partition, r.offset));
    let mut first: HashMap<String, &Consumed> = HashMap::new();
    let mut partition_of: HashMap<String, i32> = HashMap::new();
    let mut last_g: HashMap<String, i64> = HashMap::new();
    let mut repeated = Vec::new();
    for record in &records {
        let id = record.id();
        let row = by_id
            .get(id.as_str())
            .unwrap_or_else(|| panic!("unknown id {id}"));
        // A NULL key and an empty one both arrive as no key bytes.
        let key = record.key_text().unwrap_or_default();
        assert_eq!(key, row.key.clone().unwrap_or_default(), "id {id}");
        if let Some(earlier) = first.get(&id) {
            assert!(duplicates, "id {id} arrived twice");
            // A NULL key's partition is random, so its replay may go elsewhere.
            let partition = |r: &Consumed| row.key.as_ref().map(|_| r.partition);
            let same = (partition(earlier), &earlier.key, &earlier.payload);
            assert_eq!(same, (partition(record), &record.key, &record.payload));
            repeated.push(id);
            continue;
        }
        first.insert(id.clone(), record);
        let Some(key) = &row.key else { continue };
        let partition = *partition_of.entry(key.clone()).or_insert(record.partition);
        assert_eq!(partition, record.partition, "key {key:?} in two partitions");
        let before = last_g.insert(key.clone(), row.g).unwrap_or(-1);
        assert!(
            before < row.g,
            "key {key:?}: event {} after {before}",
            row.g
        );
    }
    let lost = rows.iter().filter(|r| !first.contains_key(&r.id)).count();
    assert_eq!(lost, 0, "of {} rows never arrived", rows.len());
    eprintln!(
        "{} rows, {} keys, {} duplicates",
        rows.len(),
        last_g.len(),
        repeated.len()
    );
    repeated
}

/// `backfill --shard` of every row since 2000, which must re-publish `expected` events.
fn backfill(world: &World, shard: Shard, expected: u64) {
    let (url, brokers, shard) = (world.pg.url(), world.broker.bootstrap(), shard.to_string());
    let (code, out, err) = run_command(&[
        "backfill",
        "--since",
        "2000-01-01",
        "--postgres-url",
        &url,
        "--kafka-brokers",
        &brokers,
        "--shard",
        &shard,
    ]);
    assert_eq!(code, Some(0), "{err}");
    let events = format!("backfill: {expected} events");
    assert!(out.contains(&events), "{shard}: {out}");
}

/// A relay's `outbox_relay_events_relayed_total`.
fn relayed(relay: &Relay) -> u64 {
    relay
        .metric("outbox_relay_events_relayed_total")
        .unwrap_or(0.0) as u64
}

/// How many rows each shard owns.
fn owned(rows: &[Row], count: u32) -> Vec<u64> {
    let mut owned = vec![0; count as usize];
    rows.iter()
        .for_each(|r| owned[r.shard(count) as usize] += 1);
    owned
}

async fn sharded_world() -> World {
    let world = World::start().await;
    world.broker.create_topic(TOPIC, PARTITIONS);
    world
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_shards_relay_every_event_once_with_each_key_in_order() {
    two_shards_relay_every_event_once(&World::start().await, EVENTS).await;
}

/// Two shards relay `events` rows once between them, each key in order (`broker_process`
/// runs it against a broker in its own process too).
pub(crate) async fn two_shards_relay_every_event_once(world: &World, events: u64) {
    world.broker.create_topic(TOPIC, PARTITIONS);
    let relays: Vec<Relay> = shards(2).into_iter().map(|s| spawn(world, s)).collect();
    load(&world.pg, 0, events).await;
    for shard in shards(2) {
        world
            .wait_caught_up(&slot(shard), Duration::from_secs(120))
            .await;
    }
    let rows = rows(&world.pg).await;
    check(&rows, consume_all(&world.broker, &rows), false);
    // Each relay acknowledged exactly the rows its filter owns, by the relay's hash.
    let counts: Vec<u64> = relays.iter().map(relayed).collect();
    assert_eq!(counts, owned(&rows, 2));
}

/// A shard whose slot is created after another's (its pod pending, say) misses the rows it owns
/// that committed in between: no slot held them. Its relay says so, naming the other shard's
/// slot and the remedy, and `backfill --shard` re-publishes them: every event arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_started_late_warns_and_backfill_relays_its_missed_rows() {
    let world = sharded_world().await;
    let [first, late] = shards(2)[..] else {
        unreachable!()
    };
    let _first = spawn(&world, first);
    load(&world.pg, 0, 2000).await;
    world
        .wait_caught_up(&slot(first), Duration::from_secs(60))
        .await;
    let late_relay = spawn(&world, late);
    load(&world.pg, 2000, 2000).await;
    for shard in [first, late] {
        world
            .wait_caught_up(&slot(shard), Duration::from_secs(60))
            .await;
    }
    let rows = rows(&world.pg).await;
    // The late shard relayed only what committed after its slot's creation.
    let later = rows
        .iter()
        .filter(|r| r.g >= 2000 && r.shard(2) == 1)
        .count();
    assert_eq!(relayed(&late_relay), later as u64);
    let log = late_relay.log();
    assert!(
        log.contains("shard 1/2's slot was created at")
            && log.contains("outbox_relay_shard_0_of_2")
            && log.contains("outbox-relay backfill --shard 1/2"),
        "{log}"
    );
    backfill(&world, late, owned(&rows, 2)[1]);
    let records = consume_all(&world.broker, &rows);
    let got: HashSet<String> = records.iter().map(Consumed::id).collect();
    let lost = rows.iter().filter(|r| !got.contains(&r.id)).count();
    assert_eq!(lost, 0, "of {} rows never arrived", rows.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_shard_loses_nothing_and_holds_no_other_back() {
    let world = sharded_world().await;
    let mut relays: Vec<Relay> = shards(4).into_iter().map(|s| spawn(&world, s)).collect();
    let killed = Shard { index: 1, count: 4 };
    load(&world.pg, 0, EVENTS / 2).await;
    relays[1].kill();
    // Its walsender's last position update is in once the slot is free.
    let inactive = format!(
        "SELECT 1 FROM pg_replication_slots WHERE slot_name = '{}' AND NOT active",
        slot(killed)
    );
    let freed = wait_until(Duration::from_secs(60), || async {
        !world.pg.execute(&inactive).await.is_empty()
    });
    assert!(freed.await, "the killed shard's walsender did not exit");
    let down_at = world.confirmed_flush(&slot(killed)).await.unwrap();
    load(&world.pg, EVENTS / 2, EVENTS / 2).await;
    // The other shards keep streaming past everything while shard 1 is down.
    let end = world.current_lsn().await;
    for shard in shards(4).into_iter().filter(|s| *s != killed) {
        world
            .wait_confirmed(&slot(shard), end, Duration::from_secs(120))
            .await;
    }
    let held = world.confirmed_flush(&slot(killed)).await.unwrap();
    assert_eq!(held, down_at, "nothing streams shard 1's slot");
    assert!(held < end);
    relays[1] = spawn(&world, killed);
    world
        .wait_confirmed(&slot(killed), end, Duration::from_secs(120))
        .await;
    let rows = rows(&world.pg).await;
    let repeated = check(&rows, consume_all(&world.broker, &rows), true);
    // Only the killed shard sends anything twice: its unconfirmed events.
    let shard_of: HashMap<&str, u32> = rows.iter().map(|r| (r.id.as_str(), r.shard(4))).collect();
    assert!(
        repeated
            .iter()
            .all(|id| shard_of[id.as_str()] == killed.index)
    );
    let owned = owned(&rows, 4);
    for index in [0, 2, 3] {
        assert_eq!(relayed(&relays[index]), owned[index], "shard {index}");
    }
}

/// A second outbox table, partitioned, keyed by a uuid: its filter calls `uuid_out`.
const PARTITIONED: &str = "
    CREATE TABLE public.pout (
        id bigint NOT NULL, account uuid, event_type text, payload jsonb
    ) PARTITION BY HASH (id);
    CREATE TABLE pout_0 PARTITION OF pout FOR VALUES WITH (MODULUS 2, REMAINDER 0);
    CREATE TABLE pout_1 PARTITION OF pout FOR VALUES WITH (MODULUS 2, REMAINDER 1);
";

const TABLES: [&str; 4] = [
    "--table",
    "public.outbox",
    "--table",
    "public.pout:key-column=account",
];

/// The key (else id) of every row each shard's slot would send, decoded from pgoutput.
async fn decoded_keys(pg: &PgCluster, shard: Shard) -> Vec<String> {
    let client = pg.client().await;
    let rows = client
        .query(
            "SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL, \
             'proto_version', '1', 'publication_names', $2)",
            &[&slot(shard), &shard.name("outbox_relay")],
        )
        .await
        .unwrap();
    let mut relations = HashMap::new();
    let mut keys = Vec::new();
    for row in rows {
        match pgoutput::decode(&Bytes::from(row.get::<_, Vec<u8>>(0))).unwrap() {
            Message::Relation(relation) => {
                let key = if relation.name == "pout" {
                    "account"
                } else {
                    "aggregate_id"
                };
                let indexes = (relation.column_index(key), relation.column_index("id"));
                relations.insert(relation.id, indexes);
            }
            Message::Insert {
                relation_id, new, ..
            } => {
                let (key, id) = relations[&relation_id];
                let text = |i: Option<usize>| match &new.0[i.unwrap()] {
                    Value::Text(text) => Some(String::from_utf8(text.to_vec()).unwrap()),
                    _ => None,
                };
                keys.push(text(key).or_else(|| text(id)).unwrap());
            }
            _ => {}
        }
    }
    keys
}

#[tokio::test(flavor = "current_thread")]
async fn shard_filters_send_each_row_to_the_shard_the_relay_hashes_it_to_on_15_to_18() {
    // `setup` records each shard's slot in the lineage topic.
    let broker = Broker::start();
    let brokers = broker.bootstrap();
    for major in [15, 16, 17, 18] {
        let pg = PgCluster::start_with(PgOptions {
            major: Some(major),
            ..PgOptions::default()
        });
        pg.execute(SCHEMA).await;
        pg.execute(PARTITIONED).await;
        let url = pg.url();
        for shard in shards(3) {
            let shard = shard.to_string();
            let mut args = vec!["setup", "--postgres-url", &url, "--shard", &shard];
            args.extend(["--kafka-brokers", &brokers]);
            args.extend(TABLES);
            let (code, out, err) = run_command(&args);
            assert_eq!(
                code,
                Some(0),
                "PostgreSQL {major}, shard {shard}: {out}{err}"
            );
        }
        load(&pg, 0, 2000).await;
        pg.execute(
            "INSERT INTO pout SELECT g, CASE WHEN g % 7 = 0 THEN NULL ELSE gen_random_uuid() END, \
             'P', '{}' FROM generate_series(1, 1000) g",
        )
        .await;
        let mut expected: Vec<Vec<String>> = vec![Vec::new(); 3];
        let texts = pg
            .execute(
                "SELECT coalesce(aggregate_id, id::text) FROM outbox \
                 UNION ALL SELECT coalesce(account::text, id::text) FROM pout",
            )
            .await;
        for text in texts.into_iter().map(|r| r[0].clone().unwrap()) {
            expected[Shard::of(Some(text.as_bytes()), None, 3) as usize].push(text);
        }
        for shard in shards(3) {
            let mut got = decoded_keys(&pg, shard).await;
            got.sort();
            let want = &mut expected[shard.index as usize];
            want.sort();
            assert_eq!(got.len(), want.len(), "PostgreSQL {major}, shard {shard}");
            assert!(
                got == *want,
                "PostgreSQL {major}, shard {shard}: other rows"
            );
        }
    }
    let pg = PgCluster::start_with(PgOptions {
        major: Some(14),
        ..PgOptions::default()
    });
    pg.execute(SCHEMA).await;
    let url = pg.url();
    let args = [
        "setup",
        "--postgres-url",
        &url,
        "--kafka-brokers",
        &brokers,
        "--shard",
        "0/2",
    ];
    let (code, _, err) = run_command(&args);
    assert_eq!(code, POSTGRES_EXIT, "{err}");
    assert!(
        err.contains("--shard 0/2 needs PostgreSQL 15 or later"),
        "{err}"
    );
    // A table-less outbox's shards need no row filter.
    let (code, out, err) = run_command(&[
        "setup",
        "--postgres-url",
        &url,
        "--kafka-brokers",
        &brokers,
        "--shard",
        "0/2",
        "--table",
        "none",
        "--message-prefix",
        "outbox",
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_shard_refuses_a_publication_that_would_not_shard_it() {
    let world = World::start().await;
    let (url, brokers) = (world.pg.url(), world.broker.bootstrap());
    let shard0 = ["--shard", "0/2"];
    let refused = |problem: &str| {
        let (code, log) = run_to_exit(&url, &brokers, &shard0);
        assert_eq!(code, POSTGRES_EXIT, "{log}");
        assert!(log.contains(problem), "{problem}: {log}");
        log
    };
    // An unfiltered publication under the shard's name.
    let publication = "outbox_relay_shard_0_of_2";
    world
        .pg
        .execute(&format!(
            "CREATE PUBLICATION {publication} FOR TABLE outbox"
        ))
        .await;
    let log = refused("outbox table public.outbox has no row filter");
    let status = || {
        let args = ["status", "--json", "--postgres-url", &url, "--shard", "0/2"];
        let (code, out, err) = run_command(&args);
        assert_eq!(code, Some(0), "{err}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap()
    };
    let found = status();
    assert_eq!(found["shard"], "0/2");
    assert_eq!(found["publication"]["name"], "outbox_relay_shard_0_of_2");
    assert!(
        found["warnings"].to_string().contains("has no row filter"),
        "{found}"
    );
    // The remedy it prints works.
    let remedy = log
        .split("Run ")
        .nth(1)
        .and_then(|r| r.split(" (or drop").next());
    let remedy = remedy.unwrap_or_else(|| panic!("no remedy in {log}"));
    assert!(remedy.starts_with("ALTER PUBLICATION \"outbox_relay_shard_0_of_2\" SET TABLE"));
    world.pg.execute(remedy).await;
    world.relay(&shard0).stop();
    let found = status();
    assert!(
        !found["warnings"].to_string().contains("row filter"),
        "{found}"
    );
    let filter = found["publication"]["row_filters"]["public.outbox"].to_string();
    assert!(filter.contains("hashtextextended"), "{found}");
    // Shard 1's filter on shard 0's publication.
    world
        .pg
        .execute(&format!("DROP PUBLICATION {publication}"))
        .await;
    let (code, out, err) =
        run_command(&["setup", "--print", "--postgres-url", &url, "--shard", "1/2"]);
    assert_eq!(code, Some(0), "{err}");
    let create = out
        .lines()
        .find(|l| l.starts_with("CREATE PUBLICATION"))
        .unwrap();
    assert!(create.contains("% 2 = 1)"), "{create}");
    world
        .pg
        .execute(&create.replace("_shard_1_of_2", "_shard_0_of_2"))
        .await;
    refused("not shard 0/2's");
    world
        .pg
        .execute(&format!("DROP PUBLICATION {publication}"))
        .await;
    for (publishes, problem) in [
        (
            "FOR ALL TABLES",
            "is FOR ALL TABLES, which cannot carry a row filter",
        ),
        (
            "FOR TABLES IN SCHEMA public",
            "is also published through a schema",
        ),
    ] {
        let create = format!("CREATE PUBLICATION {publication} {publishes}");
        world.pg.execute(&create).await;
        refused(problem);
        world
            .pg
            .execute(&format!("DROP PUBLICATION {publication}"))
            .await;
    }
    // A key column no row filter can use, each refused by name: one whose text depends on the
    // session; one with a user-defined collation or type, which Postgres refuses in a row
    // filter without naming the column (before, that refusal was all the relay printed).
    let unusable = [
        (
            "SELECT 1",
            "created_at",
            "has type timestamp with time zone, whose output function timestamptz_out is not \
             immutable",
        ),
        (
            "CREATE COLLATION nocase (provider = icu, locale = 'und-u-ks-level2', \
             deterministic = false); \
             ALTER TABLE outbox ALTER COLUMN event_type TYPE text COLLATE nocase",
            "event_type",
            "\"event_type\" of public.outbox has the user-defined collation nocase",
        ),
        (
            "CREATE DOMAIN aggregate_kind AS text; \
             ALTER TABLE outbox ALTER COLUMN aggregate_type TYPE aggregate_kind",
            "aggregate_type",
            "\"aggregate_type\" of public.outbox has the user-defined type aggregate_kind",
        ),
    ];
    for (sql, column, refusal) in unusable {
        world.pg.execute(sql).await;
        let args = ["--shard", "0/2", "--key-column", column];
        let (code, log) = run_to_exit(&url, &brokers, &args);
        assert_eq!(code, POSTGRES_EXIT, "{log}");
        assert!(log.contains(refusal), "{log}");
    }
    // Without --postgres-url, setup --print cannot know the columns' types.
    let (code, _, err) = run_command(&["setup", "--print", "--shard", "0/2"]);
    assert_eq!(code, CONFIG_EXIT, "{err}");
    assert!(err.contains("give --postgres-url"), "{err}");
    // The relay creates a correct one.
    let relay = world.relay(&shard0);
    let ids = world.insert_tx(&[("Evt", "a", "{}")]).await;
    drop(relay);
    assert_eq!(ids.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_shards_decode_on_a_pg16_hot_standby() {
    let mut primary = PgCluster::start_with(PgOptions {
        major: Some(16),
        ..PgOptions::default()
    });
    primary.execute(SCHEMA).await;
    let standby = primary
        .start_standby("standby1", &[("hot_standby_feedback", "on")])
        .await;
    let broker = Broker::start();
    broker.create_topic(TOPIC, PARTITIONS);
    // The standby cannot create publications: `setup --print` gives the primary's statements.
    for shard in shards(2) {
        let args = [
            "setup",
            "--print",
            "--postgres-url",
            &primary.url(),
            "--shard",
            &shard.to_string(),
        ];
        let (code, out, err) = run_command(&args);
        assert_eq!(code, Some(0), "{err}");
        let create = out
            .lines()
            .find(|l| l.starts_with("CREATE PUBLICATION"))
            .unwrap();
        primary.execute(create).await;
    }
    let replicated = "SELECT 1 FROM pg_publication WHERE pubname LIKE 'outbox_relay_shard_%'";
    assert!(
        wait_until(Duration::from_secs(30), || async {
            standby.execute(replicated).await.len() == 2
        })
        .await
    );
    let stop = Arc::new(AtomicBool::new(false));
    crate::failover::log_standby_snapshots(primary.client().await, stop.clone());
    let relays: Vec<Relay> = shards(2)
        .into_iter()
        .map(|s| {
            Relay::spawn_streaming(
                &standby.url(),
                &broker.bootstrap(),
                &["--shard", &s.to_string()],
            )
        })
        .collect();
    stop.store(true, Ordering::SeqCst);
    let on_primary = "SELECT 1 FROM pg_replication_slots WHERE slot_type = 'logical'";
    assert!(
        primary.execute(on_primary).await.is_empty(),
        "the slots live on the standby"
    );
    load(&primary, 0, 2_000).await;
    let rows = rows(&primary).await;
    check(&rows, consume_all(&broker, &rows), false);
    let end: Lsn = primary.execute("SELECT pg_current_wal_lsn()::text").await[0][0]
        .as_deref()
        .unwrap()
        .parse()
        .unwrap();
    for shard in shards(2) {
        let sql = format!(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = '{}' \
             AND confirmed_flush_lsn >= '{end}'",
            slot(shard)
        );
        assert!(
            wait_until(Duration::from_secs(60), || async {
                !standby.execute(&sql).await.is_empty()
            })
            .await,
            "the standby's slot of shard {shard} did not pass {end}"
        );
    }
    let counts: Vec<u64> = relays.iter().map(relayed).collect();
    assert_eq!(counts, owned(&rows, 2));
}

/// Commits 20-row transactions on one connection (row `g` has key `k-(g % 500)` and payload
/// `{"g": g}`) until stopped; counts the rows.
fn spawn_writer(
    pg: &PgCluster,
    stop: Arc<AtomicBool>,
    written: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<()> {
    let url = pg.url();
    tokio::spawn(async move {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        let insert = "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                      SELECT 'order', 'k-' || (g % 500), 'Evt', jsonb_build_object('g', g) \
                      FROM generate_series($1::bigint, $2::bigint) g";
        for batch in 0..100_000i64 {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            let first = batch * 20;
            client
                .execute(insert, &[&first, &(first + 19)])
                .await
                .unwrap();
            written.fetch_add(20, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}

/// Waits until the writer wrote `more` rows after this call.
async fn wait_written(written: &AtomicU64, more: u64) {
    let target = written.load(Ordering::SeqCst) + more;
    let wrote = wait_until(Duration::from_secs(60), || async {
        written.load(Ordering::SeqCst) >= target
    });
    assert!(wrote.await, "the writer did not write {more} rows");
}

/// `outbox-relay reshard ARGS` on a blocking thread (the writer keeps running).
async fn reshard(url: &str, brokers: &str, args: &[&str]) -> String {
    let mut all = vec![
        "reshard".to_owned(),
        "--postgres-url".to_owned(),
        url.to_owned(),
        "--kafka-brokers".to_owned(),
        brokers.to_owned(),
    ];
    all.extend(args.iter().map(|a| a.to_string()));
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        run_command(&all)
    })
    .await
    .unwrap();
    assert_eq!(code, Some(0), "reshard {args:?}: {out}{err}");
    out
}

/// Waits until no relay streams from the old shards' slots (of 2): a killed relay's walsender
/// frees its slot once it sees the connection gone.
async fn wait_old_slots_freed(world: &World) {
    let active = "SELECT 1 FROM pg_replication_slots WHERE active AND slot_name LIKE '%_of_2'";
    let freed = wait_until(Duration::from_secs(60), || async {
        world.pg.execute(active).await.is_empty()
    });
    assert!(freed.await, "the old slots are still in use");
}

/// The writer [`spawn_writer`] runs: its stop flag, its count of rows written, its task.
type Writer = (Arc<AtomicBool>, Arc<AtomicU64>, tokio::task::JoinHandle<()>);

/// After `reshard --finish`: starts the `count` new relays, lets the writer write `more`
/// rows, stops it, and checks that every event arrived, each key's in commit order in one
/// partition, the new relays having relayed at least `more`.
async fn the_new_fleet_relays_the_rest(world: &World, count: u32, writer: Writer, more: u64) {
    let (stop, written, writing) = writer;
    let new: Vec<Relay> = shards(count).into_iter().map(|s| spawn(world, s)).collect();
    wait_written(&written, more).await;
    stop.store(true, Ordering::SeqCst);
    writing.await.unwrap();
    for shard in shards(count) {
        world
            .wait_caught_up(&slot(shard), Duration::from_secs(120))
            .await;
    }
    let rows = rows(&world.pg).await;
    check(&rows, consume_all(&world.broker, &rows), true);
    let after = new.iter().map(relayed).sum::<u64>();
    assert!(after >= more, "the new shards relayed only {after} events");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_from_two_to_four_while_writing_loses_and_reorders_nothing() {
    let world = sharded_world().await;
    let (url, brokers) = (world.pg.url(), world.broker.bootstrap());
    let mut old: Vec<Relay> = shards(2).into_iter().map(|s| spawn(&world, s)).collect();
    let (stop, written) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let writer = spawn_writer(&world.pg, stop.clone(), written.clone());
    wait_written(&written, 2_000).await;
    // --finish refuses before the first step, and while the old relays stream.
    let finish = [
        "reshard",
        "--postgres-url",
        &url,
        "--kafka-brokers",
        &brokers,
        "--from",
        "2",
        "--to",
        "4",
        "--finish",
    ];
    let (code, _, err) = run_command(&finish);
    assert_eq!(code, CONFIG_EXIT, "{err}");
    assert!(
        err.contains("\"outbox_relay_shard_0_of_2\" is in use"),
        "{err}"
    );
    // Old shards whose slots are not on this server (a wrong --from, or shards decoding on
    // other standbys) are refused before anything is created.
    let mut wrong = finish.to_vec();
    wrong[6] = "3";
    wrong.pop();
    let (code, _, err) = run_command(&wrong);
    assert_eq!(code, CONFIG_EXIT, "{err}");
    assert!(
        err.contains("\"outbox_relay_shard_0_of_3\" of the old shards does not exist")
            && err.contains("every old and new slot on that one server"),
        "{err}"
    );

    let out = reshard(&url, &brokers, &["--from", "2", "--to", "4"]).await;
    assert!(out.contains("ready: every old slot is past"), "{out}");
    wait_written(&written, 1_000).await;
    // One old relay stops cleanly, the other is killed with deliveries unconfirmed.
    old[0].stop();
    old[1].signal("KILL");
    wait_written(&written, 1_000).await;
    // The killed relay's walsender frees its slot once it sees the connection gone.
    wait_old_slots_freed(&world).await;
    let out = reshard(&url, &brokers, &["--from", "2", "--to", "4", "--finish"]).await;
    assert!(
        out.contains("dropped old slot \"outbox_relay_shard_1_of_2\""),
        "{out}"
    );
    let slots = world
        .pg
        .execute("SELECT slot_name::text FROM pg_replication_slots ORDER BY 1")
        .await;
    let slots: Vec<String> = slots.into_iter().map(|r| r[0].clone().unwrap()).collect();
    assert_eq!(slots, shards(4).into_iter().map(slot).collect::<Vec<_>>());
    // The old slots are recorded dropped, not lost: a later 4 → 2 may use their names.
    let lineage = consume_until(
        &brokers,
        &["outbox-relay.lineage"],
        Duration::from_secs(10),
        Duration::from_secs(1),
        |_| true,
    );
    for old_slot in shards(2).into_iter().map(slot) {
        let last = lineage
            .iter()
            .rfind(|r| {
                r.key_text()
                    .is_some_and(|k| k.ends_with(&format!("/{old_slot}")))
            })
            .and_then(|r| r.payload_text())
            .unwrap_or_default();
        assert!(last.contains(r#""state":"dropped""#), "{old_slot}: {last}");
    }

    the_new_fleet_relays_the_rest(&world, 4, (stop, written, writer), 2_000).await;
    drop(old);
}

/// Rows of `ids` per shard of 2, by the key else the id of each `(id, key)`.
fn split(items: &[(String, Option<String>)]) -> [usize; 2] {
    let mut counts = [0; 2];
    for (id, key) in items {
        let shard = Shard::of(key.as_deref().map(str::as_bytes), Some(id.as_bytes()), 2);
        counts[shard as usize] += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_split_messages_and_backfills_by_the_same_hash() {
    let world = World::start().await;
    let dead_letters = ["--on-poison", "dead-letter", "--dead-letter-topic", "dlq"];
    let relays: Vec<Relay> = shards(2)
        .into_iter()
        .map(|s| {
            let shard = s.to_string();
            let mut args = vec!["--table", "none", "--message-prefix", "outbox"];
            args.extend(["--shard", &shard]);
            args.extend(dead_letters);
            world.relay(&args)
        })
        .collect();
    // A table-less outbox: every shard's walsender sends every message; each relay keeps
    // those whose key (else id) hashes to it, and one relay dead-letters the one that does
    // not parse.
    world
        .pg
        .execute(
            "BEGIN; SELECT pg_logical_emit_message(true, 'outbox', json_build_object('id', \
             'm-' || g, 'aggregate_id', CASE WHEN g % 10 = 0 THEN NULL ELSE 'a-' || (g % 37) END, \
             'event_type', 'Msg', 'payload', json_build_object('g', g))::text) \
             FROM generate_series(1, 300) g; \
             SELECT pg_logical_emit_message(true, 'outbox', 'not json'); COMMIT;",
        )
        .await;
    let messages: Vec<(String, Option<String>)> = (1..=300)
        .map(|g| {
            (
                format!("m-{g}"),
                (g % 10 != 0).then(|| format!("a-{}", g % 37)),
            )
        })
        .collect();
    let ids: Vec<String> = messages.iter().map(|(id, _)| id.clone()).collect();
    let got = world
        .broker
        .consume_ids(&["Msg"], &ids, Duration::from_secs(60));
    let mut seen: Vec<String> = got.iter().map(Consumed::id).collect();
    seen.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(seen, want, "every message once");
    let dead = world.broker.consume(&["dlq"], 2, Duration::from_secs(10));
    assert_eq!(
        dead.len(),
        1,
        "one shard dead-letters the unparsable message"
    );
    let counts: Vec<u64> = relays.iter().map(relayed).collect();
    assert_eq!(
        counts,
        split(&messages).map(|n| n as u64),
        "each relay's share"
    );
    let dead_lettered = relays
        .iter()
        .map(|r| r.metric("outbox_relay_dead_lettered_total"));
    let owner = Shard::of(None, None, 2) as usize;
    for (index, count) in dead_lettered.enumerate() {
        let expected = f64::from(u8::from(index == owner));
        assert_eq!(
            count.unwrap_or(0.0),
            expected,
            "dead letters of shard {index}"
        );
    }

    // backfill --shard re-publishes the rows the shard's filter would send it.
    let ids = world
        .insert_tx(
            &(0..100)
                .map(|n| ("Back", format!("b-{n}"), "{}"))
                .collect::<Vec<_>>(),
        )
        .await;
    let rows = world
        .pg
        .execute("SELECT id::text, aggregate_id FROM outbox WHERE event_type = 'Back'")
        .await;
    let rows: Vec<(String, Option<String>)> = rows
        .into_iter()
        .map(|r| (r[0].clone().unwrap(), r[1].clone()))
        .collect();
    for (shard, expected) in shards(2).into_iter().zip(split(&rows)) {
        backfill(&world, shard, expected as u64);
    }
    let got = world
        .broker
        .consume_ids(&["Back"], &ids, Duration::from_secs(60));
    assert_eq!(
        got.len(),
        ids.len(),
        "every row once between the two shards"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_shards_sharing_partitions_resend_nothing_after_a_sigkill() {
    let world = World::start().await;
    // Both shards write both partitions: each reads back past the other's records.
    world.broker.create_topic(TOPIC, 2);
    let spawn = |shard: Shard, status_interval: &str| {
        let shard = shard.to_string();
        world.relay(&[
            "--shard",
            &shard,
            "--delivery",
            "exactly-once",
            "--status-interval",
            status_interval,
        ])
    };
    let killed = Shard { index: 0, count: 2 };
    // The first shard 0 confirms nothing for a minute: what it delivered is replayed.
    let mut relays = [
        spawn(killed, "60s"),
        spawn(Shard { index: 1, count: 2 }, "200ms"),
    ];
    load(&world.pg, 0, 4_000).await;
    let delivered = relays[0].wait_for(Duration::from_secs(60), |r| relayed(r) > 1_000);
    assert!(delivered, "{}", relays[0].log());
    relays[0].kill();
    relays[0] = spawn(killed, "200ms");
    for shard in shards(2) {
        world
            .wait_caught_up(&slot(shard), Duration::from_secs(120))
            .await;
    }
    let rows = rows(&world.pg).await;
    check(&rows, consume_all(&world.broker, &rows), false);
}

/// The slots on the server, by name.
async fn slot_names(pg: &PgCluster) -> Vec<String> {
    let slots = pg
        .execute("SELECT slot_name::text FROM pg_replication_slots ORDER BY 1")
        .await;
    slots.into_iter().filter_map(|row| row[0].clone()).collect()
}

#[tokio::test(flavor = "current_thread")]
async fn a_fleet_of_another_count_or_key_is_refused_with_the_reshard_remedy() {
    let world = World::start().await;
    let (url, brokers) = (world.pg.url(), world.broker.bootstrap());
    let mut first = world.relay(&["--shard", "0/2"]);
    // A rolling change of K: 1/3 beside 0/2 would leave rows owned by no running shard.
    let (code, log) = run_to_exit(&url, &brokers, &["--shard", "1/3"]);
    assert_eq!(code, POSTGRES_EXIT, "{log}");
    for words in [
        "shard 1/3 (slot \"outbox_relay_shard_1_of_3\")",
        "\"outbox_relay_shard_0_of_2\" (K = 2)",
        "outbox-relay reshard --from 2 --to 3",
    ] {
        assert!(log.contains(words), "{words}: {log}");
    }
    // Refused before anything was written.
    assert_eq!(slot_names(&world.pg).await, ["outbox_relay_shard_0_of_2"]);
    // So is one relay without --shard, and `status` warns of the mixed fleet.
    let (code, log) = run_to_exit(&url, &brokers, &[]);
    assert_eq!(code, POSTGRES_EXIT, "{log}");
    assert!(
        log.contains("outbox-relay reshard --from 2 --to 1"),
        "{log}"
    );
    let args = ["status", "--json", "--postgres-url", &url, "--shard", "1/3"];
    let (code, out, err) = run_command(&args);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("outbox_relay_shard_0_of_2") && out.contains("another shard count"),
        "{out}"
    );
    // Another key column: every shard's rows would move, a resharding.
    first.stop();
    let args = ["--shard", "0/2", "--key-column", "aggregate_type"];
    let (code, log) = run_to_exit(&url, &brokers, &args);
    assert_eq!(code, POSTGRES_EXIT, "{log}");
    for words in [
        "is sharded by another key or id column",
        "outbox-relay reshard --from 2 --to K'",
    ] {
        assert!(log.contains(words), "{words}: {log}");
    }
    assert!(!log.contains("Run ALTER PUBLICATION"), "{log}");
    // A sibling of the same K hashing another column: the fleet would split the rows two ways.
    let args = ["--shard", "1/2", "--key-column", "aggregate_type"];
    let (code, log) = run_to_exit(&url, &brokers, &args);
    assert_eq!(code, POSTGRES_EXIT, "{log}");
    for words in [
        "--shard 1/2 would hash other columns of outbox table public.outbox than shard 0/2",
        "outbox-relay reshard --from 2 --to K'",
    ] {
        assert!(log.contains(words), "{words}: {log}");
    }
    assert_eq!(slot_names(&world.pg).await, ["outbox_relay_shard_0_of_2"]);
}

/// Runs `outbox-relay reshard ARGS` until it has said a line containing `marker` (a step
/// done), then SIGKILLs it (the test seam holds it right after that line). Panics when it
/// exits first, or does not get there in time.
fn reshard_killed_at(url: &str, brokers: &str, args: &[&str], marker: &str) {
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("out");
    let out = std::fs::File::create(&out_path).unwrap();
    let mut child = std::process::Command::new(crate::support::relay::binary())
        .args(["reshard", "--postgres-url", url, "--kafka-brokers", brokers])
        .args(args)
        .env_remove("RUST_LOG")
        .env("OUTBOX_RELAY_HTTP_ADDR", "none")
        .env("OUTBOX_RELAY_TEST_RESHARD_PAUSE_AT", marker)
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let said = std::fs::read_to_string(&out_path).unwrap_or_default();
        if said.lines().any(|line| line.contains(marker)) {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            let output = child.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&output.stderr);
            panic!("reshard {args:?} exited ({status}) before {marker:?}: {said}{err}");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "reshard {args:?} did not get to {marker:?}: {said}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reshard_and_finish_killed_at_each_step_and_run_again_lose_and_reorder_nothing() {
    let world = sharded_world().await;
    let (url, brokers) = (world.pg.url(), world.broker.bootstrap());
    let mut old: Vec<Relay> = shards(2).into_iter().map(|s| spawn(&world, s)).collect();
    // A standby of old shard 0, polling with the slot held.
    let mut standby = Relay::spawn(&url, &brokers, &["--shard", "0/2"]);
    standby.wait_standing_by();
    let (stop, written) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let writer = spawn_writer(&world.pg, stop.clone(), written.clone());
    wait_written(&written, 1_000).await;
    let start = ["--from", "2", "--to", "3"];
    let new_slot = |i: u32| format!("new slot \"{}\"", slot(Shard { index: i, count: 3 }));
    let mut markers: Vec<String> = (0..3).map(new_slot).collect();
    markers.push("waiting for the old slots".to_owned());
    for (step, marker) in markers.iter().enumerate() {
        let (url, brokers) = (url.clone(), brokers.clone());
        let marker = marker.clone();
        tokio::task::spawn_blocking(move || reshard_killed_at(&url, &brokers, &start, &marker))
            .await
            .unwrap();
        wait_written(&written, 200).await;
        if step == 1 {
            // An old relay restarts beside the new slots of a resharding under way.
            old[1].stop();
            old[1] = spawn(&world, Shard { index: 1, count: 2 });
        }
    }
    let out = reshard(&url, &brokers, &start).await;
    assert!(out.contains("ready: every old slot is past"), "{out}");
    wait_written(&written, 1_000).await;

    // The standby is held while its shard is retired, as one that polls rarely would be.
    standby.signal("STOP");
    old[0].stop();
    old[1].signal("KILL");
    wait_written(&written, 500).await;
    wait_old_slots_freed(&world).await;
    let finish = ["--from", "2", "--to", "3", "--finish"];
    let old_slot = |i: u32| slot(Shard { index: i, count: 2 });
    let mut markers: Vec<String> = (0..3).map(|i| format!("{} starts", new_slot(i))).collect();
    for i in 0..2 {
        markers.push(format!("recorded old slot \"{}\"", old_slot(i)));
        markers.push(format!("dropped old slot \"{}\"", old_slot(i)));
    }
    for i in 0..2 {
        markers.push(format!("dropped old publication \"{}\"", old_slot(i)));
    }
    markers.extend((0..3).map(|i| format!("{} is ready", new_slot(i))));
    for marker in &markers {
        let (url_owned, brokers_owned) = (url.clone(), brokers.clone());
        let marker_owned = marker.clone();
        tokio::task::spawn_blocking(move || {
            reshard_killed_at(&url_owned, &brokers_owned, &finish, &marker_owned)
        })
        .await
        .unwrap();
        if *marker == format!("dropped old slot \"{}\"", old_slot(0)) {
            // Old shard 0, restarted: refused beside the new fleet, its slot not created again.
            let (code, log) = run_to_exit(&url, &brokers, &["--shard", "0/2"]);
            assert_eq!(code, POSTGRES_EXIT, "{log}");
            assert!(
                log.contains("was retired by `outbox-relay reshard --from 2 --to 3 --finish`"),
                "{log}"
            );
            // A new shard, started too early: refused while old shard 1's slot is there.
            let (code, log) = run_to_exit(&url, &brokers, &["--shard", "0/3"]);
            assert_eq!(code, POSTGRES_EXIT, "{log}");
            assert!(log.contains("which is not finished"), "{log}");
            // The broker away during a rerun: it stops (exit 4), and the next run goes on.
            world.broker.down();
            let mut args = vec![
                "reshard",
                "--postgres-url",
                &url,
                "--kafka-brokers",
                &brokers,
            ];
            args.extend(finish);
            let (code, out, err) = run_command(&args);
            assert_eq!(code, KAFKA_EXIT, "{out}{err}");
            world.broker.up();
        }
    }
    let out = reshard(&url, &brokers, &finish).await;
    assert!(out.contains("done: start the 3 new relays"), "{out}");
    let new_slots: Vec<String> = shards(3).into_iter().map(slot).collect();
    assert_eq!(slot_names(&world.pg).await, new_slots);

    // The old shard's standby notices its shard was retired: it stops cleanly.
    standby.signal("CONT");
    let exited = standby.wait_exit(Duration::from_secs(90));
    let code = exited.and_then(|status| status.code());
    assert_eq!(code, Some(0), "{}", standby.log());
    assert_eq!(slot_names(&world.pg).await, new_slots);

    the_new_fleet_relays_the_rest(&world, 3, (stop, written, writer), 1_000).await;
    drop(old);
}
