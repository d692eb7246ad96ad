use std::collections::BTreeMap;
use std::path::Path;

use clap::Parser;

use super::*;
use crate::config::{Cli, Config};
use crate::outbox::connect::columns::TimePrecision;
use crate::outbox::connect::registry::Lookup;
use crate::outbox::connect::{Converter, HeaderConverter};

const BASIC: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/debezium/basic-outbox.json"
));
const CUSTOM: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/debezium/custom-routing.json"
));
const SECRETS: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/debezium/secrets-zstd.properties"
));

fn import(config: &BTreeMap<String, String>) -> Result<Imported, DebeziumError> {
    import_with(config, None)
}

fn import_fixture(path: &str, text: &str) -> Imported {
    let format = detect_format(Path::new(path), text);
    import(&parse(text, format).unwrap()).unwrap()
}

fn args(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(f, v)| ((*f).to_owned(), (*v).to_owned()))
        .collect()
}

/// Asserts that each option is listed as having no effect on the records, with why.
fn assert_no_effect(imported: &Imported, keys: &[&str]) {
    for key in keys {
        assert!(
            (imported.no_effect.iter())
                .any(|o| o.starts_with(&format!("{key}=")) && o.contains(": ")),
            "{key} is not listed as without effect: {:?}",
            imported.no_effect
        );
    }
}

/// Asserts `--explain` lists nowhere Debezium itself stops.
fn assert_no_stops(imported: &Imported) {
    assert!(
        imported.debezium_stops.is_empty(),
        "{:?}",
        imported.debezium_stops
    );
}

/// Asserts one warning mentions every needle.
fn assert_warned(imported: &Imported, needles: &[&str]) {
    assert!(
        imported
            .warnings
            .iter()
            .any(|w| needles.iter().all(|n| w.contains(n))),
        "no warning mentions all of {needles:?}:\n{}",
        imported.warnings.join("\n")
    );
}

/// The imported flags must pass the relay's own validation.
fn assert_valid_for_relay(imported: &Imported) -> Config {
    let mut argv = vec!["outbox-relay".to_owned()];
    if !imported.args.iter().any(|(f, _)| f == "--kafka-brokers") {
        argv.extend(["--kafka-brokers".to_owned(), "127.0.0.1:9092".to_owned()]);
    }
    for (flag, value) in &imported.args {
        argv.push(flag.clone());
        argv.push(value.clone());
    }
    let cli = Cli::try_parse_from(argv).unwrap();
    Config::from_cli(&cli).unwrap()
}

