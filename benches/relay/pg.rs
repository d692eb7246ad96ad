//! The bench's slots and publication in Postgres, and the queries that watch them.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use outbox_relay::lsn::Lsn;

use crate::workload::SCHEMA;

/// The slot `pg_recvlogical` drains: the reference.
pub(crate) const SLOT_REF: &str = "bench_ref";
/// The relay's slot (a shard's is named after it).
pub(crate) const SLOT_RELAY: &str = "bench_relay";
pub(crate) const PUBLICATION: &str = "bench_pub";

/// How often the slot's confirmed position is polled.
pub(crate) const CONFIRMED_POLL: Duration = Duration::from_millis(2);

/// The outbox table, its publication and both slots, before any row is written, so that
/// both slots see the same WAL.
pub(crate) async fn create_objects(control: &tokio_postgres::Client) -> Result<()> {
    control.batch_execute(SCHEMA).await.context("schema")?;
    control
        .batch_execute(&format!(
            "CREATE PUBLICATION {PUBLICATION} FOR TABLE public.outbox WITH (publish = 'insert')"
        ))
        .await
        .context("publication")?;
    for slot in [SLOT_REF, SLOT_RELAY] {
        control
            .batch_execute(&format!(
                "SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')"
            ))
            .await
            .with_context(|| format!("create slot {slot}"))?;
    }
    Ok(())
}

pub(crate) async fn query_text(
    client: &tokio_postgres::Client,
    sql: &str,
) -> Result<Option<String>> {
    let rows = client
        .simple_query(sql)
        .await
        .with_context(|| format!("query {sql}"))?;
    Ok(rows.into_iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
        _ => None,
    }))
}

pub(crate) async fn current_lsn(client: &tokio_postgres::Client) -> Result<Lsn> {
    query_text(client, "SELECT pg_current_wal_lsn()::text")
        .await?
        .ok_or_else(|| anyhow!("pg_current_wal_lsn() returned nothing"))?
        .parse()
        .map_err(|e| anyhow!("pg_current_wal_lsn(): {e:?}"))
}

pub(crate) async fn confirmed_flush(client: &tokio_postgres::Client, slot: &str) -> Result<Lsn> {
    let text = query_text(
        client,
        &format!(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = '{slot}'"
        ),
    )
    .await?;
    Ok(text.and_then(|t| t.parse().ok()).unwrap_or(Lsn::ZERO))
}

/// The walsender serving `slot`, once one is attached (polled up to `timeout`).
pub(crate) async fn walsender_pid(
    client: &tokio_postgres::Client,
    slot: &str,
    timeout: Duration,
) -> Result<Option<u32>> {
    let deadline = Instant::now() + timeout;
    let sql = format!(
        "SELECT active_pid::text FROM pg_replication_slots WHERE slot_name = '{slot}' AND active"
    );
    for _ in 0..(timeout.as_millis() / 2 + 1) {
        if let Some(pid) = query_text(client, &sql).await?.and_then(|t| t.parse().ok()) {
            return Ok(Some(pid));
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(None)
}

/// The end of a round's WAL, after a `CHECKPOINT` that logs the running transactions there.
/// A slot's `restart_lsn` moves only to such a record once it is confirmed past it; without
/// one (the bench's rounds are shorter than the 15 s between the ones the background writer
/// logs) every walsender would decode all earlier rounds' WAL again, skipping it, before
/// this round's: round N would cost the walsenders N rounds of decoding.
pub(crate) async fn end_of_load(client: &tokio_postgres::Client) -> Result<Lsn> {
    client.batch_execute("CHECKPOINT").await?;
    current_lsn(client).await
}

/// Moves the reference slot to the current position while nothing streams, so that it
/// does not hold the WAL (and is outside any measurement).
pub(crate) async fn advance_reference(client: &tokio_postgres::Client) -> Result<()> {
    client
        .simple_query(&format!(
            "SELECT pg_replication_slot_advance('{SLOT_REF}', pg_current_wal_lsn())"
        ))
        .await
        .context("advance the reference slot")?;
    Ok(())
}
