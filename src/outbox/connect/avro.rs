//! PURE: Confluent's `AvroConverter` (7.0) without its registry: the Avro schema
//! `io.confluent.connect.avro.AvroData` derives from a Connect schema, that schema's text as
//! Avro 1.11's `Schema.toString()` writes it (what the converter registers), and a value's
//! Avro binary body. The registry's schema id, which goes in front of the body, is resolved
//! elsewhere (`registry`).
//!
//! What the derivation follows: optional schemas become unions with `null` (`null` first,
//! unless the schema has a default), Connect metadata goes into `connect.*` properties
//! (`connect.meta.data`), structs become records named after the Connect name (split at the
//! last dot into namespace and name) or `io.confluent.connect.avro.ConnectDefault[N]`, equal
//! non-optional schemas are one Avro schema, written in full once and by name after that.
//! Where Avro refuses a name (`Illegal character in: ...`), or two different records share
//! one, Debezium's converter throws and the task stops; so does the derivation here.

use std::collections::HashMap;
use std::fmt::Write as _;

use unicode_general_category::{GeneralCategory, get_general_category};

use super::data::{DECIMAL, Data, Kind, Schema, write_double, write_float, write_jackson_string};

/// `io.confluent.connect.avro.AvroData`'s namespace for the names it makes up.
const NAMESPACE: &str = "io.confluent.connect.avro";
/// The schema of a value without a Connect schema: a record with one optional field per type.
const ANYTHING: &str = r#"{"type":"record","name":"Anything","namespace":"io.confluent.connect.avro","fields":[{"name":"boolean","type":["null","boolean"],"default":null},{"name":"bytes","type":["null","bytes"],"default":null},{"name":"double","type":["null","double"],"default":null},{"name":"float","type":["null","float"],"default":null},{"name":"int","type":["null","int"],"default":null},{"name":"long","type":["null","long"],"default":null},{"name":"string","type":["null","string"],"default":null},{"name":"array","type":["null",{"type":"array","items":"Anything"}],"default":null},{"name":"map","type":["null",{"type":"array","items":{"type":"record","name":"MapEntry","fields":[{"name":"key","type":"Anything"},{"name":"value","type":"Anything"}]}}],"default":null}]}"#;
/// Avro's primitive type names: no named schema may be called one of them.
const PRIMITIVES: [&str; 8] = [
    "null", "boolean", "int", "long", "float", "double", "bytes", "string",
];
/// Debezium's parameter of a `Decimal`'s precision, which `AvroData` writes as `precision`.
const DECIMAL_PRECISION: &str = "connect.decimal.precision";
/// `AvroData`'s precision of a `Decimal` without [`DECIMAL_PRECISION`].
const DEFAULT_DECIMAL_PRECISION: i64 = 64;
/// Kafka Connect's logical types that `AvroData` marks with an Avro `logicalType`.
const LOGICAL_TYPES: [(&str, &str); 4] = [
    (DECIMAL, "decimal"),
    ("org.apache.kafka.connect.data.Time", "time-millis"),
    (
        "org.apache.kafka.connect.data.Timestamp",
        "timestamp-millis",
    ),
    ("org.apache.kafka.connect.data.Date", "date"),
];

/// The `AvroDataConfig` settings that change schemas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// `connect.meta.data` (default true): the `connect.*` properties.
    pub connect_meta_data: bool,
    /// `scrub.invalid.names` (default false): names made valid rather than refused.
    pub scrub_invalid_names: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            connect_meta_data: true,
            scrub_invalid_names: false,
        }
    }
}

/// A JSON value in a schema: a property or a default, written as Jackson writes it.
#[derive(Clone, Debug, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Int(i64),
    /// A Java `float`, written as `Float.toString` does.
    Float(f64),
    Double(f64),
    Str(String),
    /// An object of strings (`connect.parameters`).
    Object(Vec<(String, String)>),
}

/// An Avro primitive type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Primitive {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    Bytes,
    String,
}

impl Primitive {
    fn name(self) -> &'static str {
        match self {
            Primitive::Null => "null",
            Primitive::Boolean => "boolean",
            Primitive::Int => "int",
            Primitive::Long => "long",
            Primitive::Float => "float",
            Primitive::Double => "double",
            Primitive::Bytes => "bytes",
            Primitive::String => "string",
        }
    }
}