fn config(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut map: BTreeMap<String, String> = [
        (
            "connector.class",
            "io.debezium.connector.postgresql.PostgresConnector",
        ),
        ("database.hostname", "db"),
        ("database.user", "u"),
        ("database.dbname", "app"),
        ("topic.prefix", "app"),
        ("plugin.name", "pgoutput"),
        ("table.include.list", "public.outbox"),
        ("transforms", "outbox"),
        (
            "transforms.outbox.type",
            "io.debezium.transforms.outbox.EventRouter",
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    for (k, v) in pairs {
        map.insert((*k).to_owned(), (*v).to_owned());
    }
    map
}

#[test]
fn basic_outbox_example_gets_debeziums_defaults_spelled_out() {
    let imported = import_fixture("basic-outbox.json", BASIC);
    assert_eq!(
        imported.args,
        args(&[
            (
                "--postgres-url",
                "postgres://postgres:postgres@postgres:5432/orderdb"
            ),
            ("--table", "inventory.outboxevent"),
            ("--slot", "debezium"),
            ("--publication", "dbz_publication"),
            ("--key-converter", "json-with-schemas"),
            ("--value-converter", "json-with-schemas"),
            ("--debezium-topic-prefix", "dbserver1"),
            ("--debezium-context-headers", "true"),
            ("--route-by", "aggregatetype"),
            ("--topic-template", "outbox.event.${routedByValue}"),
            ("--key-column", "aggregateid"),
            ("--id-column", "id"),
            ("--payload-column", "payload"),
        ])
    );
    assert_warned(&imported, &["--kafka-brokers", "bootstrap.servers"]);
    assert_warned(
        &imported,
        &["publication.autocreate.mode=all_tables", "dbz_publication"],
    );
    assert_warned(&imported, &["table.field.event.timestamp", "commit time"]);
    assert_warned(&imported, &["key.converter", "sample worker config"]);
    assert_no_effect(
        &imported,
        &["schema.include.list", "tasks.max", "tombstones.on.delete"],
    );
    assert!(
        imported
            .identical
            .contains(&format!("value.converter={}", JSON_CONVERTER))
    );
    let config = assert_valid_for_relay(&imported);
    assert_eq!(config.mapping.route_by, "aggregatetype");
    assert_eq!(config.postgres.password.as_deref(), Some("postgres"));
}

#[test]
fn custom_routing_example_maps_placements_and_expansion() {
    let imported = import_fixture("custom-routing.json", CUSTOM);
    assert_eq!(
        imported.args,
        args(&[
            (
                "--postgres-url",
                "postgres://debezium:p%40ss%3Aw%2Frd@orders-db.internal:5432/orders?sslmode=disable"
            ),
            ("--table", "public.outbox"),
            ("--slot", "orders_outbox"),
            ("--publication", "orders_outbox"),
            ("--key-converter", "string"),
            ("--value-converter", "json"),
            ("--debezium-topic-prefix", "orders"),
            ("--debezium-context-headers", "true"),
            ("--route-by", "event_type"),
            ("--topic-template", "${routedByValue}.events"),
            ("--key-column", "aggregate_id"),
            ("--id-column", "id"),
            ("--payload-column", "payload"),
            ("--timestamp-column", "timestamp"),
            ("--header-column", "type:eventType"),
            ("--envelope-column", "aggregatetype:aggregateType"),
            ("--expand-json-payload", "true"),
            ("--heartbeat-interval", "10000ms"),
        ])
    );
    for option in [
        "key.converter=",
        "value.converter=",
        "table.fields.additional.placement=",
        "table.expand.json.payload=true",
    ] {
        assert!(
            imported.identical.iter().any(|o| o.contains(option)),
            "{option}: {:?}",
            imported.identical
        );
    }
    assert_warned(
        &imported,
        &[
            "errors.tolerance",
            "--on-poison dead-letter --dead-letter-topic orders-outbox-dlq",
        ],
    );
    assert_warned(&imported, &["heartbeat.interval.ms", "keepalive"]);
    assert_no_effect(&imported, &["snapshot.mode"]);
    // Converters in the connector config need no worker; a filtered publication no warning.
    assert!(
        !imported
            .warnings
            .iter()
            .any(|w| w.contains("key.converter"))
    );
    assert!(!imported.warnings.iter().any(|w| w.contains("all_tables")));
    let config = assert_valid_for_relay(&imported);
    assert_eq!(config.postgres.password.as_deref(), Some("p@ss:w/rd"));
    assert_eq!(config.mapping.header_columns[0].header, "eventType");
    let connect = config.mapping.connect.expect("the Debezium format");
    assert!(connect.expand_json_payload && connect.context_headers.is_some());
    assert_eq!(connect.envelope[0].header, "aggregateType");
}

#[test]
fn properties_example_keeps_the_secret_out_and_passes_producer_overrides() {
    let imported = import_fixture("secrets-zstd.properties", SECRETS);
    assert_eq!(
        imported.args,
        args(&[
            (
                "--postgres-url",
                "postgres://debezium@billing-db.internal:6543/billing"
            ),
            ("--table", "public.outbox"),
            ("--table", "billing.outbox_events"),
            ("--slot", "billing_outbox"),
            ("--publication", "billing_outbox"),
            ("--key-converter", "string"),
            ("--value-converter", "bytearray"),
            ("--debezium-topic-prefix", "billing"),
            ("--debezium-context-headers", "true"),
            ("--transform", "transforms=source"),
            ("--transform", "transforms.source.header=source"),
            (
                "--transform",
                "transforms.source.type=org.apache.kafka.connect.transforms.InsertHeader"
            ),
            ("--transform", "transforms.source.value.literal=billing"),
            ("--route-by", "aggregate_type"),
            ("--topic-template", "billing.${routedByValue}"),
            ("--key-column", "aggregate_id"),
            ("--id-column", "id"),
            ("--payload-column", "payload"),
            ("--timestamp-column", "created_at"),
            ("--tombstone-on-empty-payload", "true"),
            ("-X", "compression.type=zstd"),
            ("-X", "linger.ms=20"),
            ("-X", "message.max.bytes=2097152"),
            ("--heartbeat-interval", "10000ms"),
        ])
    );
    assert_warned(
        &imported,
        &[
            "database.password",
            "config-provider",
            "--postgres-password-file",
        ],
    );
    assert!(
        imported
            .identical
            .iter()
            .any(|o| o == "transforms.source.value.literal=billing"),
        "{:?}",
        imported.identical
    );
    assert_warned(&imported, &["extended.headers.enabled"]);
    assert_warned(&imported, &["table.op.invalid.behavior=fatal"]);
    assert_warned(&imported, &["sasl.jaas.config", "sasl.username"]);
    assert_warned(&imported, &["max.request.size", "message.max.bytes"]);
    assert_warned(
        &imported,
        &["heartbeat.action.query", "heartbeat.interval.ms"],
    );
    assert_no_effect(&imported, &["snapshot.mode", "tasks.max"]);
    for w in &imported.warnings {
        assert!(!w.contains("not-a-real-secret"), "secret leaked: {w}");
        assert!(
            !w.contains("/secrets/pg.properties"),
            "reference leaked: {w}"
        );
    }
    assert!(
        !imported
            .warnings
            .iter()
            .any(|w| w.contains("value.converter"))
    );
    let config = assert_valid_for_relay(&imported);
    assert_eq!(config.postgres.password, None);
    assert_eq!(config.postgres.port, 6543);
}

#[test]
fn explain_prints_a_runnable_quoted_command_and_the_warnings() {
    let imported = import_fixture("custom-routing.json", CUSTOM);
    let text = explain(&imported);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "outbox-relay \\");
    assert!(lines.contains(&"  --topic-template '${routedByValue}.events' \\"));
    assert!(lines.contains(&"  --header-column type:eventType \\"));
    assert!(
        lines.contains(&"  --postgres-url 'postgres://debezium:p%40ss%3Aw%2Frd@orders-db.internal:5432/orders?sslmode=disable' \\")
    );
    let flag_lines = 1 + imported.args.len();
    assert!(lines[1..flag_lines - 1].iter().all(|l| l.ends_with(" \\")));
    assert!(!lines[flag_lines - 1].ends_with('\\'));
    assert!(lines[flag_lines..].iter().all(|l| l.starts_with('#')));
    assert_eq!(
        lines[flag_lines..].len(),
        imported.warnings.len()
            + imported.identical.len()
            + imported.no_effect.len()
            + imported.debezium_stops.len()
            + 3
            + usize::from(!imported.debezium_stops.is_empty()),
        "{text}"
    );
    assert!(
        text.contains("# - value.converter=org.apache.kafka.connect.json.JsonConverter: identical")
    );
    // A shell reads back exactly the imported flags.
    let words = shell_words::split(&lines[..flag_lines].join("\n")).unwrap();
    let expected = imported
        .args
        .iter()
        .flat_map(|(f, v)| [f.clone(), v.clone()]);
    assert_eq!(words[1..], expected.collect::<Vec<_>>());
    let quoted = explain(&Imported {
        no_effect: Vec::new(),
        debezium_stops: Vec::new(),
        args: args(&[("--slot", "it's"), ("--route-by", "")]),
        warnings: Vec::new(),
        identical: Vec::new(),
    });
    assert!(quoted.contains("--slot 'it'\\''s'"), "{quoted}");
    assert_eq!(
        shell_words::split(&quoted).unwrap()[1..],
        ["--slot", "it's", "--route-by", ""]
    );
}

fn parse_importing(args: &[&str]) -> Result<Cli, clap::Error> {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/debezium/custom-routing.json"
    );
    let imported = import_file(Path::new(fixture), None).unwrap();
    assert!(!imported.warnings.is_empty());
    let head = ["outbox-relay", "--debezium-config", fixture];
    let argv = head.iter().chain(args);
    Cli::try_parse_with(&imported, argv)
}

