//! The slot poller: every `--slot-poll-interval` it reads the slot's lag and WAL status into the
//! metrics and [`Health`], and warns (with the remedy) when the slot's WAL is at risk. It never
//! stops the relay: a failed poll makes the slot "unknown" for readiness until one succeeds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use super::setup::query_err;
use super::{control, failover};
use crate::config::Config;
use crate::observability::Chain;
use crate::observability::health::{Health, SlotObservation, SlotStatus, WalStatus, slot_warnings};
use crate::observability::metrics;

/// The poll. On a standby (logical slots exist there from Postgres 16) the
/// replay position stands in for `pg_current_wal_lsn()`. Newer servers' columns
/// are read through `to_jsonb`, so one query fits every version.
const SLOT_QUERY: &str = "\
    SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() \
                 ELSE pg_current_wal_lsn() END - confirmed_flush_lsn)::bigint, \
           wal_status::text, safe_wal_size::bigint, \
           (to_jsonb(s) -> 'failover')::boolean, \
           current_setting('synchronized_standby_slots', true) <> '', \
           to_jsonb(s) ->> 'invalidation_reason', (to_jsonb(s) ->> 'conflicting')::bool, \
           to_jsonb(s) ->> 'inactive_since' \
    FROM pg_replication_slots s WHERE slot_name = $1";

/// `idle_replication_slot_timeout` in seconds (NULL before PostgreSQL 18).
pub const IDLE_TIMEOUT_QUERY: &str = "\
    SELECT (SELECT setting::bigint * CASE unit WHEN 'min' THEN 60 WHEN 'h' THEN 3600 \
                                             WHEN 'd' THEN 86400 ELSE 1 END \
            FROM pg_settings WHERE name = 'idle_replication_slot_timeout')";

/// The same warnings are repeated at most this often.
const REPEAT_WARNINGS: Duration = Duration::from_secs(300);

/// Polls forever (the caller aborts the task on shutdown).
pub async fn run(config: Config, health: Arc<Health>, interval: Duration) {
    let mut client: Option<Client> = None;
    let mut last_warnings: Vec<String> = Vec::new();
    let mut last_warned = Instant::now();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let polled = async {
            let connected = control(&mut client, &config).await?;
            poll(connected, &config.flags.slot)
                .await
                .map_err(query_err("poll the slot"))
        };
        let observation = match polled.await {
            // Before the first start the relay may not have created the slot yet.
            Ok(SlotObservation::Missing) if !health.snapshot(Instant::now()).streaming => {
                SlotObservation::Unknown
            }
            Ok(SlotObservation::Seen(mut status)) => {
                failover::probe(&mut status, &config).await;
                // Transactions running at the last standby snapshot keep a copy temporary
                // until the next; the creation's warning covers a refusal.
                if status.failover_ready == Some(false)
                    && let Some(client) = &client
                {
                    let _ = failover::snapshot(client).await;
                }
                SlotObservation::Seen(status)
            }
            Ok(observation) => observation,
            Err(error) => {
                tracing::warn!(slot = %config.flags.slot, error = %Chain(&error), "slot poll failed; retrying next tick");
                health.set_slot_observation(SlotObservation::Unknown);
                client = None;
                continue;
            }
        };
        metrics::set_slot(&observation);
        health.set_slot_observation(observation.clone());
        let warnings = match &observation {
            SlotObservation::Seen(slot) => slot_warnings(slot, &health.thresholds()),
            SlotObservation::Missing => vec![format!(
                "replication slot {:?} does not exist (dropped, or lost in a failover); the relay \
                 cannot resume from it. {}",
                config.flags.slot,
                crate::remedy::LOST_SLOT
            )],
            SlotObservation::Unknown => Vec::new(),
        };
        if !warnings.is_empty()
            && (warnings != last_warnings || last_warned.elapsed() >= REPEAT_WARNINGS)
        {
            for warning in &warnings {
                tracing::warn!(slot = %config.flags.slot, "{warning}");
            }
            last_warned = Instant::now();
        }
        last_warnings = warnings;
    }
}

/// One poll of `slot`.
pub async fn poll(client: &Client, slot: &str) -> Result<SlotObservation, tokio_postgres::Error> {
    let Some(row) = client.query_opt(SLOT_QUERY, &[&slot]).await? else {
        return Ok(SlotObservation::Missing);
    };
    let idle_timeout = client
        .query_one(IDLE_TIMEOUT_QUERY, &[])
        .await?
        .try_get(0)?;
    let to_u64 = |value: Option<i64>| value.map(|v| u64::try_from(v).unwrap_or(0));
    let wal_status: Option<String> = row.try_get(1)?;
    let status = SlotStatus {
        lag_bytes: to_u64(row.try_get(0)?),
        wal_status: WalStatus::parse(wal_status.as_deref()),
        safe_wal_size_bytes: row.try_get(2)?,
        failover: row.try_get(3)?,
        synchronized_standby_slots_set: row.try_get(4)?,
        invalidation_reason: row.try_get(5)?,
        conflicting: row.try_get(6)?,
        inactive_since: row.try_get(7)?,
        idle_timeout_secs: to_u64(idle_timeout),
        ..SlotStatus::default()
    };
    tracing::debug!(slot, ?status, "polled the slot");
    Ok(SlotObservation::Seen(status))
}