/// Properties, in the order they were added (Avro keeps that order).
type Props = Vec<(&'static str, Json)>;

/// An Avro schema as Avro's Java `Schema` holds one.
#[derive(Clone, Debug, PartialEq)]
enum Avro {
    Primitive(Primitive, Props),
    Array(Box<Avro>, Props),
    Union(Vec<Avro>),
    Record(Box<Record>),
}

/// A named record.
#[derive(Clone, Debug, PartialEq)]
struct Record {
    space: Option<String>,
    name: String,
    fields: Vec<Field>,
    props: Props,
}

impl Record {
    fn full_name(&self) -> String {
        match &self.space {
            Some(space) => format!("{space}.{}", self.name),
            None => self.name.clone(),
        }
    }
}

/// A record field: its schema, its Avro default, and the Connect default a null value takes
/// (`Struct.get` returns it).
#[derive(Clone, Debug, PartialEq)]
struct Field {
    name: String,
    schema: Avro,
    default: Option<Json>,
    fallback: Option<Data>,
}

/// The Avro schema of a Connect schema, with its registered text.
#[derive(Clone, Debug, PartialEq)]
pub struct AvroSchema {
    /// `None`: the schemaless `Anything` record.
    root: Option<Avro>,
    text: String,
    /// The record's full name, when it is a record.
    record_name: Option<String>,
}

impl AvroSchema {
    /// `AvroData.fromConnectSchema`, then `Schema.toString()`; `Err`: why Confluent's
    /// converter throws (Debezium stops).
    pub fn from_connect(schema: Option<&Schema>, options: Options) -> Result<Self, String> {
        let Some(schema) = schema else {
            return Ok(AvroSchema {
                root: None,
                text: ANYTHING.to_owned(),
                record_name: Some(format!("{NAMESPACE}.Anything")),
            });
        };
        let mut context = Context {
            options,
            converted: HashMap::new(),
            unnamed: 0,
        };
        let root = context.schema(schema, false)?;
        let mut text = String::new();
        Writer::default().schema(&mut text, &root)?;
        let record_name = match &root {
            Avro::Record(record) => Some(record.full_name()),
            _ => None,
        };
        Ok(AvroSchema {
            root: Some(root),
            text,
            record_name,
        })
    }

    /// The text the converter registers (`AvroSchema.canonicalString()`).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The record's full name (`AvroSchema.name()`): what `RecordNameStrategy` names a
    /// subject after; `None` for any other schema.
    pub fn record_name(&self) -> Option<&str> {
        self.record_name.as_deref()
    }

    /// Appends the Avro body of `data` (a non-null value) to `out`, as the serializer writes
    /// it after the schema id: `bytes` at the top level as they are, anything else in Avro's
    /// binary encoding.
    pub fn encode(&self, data: &Data, out: &mut Vec<u8>) -> Result<(), String> {
        match (&self.root, data) {
            (Some(Avro::Primitive(Primitive::Bytes, _)), Data::Bytes(bytes)) => {
                out.extend_from_slice(bytes);
                Ok(())
            }
            (Some(Avro::Primitive(Primitive::Bytes, _)), Data::Decimal(decimal)) => {
                out.extend_from_slice(&decimal.unscaled_bytes());
                Ok(())
            }
            (Some(root), data) => encode(root, data, out),
            (None, data) => encode_anything(data, out),
        }
    }
}

/// `AvroData`'s `FromConnectContext`: schemas converted so far, and unnamed records counted.
struct Context {
    options: Options,
    /// Non-optional Connect schemas already converted: an equal one is the same Avro schema.
    converted: HashMap<Schema, Avro>,
    unnamed: u32,
}

impl Context {
    /// `fromConnectSchema(schema, context, ignoreOptional=false)`.
    fn schema(&mut self, schema: &Schema, ignore_optional: bool) -> Result<Avro, String> {
        if !schema.optional
            && let Some(avro) = self.converted.get(schema)
        {
            return Ok(avro.clone());
        }
        let mut connect_type = None;
        let primitive = |p| Avro::Primitive(p, Vec::new());
        let base = match &schema.kind {
            Kind::Boolean => primitive(Primitive::Boolean),
            Kind::Int8 => {
                connect_type = Some("int8");
                primitive(Primitive::Int)
            }
            Kind::Int16 => {
                connect_type = Some("int16");
                primitive(Primitive::Int)
            }
            Kind::Int32 => primitive(Primitive::Int),
            Kind::Int64 => primitive(Primitive::Long),
            Kind::Float32 => primitive(Primitive::Float),
            Kind::Float64 => primitive(Primitive::Double),
            Kind::String => primitive(Primitive::String),
            Kind::Bytes if schema.is_decimal() => decimal(schema)?,
            Kind::Bytes => primitive(Primitive::Bytes),
            Kind::Array(items) => Avro::Array(Box::new(self.schema(items, false)?), Vec::new()),
            Kind::Struct(_) if schema.optional => {
                let required = Schema {
                    optional: false,
                    ..schema.clone()
                };
                let record = self.schema(&required, false)?;
                Avro::Union(vec![primitive(Primitive::Null), record])
            }
            Kind::Struct(fields) => self.record(schema, fields)?,
        };
        let mut avro = base;
        if !matches!(avro, Avro::Union(_)) {
            if self.options.connect_meta_data
                && let Some(props) = props_mut(&mut avro)
            {
                connect_props(props, schema, connect_type)?;
            }
            let logical = (schema.name.as_deref()).and_then(|name| {
                LOGICAL_TYPES
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(name))
            });
            if let (Some((_, logical)), Some(props)) = (logical, props_mut(&mut avro)) {
                props.push(("logicalType", Json::Str((*logical).to_owned())));
            }
            if !ignore_optional {
                avro = optional(schema, avro);
            }
        }
        if !schema.optional {
            self.converted.insert(schema.clone(), avro.clone());
        }
        Ok(avro)
    }

    /// A non-optional struct's record.
    fn record(&mut self, schema: &Schema, fields: &[(String, Schema)]) -> Result<Avro, String> {
        let (space, name) = match &schema.name {
            Some(name) => self.split_name(name)?,
            None => {
                self.unnamed += 1;
                let suffix = match self.unnamed {
                    1 => String::new(),
                    n => n.to_string(),
                };
                (
                    Some(NAMESPACE.to_owned()),
                    format!("ConnectDefault{suffix}"),
                )
            }
        };
        check_name(&name)?;
        let full = match &space {
            Some(space) => format!("{space}.{name}"),
            None => name.clone(),
        };
        if PRIMITIVES.contains(&full.as_str()) {
            return Err(format!(
                "Avro refuses a record named after a primitive type: {full}"
            ));
        }
        let mut avro_fields = Vec::with_capacity(fields.len());
        for (field, field_schema) in fields {
            let name = self.scrub(field);
            check_name(&name)?;
            let default = match (&field_schema.default, field_schema.optional) {
                (Some(default), _) => Some(json_default(field_schema, default)?),
                (None, true) => Some(Json::Null),
                (None, false) => None,
            };
            avro_fields.push(Field {
                name,
                schema: self.schema(field_schema, false)?,
                default,
                fallback: field_schema.default.clone(),
            });
        }
        Ok(Avro::Record(Box::new(Record {
            space,
            name,
            fields: avro_fields,
            props: Vec::new(),
        })))
    }

    /// `splitName`: namespace and name of a Connect name, as Java's `String.split("\\.")`
    /// splits it (trailing empty parts dropped); an empty namespace is none.
    fn split_name(&self, full: &str) -> Result<(Option<String>, String), String> {
        if full.is_empty() {
            return Err("Avro refuses an empty record name".into());
        }
        let mut parts: Vec<String> = full.split('.').map(|p| self.scrub(p)).collect();
        while parts.last().is_some_and(String::is_empty) {
            parts.pop();
        }
        let Some(name) = parts.pop() else {
            return Err(format!("the record name {full:?} has no name part"));
        };
        let space = Some(parts.join(".")).filter(|s| !s.is_empty());
        Ok((space, name))
    }

    fn scrub(&self, name: &str) -> String {
        match self.options.scrub_invalid_names {
            true => scrub_name(name),
            false => name.to_owned(),
        }
    }
}

