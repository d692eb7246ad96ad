use super::super::data::{JsonSettings, to_json_with};
use super::*;

const T: &str = "public.outbox_types";

fn oid(ty: &Type) -> u32 {
    ty.oid()
}

/// A column of type `ty` (modifier `typmod`) under `modes`, nullable unless `not_null`.
fn column(ty: Type, typmod: i32, modes: &ColumnModes, default: Option<&str>) -> Column {
    let pg = PgType::of(oid(&ty), typmod).unwrap();
    let site = ColumnSite {
        table: T,
        name: "c",
        not_null: false,
        default,
    };
    Column::new(pg, site, modes).unwrap()
}

/// The JSON (with schema) JsonConverter writes for `text` read as the column.
fn json(column: &Column, text: &str) -> String {
    let data = column.read(text.as_bytes()).unwrap();
    let settings = JsonSettings {
        schemas: true,
        numeric_decimals: false,
    };
    to_json_with(Some(&column.schema), &data, settings)
        .unwrap()
        .unwrap()
}

fn modes(time: TimePrecision, decimal: DecimalHandling) -> ColumnModes {
    ColumnModes {
        time,
        decimal,
        ..ColumnModes::default()
    }
}

/// The values of tests/fixtures/debezium-records/types-*.json, one row per type and mode.
#[test]
fn typed_columns_as_debezium_writes_them() {
    use DecimalHandling::{Double, Precise, String as Str};
    use TimePrecision::{Adaptive, AdaptiveTimeMicroseconds as Micro, Connect, Isostring};
    let timestamptz = "2000-01-01 00:00:00.000001+05:30";
    for (ty, typmod, time, decimal, text, expected) in [
        (
            Type::TIMESTAMPTZ,
            -1,
            Adaptive,
            Precise,
            timestamptz,
            r#"{"schema":{"type":"string","optional":true,"name":"io.debezium.time.ZonedTimestamp","version":1},"payload":"1999-12-31T18:30:00.000001Z"}"#,
        ),
        (
            Type::TIMESTAMPTZ,
            3,
            Isostring,
            Precise,
            "2038-01-19 03:14:08.5+00",
            r#"{"schema":{"type":"string","optional":true,"name":"io.debezium.time.ZonedTimestamp","version":1},"payload":"2038-01-19T03:14:08.500Z"}"#,
        ),
        (
            Type::TIMESTAMP,
            3,
            Adaptive,
            Precise,
            "1969-12-31 23:59:59.999",
            r#"{"schema":{"type":"int64","optional":true,"name":"io.debezium.time.Timestamp","version":1},"payload":-1}"#,
        ),
        (
            Type::TIMESTAMP,
            -1,
            Micro,
            Precise,
            "1969-12-31 23:59:59.999999",
            r#"{"schema":{"type":"int64","optional":true,"name":"io.debezium.time.MicroTimestamp","version":1},"payload":-1}"#,
        ),
        (
            Type::TIMESTAMP,
            -1,
            Connect,
            Precise,
            "1969-12-31 23:59:59.999999",
            r#"{"schema":{"type":"int64","optional":true,"name":"org.apache.kafka.connect.data.Timestamp","version":1},"payload":-1}"#,
        ),
        (
            Type::TIMESTAMP,
            -1,
            Isostring,
            Precise,
            "2000-01-01 00:00:00.1",
            r#"{"schema":{"type":"string","optional":true,"name":"io.debezium.time.IsoTimestamp","version":1},"payload":"2000-01-01T00:00:00.1Z"}"#,
        ),
        (
            Type::DATE,
            -1,
            Adaptive,
            Precise,
            "0001-01-01",
            r#"{"schema":{"type":"int32","optional":true,"name":"io.debezium.time.Date","version":1},"payload":-719162}"#,
        ),
        (
            Type::DATE,
            -1,
            Connect,
            Precise,
            "2024-02-29",
            r#"{"schema":{"type":"int32","optional":true,"name":"org.apache.kafka.connect.data.Date","version":1},"payload":19782}"#,
        ),
        (
            Type::DATE,
            -1,
            Isostring,
            Precise,
            "2024-02-29",
            r#"{"schema":{"type":"string","optional":true,"name":"io.debezium.time.IsoDate","version":1},"payload":"2024-02-29Z"}"#,
        ),
        (
            Type::TIME,
            3,
            Adaptive,
            Precise,
            "12:34:56.78",
            r#"{"schema":{"type":"int32","optional":true,"name":"io.debezium.time.Time","version":1},"payload":45296780}"#,
        ),
        (
            Type::TIME,
            3,
            Micro,
            Precise,
            "00:00:00.001",
            r#"{"schema":{"type":"int64","optional":true,"name":"io.debezium.time.MicroTime","version":1},"payload":1000}"#,
        ),
        (
            Type::TIME,
            -1,
            Adaptive,
            Precise,
            "13:14:15.123456",
            r#"{"schema":{"type":"int64","optional":true,"name":"io.debezium.time.MicroTime","version":1},"payload":47655123456}"#,
        ),
        (
            Type::TIME,
            -1,
            Connect,
            Precise,
            "12:00:00.5",
            r#"{"schema":{"type":"int32","optional":true,"name":"org.apache.kafka.connect.data.Time","version":1},"payload":43200500}"#,
        ),
        (
            Type::TIME,
            -1,
            Isostring,
            Precise,
            "00:00:00",
            r#"{"schema":{"type":"string","optional":true,"name":"io.debezium.time.IsoTime","version":1},"payload":"00:00:00Z"}"#,
        ),
        (
            Type::NUMERIC,
            (10 << 16 | 2) + 4,
            Adaptive,
            Precise,
            "-12.30",
            r#"{"schema":{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2","connect.decimal.precision":"10"}},"payload":"+zI="}"#,
        ),
        (
            Type::NUMERIC,
            -1,
            Adaptive,
            Precise,
            "-0.00000000015",
            r#"{"schema":{"type":"struct","fields":[{"type":"int32","optional":false,"field":"scale"},{"type":"bytes","optional":false,"field":"value"}],"optional":true,"name":"io.debezium.data.VariableScaleDecimal","version":1,"doc":"Variable scaled decimal"},"payload":{"scale":11,"value":"8Q=="}}"#,
        ),
        (
            Type::NUMERIC,
            (10 << 16 | 2) + 4,
            Adaptive,
            Double,
            "99999999.99",
            r#"{"schema":{"type":"double","optional":true},"payload":9.999999999E7}"#,
        ),
        (
            Type::NUMERIC,
            -1,
            Adaptive,
            Str,
            "-0.00000000015",
            r#"{"schema":{"type":"string","optional":true},"payload":"-0.00000000015"}"#,
        ),
        (
            Type::FLOAT4,
            -1,
            Adaptive,
            Precise,
            "3.4028235e+38",
            r#"{"schema":{"type":"float","optional":true},"payload":3.4028235E38}"#,
        ),
        (
            Type::FLOAT8,
            -1,
            Adaptive,
            Precise,
            "Infinity",
            r#"{"schema":{"type":"double","optional":true},"payload":"Infinity"}"#,
        ),
        (
            Type::BPCHAR,
            7,
            Adaptive,
            Precise,
            "ab ",
            r#"{"schema":{"type":"string","optional":true},"payload":"ab "}"#,
        ),
        (
            Type::INT2,
            -1,
            Adaptive,
            Precise,
            "-32768",
            r#"{"schema":{"type":"int16","optional":true},"payload":-32768}"#,
        ),
        (
            Type::BOOL,
            -1,
            Adaptive,
            Precise,
            "t",
            r#"{"schema":{"type":"boolean","optional":true},"payload":true}"#,
        ),
    ] {
        let c = column(ty.clone(), typmod, &modes(time, decimal), None);
        assert_eq!(
            json(&c, text),
            expected,
            "{ty} {typmod} {time:?} {decimal:?} {text}"
        );
    }
}

