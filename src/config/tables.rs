//! `--table`: the outbox tables in flag order, each with its per-table overrides of the
//! mapping flags.

use super::{Cli, ConfigError, invalid};
use crate::outbox::{MappingConfig, TableName, TopicTemplate};

/// The `--table` values: the tables in flag order (`none` means none, for a table-less outbox)
/// and each table's raw overrides. Without a table or a `--message-prefix`, nothing is relayed.
pub(super) fn parse_tables(cli: &Cli) -> Result<(Vec<TableName>, Overrides<'_>), ConfigError> {
    let (mut tables, mut overridden) = (Vec::new(), Vec::new());
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

/// Applies one table's `key=value;key=value` overrides (as written) to the global mapping.
pub(super) fn apply_overrides(
    base: &MappingConfig,
    overrides: &str,
) -> Result<MappingConfig, ConfigError> {
    let mut m = base.clone();
    let bad = |reason| invalid("--table", overrides, reason);
    let pairs = overrides.split(';').map(str::trim);
    for pair in pairs.filter(|p| !p.is_empty()) {
        let Some((key, value)) = pair.split_once('=').filter(|(_, v)| !v.trim().is_empty()) else {
            return Err(bad(format!("override {pair:?} is not KEY=VALUE")));
        };
        let value = value.trim().to_owned();
        match key.trim() {
            "route-by" => m.route_by = value,
            "topic-template" => m.topic_template = TopicTemplate::parse(&value).map_err(bad)?,
            "key-column" => m.key_column = value,
            "id-column" => m.id_column = value,
            "payload-column" => m.payload_column = value,
            "timestamp-column" => m.timestamp_column = Some(value),
            other => {
                return Err(bad(format!(
                    "unknown override {other:?}; use route-by, topic-template, key-column, \
                     id-column, payload-column or timestamp-column"
                )));
            }
        }
    }
    Ok(m)
}
