//! Micro-benchmarks of the relay's pure per-row work: decoding one pgoutput
//! Insert message and mapping the decoded row to a Kafka record, in the relay's
//! own format and in Debezium's (JsonConverter with schemas, the context headers).
//!
//! The input is real WAL: the messages captured from PostgreSQL 15 in
//! `tests/fixtures/pgoutput/outbox.txt` (one Relation for `public.outbox`,
//! then Inserts). Run with `cargo bench --bench decode`.

use std::hint::black_box;
use std::time::Duration;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use outbox_relay::config::{Cli, Config};
use outbox_relay::outbox::connect::ColumnFacts;
use outbox_relay::outbox::{MappingConfig, TableMapping, TopicTemplate};
use outbox_relay::pgoutput::{self, Message, Relation, TupleData};

const FIXTURE: &str = include_str!("../tests/fixtures/pgoutput/outbox.txt");

/// The fixture's messages, in order (`<lsn>\t<hex>` lines; `#` starts a comment).
fn fixture_messages() -> Vec<Bytes> {
    FIXTURE
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| line.split_once('\t'))
        .filter_map(|(_, hex)| hex::decode(hex.trim()).ok())
        .map(Bytes::from)
        .collect()
}

/// What the benchmarks decode and map: the fixture's first Insert (the plain outbox row)
/// and the Relation before it.
struct PlainRow {
    relation: Relation,
    /// The Insert message as it arrives.
    insert: Bytes,
    /// Its decoded row.
    row: TupleData,
}

fn plain_row(messages: &[Bytes]) -> Option<PlainRow> {
    let mut relation = None;
    for raw in messages {
        match pgoutput::decode(raw).ok()? {
            Message::Relation(r) => relation = Some(r),
            Message::Insert { new, .. } => {
                return Some(PlainRow {
                    relation: relation?,
                    insert: raw.clone(),
                    row: new,
                });
            }
            _ => {}
        }
    }
    None
}

/// The relay's default mapping (Debezium's outbox defaults).
fn default_mapping() -> Option<MappingConfig> {
    Some(MappingConfig {
        route_by: "event_type".to_owned(),
        topic_template: TopicTemplate::parse("${routedByValue}").ok()?,
        key_column: "aggregate_id".to_owned(),
        id_column: "id".to_owned(),
        payload_column: "payload".to_owned(),
        timestamp_column: None,
        header_columns: Vec::new(),
        cloudevents: None,
        connect: None,
    })
}

/// The default mapping in Debezium's format, as `--debezium-config` sets it for Kafka's sample
/// worker config (JsonConverter with schemas) and `extended.headers.enabled`.
fn debezium_mapping() -> Option<MappingConfig> {
    let args = [
        "outbox-relay",
        "--postgres-url",
        "postgres://bench@127.0.0.1/bench",
        "--kafka-brokers",
        "127.0.0.1:9092",
        "--route-by",
        "event_type",
        "--topic-template",
        "${routedByValue}",
        "--key-column",
        "aggregate_id",
        "--key-converter",
        "json-with-schemas",
        "--value-converter",
        "json-with-schemas",
        "--debezium-topic-prefix",
        "bench",
        "--debezium-context-headers",
        "true",
    ];
    let cli = Cli::try_parse_global_from(args).ok()?;
    Some(Config::from_cli(&cli).ok()?.mapping)
}

/// The catalog facts Debezium's format reads: every column nullable, without default.
fn facts(relation: &Relation) -> Vec<ColumnFacts> {
    let fact = |name: &str| ColumnFacts {
        name: name.to_owned(),
        not_null: false,
        default: None,
    };
    relation.columns.iter().map(|c| fact(&c.name)).collect()
}

fn benches(c: &mut Criterion) {
    let messages = fixture_messages();
    let Some(PlainRow {
        relation,
        insert,
        row,
    }) = plain_row(&messages)
    else {
        eprintln!("tests/fixtures/pgoutput/outbox.txt has no Relation followed by an Insert");
        return;
    };
    let Some(mapping) =
        default_mapping().and_then(|config| TableMapping::bind(&config, &relation).ok())
    else {
        eprintln!("the default mapping does not bind to the fixture's relation");
        return;
    };

    let debezium = debezium_mapping()
        .and_then(|config| TableMapping::bind_with(&config, &relation, &facts(&relation)).ok());
    let Some(debezium) = debezium else {
        eprintln!("Debezium's format does not bind to the fixture's relation");
        return;
    };

    let mut group = c.benchmark_group("per_row");
    group.throughput(Throughput::Elements(1));
    group.bench_function("pgoutput_decode_insert", |b| {
        b.iter(|| pgoutput::decode(black_box(&insert)))
    });
    group.bench_function("table_mapping_map", |b| {
        b.iter(|| mapping.map(black_box(&row), black_box(0)))
    });
    group.bench_function("table_mapping_map_debezium_json_schemas", |b| {
        b.iter(|| debezium.map(black_box(&row), black_box(0)))
    });
    group.bench_function("decode_and_map", |b| {
        b.iter(|| match pgoutput::decode(black_box(&insert)) {
            Ok(Message::Insert { new, .. }) => mapping.map(&new, 0).is_ok(),
            _ => false,
        })
    });
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50)
}

criterion_group! {
    name = decode;
    config = config();
    targets = benches
}
criterion_main!(decode);