#[test]
fn bytea_under_each_binary_handling_mode() {
    for (binary, expected) in [
        (
            BinaryHandling::Bytes,
            r#"{"schema":{"type":"bytes","optional":true},"payload":"+/8="}"#,
        ),
        (
            BinaryHandling::Base64,
            r#"{"schema":{"type":"string","optional":true},"payload":"+/8="}"#,
        ),
        (
            BinaryHandling::Base64UrlSafe,
            r#"{"schema":{"type":"string","optional":true},"payload":"-_8="}"#,
        ),
        (
            BinaryHandling::Hex,
            r#"{"schema":{"type":"string","optional":true},"payload":"fbff"}"#,
        ),
    ] {
        let modes = ColumnModes {
            binary,
            ..ColumnModes::default()
        };
        let c = column(Type::BYTEA, -1, &modes, None);
        assert_eq!(json(&c, "\\xfbff"), expected, "{binary:?}");
    }
}

#[test]
fn values_debezium_encodes_differently_are_refused() {
    let adaptive = ColumnModes::default();
    for (ty, typmod, text) in [
        (Type::TIMESTAMPTZ, -1, "infinity"),
        (Type::TIMESTAMP, -1, "-infinity"),
        (Type::DATE, -1, "0044-03-15 BC"),
        (Type::TIME, -1, "24:00:00"),
        (Type::NUMERIC, -1, "NaN"),
        (Type::BYTEA, -1, "plain"),
    ] {
        let c = column(ty.clone(), typmod, &adaptive, None);
        assert!(c.read(text.as_bytes()).is_err(), "{ty} {text}");
    }
    assert_eq!(PgType::of(oid(&Type::INTERVAL), -1), None);
    assert_eq!(PgType::of(oid(&Type::MONEY), -1), None);
}

