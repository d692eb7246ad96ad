//! `outbox-relay setup [--print]`: the publication and the slot, created ahead of time by the
//! relay's own start-up ([`startup::start`]: the same checks, then the same steps), or
//! printed as a script of the steps start-up would take where neither exists.

use std::io::Write;

use super::CommandError;
use crate::config::{Cli, Config, RelayFlags};
use crate::outbox::TableName;
use crate::postgres::Connector;
use crate::sink::lineage;
use crate::startup::{self, Step, Wanted, checks, gather};

/// `setup --print`: needs only the flags, no connection, but for a shard's row filters, which
/// call the output functions of the key and id columns' types, read from `--postgres-url`.
pub(super) fn print(cli: &Cli) -> Result<(), CommandError> {
    let flags = cli.flags.sharded()?;
    let tables = cli.outbox_tables()?;
    let reads_server = reads_server(&flags, &tables, cli.postgres_url.is_some());
    let filters = match reads_server.map_err(CommandError::Refused)? {
        false => Vec::new(),
        true => {
            let config = Config::from_cli(cli)?;
            super::block_on(row_filters(&config))??
        }
    };
    let steps = checks::setup_steps(&flags.publication, &tables, &filters, flags.slot_failover);
    let script = script(&flags, &tables, &steps);
    std::io::stdout().write_all(script.as_bytes())?;
    Ok(())
}

/// PURE: whether `setup --print` must read the server (a shard's row filters over tables),
/// refused without `--postgres-url`.
fn reads_server(flags: &RelayFlags, tables: &[TableName], has_url: bool) -> Result<bool, String> {
    let reads = flags.shard.is_some() && !tables.is_empty();
    if reads && !has_url {
        return Err(
            "setup --print --shard reads the types of the outbox tables' key and id \
                    columns (a shard's row filter calls their output functions): give \
                    --postgres-url"
                .to_owned(),
        );
    }
    Ok(reads)
}

/// A shard's row filters, from its tables' key and id column types.
async fn row_filters(config: &Config) -> Result<Vec<String>, CommandError> {
    crate::cloud::start(&config.kafka_auth, &config.postgres.auth, None).await?;
    let wanted = Wanted::new(config);
    let control = Connector::new(config.postgres.clone()).control().await?;
    let found = gather::catalog(&control, &wanted).await?;
    Ok(checks::row_filters(&found, &wanted).map_err(startup::StartupError::from)?)
}

/// The SQL `setup` would run, as a script, and the Kafka commands the lineage topic needs.
fn script(flags: &RelayFlags, tables: &[TableName], steps: &[Step]) -> String {
    let names: Vec<String> = tables.iter().map(ToString::to_string).collect();
    let [create_topic, acls] = lineage::topic_commands(&flags.lineage_topic);
    let events = match flags.shard {
        Some(shard) => format!(
            "Shard {shard}: only inserts into the outbox tables whose key (else id) hashes to {}",
            shard.index
        ),
        None => "Only inserts into the outbox tables are events".to_owned(),
    };
    let statement = |wanted: fn(&Step) -> bool| {
        let step = steps.iter().find(|step| wanted(step));
        step.and_then(|step| step.sql(&flags.slot))
            .unwrap_or_default()
    };
    let create_publication = statement(|s| matches!(s, Step::CreatePublication(_)));
    let create_slot = statement(|s| matches!(s, Step::CreateSlot { .. }));
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
    )
}

/// Creates what is missing through the relay's own start-up, and says what it did.
pub(super) async fn apply(config: &Config) -> Result<(), CommandError> {
    let connector = Connector::new(config.postgres.clone());
    let wanted = Wanted::new(config);
    let started = startup::start(&wanted, &connector, &super::kafka(config)).await?;
    let publication = match &started.publication_created {
        Some(statement) => format!("created: {statement}"),
        None => "exists and covers the outbox tables; kept".to_owned(),
    };
    let at = started.confirmed_flush;
    let slot = match started.slot_created {
        true => format!("created at {at} (it keeps WAL from here until a relay confirms it)"),
        false => format!("exists (confirmed up to {at}); kept"),
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "publication {:?}: {publication}", wanted.publication)?;
    writeln!(out, "slot {:?}: {slot}", wanted.slot)?;
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
        let steps = checks::setup_steps("p", &tables, &[], false);
        let script = script(&cli.flags, &tables, &steps);
        assert!(
            script.contains(&format!(
                "{};\n",
                crate::postgres::sql::create_publication("p", &tables, &[])
            )),
            "{script}"
        );
        assert!(
            script.contains(&format!(
                "{};\n",
                crate::postgres::sql::create_slot("s", false)
            )),
            "{script}"
        );
        let topic =
            "--create --topic outbox-relay.lineage --partitions 1 --config cleanup.policy=compact";
        assert!(script.contains(topic), "{script}");
    }

    #[test]
    fn print_reads_the_server_only_for_a_shard_of_tables_and_needs_its_url_then() {
        let flags = |shard: &[&str]| {
            let args = [&["outbox-relay"][..], shard].concat();
            Cli::try_parse_global_from(args).unwrap().flags
        };
        let tables = [TableName::parse("public.outbox").unwrap()];
        let sharded = flags(&["--shard", "0/2"]);
        assert_eq!(reads_server(&flags(&[]), &tables, false), Ok(false));
        assert_eq!(reads_server(&sharded, &[], false), Ok(false));
        assert_eq!(reads_server(&sharded, &tables, true), Ok(true));
        let refused = reads_server(&sharded, &tables, false).unwrap_err();
        assert!(refused.contains("give --postgres-url"), "{refused}");
    }
}
