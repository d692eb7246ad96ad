//! The mapping flags become a [`MappingConfig`]: the one every table uses, and each
//! overridden table's (`--table 'SCHEMA.TABLE:KEY=VALUE;...'`).

use clap::builder::NonEmptyStringValueParser;
use clap::{ArgMatches, Args, FromArgMatches};

use super::tables::{Overrides, overridden};
use super::{Cli, ConfigError, Delivery, PostgresConnInfo, columns, heading, invalid};
use crate::outbox::cloudevents::CloudEventsConfig;
use crate::outbox::{MappingConfig, TableName, TopicTemplate};

/// The flags a `--table` may set for its own table (its key for each is the long name): one
/// declaration gives the flag, its variable, the table's key and the docs.
#[derive(Args, Debug, Clone)]
pub struct PerTable {
    /// Column whose value routes the event (`${routedByValue}`). Debezium: route.by.field.
    #[arg(help_heading = heading::PER_TABLE)]
    #[arg(long, env = "OUTBOX_RELAY_ROUTE_BY", default_value = "event_type", value_parser = NonEmptyStringValueParser::new())]
    pub route_by: String,
    /// Topic name template: `${routedByValue}` is the --route-by value, `${COLUMN}` any column.
    #[arg(help_heading = heading::PER_TABLE)]
    #[arg(long, env = "OUTBOX_RELAY_TOPIC_TEMPLATE", default_value = "${routedByValue}", value_parser = TopicTemplate::parse)]
    pub topic_template: TopicTemplate,
    /// Column whose text is the record key (NULL: null key). Debezium: table.field.event.key.
    #[arg(help_heading = heading::PER_TABLE)]
    #[arg(long, env = "OUTBOX_RELAY_KEY_COLUMN", default_value = "aggregate_id", value_parser = NonEmptyStringValueParser::new())]
    pub key_column: String,
    /// Column whose text is the `id` header, the dedupe key. Debezium: table.field.event.id.
    #[arg(help_heading = heading::PER_TABLE)]
    #[arg(long, env = "OUTBOX_RELAY_ID_COLUMN", default_value = "id", value_parser = NonEmptyStringValueParser::new())]
    pub id_column: String,
    /// Column becoming the record value (NULL: a tombstone). Debezium: table.field.event.payload.
    #[arg(help_heading = heading::PER_TABLE)]
    #[arg(long, env = "OUTBOX_RELAY_PAYLOAD_COLUMN", default_value = "payload", value_parser = NonEmptyStringValueParser::new())]
    pub payload_column: String,
    /// Column holding the record timestamp (default: the commit time).
    #[arg(help_heading = heading::PER_TABLE)]
    #[arg(long, env = "OUTBOX_RELAY_TIMESTAMP_COLUMN")]
    pub timestamp_column: Option<String>,
}

/// The mapping flags (before `--table`'s per-table overrides).
pub(super) fn mapping(
    cli: &Cli,
    postgres: &PostgresConnInfo,
) -> Result<MappingConfig, ConfigError> {
    let mut mapping = MappingConfig {
        route_by: cli.mapping.route_by.clone(),
        topic_template: cli.mapping.topic_template.clone(),
        key_column: cli.mapping.key_column.clone(),
        id_column: cli.mapping.id_column.clone(),
        payload_column: cli.mapping.payload_column.clone(),
        timestamp_column: cli
            .mapping
            .timestamp_column
            .clone()
            .filter(|c| !c.is_empty()),
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
        let routed = routed(cli, &given, mapping);
        Ok((
            table,
            routed.map_err(|e| invalid("--table", raw, e.to_string()))?,
        ))
    });
    table_mappings.collect()
}

/// `base` with one table's values of the per-table flags: those its overrides give (`table`,
/// from [`overridden`]), else the flags'. The converters' state,
/// such as the Schema Registry ids, stays shared with `base`.
fn routed(
    cli: &Cli,
    table: &ArgMatches,
    base: &MappingConfig,
) -> Result<MappingConfig, clap::Error> {
    let mut flags = cli.mapping.clone();
    // Sets only the fields whose ids `table` holds (it has no defaults nor variables).
    flags.update_from_arg_matches(table)?;
    let PerTable {
        route_by,
        topic_template,
        key_column,
        id_column,
        payload_column,
        timestamp_column,
    } = flags;
    Ok(MappingConfig {
        route_by,
        topic_template,
        key_column,
        id_column,
        payload_column,
        timestamp_column: timestamp_column.filter(|c| !c.is_empty()),
        ..base.clone()
    })
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
