//! PURE: Kafka Connect's data model (a schema and a value) and the bytes Kafka's `JsonConverter`
//! writes for it: Jackson's escaping (control characters as `\u001F`, characters outside the
//! Basic Multilingual Plane as upper-case surrogate pairs), Java's `Double.toString` and
//! `Float.toString`, `BigDecimal`'s text, and the schema envelope's key order. Also the text
//! Kafka's `Values.convertToString` makes of a value, which `SimpleHeaderConverter` writes.

use std::fmt::Write as _;

use base64::Engine as _;

mod decimal;
mod text;

pub use decimal::Decimal;
pub use text::to_text;

/// A Connect schema type; structs carry their fields in order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `boolean`
    Boolean,
    /// `int8`
    Int8,
    /// `int16`
    Int16,
    /// `int32`
    Int32,
    /// `int64`
    Int64,
    /// `float`
    Float32,
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
    /// The schema's documentation, e.g. `Variable scaled decimal`.
    pub doc: Option<String>,
    /// Schema parameters in insertion order (Connect keeps them in a `LinkedHashMap`), e.g.
    /// a decimal's `scale` or Debezium's `__debezium.source.column.type`.
    pub parameters: Vec<(String, String)>,
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
            doc: None,
            parameters: Vec::new(),
            default: None,
        }
    }

    /// A required schema of `kind` without name, version or default.
    pub fn required(kind: Kind) -> Schema {
        Schema {
            optional: false,
            ..Schema::optional(kind)
        }
    }

    /// The schema of `name`, a field of this struct.
    pub fn field(&self, name: &str) -> Option<&Schema> {
        match &self.kind {
            Kind::Struct(fields) => fields.iter().find(|(n, _)| n == name).map(|(_, s)| s),
            _ => None,
        }
    }

    /// Whether this is Kafka Connect's `Decimal` logical type (bytes of an unscaled integer).
    pub fn is_decimal(&self) -> bool {
        self.kind == Kind::Bytes && self.name.as_deref() == Some(DECIMAL)
    }
}

/// Kafka Connect's `Decimal` logical type name.
pub const DECIMAL: &str = "org.apache.kafka.connect.data.Decimal";

/// A Connect value; integers keep their width in the schema.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    /// null
    Null,
    /// A boolean.
    Bool(bool),
    /// Any integer type.
    Int(i64),
    /// A `float` or `double` (a `float` schema writes it as Java's `float`).
    Float(f64),
    /// A `Decimal` logical value.
    Decimal(Decimal),
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
            Data::Decimal(d) => d.hash(state),
            Data::Array(items) | Data::Struct(items) => items.hash(state),
            Data::Null => {}
        }
    }
}

/// A value `JsonConverter` refuses (Debezium stops on it): why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

/// How a `JsonConverter` is configured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JsonSettings {
    /// `schemas.enable`: the value in `{"schema":..,"payload":..}`.
    pub schemas: bool,
    /// `decimal.format=NUMERIC`: decimals as JSON numbers rather than base64 of their bytes.
    pub numeric_decimals: bool,
}

/// `JsonConverter.fromConnectData` with `schemas.enable` as `schemas` and the default
/// `decimal.format` (BASE64).
pub fn to_json(
    schema: Option<&Schema>,
    data: &Data,
    schemas: bool,
) -> Result<Option<String>, Refused> {
    let settings = JsonSettings {
        schemas,
        numeric_decimals: false,
    };
    to_json_with(schema, data, settings)
}

/// `JsonConverter.fromConnectData`: the value, in `{"schema":..,"payload":..}` with schemas;
/// `None` (a tombstone) only when both schema and value are absent.
pub fn to_json_with(
    schema: Option<&Schema>,
    data: &Data,
    settings: JsonSettings,
) -> Result<Option<String>, Refused> {
    if schema.is_none() && *data == Data::Null {
        return Ok(None);
    }
    let writer = JsonWriter { settings };
    let mut out = String::new();
    if settings.schemas {
        out.push_str("{\"schema\":");
        match schema {
            Some(schema) => writer.schema(&mut out, schema)?,
            None => out.push_str("null"),
        }
        out.push_str(",\"payload\":");
    }
    writer.data(&mut out, schema, data)?;
    if settings.schemas {
        out.push('}');
    }
    Ok(Some(out))
}

