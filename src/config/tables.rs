//! `--table`: the outbox tables in flag order, each with its per-table overrides of the
//! mapping flags. Which flags a table may override is declared once, in [`PerTable`] (grouped
//! in `--help` under [`super::heading::PER_TABLE`]); the override's key is the flag's name, and
//! its value is parsed by the flag's own parser.

use clap::{Arg, ArgMatches, Args, Command};

use super::{Cli, ConfigError, PerTable, invalid};
use crate::outbox::TableName;

/// The `--table` values: the tables in flag order (`none` means none, for a table-less outbox)
/// and each table's raw overrides. Without a table or a `--message-prefix`, nothing is relayed.
pub(super) fn parse_tables(cli: &Cli) -> Result<(Vec<TableName>, Overrides<'_>), ConfigError> {
    let mut tables = Vec::new();
    let mut overridden = Vec::new();
    for raw in &cli.tables {
        let (name, overrides) = raw.split_once(':').unwrap_or((raw.as_str(), ""));
        if name == "none" {
            continue;
        }
        let table = TableName::parse(name).map_err(|reason| invalid("--table", raw, reason))?;
        if !overrides.is_empty() {
            overridden.push((table.clone(), overrides));
        }
        if !tables.contains(&table) {
            tables.push(table);
        }
    }
    if cli.tables.iter().any(|t| t == "none") {
        tables.clear();
    }
    if tables.is_empty() && cli.message_prefixes.iter().all(String::is_empty) {
        let reason = "give at least one outbox table or --message-prefix";
        return Err(invalid("--table", "", reason));
    }
    Ok((tables, overridden))
}

/// Per-table overrides as written: each table and its `key=value;...` text.
pub(super) type Overrides<'a> = Vec<(TableName, &'a str)>;

/// The flags a `--table` may set for its own table: [`PerTable`]'s, which `--help` groups
/// under [`super::heading::PER_TABLE`]. A table's key for each is its long name.
pub fn per_table_flags() -> Vec<Arg> {
    let flags = PerTable::augment_args(Command::new("table"));
    flags.get_arguments().cloned().collect()
}

/// One table's overrides (`KEY=VALUE;KEY=VALUE`, as written), each value parsed by its
/// flag's own parser; only the keys given are present.
pub(super) fn overridden(overrides: &str) -> Result<ArgMatches, ConfigError> {
    let bad = |reason: String| invalid("--table", overrides, reason);
    let flags = per_table_flags();
    let keys: Vec<&str> = flags.iter().filter_map(Arg::get_long).collect();
    let mut args = Vec::new();
    for pair in overrides
        .split(';')
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        let Some((key, value)) = pair.split_once('=').filter(|(_, v)| !v.trim().is_empty()) else {
            return Err(bad(format!("override {pair:?} is not KEY=VALUE")));
        };
        let key = key.trim();
        if !keys.contains(&key) {
            let known = keys.join(", ");
            return Err(bad(format!("unknown override {key:?}; use one of {known}")));
        }
        args.push(format!("--{key}={}", value.trim()));
    }
    // Only what the table's text says: neither the flags' defaults nor their variables.
    let only_given = |arg: Arg| arg.default_value(None).env(None).global(false);
    let command = Command::new("table")
        .no_binary_name(true)
        .args_override_self(true)
        .args(flags.into_iter().map(only_given));
    let matches = command.try_get_matches_from(args);
    matches.map_err(|error| bad(clap_reason(&error)))
}

/// Why clap refused a value: the value parser's own words when it has them.
fn clap_reason(error: &clap::Error) -> String {
    if let Some(source) = std::error::Error::source(error) {
        return source.to_string();
    }
    let text = error.to_string();
    let first = text.lines().next().unwrap_or_default();
    first.trim_start_matches("error: ").to_owned()
}
