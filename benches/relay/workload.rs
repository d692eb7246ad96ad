//! The rows the bench writes: the outbox table, its order events and their keys.

use anyhow::{Context, Result};

use crate::postgres::PgCluster;

/// Event types: one topic each (the relay routes by `event_type`).
pub(crate) const EVENT_TYPES: [&str; 10] = [
    "OrderPlaced",
    "OrderPaid",
    "OrderPacked",
    "OrderShipped",
    "OrderDelivered",
    "OrderCancelled",
    "OrderRefunded",
    "PaymentFailed",
    "AddressChanged",
    "InvoiceIssued",
];
/// Distinct aggregates (record keys).
const AGGREGATES: u64 = 1_000;
/// Rows per backlog transaction.
pub(crate) const BACKLOG_TX_ROWS: u64 = 100;

/// Every phase's ids start with its own prefix; the rest is the row's sequence number.
pub(crate) const ID_BACKLOG: &str = "10000000-0000-4000-8000-";
pub(crate) const ID_STEADY: &str = "20000000-0000-4000-8000-";
pub(crate) const ID_LARGE: &str = "30000000-0000-4000-8000-";

pub(crate) const SCHEMA: &str = "
    CREATE TABLE public.outbox (
        id uuid PRIMARY KEY,
        aggregate_type text NOT NULL,
        aggregate_id text,
        event_type text,
        payload jsonb,
        created_at timestamptz NOT NULL DEFAULT now()
    );
";

/// The payload of row `g`: an order event of about 300 bytes of JSON.
const PAYLOAD_SQL: &str = "jsonb_build_object(\
    'order_id', g, \
    'customer_id', 'cust-' || lpad((g % 5000)::text, 5, '0'), \
    'amount_cents', (g * 37) % 100000, \
    'currency', 'EUR', \
    'placed_at', '2024-01-02T03:04:05Z', \
    'lines', jsonb_build_array(\
        jsonb_build_object('sku', 'SKU-' || lpad((g % 977)::text, 4, '0'), 'qty', 1 + g % 5, 'unit_cents', 100 + g % 9000)), \
    'shipping', jsonb_build_object('name', 'Customer ' || (g % 5000), 'street', (g % 200) || ' Main Street', \
        'city', 'Springfield', 'zip', lpad((g % 99999)::text, 5, '0')), \
    'note', 'left at the front door')";

/// `INSERT ... SELECT` of rows `$1..=$2` with ids `prefix || hex(g)`.
pub(crate) fn insert_sql(id_prefix: &str) -> String {
    let types = EVENT_TYPES
        .iter()
        .map(|t| format!("'{t}'"))
        .collect::<Vec<_>>()
        .join(",");
    format!(
        "INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload) \
         SELECT ('{id_prefix}' || lpad(to_hex(g), 12, '0'))::uuid, 'order', \
                'order-' || lpad(((g * 7919) % {AGGREGATES})::text, 4, '0'), \
                (ARRAY[{types}])[1 + (g % {n})::int], \
                {PAYLOAD_SQL} \
         FROM generate_series($1::bigint, $2::bigint) g",
        n = EVENT_TYPES.len()
    )
}

/// The record key of backlog row `g` (`insert_sql`'s `aggregate_id`).
pub(crate) fn backlog_key(g: u64) -> String {
    format!("order-{:04}", (g * 7919) % AGGREGATES)
}

/// Loads rows `offset+1..=offset+events` in transactions of `BACKLOG_TX_ROWS`,
/// on two connections.
pub(crate) async fn load_backlog(pg: &PgCluster, offset: u64, events: u64) -> Result<()> {
    let workers = 2u64;
    let txs = events.div_ceil(BACKLOG_TX_ROWS);
    let mut tasks = Vec::new();
    for w in 0..workers {
        let client = pg.client().await;
        tasks.push(tokio::spawn(async move {
            let stmt = client.prepare(&insert_sql(ID_BACKLOG)).await?;
            let mut tx = w;
            while tx < txs {
                let first = (offset + tx * BACKLOG_TX_ROWS + 1) as i64;
                let last = (offset + ((tx + 1) * BACKLOG_TX_ROWS).min(events)) as i64;
                client.execute(&stmt, &[&first, &last]).await?;
                tx += workers;
            }
            Ok::<(), tokio_postgres::Error>(())
        }));
    }
    for task in tasks {
        task.await.context("loader task")?.context("load backlog")?;
    }
    Ok(())
}
