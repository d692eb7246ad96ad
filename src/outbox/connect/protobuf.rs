//! PURE: Confluent's `ProtobufConverter` (7.0.16, with its default settings) without its
//! registry: the `.proto` schema `io.confluent.connect.protobuf.ProtobufData` derives from a
//! Connect schema, as the converter registers it, and a value's bytes after the schema id (the
//! message indexes, then the protobuf body). The id in front is resolved elsewhere
//! (`registry`).
//!
//! What the derivation follows, as measured against the converter
//! (`tests/fixtures/debezium-records/protobuf*.json`): a root that is not a struct becomes a
//! wrapper of `google/protobuf/wrappers.proto` (`StringValue` for strings, `Int64Value` for
//! int64, ...), and the schema registered is that whole file as protobuf-java's descriptor
//! prints it, the record naming its message by index (`StringValue` is the eighth: `[7]`). A
//! struct (an envelope) becomes a proto3 `message` named after the Connect name's last part, in
//! the package of the rest, its fields numbered in order with proto3 scalar types (an optional
//! field is a plain scalar: `optional.for.nullables` and `wrapper.for.nullables` are off), and
//! the record names it by the `[0]` shortcut (one zero byte). proto3 writes no field whose value
//! is its type's default (empty, zero, false) and no null.
//!
//! What was not measured is refused by name rather than guessed: nested structs and arrays
//! (expanded payloads), `int16` fields (the converter adds `connect.type` options, which import
//! Confluent's `meta.proto`), logical types, a value without schema, and a struct without
//! package.

use super::data::{self, Data, Kind, Schema};

/// `google/protobuf/wrappers.proto` as the converter registers it: protobuf-java 3.25's
/// descriptor of the file, printed by Confluent's `ProtobufSchema` (the wheel's protobuf-java).
pub const WRAPPERS: &str = r#"syntax = "proto3";
package google.protobuf;

option java_package = "com.google.protobuf";
option java_outer_classname = "WrappersProto";
option java_multiple_files = true;
option go_package = "google.golang.org/protobuf/types/known/wrapperspb";
option cc_enable_arenas = true;
option objc_class_prefix = "GPB";
option csharp_namespace = "Google.Protobuf.WellKnownTypes";

message DoubleValue {
  double value = 1 [json_name = "value"];
}
message FloatValue {
  float value = 1 [json_name = "value"];
}
message Int64Value {
  int64 value = 1 [json_name = "value"];
}
message UInt64Value {
  uint64 value = 1 [json_name = "value"];
}
message Int32Value {
  int32 value = 1 [json_name = "value"];
}
message UInt32Value {
  uint32 value = 1 [json_name = "value"];
}
message BoolValue {
  bool value = 1 [json_name = "value"];
}
message StringValue {
  string value = 1 [json_name = "value"];
}
message BytesValue {
  bytes value = 1 [json_name = "value"];
}
"#;

/// A proto3 scalar type, as a field or a wrapper's `value` holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scalar {
    Bool,
    Int32,
    Int64,
    Double,
    String,
    Bytes,
}

impl Scalar {
    /// The scalar of a Connect `kind`, or why the converter's output for it is not reproduced.
    fn of(kind: &Kind) -> Result<Scalar, String> {
        Ok(match kind {
            Kind::Boolean => Scalar::Bool,
            Kind::Int32 => Scalar::Int32,
            Kind::Int64 => Scalar::Int64,
            Kind::Float64 => Scalar::Double,
            Kind::String => Scalar::String,
            Kind::Bytes => Scalar::Bytes,
            other => return Err(format!("a {} field", data::type_name(other))),
        })
    }

    /// The type's name in a `.proto` file.
    fn name(self) -> &'static str {
        match self {
            Scalar::Bool => "bool",
            Scalar::Int32 => "int32",
            Scalar::Int64 => "int64",
            Scalar::Double => "double",
            Scalar::String => "string",
            Scalar::Bytes => "bytes",
        }
    }

    /// The wrapper's index among `wrappers.proto`'s messages.
    fn wrapper_index(self) -> u32 {
        match self {
            Scalar::Double => 0,
            Scalar::Int64 => 2,
            Scalar::Int32 => 4,
            Scalar::Bool => 6,
            Scalar::String => 7,
            Scalar::Bytes => 8,
        }
    }
}

/// What the converter writes a root as: a wrapper, or a message of scalar fields.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Root {
    Wrapper(Scalar),
    Message(Vec<Scalar>),
}

/// A Connect schema's protobuf schema, as `ProtobufData.fromConnectSchema` derives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtobufSchema {
    root: Root,
    text: String,
    /// The message's full name (`package.Name`).
    full_name: String,
}

