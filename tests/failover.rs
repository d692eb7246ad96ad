//! Failover: several hosts in one URL, failover slots (PostgreSQL 17), and
//! the refusal to start over from "now" where the slot was lost.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use outbox_relay::lsn::Lsn;

use crate::support::kafka::Broker;
use crate::support::postgres::{PgCluster, PgOptions};
use crate::support::relay::{Relay, run_to_exit};
use crate::support::world::{SCHEMA, World, wait_until};

const SLOT: &str = "outbox_relay";
const SLOT_LOST_EXIT: Option<i32> = Some(7);
const FAST_BACKOFF: [&str; 4] = [
    "--reconnect-backoff-min",
    "200ms",
    "--reconnect-backoff-max",
    "1s",
];

async fn slot_exists(pg: &PgCluster) -> bool {
    !pg.execute(&format!(
        "SELECT 1 FROM pg_replication_slots WHERE slot_name = '{SLOT}'"
    ))
    .await
    .is_empty()
}

#[tokio::test(flavor = "current_thread")]
async fn a_lost_slot_where_the_relay_streamed_before_stops_it_until_allowed() {
    let world = World::start().await;
    let mut relay = world.relay(&[]);
    relay.stop();
    let (url, brokers) = (world.pg.url(), world.broker.bootstrap());
    world
        .pg
        .execute(&format!("SELECT pg_drop_replication_slot('{SLOT}')"))
        .await;

    let (code, log) = run_to_exit(&url, &brokers, &[]);
    assert_eq!(code, SLOT_LOST_EXIT, "{log}");
    assert!(
        log.contains("where this relay has streamed from it before"),
        "{log}"
    );
    assert!(log.contains("outbox-relay backfill --since"), "{log}");
    assert!(!slot_exists(&world.pg).await, "no slot may be created");

    let relay = Relay::spawn_streaming(&url, &brokers, &["--allow-new-slot"]);
    let ids = world.insert_tx(&[("Evt", "a", r#"{"n": 1}"#)]).await;
    let got = world
        .broker
        .consume_ids(&["Evt"], &ids, Duration::from_secs(30));
    assert_eq!(got.len(), 1, "{}", relay.log());
}

#[tokio::test(flavor = "current_thread")]
async fn slot_failover_is_refused_before_postgres_17_naming_the_version() {
    let World { pg, broker } = World::start_on(16).await;
    let (code, log) = run_to_exit(&pg.url(), &broker.bootstrap(), &["--slot-failover"]);
    assert_eq!(code, Some(3), "{log}");
    assert!(
        log.contains("needs PostgreSQL 17 or later, but the server is 16"),
        "{log}"
    );
}

/// Commits one outbox row per transaction to whichever server is the primary
/// until stopped; counts the commits.
fn spawn_writer(url: String, stop: Arc<AtomicBool>, committed: Arc<AtomicU64>) {
    tokio::spawn(async move {
        let mut client: Option<tokio_postgres::Client> = None;
        for n in 0..20_000u64 {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            if client.as_ref().is_none_or(|c| c.is_closed()) {
                client = match tokio_postgres::connect(&url, tokio_postgres::NoTls).await {
                    Ok((c, connection)) => {
                        tokio::spawn(connection);
                        Some(c)
                    }
                    Err(_) => None,
                };
            }
            let ok = match &client {
                Some(c) => c
                    .execute(
                        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                         VALUES ('order', $1, 'Evt', '{}')",
                        &[&n.to_string()],
                    )
                    .await
                    .is_ok(),
                None => false,
            };
            if ok {
                committed.fetch_add(1, Ordering::SeqCst);
            } else {
                client = None;
            }
            tokio::time::sleep(Duration::from_millis(if ok { 5 } else { 100 })).await;
        }
    });
}

/// The standby settings that synchronize failover slots (PostgreSQL 17+).
const SYNC_SLOTS: [(&str, &str); 2] = [
    ("sync_replication_slots", "on"),
    ("hot_standby_feedback", "on"),
];

/// A primary and a streaming standby of `major`; the relay's and the writer's URLs.
async fn primary_and_standby(major: u32, standby_conf: &[(&str, &str)]) -> (PgCluster, PgCluster) {
    let mut primary = PgCluster::start_with(PgOptions {
        major: Some(major),
        ..PgOptions::default()
    });
    primary.execute(SCHEMA).await;
    let standby = primary.start_standby("standby1", standby_conf).await;
    (primary, standby)
}

fn both_hosts(primary: &PgCluster, standby: &PgCluster) -> String {
    format!(
        "postgres://postgres:{}@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        PgCluster::PASSWORD,
        primary.port(),
        standby.port()
    )
}

/// Waits until the writer committed `more` rows after this call.
async fn wait_commits(committed: &AtomicU64, more: u64) {
    let target = committed.load(Ordering::SeqCst) + more;
    assert!(
        wait_until(Duration::from_secs(60), || async {
            committed.load(Ordering::SeqCst) >= target
        })
        .await,
        "the writer did not commit {more} rows"
    );
}

/// Waits until `standby` holds a persistent synchronized copy of the slot.
async fn wait_synced(standby: &PgCluster) {
    let synced = "SELECT 1 FROM pg_replication_slots WHERE slot_name = 'outbox_relay' \
                  AND synced AND NOT temporary AND confirmed_flush_lsn IS NOT NULL";
    assert!(
        wait_until(Duration::from_secs(120), || async {
            !standby.execute(synced).await.is_empty()
        })
        .await,
        "the slot was not synchronized to the standby:\n{}",
        standby.log_tail()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg17_failover_slots_follow_a_promotion_without_losing_an_event() {
    let (mut primary, standby) = primary_and_standby(17, &SYNC_SLOTS).await;
    primary
        .execute("ALTER SYSTEM SET synchronized_standby_slots = 'standby1'")
        .await;
    primary.execute("SELECT pg_reload_conf()").await;
    let broker = Broker::start();
    let url = both_hosts(&primary, &standby);
    let mut args = vec!["--slot-failover"];
    args.extend(FAST_BACKOFF);
    let mut relay = Relay::spawn_streaming(&url, &broker.bootstrap(), &args);
    let flags = primary
        .execute(&format!(
            "SELECT failover::text FROM pg_replication_slots WHERE slot_name = '{SLOT}'"
        ))
        .await;
    assert_eq!(flags, vec![vec![Some("true".to_owned())]]);

    let stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(AtomicU64::new(0));
    spawn_writer(url.clone(), stop.clone(), committed.clone());
    wait_commits(&committed, 50).await;
    // The standby must hold a persistent synchronized copy before the primary dies.
    wait_synced(&standby).await;
    wait_commits(&committed, 50).await;

    primary.stop_immediate();
    standby.promote();
    wait_commits(&committed, 100).await;
    stop.store(true, Ordering::SeqCst);

    let rows = standby.execute("SELECT id::text FROM outbox").await;
    let ids: Vec<String> = rows.into_iter().filter_map(|r| r[0].clone()).collect();
    assert!(ids.len() >= 200, "{} rows", ids.len());
    let got: HashSet<String> = broker
        .consume_ids(&["Evt"], &ids, Duration::from_secs(90))
        .iter()
        .map(|r| r.id())
        .collect();
    let lost: Vec<&String> = ids.iter().filter(|id| !got.contains(*id)).collect();
    assert!(
        lost.is_empty(),
        "{} of {} rows never reached Kafka; relay log:\n{}",
        lost.len(),
        ids.len(),
        relay.log()
    );
    assert!(
        relay.wait_exit(Duration::from_millis(10)).is_none(),
        "the relay must keep running:\n{}",
        relay.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg16_failover_stops_the_relay_with_the_missing_slot_explained() {
    let (mut primary, standby) = primary_and_standby(16, &[("hot_standby_feedback", "on")]).await;
    let broker = Broker::start();
    let url = both_hosts(&primary, &standby);
    let mut relay = Relay::spawn_streaming(&url, &broker.bootstrap(), &FAST_BACKOFF);
    let stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(AtomicU64::new(0));
    spawn_writer(url.clone(), stop.clone(), committed.clone());
    wait_commits(&committed, 50).await;
    let before_failover = primary.execute("SELECT now()::text").await[0][0]
        .clone()
        .unwrap();

    primary.stop_immediate();
    standby.promote();
    // Rows committed after the promotion: no slot ever sees them.
    wait_commits(&committed, 50).await;
    stop.store(true, Ordering::SeqCst);

    let status = relay
        .wait_exit(Duration::from_secs(60))
        .expect("the relay stops");
    let log = relay.log();
    assert_eq!(status.code(), SLOT_LOST_EXIT, "{log}");
    assert!(log.contains("is missing on the server"), "{log}");
    assert!(log.contains("No slot was created"), "{log}");
    assert!(
        !slot_exists(&standby).await,
        "no slot on the promoted server"
    );

    // A restart finds the lineage record of the old slot and refuses too.
    let (code, log) = run_to_exit(&url, &broker.bootstrap(), &[]);
    assert_eq!(code, SLOT_LOST_EXIT, "{log}");
    assert!(
        log.contains("recorded in Kafka topic \"outbox-relay.lineage\""),
        "{log}"
    );
    assert!(
        !slot_exists(&standby).await,
        "no slot on the promoted server"
    );

    // The runbook: a fresh slot knowingly, then backfill from before the failover.
    let mut relay = Relay::spawn_streaming(&url, &broker.bootstrap(), &["--allow-new-slot"]);
    let out = std::process::Command::new(crate::support::relay::binary())
        .args([
            "backfill",
            "--since",
            &before_failover,
            "--postgres-url",
            &url,
        ])
        .args(["--kafka-brokers", &broker.bootstrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "backfill failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = standby.execute("SELECT id::text FROM outbox").await;
    let ids: Vec<String> = rows.into_iter().filter_map(|r| r[0].clone()).collect();
    let got: HashSet<String> = broker
        .consume_ids(&["Evt"], &ids, Duration::from_secs(60))
        .iter()
        .map(|r| r.id())
        .collect();
    let lost = ids.iter().filter(|id| !got.contains(*id)).count();
    assert_eq!(
        lost,
        0,
        "{lost} of {} rows missing after the backfill",
        ids.len()
    );
    assert!(
        relay.wait_exit(Duration::from_millis(10)).is_none(),
        "{}",
        relay.log()
    );
}

#[tokio::test(flavor = "current_thread")]
async fn slot_failover_marks_an_existing_slot_and_reports_it() {
    let World { pg, broker } = World::start_on(17).await;
    let mut relay = Relay::spawn_streaming(&pg.url(), &broker.bootstrap(), &[]);
    relay.stop();
    let flag =
        format!("SELECT failover::text FROM pg_replication_slots WHERE slot_name = '{SLOT}'");
    assert_eq!(
        pg.execute(&flag).await,
        vec![vec![Some("false".to_owned())]]
    );

    let args = ["--slot-failover", "--slot-poll-interval", "200ms"];
    let mut relay = Relay::spawn_streaming(&pg.url(), &broker.bootstrap(), &args);
    assert_eq!(pg.execute(&flag).await, vec![vec![Some("true".to_owned())]]);
    assert!(
        relay.wait_for(Duration::from_secs(30), |r| {
            r.metric("outbox_relay_slot_failover") == Some(1.0)
        }),
        "{}",
        relay.log()
    );
    assert_eq!(
        relay.metric("outbox_relay_synchronized_standby_slots_set"),
        Some(0.0)
    );
    let (_, readyz) = crate::support::http::get(relay.http_port().unwrap(), "/readyz").unwrap();
    assert!(readyz.contains("\"failover\":true"), "{readyz}");
    assert!(
        readyz.contains("synchronized_standby_slots is empty"),
        "{readyz}"
    );
}

/// The old primary's keepalives move the relay's position past WAL the
/// standby never received; after the promotion the new primary's first
/// transactions lie below that position and must still be relayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promotion_resumes_from_the_new_primarys_slot_not_the_old_primarys_keepalives() {
    let (mut primary, mut standby) = primary_and_standby(17, &SYNC_SLOTS).await;
    // No synchronized_standby_slots: the old primary may stream past the standby.
    let broker = Broker::start();
    let url = both_hosts(&primary, &standby);
    let mut args = vec!["--slot-failover"];
    args.extend(FAST_BACKOFF);
    let relay = Relay::spawn_streaming(&url, &broker.bootstrap(), &args);
    primary
        .execute("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'a', 'Evt', '{}')")
        .await;
    wait_synced(&standby).await;
    standby.stop();
    // WAL the standby never receives; the idle relay confirms past it.
    primary
        .execute("CREATE TABLE filler AS SELECT g, repeat('x', 200) AS pad FROM generate_series(1, 20000) g")
        .await;
    let end = primary.execute("SELECT pg_current_wal_lsn()::text").await[0][0]
        .clone()
        .unwrap();
    let past_end = format!(
        "SELECT 1 FROM pg_replication_slots WHERE slot_name = '{SLOT}' \
         AND confirmed_flush_lsn >= '{end}'::pg_lsn"
    );
    assert!(
        wait_until(Duration::from_secs(60), || async {
            !primary.execute(&past_end).await.is_empty()
        })
        .await,
        "the relay did not confirm the old primary's WAL end {end}:\n{}",
        relay.log()
    );
    primary.stop_immediate();
    standby.restart();
    standby.promote();
    let mut ids = Vec::new();
    for n in 0..20 {
        let row = standby
            .execute(&format!(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                 VALUES ('order', 'b{n}', 'Evt', '{{}}') RETURNING id::text"
            ))
            .await;
        ids.extend(row.into_iter().filter_map(|r| r[0].clone()));
    }
    // The test means something only if the new rows lie below the old end.
    let below = standby
        .execute(&format!("SELECT pg_current_wal_lsn() < '{end}'::pg_lsn"))
        .await;
    assert_eq!(below, vec![vec![Some("t".to_owned())]]);
    let got: HashSet<String> = broker
        .consume_ids(&["Evt"], &ids, Duration::from_secs(60))
        .iter()
        .map(|r| r.id())
        .collect();
    let lost = ids.iter().filter(|id| !got.contains(*id)).count();
    assert_eq!(lost, 0, "relay log:\n{}", relay.log());
}

/// Logs a running-xacts record on the primary every 200 ms until stopped: a
/// standby creates a logical slot only after replaying one, and the primary
/// writes one by itself only every 15 s.
pub(crate) fn log_standby_snapshots(client: tokio_postgres::Client, stop: Arc<AtomicBool>) {
    tokio::spawn(async move {
        for _ in 0..3_000 {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            let _ = client
                .simple_query("SELECT pg_log_standby_snapshot()")
                .await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
}

async fn query_text(pg: &PgCluster, sql: &str) -> Option<String> {
    pg.execute(sql).await.first().and_then(|r| r[0].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pg16_hot_standby_relays_from_its_own_slot_until_a_conflict_invalidates_it() {
    // PostgreSQL 16 says only `conflicting`.
    hot_standby_relays_until_invalidated(16, "conflict with recovery").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pg17_hot_standby_slot_invalidated_by_wal_level_names_the_reason() {
    hot_standby_relays_until_invalidated(17, "wal_level_insufficient").await;
}

/// The relay reads from a hot standby of `major`, with its slot there, until
/// `wal_level = replica` on the primary invalidates that slot (`reason`).
async fn hot_standby_relays_until_invalidated(major: u32, reason: &str) {
    let (mut primary, standby) =
        primary_and_standby(major, &[("hot_standby_feedback", "on")]).await;
    let broker = Broker::start();
    let mut args = vec!["--slot-poll-interval", "200ms"];
    args.extend(FAST_BACKOFF);

    // A standby cannot create the publication: it must come from the primary.
    let (code, log) = run_to_exit(&standby.url(), &broker.bootstrap(), &args);
    assert_eq!(code, Some(3), "{log}");
    assert!(log.contains("create it on the primary"), "{log}");
    primary
        .execute(
            "CREATE PUBLICATION outbox_relay FOR TABLE outbox \
             WITH (publish = 'insert', publish_via_partition_root = true)",
        )
        .await;
    let replicated = "SELECT 1 FROM pg_publication WHERE pubname = 'outbox_relay'";
    assert!(
        wait_until(Duration::from_secs(30), || async {
            !standby.execute(replicated).await.is_empty()
        })
        .await
    );

    let stop = Arc::new(AtomicBool::new(false));
    log_standby_snapshots(primary.client().await, stop.clone());
    let mut relay = Relay::spawn_streaming(&standby.url(), &broker.bootstrap(), &args);
    let slot_lsn = format!(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = '{SLOT}'"
    );
    assert!(query_text(&standby, &slot_lsn).await.is_some());
    assert!(
        !slot_exists(&primary).await,
        "the slot lives on the standby"
    );

    let mut ids = Vec::new();
    for n in 0..5 {
        let sql = format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('order', '{n}', 'Evt', '{{}}') RETURNING id::text"
        );
        ids.extend(query_text(&primary, &sql).await);
    }
    let written: Lsn = query_text(&primary, "SELECT pg_current_wal_lsn()::text")
        .await
        .and_then(|t| t.parse().ok())
        .unwrap();
    let got = broker.consume_ids(&["Evt"], &ids, Duration::from_secs(60));
    assert_eq!(got.len(), ids.len(), "{}", relay.log());
    assert!(
        wait_until(Duration::from_secs(60), || async {
            query_text(&standby, &slot_lsn)
                .await
                .and_then(|t| t.parse::<Lsn>().ok())
                .is_some_and(|lsn| lsn >= written)
        })
        .await,
        "the standby's slot did not advance past {written}:\n{}",
        relay.log()
    );

    // wal_level below logical on the primary invalidates the standby's logical
    // slots when the standby replays the change (a recovery conflict).
    stop.store(true, Ordering::SeqCst);
    primary
        .execute("ALTER SYSTEM SET wal_level = replica")
        .await;
    primary.restart();
    let status = relay
        .wait_exit(Duration::from_secs(60))
        .expect("the relay stops");
    let log = relay.log();
    assert_eq!(status.code(), Some(3), "{log}");
    assert!(log.contains(&format!("invalidated ({reason})")), "{log}");
    assert!(log.contains("wal_level = logical on the primary"), "{log}");
    assert_eq!(
        query_text(
            &standby,
            &format!(
                "SELECT conflicting::text FROM pg_replication_slots WHERE slot_name = '{SLOT}'"
            )
        )
        .await
        .as_deref(),
        Some("true")
    );
    let (code, log) = run_to_exit(&standby.url(), &broker.bootstrap(), &args);
    assert_eq!(code, Some(3), "{log}");
    assert!(log.contains(&format!("invalidated ({reason})")), "{log}");
}

/// Inserts `n` outbox rows, one transaction each, with aggregate ids of
/// `width` characters; returns their ids.
async fn insert_rows(
    pg: &PgCluster,
    prefix: &str,
    n: usize,
    width: usize,
    pad: bool,
) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        if pad {
            // A WAL record of 8 to 200 bytes more than the smallest, outside any transaction.
            let bytes = (i * 37) % 25 * 8;
            pg.execute(&format!(
                "SELECT pg_logical_emit_message(false, 'pad', repeat('x', {bytes}))"
            ))
            .await;
        }
        let aggregate = format!("{prefix}{i:0width$}", width = width - prefix.len());
        let row = pg
            .execute(&format!(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                 VALUES ('order', '{aggregate}', 'Evt', '{{}}') RETURNING id::text"
            ))
            .await;
        ids.extend(row.into_iter().filter_map(|r| r[0].clone()));
    }
    ids
}

/// With `--delivery exactly-once`, records the old primary's timeline
/// delivered past the point the standby reached share positions (commit
/// LSN, change LSN) with the new primary's first events: they must not count
/// as those events delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_after_a_promotion_relays_events_at_positions_the_old_timeline_used() {
    const N: usize = 400;
    let (mut primary, mut standby) = primary_and_standby(17, &SYNC_SLOTS).await;
    let broker = Broker::start();
    // One partition: an old record and a new event at the same position
    // meet whatever their keys.
    broker.create_topic("Evt", 1);
    let url = both_hosts(&primary, &standby);
    let mut args = vec!["--slot-failover", "--delivery", "exactly-once"];
    args.extend(FAST_BACKOFF);
    let relay = Relay::spawn_streaming(&url, &broker.bootstrap(), &args);
    wait_synced(&standby).await;
    standby.stop();
    // Rows the standby never receives, relayed from the old timeline.
    let old = insert_rows(&primary, "a", N, 8, false).await;
    let old_records = broker.consume_ids(&["Evt"], &old, Duration::from_secs(60));
    let old_positions: HashSet<(String, String)> = old_records
        .iter()
        .map(|r| {
            (
                r.header("outbox.lsn").unwrap(),
                r.header("outbox.change").unwrap(),
            )
        })
        .collect();
    assert_eq!(old_positions.len(), N, "{}", relay.log());
    primary.stop_immediate();
    standby.restart();
    standby.promote();
    // Transactions laid out as the old ones, each after a pad of another length: the new
    // ones drift across the old positions and meet some of them exactly.
    let new = insert_rows(&standby, "b", N, 8, true).await;
    let records = broker.consume_ids(&["Evt"], &new, Duration::from_secs(60));
    let got: HashSet<String> = records.iter().map(|r| r.id()).collect();
    let lost = new.iter().filter(|id| !got.contains(*id)).count();
    assert_eq!(lost, 0, "of {N} new rows; relay log:\n{}", relay.log());
    // The test means something only if new events took old positions.
    let reused = records
        .iter()
        .filter(|r| new.contains(&r.id()))
        .filter(|r| {
            old_positions.contains(&(
                r.header("outbox.lsn").unwrap(),
                r.header("outbox.change").unwrap(),
            ))
        })
        .count();
    eprintln!("{reused} of {N} new events at positions the old timeline used");
    assert!(reused > 0, "no new event took an old position");
}

/// `outbox_relay_slot_failover_ready`, `/readyz` and `status` for a PG 17 failover slot: ready
/// once the standby the URL names holds a persistent copy of the slot, not ready while it
/// cannot be checked. Prints how long after the relay started the standby's copy was ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg17_failover_readiness_waits_for_a_persistent_copy_on_the_standby() {
    let (primary, mut standby) = primary_and_standby(17, &SYNC_SLOTS).await;
    // The least-privilege role of sql/, which may log the standby snapshot.
    primary
        .execute(include_str!("../sql/03_relay_role.sql"))
        .await;
    primary
        .execute(include_str!("../sql/02_publication.sql"))
        .await;
    let broker = Broker::start();
    let url = both_hosts(&primary, &standby).replace(
        &format!("postgres:{}@", PgCluster::PASSWORD),
        "outbox_relay:relay-password@",
    );
    let args = ["--slot-failover", "--slot-poll-interval", "200ms"];
    let created = std::time::Instant::now();
    let mut relay = Relay::spawn_streaming(&url, &broker.bootstrap(), &args);
    let ready = |r: &Relay| r.metric("outbox_relay_slot_failover_ready") == Some(1.0);
    assert!(
        relay.wait_for(Duration::from_secs(120), ready),
        "{:?}\n{}",
        relay.readyz(),
        relay.log()
    );
    eprintln!(
        "the failover slot was ready on the standby {:.1} s after the relay started",
        created.elapsed().as_secs_f64()
    );
    wait_synced(&standby).await;
    let readyz = |r: &Relay| r.readyz().unwrap_or_default();
    let ready =
        |r: &Relay| readyz(r)["ready"] == true && readyz(r)["slot"]["failover_ready"] == true;
    assert!(
        relay.wait_for(Duration::from_secs(30), ready),
        "{:?}",
        relay.readyz()
    );

    // A standby that cannot be checked (down, say) is not ready for a promotion either.
    standby.stop();
    let unready = |r: &Relay| r.metric("outbox_relay_slot_failover_ready") == Some(0.0);
    assert!(
        relay.wait_for(Duration::from_secs(30), unready),
        "{}",
        relay.log()
    );
    let reasons = relay.readyz().unwrap()["reasons"].to_string();
    let standby_addr = format!("127.0.0.1:{}: cannot check it", standby.port());
    assert!(reasons.contains(&standby_addr), "{reasons}");
    let (code, out, err) =
        crate::support::relay::run_command(&["status", "--json", "--postgres-url", &url]);
    assert_eq!(code, Some(0), "{err}");
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(status["slot"]["failover_ready"], false, "{status}");
    assert!(
        status["warnings"].to_string().contains(&standby_addr),
        "{status}"
    );
}

/// Issue 21 §5: after a promotion, the relay's records of the old timeline fill the partitions
/// (as much as the broker keeps). The first tail read on the new timeline stops at them rather
/// than reading each partition back to its start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_after_a_promotion_reads_a_bounded_tail_over_the_old_timelines_records() {
    let (mut primary, standby) = primary_and_standby(17, &SYNC_SLOTS).await;
    let broker = Broker::start();
    broker.create_topic("Evt", 2);
    let url = both_hosts(&primary, &standby);
    let mut args = vec!["--slot-failover", "--delivery", "exactly-once"];
    args.extend(FAST_BACKOFF);
    let relay = Relay::spawn_streaming(&url, &broker.bootstrap(), &args);
    // 10 MB of 2 KB events over both partitions; the broker keeps about 5 MB of each.
    for batch in 0..10 {
        insert_batch(&primary, &format!("old{batch}-"), 500, 2_000).await;
    }
    let end = primary.execute("SELECT pg_current_wal_lsn()::text").await[0][0]
        .clone()
        .unwrap();
    let past_end = format!(
        "SELECT 1 FROM pg_replication_slots WHERE slot_name = '{SLOT}' \
         AND confirmed_flush_lsn >= '{end}'::pg_lsn"
    );
    for pg in [&primary, &standby] {
        assert!(
            wait_until(Duration::from_secs(120), || async {
                !pg.execute(&past_end).await.is_empty()
            })
            .await,
            "the slot did not reach {end}:\n{}",
            relay.log()
        );
    }
    let before = crate::exactly_once::tail_records_read(&relay, "Evt", 2);
    primary.stop_immediate();
    standby.promote();

    let new = insert_batch(&standby, "new-", 10, 10).await;
    let records = broker.consume_ids(&["Evt"], &new, Duration::from_secs(60));
    let got: HashSet<String> = records.iter().map(|r| r.id()).collect();
    assert!(new.iter().all(|id| got.contains(id)), "{}", relay.log());
    let after = crate::exactly_once::tail_records_read(&relay, "Evt", 2);
    let read: Vec<f64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    eprintln!("records read back per partition after the promotion: {read:?}");
    for (p, n) in read.iter().enumerate() {
        assert!(
            *n <= 512.0,
            "partition {p}: {n} records read\n{}",
            relay.log()
        );
    }
}

/// Inserts `n` outbox rows of about `size` bytes in one transaction, keys `{prefix}{i}`.
async fn insert_batch(pg: &PgCluster, prefix: &str, n: usize, size: usize) -> Vec<String> {
    let payload = format!(r#"{{"pad": "{}"}}"#, "x".repeat(size));
    let mut sql = String::from("BEGIN;");
    for i in 0..n {
        sql.push_str(&format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('order', '{prefix}{i}', 'Evt', '{payload}') RETURNING id::text;"
        ));
    }
    sql.push_str("COMMIT;");
    let rows = pg.execute(&sql).await;
    rows.into_iter().filter_map(|r| r[0].clone()).collect()
}
