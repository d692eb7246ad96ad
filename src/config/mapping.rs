//! The mapping flags become a [`MappingConfig`]: the one every table uses, and each
//! overridden table's (`--table 'SCHEMA.TABLE:KEY=VALUE;...'`).

use clap::ArgMatches;

use super::tables::{Overrides, overridden};
use super::{Cli, ConfigError, Delivery, PostgresConnInfo, columns, invalid};
use crate::outbox::cloudevents::CloudEventsConfig;
use crate::outbox::{MappingConfig, TableName, TopicTemplate};

/// The mapping flags (before `--table`'s per-table overrides).
pub(super) fn mapping(
    cli: &Cli,
    postgres: &PostgresConnInfo,
) -> Result<MappingConfig, ConfigError> {
    let mut mapping = MappingConfig {
        route_by: cli.route_by.clone(),
        topic_template: cli.topic_template.clone(),
        key_column: cli.key_column.clone(),
        id_column: cli.id_column.clone(),
        payload_column: cli.payload_column.clone(),
        timestamp_column: cli.timestamp_column.clone().filter(|c| !c.is_empty()),
        header_columns: columns("--header-column", &cli.header_columns)?,
        cloudevents: cli.cloudevents.then(|| CloudEventsConfig {
            source: cli.cloudevents_source.clone().filter(|s| !s.is_empty()),
            database: postgres.dbname.clone(),
        }),
        connect: cli.format.connect(!cli.message_prefixes.is_empty())?,
    };
    if let Some(connect) = mapping.connect.as_mut() {
        connect.registry = cli.registry.format();
    }
    Ok(mapping)
}

/// Each table with `--table` overrides, and its mapping: `mapping` with them.
pub(super) fn table_mappings(
    cli: &Cli,
    table_overrides: Overrides<'_>,
    mapping: &MappingConfig,
) -> Result<Vec<(TableName, MappingConfig)>, ConfigError> {
    let table_mappings = table_overrides.into_iter().map(|(table, raw)| {
        let given = overridden(raw)?;
        Ok((table, routed(cli, &given, mapping)))
    });
    table_mappings.collect()
}

/// `base` with one table's values of the per-table flags: those its overrides give (`table`,
/// from [`overridden`], by the flags' ids), else the flags'. The converters' state,
/// such as the Schema Registry ids, stays shared with `base`.
fn routed(cli: &Cli, table: &ArgMatches, base: &MappingConfig) -> MappingConfig {
    let text = |id: &str, flag: &String| table.get_one::<String>(id).unwrap_or(flag).clone();
    let topic_template = table.get_one::<TopicTemplate>("topic_template");
    let timestamp_column = table.get_one::<String>("timestamp_column");
    let timestamp_column = timestamp_column.or(cli.timestamp_column.as_ref());
    MappingConfig {
        route_by: text("route_by", &cli.route_by),
        topic_template: topic_template.unwrap_or(&cli.topic_template).clone(),
        key_column: text("key_column", &cli.key_column),
        id_column: text("id_column", &cli.id_column),
        payload_column: text("payload_column", &cli.payload_column),
        timestamp_column: timestamp_column.filter(|c| !c.is_empty()).cloned(),
        ..base.clone()
    }
}

/// PURE: `--partition-column` places a record by a column's value, while `--delivery
/// exactly-once` pins each record to its key's partition (as the Java client hashes it) and
/// reads replays back there: the column would be overridden, so the two are refused together.
pub(super) fn refuse_partition_column_with_exactly_once<'a>(
    delivery: Delivery,
    mappings: impl IntoIterator<Item = &'a MappingConfig>,
) -> Result<(), ConfigError> {
    if delivery != Delivery::ExactlyOnce {
        return Ok(());
    }
    let connect = mappings.into_iter().filter_map(|m| m.connect.as_ref());
    let Some(column) = connect.filter_map(|c| c.partition_column.clone()).next() else {
        return Ok(());
    };
    let reason = "cannot be combined with --delivery exactly-once, which places each record in \
                  its key's partition (murmur2, as the Java client) and finds replays there: \
                  the column's partition would be overridden. Drop --partition-column, or use \
                  --delivery at-least-once";
    Err(invalid("--partition-column", column, reason))
}
