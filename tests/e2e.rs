//! The relay end to end: Postgres WAL → outbox events → Kafka, slot moved only after acks.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::support::relay::Relay;
use crate::support::world::World;

const SLOT: &str = "outbox_relay";

async fn millis_now(world: &World) -> i64 {
    let rows = world
        .pg
        .execute("SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint::text")
        .await;
    rows[0][0].as_deref().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn relays_committed_outbox_rows_to_their_topics() {
    let world = World::start().await;
    let mut relay = Relay::spawn(&world.pg.url(), &world.broker.bootstrap(), &[]);
    relay.wait_streaming();

    // One transaction with several event types, a tombstone and a null key.
    let before = millis_now(&world).await;
    let ids = world
        .insert_tx(&[
            ("OrderCreated", "order-1", r#"{"total": 10}"#),
            (
                "OrderCreated",
                "order-2",
                r#"{"total": 20, "note": "naïve ☕"}"#,
            ),
            ("OrderPaid", "order-1", r#"{"paid": true}"#),
        ])
        .await;
    let after = millis_now(&world).await;
    let special = world
        .pg
        .execute(
            "BEGIN;
             INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
               VALUES ('order', 'order-3', 'OrderCancelled', NULL) RETURNING id::text;
             INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
               VALUES ('order', NULL, 'OrderCancelled', '{\"k\": null}') RETURNING id::text;
             COMMIT;",
        )
        .await;
    let tombstone_id = special[0][0].clone().unwrap();
    let null_key_id = special[1][0].clone().unwrap();

    // Rolled back, and business-only transactions: nothing is published.
    world
        .pg
        .execute(
            "BEGIN;
             INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
               VALUES ('order', 'order-9', 'OrderCreated', '{}');
             ROLLBACK;",
        )
        .await;
    world
        .pg
        .execute("INSERT INTO orders (note) SELECT 'busy' FROM generate_series(1, 100)")
        .await;

    // Per-aggregate order: 60 single-event transactions over 4 aggregates.
    let mut expected_seq: HashMap<String, Vec<i64>> = HashMap::new();
    for n in 0..60i64 {
        let aggregate = format!("agg-{}", n % 4);
        world
            .insert_tx(&[("OrderUpdated", &aggregate, &format!(r#"{{"seq": {n}}}"#))])
            .await;
        expected_seq.entry(aggregate).or_default().push(n);
    }
    let end = world.current_lsn().await;

    let topics = [
        "OrderCreated",
        "OrderPaid",
        "OrderCancelled",
        "OrderUpdated",
    ];
    let total = 3 + 2 + 60;
    let records = world
        .broker
        .consume(&topics, total, Duration::from_secs(30));
    assert_eq!(records.len(), total, "relay log:\n{}", relay.log());
    // Once the slot has passed everything, every record the relay will ever
    // send is in the broker: ask for one more than expected, so a stray record
    // (the rolled-back row, the business rows) would show up.
    world
        .wait_confirmed(SLOT, end, Duration::from_secs(20))
        .await;
    let records = world
        .broker
        .consume(&topics, total + 1, Duration::from_secs(5));
    assert_eq!(records.len(), total, "records: {records:#?}");

    let by_id: HashMap<String, _> = records.iter().map(|r| (r.id(), r)).collect();
    assert_eq!(by_id.len(), total, "every record has a distinct id header");
    for (id, (topic, key, payload)) in ids.iter().zip([
        ("OrderCreated", "order-1", r#"{"total": 10}"#),
        (
            "OrderCreated",
            "order-2",
            r#"{"note": "naïve ☕", "total": 20}"#,
        ),
        ("OrderPaid", "order-1", r#"{"paid": true}"#),
    ]) {
        let r = by_id.get(id).unwrap_or_else(|| panic!("id {id} missing"));
        assert_eq!(r.topic, topic);
        assert_eq!(r.key_text().as_deref(), Some(key));
        // jsonb text exactly as Postgres renders it.
        assert_eq!(r.payload_text().as_deref(), Some(payload));
        let ts = r.timestamp.unwrap();
        assert!(
            (before..=after).contains(&ts),
            "timestamp {ts} should be the commit time, within [{before}, {after}]"
        );
    }
    let tombstone = by_id[&tombstone_id];
    assert_eq!(tombstone.payload, None, "NULL payload is a tombstone");
    assert_eq!(tombstone.key_text().as_deref(), Some("order-3"));
    let null_key = by_id[&null_key_id];
    assert_eq!(null_key.key, None, "NULL aggregate_id is a null key");
    assert_eq!(null_key.topic, "OrderCancelled");

    // Per aggregate, the consumed order is the commit order.
    let mut seen: HashMap<String, Vec<i64>> = HashMap::new();
    for r in records.iter().filter(|r| r.topic == "OrderUpdated") {
        let v: serde_json::Value = serde_json::from_slice(r.payload.as_ref().unwrap()).unwrap();
        seen.entry(r.key_text().unwrap())
            .or_default()
            .push(v["seq"].as_i64().unwrap());
    }
    assert_eq!(seen, expected_seq);
    // Same key, same partition.
    let partitions: HashSet<(String, i32)> = records
        .iter()
        .filter(|r| r.topic == "OrderUpdated")
        .map(|r| (r.key_text().unwrap(), r.partition))
        .collect();
    assert_eq!(partitions.len(), 4);
}

#[tokio::test(flavor = "current_thread")]
async fn custom_mapping_flags_shape_the_record() {
    let world = World::start().await;
    let mut relay = Relay::spawn(
        &world.pg.url(),
        &world.broker.bootstrap(),
        &[
            "--topic-template",
            "outbox.${aggregate_type}.${routedByValue}",
            "--key-column",
            "id",
            "--header-column",
            "aggregate_type:type",
            "--header-column",
            "event_type",
            "--timestamp-column",
            "created_at",
        ],
    );
    relay.wait_streaming();
    world
        .pg
        .execute(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, created_at)
             VALUES ('00000000-0000-4000-8000-000000000001', 'order', 'o-1', 'OrderCreated',
                     '{}', '2030-01-02 03:04:05.678+00')",
        )
        .await;
    let records = world
        .broker
        .consume(&["outbox.order.OrderCreated"], 1, Duration::from_secs(30));
    assert_eq!(records.len(), 1, "relay log:\n{}", relay.log());
    let r = &records[0];
    assert_eq!(
        r.key_text().as_deref(),
        Some("00000000-0000-4000-8000-000000000001")
    );
    assert_eq!(r.id(), "00000000-0000-4000-8000-000000000001");
    assert_eq!(r.header("type").as_deref(), Some("order"));
    assert_eq!(r.header("event_type").as_deref(), Some("OrderCreated"));
    assert_eq!(r.timestamp, Some(1_893_553_445_678));
}

#[tokio::test(flavor = "current_thread")]
async fn updates_and_deletes_on_the_outbox_are_ignored_with_one_warning() {
    let world = World::start().await;
    // A publication that publishes every operation, as a user might have made it.
    world
        .pg
        .execute("CREATE PUBLICATION outbox_relay FOR TABLE public.outbox")
        .await;
    let mut relay = Relay::spawn(&world.pg.url(), &world.broker.bootstrap(), &[]);
    relay.wait_streaming();
    let ids = world.insert_tx(&[("Evt", "a-1", "{}")]).await;
    world
        .pg
        .execute(&format!(
            "UPDATE outbox SET payload = '{{\"x\": 1}}' WHERE id = '{0}';
             UPDATE outbox SET payload = '{{\"x\": 2}}' WHERE id = '{0}';
             DELETE FROM outbox WHERE id = '{0}';",
            ids[0]
        ))
        .await;
    let end = world.current_lsn().await;
    let records = world.broker.consume(&["Evt"], 2, Duration::from_secs(8));
    assert_eq!(records.len(), 1, "only the insert is relayed");
    world
        .wait_confirmed(SLOT, end, Duration::from_secs(20))
        .await;
    let log = relay.log();
    assert_eq!(
        log.matches("ignoring UPDATE/DELETE on an outbox table")
            .count(),
        1,
        "{log}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn an_idle_outbox_does_not_pin_wal_while_other_tables_are_busy() {
    let world = World::start().await;
    let mut relay = Relay::spawn(&world.pg.url(), &world.broker.bootstrap(), &[]);
    relay.wait_streaming();
    let start = world.confirmed_flush(SLOT).await.unwrap();
    // About 8 MB of WAL in tables the relay does not publish.
    for _ in 0..8 {
        world
            .pg
            .execute(
                "INSERT INTO orders (note) SELECT repeat('x', 1000) FROM generate_series(1, 1000)",
            )
            .await;
    }
    let end = world.current_lsn().await;
    assert!(
        end.0 - start.0 > 8_000_000,
        "wrote {} bytes of WAL",
        end.0 - start.0
    );
    // Keepalive positions are acknowledged while nothing is in flight.
    let confirmed = world
        .wait_confirmed(SLOT, end, Duration::from_secs(20))
        .await;
    assert!(confirmed >= end, "{}", relay.log());
}

#[tokio::test(flavor = "current_thread")]
async fn several_outbox_tables_each_with_its_own_routing() {
    let world = World::start().await;
    world
        .pg
        .execute(
            "CREATE SCHEMA billing;
             CREATE TABLE billing.outbox (event_id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
                 kind text, account_id text, body bytea);",
        )
        .await;
    let mut relay = Relay::spawn(
        &world.pg.url(),
        &world.broker.bootstrap(),
        &[
            "--table",
            "public.outbox",
            "--table",
            "billing.outbox:route-by=kind;key-column=account_id;id-column=event_id;payload-column=body;topic-template=billing.${routedByValue}",
        ],
    );
    relay.wait_streaming();
    let ids = world.insert_tx(&[("OrderCreated", "o-1", "{}")]).await;
    let billing = world
        .pg
        .execute(
            "INSERT INTO billing.outbox (kind, account_id, body)
             VALUES ('InvoiceIssued', 'acct-7', '\\x00ff') RETURNING event_id::text",
        )
        .await;
    let records = world.broker.consume(
        &["OrderCreated", "billing.InvoiceIssued"],
        2,
        Duration::from_secs(30),
    );
    assert_eq!(records.len(), 2, "{}", relay.log());
    let order = records.iter().find(|r| r.topic == "OrderCreated").unwrap();
    assert_eq!(order.id(), ids[0]);
    assert_eq!(order.key_text().as_deref(), Some("o-1"));
    let invoice = records
        .iter()
        .find(|r| r.topic == "billing.InvoiceIssued")
        .unwrap();
    assert_eq!(Some(invoice.id()), billing[0][0].clone());
    assert_eq!(invoice.key_text().as_deref(), Some("acct-7"));
    assert_eq!(
        invoice.payload.as_deref(),
        Some(&[0u8, 0xff][..]),
        "bytea as raw bytes"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_table_less_outbox_relays_logical_decoding_messages() {
    let world = World::start().await;
    let mut relay = Relay::spawn(
        &world.pg.url(),
        &world.broker.bootstrap(),
        &[
            "--table",
            "none",
            "--message-prefix",
            "outbox",
            "--on-poison",
            "dead-letter",
            "--dead-letter-topic",
            "outbox.dlq",
        ],
    );
    relay.wait_streaming();
    world
        .pg
        .execute(
            r#"BEGIN;
               INSERT INTO orders (note) VALUES ('paid');
               SELECT pg_logical_emit_message(true, 'outbox',
                 '{"id": "m-1", "aggregate_type": "order", "aggregate_id": "o-1",
                   "event_type": "OrderPaid", "payload": {"amount": 42}}');
               COMMIT;
               BEGIN;
               SELECT pg_logical_emit_message(true, 'outbox', '{"id": "rolled-back", "event_type": "OrderPaid"}');
               ROLLBACK;
               SELECT pg_logical_emit_message(false, 'outbox', '{"id": "non-tx", "event_type": "OrderPaid"}');
               SELECT pg_logical_emit_message(true, 'other', '{"id": "other", "event_type": "OrderPaid"}');
               SELECT pg_logical_emit_message(true, 'outbox', 'not json');
               SELECT pg_logical_emit_message(true, 'outbox', '{"id": "m-2", "aggregate_id": "o-1", "event_type": "OrderPaid"}');"#,
        )
        .await;
    let end = world.current_lsn().await;
    let records = world
        .broker
        .consume(&["OrderPaid"], 2, Duration::from_secs(30));
    let ids: Vec<String> = records.iter().map(|r| r.id()).collect();
    assert_eq!(ids, ["m-1", "m-2"], "{}", relay.log());
    assert_eq!(records[0].key_text().as_deref(), Some("o-1"));
    assert_eq!(
        records[0].payload_text().as_deref(),
        Some(r#"{"amount": 42}"#)
    );
    assert_eq!(records[1].payload, None, "no payload field: a tombstone");
    world
        .wait_confirmed(SLOT, end, Duration::from_secs(20))
        .await;
    let dead = world
        .broker
        .consume(&["outbox.dlq"], 2, Duration::from_secs(5));
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].payload_text().as_deref(), Some("not json"));
    assert_eq!(
        dead[0].header("outbox.table").as_deref(),
        Some("message:outbox")
    );
    let extra = world
        .broker
        .consume(&["OrderPaid"], 3, Duration::from_secs(3));
    assert_eq!(
        extra.len(),
        2,
        "rolled-back, non-transactional and other-prefix messages are not relayed"
    );
    assert!(relay.log().contains("non-transactional message"));
}

#[tokio::test(flavor = "current_thread")]
async fn switching_from_debezium_reuses_its_slot_and_publication() {
    let world = World::start().await;
    // What a Debezium deployment leaves behind: its default outbox schema,
    // an all-tables publication and a pgoutput slot it confirmed up to some point.
    world
        .pg
        .execute(
            "CREATE TABLE public.outboxevent (id uuid PRIMARY KEY, aggregatetype text NOT NULL,
                 aggregateid text NOT NULL, type text NOT NULL, payload jsonb);
             CREATE PUBLICATION dbz_publication FOR ALL TABLES;",
        )
        .await;
    world
        .pg
        .execute("SELECT pg_create_logical_replication_slot('debezium', 'pgoutput')")
        .await;
    let insert = |id: &str| {
        format!("INSERT INTO outboxevent VALUES ('{id}', 'Order', 'o-1', 'OrderCreated', '{{}}')")
    };
    world
        .pg
        .execute(&insert("00000000-0000-4000-8000-000000000001"))
        .await;
    // Debezium delivered and confirmed everything so far.
    world
        .pg
        .execute("SELECT pg_replication_slot_advance('debezium', pg_current_wal_lsn())")
        .await;
    world
        .pg
        .execute(&insert("00000000-0000-4000-8000-000000000002"))
        .await;

    let dir = tempfile::tempdir().unwrap();
    let connector = dir.path().join("connector.json");
    let url = url::Url::parse(&world.pg.url()).unwrap();
    std::fs::write(
        &connector,
        serde_json::json!({
            "name": "outbox-connector",
            "config": {
                "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
                "plugin.name": "pgoutput",
                "database.hostname": "127.0.0.1",
                "database.port": url.port().unwrap().to_string(),
                "database.user": "postgres",
                "database.password": crate::support::postgres::PgCluster::PASSWORD,
                "database.dbname": "postgres",
                "topic.prefix": "dbserver1",
                "table.include.list": "public.outboxevent",
                "transforms": "outbox",
                "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
                "transforms.outbox.table.field.event.key": "aggregateid",
                "transforms.outbox.route.by.field": "aggregatetype"
            }
        })
        .to_string(),
    )
    .unwrap();
    // No --postgres-url: everything but the brokers comes from the connector config.
    let mut relay = Relay::spawn_raw(&[
        "--debezium-config",
        connector.to_str().unwrap(),
        "--kafka-brokers",
        &world.broker.bootstrap(),
    ]);
    relay.wait_streaming();
    let end = world.current_lsn().await;
    world
        .wait_confirmed("debezium", end, Duration::from_secs(20))
        .await;
    let records = world
        .broker
        .consume(&["outbox.event.Order"], 2, Duration::from_secs(5));
    let ids: Vec<String> = records.iter().map(|r| r.id()).collect();
    assert_eq!(
        ids,
        ["00000000-0000-4000-8000-000000000002"],
        "only what Debezium had not confirmed; log:\n{}",
        relay.log()
    );
    // Kafka Connect's sample worker converter (JsonConverter with schemas), as Debezium wrote.
    assert_eq!(
        records[0].key_text().as_deref(),
        Some("{\"schema\":{\"type\":\"string\",\"optional\":false},\"payload\":\"o-1\"}")
    );
}
