use super::*;
use crate::pgoutput::{Column, Value};
use tokio_postgres::types::Type;

const UUID: u32 = 2950;
const TEXT: u32 = 25;
const JSONB: u32 = 3802;

fn relation(columns: &[(&str, u32)]) -> Relation {
    Relation {
        id: 16384,
        namespace: "public".into(),
        name: "outbox".into(),
        replica_identity: b'd',
        columns: columns
            .iter()
            .map(|(name, type_oid)| Column {
                flags: 0,
                name: (*name).into(),
                type_oid: *type_oid,
                type_modifier: -1,
            })
            .collect(),
    }
}

fn standard() -> Relation {
    relation(&[
        ("id", UUID),
        ("aggregate_type", TEXT),
        ("aggregate_id", TEXT),
        ("event_type", TEXT),
        ("payload", JSONB),
        ("created_at", Type::TIMESTAMPTZ.oid()),
    ])
}

fn config(extra: impl FnOnce(&mut MappingConfig)) -> MappingConfig {
    let mut c = MappingConfig {
        route_by: "event_type".into(),
        topic_template: TopicTemplate::parse("${routedByValue}").unwrap(),
        key_column: "aggregate_id".into(),
        id_column: "id".into(),
        payload_column: "payload".into(),
        timestamp_column: None,
        header_columns: vec![],
        cloudevents: None,
        connect: None,
    };
    extra(&mut c);
    c
}

fn t(s: &str) -> Value {
    Value::Text(Bytes::copy_from_slice(s.as_bytes()))
}

fn row(values: Vec<Value>) -> TupleData {
    TupleData(values)
}

fn standard_row(payload: Value) -> TupleData {
    row(vec![
        t("6f1c2c4e-0000-4000-8000-000000000001"),
        t("order"),
        t("order-42"),
        t("OrderCreated"),
        payload,
        t("2026-11-22 13:05:54.123456+00"),
    ])
}

/// A row's mapping, which no transform drops (these mappings have none).
fn map(
    m: &TableMapping,
    row: &TupleData,
    commit_time_ms: i64,
) -> Result<OutboxRecord, (EventError, RawParts)> {
    m.map(row, commit_time_ms)
        .map(|record| record.expect("no transform drops it"))
}

