//! PURE: Kafka's `Values.convertToString`, the text `SimpleHeaderConverter` (and
//! `StringConverter` of a number) writes of a Connect value.

use std::fmt::Write as _;

use base64::Engine as _;

use super::{
    CONNECT_DATE, CONNECT_TIME, CONNECT_TIMESTAMP, Data, Kind, Refused, Schema, java_double,
    java_float, write_base64,
};

/// `Values.convertToString`, which `SimpleHeaderConverter` writes: strings as they are,
/// numbers as Java prints them, bytes as base64, structs and arrays in Connect's own JSON-like
/// text; `None` for null. `Err` for Connect's `Date`, `Time` and `Timestamp`, which it formats in
/// the worker JVM's time zone.
pub fn to_text(schema: Option<&Schema>, data: &Data) -> Result<Option<String>, Refused> {
    if *data == Data::Null {
        return Ok(None);
    }
    let mut out = String::new();
    append_text(&mut out, schema, data, false)?;
    Ok(Some(out))
}

/// `Values.append`: `embedded` values (inside a struct or array) quote their strings.
fn append_text(
    out: &mut String,
    schema: Option<&Schema>,
    data: &Data,
    embedded: bool,
) -> Result<(), Refused> {
    let logical = schema.and_then(|s| s.name.as_deref());
    if let Some(name @ (CONNECT_DATE | CONNECT_TIME | CONNECT_TIMESTAMP)) = logical {
        let why = format!("Kafka's Values formats a {name} in the worker JVM's time zone");
        return Err(Refused(why));
    }
    match data {
        Data::Null => out.push_str("null"),
        Data::Bool(b) => write!(out, "{b}").unwrap_or_default(),
        Data::Int(i) => write!(out, "{i}").unwrap_or_default(),
        Data::Float(f) => match schema.map(|s| &s.kind) {
            Some(Kind::Float32) => out.push_str(&java_float(*f)),
            _ => out.push_str(&java_double(*f)),
        },
        Data::Decimal(d) => out.push_str(&d.to_java_string()),
        Data::Str(s) if embedded => {
            let escaped = s.replace('\\', "\\\\").replace('"', "\\\"");
            write!(out, "\"{escaped}\"").unwrap_or_default();
        }
        Data::Str(s) => out.push_str(s),
        Data::Bytes(b) if embedded => write_base64(out, b),
        Data::Bytes(b) => base64::engine::general_purpose::STANDARD.encode_string(b, out),
        Data::Array(items) => append_array(out, schema, items)?,
        Data::Struct(values) => append_struct(out, schema, values)?,
    }
    Ok(())
}

/// An array's items, each embedded.
fn append_array(out: &mut String, schema: Option<&Schema>, items: &[Data]) -> Result<(), Refused> {
    let item = match schema.map(|s| &s.kind) {
        Some(Kind::Array(item)) => Some(&**item),
        _ => None,
    };
    out.push('[');
    for (i, value) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        append_text(out, item, value, true)?;
    }
    out.push(']');
    Ok(())
}

/// A struct's fields as `{name:value,...}`, each embedded.
fn append_struct(
    out: &mut String,
    schema: Option<&Schema>,
    values: &[Data],
) -> Result<(), Refused> {
    let Some(Kind::Struct(fields)) = schema.map(|s| &s.kind) else {
        return Err(Refused("a struct without its schema".into()));
    };
    out.push('{');
    for (i, ((name, field), value)) in fields.iter().zip(values).enumerate() {
        if i > 0 {
            out.push(',');
        }
        append_text(out, None, &Data::Str(name.clone()), true)?;
        out.push(':');
        // `Struct.get` gives a null field its default.
        let value = match (value, &field.default) {
            (Data::Null, Some(default)) => default,
            _ => value,
        };
        append_text(out, Some(field), value, true)?;
    }
    out.push('}');
    Ok(())
}
