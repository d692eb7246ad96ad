//! Partitioned outbox tables (range, list, hash, two levels, partitions created,
//! attached and detached while streaming) are relayed under the root's mapping,
//! and an insert the relay cannot map is never skipped silently.

use std::collections::HashSet;
use std::time::Duration;

use crate::support::kafka::Broker;
use crate::support::postgres::PgCluster;
use crate::support::relay::{Relay, run_to_exit};
use crate::support::world::World;

const SLOT: &str = "outbox_relay";
const TOPIC: &str = "PartEvt";
const CONFIG_EXIT: Option<i32> = Some(outbox_relay::pipeline::exit_code::CONFIG as i32);
const POSTGRES_EXIT: Option<i32> = Some(outbox_relay::pipeline::exit_code::POSTGRES as i32);

/// Range by year; 2026 listed by aggregate type, 2025 hashed by id.
const SCHEMA: &str = "
    CREATE TABLE public.outbox (
        id uuid NOT NULL DEFAULT gen_random_uuid(),
        aggregate_type text NOT NULL,
        aggregate_id text,
        event_type text,
        payload jsonb,
        created_at timestamptz NOT NULL
    ) PARTITION BY RANGE (created_at);
    CREATE TABLE outbox_2026 PARTITION OF outbox
        FOR VALUES FROM ('2026-01-01') TO ('2027-01-01') PARTITION BY LIST (aggregate_type);
    CREATE TABLE outbox_2026_order PARTITION OF outbox_2026 FOR VALUES IN ('order');
    CREATE TABLE outbox_2026_rest PARTITION OF outbox_2026 DEFAULT;
    CREATE TABLE outbox_2025 PARTITION OF outbox
        FOR VALUES FROM ('2025-01-01') TO ('2026-01-01') PARTITION BY HASH (id);
    CREATE TABLE outbox_2025_h0 PARTITION OF outbox_2025 FOR VALUES WITH (MODULUS 2, REMAINDER 0);
    CREATE TABLE outbox_2025_h1 PARTITION OF outbox_2025 FOR VALUES WITH (MODULUS 2, REMAINDER 1);
    CREATE TABLE public.orders (id bigserial PRIMARY KEY, note text);
";

async fn start() -> World {
    let pg = PgCluster::start();
    pg.execute(SCHEMA).await;
    World {
        pg,
        broker: Broker::start(),
    }
}

/// Inserts one row per `(aggregate_type, created_at)` in one transaction; returns the ids.
async fn insert(world: &World, rows: &[(&str, &str)]) -> Vec<String> {
    let mut sql = String::from("BEGIN;");
    for (aggregate_type, created_at) in rows {
        sql.push_str(&format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at) \
             VALUES ('{aggregate_type}', 'a', '{TOPIC}', '{{}}', '{created_at}') RETURNING id::text;"
        ));
    }
    sql.push_str("COMMIT;");
    world
        .pg
        .execute(&sql)
        .await
        .into_iter()
        .filter_map(|row| row.into_iter().next().flatten())
        .collect()
}

/// Every id reaches the topic, nothing else does, and the slot then passes them.
async fn assert_relayed(world: &World, relay: &Relay, ids: &[String]) {
    let lsn = world.current_lsn().await;
    let records = world
        .broker
        .consume(&[TOPIC], ids.len(), Duration::from_secs(60));
    let got: HashSet<String> = records.iter().map(|r| r.id()).collect();
    for id in ids {
        assert!(
            got.contains(id),
            "id {id} lost; relay log:\n{}",
            relay.log()
        );
    }
    world
        .wait_confirmed(SLOT, lsn, Duration::from_secs(30))
        .await;
    let records = world
        .broker
        .consume(&[TOPIC], ids.len() + 1, Duration::from_secs(2));
    assert_eq!(records.len(), ids.len(), "{records:#?}");
}

#[tokio::test(flavor = "current_thread")]
async fn every_partition_is_relayed_including_ones_created_and_attached_while_streaming() {
    let world = start().await;
    let (pg, broker) = (&world.pg, &world.broker);
    let mut relay = Relay::spawn(&pg.url(), &broker.bootstrap(), &[]);
    relay.wait_streaming();

    // A row in every leaf: list (both), hash (both remainders: with random ids, 24
    // rows all land in one with probability 2^-23).
    let mut rows = vec![("order", "2026-03-01"), ("invoice", "2026-04-01")];
    rows.extend([("order", "2025-05-01"); 24]);
    let mut ids = insert(&world, &rows).await;
    let leaves = pg
        .execute("SELECT count(DISTINCT tableoid) FROM outbox WHERE created_at < '2027-01-01'")
        .await;
    assert_eq!(leaves[0][0].as_deref(), Some("4"), "rows in every leaf");
    assert_relayed(&world, &relay, &ids).await;

    // Created while streaming.
    pg.execute(
        "CREATE TABLE outbox_2027 PARTITION OF outbox FOR VALUES FROM ('2027-01-01') TO ('2028-01-01')",
    )
    .await;
    ids.extend(insert(&world, &[("order", "2027-02-01"), ("order", "2026-02-01")]).await);
    // Attached while streaming, with its columns in another order.
    pg.execute(
        "CREATE TABLE outbox_2024 (payload jsonb, created_at timestamptz NOT NULL, event_type text,
             aggregate_id text, aggregate_type text NOT NULL, id uuid NOT NULL DEFAULT gen_random_uuid());
         ALTER TABLE outbox ATTACH PARTITION outbox_2024 FOR VALUES FROM ('2024-01-01') TO ('2025-01-01')",
    )
    .await;
    ids.extend(insert(&world, &[("order", "2024-02-01"), ("order", "2027-03-01")]).await);
    // Detached (the usual cleanup): the remaining partitions still flow.
    pg.execute("ALTER TABLE outbox DETACH PARTITION outbox_2025")
        .await;
    ids.extend(insert(&world, &[("order", "2024-03-01")]).await);
    assert_relayed(&world, &relay, &ids).await;

    // The slot never passes an undelivered event in a partition.
    broker.down();
    let held = insert(&world, &[("order", "2024-04-01"), ("x", "2026-05-01")]).await;
    let after_commit = world.current_lsn().await;
    world
        .wait_replies_past(SLOT, after_commit, Duration::from_secs(30))
        .await;
    let confirmed = world.confirmed_flush(SLOT).await.unwrap();
    assert!(
        confirmed < after_commit,
        "slot confirmed {confirmed} past the undelivered transaction ending at {after_commit}\n{}",
        relay.log()
    );
    broker.up();
    ids.extend(held);
    assert_relayed(&world, &relay, &ids).await;
}