#[test]
fn maps_the_common_schema_with_defaults() {
    let rel = standard();
    let m = TableMapping::bind(&config(|_| {}), &rel).unwrap();
    let rec = map(&m, &standard_row(t(r#"{"total": 10}"#)), 1_000).unwrap();
    assert_eq!(rec.topic, "OrderCreated");
    assert_eq!(rec.key.as_deref(), Some(&b"order-42"[..]));
    assert_eq!(rec.payload.as_deref(), Some(&br#"{"total": 10}"#[..]));
    assert_eq!(rec.id_text(), "6f1c2c4e-0000-4000-8000-000000000001");
    assert_eq!(rec.timestamp_ms, 1_000);
    assert!(rec.headers.is_empty());
    assert_eq!(m.table().as_ref(), "public.outbox");
}

#[test]
fn reproduces_debezium_default_topic_and_column_placeholders() {
    let rel = standard();
    let m = TableMapping::bind(
        &config(|c| {
            c.topic_template =
                TopicTemplate::parse("outbox.${aggregate_type}.${routedByValue}").unwrap()
        }),
        &rel,
    )
    .unwrap();
    let rec = map(&m, &standard_row(Value::Null), 0).unwrap();
    assert_eq!(rec.topic, "outbox.order.OrderCreated");
}

#[test]
fn null_payload_is_a_tombstone_and_null_key_is_null() {
    let rel = standard();
    let m = TableMapping::bind(&config(|_| {}), &rel).unwrap();
    let mut r = standard_row(Value::Null);
    r.0[2] = Value::Null;
    let rec = map(&m, &r, 0).unwrap();
    assert_eq!(rec.payload, None);
    assert_eq!(rec.key, None);
}

#[test]
fn bytea_payload_is_decoded_to_raw_bytes() {
    let rel = relation(&[
        ("id", UUID),
        ("aggregate_id", TEXT),
        ("event_type", TEXT),
        ("payload", Type::BYTEA.oid()),
    ]);
    let m = TableMapping::bind(&config(|_| {}), &rel).unwrap();
    let r = row(vec![t("1"), t("a"), t("E"), t("\\x00ff")]);
    assert_eq!(
        map(&m, &r, 0).unwrap().payload.as_deref(),
        Some(&[0u8, 0xff][..])
    );
    let bad = row(vec![t("1"), t("a"), t("E"), t("\\xf")]);
    assert!(matches!(
        map(&m, &bad, 0),
        Err((EventError::InvalidValue { .. }, _))
    ));
}

#[test]
fn headers_and_timestamp_column() {
    let rel = standard();
    let m = TableMapping::bind(
        &config(|c| {
            c.timestamp_column = Some("created_at".into());
            c.header_columns = vec![
                HeaderColumn::parse("aggregate_type:type").unwrap(),
                HeaderColumn::parse("event_type").unwrap(),
            ];
        }),
        &rel,
    )
    .unwrap();
    let rec = map(&m, &standard_row(Value::Null), 0).unwrap();
    assert_eq!(rec.timestamp_ms, 1_795_352_754_123);
    assert_eq!(rec.headers.len(), 2);
    assert_eq!(rec.headers[0].0.as_ref(), "type");
    assert_eq!(rec.headers[0].1.as_deref(), Some(&b"order"[..]));
    assert_eq!(rec.headers[1].0.as_ref(), "event_type");
}

#[test]
fn epoch_millis_timestamp_column() {
    let rel = relation(&[
        ("id", UUID),
        ("aggregate_id", TEXT),
        ("event_type", TEXT),
        ("payload", JSONB),
        ("ts", Type::INT8.oid()),
    ]);
    let m = TableMapping::bind(&config(|c| c.timestamp_column = Some("ts".into())), &rel).unwrap();
    let r = row(vec![
        t("1"),
        t("a"),
        t("E"),
        Value::Null,
        t("1700000000000"),
    ]);
    assert_eq!(map(&m, &r, 5).unwrap().timestamp_ms, 1_700_000_000_000);
    let r = row(vec![t("1"), t("a"), t("E"), Value::Null, t("soon")]);
    assert!(map(&m, &r, 5).is_err());
}

#[test]
fn missing_columns_are_named_with_the_flag_and_the_real_columns() {
    let rel = standard();
    let err = TableMapping::bind(&config(|c| c.key_column = "aggregateid".into()), &rel)
        .unwrap_err()
        .to_string();
    assert!(err.contains("\"aggregateid\""), "{err}");
    assert!(err.contains("--key-column"), "{err}");
    assert!(
        err.contains("id, aggregate_type, aggregate_id, event_type, payload, created_at"),
        "{err}"
    );
    let err = TableMapping::bind(
        &config(|c| c.topic_template = TopicTemplate::parse("${nope}").unwrap()),
        &rel,
    )
    .unwrap_err();
    assert!(matches!(
        err,
        BindError::MissingColumn {
            flag: "--topic-template",
            ..
        }
    ));
    let err = TableMapping::bind(
        &config(|c| c.timestamp_column = Some("event_type".into())),
        &rel,
    )
    .unwrap_err();
    assert!(matches!(err, BindError::TimestampType { .. }));
}

#[test]
fn bad_rows_are_typed_errors() {
    let rel = standard();
    let m = TableMapping::bind(&config(|_| {}), &rel).unwrap();
    let mut r = standard_row(Value::Null);
    r.0[0] = Value::Null;
    assert!(matches!(
        map(&m, &r, 0),
        Err((EventError::NullId { .. }, _))
    ));
    let mut r = standard_row(Value::Null);
    r.0[3] = t("");
    assert!(matches!(
        map(&m, &r, 0),
        Err((EventError::EmptyRoutingValue { .. }, _))
    ));
    let mut r = standard_row(Value::Null);
    r.0[3] = Value::Null;
    assert!(matches!(
        map(&m, &r, 0),
        Err((EventError::EmptyRoutingValue { .. }, _))
    ));
    let short = row(vec![t("1")]);
    assert!(matches!(
        map(&m, &short, 0),
        Err((EventError::InvalidValue { .. }, _))
    ));
    let mut r = standard_row(Value::Null);
    r.0[1] = Value::Unchanged;
    let m2 = TableMapping::bind(
        &config(|c| c.header_columns = vec![HeaderColumn::parse("aggregate_type").unwrap()]),
        &rel,
    )
    .unwrap();
    assert!(map(&m2, &r, 0).is_err());
}

#[test]
fn topic_names_kafka_rejects_are_event_errors() {
    let rel = standard();
    let m = TableMapping::bind(&config(|_| {}), &rel).unwrap();
    for bad in ["Order Created", "a/b", ".", "ünï"] {
        let mut r = standard_row(Value::Null);
        r.0[3] = t(bad);
        assert!(
            matches!(map(&m, &r, 0), Err((EventError::InvalidTopic { .. }, _))),
            "{bad:?}"
        );
    }
    let mut r = standard_row(Value::Null);
    r.0[3] = t(&"x".repeat(250));
    assert!(matches!(
        map(&m, &r, 0),
        Err((EventError::InvalidTopic { .. }, _))
    ));
    r.0[3] = t(&"x".repeat(249));
    assert!(map(&m, &r, 0).is_ok());
}

#[test]
fn dead_letter_records_keep_key_payload_and_say_why() {
    let rel = standard();
    let m = TableMapping::bind(
        &config(|c| c.topic_template = TopicTemplate::parse("out.${routedByValue}").unwrap()),
        &rel,
    )
    .unwrap();
    let mut r = standard_row(t(r#"{"a":1}"#));
    r.0[3] = t("bad topic");
    let parts = map(&m, &r, 0).unwrap_err().1;
    assert_eq!(parts.intended_topic.as_deref(), Some("out.bad topic"));
    let info = DeadLetterInfo {
        error: "topic name is not valid".into(),
        lsn: crate::lsn::Lsn(0x1_0000_0010),
        table: "public.outbox".into(),
        intended_topic: parts.intended_topic.clone(),
        payload_omitted: None,
    };
    let rec = dead_letter_record("dlq", parts.clone(), vec![], &info, 7);
    assert_eq!(rec.topic, "dlq");
    assert_eq!(rec.key.as_deref(), Some(&b"order-42"[..]));
    assert_eq!(rec.payload.as_deref(), Some(&br#"{"a":1}"#[..]));
    assert_eq!(rec.id_text(), "6f1c2c4e-0000-4000-8000-000000000001");
    let header = |name: &str| {
        rec.headers
            .iter()
            .find(|(k, _)| k.as_ref() == name)
            .and_then(|(_, v)| v.clone())
    };
    assert_eq!(header("outbox.lsn").as_deref(), Some(&b"1/10"[..]));
    assert_eq!(
        header("outbox.topic").as_deref(),
        Some(&b"out.bad topic"[..])
    );
    assert_eq!(
        header("outbox.table").as_deref(),
        Some(&b"public.outbox"[..])
    );
    assert!(header("outbox.payload.omitted").is_none());

    let omitted = DeadLetterInfo {
        payload_omitted: Some("payload larger than message.max.bytes".into()),
        ..info
    };
    let rec = dead_letter_record("dlq", parts, vec![], &omitted, 7);
    assert_eq!(rec.payload, None);
    assert!(
        rec.headers
            .iter()
            .any(|(k, _)| k.as_ref() == "outbox.payload.omitted")
    );

    // A NULL id still yields a record (with an empty id) rather than nothing.
    let mut r = standard_row(Value::Null);
    r.0[0] = Value::Null;
    assert_eq!(map(&m, &r, 0).unwrap_err().1.id.len(), 0);
}

#[test]
fn cloudevents_headers_come_from_the_row_and_the_commit_time() {
    let ce = |c: &mut MappingConfig| {
        c.cloudevents = Some(cloudevents::CloudEventsConfig {
            source: None,
            database: "shop".into(),
        });
        c.timestamp_column = Some("created_at".into());
    };
    let rel = standard();
    let m = TableMapping::bind(&config(ce), &rel).unwrap();
    let rec = map(&m, &standard_row(t("{}")), 1_000).unwrap();
    let header = |name: &str| {
        rec.headers
            .iter()
            .find(|(n, _)| &**n == name)
            .and_then(|(_, v)| v.as_deref())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    assert_eq!(header("ce_specversion").as_deref(), Some("1.0"));
    assert_eq!(
        header("ce_id").as_deref(),
        Some("6f1c2c4e-0000-4000-8000-000000000001")
    );
    assert_eq!(header("ce_type").as_deref(), Some("OrderCreated"));
    assert_eq!(header("ce_source").as_deref(), Some("/shop/public/outbox"));
    // The commit time, not the timestamp column.
    assert_eq!(
        header("ce_time").as_deref(),
        Some("1970-01-01T00:00:01.000Z")
    );
    assert_eq!(header("ce_subject").as_deref(), Some("order-42"));
    assert_eq!(header("content-type").as_deref(), Some("application/json"));

    // A null key has no subject; a text payload no content type; a NULL
    // route-by value cannot make an event (ce_type is required).
    let text_payload = relation(&[
        ("id", UUID),
        ("aggregate_type", TEXT),
        ("aggregate_id", TEXT),
        ("event_type", TEXT),
        ("payload", TEXT),
        ("created_at", Type::TIMESTAMPTZ.oid()),
    ]);
    let m = TableMapping::bind(&config(ce), &text_payload).unwrap();
    let mut r = standard_row(t("hello"));
    r.0[2] = Value::Null;
    let rec = map(&m, &r, 0).unwrap();
    assert!(!rec.headers.iter().any(|(n, _)| &**n == "ce_subject"));
    assert!(!rec.headers.iter().any(|(n, _)| &**n == "content-type"));
    let m = TableMapping::bind(
        &config(|c| {
            ce(c);
            c.topic_template = TopicTemplate::parse("events").unwrap();
        }),
        &rel,
    )
    .unwrap();
    r.0[3] = Value::Null;
    assert!(matches!(
        map(&m, &r, 0),
        Err((EventError::EmptyRoutingValue { .. }, _))
    ));
}

#[test]
fn event_mapper_follows_relation_reannouncements() {
    let outbox = TableName::parse("public.outbox").unwrap();
    let mut mapper = EventMapper::new(vec![(outbox, config(|_| {}))], vec![]);
    let rel = standard();
    let row = standard_row(Value::Null);
    assert!(
        mapper.insert(rel.id, &row, 0).is_none(),
        "not announced yet"
    );
    mapper.relation(rel.clone(), None, &[]).unwrap();
    let (table, mapped) = mapper.insert(rel.id, &row, 0).unwrap();
    assert_eq!(table.as_ref(), "public.outbox");
    assert!(mapped.is_ok());

    // Re-announced with a column dropped: rebinds to the new layout.
    let mut narrower = rel.clone();
    narrower.columns.pop();
    mapper.relation(narrower, None, &[]).unwrap();
    let mut short = row.clone();
    short.0.pop();
    assert!(mapper.insert(rel.id, &short, 0).unwrap().1.is_ok());

    // A column the mapping needs is gone: an error, and the old binding stays.
    let mut broken = rel.clone();
    broken.columns.remove(2);
    assert!(matches!(
        mapper.relation(broken, None, &[]),
        Err(BindError::MissingColumn { .. })
    ));
    assert!(mapper.outbox_table(rel.id).is_some());

    // Renamed away: no longer an outbox table.
    let mut renamed = rel.clone();
    renamed.namespace = "archive".into();
    mapper.relation(renamed.clone(), None, &[]).unwrap();
    assert!(mapper.outbox_table(rel.id).is_none());
    assert!(mapper.insert(rel.id, &row, 0).is_none());

    // Recreated under the old name with a new OID: the new OID maps, the old one does not.
    let mut recreated = rel.clone();
    recreated.id = 99_999;
    mapper.relation(recreated, None, &[]).unwrap();
    assert!(mapper.insert(99_999, &row, 0).unwrap().1.is_ok());
    mapper.relation(renamed, None, &[]).unwrap();
    assert!(mapper.insert(rel.id, &row, 0).is_none());

    // A partition announced under its own name maps as its root.
    let mut partition = rel.clone();
    partition.id = 4242;
    partition.name = "outbox_2024".into();
    let root = TableName::parse("public.outbox").unwrap();
    mapper.relation(partition, Some(root), &[]).unwrap();
    assert_eq!(
        mapper.insert(4242, &row, 0).unwrap().0.as_ref(),
        "public.outbox"
    );
}