/// Debezium's PostgresDefaultValueConverter, as types-*.json's schemas show it.
#[test]
fn defaults_as_debezium_parses_them() {
    let adaptive = ColumnModes::default();
    let iso = modes(TimePrecision::Isostring, DecimalHandling::String);
    let numeric = (10 << 16 | 2) + 4;
    for (ty, typmod, modes, expr, default) in [
        (
            Type::TEXT,
            -1,
            &adaptive,
            "'It''s'::text",
            Some(Data::Str("It's".into())),
        ),
        (
            Type::VARCHAR,
            259,
            &adaptive,
            "'Event'::character varying",
            Some(Data::Str("Event".into())),
        ),
        (
            Type::TEXT,
            -1,
            &adaptive,
            "upper('x'::text)",
            Some(Data::Str(String::new())),
        ),
        (Type::TEXT, -1, &adaptive, "NULL::text", None),
        (
            Type::UUID,
            -1,
            &adaptive,
            "gen_random_uuid()",
            Some(Data::Str("00000000-0000-0000-0000-000000000000".into())),
        ),
        (
            Type::TIMESTAMPTZ,
            -1,
            &adaptive,
            "now()",
            Some(Data::Str("1970-01-01T00:00:00.000000Z".into())),
        ),
        (
            Type::TIMESTAMPTZ,
            -1,
            &adaptive,
            "CURRENT_TIMESTAMP",
            Some(Data::Str("1970-01-01T00:00:00.000000Z".into())),
        ),
        (
            Type::TIMESTAMP,
            3,
            &adaptive,
            "'2000-01-01 12:00:00.5'::timestamp without time zone",
            Some(Data::Int(946_728_000_500)),
        ),
        (
            Type::TIMESTAMP,
            3,
            &iso,
            "'2000-01-01 12:00:00.5'::timestamp without time zone",
            Some(Data::Str("2000-01-01T12:00:00.5Z".into())),
        ),
        (
            Type::DATE,
            -1,
            &adaptive,
            "'2020-01-01'::date",
            Some(Data::Int(18262)),
        ),
        (
            Type::DATE,
            -1,
            &iso,
            "'2020-01-01'::date",
            Some(Data::Str("2020-01-01Z".into())),
        ),
        (
            Type::TIME,
            -1,
            &adaptive,
            "'12:00:00'::time without time zone",
            Some(Data::Int(43_200_000_000)),
        ),
        (
            Type::NUMERIC,
            numeric,
            &adaptive,
            "0",
            Some(Data::Decimal(
                Decimal::parse("0.00").unwrap_or_else(|| unreachable!()),
            )),
        ),
        (
            Type::NUMERIC,
            numeric,
            &iso,
            "0",
            Some(Data::Str("0.00".into())),
        ),
        (Type::NUMERIC, -1, &adaptive, "1", None),
        (Type::FLOAT8, -1, &adaptive, "1.5", Some(Data::Float(1.5))),
        (
            Type::INT4,
            -1,
            &adaptive,
            "'-1'::integer",
            Some(Data::Int(-1)),
        ),
        (
            Type::INT8,
            -1,
            &adaptive,
            "nextval('s'::regclass)",
            Some(Data::Int(0)),
        ),
        (Type::BOOL, -1, &adaptive, "false", Some(Data::Bool(false))),
        (Type::BOOL, -1, &adaptive, "true", Some(Data::Bool(true))),
        (Type::BYTEA, -1, &adaptive, "'\\x00'::bytea", None),
        (
            Type::JSONB,
            -1,
            &adaptive,
            "'{}'::jsonb",
            Some(Data::Str("{}".into())),
        ),
    ] {
        let c = column(ty.clone(), typmod, modes, Some(expr));
        assert_eq!(c.schema.default, default, "{ty} {expr}");
    }
}