impl ProtobufSchema {
    /// The schema of `schema`; `Err`: why the converter throws, or why what it writes is not
    /// reproduced (named, so the relay refuses it).
    pub fn from_connect(schema: Option<&Schema>) -> Result<Self, String> {
        let not_reproduced = |what: String| {
            format!(
                "ProtobufConverter: {what} is not reproduced (not measured against Confluent's converter)"
            )
        };
        let Some(schema) = schema else {
            return Err(not_reproduced("a value without schema".into()));
        };
        if let Kind::Array(_) = schema.kind {
            let why = "ProtobufConverter: a key or value that is an array is not written: Confluent's converter throws on it (Unsupported root schema of type ARRAY)";
            return Err(why.into());
        }
        if let Some(logical) = connect_logical(schema) {
            return Err(not_reproduced(format!("a value of type {logical}")));
        }
        let Kind::Struct(fields) = &schema.kind else {
            let scalar = Scalar::of(&schema.kind).map_err(not_reproduced)?;
            let full_name = format!("google.protobuf.{}", wrapper_name(scalar));
            return Ok(ProtobufSchema {
                root: Root::Wrapper(scalar),
                text: WRAPPERS.to_owned(),
                full_name,
            });
        };
        let full_name = schema.name.as_deref().unwrap_or_default();
        let Some((package, name)) = full_name.rsplit_once('.') else {
            return Err(not_reproduced(format!(
                "a struct named {full_name:?} (no package)"
            )));
        };
        if !valid_name(name) || !package.split('.').all(valid_name) {
            return Err(not_reproduced(format!("the message name {full_name:?}")));
        }
        let mut text = format!("syntax = \"proto3\";\npackage {package};\n\nmessage {name} {{\n");
        let mut scalars = Vec::new();
        for (number, (field, field_schema)) in (1..).zip(fields) {
            if !valid_name(field) {
                return Err(not_reproduced(format!("the field name {field:?}")));
            }
            if let Some(logical) = connect_logical(field_schema) {
                return Err(not_reproduced(format!("field {field:?} of type {logical}")));
            }
            let scalar = Scalar::of(&field_schema.kind)
                .map_err(|what| not_reproduced(format!("{what} ({field:?})")))?;
            text.push_str(&format!("  {} {field} = {number};\n", scalar.name()));
            scalars.push(scalar);
        }
        text.push_str("}\n");
        Ok(ProtobufSchema {
            root: Root::Message(scalars),
            text,
            full_name: full_name.to_owned(),
        })
    }

    /// The schema's text, as the converter registers it.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The full name of the record's message (`RecordNameStrategy`'s subject).
    pub fn full_name(&self) -> &str {
        &self.full_name
    }

    /// Appends `data`'s message indexes and protobuf body to `out`.
    pub fn encode(&self, data: &Data, out: &mut Vec<u8>) -> Result<(), String> {
        match (&self.root, data) {
            (Root::Wrapper(scalar), data) => {
                // One index: the count, then the index, both zigzag varints.
                varint(out, zigzag(1));
                varint(out, zigzag(i64::from(scalar.wrapper_index())));
                field(out, 1, *scalar, data)
            }
            (Root::Message(scalars), Data::Struct(values)) if values.len() == scalars.len() => {
                // The first message of the file: the `[0]` shortcut.
                out.push(0);
                for (number, (scalar, value)) in (1..).zip(scalars.iter().zip(values)) {
                    field(out, number, *scalar, value)?;
                }
                Ok(())
            }
            (Root::Message(_), other) => Err(format!("a value that is not its struct: {other:?}")),
        }
    }
}

/// Connect's logical types (`Decimal`, `Date`, `Time`, `Timestamp`), which the converter
/// writes as messages of other files (`confluent/type/decimal.proto`, `google/type/...`); other
/// names (`io.debezium.data.Json`, `io.debezium.time.*`) do not change the type.
fn connect_logical(schema: &Schema) -> Option<&str> {
    let name = schema.name.as_deref()?;
    name.starts_with("org.apache.kafka.connect.data.")
        .then_some(name)
}

/// The wrapper message of `scalar`.
fn wrapper_name(scalar: Scalar) -> &'static str {
    match scalar {
        Scalar::Bool => "BoolValue",
        Scalar::Int32 => "Int32Value",
        Scalar::Int64 => "Int64Value",
        Scalar::Double => "DoubleValue",
        Scalar::String => "StringValue",
        Scalar::Bytes => "BytesValue",
    }
}

/// A name protobuf accepts: a letter or `_`, then letters, digits or `_` (ASCII).
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    let first = chars.next();
    first.is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Protobuf's zigzag mapping of a signed number.
fn zigzag(n: i64) -> u64 {
    ((n << 1) ^ (n >> 63)) as u64
}

/// Appends `n` as a base-128 varint.
fn varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// Appends field `number` holding `value` as `scalar`, unless proto3 leaves it out (null, or
/// its type's default).
fn field(out: &mut Vec<u8>, number: u32, scalar: Scalar, value: &Data) -> Result<(), String> {
    let tag = |out: &mut Vec<u8>, wire: u32| varint(out, u64::from(number << 3 | wire));
    match (scalar, value) {
        (_, Data::Null) => {}
        (Scalar::Bool, Data::Bool(b)) => {
            if *b {
                tag(out, 0);
                out.push(1);
            }
        }
        (Scalar::Int32 | Scalar::Int64, Data::Int(n)) => {
            if *n != 0 {
                tag(out, 0);
                // Negative int32 and int64 alike take ten bytes, sign-extended.
                varint(out, *n as u64);
            }
        }
        (Scalar::Double, Data::Float(f)) => {
            // Java's Double.equals: only +0.0 is the default.
            if f.to_bits() != 0 {
                tag(out, 1);
                out.extend_from_slice(&f.to_le_bytes());
            }
        }
        (Scalar::String, Data::Str(s)) => delimited(out, tag, s.as_bytes()),
        (Scalar::Bytes, Data::Bytes(b)) => delimited(out, tag, b),
        (scalar, other) => return Err(format!("a {} field holding {other:?}", scalar.name())),
    }
    Ok(())
}