/// `AvroData`'s Connect metadata, in its order: `connect.doc`, `connect.version`,
/// `connect.parameters`, `connect.default`, `connect.name`, `connect.type`.
fn connect_props(
    props: &mut Props,
    schema: &Schema,
    connect_type: Option<&'static str>,
) -> Result<(), String> {
    if let Some(doc) = &schema.doc {
        props.push(("connect.doc", Json::Str(doc.clone())));
    }
    if let Some(version) = schema.version {
        props.push(("connect.version", Json::Int(i64::from(version))));
    }
    if !schema.parameters.is_empty() {
        props.push((
            "connect.parameters",
            Json::Object(schema.parameters.clone()),
        ));
    }
    if let Some(default) = &schema.default {
        props.push(("connect.default", json_default(schema, default)?));
    }
    if let Some(name) = &schema.name {
        props.push(("connect.name", Json::Str(name.clone())));
    }
    if let Some(connect_type) = connect_type {
        props.push(("connect.type", Json::Str(connect_type.to_owned())));
    }
    Ok(())
}

/// A `Decimal`'s `bytes`, with the `scale` and `precision` properties `AvroData` gives it
/// whatever `connect.meta.data` says.
fn decimal(schema: &Schema) -> Result<Avro, String> {
    let parameter = |name: &str| {
        let value = schema.parameters.iter().find(|(n, _)| n == name);
        value.map(|(_, v)| v.parse::<i64>().map_err(|e| format!("{name}={v}: {e}")))
    };
    let scale = parameter("scale").transpose()?.unwrap_or(0);
    let precision =
        (parameter(DECIMAL_PRECISION).transpose()?).unwrap_or(DEFAULT_DECIMAL_PRECISION);
    let props = vec![
        ("scale", Json::Int(scale)),
        ("precision", Json::Int(precision)),
    ];
    Ok(Avro::Primitive(Primitive::Bytes, props))
}

