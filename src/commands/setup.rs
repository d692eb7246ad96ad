//! `outbox-relay setup [--print]`: the publication and the slot the relay
//! streams from, created ahead of time (by a DBA, say) or printed for review.
//!
//! Both paths use [`crate::source::sql`] for the statements, and applying
//! goes through the relay's own start-up ([`setup::prepare`]): the same
//! checks, the same "skip what exists".

use std::io::Write;

use super::CommandError;
use crate::config::{Cli, Config, SetupArgs, SetupTarget};
use crate::source::{setup, sql};

pub(super) fn run(cli: &Cli, args: &SetupArgs) -> Result<(), CommandError> {
    if args.print {
        let target = SetupTarget::from_cli(cli)?;
        let mut out = std::io::stdout().lock();
        out.write_all(print(&target).as_bytes())?;
        return Ok(());
    }
    let config = Config::from_cli(cli)?;
    super::block_on(apply(&config))?
}

/// The SQL `setup` would run, as a script.
pub fn print(target: &SetupTarget) -> String {
    let tables: Vec<String> = target.tables.iter().map(ToString::to_string).collect();
    format!(
        "-- outbox-relay setup: publication {publication:?} for {tables}, slot {slot:?}.\n\
         -- Run as a role with REPLICATION (or superuser) in the outbox database;\n\
         -- skip a statement whose object already exists.\n\
         \n\
         -- Only inserts into the outbox tables are events.\n\
         {create_publication};\n\
         \n\
         -- The slot keeps WAL from now until a relay confirms it: create it shortly\n\
         -- before the relay first starts (or let the relay create it).\n\
         {create_slot};\n\
         \n\
         -- Records that the relay streams from this slot, so that after a failover to a\n\
         -- server without it the relay stops instead of starting over from \"now\".\n\
         {create_record};\n",
        publication = target.publication,
        slot = target.slot,
        tables = tables.join(", "),
        create_publication = sql::create_publication(&target.publication, &target.tables),
        create_slot = sql::create_slot(&target.slot, false),
        create_record = crate::source::lineage::CREATE_TABLE,
    )
}

async fn apply(config: &Config) -> Result<(), CommandError> {
    let client = setup::connect(config).await?;
    let had_publication = client
        .query_opt(
            "SELECT 1 FROM pg_publication WHERE pubname = $1",
            &[&config.publication],
        )
        .await
        .map_err(setup::query_err("look up the publication"))?
        .is_some();
    let slot = setup::prepare(&client, config).await?;
    let mut out = std::io::stdout().lock();
    if had_publication {
        writeln!(
            out,
            "publication {:?}: exists and covers the outbox tables; kept",
            config.publication
        )?;
    } else {
        writeln!(
            out,
            "publication {:?}: created: {}",
            config.publication,
            sql::create_publication(&config.publication, &config.tables)
        )?;
    }
    if slot.created {
        writeln!(
            out,
            "slot {:?}: created at {} (it keeps WAL from here until a relay confirms it)",
            config.slot, slot.confirmed_flush
        )?;
    } else {
        writeln!(
            out,
            "slot {:?}: exists (confirmed up to {}); kept",
            config.slot, slot.confirmed_flush
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::TableName;

    #[test]
    fn printed_script_is_the_statements_setup_runs() {
        let target = SetupTarget {
            tables: vec![TableName::parse("public.outbox").unwrap()],
            slot: "s".to_owned(),
            publication: "p".to_owned(),
        };
        let script = print(&target);
        assert!(
            script.contains(&format!(
                "{};\n",
                sql::create_publication("p", &target.tables)
            )),
            "{script}"
        );
        assert!(
            script.contains(&format!("{};\n", sql::create_slot("s", false))),
            "{script}"
        );
    }
}
