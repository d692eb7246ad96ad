use tokio_postgres::types::Type;

use super::*;
use crate::outbox::{MappingConfig, TableMapping, TopicTemplate};
use crate::pgoutput::{Column, Value};

fn relation(columns: &[(&str, Type)]) -> Relation {
    let columns = columns.iter().map(|(name, ty)| Column {
        flags: 0,
        name: (*name).into(),
        type_oid: ty.oid(),
        type_modifier: -1,
    });
    Relation {
        id: 1,
        namespace: "public".into(),
        name: "outbox".into(),
        replica_identity: b'd',
        columns: columns.collect(),
    }
}

fn outbox() -> Relation {
    relation(&[
        ("id", Type::UUID),
        ("aggregatetype", Type::VARCHAR),
        ("aggregateid", Type::VARCHAR),
        ("type", Type::VARCHAR),
        ("payload", Type::JSONB),
        ("partitionno", Type::INT4),
    ])
}

fn facts() -> Vec<ColumnFacts> {
    let fact = |name: &str, not_null, default: Option<&str>| ColumnFacts {
        name: name.into(),
        not_null,
        default: default.map(str::to_owned),
    };
    vec![
        fact("id", true, None),
        fact("aggregatetype", true, None),
        fact("aggregateid", false, None),
        fact("type", true, Some("'Event'::character varying")),
        fact("payload", false, None),
    ]
}

/// The catalog facts of `relation`'s columns: all nullable, no defaults.
fn nullable(relation: &Relation) -> Vec<ColumnFacts> {
    let fact = |c: &Column| ColumnFacts {
        name: c.name.clone(),
        not_null: false,
        default: None,
    };
    relation.columns.iter().map(fact).collect()
}

fn connect(key: Converter, value: Converter) -> ConnectConfig {
    ConnectConfig {
        key,
        value,
        delegates: Delegates::default(),
        header: HeaderConverter::Simple,
        key_decimal_format: DecimalFormat::Base64,
        value_decimal_format: DecimalFormat::Base64,
        header_decimal_format: DecimalFormat::Base64,
        columns: ColumnModes::default(),
        topic_prefix: "dbserver1".into(),
        context_headers: Some("run".into()),
        expand_json_payload: false,
        json_nulls_as_bytes: false,
        envelope: vec![],
        partition_column: None,
        schema_version_column: None,
        tombstone_on_empty: false,
        trace_column: None,
        transforms: transforms::Chain::default(),
        registry: Default::default(),
        schema_cache: SchemaCache::default(),
    }
}

fn mapping(connect: ConnectConfig) -> MappingConfig {
    MappingConfig {
        route_by: "aggregatetype".into(),
        topic_template: TopicTemplate::parse("outbox.event.${routedByValue}").unwrap(),
        key_column: "aggregateid".into(),
        id_column: "id".into(),
        payload_column: "payload".into(),
        timestamp_column: None,
        header_columns: vec![],
        cloudevents: None,
        connect: Some(connect),
    }
}

fn row(values: &[Option<&str>]) -> TupleData {
    let value = |v: &Option<&str>| match v {
        Some(text) => Value::Text(Bytes::copy_from_slice(text.as_bytes())),
        None => Value::Null,
    };
    TupleData(values.iter().map(value).collect())
}

fn text(bytes: &Option<Bytes>) -> &str {
    std::str::from_utf8(bytes.as_deref().unwrap_or_default()).unwrap()
}

