//! PURE: Kafka Connect's data model (a schema and a value) and the bytes Kafka's `JsonConverter`
//! writes for it: Jackson's escaping (control characters as `\u001F`, characters outside the
//! Basic Multilingual Plane as upper-case surrogate pairs), Java's `Double.toString`, and the
//! schema envelope's key order.

use std::fmt::Write as _;

use base64::Engine as _;

/// A Connect schema type; structs carry their fields in order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `boolean`
    Boolean,
    /// `int16`
    Int16,
    /// `int32`
    Int32,
    /// `int64`
    Int64,
    /// `double`
    Float64,
    /// `string`
    String,
    /// `bytes`
    Bytes,
    /// `array` of the item schema.
    Array(Box<Schema>),
    /// `struct` with named fields.
    Struct(Vec<(String, Schema)>),
}

/// A Connect schema, as far as Debezium's outbox records use one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Schema {
    /// The type.
    pub kind: Kind,
    /// Whether null is allowed.
    pub optional: bool,
    /// A logical or record name, e.g. `io.debezium.data.Json`.
    pub name: Option<String>,
    /// The schema version.
    pub version: Option<i32>,
    /// The column's default, written in the schema and for a null value.
    pub default: Option<Data>,
}

impl Schema {
    /// An optional schema of `kind` without name, version or default.
    pub fn optional(kind: Kind) -> Schema {
        Schema {
            kind,
            optional: true,
            name: None,
            version: None,
            default: None,
        }
    }
}

/// A Connect value; integers keep their width in the schema.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    /// null
    Null,
    /// A boolean.
    Bool(bool),
    /// Any integer type.
    Int(i64),
    /// A `double`.
    Float(f64),
    /// A string.
    Str(String),
    /// Bytes, written as base64.
    Bytes(Vec<u8>),
    /// An array's items.
    Array(Vec<Data>),
    /// A struct's values, in its schema's field order.
    Struct(Vec<Data>),
}

// Defaults are strings, integers or booleans: never NaN.
impl Eq for Data {}

impl std::hash::Hash for Data {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        match self {
            Data::Bool(b) => b.hash(state),
            Data::Int(i) => i.hash(state),
            Data::Float(f) => f.to_bits().hash(state),
            Data::Str(s) => s.hash(state),
            Data::Bytes(b) => b.hash(state),
            Data::Array(items) | Data::Struct(items) => items.hash(state),
            Data::Null => {}
        }
    }
}

/// A value `JsonConverter` refuses (Debezium stops on it): why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

/// `JsonConverter.fromConnectData`: the value, in `{"schema":..,"payload":..}` when `schemas`;
/// `None` (a tombstone) only when both schema and value are absent.
pub fn to_json(
    schema: Option<&Schema>,
    data: &Data,
    schemas: bool,
) -> Result<Option<String>, Refused> {
    if schema.is_none() && *data == Data::Null {
        return Ok(None);
    }
    let mut out = String::new();
    if schemas {
        out.push_str("{\"schema\":");
        match schema {
            Some(schema) => write_schema(&mut out, schema)?,
            None => out.push_str("null"),
        }
        out.push_str(",\"payload\":");
    }
    write_data(&mut out, schema, data)?;
    if schemas {
        out.push('}');
    }
    Ok(Some(out))
}

/// `JsonConverter.asJsonSchema`: type, items or fields, optional, name, version, default.
fn write_schema(out: &mut String, schema: &Schema) -> Result<(), Refused> {
    let name = match &schema.kind {
        Kind::Boolean => "boolean",
        Kind::Int16 => "int16",
        Kind::Int32 => "int32",
        Kind::Int64 => "int64",
        Kind::Float64 => "double",
        Kind::String => "string",
        Kind::Bytes => "bytes",
        Kind::Array(_) => "array",
        Kind::Struct(_) => "struct",
    };
    write!(out, "{{\"type\":\"{name}\"").ok();
    match &schema.kind {
        Kind::Array(items) => {
            out.push_str(",\"items\":");
            write_schema(out, items)?;
        }
        Kind::Struct(fields) => {
            out.push_str(",\"fields\":[");
            for (i, (field, schema)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_schema(out, schema)?;
                // The field's name goes last, into the field schema's object.
                out.pop();
                out.push_str(",\"field\":");
                write_string(out, field);
                out.push('}');
            }
            out.push(']');
        }
        _ => {}
    }
    write!(out, ",\"optional\":{}", schema.optional).ok();
    if let Some(name) = &schema.name {
        out.push_str(",\"name\":");
        write_string(out, name);
    }
    if let Some(version) = schema.version {
        write!(out, ",\"version\":{version}").ok();
    }
    if let Some(default) = &schema.default {
        out.push_str(",\"default\":");
        write_data(out, Some(schema), default)?;
    }
    out.push('}');
    Ok(())
}

