//! Failover slots (PostgreSQL 17+) while the relay runs: checking that the standbys
//! `--postgres-url` names hold a copy of the slot a promotion can use, and hurrying those
//! copies (start-up creates or marks the slot `FAILOVER true`). A copy is usable only once
//! persistent (`synced` and not `temporary`): the standby's slot sync worker persists it after
//! decoding past a standby snapshot (a running-transactions record) the primary logged after
//! the slot's creation, which a primary writes by itself only every 15 s, and only when busy.

use tokio_postgres::Client;

use crate::observability::health::SlotStatus;
use crate::postgres::catalog::slots::synced_copy;
use crate::postgres::{Connector, sql};

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