#[test]
fn the_documentation_row_as_json_converter_with_schemas_writes_it() {
    let config = mapping(connect(
        Converter::JsonWithSchemas,
        Converter::JsonWithSchemas,
    ));
    let m = TableMapping::bind_with(&config, &outbox(), &facts()).unwrap();
    let r = row(&[
        Some("00000000-0000-4000-8000-000000000001"),
        Some("order"),
        Some("1001"),
        Some("OrderCreated"),
        Some("{\"a\": 1}"),
        None,
    ]);
    let record = m.map(&r, 0).unwrap().unwrap();
    assert_eq!(record.topic, "outbox.event.order");
    assert_eq!(
        text(&record.key),
        "{\"schema\":{\"type\":\"string\",\"optional\":true},\"payload\":\"1001\"}"
    );
    assert_eq!(
        text(&record.payload),
        "{\"schema\":{\"type\":\"string\",\"optional\":true,\"name\":\"io.debezium.data.Json\",\"version\":1},\"payload\":\"{\\\"a\\\": 1}\"}"
    );
    let names: Vec<&str> = record.headers.iter().map(|(n, _)| &**n).collect();
    assert_eq!(
        names[..4],
        [
            "__debezium.context.connectorLogicalName",
            "__debezium.context.taskId",
            "__debezium.context.connectorName",
            "__debezium.context.runId"
        ]
    );
    assert_eq!(names[4], "id");
    assert_eq!(record.id_header_at, None);
    // A NULL key is the JSON null, not a null key.
    let r = row(&[
        Some("00000000-0000-4000-8000-000000000002"),
        Some("order"),
        None,
        Some("OrderCreated"),
        None,
        None,
    ]);
    let record = TableMapping::bind_with(
        &mapping(connect(Converter::Json, Converter::Json)),
        &outbox(),
        &facts(),
    )
    .unwrap()
    .map(&r, 0)
    .unwrap()
    .unwrap();
    assert_eq!((text(&record.key), text(&record.payload)), ("null", "null"));
}

#[test]
fn envelopes_keep_the_first_routes_schema_name_and_defaults() {
    let mut c = connect(Converter::Json, Converter::JsonWithSchemas);
    c.envelope = vec![HeaderColumn::parse("type:eventType").unwrap()];
    c.partition_column = Some("partitionno".into());
    let m = TableMapping::bind_with(&mapping(c), &outbox(), &facts()).unwrap();
    let first = m
        .map(
            &row(&[
                Some("1"),
                Some("order"),
                Some("1"),
                Some("A"),
                Some("{}"),
                Some("3"),
            ]),
            0,
        )
        .unwrap()
        .unwrap();
    let second = m
        .map(
            &row(&[
                Some("2"),
                Some("customer"),
                Some("1"),
                Some("B"),
                None,
                None,
            ]),
            0,
        )
        .unwrap()
        .unwrap();
    for record in [&first, &second] {
        let value = text(&record.payload);
        assert!(
            value.contains("\"name\":\"dbserver1.public.outbox.order.Value\""),
            "{value}"
        );
        assert!(value.contains("{\"type\":\"string\",\"optional\":false,\"default\":\"Event\",\"field\":\"eventType\"}"), "{value}");
    }
    assert_eq!((first.partition, second.partition), (Some(3), None));
}

