//! `outbox-relay peek`: what is pending in the slot, mapped like the relay
//! maps it, without moving the slot; refused while a relay holds the slot.

use std::time::Duration;

use crate::support::relay::{Relay, run_command};
use crate::support::world::{World, wait_until};

const SLOT: &str = "outbox_relay";

fn peek(url: &str, extra: &[&str]) -> (Option<i32>, String, String) {
    let mut args = vec!["peek", "--postgres-url", url];
    args.extend_from_slice(extra);
    run_command(&args)
}

#[tokio::test(flavor = "current_thread")]
async fn peek_prints_pending_records_and_leaves_the_slot_where_it_was() {
    let world = World::start().await;
    let url = world.pg.url();
    let (code, _, err) = run_command(&[
        "setup",
        "--postgres-url",
        &url,
        "--kafka-brokers",
        &world.broker.bootstrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let mut ids = world
        .insert_tx(&[
            ("OrderCreated", "order-1", r#"{"n": 1}"#),
            ("OrderPaid", "order-1", r#"{"n": 2}"#),
        ])
        .await;
    ids.extend(
        world
            .insert_tx(&[("OrderCreated", "order-2", r#"{"n": 3}"#)])
            .await,
    );
    let before = world.confirmed_flush(SLOT).await.unwrap();

    // Text, with a mapping flag: it flows through as in the relay.
    let template = ["--topic-template", "outbox.${routedByValue}"];
    let (code, out, err) = peek(&url, &template);
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("outbox.")).collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines[0].starts_with("outbox.OrderCreated lsn=")
            && lines[0].contains(" key=order-1 ")
            && lines[0].contains(&format!(" id={} ", ids[0]))
            && lines[0].ends_with(r#"{"n": 1}"#),
        "{out}"
    );
    assert!(lines[2].contains(" key=order-2 "), "{out}");
    assert!(out.contains("3 record(s) pending"), "{out}");

    // --json and --limit; the slot still holds everything.
    let (code, out, err) = peek(&url, &["--json", "--limit", "2"]);
    assert_eq!(code, Some(0), "{err}");
    let records: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 2, "{out}");
    assert_eq!(records[1]["topic"], "OrderPaid");
    assert_eq!(records[1]["key"], "order-1");
    assert_eq!(records[1]["headers"]["id"], ids[1].as_str());
    let value: serde_json::Value =
        serde_json::from_str(records[1]["value"].as_str().unwrap()).unwrap();
    assert_eq!(value, serde_json::json!({"n": 2}));
    assert!(err.contains("--limit reached"), "{err}");

    assert_eq!(world.confirmed_flush(SLOT).await.unwrap(), before);
    let (_, again, _) = peek(&url, &template);
    assert_eq!(
        again.lines().filter(|l| l.starts_with("outbox.")).count(),
        3
    );
}

#[tokio::test(flavor = "current_thread")]
async fn peek_refuses_while_a_relay_holds_the_slot() {
    let world = World::start().await;
    let url = world.pg.url();
    // Streaming, not just creating the slot (which holds it too, briefly).
    let _relay = Relay::spawn_streaming(&url, &world.broker.bootstrap(), &[]);
    let active = wait_until(Duration::from_secs(30), || async {
        !world
            .pg
            .execute(&format!(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = '{SLOT}' AND active"
            ))
            .await
            .is_empty()
    })
    .await;
    assert!(active, "the relay never took the slot");
    let (code, out, err) = peek(&url, &[]);
    assert_ne!(code, Some(0), "{out}");
    assert!(err.contains("in use by server process"), "{err}");
}

/// `peek --limit N` bounds the decoding the server does (`upto_nchanges`), instead of
/// decoding everything pending and showing N records of it.
#[tokio::test(flavor = "current_thread")]
async fn peek_limit_bounds_the_decoding_on_the_server() {
    const PENDING: usize = 300;
    let world = World::start().await;
    let url = world.pg.url();
    world
        .pg
        .execute("SELECT pg_create_logical_replication_slot('outbox_relay', 'pgoutput')")
        .await;
    world
        .pg
        .execute("CREATE PUBLICATION outbox_relay FOR TABLE outbox WITH (publish = 'insert')")
        .await;
    world
        .pg
        .execute(&format!(
            "DO $$ BEGIN FOR i IN 1..{PENDING} LOOP \
             INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('order', i::text, 'Evt', '{{}}'); COMMIT; END LOOP; END $$"
        ))
        .await;

    let (code, out, err) = peek(&url, &["--limit", "3"]);
    assert_eq!(code, Some(0), "{err}");
    let records = out.lines().filter(|l| l.starts_with("Evt ")).count();
    assert_eq!(records, 3, "{out}");
    // The server counts the transactions it decoded for the slot (flushed as peek's
    // session ends).
    let decoded = "SELECT total_txns::text FROM pg_stat_replication_slots \
                   WHERE slot_name = 'outbox_relay' AND total_txns > 0";
    let count = async || {
        let rows = world.pg.execute(decoded).await;
        rows.first()
            .and_then(|r| r[0].clone())
            .map_or(0, |t| t.parse::<usize>().unwrap())
    };
    let reported = wait_until(Duration::from_secs(30), || async { count().await > 0 }).await;
    assert!(reported, "the server reported no decoding");
    let txns = count().await;
    eprintln!("{txns} of {PENDING} pending transactions decoded for 3 records");
    assert!(
        txns < PENDING / 10,
        "{txns} of {PENDING} pending transactions decoded for 3 records"
    );
}

/// Transactions without records (logical messages of another prefix) before the records:
/// `--limit` still finds them, decoding further when a bounded pass found too few.
#[tokio::test(flavor = "current_thread")]
async fn peek_limit_reads_past_transactions_without_records() {
    let world = World::start().await;
    let url = world.pg.url();
    let args = [
        "setup",
        "--postgres-url",
        &url,
        "--kafka-brokers",
        &world.broker.bootstrap(),
    ];
    let (code, _, err) = run_command(&args);
    assert_eq!(code, Some(0), "{err}");
    world
        .pg
        .execute(
            "DO $$ BEGIN FOR i IN 1..100 LOOP \
             PERFORM pg_logical_emit_message(true, 'other', 'x'); COMMIT; END LOOP; END $$",
        )
        .await;
    let ids = [
        world.insert_tx(&[("Evt", "a", "{}")]).await,
        world.insert_tx(&[("Evt", "b", "{}")]).await,
    ];
    let (code, out, err) = peek(&url, &["--limit", "2"]);
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("Evt ")).collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].contains(&ids[0][0]) && lines[1].contains(&ids[1][0]),
        "{out}"
    );
}
