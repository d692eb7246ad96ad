//! `outbox-relay setup [--print]`: the publication and the slot, created ahead
//! of time through the relay's own start-up checks ([`setup::prepare`]), or
//! printed as a script of the same [`crate::source::sql`] statements.

use std::io::Write;

use super::CommandError;
use crate::config::{Cli, Config, RelayFlags};
use crate::outbox::TableName;
use crate::postgres::catalog::publication;
use crate::postgres::sql;
use crate::sink::lineage;
use crate::source::{setup, shard};

/// `setup --print`: needs only the flags, no connection, but for a shard's row filters, which
/// call the output functions of the key and id columns' types, read from `--postgres-url`.
pub(super) fn print(cli: &Cli) -> Result<(), CommandError> {
    let (flags, tables) = (cli.flags.sharded()?, cli.outbox_tables()?);
    let filters = match flags.shard.is_some() && !tables.is_empty() {
        false => Vec::new(),
        true if cli.postgres_url.is_none() => {
            return Err(CommandError::Refused(
                "setup --print --shard reads the types of the outbox tables' key and id columns \
                 (a shard's row filter calls their output functions): give --postgres-url"
                    .to_owned(),
            ));
        }
        true => {
            let config = Config::from_cli(cli)?;
            super::block_on(async {
                let client = setup::connect(&config).await?;
                shard::row_filters(&client, &config).await
            })??
        }
    };
    let script = script(&flags, &tables, &filters);
    std::io::stdout().write_all(script.as_bytes())?;
    Ok(())
}

/// The SQL `setup` would run, as a script, and the Kafka commands the lineage topic needs.
fn script(flags: &RelayFlags, tables: &[TableName], filters: &[String]) -> String {
    let names: Vec<String> = tables.iter().map(ToString::to_string).collect();
    let [create_topic, acls] = lineage::topic_commands(&flags.lineage_topic);
    let events = match flags.shard {
        Some(shard) => format!(
            "Shard {shard}: only inserts into the outbox tables whose key (else id) hashes to {}",
            shard.index
        ),
        None => "Only inserts into the outbox tables are events".to_owned(),
    };
    format!(
        "-- outbox-relay setup: publication {publication:?} for {tables}, slot {slot:?}.\n\
         -- Run as a role with REPLICATION (or superuser) in the outbox database;\n\
         -- skip a statement whose object already exists.\n\
         \n\
         -- {events}.\n\
         {create_publication};\n\
         \n\
         -- The slot keeps WAL from now until a relay confirms it: create it shortly\n\
         -- before the relay first starts (or let the relay create it).\n\
         {create_slot};\n\
         \n\
         -- Kafka: the relay records the slots it streams from in the lineage topic\n\
         -- (--lineage-topic), so that after a failover to a server without the slot it\n\
         -- stops (exit 7) instead of starting over from \"now\". It does not stream\n\
         -- until the record is written. Compacted, one partition; the relay's principal\n\
         -- (with the relay's -X security settings) reads and writes it:\n\
         --   {create_topic}\n\
         --   {acls}\n",
        publication = flags.publication,
        slot = flags.slot,
        tables = names.join(", "),
        create_publication = sql::create_publication(&flags.publication, tables, filters),
        create_slot = sql::create_slot(&flags.slot, false),
    )
}

/// Creates what is missing through the relay's own start-up checks.
pub(super) async fn apply(config: &Config) -> Result<(), CommandError> {
    let client = setup::connect(config).await?;
    let had_publication = publication::options(&client, &config.flags.publication)
        .await?
        .is_some();
    let slot = setup::prepare(&client, config).await?;
    let filters = shard::row_filters(&client, config).await?;
    let statement = sql::create_publication(&config.flags.publication, &config.tables, &filters);
    let publication = match had_publication {
        true => "exists and covers the outbox tables; kept".to_owned(),
        false => format!("created: {statement}"),
    };
    let at = slot.confirmed_flush;
    let slot = match slot.created {
        true => format!("created at {at} (it keeps WAL from here until a relay confirms it)"),
        false => format!("exists (confirmed up to {at}); kept"),
    };
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "publication {:?}: {publication}",
        config.flags.publication
    )?;
    writeln!(out, "slot {:?}: {slot}", config.flags.slot)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printed_script_is_the_statements_setup_runs() {
        let args = ["outbox-relay", "--slot", "s", "--publication", "p"];
        let cli = Cli::try_parse_global_from(args).unwrap();
        let tables = [TableName::parse("public.outbox").unwrap()];
        let script = script(&cli.flags, &tables, &[]);
        assert!(
            script.contains(&format!(
                "{};\n",
                sql::create_publication("p", &tables, &[])
            )),
            "{script}"
        );
        assert!(
            script.contains(&format!("{};\n", sql::create_slot("s", false))),
            "{script}"
        );
        let topic =
            "--create --topic outbox-relay.lineage --partitions 1 --config cleanup.policy=compact";
        assert!(script.contains(topic), "{script}");
    }
}