#[test]
fn imported_values_are_defaults_that_explicit_flags_replace() {
    // Explicit flags (before or after a subcommand) win; the rest comes from the file.
    let cli = parse_importing(&["--slot", "mine", "--kafka-brokers", "k:9092"]).unwrap();
    assert_eq!(cli.flags.slot, "mine");
    assert_eq!(cli.mapping.route_by, "event_type");
    assert_eq!(cli.flags.publication, "orders_outbox");
    assert_eq!(cli.header_columns, ["type:eventType"]);
    let cli = parse_importing(&[
        "status",
        "--publication",
        "p",
        "--table",
        "a.x",
        "--table",
        "b.y",
    ])
    .unwrap();
    assert_eq!(cli.flags.publication, "p");
    assert_eq!(cli.flags.slot, "orders_outbox");
    // An explicit repeatable flag replaces every imported value.
    assert_eq!(cli.tables, ["a.x", "b.y"]);
    let config =
        Config::from_cli(&parse_importing(&["--kafka-brokers", "k:9092"]).unwrap()).unwrap();
    assert_eq!(config.mapping.route_by, "event_type");
    assert_eq!(config.flags.slot, "orders_outbox");
    assert_eq!(config.postgres.password.as_deref(), Some("p@ss:w/rd"));
    // An imported value is checked like a typed one.
    let bad = Imported {
        no_effect: Vec::new(),
        debezium_stops: Vec::new(),
        args: args(&[("--heartbeat-interval", "soon")]),
        warnings: Vec::new(),
        identical: Vec::new(),
    };
    assert!(Cli::try_parse_with(&bad, ["outbox-relay"]).is_err());
}

#[test]
fn a_file_that_cannot_be_read_names_its_path() {
    let err = import_file(Path::new("/no/such/file.json"), None).unwrap_err();
    assert!(err.to_string().contains("/no/such/file.json"), "{err}");
    assert!(matches!(err.source, DebeziumError::Read(_)), "{err:?}");
}