/// The JSON type name of a schema kind (Connect's type names).
pub(super) fn type_name(kind: &Kind) -> &'static str {
    match kind {
        Kind::Boolean => "boolean",
        Kind::Int8 => "int8",
        Kind::Int16 => "int16",
        Kind::Int32 => "int32",
        Kind::Int64 => "int64",
        Kind::Float32 => "float",
        Kind::Float64 => "double",
        Kind::String => "string",
        Kind::Bytes => "bytes",
        Kind::Array(_) => "array",
        Kind::Struct(_) => "struct",
    }
}

/// `JsonConverter`'s writing, with its settings.
struct JsonWriter {
    settings: JsonSettings,
}

impl JsonWriter {
    /// `JsonConverter.asJsonSchema`: type, items or fields, optional, name, version, doc,
    /// parameters, default.
    fn schema(&self, out: &mut String, schema: &Schema) -> Result<(), Refused> {
        write!(out, "{{\"type\":\"{}\"", type_name(&schema.kind)).ok();
        match &schema.kind {
            Kind::Array(items) => {
                out.push_str(",\"items\":");
                self.schema(out, items)?;
            }
            Kind::Struct(fields) => {
                out.push_str(",\"fields\":[");
                for (i, (field, schema)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    self.schema(out, schema)?;
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
        if let Some(doc) = &schema.doc {
            out.push_str(",\"doc\":");
            write_string(out, doc);
        }
        if !schema.parameters.is_empty() {
            out.push_str(",\"parameters\":{");
            for (i, (key, value)) in schema.parameters.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, key);
                out.push(':');
                write_string(out, value);
            }
            out.push('}');
        }
        if let Some(default) = &schema.default {
            out.push_str(",\"default\":");
            self.data(out, Some(schema), default)?;
        }
        out.push('}');
        Ok(())
    }

    /// `JsonConverter.convertToJson`: a null takes the schema's default, else must be optional.
    fn data(&self, out: &mut String, schema: Option<&Schema>, data: &Data) -> Result<(), Refused> {
        let mismatch = || Refused(format!("a value that does not fit its schema {schema:?}"));
        match (schema.map(|s| &s.kind), data) {
            (_, Data::Null) => match schema {
                Some(Schema {
                    default: Some(default),
                    ..
                }) => self.data(out, schema, default)?,
                Some(s) if !s.optional => {
                    return Err(Refused(
                        "a null value for a required field without default".into(),
                    ));
                }
                _ => out.push_str("null"),
            },
            (None | Some(Kind::Boolean), Data::Bool(b)) => write!(out, "{b}").unwrap_or_default(),
            (None | Some(Kind::Int8 | Kind::Int16 | Kind::Int32 | Kind::Int64), Data::Int(i)) => {
                write!(out, "{i}").unwrap_or_default()
            }
            (Some(Kind::Float32), Data::Float(f)) => write_float(out, *f),
            (None | Some(Kind::Float64), Data::Float(f)) => write_double(out, *f),
            (None | Some(Kind::String), Data::Str(s)) => write_string(out, s),
            (None | Some(Kind::Bytes), Data::Bytes(b)) => write_base64(out, b),
            (Some(Kind::Bytes), Data::Decimal(d)) if schema.is_some_and(Schema::is_decimal) => {
                if self.settings.numeric_decimals {
                    out.push_str(&d.to_java_string());
                } else {
                    write_base64(out, &d.unscaled_bytes());
                }
            }
            (Some(Kind::Array(items)), Data::Array(values)) => {
                out.push('[');
                for (i, value) in values.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    self.data(out, Some(items), value)?;
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
                    self.data(out, Some(schema), value)?;
                }
                out.push('}');
            }
            _ => return Err(mismatch()),
        }
        Ok(())
    }
}

/// Bytes as a JSON string of their base64.
fn write_base64(out: &mut String, bytes: &[u8]) {
    out.push('"');
    base64::engine::general_purpose::STANDARD.encode_string(bytes, out);
    out.push('"');
}