/// The properties of a schema that can hold them (a union cannot).
fn props_mut(avro: &mut Avro) -> Option<&mut Props> {
    match avro {
        Avro::Primitive(_, props) | Avro::Array(_, props) => Some(props),
        Avro::Record(record) => Some(&mut record.props),
        Avro::Union(_) => None,
    }
}

/// `maybeMakeOptional`: an optional schema as a union with `null`, first unless it has a
/// default (Avro's default must match the union's first branch).
fn optional(schema: &Schema, base: Avro) -> Avro {
    let null = Avro::Primitive(Primitive::Null, Vec::new());
    match (schema.optional, schema.default.is_some()) {
        (false, _) => base,
        (true, true) => Avro::Union(vec![base, null]),
        (true, false) => Avro::Union(vec![null, base]),
    }
}

/// `defaultValueFromConnect` for the defaults Connect schemas here carry.
fn json_default(schema: &Schema, data: &Data) -> Result<Json, String> {
    let latin1 = |bytes: &[u8]| Json::Str(bytes.iter().map(|&b| char::from(b)).collect());
    Ok(match data {
        Data::Null => Json::Null,
        Data::Bool(b) => Json::Bool(*b),
        Data::Int(i) => Json::Int(*i),
        Data::Float(f) if schema.kind == Kind::Float32 => Json::Float(*f),
        Data::Float(f) => Json::Double(*f),
        Data::Str(s) => Json::Str(s.clone()),
        // Avro writes bytes defaults as ISO-8859-1 text; a decimal is its unscaled bytes.
        Data::Bytes(b) => latin1(b),
        Data::Decimal(d) => latin1(&d.unscaled_bytes()),
        Data::Array(_) | Data::Struct(_) => {
            return Err("a default that is an array or a struct is not reproduced".into());
        }
    })
}

/// Avro 1.11's `validateName`: a letter or `_`, then letters, digits or `_`, as Java's
/// `Character.isLetter`/`isLetterOrDigit` judge UTF-16 code units (so no character outside
/// the Basic Multilingual Plane).
fn check_name(name: &str) -> Result<(), String> {
    let letter = |c: char| {
        use GeneralCategory as G;
        (c as u32) <= 0xFFFF
            && matches!(
                get_general_category(c),
                G::UppercaseLetter
                    | G::LowercaseLetter
                    | G::TitlecaseLetter
                    | G::ModifierLetter
                    | G::OtherLetter
            )
    };
    let digit =
        |c: char| (c as u32) <= 0xFFFF && get_general_category(c) == GeneralCategory::DecimalNumber;
    let mut chars = name.chars();
    match chars.next() {
        None => Err("Avro refuses an empty name".into()),
        Some(first) if !(letter(first) || first == '_') => Err(format!(
            "Avro refuses the name {name:?} (Illegal initial character)"
        )),
        Some(_) if chars.any(|c| !(letter(c) || digit(c) || c == '_')) => Err(format!(
            "Avro refuses the name {name:?} (Illegal character)"
        )),
        Some(_) => Ok(()),
    }
}