/// `JsonConverter.convertToJson`: a null takes the schema's default, else must be optional.
fn write_data(out: &mut String, schema: Option<&Schema>, data: &Data) -> Result<(), Refused> {
    let mismatch = || Refused(format!("a value that does not fit its schema {schema:?}"));
    match (schema.map(|s| &s.kind), data) {
        (_, Data::Null) => match schema {
            Some(Schema {
                default: Some(default),
                ..
            }) => write_data(out, schema, default)?,
            Some(s) if !s.optional => {
                return Err(Refused(
                    "a null value for a required field without default".into(),
                ));
            }
            _ => out.push_str("null"),
        },
        (None | Some(Kind::Boolean), Data::Bool(b)) => write!(out, "{b}").unwrap_or_default(),
        (None | Some(Kind::Int16 | Kind::Int32 | Kind::Int64), Data::Int(i)) => {
            write!(out, "{i}").unwrap_or_default()
        }
        (None | Some(Kind::Float64), Data::Float(f)) => write_double(out, *f),
        (None | Some(Kind::String), Data::Str(s)) => write_string(out, s),
        (None | Some(Kind::Bytes), Data::Bytes(b)) => {
            out.push('"');
            base64::engine::general_purpose::STANDARD.encode_string(b, out);
            out.push('"');
        }
        (Some(Kind::Array(items)), Data::Array(values)) => {
            out.push('[');
            for (i, value) in values.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_data(out, Some(items), value)?;
            }
            out.push(']');
        }
        (Some(Kind::Struct(fields)), Data::Struct(values)) if fields.len() == values.len() => {
            out.push('{');
            for (i, ((name, schema), value)) in fields.iter().zip(values).enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, name);
                out.push(':');
                write_data(out, Some(schema), value)?;
            }
            out.push('}');
        }
        _ => return Err(mismatch()),
    }
    Ok(())
}

/// A JSON string as Jackson writes it: `"` and `\` escaped, control characters as `\n`-style
/// or `\u00XX` escapes, and characters beyond U+FFFF as escaped surrogate pairs.
pub fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if c < ' ' => write!(out, "\\u{:04X}", c as u32).unwrap_or_default(),
            c if c > '\u{FFFF}' => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    write!(out, "\\u{unit:04X}").unwrap_or_default();
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Java's `Double.toString`: plain between 10^-3 and 10^7, else `d.dddE±n`, always with a
/// fraction digit; the digits are the shortest that read back as the same double (as Java 19
/// and later print them; Java 17 prints a longer form for a few values). Jackson quotes
/// infinities and NaN.
pub fn write_double(out: &mut String, f: f64) {
    if !f.is_finite() {
        let text = match f {
            f if f.is_nan() => "NaN",
            f if f > 0.0 => "Infinity",
            _ => "-Infinity",
        };
        write!(out, "\"{text}\"").unwrap_or_default();
        return;
    }
    // Rust's `{:e}` prints the shortest round-trip digits: `d[.ddd]e[-]n`.
    let scientific = format!("{:e}", f.abs());
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or_default();
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    // `-0.0` included.
    if f.is_sign_negative() {
        out.push('-');
    }
    if (-3..7).contains(&exponent) {
        let point = exponent + 1;
        if point <= 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', point.unsigned_abs() as usize));
            out.push_str(&digits);
        } else {
            let point = point as usize;
            let padded = format!("{digits:0<point$}");
            let (int, frac) = padded.split_at(point);
            write!(out, "{int}.{}", if frac.is_empty() { "0" } else { frac }).unwrap_or_default();
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let rest = if rest.is_empty() { "0" } else { rest };
        write!(out, "{first}.{rest}E{exponent}").unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn double(f: f64) -> String {
        let mut out = String::new();
        write_double(&mut out, f);
        out
    }

    #[test]
    fn doubles_print_as_java_does() {
        for (f, java) in [
            (0.0000001, "1.0E-7"),
            (1e7, "1.0E7"),
            (12345678.9, "1.23456789E7"),
            (9999999.999, "9999999.999"),
            (0.001, "0.001"),
            (0.000999, "9.99E-4"),
            (1234567.0, "1234567.0"),
            (-1.5, "-1.5"),
            (0.1, "0.1"),
            (100.0, "100.0"),
            (1.5e-300, "1.5E-300"),
            (12345678901234567890.5, "1.2345678901234567E19"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (f64::INFINITY, "\"Infinity\""),
        ] {
            assert_eq!(double(f), java, "{f}");
        }
    }

    #[test]
    fn strings_escape_as_jackson_does() {
        let mut out = String::new();
        write_string(
            &mut out,
            "k🙂\t\u{1f}\u{7f}\u{2028}\"\\/é\u{8}\u{c}\r\n\u{1}",
        );
        assert_eq!(
            out,
            "\"k\\uD83D\\uDE42\\t\\u001F\u{7f}\u{2028}\\\"\\\\/é\\b\\f\\r\\n\\u0001\""
        );
    }

    #[test]
    fn envelopes_put_the_schema_keys_in_converter_order() {
        let mut field = Schema::optional(Kind::String);
        field.optional = false;
        field.default = Some(Data::Str("Event".into()));
        let mut json = Schema::optional(Kind::String);
        json.name = Some("io.debezium.data.Json".into());
        json.version = Some(1);
        let envelope = Schema {
            kind: Kind::Struct(vec![("payload".into(), json), ("type".into(), field)]),
            optional: false,
            name: Some("a.b".into()),
            version: Some(2),
            default: None,
        };
        let value = Data::Struct(vec![Data::Null, Data::Null]);
        assert_eq!(
            to_json(Some(&envelope), &value, true).unwrap().unwrap(),
            "{\"schema\":{\"type\":\"struct\",\"fields\":[{\"type\":\"string\",\"optional\":true,\
             \"name\":\"io.debezium.data.Json\",\"version\":1,\"field\":\"payload\"},{\"type\":\
             \"string\",\"optional\":false,\"default\":\"Event\",\"field\":\"type\"}],\"optional\":\
             false,\"name\":\"a.b\",\"version\":2},\"payload\":{\"payload\":null,\"type\":\"Event\"}}"
        );
        assert_eq!(to_json(None, &Data::Null, true), Ok(None));
        let bytes = Schema::optional(Kind::Bytes);
        let value = Data::Bytes(vec![0, 255, 16, 226]);
        assert_eq!(
            to_json(Some(&bytes), &value, false).unwrap().unwrap(),
            "\"AP8Q4g==\""
        );
        assert!(to_json(Some(&bytes), &Data::Str("x".into()), false).is_err());
    }
}
