use super::apply::struct_fields;
use super::parse::parse_literal;
use super::*;
use crate::outbox::connect::data::{Data, Kind, Schema};
use crate::outbox::connect::record::Header;

fn text(s: &str) -> Data {
    Data::Str(s.to_owned())
}

/// The router's record of an envelope `{payload, eventType}` (eventType defaults to `Event`).
fn record(topic: &str) -> ConnectRecord {
    let mut event_type = Schema::required(Kind::String);
    event_type.default = Some(text("Event"));
    let envelope = Schema {
        name: Some("dbserver1.public.outbox.order.Value".into()),
        ..Schema::required(Kind::Struct(vec![
            ("payload".into(), Schema::optional(Kind::String)),
            ("eventType".into(), event_type),
        ]))
    };
    ConnectRecord {
        topic: topic.to_owned(),
        partition: None,
        key: Datum::new(Schema::optional(Kind::String), text("1001")),
        value: Datum::new(
            envelope,
            Data::Struct(vec![text("{}"), text("OrderCreated")]),
        ),
        headers: vec![Header::new(
            Arc::from("id"),
            Datum::new(Schema::required(Kind::String), text("e-1")),
        )],
    }
}

fn chain(settings: &[(&str, &str)]) -> Chain {
    let settings: Vec<(String, String)> = (settings.iter())
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    Chain::parse(&settings).unwrap()
}

fn header_names(record: &ConnectRecord) -> Vec<&str> {
    record.headers.iter().map(|h| &*h.name).collect()
}

fn field_names(datum: &Datum) -> Vec<&str> {
    let fields = datum.schema.as_deref().map_or(&[][..], struct_fields);
    fields.iter().map(|(n, _)| n.as_str()).collect()
}

#[test]
fn literals_are_read_as_values_parse_string_reads_them() {
    for (literal, kind, data) in [
        ("outbox-relay", Some(Kind::String), text("outbox-relay")),
        ("", Some(Kind::String), text("")),
        ("a:b c", Some(Kind::String), text("a:b c")),
        ("True", Some(Kind::String), text("True")),
        ("true", Some(Kind::Boolean), Data::Bool(true)),
        ("42", Some(Kind::Int8), Data::Int(42)),
        ("-129", Some(Kind::Int16), Data::Int(-129)),
        ("007", Some(Kind::Int8), Data::Int(7)),
        ("40000", Some(Kind::Int32), Data::Int(40000)),
        ("3000000000", Some(Kind::Int64), Data::Int(3_000_000_000)),
        ("null", None, Data::Null),
    ] {
        let datum = parse_literal(literal).unwrap();
        assert_eq!(datum.schema.map(|s| s.kind.clone()), kind, "{literal:?}");
        assert_eq!(datum.data, data, "{literal:?}");
    }
    for refused in [
        "1.5",
        "2024-01-01",
        "[1]",
        "{a:1}",
        " x",
        "99999999999999999999",
        "+",
    ] {
        assert!(parse_literal(refused).is_err(), "{refused:?}");
    }
}

#[test]
fn headers_are_added_copied_moved_and_dropped() {
    let c = chain(&[
        ("transforms", "lit,copy,move,drop"),
        (
            "transforms.lit.type",
            "org.apache.kafka.connect.transforms.InsertHeader",
        ),
        ("transforms.lit.header", "answer"),
        ("transforms.lit.value.literal", "42"),
        (
            "transforms.copy.type",
            "org.apache.kafka.connect.transforms.HeaderFrom$Value",
        ),
        ("transforms.copy.fields", "eventType"),
        ("transforms.copy.headers", "event-type"),
        ("transforms.copy.operation", "copy"),
        ("transforms.move.type", "HeaderFrom$Value"),
        ("transforms.move.fields", "payload"),
        ("transforms.move.headers", "body"),
        ("transforms.move.operation", "move"),
        ("transforms.drop.type", "DropHeaders"),
        ("transforms.drop.headers", "id, nothing"),
    ]);
    let out = c.apply(record("outbox.event.order")).unwrap().unwrap();
    assert_eq!(header_names(&out), ["answer", "event-type", "body"]);
    assert_eq!(out.headers[1].value.data, text("OrderCreated"));
    assert_eq!(out.headers[2].value.data, text("{}"));
    assert_eq!(field_names(&out.value), ["eventType"]);
    let schema = out.value.schema.unwrap();
    assert_eq!(
        schema.name.as_deref(),
        Some("dbserver1.public.outbox.order.Value")
    );
    // A tombstone has no struct to copy from: Kafka Connect's task stops.
    let mut tombstone = record("t");
    tombstone.value = Datum::null();
    let err = c.apply(tombstone).unwrap_err();
    assert!(
        err.contains("transform copy: Only Map objects supported"),
        "{err}"
    );
}

