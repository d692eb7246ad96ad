//! `--cleanup delete`, and the two cleanup patterns that need no flag: delete
//! in the same transaction, and a partitioned outbox whose old partitions are dropped.

use std::collections::HashSet;
use std::time::Duration;

use crate::support::http::get;
use crate::support::kafka::consume_until;
use crate::support::relay::{Relay, run_to_exit};
use crate::support::world::{World, wait_until};

const SLOT: &str = "outbox_relay";

/// The ids still in `public.outbox`.
async fn remaining(world: &World) -> HashSet<String> {
    world
        .pg
        .execute("SELECT id::text FROM public.outbox")
        .await
        .into_iter()
        .filter_map(|r| r.into_iter().next().flatten())
        .collect()
}

/// Waits until every row is gone from `public.outbox`.
async fn wait_emptied(world: &World, relay: &Relay, timeout: Duration) {
    let emptied = wait_until(timeout, || async { remaining(world).await.is_empty() }).await;
    let left = remaining(world).await;
    assert!(emptied, "rows left: {left:?}\n{}", relay.log());
}

#[tokio::test(flavor = "current_thread")]
async fn cleanup_delete_removes_relayed_rows_and_counts_them() {
    let world = World::start().await;
    let mut relay = world.relay(&["--cleanup", "delete"]);
    let port = relay.wait_http_port();
    let mut ids = Vec::new();
    for n in 0..10 {
        let rows: Vec<(String, String, String)> = (0..3)
            .map(|k| ("Evt".into(), format!("a-{k}"), format!(r#"{{"n": {n}}}"#)))
            .collect();
        ids.extend(world.insert_tx(&rows).await);
    }
    let records = world
        .broker
        .consume_ids(&["Evt"], &ids, Duration::from_secs(60));
    let got: HashSet<String> = records.iter().map(|r| r.id()).collect();
    assert!(ids.iter().all(|id| got.contains(id)), "{}", relay.log());
    wait_emptied(&world, &relay, Duration::from_secs(30)).await;
    world.wait_caught_up(SLOT, Duration::from_secs(30)).await;
    let counted = wait_until(Duration::from_secs(30), || async {
        get(port, "/metrics")
            .is_some_and(|(_, body)| body.contains("outbox_relay_cleanup_deleted_rows_total 30"))
    })
    .await;
    assert!(counted, "{:?}", get(port, "/metrics"));
    // The deletes do not come back through the slot (publish = 'insert').
    assert!(
        !relay.log().contains("ignoring UPDATE/DELETE"),
        "{}",
        relay.log()
    );

    // Rows whose events the broker has not acknowledged stay.
    world.broker.down();
    let held = world
        .insert_tx(&[("Evt", "a-1", r#"{"n": 1}"#), ("Evt", "a-2", r#"{"n": 2}"#)])
        .await;
    let after_commit = world.current_lsn().await;
    world
        .wait_replies_past(SLOT, after_commit, Duration::from_secs(30))
        .await;
    let left = remaining(&world).await;
    assert!(
        held.iter().all(|id| left.contains(id)),
        "an unacknowledged row was deleted: {left:?}\n{}",
        relay.log()
    );
    assert!(world.confirmed_flush(SLOT).await.unwrap() < after_commit);
    world.broker.up();
    wait_emptied(&world, &relay, Duration::from_secs(60)).await;
}

#[tokio::test(flavor = "current_thread")]
async fn cleanup_with_sigkill_deletes_only_relayed_rows_and_eventually_all() {
    let world = World::start().await;
    let url = world.pg.url();
    let bootstrap = world.broker.bootstrap();
    let args = ["--cleanup", "delete"];
    let mut relay = Relay::spawn_streaming(&url, &bootstrap, &args);
    let mut committed = Vec::new();
    for n in 0..120 {
        let rows: Vec<(String, String, String)> = (0..(1 + n % 4))
            .map(|k| {
                (
                    format!("Evt{}", k % 2),
                    format!("agg-{}", n % 7),
                    format!(r#"{{"n": {n}, "k": {k}}}"#),
                )
            })
            .collect();
        committed.extend(world.insert_tx(&rows).await);
        if n == 50 {
            relay.kill();
            // Every row gone from the table was delivered before it went.
            let left = remaining(&world).await;
            let deleted: Vec<&String> = committed.iter().filter(|id| !left.contains(*id)).collect();
            let records = consume_until(
                &bootstrap,
                &["Evt0", "Evt1"],
                Duration::from_secs(30),
                Duration::ZERO,
                |records| {
                    let seen: HashSet<String> = records.iter().map(|r| r.id()).collect();
                    deleted.iter().all(|id| seen.contains(*id))
                },
            );
            let seen: HashSet<String> = records.iter().map(|r| r.id()).collect();
            let unrelayed: Vec<&&String> =
                deleted.iter().filter(|id| !seen.contains(**id)).collect();
            assert!(
                unrelayed.is_empty(),
                "{} rows deleted without being delivered: {unrelayed:?}\n{}",
                unrelayed.len(),
                relay.log()
            );
            eprintln!(
                "cleanup sigkill: {} of {} rows deleted at the kill",
                deleted.len(),
                committed.len()
            );
        }
        if n == 80 {
            relay = Relay::spawn_streaming(&url, &bootstrap, &args);
        }
    }
    let records = world
        .broker
        .consume_ids(&["Evt0", "Evt1"], &committed, Duration::from_secs(60));
    let got: HashSet<String> = records.iter().map(|r| r.id()).collect();
    let lost: Vec<&String> = committed.iter().filter(|id| !got.contains(*id)).collect();
    assert!(
        lost.is_empty(),
        "{} ids lost: {lost:?}\n{}",
        lost.len(),
        relay.log()
    );
    wait_emptied(&world, &relay, Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "current_thread")]
async fn cleanup_delete_refuses_to_start_without_a_primary_key_or_with_deletes_published() {
    let world = World::start().await;
    world
        .pg
        .execute(
            "CREATE TABLE public.nopk (id uuid DEFAULT gen_random_uuid(), aggregate_id text, \
             event_type text, payload jsonb);
             CREATE PUBLICATION alldml FOR TABLE public.outbox;",
        )
        .await;
    let (code, log) = run_to_exit(
        &world.pg.url(),
        &world.broker.bootstrap(),
        &[
            "--table",
            "public.nopk",
            "--publication",
            "nopk",
            "--cleanup",
            "delete",
        ],
    );
    assert_eq!(code, Some(3), "{log}");
    assert!(
        log.contains("table public.nopk has no primary key"),
        "{log}"
    );
    let (code, log) = run_to_exit(
        &world.pg.url(),
        &world.broker.bootstrap(),
        &["--publication", "alldml", "--cleanup", "delete"],
    );
    assert_eq!(code, Some(3), "{log}");
    assert!(
        log.contains("publication \"alldml\" publishes deletes"),
        "{log}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn insert_and_delete_in_the_same_transaction_is_relayed() {
    let world = World::start().await;
    let relay = world.relay(&[]);
    let id = "6f1c2c4e-0000-4000-8000-00000000d0d0".to_owned();
    world
        .pg
        .execute(&format!(
            "BEGIN;
             INSERT INTO orders (note) VALUES ('x');
             INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
                 VALUES ('{id}', 'order', 'o-1', 'Evt', '{{\"n\": 1}}');
             DELETE FROM outbox WHERE id = '{id}';
             COMMIT;"
        ))
        .await;
    assert!(remaining(&world).await.is_empty());
    let records = world.broker.consume(&["Evt"], 1, Duration::from_secs(30));
    assert_eq!(
        records.iter().map(|r| r.id()).collect::<Vec<_>>(),
        vec![id],
        "{}",
        relay.log()
    );
    assert_eq!(records[0].payload_text().as_deref(), Some(r#"{"n": 1}"#));
}

#[tokio::test(flavor = "current_thread")]
async fn partitioned_outbox_relays_across_dropped_partitions() {
    let world = World::start().await;
    world
        .pg
        .execute(
            "CREATE TABLE public.pbox (
                 id uuid NOT NULL DEFAULT gen_random_uuid(),
                 created_on date NOT NULL,
                 aggregate_id text, event_type text, payload jsonb,
                 PRIMARY KEY (id, created_on)
             ) PARTITION BY RANGE (created_on);
             CREATE TABLE public.pbox_01 PARTITION OF public.pbox
                 FOR VALUES FROM ('2026-01-01') TO ('2026-02-01');
             CREATE TABLE public.pbox_02 PARTITION OF public.pbox
                 FOR VALUES FROM ('2026-02-01') TO ('2026-03-01');",
        )
        .await;
    let insert = |day: &'static str| {
        let pg = &world.pg;
        async move {
            pg.execute(&format!(
                "INSERT INTO public.pbox (created_on, aggregate_id, event_type, payload) \
                 VALUES ('{day}', 'a', 'Part', '{{}}') RETURNING id::text"
            ))
            .await[0][0]
                .clone()
                .unwrap()
        }
    };
    let relay = world.relay(
        // With --cleanup delete too: a composite primary key, deleted through the parent.
        &[
            "--table",
            "public.pbox",
            "--publication",
            "pbox",
            "--cleanup",
            "delete",
        ],
    );
    let mut ids = vec![insert("2026-01-15").await, insert("2026-02-15").await];
    let records = world
        .broker
        .consume_ids(&["Part"], &ids, Duration::from_secs(30));
    assert_eq!(records.len(), 2, "{}", relay.log());
    // Retention by partition: the oldest goes, a new one comes, the relay carries on.
    world
        .pg
        .execute(
            "DROP TABLE public.pbox_01;
             CREATE TABLE public.pbox_03 PARTITION OF public.pbox
                 FOR VALUES FROM ('2026-03-01') TO ('2026-04-01');",
        )
        .await;
    ids.push(insert("2026-02-16").await);
    ids.push(insert("2026-03-01").await);
    let records = world
        .broker
        .consume_ids(&["Part"], &ids, Duration::from_secs(30));
    let got: HashSet<String> = records.iter().map(|r| r.id()).collect();
    assert!(
        ids.iter().all(|id| got.contains(id)),
        "{got:?}\n{}",
        relay.log()
    );
    world.wait_caught_up(SLOT, Duration::from_secs(30)).await;
    let left = world.pg.execute("SELECT count(*) FROM public.pbox").await;
    assert_eq!(left[0][0].as_deref(), Some("0"), "{}", relay.log());
}

/// Locks the row `id` in a transaction of its own, left open until the client commits.
async fn lock_row(world: &World, id: &str) -> tokio_postgres::Client {
    let locker = world.pg.client().await;
    locker
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM public.outbox WHERE id = '{id}' FOR UPDATE"
        ))
        .await
        .unwrap();
    locker
}

/// Commits one outbox row whose event the broker has not acknowledged yet, and locks it from
/// another session before the relay could delete it (the broker is down meanwhile).
async fn insert_locked_row(world: &World) -> (String, tokio_postgres::Client) {
    world.broker.down();
    let id = world.insert_tx(&[("Evt", "a-0", r#"{"n": 0}"#)]).await;
    let locker = lock_row(world, &id[0]).await;
    world.broker.up();
    (id[0].clone(), locker)
}

/// `/readyz`'s reasons, as one string.
fn reasons(relay: &Relay) -> String {
    relay
        .readyz()
        .map(|j| j["reasons"].to_string())
        .unwrap_or_default()
}

#[tokio::test(flavor = "current_thread")]
async fn a_row_locked_by_another_session_stalls_neither_relaying_nor_shutdown() {
    let world = World::start().await;
    let args = [
        "--cleanup",
        "delete",
        "--shutdown-timeout",
        "5s",
        "--ready-max-ack-staleness",
        "1s",
    ];
    let mut relay = world.relay(&args);
    let (locked, locker) = insert_locked_row(&world).await;
    let mut ids = vec![locked.clone()];
    for n in 1..26 {
        let payload = format!(r#"{{"n": {n}}}"#);
        ids.extend(world.insert_tx(&[("Evt", format!("a-{n}"), payload)]).await);
    }
    // The issue's reproduction: every event reaches Kafka while the row is locked.
    let records = world
        .broker
        .consume_ids(&["Evt"], &ids, Duration::from_secs(60));
    let got: HashSet<String> = records.iter().map(|r| r.id()).collect();
    let missing: Vec<&String> = ids.iter().filter(|id| !got.contains(*id)).collect();
    assert!(
        missing.is_empty(),
        "not relayed: {missing:?}\n{}",
        relay.log()
    );
    // Every other row is deleted; the locked one stays, and /readyz says why.
    let only_locked = wait_until(Duration::from_secs(30), || async {
        remaining(&world).await == HashSet::from([locked.clone()])
    })
    .await;
    assert!(
        only_locked,
        "{:?}\n{}",
        remaining(&world).await,
        relay.log()
    );
    let held = relay.wait_for(Duration::from_secs(30), |r| {
        reasons(r).contains("another session holds")
    });
    assert!(held, "{:?}\n{}", relay.readyz(), relay.log());
    assert_eq!(
        relay.metric("outbox_relay_cleanup_held_rows"),
        Some(1.0),
        "{}",
        relay.log()
    );
    // SIGTERM stops the relay within --shutdown-timeout whatever the deletes are doing.
    relay.signal("TERM");
    let status = relay.wait_exit(Duration::from_secs(30));
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", relay.log());
    // The row's transaction was not confirmed: released, the replay deletes it.
    locker.batch_execute("COMMIT").await.unwrap();
    let relay = world.relay(&args);
    wait_emptied(&world, &relay, Duration::from_secs(30)).await;
    world.wait_caught_up(SLOT, Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "current_thread")]
async fn the_cleanup_backlog_is_bounded_and_shown_in_readiness() {
    let world = World::start().await;
    let args = ["--cleanup", "delete", "--max-in-flight-events", "20"];
    let mut relay = world.relay(&args);
    let (locked, locker) = insert_locked_row(&world).await;
    let mut ids = vec![locked];
    for n in 0..10 {
        let rows: Vec<(String, String, String)> = (0..10)
            .map(|k| ("Evt".into(), format!("a-{k}"), format!(r#"{{"n": {n}}}"#)))
            .collect();
        ids.extend(world.insert_tx(&rows).await);
    }
    // Reading pauses with 20 rows from the locked one on, and /readyz says so.
    let full = relay.wait_for(Duration::from_secs(60), |r| {
        reasons(r).contains("reading the WAL is paused")
    });
    assert!(full, "{:?}\n{}", relay.readyz(), relay.log());
    assert_eq!(
        relay.metric("outbox_relay_cleanup_backlog_rows"),
        Some(20.0),
        "{}",
        relay.log()
    );
    // Released, the rest streams through and every row goes.
    locker.batch_execute("COMMIT").await.unwrap();
    let records = world
        .broker
        .consume_ids(&["Evt"], &ids, Duration::from_secs(60));
    assert_eq!(records.len(), ids.len(), "{}", relay.log());
    wait_emptied(&world, &relay, Duration::from_secs(30)).await;
    let ready = relay.wait_for(Duration::from_secs(30), |r| {
        r.readyz().is_some_and(|j| j["ready"] == true)
    });
    assert!(ready, "{:?}\n{}", relay.readyz(), relay.log());
}

#[tokio::test(flavor = "current_thread")]
async fn cleanup_keeps_a_row_whose_payload_did_not_reach_kafka() {
    let world = World::start().await;
    let relay = world.relay(&[
        "--cleanup",
        "delete",
        "--on-poison",
        "dead-letter",
        "--dead-letter-topic",
        "dlq",
        "-X",
        "message.max.bytes=20000",
    ]);
    let big = format!(r#"{{"blob": "{}"}}"#, "y".repeat(30_000));
    let ids = world
        .insert_tx(&[("Evt", "a-1", r#"{"n": 1}"#), ("Evt", "a-2", big.as_str())])
        .await;
    // NULL event_type: dead-lettered with its payload, so everything it held reached Kafka.
    let unrouted = world
        .pg
        .execute(
            "INSERT INTO outbox (aggregate_type, aggregate_id, payload) \
             VALUES ('order', 'a-3', '{\"n\": 3}') RETURNING id::text",
        )
        .await;
    let unrouted = unrouted[0][0].clone().unwrap();
    let dead = world.broker.consume_ids(
        &["dlq"],
        &[ids[1].clone(), unrouted.clone()],
        Duration::from_secs(60),
    );
    assert_eq!(dead.len(), 2, "{}", relay.log());
    world.wait_caught_up(SLOT, Duration::from_secs(30)).await;
    // The slot moved past all three: what was to be deleted is deleted.
    assert_eq!(
        remaining(&world).await,
        HashSet::from([ids[1].clone()]),
        "only the row whose payload was left out stays\n{}",
        relay.log()
    );
    assert_eq!(
        relay.metric("outbox_relay_cleanup_kept_rows_total"),
        Some(1.0),
        "{}",
        relay.log()
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_delete_that_cannot_succeed_stops_the_relay_naming_the_table_and_the_cause() {
    let world = World::start().await;
    world
        .pg
        .execute(
            "CREATE FUNCTION keep_outbox() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'outbox rows are kept for audit'; END $$;
             CREATE TRIGGER keep BEFORE DELETE ON public.outbox \
             FOR EACH ROW EXECUTE FUNCTION keep_outbox();",
        )
        .await;
    let mut relay = world.relay(&["--cleanup", "delete"]);
    let before = world.current_lsn().await;
    let ids = world.insert_tx(&[("Evt", "a-1", r#"{"n": 1}"#)]).await;
    let status = relay.wait_exit(Duration::from_secs(60));
    let log = relay.log();
    assert_eq!(status.and_then(|s| s.code()), Some(3), "{log}");
    for part in [
        "public.outbox",
        "outbox rows are kept for audit",
        "--cleanup none",
    ] {
        assert!(log.contains(part), "{part}: {log}");
    }
    // Delivered, but not confirmed: the row stays and is relayed again after restart.
    world
        .broker
        .consume_ids(&["Evt"], &ids, Duration::from_secs(30));
    assert!(world.confirmed_flush(SLOT).await.unwrap() <= before);
    assert_eq!(remaining(&world).await, HashSet::from([ids[0].clone()]));
    world.pg.execute("DROP TRIGGER keep ON public.outbox").await;
    let relay = world.relay(&["--cleanup", "delete"]);
    wait_emptied(&world, &relay, Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "current_thread")]
async fn cleanup_delete_is_refused_on_a_standby() {
    let mut primary = crate::support::postgres::PgCluster::start();
    primary.execute(crate::support::world::SCHEMA).await;
    let standby = primary.start_standby("standby1", &[]).await;
    let broker = crate::support::kafka::Broker::start();
    let (code, log) = run_to_exit(
        &standby.url(),
        &broker.bootstrap(),
        &["--cleanup", "delete"],
    );
    assert_eq!(code, Some(3), "{log}");
    assert!(
        log.contains("--cleanup delete: the server") && log.contains("is a standby"),
        "{log}"
    );
}