#[test]
fn what_debezium_could_not_produce_is_refused_by_option() {
    let bind = |c: ConnectConfig, facts: &[ColumnFacts]| {
        TableMapping::bind_with(&mapping(c), &outbox(), facts)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let err = bind(connect(Converter::Bytearray, Converter::String), &facts());
    assert!(
        err.contains("--key-converter aggregateid") && err.contains("ByteArrayConverter"),
        "{err}"
    );
    let mut c = connect(Converter::String, Converter::String);
    c.envelope = vec![HeaderColumn::parse("type").unwrap()];
    assert!(bind(c, &facts()).contains("--envelope-column"));
    let mut c = connect(Converter::String, Converter::Json);
    c.partition_column = Some("type".into());
    assert!(bind(c, &facts()).contains("int32"));
    assert!(bind(connect(Converter::Json, Converter::Json), &[]).contains("NOT NULL"));
}

#[test]
fn string_converter_prints_a_byte_buffer_and_tombstones_follow_java_trim() {
    let rel = relation(&[
        ("id", Type::INT8),
        ("aggregatetype", Type::TEXT),
        ("aggregateid", Type::INT8),
        ("payload", Type::BYTEA),
    ]);
    let mut c = connect(Converter::String, Converter::String);
    c.context_headers = None;
    let m = TableMapping::bind_with(&mapping(c), &rel, &nullable(&rel)).unwrap();
    let record = m
        .map(
            &row(&[Some("1"), Some("bytes"), Some("-9"), Some("\\x00ff")]),
            0,
        )
        .unwrap()
        .unwrap();
    assert_eq!(text(&record.key), "-9");
    assert_eq!(
        text(&record.payload),
        "java.nio.HeapByteBuffer[pos=0 lim=2 cap=2]"
    );
    let names: Vec<&str> = record.headers.iter().map(|(n, _)| &**n).collect();
    assert_eq!(names, ["id"]);
    let rel = relation(&[
        ("id", Type::INT8),
        ("aggregatetype", Type::TEXT),
        ("aggregateid", Type::TEXT),
        ("payload", Type::TEXT),
    ]);
    let mut c = connect(Converter::String, Converter::String);
    c.tombstone_on_empty = true;
    let m = TableMapping::bind_with(&mapping(c), &rel, &nullable(&rel)).unwrap();
    for (payload, tombstone) in [(" \u{1}\t", true), ("", true), (" x ", false)] {
        let record = m
            .map(&row(&[Some("1"), Some("t"), Some("k"), Some(payload)]), 0)
            .unwrap()
            .unwrap();
        assert_eq!(record.payload.is_none(), tombstone, "{payload:?}");
    }
}

#[test]
fn trace_headers_continue_the_parent_trace() {
    let headers = router::trace_headers(
        b"traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\ntracestate=rojo=1\n",
    );
    let value = |header: &record::Header| match &header.value.data {
        Data::Str(text) => text.clone(),
        _ => String::new(),
    };
    let parent = value(&headers[0]);
    assert!(
        parent.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-") && parent.ends_with("-01"),
        "{parent}"
    );
    assert_eq!(parent.len(), 55);
    assert!(!parent.contains("00f067aa0ba902b7"));
    assert_eq!(
        (&*headers[1].name, value(&headers[1]).as_str()),
        ("tracestate", "rojo=1")
    );
    let root = router::trace_headers(b"nothing=here");
    assert_eq!(root.len(), 1);
    assert_eq!(value(&root[0]).len(), 55);
}

#[test]
fn text_converters_refuse_what_java_prints_in_its_own_way() {
    let rel = relation(&[
        ("id", Type::UUID),
        ("aggregatetype", Type::TEXT),
        ("aggregateid", Type::NUMERIC),
        ("payload", Type::TEXT),
        ("day", Type::DATE),
    ]);
    let bind = |c: ConnectConfig, headers: &[&str]| {
        let mut m = mapping(c);
        m.header_columns = (headers.iter())
            .map(|h| HeaderColumn::parse(h).unwrap())
            .collect();
        TableMapping::bind_with(&m, &rel, &nullable(&rel))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    // A numeric without scale is a VariableScaleDecimal struct: StringConverter prints
    // Struct.toString(), SimpleHeaderConverter Connect's own text.
    let err = bind(connect(Converter::String, Converter::String), &[]);
    assert!(
        err.contains("--key-converter string") && err.contains("VariableScaleDecimal"),
        "{err}"
    );
    let mut c = connect(Converter::Json, Converter::String);
    assert_eq!(bind(c.clone(), &["aggregateid"]), "");
    c.columns.time = columns::TimePrecision::Connect;
    let err = bind(c.clone(), &["day"]);
    assert!(
        err.contains("header day") && err.contains("time zone"),
        "{err}"
    );
    c.header = HeaderConverter::JsonWithSchemas;
    assert_eq!(bind(c, &["day"]), "");
}

#[test]
fn binary_data_passes_bytes_through_and_delegates_the_rest() {
    let rel = relation(&[
        ("id", Type::INT8),
        ("aggregatetype", Type::TEXT),
        ("aggregateid", Type::INT8),
        ("payload", Type::BYTEA),
    ]);
    let mut c = connect(Converter::BinaryData, Converter::BinaryData);
    c.context_headers = None;
    c.delegates.key = Some(Converter::Json);
    let nullable = |name: &str| ColumnFacts {
        name: name.into(),
        not_null: false,
        default: None,
    };
    let bytes_facts = [nullable("aggregateid")];
    let m = TableMapping::bind_with(&mapping(c.clone()), &rel, &bytes_facts).unwrap();
    let record = m
        .map(
            &row(&[Some("1"), Some("b"), Some("-9"), Some("\\x00ff")]),
            0,
        )
        .unwrap()
        .unwrap();
    assert_eq!(record.key.as_deref(), Some(&b"-9"[..]));
    assert_eq!(record.payload.as_deref(), Some(&[0, 255][..]));
    let record = m
        .map(&row(&[Some("2"), Some("b"), None, None]), 0)
        .unwrap()
        .unwrap();
    assert_eq!((text(&record.key), record.payload), ("null", None));
    // Without a delegate, a column that is not bytea stops Debezium at its first event.
    c.delegates.key = None;
    let err = TableMapping::bind_with(&mapping(c.clone()), &rel, &bytes_facts).unwrap_err();
    assert!(
        err.to_string().contains("--key-converter aggregateid")
            && err.to_string().contains("delegate.converter.type"),
        "{err}"
    );
    // A text payload goes to the value's delegate, and so does an envelope.
    let mut c = connect(Converter::String, Converter::BinaryData);
    c.delegates.value = Some(Converter::JsonWithSchemas);
    c.envelope = vec![HeaderColumn::parse("type:eventType").unwrap()];
    let m = TableMapping::bind_with(&mapping(c.clone()), &outbox(), &facts()).unwrap();
    let record = m
        .map(
            &row(&[
                Some("1"),
                Some("order"),
                Some("1"),
                Some("A"),
                Some("{}"),
                None,
            ]),
            0,
        )
        .unwrap()
        .unwrap();
    assert!(text(&record.payload).starts_with("{\"schema\":{\"type\":\"struct\""));
    c.delegates.value = Some(Converter::String);
    let err = TableMapping::bind_with(&mapping(c), &outbox(), &facts()).unwrap_err();
    assert!(err.to_string().contains("--envelope-column"), "{err}");
}

#[test]
fn avro_records_carry_their_schemas_until_the_ids_are_known() {
    let c = connect(Converter::Avro, Converter::Avro);
    let ids = c.registry.ids.clone();
    let m = TableMapping::bind_with(&mapping(c), &outbox(), &facts()).unwrap();
    let r = row(&[
        Some("00000000-0000-4000-8000-000000000001"),
        Some("order"),
        Some("1001"),
        Some("OrderCreated"),
        Some("{}"),
        None,
    ]);
    let mut record = m.map(&r, 0).unwrap().unwrap();
    let pending = record.schemas.as_ref().unwrap();
    let subjects: Vec<&str> = pending.each().map(|p| &*p.subject).collect();
    assert_eq!(
        subjects,
        ["outbox.event.order-key", "outbox.event.order-value"]
    );
    assert_eq!(pending.raw.key.as_deref(), Some(&b"1001"[..]));
    assert_eq!(
        pending.value.as_ref().unwrap().schema.text(),
        r#"["null",{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Json"}]"#
    );
    let known: Vec<_> = pending.each().cloned().collect();
    for (id, p) in (1..).zip(&known) {
        ids.insert(&p.subject, &p.schema, id);
    }
    assert!(registry::PendingSchemas::complete(&mut record, &ids));
    assert_eq!(
        record.key.as_deref(),
        Some(&b"\0\0\0\0\x01\x02\x081001"[..])
    );
    assert_eq!(
        record.payload.as_deref(),
        Some(&b"\0\0\0\0\x02\x02\x04{}"[..])
    );
    // Now known, the ids are written in at mapping; a NULL key registers nothing.
    let mut r = r.clone();
    r.0[2] = Value::Null;
    let record = m.map(&r, 0).unwrap().unwrap();
    assert!(record.schemas.is_none());
    assert_eq!(record.key, None);
    assert_eq!(
        record.payload.as_deref(),
        Some(&b"\0\0\0\0\x02\x02\x04{}"[..])
    );
}

#[test]
fn record_name_strategies_need_records() {
    let mut c = connect(Converter::Avro, Converter::Avro);
    c.registry.key.subjects = registry::SubjectStrategy::Record;
    let err = TableMapping::bind_with(&mapping(c), &outbox(), &facts()).unwrap_err();
    assert!(
        err.to_string()
            .contains("--key-subject-name-strategy aggregateid"),
        "{err}"
    );
    let mut c = connect(Converter::Avro, Converter::Avro);
    c.registry.value.subjects = registry::SubjectStrategy::TopicRecord;
    assert!(TableMapping::bind_with(&mapping(c.clone()), &outbox(), &facts()).is_err());
    c.envelope = vec![HeaderColumn::parse("type").unwrap()];
    let m = TableMapping::bind_with(&mapping(c), &outbox(), &facts()).unwrap();
    let record = m
        .map(
            &row(&[Some("1"), Some("order"), Some("1"), Some("A"), None, None]),
            0,
        )
        .unwrap()
        .unwrap();
    let value = record
        .schemas
        .as_ref()
        .and_then(|p| p.value.as_ref())
        .unwrap();
    assert_eq!(
        &*value.subject,
        "outbox.event.order-dbserver1.public.outbox.order.Value"
    );
}

#[test]
fn a_record_strategy_after_value_to_key_is_judged_per_event() {
    let mut c = connect(Converter::Avro, Converter::Avro);
    c.registry.key.subjects = registry::SubjectStrategy::Record;
    c.envelope = vec![HeaderColumn::parse("type:eventType").unwrap()];
    let settings: Vec<(String, String)> = [
        ("transforms", "tokey"),
        (
            "transforms.tokey.type",
            "org.apache.kafka.connect.transforms.ValueToKey",
        ),
        ("transforms.tokey.fields", "eventType"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    c.transforms = transforms::Chain::parse(&settings).unwrap();
    // ValueToKey makes the key a struct, an Avro record: Confluent names its subject after it.
    let m = TableMapping::bind_with(&mapping(c), &outbox(), &facts()).unwrap();
    let r = row(&[Some("1"), Some("order"), Some("1"), Some("A"), None, None]);
    let record = m.map(&r, 0).unwrap().unwrap();
    let key = record
        .schemas
        .as_ref()
        .and_then(|p| p.key.as_ref())
        .unwrap();
    assert_eq!(&*key.subject, "io.confluent.connect.avro.ConnectDefault");
}

#[test]
fn protobuf_combinations_not_measured_are_refused_at_start_up() {
    // (key, value, set up) -> the flag the refusal names, or "" when it binds
    let expand = |c: &mut ConnectConfig| c.expand_json_payload = true;
    let key_record =
        |c: &mut ConnectConfig| c.registry.key.subjects = registry::SubjectStrategy::Record;
    let value_topic_record =
        |c: &mut ConnectConfig| c.registry.value.subjects = registry::SubjectStrategy::TopicRecord;
    let nothing = |_: &mut ConnectConfig| {};
    type SetUp<'a> = &'a dyn Fn(&mut ConnectConfig);
    let table: Vec<(Converter, Converter, SetUp, &str)> = vec![
        (Converter::Protobuf, Converter::Protobuf, &nothing, ""),
        (
            Converter::String,
            Converter::Protobuf,
            &expand,
            "--expand-json-payload",
        ),
        (Converter::Protobuf, Converter::Json, &expand, ""),
        (
            Converter::Protobuf,
            Converter::Protobuf,
            &key_record,
            "--key-subject-name-strategy",
        ),
        (Converter::String, Converter::Protobuf, &key_record, ""),
        (
            Converter::Protobuf,
            Converter::Protobuf,
            &value_topic_record,
            "--value-subject-name-strategy",
        ),
    ];
    for (key, value, set_up, flag) in table {
        let mut c = connect(key, value);
        set_up(&mut c);
        let bound = TableMapping::bind_with(&mapping(c), &outbox(), &facts());
        let err = bound.err().map(|e| e.to_string()).unwrap_or_default();
        match flag {
            "" => assert_eq!(err, "", "{key:?} {value:?}"),
            flag => assert!(
                err.contains(flag) && err.contains("measured"),
                "{key:?} {value:?}: {err}"
            ),
        }
    }
}