#[tokio::test(flavor = "current_thread")]
async fn an_insert_the_relay_cannot_map_stops_it_unacknowledged() {
    let world = start().await;
    let (pg, broker) = (&world.pg, &world.broker);
    let mut relay = Relay::spawn(&pg.url(), &broker.bootstrap(), &[]);
    relay.wait_streaming();
    let ids = insert(&world, &[("order", "2026-03-01")]).await;
    assert_relayed(&world, &relay, &ids).await;

    // Someone adds a business table to the relay's own publication.
    pg.execute("ALTER PUBLICATION outbox_relay ADD TABLE orders")
        .await;
    insert(&world, &[("order", "2026-03-02")]).await;
    let before = world.current_lsn().await;
    pg.execute("INSERT INTO orders (note) VALUES ('not an event')")
        .await;
    let status = relay.wait_exit(Duration::from_secs(30));
    let log = relay.log();
    assert_eq!(status.and_then(|s| s.code()), CONFIG_EXIT, "{log}");
    assert!(log.contains("public.orders"), "{log}");
    assert!(log.contains("DROP TABLE public.orders"), "{log}");
    let confirmed = world.confirmed_flush(SLOT).await.unwrap();
    assert!(confirmed <= before, "slot at {confirmed}, past {before}");
    // Restarted, the relay stops again at the same transaction: nothing was skipped.
    let (code, log) = run_to_exit(&pg.url(), &broker.bootstrap(), &[]);
    assert_eq!(code, CONFIG_EXIT, "{log}");
    assert!(world.confirmed_flush(SLOT).await.unwrap() <= before);
}

#[tokio::test(flavor = "current_thread")]
async fn for_all_tables_skips_other_tables_but_not_outbox_partitions() {
    let world = start().await;
    let (pg, broker) = (&world.pg, &world.broker);
    pg.execute(
        "CREATE PUBLICATION everything FOR ALL TABLES WITH (publish_via_partition_root = true)",
    )
    .await;
    let mut relay = Relay::spawn(
        &pg.url(),
        &broker.bootstrap(),
        &["--publication", "everything"],
    );
    relay.wait_streaming();
    pg.execute("INSERT INTO orders (note) VALUES ('skipped')")
        .await;
    let mut ids = insert(&world, &[("order", "2026-03-01"), ("x", "2025-03-01")]).await;
    assert_relayed(&world, &relay, &ids).await;

    // Without publish_via_partition_root, rows arrive under the leaves' names.
    pg.execute("ALTER PUBLICATION everything SET (publish_via_partition_root = false)")
        .await;
    pg.execute("INSERT INTO orders (note) VALUES ('skipped')")
        .await;
    ids.extend(insert(&world, &[("order", "2026-03-02"), ("x", "2025-03-02")]).await);
    assert_relayed(&world, &relay, &ids).await;
}

#[tokio::test(flavor = "current_thread")]
async fn publications_and_tables_that_would_lose_rows_are_refused_at_startup() {
    let world = start().await;
    let (pg, broker) = (&world.pg, &world.broker);
    let bootstrap = broker.bootstrap();

    pg.execute("CREATE PUBLICATION legacy FOR TABLE outbox WITH (publish = 'insert')")
        .await;
    let (code, log) = run_to_exit(&pg.url(), &bootstrap, &["--publication", "legacy"]);
    assert_eq!(code, POSTGRES_EXIT, "{log}");
    assert!(
        log.contains("ALTER PUBLICATION \\\"legacy\\\" SET (publish_via_partition_root = true);")
            || log
                .contains("ALTER PUBLICATION \"legacy\" SET (publish_via_partition_root = true);"),
        "{log}"
    );

    pg.execute(
        "CREATE UNLOGGED TABLE outbox_2027 (LIKE outbox);
         ALTER TABLE outbox ATTACH PARTITION outbox_2027 FOR VALUES FROM ('2027-01-01') TO ('2028-01-01')",
    )
    .await;
    let (code, log) = run_to_exit(&pg.url(), &bootstrap, &[]);
    assert_eq!(code, POSTGRES_EXIT, "{log}");
    assert!(log.contains("outbox_2027 is UNLOGGED"), "{log}");
    assert!(log.contains("SET LOGGED"), "{log}");

    let world = World::start().await;
    world.pg.execute("ALTER TABLE outbox SET UNLOGGED").await;
    let (code, log) = run_to_exit(&world.pg.url(), &world.broker.bootstrap(), &[]);
    assert_eq!(code, POSTGRES_EXIT, "{log}");
    assert!(log.contains("outbox is UNLOGGED"), "{log}");
    assert_eq!(world.confirmed_flush(SLOT).await, None);
}