/// `AvroData.doScrubName` (`scrub.invalid.names`): URL-encoded, then every character other
/// than an ASCII letter, digit or `_` replaced by `_`, with `x` before a leading digit.
fn scrub_name(name: &str) -> String {
    let valid = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let starts_with_digit = name.starts_with(|c: char| c.is_ascii_digit());
    if name.is_empty() || (name.chars().all(valid) && !starts_with_digit) {
        return name.to_owned();
    }
    // URLEncoder keeps letters, digits and `.-*_`, makes ' ' a '+', and other bytes %XX:
    // after the replacement, `_XX`.
    let mut out = String::with_capacity(name.len() * 3);
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            out.push(c);
        } else if matches!(c, '.' | '-' | '*' | ' ') {
            out.push('_');
        } else {
            let mut buf = [0; 4];
            for byte in c.encode_utf8(&mut buf).bytes() {
                write!(out, "_{byte:02X}").unwrap_or_default();
            }
        }
    }
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, 'x');
    }
    out
}

/// Avro's `Schema.toJson` state: the named schemas written so far and the enclosing namespace.
#[derive(Default)]
struct Writer<'a> {
    written: Vec<(String, &'a Record)>,
    space: Option<String>,
}

impl<'a> Writer<'a> {
    fn schema(&mut self, out: &mut String, avro: &'a Avro) -> Result<(), String> {
        match avro {
            Avro::Primitive(primitive, props) if props.is_empty() => {
                write_string(out, primitive.name());
            }
            Avro::Primitive(primitive, props) => {
                out.push_str("{\"type\":");
                write_string(out, primitive.name());
                write_props(out, props);
                out.push('}');
            }
            Avro::Array(items, props) => {
                out.push_str("{\"type\":\"array\",\"items\":");
                self.schema(out, items)?;
                write_props(out, props);
                out.push('}');
            }
            Avro::Union(branches) => {
                out.push('[');
                for (i, branch) in branches.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    self.schema(out, branch)?;
                }
                out.push(']');
            }
            Avro::Record(record) => self.record(out, record)?,
        }
        Ok(())
    }

    /// A record in full the first time, by name after that (`writeNameRef`); a different
    /// record of a name already written is Avro's `Can't redefine`.
    fn record(&mut self, out: &mut String, record: &'a Record) -> Result<(), String> {
        let full = record.full_name();
        if let Some((_, written)) = self.written.iter().find(|(name, _)| *name == full) {
            if **written != *record {
                return Err(format!(
                    "Avro refuses two different records named {full} in one schema"
                ));
            }
            let short = record.space.is_some()
                && record.space == self.space
                && !PRIMITIVES.contains(&record.name.as_str());
            write_string(out, if short { &record.name } else { &full });
            return Ok(());
        }
        self.written.push((full, record));
        out.push_str("{\"type\":\"record\",\"name\":");
        write_string(out, &record.name);
        match (&record.space, &self.space) {
            (Some(space), enclosing) if Some(space) != enclosing.as_ref() => {
                out.push_str(",\"namespace\":");
                write_string(out, space);
            }
            (None, Some(_)) => out.push_str(",\"namespace\":\"\""),
            _ => {}
        }
        let saved = std::mem::replace(&mut self.space, record.space.clone());
        out.push_str(",\"fields\":[");
        for (i, field) in record.fields.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str("{\"name\":");
            write_string(out, &field.name);
            out.push_str(",\"type\":");
            self.schema(out, &field.schema)?;
            if let Some(default) = &field.default {
                out.push_str(",\"default\":");
                write_json(out, default);
            }
            out.push('}');
        }
        out.push(']');
        write_props(out, &record.props);
        out.push('}');
        self.space = saved;
        Ok(())
    }
}

fn write_props(out: &mut String, props: &Props) {
    for (name, value) in props {
        out.push(',');
        write_string(out, name);
        out.push(':');
        write_json(out, value);
    }
}

fn write_json(out: &mut String, json: &Json) {
    match json {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => write!(out, "{b}").unwrap_or_default(),
        Json::Int(i) => write!(out, "{i}").unwrap_or_default(),
        Json::Float(f) => write_float(out, *f),
        Json::Double(f) => write_double(out, *f),
        Json::Str(s) => write_string(out, s),
        Json::Object(entries) => {
            out.push('{');
            for (i, (name, value)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, name);
                out.push(':');
                write_string(out, value);
            }
            out.push('}');
        }
    }
}

