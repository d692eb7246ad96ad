//! The slot poller: every `--slot-poll-interval` it reads the slot's lag and WAL status into the
//! metrics and [`Health`], and warns (with the remedy) when the slot's WAL is at risk. It never
//! stops the relay: a failed poll makes the slot "unknown" for readiness until one succeeds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use super::replication::control;
use super::{SourceError, failover};
use crate::observability::Chain;
use crate::observability::health::{Health, SlotObservation, slot_warnings};
use crate::observability::metrics;
use crate::postgres::catalog::slots::poll;
use crate::postgres::{Connector, query_err};

/// The same warnings are repeated at most this often.
const REPEAT_WARNINGS: Duration = Duration::from_secs(300);

/// Polls forever (the caller aborts the task on shutdown).
pub async fn run(connector: Connector, slot: String, health: Arc<Health>, interval: Duration) {
    let mut client: Option<Client> = None;
    let mut last_warnings: Vec<String> = Vec::new();
    let mut last_warned = Instant::now();
    // When a failed poll was last logged, while polls fail.
    let mut warned_failing_at: Option<Instant> = None;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let polled = async {
            let connected = control(&mut client, &connector).await?;
            poll(connected, &slot)
                .await
                .map_err(|e| SourceError::from(query_err("poll the slot")(e)))
        };
        let observation = match polled.await {
            // Before the first start the relay may not have created the slot yet.
            Ok(SlotObservation::Missing) if !health.snapshot(Instant::now()).streaming => {
                SlotObservation::Unknown
            }
            Ok(SlotObservation::Seen(mut status)) => {
                failover::probe(&mut status, &connector, &slot).await;
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
                poll_failed(&slot, &error, &mut warned_failing_at);
                health.set_slot_observation(SlotObservation::Unknown);
                client = None;
                continue;
            }
        };
        if warned_failing_at.take().is_some() {
            tracing::info!(slot = %slot, "slot poll works again");
        }
        metrics::set_slot(&observation);
        health.set_slot_observation(observation.clone());
        let warnings = warnings(&observation, &slot, &health);
        if !warnings.is_empty()
            && (warnings != last_warnings || last_warned.elapsed() >= REPEAT_WARNINGS)
        {
            for warning in &warnings {
                tracing::warn!(slot = %slot, "{warning}");
            }
            last_warned = Instant::now();
        }
        last_warnings = warnings;
    }
}

/// Logs a failed poll once per outage (and every [`REPEAT_WARNINGS`] during a long one):
/// start-up, or the stream's reconnects, say what the relay waits for. `warned_at`: when a
/// failed poll was last logged, while polls fail.
fn poll_failed(slot: &str, error: &SourceError, warned_at: &mut Option<Instant>) {
    let repeat = warned_at.is_none_or(|at: Instant| at.elapsed() >= REPEAT_WARNINGS);
    if repeat {
        tracing::warn!(
            slot = %slot,
            error = %Chain(error),
            "slot poll failed; retrying every tick, logging it again once it works, or in 5 \
             minutes"
        );
        *warned_at = Some(Instant::now());
    } else {
        tracing::debug!(slot = %slot, error = %Chain(error), "slot poll failed again");
    }
}

/// What the slot as observed needs attention for, with the remedy.
fn warnings(observation: &SlotObservation, slot: &str, health: &Health) -> Vec<String> {
    match observation {
        SlotObservation::Seen(status) => slot_warnings(status, &health.thresholds()),
        SlotObservation::Missing => vec![format!(
            "replication slot {slot:?} does not exist (dropped, or lost in a failover); the relay \
             cannot resume from it. {}",
            crate::remedy::LOST_SLOT
        )],
        SlotObservation::Unknown => Vec::new(),
    }
}
