//! What survives a failover: the slot's failover settings (PostgreSQL 17+), and the replicated
//! table `public.outbox_relay_slots`, so that a slot missing on a promoted standby is refused as
//! "lost" (a fresh one would skip every event since the last acknowledgement), not created anew.

use tokio_postgres::Client;

use super::setup::query_err;
use super::{SourceError, pg_error_text, stream_err};
use crate::config::Config;

/// Creates `public.outbox_relay_slots` if missing (also run by `outbox-relay setup`).
pub const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS public.outbox_relay_slots (\
     slot_name text PRIMARY KEY, system_identifier text NOT NULL, \
     created_at timestamptz NOT NULL DEFAULT now(), created_lsn pg_lsn)";

/// Before a missing slot is created: refuses when the table says this relay streamed from it on
/// this cluster, unless `--allow-new-slot`.
pub(super) async fn check_missing_slot(
    client: &Client,
    config: &Config,
) -> Result<(), SourceError> {
    // A promoted standby keeps the system identifier, unlike the timeline.
    let found = client
        .query_opt(
            "SELECT system_identifier = (SELECT system_identifier::text FROM pg_control_system()), \
                    created_at::text \
             FROM public.outbox_relay_slots WHERE slot_name = $1",
            &[&config.flags.slot],
        )
        .await;
    let row = match found {
        Ok(row) => row,
        // No table: this relay never created a slot in this database.
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => None,
        Err(source) => return Err(query_err("read public.outbox_relay_slots")(source)),
    };
    let Some(row) = row else { return Ok(()) };
    let (same_cluster, created_at): (bool, String) = (row.get(0), row.get(1));
    let slot = &config.flags.slot;
    if !same_cluster {
        tracing::warn!(
            slot,
            "public.outbox_relay_slots names this slot under another cluster's system identifier \
             (the database was copied): creating the slot as on a first start"
        );
        return Ok(());
    }
    if config.flags.allow_new_slot {
        tracing::warn!(
            slot,
            created_at,
            "--allow-new-slot: creating a fresh slot where this relay streamed before; events \
             committed between the last acknowledgement and now are relayed only by \
             `outbox-relay backfill`"
        );
        return Ok(());
    }
    Err(SourceError::SlotLost {
        slot: slot.clone(),
        url: config.postgres.redacted(),
        created_at,
    })
}

/// Records the slot, creating the table if needed. Best effort: a role that may not create it is
/// warned, not stopped.
pub(super) async fn record_slot(client: &Client, slot: &str) {
    let result = async {
        let state = client
            .query_one(
                "SELECT to_regclass('public.outbox_relay_slots') IS NOT NULL, pg_is_in_recovery()",
                &[],
            )
            .await?;
        // A hot standby can write nothing; the primary's record is replicated.
        if state.get::<_, bool>(1) {
            return Ok(0);
        }
        if !state.get::<_, bool>(0) {
            client.batch_execute(CREATE_TABLE).await?;
        }
        client
            .execute(
                "INSERT INTO public.outbox_relay_slots (slot_name, system_identifier, created_lsn) \
                 SELECT $1::text, system_identifier::text, \
                        (SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1::text) \
                 FROM pg_control_system() \
                 ON CONFLICT (slot_name) DO UPDATE SET system_identifier = EXCLUDED.system_identifier \
                 WHERE outbox_relay_slots.system_identifier <> EXCLUDED.system_identifier",
                &[&slot],
            )
            .await
    };
    if let Err(e) = result.await {
        tracing::warn!(
            slot,
            error = %pg_error_text(&e),
            "cannot record the slot in public.outbox_relay_slots: after a failover to a server \
             without the slot the relay could not tell a lost slot from a first start. Run \
             `outbox-relay setup` as the table's owner, or grant the relay's role CREATE on \
             schema public"
        );
    }
}

/// With `--slot-failover`: warns when `synchronized_standby_slots` is empty; returns whether the
/// existing slot lacks `FAILOVER true`.
pub(super) async fn check_failover(client: &Client, config: &Config) -> Result<bool, SourceError> {
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
pub(super) async fn mark_failover(config: &Config) -> Result<(), SourceError> {
    let mut client = super::command_session(config).await?;
    let sql = format!(
        "ALTER_REPLICATION_SLOT {} (FAILOVER true)",
        config.flags.slot
    );
    client
        .simple_query(&sql)
        .await
        .map_err(stream_err(&config.flags.slot))?;
    tracing::info!(slot = %config.flags.slot, "marked the slot for failover (FAILOVER true)");
    Ok(())
}
