//! `debezium-config --explain FILE`: the command line a Debezium connector
//! configuration imports as (see [`crate::config::debezium`]), with what does
//! not carry over.

use std::error::Error;
use std::io::Write;

use super::CommandError;
use crate::config::DebeziumConfigArgs;
use crate::config::debezium;

/// `debezium-config --explain FILE`.
pub(super) fn run(args: &DebeziumConfigArgs) -> Result<(), CommandError> {
    let imported = debezium::import_file(&args.explain).map_err(|e| {
        // The refusal is printed alone, so it carries the causes.
        let chain = std::iter::successors(Some(&e as &dyn Error), |e| (*e).source());
        CommandError::Refused(
            chain
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(": "),
        )
    })?;
    writeln!(std::io::stdout().lock(), "{}", debezium::explain(&imported))?;
    Ok(())
}
