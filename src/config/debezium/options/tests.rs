use super::*;

const OPTIONS: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/debezium-records/options.json"
));

/// The options the import turns into flags (or handles on its own) rather than classifying.
const IMPORTED: [&str; 30] = [
    "connector.class",
    "topic.prefix",
    "database.hostname",
    "database.port",
    "database.user",
    "database.password",
    "database.dbname",
    "database.sslmode",
    "database.sslcert",
    "database.sslrootcert",
    "database.sslkey",
    "plugin.name",
    "slot.name",
    "publication.name",
    "publication.autocreate.mode",
    "extended.headers.enabled",
    "decimal.handling.mode",
    "time.precision.mode",
    "binary.handling.mode",
    "column.propagate.source.type",
    "datatype.propagate.source.type",
    "table.include.list",
    "heartbeat.interval.ms",
    "heartbeat.action.query",
    "key.converter",
    "value.converter",
    "header.converter",
    "transforms",
    "predicates",
    "errors.tolerance",
];

/// A key for an option the jar names by pattern (`column.mask.with.(d+).chars`).
fn example(name: &str) -> String {
    name.replace("([^.]+)", "SHA-256")
        .replace("(.+)", "salt")
        .replace("(d+)", "10")
}

/// Every option Debezium 3.6.3's Postgres connector and Kafka Connect's source connector config
/// define (the list generate.sh extracts from their jars) is imported as a flag or classified,
/// at its default and at a value that changes records where there is one.
#[test]
fn every_option_of_debezium_and_kafka_connect_is_imported_or_classified() {
    let options: serde_json::Value = serde_json::from_str(OPTIONS).unwrap();
    let mut names = Vec::new();
    for group in ["connector", "connect"] {
        let group = options[group].as_object().unwrap();
        names.extend(group.iter().map(|(name, default)| {
            let default = default.as_str().unwrap_or_default().to_owned();
            (example(name), default)
        }));
    }
    assert!(names.len() > 140, "{} options", names.len());
    let reads = Reads {
        tables: &["public.outbox".to_owned()],
        columns: &["aggregateid".to_owned()],
    };
    let unclassified: Vec<&str> = (names.iter())
        .filter(|(name, _)| !IMPORTED.contains(&name.as_str()))
        .filter(|(name, default)| classify(name, default, reads).is_none())
        .map(|(name, _)| name.as_str())
        .collect();
    assert!(unclassified.is_empty(), "not classified: {unclassified:?}");
}

/// One row per decision whose class depends on the value or on what the router reads.
#[test]
fn values_that_change_records_are_refused_and_the_rest_say_why() {
    let tables = ["public.outbox".to_owned()];
    let columns = ["aggregateid".to_owned(), "payload".to_owned()];
    let reads = Reads {
        tables: &tables,
        columns: &columns,
    };
    let class = |key: &str, value: &str| match classify(key, value, reads) {
        Some(Class::NoEffect(_)) => "no effect",
        Some(Class::Differs(_)) => "differs",
        Some(Class::Refused(_)) => "refused",
        None => "unknown",
    };
    for (key, value, expected) in [
        ("skipped.operations", "t,d", "no effect"),
        ("skipped.operations", "c", "refused"),
        ("column.mask.with.10.chars", "public.users.ssn", "no effect"),
        (
            "column.mask.with.10.chars",
            "public.outbox.aggregateid",
            "refused",
        ),
        (
            "column.truncate.to.3.chars",
            "PUBLIC.OUTBOX.PAYLOAD",
            "refused",
        ),
        (
            "column.mask.hash.SHA-256.with.salt.x",
            "public\\.outbox\\..*",
            "refused",
        ),
        (
            "column.exclude.list",
            "public.outbox.tracingspancontext",
            "no effect",
        ),
        ("column.exclude.list", "public.outbox.payload", "refused"),
        (
            "column.include.list",
            "public.outbox.(aggregateid|payload)",
            "no effect",
        ),
        (
            "column.include.list",
            "public.outbox.aggregateid",
            "refused",
        ),
        ("include.schema.comments", "true", "refused"),
        ("include.schema.comments", "false", "no effect"),
        ("field.name.adjustment.mode", "avro", "refused"),
        ("schema.name.adjustment.mode", "none", "no effect"),
        ("topic.delimiter", "_", "refused"),
        (
            "topic.naming.strategy",
            "io.debezium.schema.SchemaTopicNamingStrategy",
            "no effect",
        ),
        ("converters", "isbn", "refused"),
        ("post.processors", "reselector", "refused"),
        ("slot.stream.params", "origin=none", "refused"),
        ("provide.transaction.metadata", "true", "differs"),
        ("event.processing.failure.handling.mode", "skip", "differs"),
        ("slot.failover", "true", "differs"),
        ("topic.creation.default.partitions", "12", "differs"),
        ("snapshot.mode", "initial", "no effect"),
        ("not.an.option", "x", "unknown"),
    ] {
        assert_eq!(class(key, value), expected, "{key}={value}");
    }
}