/// A JSON string as Jackson's character-based generator writes it (Avro's `toString`):
/// `"`, `\` and control characters escaped, everything else as it is.
fn write_string(out: &mut String, s: &str) {
    write_jackson_string(out, s, false);
}

/// Avro's binary encoding of `data` (`GenericDatumWriter` over `AvroData`'s datum).
fn encode(avro: &Avro, data: &Data, out: &mut Vec<u8>) -> Result<(), String> {
    let mismatch = || format!("a value that does not fit its Avro schema ({data:?})");
    match (avro, data) {
        (Avro::Union(branches), data) => encode_union(branches, data, out),
        (Avro::Primitive(Primitive::Null, _), Data::Null) => Ok(()),
        (Avro::Primitive(Primitive::Boolean, _), Data::Bool(b)) => {
            out.push(u8::from(*b));
            Ok(())
        }
        (Avro::Primitive(Primitive::Int | Primitive::Long, _), Data::Int(i)) => {
            write_long(out, *i);
            Ok(())
        }
        (Avro::Primitive(Primitive::Float, _), Data::Float(f)) => {
            // Connect holds a float column's value as a Java float: narrowing is the point.
            #[allow(clippy::cast_possible_truncation)]
            let single = *f as f32;
            out.extend_from_slice(&single.to_le_bytes());
            Ok(())
        }
        (Avro::Primitive(Primitive::Double, _), Data::Float(f)) => {
            out.extend_from_slice(&f.to_le_bytes());
            Ok(())
        }
        (Avro::Primitive(Primitive::String, _), Data::Str(s)) => {
            write_bytes(out, s.as_bytes());
            Ok(())
        }
        (Avro::Primitive(Primitive::Bytes, _), Data::Bytes(b)) => {
            write_bytes(out, b);
            Ok(())
        }
        (Avro::Primitive(Primitive::Bytes, _), Data::Decimal(decimal)) => {
            write_bytes(out, &decimal.unscaled_bytes());
            Ok(())
        }
        (Avro::Array(items, _), Data::Array(values)) => encode_array(items, values, out),
        (Avro::Record(record), Data::Struct(values)) if values.len() == record.fields.len() => {
            encode_record(record, values, out)
        }
        (_, Data::Null) => Err("a null value where the Avro schema allows none".into()),
        _ => Err(mismatch()),
    }
}

/// A union's value: `GenericData.resolveUnion` picks the branch of the datum's type.
fn encode_union(branches: &[Avro], data: &Data, out: &mut Vec<u8>) -> Result<(), String> {
    let is_null = *data == Data::Null;
    let index = branches
        .iter()
        .position(|b| matches!(b, Avro::Primitive(Primitive::Null, _)) == is_null)
        .ok_or_else(|| format!("a value that does not fit its Avro schema ({data:?})"))?;
    write_long(out, index as i64);
    encode(&branches[index], data, out)
}

/// An array: its items in one block, then the empty block that ends it.
fn encode_array(items: &Avro, values: &[Data], out: &mut Vec<u8>) -> Result<(), String> {
    if !values.is_empty() {
        write_long(out, values.len() as i64);
        for value in values {
            encode(items, value, out)?;
        }
    }
    out.push(0);
    Ok(())
}

/// A record's fields in order, a null field as its default (`Struct.get`).
fn encode_record(record: &Record, values: &[Data], out: &mut Vec<u8>) -> Result<(), String> {
    for (field, value) in record.fields.iter().zip(values) {
        let value = match (value, &field.fallback) {
            (Data::Null, Some(fallback)) => fallback,
            (value, _) => value,
        };
        encode(&field.schema, value, out)?;
    }
    Ok(())
}

