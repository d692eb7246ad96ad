//! The demo's application: each transaction changes an order and writes its
//! outbox event, the transactional-outbox pattern the relay exists for.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio_postgres::Client;

use crate::postgres::query_err;
use crate::source::SourceError;

/// The demo schema: its own, so a user's database keeps its tables.
pub(super) const SCHEMA: &str = "outbox_demo";
/// The demo's outbox table.
pub(super) const OUTBOX: &str = "outbox_demo.outbox";

/// The life of every order, one event (and status) per transaction.
pub(super) const EVENT_TYPES: [&str; 3] = ["order.created", "order.paid", "order.shipped"];

/// The orders table plus the outbox table from `sql/01_outbox_table.sql`.
pub(super) fn schema_sql() -> String {
    let outbox = include_str!("../../../sql/01_outbox_table.sql").replace("public.outbox", OUTBOX);
    format!(
        "CREATE SCHEMA IF NOT EXISTS {SCHEMA};
         CREATE TABLE IF NOT EXISTS {SCHEMA}.orders (
             id text PRIMARY KEY,
             status text NOT NULL,
             total numeric(10, 2) NOT NULL,
             updated_at timestamptz NOT NULL DEFAULT now()
         );
         {outbox}"
    )
}

/// One event's transaction: the order's change and its outbox row, together.
fn transaction_sql(n: u64) -> String {
    let event_type = EVENT_TYPES[(n % 3) as usize];
    let status = event_type.trim_start_matches("order.");
    let order = format!("order-{}", n / 3 + 1);
    let total = format!("{}.{:02}", 10 + (n / 3 * 7) % 90, (n / 3 * 13) % 100);
    format!(
        "BEGIN;
         INSERT INTO {SCHEMA}.orders (id, status, total) VALUES ('{order}', '{status}', {total})
             ON CONFLICT (id) DO UPDATE SET status = excluded.status, updated_at = now();
         INSERT INTO {OUTBOX} (aggregate_type, aggregate_id, event_type, payload)
             VALUES ('order', '{order}', '{event_type}',
                     '{{\"order_id\": \"{order}\", \"status\": \"{status}\", \"total\": {total}}}');
         COMMIT;"
    )
}

/// Commits one event every `1 / rate` seconds, counted in `written`, until
/// `stop` (between transactions) or a Postgres failure.
pub(super) async fn run(
    client: Arc<Client>,
    rate: f64,
    written: Arc<AtomicU64>,
    stop: impl Future<Output = ()>,
) -> Result<(), SourceError> {
    let mut stop = std::pin::pin!(stop);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for n in 0.. {
        tokio::select! {
            _ = tick.tick() => {}
            () = &mut stop => break,
        }
        client
            .batch_execute(&transaction_sql(n))
            .await
            .map_err(query_err("write a demo order and its outbox event"))?;
        written.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_go_through_their_life_in_order() {
        assert!(transaction_sql(0).contains("INSERT INTO outbox_demo.orders"));
        assert!(transaction_sql(0).contains("'order-1', 'order.created'"));
        assert!(transaction_sql(2).contains("'order-1', 'order.shipped'"));
        assert!(transaction_sql(3).contains("'order-2', 'order.created'"));
        assert!(schema_sql().contains("CREATE TABLE IF NOT EXISTS outbox_demo.outbox"));
    }
}