#[test]
fn json_accepts_scalars_and_rejects_nesting() {
    let map = parse(
        r#"{"a": "x", "b": 5, "c": true, "d": null}"#,
        SourceFormat::Json,
    )
    .unwrap();
    assert_eq!(map.get("b").map(String::as_str), Some("5"));
    assert_eq!(map.get("c").map(String::as_str), Some("true"));
    assert!(!map.contains_key("d"));
    let err = parse(r#"{"a": [1]}"#, SourceFormat::Json).unwrap_err();
    assert!(matches!(err, DebeziumError::JsonValue(ref key) if key == "a"));
    let err = parse("[]", SourceFormat::Json).unwrap_err();
    assert!(matches!(err, DebeziumError::JsonShape));
    let err = parse("{\n  \"a\": \"x\",\n  \"b\" 1\n}", SourceFormat::Json).unwrap_err();
    assert!(
        matches!(err, DebeziumError::Json(ref e) if e.line() == 3),
        "{err:?}"
    );
    assert!(err.to_string().contains("line 3"), "{err}");
}

#[test]
fn properties_follow_java_syntax() {
    let text = "  # comment\n! also\n\na=1\nb : 2\nc 3\nd\\=e = f\\tg\nlong = one \\\n    two\\\\\nu=\\u00e9\nempty\n";
    let map = parse(text, SourceFormat::Properties).unwrap();
    let get = |k: &str| map.get(k).map(String::as_str);
    assert_eq!(get("a"), Some("1"));
    assert_eq!(get("b"), Some("2"));
    assert_eq!(get("c"), Some("3"));
    assert_eq!(get("d=e"), Some("f\tg"));
    assert_eq!(get("long"), Some("one two\\"));
    assert_eq!(get("u"), Some("é"));
    assert_eq!(get("empty"), Some(""));
    assert_eq!(map.len(), 7);
    let err = parse("a=1\nb=\\u12\n", SourceFormat::Properties).unwrap_err();
    assert!(
        matches!(err, DebeziumError::Properties(ref e) if e.line_number() == Some(2)),
        "{err:?}"
    );
    let err = parse("a=\\uD800\n", SourceFormat::Properties).unwrap_err();
    assert!(matches!(err, DebeziumError::Properties(ref e) if e.line_number() == Some(1)));
}

#[test]
fn format_is_detected_by_extension_then_content() {
    assert_eq!(
        detect_format(Path::new("c.json"), "a=b"),
        SourceFormat::Json
    );
    assert_eq!(
        detect_format(Path::new("c.PROPERTIES"), "{"),
        SourceFormat::Properties
    );
    assert_eq!(
        detect_format(Path::new("c"), "\u{feff}\n  {\"a\": 1}"),
        SourceFormat::Json
    );
    assert_eq!(
        detect_format(Path::new("-"), "a=b"),
        SourceFormat::Properties
    );
}

#[test]
fn wrong_connector_and_plugin_are_errors_that_say_what_to_do() {
    let err = import(&config(&[(
        "connector.class",
        "io.debezium.connector.mysql.MySqlConnector",
    )]))
    .unwrap_err();
    assert!(matches!(err, DebeziumError::Invalid { ref key, .. } if key == "connector.class"));
    assert!(err.to_string().contains("Postgres connector"), "{err}");
    for plugin in ["decoderbufs", "wal2json"] {
        let err = import(&config(&[("plugin.name", plugin)])).unwrap_err();
        assert!(matches!(err, DebeziumError::Invalid { ref key, .. } if key == "plugin.name"));
        assert!(err.to_string().contains("plugin.name=pgoutput"), "{err}");
    }
    let mut no_plugin = config(&[]);
    no_plugin.remove("plugin.name");
    let imported = import(&no_plugin).unwrap();
    assert_warned(&imported, &["plugin.name", "decoderbufs", "--slot"]);
    // Without pgoutput Debezium made no publication: no all_tables warning.
    assert!(!imported.warnings.iter().any(|w| w.contains("all_tables")));
}

#[test]
fn missing_required_keys_are_named() {
    for key in [
        "connector.class",
        "database.hostname",
        "database.user",
        "database.dbname",
        "table.include.list",
    ] {
        let mut map = config(&[]);
        map.remove(key);
        let err = import(&map).unwrap_err();
        assert!(
            matches!(err, DebeziumError::Missing { key: k, .. } if k == key),
            "{key}: {err:?}"
        );
    }
    let err = import(&config(&[("transforms", "")])).unwrap_err();
    assert!(matches!(err, DebeziumError::Invalid { ref key, .. } if key == "transforms"));
    let err = import(&config(&[("database.port", "x")])).unwrap_err();
    assert!(err.to_string().contains("database.port"), "{err}");
    let err = import(&config(&[("database.user", "${env:PGUSER}")])).unwrap_err();
    assert!(err.to_string().contains("config-provider"), "{err}");
}

#[test]
fn table_lists_accept_names_and_reject_regexes() {
    let imported = import(&config(&[(
        "table.include.list",
        r"public\.outbox, sales.Outbox ,outbox2",
    )]))
    .unwrap();
    let tables: Vec<&str> = imported
        .args
        .iter()
        .filter(|(f, _)| f == "--table")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(tables, ["public.outbox", "sales.Outbox", "outbox2"]);
    assert_warned(&imported, &["without a schema", "outbox2"]);
    assert_warned(&imported, &["case-insensitively", "sales.Outbox"]);
    for regex in [r"public\.outbox.*", "public.(a|b)", r"inventory\.outbox\d"] {
        let err = import(&config(&[("table.include.list", regex)])).unwrap_err();
        assert!(
            matches!(err, DebeziumError::Invalid { ref key, .. } if key == "table.include.list"),
            "{regex}"
        );
        assert!(err.to_string().contains("schema.table"), "{err}");
    }
    let imported = import(&config(&[
        ("table.include.list", ""),
        ("table.whitelist", "public.outbox"),
    ]))
    .unwrap();
    assert!(
        imported
            .args
            .contains(&("--table".into(), "public.outbox".into()))
    );
}

#[test]
fn topic_routing_converts_java_replacements_and_rejects_regex_routing() {
    let template = |pairs: &[(&str, &str)]| {
        import(&config(pairs)).map(|i| {
            i.args
                .into_iter()
                .find(|(f, _)| f == "--topic-template")
                .map(|(_, v)| v)
                .unwrap()
        })
    };
    assert_eq!(
        template(&[(
            "transforms.outbox.route.topic.replacement",
            r"ev.\$.${routedByValue}"
        )])
        .unwrap(),
        "ev.$$.${routedByValue}"
    );
    assert_eq!(
        template(&[
            ("transforms.outbox.route.topic.regex", "^(.*)$"),
            ("transforms.outbox.route.topic.replacement", "x.$1.$0"),
        ])
        .unwrap(),
        "x.${routedByValue}.${routedByValue}"
    );
    let imported = import(&config(&[
        ("transforms.outbox.route.topic.regex", "(.+)"),
        ("transforms.outbox.route.topic.replacement", "$1"),
    ]))
    .unwrap();
    assert_warned(&imported, &["route.topic.regex", "treated as the default"]);
    let err =
        template(&[("transforms.outbox.route.topic.regex", "(?<t>[a-z]+)_(.*)")]).unwrap_err();
    assert!(err.to_string().contains("no regex routing"), "{err}");
    let err = template(&[(
        "transforms.outbox.route.topic.replacement",
        "${aggregatetype}",
    )])
    .unwrap_err();
    assert!(err.to_string().contains("names no group"), "{err}");
    let err = template(&[
        ("transforms.outbox.route.topic.regex", "(.*)"),
        (
            "transforms.outbox.route.topic.replacement",
            "${routedByValue}",
        ),
    ])
    .unwrap_err();
    assert!(err.to_string().contains("names no group"), "{err}");
    let err = template(&[("transforms.outbox.route.topic.replacement", "a$2")]).unwrap_err();
    assert!(err.to_string().contains("$2"), "{err}");
}

#[test]
fn router_options_are_flags_or_named_differences() {
    let imported = import(&config(&[
        ("transforms", "outbox"),
        ("transforms.outbox.table.field.event.schema.version", "v"),
        (
            "transforms.outbox.table.json.payload.null.behavior",
            "optional_bytes",
        ),
        ("transforms.outbox.table.expand.json.payload", "true"),
        ("transforms.outbox.debezium.op.invalid.behavior", "error"),
        (
            "transforms.outbox.table.fields.additional.placement",
            "a:partition,b:header,c:envelope:cc",
        ),
        ("transforms.outbox.tracing.span.context.field", "span"),
        ("transforms.outbox.tracing.operation.name", "read"),
        ("transforms.outbox.predicate", "isOutbox"),
        ("transforms.outbox.negate", "false"),
        ("predicates", "isOutbox"),
        (
            "predicates.isOutbox.type",
            "org.apache.kafka.connect.transforms.predicates.TopicNameMatches",
        ),
        ("predicates.isOutbox.pattern", "app\\.public\\..*"),
        (
            "key.converter",
            "org.apache.kafka.connect.json.JsonConverter",
        ),
        (
            "value.converter",
            "org.apache.kafka.connect.json.JsonConverter",
        ),
        ("value.converter.schemas.enable", "FALSE"),
        ("producer.override.bootstrap.servers", "k1:9092,k2:9092"),
        ("producer.override.acks", "1"),
        ("producer.override.ssl.truststore.location", "/ts.jks"),
        ("database.sslmode", "require"),
        ("database.password", "${file:/s:pw}"),
    ]))
    .unwrap();
    for arg in [
        ("--kafka-brokers", "k1:9092,k2:9092"),
        ("--key-converter", "json-with-schemas"),
        ("--value-converter", "json"),
        ("--header-column", "b"),
        ("--envelope-column", "c:cc"),
        ("--partition-column", "a"),
        ("--schema-version-column", "v"),
        ("--keep-json-payload-nulls", "true"),
        ("--expand-json-payload", "true"),
        ("--trace-context-column", "span"),
        ("-X", "acks=1"),
    ] {
        assert!(
            imported.args.contains(&(arg.0.into(), arg.1.into())),
            "{arg:?} in {:?}",
            imported.args
        );
    }
    for needles in [
        &["acks=1"][..],
        &["ssl.truststore.location", "ssl.ca.location"],
        &["database.password", "config-provider"],
    ] {
        assert_warned(&imported, needles);
    }
    for option in [
        "tracing.operation.name=read",
        "debezium.op.invalid.behavior=error",
    ] {
        assert!(
            imported.identical.iter().any(|o| o.ends_with(option)),
            "{option}: {:?}",
            imported.identical
        );
    }
    assert!(
        imported.no_effect.iter().any(|o| o.starts_with("transforms.outbox.predicate=isOutbox: holds for the change events of every outbox table (app.public.outbox)")),
        "{:?}",
        imported.no_effect
    );
    let config = assert_valid_for_relay(&imported);
    assert!(
        config
            .mapping
            .connect
            .is_some_and(|c| c.json_nulls_as_bytes)
    );
}

#[test]
fn what_the_relay_does_not_reproduce_is_refused_by_name() {
    for (key, value) in [
        (
            "value.converter",
            "io.confluent.connect.json.JsonSchemaConverter",
        ),
        (
            "value.converter",
            "io.apicurio.registry.utils.converter.AvroConverter",
        ),
        (
            "header.converter",
            "org.apache.kafka.connect.storage.StringConverter",
        ),
        (
            "value.converter",
            "io.debezium.converters.ByteArrayConverter",
        ),
        ("time.precision.mode", "structured"),
        ("decimal.handling.mode", "exact"),
        ("binary.handling.mode", "base32"),
        ("transforms.outbox.route.topic.replacment", "typo"),
        ("transforms.outbox.table.field.additional.missing", "ignore"),
        ("transforms.outbox.tracing.with.context.field.only", "false"),
        ("transforms.outbox.field.name.adjustment.mode", "avro"),
        ("transforms.outbox.table.expand.json.payload", "maybe"),
    ] {
        let mut pairs = vec![(key, value)];
        if key == "value.converter" || key == "header.converter" {
            pairs.push((key, value));
        }
        let err = import(&config(&pairs)).unwrap_err();
        assert!(
            matches!(&err, DebeziumError::Invalid { key: k, .. } if k == key),
            "{key}: {err}"
        );
    }
    // A worker's JsonConverter setting the relay does not reproduce.
    let worker: BTreeMap<String, String> = [
        ("value.converter", JSON_CONVERTER),
        ("value.converter.replace.null.with.default", "false"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let err = import_with(&config(&[]), Some(&worker)).unwrap_err();
    assert!(
        err.to_string().contains("replace.null.with.default"),
        "{err}"
    );
}

#[test]
fn the_workers_converters_apply_where_the_connector_names_none() {
    let worker: BTreeMap<String, String> = [
        (
            "key.converter",
            "org.apache.kafka.connect.storage.StringConverter",
        ),
        ("value.converter", JSON_CONVERTER),
        ("value.converter.schemas.enable", "false"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    // The connector's own value.converter.* settings do not apply to the worker's converter.
    let imported = import_with(
        &config(&[("value.converter.schemas.enable", "true")]),
        Some(&worker),
    )
    .unwrap();
    assert!(
        imported
            .args
            .contains(&("--key-converter".into(), "string".into()))
    );
    assert!(
        imported
            .args
            .contains(&("--value-converter".into(), "json".into()))
    );
    assert!(
        !imported
            .warnings
            .iter()
            .any(|w| w.contains("sample worker"))
    );
}

#[test]
fn raw_converters_are_identical() {
    let imported = import(&config(&[
        (
            "key.converter",
            "org.apache.kafka.connect.storage.StringConverter",
        ),
        (
            "value.converter",
            "org.apache.kafka.connect.converters.ByteArrayConverter",
        ),
    ]))
    .unwrap();
    assert!(
        !imported
            .warnings
            .iter()
            .any(|w| w.contains("tombstone") || w.contains("converter")),
        "{:?}",
        imported.warnings
    );
    assert!(
        imported
            .args
            .contains(&("--value-converter".into(), "bytearray".into()))
    );
}

#[test]
fn tls_modes_pass_through_without_a_warning() {
    let mut config = BTreeMap::new();
    for (k, v) in [
        (
            "connector.class",
            "io.debezium.connector.postgresql.PostgresConnector",
        ),
        ("plugin.name", "pgoutput"),
        ("database.hostname", "db"),
        ("database.user", "u"),
        ("database.dbname", "app"),
        ("database.sslmode", "verify-full"),
        ("database.sslrootcert", "/ca.pem"),
        ("topic.prefix", "app"),
        ("table.include.list", "public.outbox"),
        ("transforms", "outbox"),
        (
            "transforms.outbox.type",
            "io.debezium.transforms.outbox.EventRouter",
        ),
    ] {
        config.insert(k.to_owned(), v.to_owned());
    }
    let imported = import(&config).unwrap();
    assert!(
        imported
            .args
            .iter()
            .any(|(_, v)| v.contains("sslmode=verify-full") && v.contains("sslrootcert=")),
        "{:?}",
        imported.args
    );
    assert!(
        !imported.warnings.iter().any(|w| w.contains("TLS")),
        "{:?}",
        imported.warnings
    );
}

#[test]
fn router_booleans_are_read_in_any_case() {
    // Connect reads booleans case-insensitively, and so did the import before the router's
    // options were read in one table.
    let imported = import(&config(&[
        ("transforms.outbox.table.expand.json.payload", "TRUE"),
        ("transforms.outbox.route.tombstone.on.empty.payload", "True"),
    ]))
    .unwrap();
    for flag in ["--expand-json-payload", "--tombstone-on-empty-payload"] {
        assert!(
            imported.args.contains(&(flag.into(), "true".into())),
            "{flag}"
        );
    }
}

#[test]
fn column_modes_and_header_converters_become_flags() {
    let imported = import(&config(&[
        ("key.converter", JSON_CONVERTER),
        ("key.converter.decimal.format", "NUMERIC"),
        ("value.converter", JSON_CONVERTER),
        ("header.converter", JSON_CONVERTER),
        ("header.converter.schemas.enable", "false"),
        ("time.precision.mode", "adaptive_time_microseconds"),
        ("decimal.handling.mode", "string"),
        ("binary.handling.mode", "base64-url-safe"),
        ("column.propagate.source.type", "public\\.outbox\\..*"),
        ("datatype.propagate.source.type", ".+\\.varchar"),
    ]))
    .unwrap();
    for (flag, value) in [
        ("--key-converter", "json-with-schemas"),
        ("--key-converter-decimal-format", "numeric"),
        ("--header-converter", "json"),
        ("--time-precision-mode", "adaptive-time-microseconds"),
        ("--decimal-handling-mode", "string"),
        ("--binary-handling-mode", "base64-url-safe"),
        ("--column-propagate-source-type", "public\\.outbox\\..*"),
        ("--datatype-propagate-source-type", ".+\\.varchar"),
    ] {
        assert!(
            imported.args.contains(&(flag.to_owned(), value.to_owned())),
            "{flag} {value}: {:?}",
            imported.args
        );
    }
    let connect = assert_valid_for_relay(&imported).mapping.connect.unwrap();
    assert_eq!(connect.header, HeaderConverter::Json);
    assert_eq!(
        connect.columns.time,
        TimePrecision::AdaptiveTimeMicroseconds
    );
    // A connector's converter setting without its own converter: Connect ignores it too.
    let imported = import(&config(&[("value.converter.decimal.format", "NUMERIC")])).unwrap();
    assert!(
        imported
            .no_effect
            .iter()
            .any(|o| o.starts_with("value.converter.decimal.format=NUMERIC")),
        "{:?}",
        imported.no_effect
    );
    assert!(
        !imported
            .args
            .iter()
            .any(|(f, _)| f.ends_with("decimal-format"))
    );
}

#[test]
fn transforms_are_reproduced_after_the_router_or_refused_by_name() {
    let router = "io.debezium.transforms.outbox.EventRouter";
    for (pairs, key, needle) in [
        (
            &[
                ("transforms", "unwrap,outbox"),
                (
                    "transforms.unwrap.type",
                    "io.debezium.transforms.ExtractNewRecordState",
                ),
            ][..],
            "transforms.unwrap.type",
            "before the Outbox Event Router",
        ),
        (
            &[
                ("transforms", "outbox,outbox2"),
                ("transforms.outbox2.type", router),
            ],
            "transforms.outbox2.type",
            "Debezium transform",
        ),
        (
            &[
                ("transforms", "outbox,route"),
                (
                    "transforms.route.type",
                    "org.apache.kafka.connect.transforms.RegexRouter",
                ),
                ("transforms.route.regex", ".*"),
                ("transforms.route.replacement", "x"),
            ],
            "transforms.route.type",
            "route.topic.replacement",
        ),
        (
            &[
                ("transforms", "outbox,stamp"),
                (
                    "transforms.stamp.type",
                    "org.apache.kafka.connect.transforms.InsertField$Value",
                ),
                ("transforms.stamp.timestamp.field", "ts"),
            ],
            "transforms.stamp.timestamp.field",
            "processing time",
        ),
        (
            &[
                ("transforms", "outbox,h"),
                (
                    "transforms.h.type",
                    "org.apache.kafka.connect.transforms.InsertHeader",
                ),
                ("transforms.h.header", "n"),
                ("transforms.h.value.literal", "1.5"),
            ],
            "transforms.h.value.literal",
            "Values.parseString",
        ),
        (
            &[
                ("transforms.outbox.predicate", "p"),
                ("predicates", "p"),
                ("predicates.p.type", "TopicNameMatches"),
                ("predicates.p.pattern", "app\\.public\\.other"),
            ],
            "transforms.outbox.predicate",
            "app.public.outbox",
        ),
    ] {
        let err = import(&config(pairs)).unwrap_err();
        assert!(
            matches!(&err, DebeziumError::Invalid { key: k, .. } if k == key),
            "{key}: {err}"
        );
        assert!(err.to_string().contains(needle), "{needle}: {err}");
    }
    let imported = import(&config(&[
        ("transforms", "outbox,h"),
        ("transforms.h.type", "InsertHeader"),
        ("transforms.h.header", "source"),
        ("transforms.h.value.literal", "relay"),
        ("transforms.h.predicate", "orders"),
        ("predicates", "orders,unused"),
        ("predicates.orders.type", "TopicNameMatches"),
        ("predicates.orders.pattern", "orders"),
        ("predicates.unused.type", "RecordIsTombstone"),
        ("key.converter", JSON_CONVERTER),
        ("value.converter", JSON_CONVERTER),
    ]))
    .unwrap();
    let transforms: Vec<&str> = (imported.args.iter())
        .filter(|(flag, _)| flag == "--transform")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(
        transforms,
        [
            "transforms=h",
            "transforms.h.header=source",
            "transforms.h.predicate=orders",
            "transforms.h.type=InsertHeader",
            "transforms.h.value.literal=relay",
            "predicates=orders",
            "predicates.orders.pattern=orders",
            "predicates.orders.type=TopicNameMatches",
        ]
    );
    assert!(
        imported
            .no_effect
            .iter()
            .any(|o| o.starts_with("predicates.unused.type=")),
        "{:?}",
        imported.no_effect
    );
    let connect = assert_valid_for_relay(&imported).mapping.connect.unwrap();
    assert_eq!(connect.transforms.stages.len(), 1);
}

#[test]
fn explain_says_where_debezium_itself_stops() {
    let imported = import(&config(&[
        ("key.converter", JSON_CONVERTER),
        ("value.converter", JSON_CONVERTER),
        ("transforms.outbox.table.expand.json.payload", "true"),
        (
            "transforms.outbox.table.fields.additional.placement",
            "type:envelope:eventType",
        ),
    ]))
    .unwrap();
    let text = explain(&imported);
    assert!(
        text.contains("# Where Debezium 3.6.3 itself stops with this configuration:\n# - transforms.outbox.table.expand.json.payload with envelope fields: Debezium stops at the first payload that expands to no schema (an empty JSON array []), with a NullPointerException"),
        "{text}"
    );
    assert!(!text.contains("Struct schemas do not match"), "{text}");
    assert!(
        text.contains("# - transforms.outbox.table.expand.json.payload=true: identical up to where Debezium itself stops (below)\n"),
        "{text}"
    );
    let imported = import(&config(&[(
        "transforms.outbox.table.expand.json.payload",
        "true",
    )]))
    .unwrap();
    assert_no_stops(&imported);
}

#[test]
fn explain_says_where_debezium_stops_with_registry_and_binary_converters() {
    let avro = "io.confluent.connect.avro.AvroConverter";
    let imported = import(&config(&[
        (
            "key.converter",
            "io.debezium.converters.BinaryDataConverter",
        ),
        ("value.converter", avro),
        (
            "value.converter.schema.registry.url",
            "http://127.0.0.1:8081",
        ),
        ("transforms.outbox.table.expand.json.payload", "true"),
    ]))
    .unwrap();
    let stops = imported.debezium_stops.join("\n");
    assert!(
        stops.contains("key.converter=BinaryDataConverter without key.converter.delegate.converter.type: Debezium stops at the first event whose key is not bytes"),
        "{stops}"
    );
    assert!(
        stops.contains("table.expand.json.payload with AvroConverter values: Debezium stops at the first payload with a field name Avro refuses")
            && stops.contains("BACKWARD"),
        "{stops}"
    );
    let imported = import(&config(&[
        ("key.converter", avro),
        ("key.converter.schema.registry.url", "http://127.0.0.1:8081"),
        (
            "key.converter.key.subject.name.strategy",
            "io.confluent.kafka.serializers.subject.RecordNameStrategy",
        ),
        ("value.converter", JSON_CONVERTER),
    ]))
    .unwrap();
    let stops = imported.debezium_stops.join("\n");
    assert!(
        stops.contains("key.subject.name.strategy naming subjects after records: Debezium stops at the first event"),
        "{stops}"
    );
    // With a delegate, Debezium writes every key.
    let imported = import(&config(&[
        (
            "key.converter",
            "io.debezium.converters.BinaryDataConverter",
        ),
        ("key.converter.delegate.converter.type", JSON_CONVERTER),
        ("value.converter", JSON_CONVERTER),
    ]))
    .unwrap();
    assert_no_stops(&imported);
}

#[test]
fn producer_settings_that_move_records_are_refused() {
    let err = import(&config(&[(
        "producer.override.partitioner.class",
        "org.apache.kafka.clients.producer.RoundRobinPartitioner",
    )]))
    .unwrap_err();
    assert!(err.to_string().contains("murmur2"), "{err}");
    let worker: BTreeMap<String, String> = [("producer.partitioner.ignore.keys", "true")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let err = import_with(&config(&[]), Some(&worker)).unwrap_err();
    assert!(
        err.to_string().contains("producer.partitioner.ignore.keys"),
        "{err}"
    );
    let default = "org.apache.kafka.clients.producer.internals.DefaultPartitioner";
    assert!(import(&config(&[("producer.override.partitioner.class", default)])).is_ok());
}

#[test]
fn the_msk_iam_librarys_producer_settings_become_kafka_auth() {
    let imported = import(&config(&[
        ("producer.override.security.protocol", "SASL_SSL"),
        ("producer.override.sasl.mechanism", "AWS_MSK_IAM"),
        (
            "producer.override.sasl.jaas.config",
            "software.amazon.msk.auth.iam.IAMLoginModule required \
             awsRoleArn=\"arn:aws:iam::123456789012:role/relay\" awsStsRegion=\"eu-west-1\";",
        ),
        (
            "producer.override.sasl.client.callback.handler.class",
            "software.amazon.msk.auth.iam.IAMClientCallbackHandler",
        ),
    ]))
    .unwrap();
    for arg in [
        ("--kafka-auth", "aws-msk-iam"),
        ("--aws-role-arn", "arn:aws:iam::123456789012:role/relay"),
        ("-X", "security.protocol=SASL_SSL"),
    ] {
        let found = imported.args.contains(&(arg.0.into(), arg.1.into()));
        assert!(found, "{arg:?} in {:?}", imported.args);
    }
    let passed = imported.args.iter().filter(|(flag, _)| flag == "-X");
    assert_eq!(passed.count(), 1, "{:?}", imported.args);
    assert!(
        !imported.warnings.iter().any(|w| w.contains("sasl")),
        "{:?}",
        imported.warnings
    );
    let config = assert_valid_for_relay(&imported);
    assert!(matches!(
        config.kafka_auth,
        crate::cloud::KafkaAuth::AwsMskIam(_)
    ));
    // Without a role in the login module, only the mechanism says anything.
    let plain = "software.amazon.msk.auth.iam.IAMLoginModule required;";
    assert_eq!(msk_iam("sasl.jaas.config", plain), Some(MskIam::Implied));
    assert_eq!(msk_iam("sasl.mechanism", "PLAIN"), None);
}

#[test]
fn binary_data_converters_import_with_their_delegates() {
    let imported = import(&config(&[
        ("key.converter", BINARY_DATA_CONVERTER),
        ("key.converter.delegate.converter.type", JSON_CONVERTER),
        (
            "key.converter.delegate.converter.type.schemas.enable",
            "false",
        ),
        ("value.converter", BINARY_DATA_CONVERTER),
    ]))
    .unwrap();
    let converters: Vec<_> = (imported.args.iter())
        .filter(|(flag, _)| flag.contains("converter"))
        .cloned()
        .collect();
    assert_eq!(
        converters,
        args(&[
            ("--key-converter", "binary-data"),
            ("--key-delegate-converter", "json"),
            ("--value-converter", "binary-data"),
        ])
    );
    let relay = assert_valid_for_relay(&imported);
    let connect = relay.mapping.connect.unwrap();
    assert_eq!(connect.delegates.key, Some(Converter::Json));
    assert_eq!(connect.delegates.value, None);
    // A delegate's settings are the delegate's converter's: the same ones are refused.
    for (key, value) in [
        (
            "value.converter.delegate.converter.type",
            "com.example.Mine",
        ),
        (
            "value.converter.delegate.converter.type.replace.null.with.default",
            "false",
        ),
    ] {
        let err = import(&config(&[
            ("value.converter", BINARY_DATA_CONVERTER),
            ("value.converter.delegate.converter.type", JSON_CONVERTER),
            (key, value),
        ]))
        .unwrap_err();
        assert!(
            matches!(&err, DebeziumError::Invalid { key: k, .. } if k == key),
            "{key}: {err}"
        );
    }
}

#[test]
fn avro_converters_import_as_registry_flags_without_showing_credentials() {
    let avro = "io.confluent.connect.avro.AvroConverter";
    let imported = import(&config(&[
        ("key.converter", avro),
        (
            "key.converter.schema.registry.url",
            "https://key:s3cret@sr.example:8081",
        ),
        ("value.converter", avro),
        (
            "value.converter.schema.registry.url",
            "https://key:s3cret@sr.example:8081",
        ),
        ("value.converter.basic.auth.credentials.source", "USER_INFO"),
        ("value.converter.basic.auth.user.info", "api:hunter2"),
        ("value.converter.auto.register.schemas", "false"),
        ("value.converter.use.latest.version", "true"),
        (
            "value.converter.value.subject.name.strategy",
            "io.confluent.kafka.serializers.subject.TopicRecordNameStrategy",
        ),
        ("value.converter.connect.meta.data", "false"),
        ("value.converter.enhanced.avro.schema.support", "true"),
        (
            "value.converter.schema.registry.ssl.truststore.location",
            "/ca.pem",
        ),
        ("value.converter.schema.registry.ssl.truststore.type", "PEM"),
    ]))
    .unwrap();
    let flags: Vec<&str> = imported.args.iter().map(|(f, _)| f.as_str()).collect();
    for flag in [
        "--key-converter",
        "--value-converter",
        "--schema-registry-url",
        "--schema-registry-user-info",
        "--schema-registry-ca",
        "--schema-registry-auto-register",
        "--schema-registry-use-latest-version",
        "--avro-connect-meta-data",
        "--value-subject-name-strategy",
    ] {
        assert!(flags.contains(&flag), "{flag} in {flags:?}");
    }
    let relay = assert_valid_for_relay(&imported);
    let connect = relay.mapping.connect.unwrap();
    assert_eq!(connect.value, Converter::Avro);
    assert!(!connect.registry.value.avro.connect_meta_data);
    let registry = relay.schema_registry.unwrap();
    assert_eq!(registry.shown_urls(), "https://sr.example:8081/");
    let text = explain(&imported);
    for secret in ["s3cret", "hunter2"] {
        assert!(!text.contains(secret), "{secret} shown:\n{text}");
    }
    assert!(
        text.contains("OUTBOX_RELAY_SCHEMA_REGISTRY_USER_INFO"),
        "{text}"
    );
    assert_no_effect(&imported, &["value.converter.enhanced.avro.schema.support"]);
    // Settings the relay does not reproduce, by name; the two converters must agree.
    for (key, value) in [
        ("value.converter.use.schema.id", "3"),
        ("value.converter.normalize.schemas", "true"),
        ("value.converter.auto.register.schema", "false"),
        (
            "value.converter.schema.registry.ssl.truststore.location",
            "/ts.jks",
        ),
        (
            "value.converter.basic.auth.credentials.source",
            "SASL_INHERIT",
        ),
        ("key.converter.auto.register.schemas", "true"),
    ] {
        let err = import(&config(&[
            ("key.converter", avro),
            ("key.converter.schema.registry.url", "http://sr:8081"),
            ("key.converter.auto.register.schemas", "false"),
            ("value.converter", avro),
            ("value.converter.schema.registry.url", "http://sr:8081"),
            ("value.converter.auto.register.schemas", "false"),
            (key, value),
        ]))
        .unwrap_err();
        assert!(
            err.to_string().contains(key.rsplit('.').next().unwrap()),
            "{key}: {err}"
        );
    }
    let err = import(&config(&[("value.converter", avro)])).unwrap_err();
    assert!(err.to_string().contains("schema.registry.url"), "{err}");
}

/// The connector keys that become the connection, slot, table and routing flags `--explain`
/// prints on its command line, rather than a line of their own.
const READ_INTO_FLAGS: [&str; 17] = [
    "transforms",
    "name",
    "connector.class",
    "database.hostname",
    "database.port",
    "database.user",
    "database.dbname",
    "plugin.name",
    "slot.name",
    "publication.name",
    "publication.autocreate.mode",
    "table.include.list",
    "topic.prefix",
    "transforms.outbox.type",
    "transforms.outbox.route.by.field",
    "transforms.outbox.route.topic.replacement",
    "transforms.outbox.table.field.event.key",
];

/// Issue 33 item 5: no key of a config real Debezium ran (every fixture's) is dropped
/// silently: each is on `--explain`'s command line as a flag, or named in its lists
/// (identical, no effect, where Debezium stops, differences).
#[test]
fn every_key_of_the_fixture_configs_is_explained() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/debezium-records"
    );
    let strings = |o: &serde_json::Map<String, Value>| -> BTreeMap<String, String> {
        let text = |(k, v): (&String, &Value)| (k.clone(), v.as_str().unwrap_or_default().into());
        o.iter().map(text).collect()
    };
    let mut checked = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with(".json") || name == "options.json" {
            continue;
        }
        let fixture: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let config = strings(fixture["connector"].as_object().unwrap());
        let worker = fixture
            .get("worker")
            .and_then(Value::as_object)
            .map(strings);
        let imported = import_with(&config, worker.as_ref()).unwrap();
        let text = explain(&imported);
        for key in config.keys() {
            assert!(
                READ_INTO_FLAGS.contains(&key.as_str()) || text.contains(&format!("{key}=")),
                "{name}: {key} is not in --explain:\n{text}"
            );
        }
        checked += 1;
    }
    assert!(checked >= 50, "only {checked} fixture configs");
}

#[test]
fn protobuf_converters_import_as_registry_flags_their_own_settings_checked() {
    let protobuf = "io.confluent.connect.protobuf.ProtobufConverter";
    let base = [
        ("key.converter", protobuf),
        ("key.converter.schema.registry.url", "http://sr:8081"),
        ("value.converter", protobuf),
        ("value.converter.schema.registry.url", "http://sr:8081"),
    ];
    // Settings only reading uses, and the defaults of those that change bytes.
    let mut settings = base.to_vec();
    settings.extend([
        ("value.converter.enhanced.protobuf.schema.support", "true"),
        ("value.converter.wrapper.for.raw.primitives", "false"),
        ("value.converter.wrapper.for.nullables", "false"),
        ("value.converter.auto.register.schemas", "false"),
        ("key.converter.auto.register.schemas", "false"),
    ]);
    let imported = import(&config(&settings)).unwrap();
    let relay = assert_valid_for_relay(&imported);
    let connect = relay.mapping.connect.unwrap();
    assert_eq!(
        (connect.key, connect.value),
        (Converter::Protobuf, Converter::Protobuf)
    );
    assert_eq!(connect.registry.value.lookup, Lookup::Existing);
    // (setting, value) -> refused, naming it
    let refused = [
        ("value.converter.wrapper.for.nullables", "true"),
        ("value.converter.optional.for.nullables", "true"),
        ("value.converter.connect.meta.data", "false"),
        ("value.converter.avro.use.logical.type.converters", "true"),
        ("value.converter.use.schema.id", "3"),
    ];
    for (key, value) in refused {
        let mut settings = base.to_vec();
        settings.push((key, value));
        let err = import(&config(&settings)).unwrap_err();
        assert!(
            matches!(&err, DebeziumError::Invalid { key: k, .. } if k == key),
            "{key}: {err}"
        );
    }
}