/// A value without a Connect schema, in the `Anything` record: every field null but the one
/// of the value's type.
fn encode_anything(data: &Data, out: &mut Vec<u8>) -> Result<(), String> {
    // Field order: boolean, bytes, double, float, int, long, string, array, map.
    let slot = match data {
        Data::Bool(_) => 0,
        Data::Bytes(_) => 1,
        Data::Float(_) => 2,
        Data::Int(_) => 5,
        Data::Str(_) => 6,
        _ => return Err("a schemaless value that is not a primitive is not reproduced".into()),
    };
    for field in 0..9 {
        if field != slot {
            out.push(0);
            continue;
        }
        write_long(out, 1);
        match data {
            Data::Bool(b) => out.push(u8::from(*b)),
            Data::Bytes(b) => write_bytes(out, b),
            Data::Float(f) => out.extend_from_slice(&f.to_le_bytes()),
            Data::Int(i) => write_long(out, *i),
            Data::Str(s) => write_bytes(out, s.as_bytes()),
            _ => {}
        }
    }
    Ok(())
}

/// Avro's variable-length zig-zag `long` (an `int` is written the same way).
fn write_long(out: &mut Vec<u8>, value: i64) {
    let mut n = ((value << 1) ^ (value >> 63)) as u64;
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// Avro `bytes` and `string`: the length, then the bytes.
fn write_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    write_long(out, bytes.len() as i64);
    out.extend_from_slice(bytes);
}

/// The Avro specification's Parsing Canonical Form of a schema's JSON text: what decides how
/// values encode, without documentation, defaults, properties or aliases, names in full.
pub fn parsing_canonical_form(text: &str) -> Result<String, String> {
    let json: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let mut out = String::new();
    canonical(&json, None, &mut out)?;
    Ok(out)
}

fn canonical(
    json: &serde_json::Value,
    space: Option<&str>,
    out: &mut String,
) -> Result<(), String> {
    use serde_json::Value;
    let full = |name: &str, space: Option<&str>| match (name.contains('.'), space) {
        (false, Some(space)) if !space.is_empty() && !PRIMITIVES.contains(&name) => {
            format!("{space}.{name}")
        }
        _ => name.to_owned(),
    };
    match json {
        Value::String(name) => write_string(out, &full(name, space)),
        Value::Array(branches) => {
            out.push('[');
            for (i, branch) in branches.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(branch, space, out)?;
            }
            out.push(']');
        }
        Value::Object(object) => {
            let kind = object
                .get("type")
                .ok_or("a schema object without \"type\"")?;
            let Value::String(kind) = kind else {
                return canonical(kind, space, out);
            };
            match kind.as_str() {
                "record" | "error" | "enum" | "fixed" => {
                    let name = object
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or("no name")?;
                    let namespace = object.get("namespace").and_then(Value::as_str);
                    let name = match (name.contains('.'), namespace) {
                        (false, Some(ns)) => full(name, Some(ns)),
                        (false, None) => full(name, space),
                        (true, _) => name.to_owned(),
                    };
                    let inner = name.rsplit_once('.').map(|(ns, _)| ns.to_owned());
                    out.push_str("{\"name\":");
                    write_string(out, &name);
                    out.push_str(",\"type\":");
                    write_string(out, kind);
                    if let Some(Value::Array(fields)) = object.get("fields") {
                        out.push_str(",\"fields\":[");
                        for (i, field) in fields.iter().enumerate() {
                            if i > 0 {
                                out.push(',');
                            }
                            let field_name = field.get("name").and_then(Value::as_str);
                            out.push_str("{\"name\":");
                            write_string(out, field_name.ok_or("a field without name")?);
                            out.push_str(",\"type\":");
                            let field_type = field.get("type").ok_or("a field without type")?;
                            canonical(field_type, inner.as_deref(), out)?;
                            out.push('}');
                        }
                        out.push(']');
                    }
                    if let Some(symbols) = object.get("symbols") {
                        out.push_str(",\"symbols\":");
                        out.push_str(&symbols.to_string());
                    }
                    if let Some(size) = object.get("size") {
                        write!(out, ",\"size\":{size}").unwrap_or_default();
                    }
                    out.push('}');
                }
                "array" => {
                    out.push_str("{\"type\":\"array\",\"items\":");
                    canonical(
                        object.get("items").ok_or("an array without items")?,
                        space,
                        out,
                    )?;
                    out.push('}');
                }
                "map" => {
                    out.push_str("{\"type\":\"map\",\"values\":");
                    canonical(
                        object.get("values").ok_or("a map without values")?,
                        space,
                        out,
                    )?;
                    out.push('}');
                }
                primitive => write_string(out, &full(primitive, space)),
            }
        }
        other => return Err(format!("not a schema: {other}")),
    }
    Ok(())
}

#[cfg(test)]
mod tests;
