//! `outbox-relay drop-slot --yes-i-know [--drop-publication]`: removes the
//! slot (releasing the WAL it keeps) and, on request, the publication.

use std::io::Write;

use super::CommandError;
use crate::config::{Cli, Config, DropSlotArgs};
use crate::source::setup::{self, query_err};
use crate::source::sql;

pub(super) fn run(cli: &Cli, args: &DropSlotArgs) -> Result<(), CommandError> {
    if !args.yes_i_know {
        return Err(CommandError::Refused(refusal(&cli.slot)));
    }
    let config = Config::from_cli(cli)?;
    super::block_on(drop(&config, args.drop_publication))?
}

/// What dropping the slot loses, said before refusing.
fn refusal(slot: &str) -> String {
    format!(
        "refusing to drop replication slot {slot:?} without --yes-i-know.\n\
         Dropping it discards the slot's position, the point up to which Kafka has every \
         event: events committed after it that were not yet relayed will NOT be relayed by a \
         new slot, which starts at the current end of WAL (re-publish or reconcile them). \
         Postgres releases the WAL the slot kept. Stop the relay first, then re-run with \
         --yes-i-know."
    )
}

async fn drop(config: &Config, drop_publication: bool) -> Result<(), CommandError> {
    let client = setup::connect(config).await?;
    let row = super::slot_activity(&client, &config.slot).await?;
    let mut out = std::io::stdout().lock();
    match row {
        None => writeln!(
            out,
            "slot {:?} does not exist; nothing to drop",
            config.slot
        )?,
        Some((active_pid, confirmed)) => {
            if let Some(pid) = active_pid {
                return Err(CommandError::Refused(format!(
                    "slot {:?} is in use by server process {pid} (a running relay?); stop it \
                     first, then drop the slot",
                    config.slot
                )));
            }
            client
                .batch_execute(&sql::drop_slot(&config.slot))
                .await
                .map_err(query_err("drop the replication slot"))?;
            writeln!(
                out,
                "dropped slot {:?} (it was confirmed up to {}); its WAL is released",
                config.slot,
                confirmed.as_deref().unwrap_or("nothing")
            )?;
        }
    }
    if drop_publication {
        client
            .batch_execute(&sql::drop_publication(&config.publication))
            .await
            .map_err(query_err("drop the publication"))?;
        writeln!(
            out,
            "dropped publication {:?} (if it existed)",
            config.publication
        )?;
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