/// A length-delimited field, left out when empty.
fn delimited(out: &mut Vec<u8>, tag: impl Fn(&mut Vec<u8>, u32), bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    tag(out, 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(kind: Kind) -> Schema {
        Schema::optional(kind)
    }

    #[test]
    fn roots_that_are_not_structs_are_wrappers_by_index() {
        // (kind, value) -> the bytes after the id, as the converter wrote them
        // (tests/fixtures/debezium-records/protobuf.json).
        let table: Vec<(Kind, Data, &[u8])> = vec![
            (
                Kind::String,
                Data::Str("1001".into()),
                b"\x02\x0e\x0a\x041001",
            ),
            (Kind::String, Data::Str(String::new()), b"\x02\x0e"),
            (Kind::Int64, Data::Int(1), b"\x02\x04\x08\x01"),
            (Kind::Int64, Data::Int(0), b"\x02\x04"),
            (
                Kind::Int64,
                Data::Int(-9_000_000_000),
                b"\x02\x04\x08\x80\xcc\xbb\xbc\xde\xff\xff\xff\xff\x01",
            ),
            (Kind::Bytes, Data::Bytes(vec![1]), b"\x02\x10\x0a\x01\x01"),
            (Kind::Boolean, Data::Bool(true), b"\x02\x0c\x08\x01"),
            (Kind::Float64, Data::Float(0.0), b"\x02\x00"),
        ];
        for (kind, data, expected) in table {
            let derived = ProtobufSchema::from_connect(Some(&schema(kind.clone()))).unwrap();
            assert_eq!(derived.text(), WRAPPERS);
            let mut out = Vec::new();
            derived.encode(&data, &mut out).unwrap();
            assert_eq!(out, expected, "{kind:?} {data:?}");
        }
    }

    #[test]
    fn an_envelope_is_a_message_of_scalars_numbered_in_order() {
        let mut envelope = schema(Kind::Struct(vec![
            ("payload".into(), schema(Kind::Bytes)),
            ("eventType".into(), schema(Kind::String)),
            ("aggregateid".into(), schema(Kind::Int64)),
            ("version".into(), schema(Kind::Int32)),
        ]));
        envelope.name = Some("dbserver1.public.outbox_bytes.bytes.Value".into());
        envelope.optional = false;
        let derived = ProtobufSchema::from_connect(Some(&envelope)).unwrap();
        assert_eq!(
            derived.text(),
            "syntax = \"proto3\";\npackage dbserver1.public.outbox_bytes.bytes;\n\nmessage Value {\n  bytes payload = 1;\n  string eventType = 2;\n  int64 aggregateid = 3;\n  int32 version = 4;\n}\n"
        );
        assert_eq!(
            derived.full_name(),
            "dbserver1.public.outbox_bytes.bytes.Value"
        );
        let value = Data::Struct(vec![
            Data::Bytes(b"end".to_vec()),
            Data::Str("End".into()),
            Data::Int(1_048_575),
            Data::Null,
        ]);
        let mut out = Vec::new();
        derived.encode(&value, &mut out).unwrap();
        assert_eq!(out, b"\x00\x0a\x03end\x12\x03End\x18\xff\xff\x3f");
    }

    #[test]
    fn what_was_not_measured_is_refused_by_name() {
        let named = |kind: Kind, name: &str| {
            let mut s = schema(kind);
            s.name = Some(name.into());
            s
        };
        let table: Vec<(Option<Schema>, &str)> = vec![
            (None, "without schema"),
            (Some(schema(Kind::Int16)), "int16"),
            (
                Some(schema(Kind::Array(Box::new(schema(Kind::String))))),
                "ARRAY",
            ),
            (
                Some(named(
                    Kind::Struct(vec![("a".into(), schema(Kind::Int16))]),
                    "p.V",
                )),
                "int16",
            ),
            (
                Some(named(
                    Kind::Struct(vec![("a".into(), schema(Kind::Struct(vec![])))]),
                    "p.V",
                )),
                "struct",
            ),
            (
                Some(named(
                    Kind::Struct(vec![("a-b".into(), schema(Kind::String))]),
                    "p.V",
                )),
                "field name",
            ),
            (Some(named(Kind::Struct(vec![]), "V")), "no package"),
        ];
        for (schema, needle) in table {
            let refused = ProtobufSchema::from_connect(schema.as_ref()).unwrap_err();
            assert!(refused.contains(needle), "{needle}: {refused}");
        }
    }
}