#[test]
fn fields_are_inserted_replaced_and_moved_to_the_key() {
    let c = chain(&[
        ("transforms", "insert,replace,tokey,extract"),
        ("transforms.insert.type", "InsertField$Value"),
        ("transforms.insert.topic.field", "topic!"),
        ("transforms.insert.partition.field", "partition"),
        ("transforms.insert.static.field", "origin"),
        ("transforms.insert.static.value", "debezium"),
        ("transforms.replace.type", "ReplaceField$Value"),
        ("transforms.replace.exclude", "payload"),
        ("transforms.replace.renames", "eventType:event_type"),
        ("transforms.tokey.type", "ValueToKey"),
        ("transforms.tokey.fields", "event_type,origin"),
        ("transforms.extract.type", "ExtractField$Key"),
        ("transforms.extract.field", "event_type"),
    ]);
    let mut input = record("outbox.event.order");
    // A null field with a default gives its default (replace.null.with.default).
    input.value.data = Data::Struct(vec![text("{}"), Data::Null]);
    let out = c.apply(input).unwrap().unwrap();
    assert_eq!(
        field_names(&out.value),
        ["event_type", "topic", "partition", "origin"]
    );
    let Data::Struct(values) = &out.value.data else {
        panic!("a struct");
    };
    assert_eq!(
        values[..],
        [
            text("Event"),
            text("outbox.event.order"),
            Data::Null,
            text("debezium")
        ]
    );
    let topic = out.value.schema.as_ref().and_then(|s| s.field("topic"));
    assert_eq!(topic.map(|s| s.optional), Some(false));
    assert_eq!(out.key.data, text("Event"));
    assert_eq!(
        out.key.schema.as_ref().and_then(|s| s.default.clone()),
        Some(text("Event"))
    );
    // Not a struct: Kafka Connect's task stops.
    let mut plain = record("t");
    plain.value = Datum::new(Schema::optional(Kind::String), text("x"));
    let err = c.apply(plain).unwrap_err();
    assert!(
        err.contains("Only Struct objects supported for [field insertion]"),
        "{err}"
    );
}

#[test]
fn filters_drop_what_their_predicates_select() {
    let c = chain(&[
        ("transforms", "customers,tombstones,withid"),
        ("transforms.customers.type", "Filter"),
        ("transforms.customers.predicate", "customer"),
        (
            "transforms.tombstones.type",
            "org.apache.kafka.connect.transforms.Filter",
        ),
        ("transforms.tombstones.predicate", "tombstone"),
        ("transforms.withid.type", "Filter"),
        ("transforms.withid.predicate", "hasid"),
        ("transforms.withid.negate", "true"),
        ("predicates", "customer,tombstone,hasid"),
        ("predicates.customer.type", "TopicNameMatches"),
        ("predicates.customer.pattern", "outbox\\.event\\.customer"),
        ("predicates.tombstone.type", "RecordIsTombstone"),
        ("predicates.hasid.type", "HasHeaderKey"),
        ("predicates.hasid.name", "id"),
    ]);
    let kept = |record: ConnectRecord| c.apply(record).unwrap().is_some();
    assert!(kept(record("outbox.event.order")));
    assert!(!kept(record("outbox.event.customer")));
    assert!(
        kept(record("outbox.event.customers")),
        "the whole topic matches"
    );
    let mut tombstone = record("outbox.event.order");
    tombstone.value = Datum::null();
    assert!(!kept(tombstone));
    let mut no_id = record("outbox.event.order");
    no_id.headers.clear();
    assert!(!kept(no_id));
}

#[test]
fn what_is_not_reproduced_is_refused_by_key() {
    for (settings, key) in [
        (
            &[("transforms", "r"), ("transforms.r.type", "RegexRouter")][..],
            "transforms.r.type",
        ),
        (
            &[("transforms", "c"), ("transforms.c.type", "Cast$Value")],
            "transforms.c.type",
        ),
        (
            &[
                ("transforms", "h"),
                ("transforms.h.type", "InsertHeader"),
                ("transforms.h.header", "h"),
                ("transforms.h.value.literal", "x"),
                ("transforms.h.valu.literal", "typo"),
            ],
            "transforms.h.valu.literal",
        ),
        (
            &[("transforms", "h"), ("transforms.h.type", "InsertHeader")],
            "transforms.h.header",
        ),
        (&[("transforms.x.type", "Filter")], "transforms.x.type"),
        (
            &[
                ("transforms", "f"),
                ("transforms.f.type", "Filter"),
                ("transforms.f.predicate", "p"),
            ],
            "transforms.f.predicate",
        ),
        (
            &[
                ("transforms", "f"),
                ("transforms.f.type", "Filter"),
                ("transforms.f.predicate", "p"),
                ("predicates", "p"),
                ("predicates.p.type", "TopicNameMatches"),
                ("predicates.p.pattern", "(?<=a)b"),
            ],
            "predicates.p.pattern",
        ),
        (
            &[
                ("transforms", "e"),
                ("transforms.e.type", "ExtractField$Value"),
                ("transforms.e.field", "a.b"),
                ("transforms.e.field.syntax.version", "V2"),
            ],
            "transforms.e.field.syntax.version",
        ),
    ] {
        let settings: Vec<(String, String)> = (settings.iter())
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let err = Chain::parse(&settings).unwrap_err();
        assert_eq!(err.key, key, "{err}");
    }
}
