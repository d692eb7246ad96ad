//! A Postgres with the common outbox schema, a mock Kafka, and helpers to
//! read the slot's position.

use std::future::Future;
use std::time::{Duration, Instant};

use outbox_relay::lsn::Lsn;

use super::kafka::Broker;
use super::postgres::{PgCluster, PgOptions};
use super::relay::Relay;
use super::tansu::Tansu;

/// The common outbox schema plus a business table that is not published.
pub const SCHEMA: &str = "
    CREATE TABLE public.outbox (
        id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
        aggregate_type text NOT NULL,
        aggregate_id text,
        event_type text,
        payload jsonb,
        created_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE public.orders (id bigserial PRIMARY KEY, note text);
";

/// A throwaway Postgres with [`SCHEMA`] and a Kafka broker (the mock cluster unless a test
/// picks a broker in its own process).
pub struct World {
    pub pg: PgCluster,
    pub broker: Broker,
}

impl World {
    /// Starts both and creates the schema.
    pub async fn start() -> World {
        World::with(PgCluster::start()).await
    }

    /// [`World::start`] on one PostgreSQL major version.
    pub async fn start_on(major: u32) -> World {
        World::with(PgCluster::start_with(PgOptions {
            major: Some(major),
            ..PgOptions::default()
        }))
        .await
    }

    /// Both, on a cluster started with its own options.
    pub async fn with(pg: PgCluster) -> World {
        World::with_broker(pg, Broker::start()).await
    }

    /// A Postgres with [`SCHEMA`] and `broker`.
    pub async fn with_broker(pg: PgCluster, broker: Broker) -> World {
        pg.execute(SCHEMA).await;
        World { pg, broker }
    }

    /// [`World::start`] with a broker in its own process ([`Tansu`]) instead of the mock.
    pub async fn on(tansu: Tansu) -> World {
        World::with_broker(PgCluster::start(), Broker::process(tansu)).await
    }

    /// A relay on this world, streaming.
    pub fn relay(&self, args: &[&str]) -> Relay {
        Relay::spawn_streaming(&self.pg.url(), &self.broker.bootstrap(), args)
    }

    /// Inserts one outbox row per `(event_type, aggregate_id, payload)` in ONE
    /// transaction, with a business row; returns the ids.
    pub async fn insert_tx<T, K, P>(&self, rows: &[(T, K, P)]) -> Vec<String>
    where
        T: AsRef<str>,
        K: AsRef<str>,
        P: AsRef<str>,
    {
        let mut sql = String::from("BEGIN; INSERT INTO orders (note) VALUES ('x');");
        for (event_type, aggregate, payload) in rows {
            let (event_type, aggregate, payload) =
                (event_type.as_ref(), aggregate.as_ref(), payload.as_ref());
            sql.push_str(&format!(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                 VALUES ('order', '{aggregate}', '{event_type}', '{payload}') RETURNING id::text;"
            ));
        }
        sql.push_str("COMMIT;");
        self.pg
            .execute(&sql)
            .await
            .into_iter()
            .filter_map(|row| row.into_iter().next().flatten())
            .collect()
    }

    /// `pg_current_wal_lsn()`.
    pub async fn current_lsn(&self) -> Lsn {
        let rows = self.pg.execute("SELECT pg_current_wal_lsn()::text").await;
        parse_lsn(&rows)
    }

    /// The slot's `confirmed_flush_lsn`, if the slot exists.
    pub async fn confirmed_flush(&self, slot: &str) -> Option<Lsn> {
        let rows = self
            .pg
            .execute(&format!(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = '{slot}'"
            ))
            .await;
        rows.first()
            .and_then(|r| r.first().cloned().flatten())
            .and_then(|t| t.parse().ok())
    }

    /// Waits until the slot is confirmed at or past `lsn`.
    pub async fn wait_confirmed(&self, slot: &str, lsn: Lsn, timeout: Duration) -> Lsn {
        let deadline = Instant::now() + timeout;
        let mut last = Lsn::ZERO;
        while Instant::now() < deadline {
            last = self.confirmed_flush(slot).await.unwrap_or(Lsn::ZERO);
            if last >= lsn {
                return last;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("slot {slot} confirmed only {last}, expected >= {lsn}");
    }

    /// Waits until the slot is confirmed at the current WAL end; returns that end.
    pub async fn wait_caught_up(&self, slot: &str, timeout: Duration) -> Lsn {
        let end = self.current_lsn().await;
        self.wait_confirmed(slot, end, timeout).await;
        end
    }

    /// Waits on progress, not time, for a relay that must hold its slot before
    /// `lsn`: writes to `orders` keep WAL and keepalives flowing until the
    /// slot's walsender has sent past `lsn` and the relay has answered three
    /// status updates, so a relay that would confirm past `lsn` has done so.
    pub async fn wait_replies_past(&self, slot: &str, lsn: Lsn, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut replies = std::collections::HashSet::new();
        while replies.len() < 3 {
            assert!(
                Instant::now() < deadline,
                "the walsender of {slot} did not send past {lsn} with the relay answering"
            );
            self.pg
                .execute("INSERT INTO orders (note) SELECT 'busy' FROM generate_series(1, 50)")
                .await;
            let rows = self
                .pg
                .execute(&format!(
                    "SELECT r.reply_time::text FROM pg_stat_replication r \
                     JOIN pg_replication_slots s ON s.active_pid = r.pid \
                     WHERE s.slot_name = '{slot}' AND r.sent_lsn > '{lsn}'::pg_lsn"
                ))
                .await;
            replies.extend(
                rows.into_iter()
                    .filter_map(|r| r.into_iter().next().flatten()),
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn parse_lsn(rows: &[Vec<Option<String>>]) -> Lsn {
    rows.first()
        .and_then(|r| r.first().cloned().flatten())
        .and_then(|t| t.parse().ok())
        .expect("an LSN")
}

/// A deterministic pseudo-random schedule (xorshift64), so a failing run replays.
pub struct Schedule(u64);

impl Schedule {
    /// A schedule from a non-zero seed.
    pub fn new(seed: u64) -> Schedule {
        Schedule(seed.max(1))
    }

    /// The next number.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Polls `check` every 100 ms until it is true or `timeout` passes.
pub async fn wait_until<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}
