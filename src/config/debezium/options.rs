//! PURE: what each Debezium Postgres connector and Kafka Connect option the import does not
//! turn into a flag does to the records. Every option of Debezium 3.6.3's Postgres connector and
//! of Kafka Connect's source connector config is classified here or imported as a flag (the
//! unit test reads the list the fixture script extracts from their jars,
//! `tests/fixtures/debezium-records/options.json`): it has no effect on the records (and
//! `--explain` says why), the relay behaves differently outside the records' bytes (a warning
//! says how), or it would change bytes the relay does not reproduce (refused by name).

/// What an option does to the records the relay makes, and so what the import does with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Class {
    /// The records are the same with or without it; why.
    NoEffect(String),
    /// The relay behaves differently, but not in the records' bytes; how.
    Differs(String),
    /// It changes records in a way the relay does not reproduce; why, and what to do.
    Refused(String),
}

/// What the router reads: options that select columns matter only for these.
#[derive(Clone, Copy, Debug)]
pub struct Reads<'a> {
    /// The outbox tables, `schema.table`.
    pub tables: &'a [String],
    /// The columns the router reads (route, key, id, payload, placed, timestamp, version,
    /// trace).
    pub columns: &'a [String],
}

fn no_effect(why: &str) -> Option<Class> {
    Some(Class::NoEffect(why.to_owned()))
}

fn differs(how: &str) -> Option<Class> {
    Some(Class::Differs(how.to_owned()))
}

fn refused(why: &str) -> Option<Class> {
    Some(Class::Refused(why.to_owned()))
}

const SNAPSHOT: &str = "the relay never snapshots: it relays the inserts it streams";
const OPERATIONS: &str =
    "how Debezium runs (batching, retries, timeouts, metrics), not what it writes";
const UNSUPPORTED_TYPE: &str =
    "the relay refuses columns of that type at start-up, whatever the mode";
const ROUTED: &str =
    "the Outbox Event Router replaces it in every record (topic, key, value and headers)";

/// The class of `key` (with `value`) when it is an option of Debezium 3.6.3's Postgres
/// connector or of Kafka Connect that the import does not map to a flag; `None` otherwise.
pub fn classify(key: &str, value: &str, reads: Reads<'_>) -> Option<Class> {
    let value = value.trim();
    if let Some(class) = column_selection(key, value, reads) {
        return Some(class);
    }
    if let Some(class) = connect_option(key, value) {
        return Some(class);
    }
    connection_option(key, value)
        .or_else(|| event_option(key, value))
        .or_else(|| stream_option(key, value))
        .or_else(|| schema_option(key, value))
}

/// The connection, slot and position options.
fn connection_option(key: &str, value: &str) -> Option<Class> {
    let set = !value.is_empty();
    match key {
        "database.query.timeout.ms"
        | "database.tcpKeepAlive"
        | "connection.validation.timeout.ms" => no_effect(OPERATIONS),
        "database.initial.statements" => no_effect(
            "statements on Debezium's JDBC sessions, which do not reach the replication stream; pass session settings to the relay in --postgres-url if it needs them",
        ),
        "database.sslpassword" | "database.sslfactory" if set => differs(
            "the relay takes an unencrypted database.sslkey and its own TLS settings in --postgres-url; decrypt the key (openssl pkcs8) or use sslmode without client keys",
        ),
        "database.sslpassword" | "database.sslfactory" => no_effect("unset"),
        "replica.identity.autoset.values" => no_effect(
            "replica identity shapes updates and deletes; the relay relays inserts, whose rows are whole under any replica identity",
        ),
        "slot.failover" if value.eq_ignore_ascii_case("true") => differs(
            "add --slot-failover (PostgreSQL 17 and later): the relay creates its slot with FAILOVER only when told",
        ),
        "slot.failover" => no_effect("the slot is not a failover slot"),
        "status.update.interval.ms" => no_effect(OPERATIONS),
        "slot.drop.on.stop" if value.eq_ignore_ascii_case("true") => {
            differs("the relay never drops its slot (outbox-relay drop-slot does, on purpose)")
        }
        "slot.drop.on.stop" => no_effect("the slot is kept, as the relay keeps it"),
        "slot.stream.params" if set => refused(
            "options for the decoding plugin can change which changes arrive (origin=none drops replicated ones); the relay passes none: remove it",
        ),
        "slot.stream.params" => no_effect("unset"),
        "slot.max.retries"
        | "slot.retry.delay.ms"
        | "lsn.flush.timeout.ms"
        | "lsn.flush.timeout.action"
        | "xmin.fetch.interval.ms"
        | "lsn.flush.mode"
        | "retriable.restart.connector.wait.ms"
        | "errors.max.retries"
        | "poll.interval.ms"
        | "max.batch.size"
        | "max.queue.size"
        | "max.queue.size.in.bytes"
        | "query.fetch.size"
        | "executor.shutdown.timeout.ms"
        | "internal.log.position.check.enable"
        | "internal.advanced.metrics.enable"
        | "statistics.metrics.enabled"
        | "custom.metric.tags"
        | "custom.sanitize.pattern"
        | "memory.management.schemas.class"
        | "memory.management.tables.class"
        | "schema.refresh.mode"
        | "guardrail.collections.max"
        | "guardrail.collections.limit.action" => no_effect(OPERATIONS),
        "flush.lsn.source" if value.eq_ignore_ascii_case("false") => differs(
            "Debezium never confirmed the slot's position, leaving that to something else; the relay confirms what Kafka acknowledged",
        ),
        "flush.lsn.source" => no_effect("the slot's position is confirmed, as the relay does"),
        _ => None,
    }
}

