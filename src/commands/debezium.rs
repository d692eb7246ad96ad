//! `debezium-config --explain FILE`: a Debezium import as a command line, with its warnings.

use std::io::Write;
use std::path::Path;

use super::CommandError;
use crate::config::{DebeziumConfigArgs, debezium};
use crate::observability::Chain;

/// Prints the import (with the worker's properties from `worker`); a refusal is printed alone,
/// so it carries its causes.
pub(super) fn run(args: &DebeziumConfigArgs, worker: Option<&Path>) -> Result<(), CommandError> {
    let imported = debezium::import_file(&args.explain, worker)
        .map_err(|e| CommandError::Refused(Chain(&e).to_string()))?;
    writeln!(std::io::stdout().lock(), "{}", debezium::explain(&imported))?;
    Ok(())
}