/// tests/fixtures/debezium-records/types-propagate.json's parameters.
#[test]
fn source_types_as_debezium_propagates_them() {
    let modes = ColumnModes {
        source_types: SourceTypes::parse(Some("public\\.outbox_types\\..*"), None).unwrap(),
        ..ColumnModes::default()
    };
    for (ty, typmod, source) in [
        (Type::TIMESTAMPTZ, -1, ("TIMESTAMPTZ", "35", "6")),
        (Type::TIMESTAMP, 3, ("TIMESTAMP", "26", "3")),
        (Type::TIMESTAMP, -1, ("TIMESTAMP", "29", "6")),
        (Type::DATE, -1, ("DATE", "13", "0")),
        (Type::TIME, -1, ("TIME", "15", "6")),
        (Type::TIME, 3, ("TIME", "12", "3")),
        (Type::NUMERIC, (10 << 16 | 2) + 4, ("NUMERIC", "10", "2")),
        (Type::NUMERIC, -1, ("NUMERIC", "131089", "0")),
        (Type::FLOAT4, -1, ("FLOAT4", "8", "8")),
        (Type::FLOAT8, -1, ("FLOAT8", "17", "17")),
        (Type::BOOL, -1, ("BOOL", "1", "0")),
        (Type::INT2, -1, ("INT2", "5", "0")),
        (Type::INT4, -1, ("INT4", "10", "0")),
        (Type::INT8, -1, ("INT8", "19", "0")),
        (Type::BPCHAR, 7, ("BPCHAR", "3", "0")),
        (Type::VARCHAR, 259, ("VARCHAR", "255", "0")),
        (Type::TEXT, -1, ("TEXT", "2147483647", "0")),
        (Type::UUID, -1, ("UUID", "2147483647", "0")),
        (Type::JSONB, -1, ("JSONB", "2147483647", "0")),
        (Type::BYTEA, -1, ("BYTEA", "2147483647", "0")),
    ] {
        let c = column(ty.clone(), typmod, &modes, None);
        let parameters: Vec<(&str, &str)> = (c.schema.parameters.iter())
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .filter(|(k, _)| k.starts_with("__debezium"))
            .collect();
        let (name, length, scale) = source;
        assert_eq!(
            parameters,
            [
                ("__debezium.source.column.type", name),
                ("__debezium.source.column.length", length),
                ("__debezium.source.column.scale", scale),
                ("__debezium.source.column.name", "c"),
            ],
            "{ty} {typmod}"
        );
    }
    let name = PgType::of(oid(&Type::NAME), -1).unwrap();
    let site = ColumnSite {
        table: T,
        name: "c",
        not_null: true,
        default: None,
    };
    assert!(
        Column::new(name, site, &modes).is_err(),
        "name's length is unverified"
    );
}

#[test]
fn source_type_patterns_match_whole_names_without_case() {
    let types = SourceTypes::parse(
        Some("PUBLIC.outbox.aggregate.*"),
        Some(".+\\.varchar,.+\\.int8"),
    )
    .unwrap();
    assert!(types.matches("public.outbox", "aggregateid", "int4"));
    assert!(!types.matches("public.outbox2", "aggregateid", "int4"));
    assert!(types.matches("public.x", "y", "varchar"));
    assert!(types.matches("public.x", "y", "INT8"));
    assert!(!types.matches("public.x", "y", "int4"));
    let escaped = SourceTypes::parse(Some("a\\,b,c"), None).unwrap();
    assert_eq!(escaped.columns.len(), 2);
    assert!(SourceTypes::parse(Some("(?<=x)y"), None).is_err());
}