/// What Debezium does with events, transactions, messages and types.
fn event_option(key: &str, value: &str) -> Option<Class> {
    let set = !value.is_empty();
    match key {
        "skipped.operations" if value.split(',').any(|op| op.trim() == "c") => refused(
            "Debezium skipped inserts, so it wrote no outbox records at all; remove c from skipped.operations",
        ),
        "skipped.operations" => no_effect(
            "the relay relays inserts only; the other operations never became outbox records",
        ),
        "event.processing.failure.handling.mode" if !value.eq_ignore_ascii_case("fail") && set => {
            differs(
                "Debezium skipped an event it could not process; the relay stops on it (or dead-letters it with --on-poison dead-letter) and never skips silently",
            )
        }
        "event.processing.failure.handling.mode" => {
            no_effect("Debezium stopped on an event it could not process, as the relay does")
        }
        "provide.transaction.metadata" | "transaction.metadata.factory"
            if value.eq_ignore_ascii_case("true") =>
        {
            differs(
                "Debezium also wrote transaction BEGIN and END records to its transaction topic; the relay writes none",
            )
        }
        "provide.transaction.metadata" | "transaction.metadata.factory" => {
            no_effect("the router keeps no transaction block in outbox records")
        }
        "snapshot.delay.ms"
        | "streaming.delay.ms"
        | "snapshot.include.collection.list"
        | "snapshot.fetch.size"
        | "snapshot.max.threads"
        | "snapshot.max.threads.multiplier"
        | "legacy.snapshot.max.threads"
        | "snapshot.mode"
        | "snapshot.mode.custom.name"
        | "snapshot.lock.timeout.ms"
        | "snapshot.isolation.mode"
        | "snapshot.query.mode"
        | "snapshot.query.mode.custom.name"
        | "snapshot.locking.mode"
        | "snapshot.locking.mode.custom.name"
        | "snapshot.select.statement.overrides"
        | "snapshot.tables.order.by.row.count"
        | "incremental.snapshot.chunk.size"
        | "incremental.snapshot.watermarking.strategy"
        | "internal.snapshot.scan.all.columns.force"
        | "signal.data.collection"
        | "signal.poll.interval.ms"
        | "signal.enabled.channels" => no_effect(SNAPSHOT),
        k if k.starts_with("snapshot.mode.configuration.based.") => no_effect(SNAPSHOT),
        k if k.starts_with("openlineage.") => {
            no_effect("lineage events go to OpenLineage, not to the outbox topics")
        }
        _ => None,
    }
}

/// Notifications, messages, types Debezium handles in modes, and other stream options.
fn stream_option(key: &str, value: &str) -> Option<Class> {
    let set = !value.is_empty();
    match key {
        "notification.enabled.channels" | "notification.sink.topic.name" => differs(
            "Debezium's notifications (snapshot progress) have no equivalent; the relay reports through its log and /metrics",
        ),
        "hstore.handling.mode"
        | "interval.handling.mode"
        | "money.fraction.digits"
        | "include.unknown.datatypes" => no_effect(UNSUPPORTED_TYPE),
        "unavailable.value.placeholder" => {
            no_effect("it stands for unchanged TOAST values, which only updates carry")
        }
        "message.prefix.include.list" | "message.prefix.exclude.list" => differs(
            "Debezium wrote logical decoding messages to its message topic, unrouted; the relay relays messages only as outbox events (--message-prefix)",
        ),
        "publish.via.partition.root" => no_effect(
            "how the publication sends a partitioned table's rows; the relay relays them as rows of the --table table either way",
        ),
        "converters" if set => refused(
            "Debezium's custom converters change how columns are read; the relay reproduces Debezium's own encodings only: remove them",
        ),
        "converters" => no_effect("unset"),
        "post.processors" if set => refused(
            "post processors (such as column reselection) change values the relay does not reproduce: remove them",
        ),
        "post.processors" => no_effect("unset"),
        "tombstones.on.delete" => {
            no_effect("the router drops deletes and their tombstones (table.op.invalid.behavior)")
        }
        "heartbeat.topics.prefix" => no_effect(
            "Debezium's heartbeat records, which go to their own topic; see heartbeat.interval.ms",
        ),
        _ => None,
    }
}

