//! Failover slots (PostgreSQL 17+): creating or marking the slot `FAILOVER true`, hurrying the
//! standbys' synchronized copies, and checking that the standbys `--postgres-url` names hold a
//! copy a promotion can use. A copy is usable only once persistent (`synced` and not
//! `temporary`): the standby's slot sync worker persists it after decoding past a standby
//! snapshot (a running-transactions record) the primary logged after the slot's creation,
//! which a primary writes by itself only every 15 s, and only when busy.

use tokio_postgres::Client;

use super::SourceError;
use crate::config::Config;
use crate::observability::Chain;
use crate::observability::health::SlotStatus;
use crate::postgres::catalog::slots::synced_copy;
use crate::postgres::{Connector, PgError, query_err, sql};

/// With `--slot-failover`: warns when `synchronized_standby_slots` is empty; returns whether the
/// existing slot lacks `FAILOVER true`.
pub(super) async fn check(client: &Client, config: &Config) -> Result<bool, SourceError> {
    let row = client
        .query_one(
            "SELECT current_setting('synchronized_standby_slots'), \
                    (SELECT failover FROM pg_replication_slots WHERE slot_name = $1)",
            &[&config.flags.slot],
        )
        .await
        .map_err(query_err("read the slot's failover settings"))?;
    if row.get::<_, String>(0).trim().is_empty() {
        tracing::warn!(
            slot = %config.flags.slot,
            "--slot-failover: synchronized_standby_slots is empty on the primary, so the relay may \
             receive (and publish) transactions a standby has not received yet; after a failover \
             to that standby they exist in Kafka but not in the database. Set it to the standbys' \
             physical slots"
        );
    }
    Ok(row.get::<_, Option<bool>>(1) == Some(false))
}

/// Sets `FAILOVER true` on the slot (a replication command, so on a replication connection).
pub(super) async fn mark(client: &Client, config: &Config) -> Result<(), SourceError> {
    let connector = Connector::new(config.postgres.clone());
    let slot = &config.flags.slot;
    let mut session = connector.command_session(slot).await?;
    let marked = session.simple_query(&sql::mark_failover(slot)).await;
    marked.map_err(|e| connector.replication_error("mark the slot for failover", slot, e))?;
    tracing::info!(slot = %slot, "marked the slot for failover (FAILOVER true)");
    log_standby_snapshot(client).await;
    Ok(())
}

/// Has the primary log a standby snapshot now, so the standbys' copies of a slot just created
/// or marked become persistent within seconds. Best effort: without it they still do, later.
pub(super) async fn log_standby_snapshot(client: &Client) {
    if let Err(e) = snapshot(client).await {
        tracing::warn!(
            error = %Chain(&PgError(e)),
            "cannot call pg_log_standby_snapshot(): the standbys' copies of the failover slot \
             become persistent only after the primary's next standby snapshot (up to 15 s when \
             busy, later when idle). GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() TO the \
             relay's role (sql/03_relay_role.sql does)"
        );
    }
}

/// `pg_log_standby_snapshot()`, refused without EXECUTE on it.
pub(super) async fn snapshot(client: &Client) -> Result<(), tokio_postgres::Error> {
    client.batch_execute(sql::LOG_STANDBY_SNAPSHOT).await
}

/// For a slot marked for failover, whether the standbys are ready for a promotion.
pub async fn probe(status: &mut SlotStatus, connector: &Connector, slot: &str) {
    if status.failover != Some(true) {
        return;
    }
    let lacking = standby_copies(connector, slot).await;
    status.failover_ready = lacking.as_ref().map(Vec::is_empty);
    status.failover_lacking = lacking.unwrap_or_default();
}

/// What each standby `--postgres-url` names lacks, empty when every one holds a persistent
/// synchronized copy of the slot; `None` when the URL names no standby.
async fn standby_copies(connector: &Connector, slot: &str) -> Option<Vec<String>> {
    let mut standbys = 0;
    let mut lacking = Vec::new();
    for (addr, server) in connector.each_server() {
        let probe = async {
            let client = server.connect_first().await?;
            synced_copy(&client, slot).await
        };
        let lacks = match probe.await {
            // The primary itself.
            Ok((false, _)) => continue,
            Ok((true, Some(true))) => None,
            Ok((true, Some(false))) => Some("its copy is not persistent yet".to_owned()),
            Ok((true, None)) => Some("no synchronized copy yet".to_owned()),
            Err(e) => Some(format!("cannot check it: {e}")),
        };
        standbys += 1;
        lacking.extend(lacks.map(|lack| format!("{addr}: {lack}")));
    }
    (standbys > 0).then_some(lacking)
}