/// Kafka Connect's `Date` logical type (days since the epoch, as a `java.util.Date`).
pub const CONNECT_DATE: &str = "org.apache.kafka.connect.data.Date";
/// Kafka Connect's `Time` logical type (milliseconds of the day).
pub const CONNECT_TIME: &str = "org.apache.kafka.connect.data.Time";
/// Kafka Connect's `Timestamp` logical type (milliseconds since the epoch).
pub const CONNECT_TIMESTAMP: &str = "org.apache.kafka.connect.data.Timestamp";

/// A JSON string as Jackson writes it: `"` and `\` escaped, control characters as `\n`-style
/// or `\u00XX` escapes, and characters beyond U+FFFF as escaped surrogate pairs.
pub fn write_string(out: &mut String, s: &str) {
    write_jackson_string(out, s, true);
}

/// A JSON string as Jackson writes it, characters beyond U+FFFF as escaped surrogate pairs
/// (its byte-based generator, Kafka's JsonConverter) or as they are (`escape_beyond_bmp`
/// false: its character-based generator, Avro's `Schema.toString`).
pub fn write_jackson_string(out: &mut String, s: &str, escape_beyond_bmp: bool) {
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
            c if escape_beyond_bmp && c > '\u{FFFF}' => {
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

/// Java's `Double.toString`, as Jackson writes a double: see [`java_double`]; infinities and
/// NaN quoted.
pub fn write_double(out: &mut String, f: f64) {
    write_java_number(out, f, java_double(f));
}

/// Java's `Float.toString` for a `float`, as Jackson writes it.
pub fn write_float(out: &mut String, f: f64) {
    write_java_number(out, f, java_float(f));
}

/// A number's Java text, quoted when it is not finite (Jackson's `QUOTE_NON_NUMERIC_NUMBERS`).
fn write_java_number(out: &mut String, f: f64, text: String) {
    if f.is_finite() {
        out.push_str(&text);
    } else {
        write!(out, "\"{text}\"").unwrap_or_default();
    }
}

/// Java's `Double.toString`: plain between 10^-3 and 10^7, else `d.dddE±n`, always with a
/// fraction digit; the digits are the shortest that read back as the same double (as Java 19
/// and later print them; Java 17 prints a longer form for a few values).
pub fn java_double(f: f64) -> String {
    java_decimal_text(f, &format!("{:e}", f.abs()))
}

/// Java's `Float.toString`: as [`java_double`], with the shortest digits of the `float`.
pub fn java_float(f: f64) -> String {
    // Connect holds a float column's value as a Java float: narrowing is the point.
    #[allow(clippy::cast_possible_truncation)]
    let single = f as f32;
    java_decimal_text(f, &format!("{:e}", single.abs()))
}

/// Java's layout of a floating-point number given the shortest digits of its magnitude
/// (`scientific`, Rust's `{:e}`: `d[.ddd]e[-]n`).
fn java_decimal_text(f: f64, scientific: &str) -> String {
    if !f.is_finite() {
        let text = match f {
            f if f.is_nan() => "NaN",
            f if f > 0.0 => "Infinity",
            _ => "-Infinity",
        };
        return text.to_owned();
    }
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or_default();
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let mut out = String::new();
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
            let point = point.unsigned_abs() as usize;
            let padded = format!("{digits:0<point$}");
            let (int, frac) = padded.split_at(point);
            write!(out, "{int}.{}", if frac.is_empty() { "0" } else { frac }).unwrap_or_default();
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let rest = if rest.is_empty() { "0" } else { rest };
        write!(out, "{first}.{rest}E{exponent}").unwrap_or_default();
    }
    out
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
            doc: None,
            parameters: Vec::new(),
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

    #[test]
    fn floats_print_as_java_floats() {
        for (f, java) in [
            (1.5, "1.5"),
            (0.1, "0.1"),
            (f64::from(3.402_823_5e38_f32), "3.4028235E38"),
            (1e-4, "1.0E-4"),
            (f64::NAN, "NaN"),
        ] {
            assert_eq!(java_float(f), java, "{f}");
        }
    }

    #[test]
    fn decimals_read_and_print_as_big_decimal() {
        for (text, java, plain, bytes) in [
            ("12345678.90", "12345678.90", "12345678.90", "SZYC0g=="),
            ("-0.05", "-0.05", "-0.05", "+w=="),
            ("0", "0", "0", "AA=="),
            ("-0.00000000015", "-1.5E-10", "-0.00000000015", "8Q=="),
            ("100", "100", "100", "ZA=="),
            (
                "-123456789012345678901234567890",
                "-123456789012345678901234567890",
                "-123456789012345678901234567890",
                "/nEW8Ak8jB8RscD1Lg==",
            ),
        ] {
            let d = Decimal::parse(text).unwrap();
            assert_eq!(d.to_java_string(), java, "{text}");
            assert_eq!(d.to_plain_string(), plain, "{text}");
            let b64 = base64::engine::general_purpose::STANDARD.encode(d.unscaled_bytes());
            assert_eq!(b64, bytes, "{text}");
        }
        assert_eq!(
            Decimal::parse("0.0").unwrap().widened(2).to_java_string(),
            "0.00"
        );
        assert_eq!(
            Decimal::parse("1.5").unwrap().widened(0).to_java_string(),
            "1.5"
        );
        assert_eq!(Decimal::parse("99999999.99").unwrap().to_f64(), 99999999.99);
        for bad in ["NaN", "1e5", "", "-", "1.", ".5", "1.2.3", "+1"] {
            assert_eq!(Decimal::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn schemas_write_doc_and_parameters_before_the_default() {
        let mut amount = Schema::required(Kind::Bytes);
        amount.name = Some(DECIMAL.into());
        amount.version = Some(1);
        amount.parameters = vec![
            ("scale".into(), "2".into()),
            ("connect.decimal.precision".into(), "10".into()),
        ];
        amount.default = Some(Data::Decimal(Decimal::parse("0.00").unwrap()));
        let value = Data::Decimal(Decimal::parse("-12.30").unwrap());
        assert_eq!(
            to_json(Some(&amount), &value, true).unwrap().unwrap(),
            "{\"schema\":{\"type\":\"bytes\",\"optional\":false,\"name\":\"org.apache.kafka.connect.data.Decimal\",\"version\":1,\"parameters\":{\"scale\":\"2\",\"connect.decimal.precision\":\"10\"},\"default\":\"AA==\"},\"payload\":\"+zI=\"}"
        );
        let numeric = JsonSettings {
            schemas: false,
            numeric_decimals: true,
        };
        assert_eq!(
            to_json_with(Some(&amount), &value, numeric)
                .unwrap()
                .unwrap(),
            "-12.30"
        );
        let mut doc = Schema::optional(Kind::Int8);
        doc.doc = Some("Variable scaled decimal".into());
        assert_eq!(
            to_json(Some(&doc), &Data::Int(42), true).unwrap().unwrap(),
            "{\"schema\":{\"type\":\"int8\",\"optional\":true,\"doc\":\"Variable scaled decimal\"},\"payload\":42}"
        );
    }

    #[test]
    fn text_is_what_values_convert_to_string_makes() {
        let text = |schema: &Schema, data: Data| to_text(Some(schema), &data).unwrap();
        let ratio = Schema::optional(Kind::Struct(vec![
            ("scale".into(), Schema::required(Kind::Int32)),
            ("value".into(), Schema::required(Kind::Bytes)),
        ]));
        let value = Data::Struct(vec![Data::Int(20), Data::Bytes(vec![0x11, 0x07])]);
        assert_eq!(
            text(&ratio, value).unwrap(),
            "{\"scale\":20,\"value\":\"EQc=\"}"
        );
        let float = Schema::optional(Kind::Float32);
        assert_eq!(text(&float, Data::Float(1.5)).unwrap(), "1.5");
        let double = Schema::optional(Kind::Float64);
        assert_eq!(text(&double, Data::Float(1e20)).unwrap(), "1.0E20");
        let bytes = Schema::optional(Kind::Bytes);
        assert_eq!(text(&bytes, Data::Bytes(vec![0, 255])).unwrap(), "AP8=");
        let quoted = Schema::optional(Kind::Array(Box::new(Schema::optional(Kind::String))));
        let items = Data::Array(vec![Data::Str("a\"b\\".into()), Data::Null]);
        assert_eq!(text(&quoted, items).unwrap(), "[\"a\\\"b\\\\\",null]");
        assert_eq!(text(&double, Data::Null), None);
        let mut date = Schema::optional(Kind::Int32);
        date.name = Some(CONNECT_DATE.into());
        assert!(to_text(Some(&date), &Data::Int(1)).is_err());
    }
}