/// Topic naming, schema names and the rest of the connector's options.
fn schema_option(key: &str, value: &str) -> Option<Class> {
    let set = !value.is_empty();
    match key {
        "topic.naming.strategy"
            if value == "io.debezium.schema.SchemaTopicNamingStrategy"
                || value == "io.debezium.schema.DefaultTopicNamingStrategy" =>
        {
            no_effect(ROUTED)
        }
        "topic.naming.strategy" | "topic.delimiter" => refused(
            "it changes the raw topic Debezium names envelope schemas after (topic.prefix.schema.table.route.Value); the relay reproduces the default strategy and delimiter: remove it",
        ),
        "topic.cache.size" | "topic.heartbeat.prefix" | "topic.transaction" => no_effect(ROUTED),
        "table.exclude.list"
        | "table.blacklist"
        | "schema.include.list"
        | "schema.whitelist"
        | "schema.exclude.list"
        | "schema.blacklist"
        | "table.ignore.builtin" => {
            no_effect("the relay reads the --table tables (table.include.list)")
        }
        "message.key.columns" => no_effect("the router takes the key from table.field.event.key"),
        "sourceinfo.struct.maker" => {
            no_effect("the change event's source block, which the router drops")
        }
        "include.schema.comments" if value.eq_ignore_ascii_case("true") => refused(
            "column comments go into schemas (doc and __debezium.source.column.comment), which the relay does not read: remove it",
        ),
        "include.schema.comments" => no_effect("column comments stay out of schemas"),
        "schema.name.adjustment.mode" | "field.name.adjustment.mode"
            if set && !value.eq_ignore_ascii_case("none") =>
        {
            refused(
                "it renames schemas and fields for Avro; the relay reproduces field.name.adjustment.mode=none only: remove it",
            )
        }
        "schema.name.adjustment.mode" | "field.name.adjustment.mode" => {
            no_effect("names stay as they are")
        }
        "database.server.name" => {
            no_effect("Debezium 2 and later name topics and schemas by topic.prefix")
        }
        "tasks.max" => no_effect("a Postgres connector runs one task; run one relay per slot"),
        _ => None,
    }
}

/// Kafka Connect's own options for a source connector (not the converters and transforms,
/// which the import maps).
fn connect_option(key: &str, value: &str) -> Option<Class> {
    match key {
        "name" => no_effect("the connector's name in Kafka Connect"),
        "connector.plugin.version"
        | "key.converter.plugin.version"
        | "value.converter.plugin.version"
        | "header.converter.plugin.version"
        | "tasks.max.enforce"
        | "config.action.reload"
        | "errors.retry.timeout"
        | "errors.retry.delay.max.ms"
        | "errors.log.enable"
        | "errors.log.include.messages"
        | "offsets.storage.topic" => no_effect(OPERATIONS),
        "topic.creation.groups" => differs(
            "Kafka Connect created missing topics with topic.creation.* settings; the relay creates no topic: create them with the same partition counts first",
        ),
        k if k.starts_with("topic.creation.") => differs(
            "Kafka Connect created missing topics with these settings; the relay creates no topic: create them with the same settings first",
        ),
        "exactly.once.support" | "transaction.boundary" | "transaction.boundary.interval.ms"
            if !value.is_empty() =>
        {
            differs(
                "Kafka Connect's exactly-once source support; the relay's equivalent is --delivery exactly-once",
            )
        }
        k if k.starts_with("admin.override.") || k.starts_with("consumer.override.") => {
            no_effect("clients other than the producer that writes the records")
        }
        _ => None,
    }
}

/// Options whose regular expressions select columns: they change records only when they
/// select a column the router reads (or, for an include list, leave one out).
fn column_selection(key: &str, value: &str, reads: Reads<'_>) -> Option<Class> {
    let include = matches!(key, "column.include.list" | "column.whitelist");
    let masks = key.starts_with("column.mask.") || key.starts_with("column.truncate.to.");
    let exclude = matches!(key, "column.exclude.list" | "column.blacklist");
    if !(include || masks || exclude) {
        return None;
    }
    if value.is_empty() {
        return no_effect("unset");
    }
    let patterns: Vec<regex::Regex> = value
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .filter_map(|p| {
            regex::RegexBuilder::new(&format!("^(?:{p})$"))
                .case_insensitive(true)
                .build()
                .ok()
        })
        .collect();
    let selected = |column: &str| {
        reads.tables.iter().any(|table| {
            let name = format!("{table}.{column}");
            patterns.iter().any(|p| p.is_match(&name))
        })
    };
    let read: Vec<&str> = reads.columns.iter().map(String::as_str).collect();
    if include {
        return match read.iter().find(|c| !selected(c)) {
            None => no_effect("it includes every column the router reads"),
            Some(column) => Some(Class::Refused(format!(
                "it leaves out {column}, which the router reads: Debezium's events lacked it; include it, or remove the option"
            ))),
        };
    }
    match read.iter().find(|c| selected(c)) {
        None => no_effect("it selects none of the columns the router reads"),
        Some(column) => Some(Class::Refused(format!(
            "it changes or drops {column}, which the router reads, in a way the relay does not reproduce; remove the option or leave the outbox columns out of it"
        ))),
    }
}

#[cfg(test)]
mod tests;
