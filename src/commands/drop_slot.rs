//! `outbox-relay drop-slot --yes-i-know [--drop-publication]`: removes the
//! slot (releasing the WAL it keeps) and, on request, the publication.

use std::io::Write;

use super::{CommandError, execute};
use crate::config::{Config, DropSlotArgs};
use crate::postgres::Connector;
use crate::postgres::sql;
use crate::startup::lineage::Lineage;

/// What dropping the slot loses, said before refusing.
pub(super) fn refusal(slot: &str) -> String {
    format!(
        "refusing to drop replication slot {slot:?} without --yes-i-know.\n\
         Dropping it discards the slot's position, the point up to which Kafka has every \
         event: events committed after it that were not yet relayed will NOT be relayed by a \
         new slot, which starts at the current end of WAL (re-publish or reconcile them). \
         Postgres releases the WAL the slot kept. Stop the relay first, then re-run with \
         --yes-i-know."
    )
}

/// Drops the slot unless a walsender holds it (`--yes-i-know` was checked), recording the drop
/// in the lineage topic first, so the next start creates a fresh slot instead of exiting 7.
pub(super) async fn run(config: &Config, args: &DropSlotArgs) -> Result<(), CommandError> {
    let connector = Connector::new(config.postgres.clone());
    let client = connector.control().await?;
    let slot = &config.flags.slot;
    let mut out = std::io::stdout().lock();
    let remedy = "stop the relay first, then drop the slot";
    let info = super::status::idle_slot(&client, slot, remedy).await?;
    let topic = &config.flags.lineage_topic;
    let kafka = super::kafka(config);
    Lineage::open(&connector, &kafka, topic, slot)
        .await?
        .dropped()
        .await?;
    writeln!(
        out,
        "recorded in Kafka topic {topic:?} that slot {slot:?} was dropped: the relay's next \
         start creates a fresh one"
    )?;
    if info.exists {
        execute(&client, &sql::drop_slot(slot), "drop the replication slot").await?;
        let confirmed = info.confirmed_flush_lsn.as_deref().unwrap_or("nothing");
        writeln!(
            out,
            "dropped slot {slot:?} (it was confirmed up to {confirmed}); its WAL is released"
        )?;
    } else {
        writeln!(out, "slot {slot:?} does not exist; nothing to drop")?;
    }
    if args.drop_publication {
        let publication = &config.flags.publication;
        let drop = sql::drop_publication(publication);
        execute(&client, &drop, "drop the publication").await?;
        writeln!(out, "dropped publication {publication:?} (if it existed)")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_refusal_says_what_is_lost() {
        let text = super::refusal("outbox_relay");
        for needle in ["--yes-i-know", "position", "WAL", "not yet relayed"] {
            assert!(text.contains(needle), "{needle}: {text}");
        }
    }
}
