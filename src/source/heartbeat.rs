//! `--heartbeat-interval`: a logical decoding message written on a timer, so the walsender
//! always has recent WAL of this database to decode and its keepalive positions (acknowledged
//! when nothing is in flight) move the slot of an idle database (Debezium's heartbeat).

use std::time::Duration;

use tokio_postgres::error::SqlState;

use super::replication::control;
use crate::observability::Chain;
use crate::postgres::sql::HEARTBEAT;
use crate::postgres::{Connector, PgError};

/// Writes a heartbeat every `interval` until aborted; an error is logged once and retried.
pub async fn run(connector: Connector, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut client = None;
    let mut warned = false;
    loop {
        ticker.tick().await;
        let Ok(c) = control(&mut client, &connector).await else {
            continue;
        };
        let Err(e) = c.simple_query(HEARTBEAT).await else {
            warned = false;
            continue;
        };
        let why = if e.code() == Some(&SqlState::READ_ONLY_SQL_TRANSACTION) {
            "heartbeat refused: the relay reads from a hot standby (or a read-only server); the \
             slot still advances as the standby replays the primary's WAL. Point the heartbeat \
             at the primary or drop --heartbeat-interval"
        } else {
            "heartbeat failed; the role needs EXECUTE on pg_logical_emit_message (superuser or \
             REPLICATION). Retrying every interval"
        };
        if !std::mem::replace(&mut warned, true) {
            tracing::warn!(error = %Chain(&PgError(e)), "{why}");
        }
        client = None;
    }
}
