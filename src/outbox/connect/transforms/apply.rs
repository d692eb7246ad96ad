//! PURE: each reproduced transform applied to a Connect record as Kafka's own class applies
//! it, throwing (`Err`) where Kafka's would.

use std::sync::Arc;

use super::super::data::{Data, Kind, Schema};
use super::super::record::{ConnectRecord, Datum, Header};
use super::{Insertion, Part, Transform};

/// One transform on `record`; `Ok(None)` drops it.
pub(super) fn apply(
    transform: &Transform,
    mut record: ConnectRecord,
) -> Result<Option<ConnectRecord>, String> {
    match transform {
        Transform::Filter => return Ok(None),
        Transform::InsertHeader { header, value } => {
            let header = Header::new(Arc::clone(header), value.clone());
            record.headers.push(header);
        }
        Transform::DropHeaders(names) => record
            .headers
            .retain(|h| !names.iter().any(|n| **n == *h.name)),
        Transform::HeaderFrom {
            part,
            fields,
            headers,
            remove,
            defaults,
        } => header_from(&mut record, *part, fields, headers, *remove, *defaults)?,
        Transform::InsertField { .. } => insert_field(&mut record, transform)?,
        Transform::ReplaceField { .. } => replace_field(&mut record, transform)?,
        Transform::ValueToKey { fields, defaults } => value_to_key(&mut record, fields, *defaults)?,
        Transform::ExtractField {
            part,
            field,
            defaults,
        } => {
            let datum = part_mut(&mut record, *part);
            *datum = extract_field(datum, field, *defaults)?;
        }
    }
    Ok(Some(record))
}

/// `InsertField`: the topic, partition and static fields added to a struct (not to a null).
fn insert_field(record: &mut ConnectRecord, transform: &Transform) -> Result<(), String> {
    let Transform::InsertField {
        part,
        topic,
        partition,
        fixed,
        defaults,
    } = transform
    else {
        return Ok(());
    };
    let topic_value = Data::Str(record.topic.clone());
    let partition_value = record
        .partition
        .map_or(Data::Null, |p| Data::Int(i64::from(p)));
    let mut additions = Vec::new();
    if let Some(field) = topic {
        additions.push((field, Kind::String, topic_value));
    }
    if let Some(field) = partition {
        additions.push((field, Kind::Int32, partition_value));
    }
    if let Some((field, value)) = fixed {
        additions.push((field, Kind::String, Data::Str(value.clone())));
    }
    let datum = part_mut(record, *part);
    if datum.data != Data::Null {
        *datum = insert_fields(datum, &additions, *defaults)?;
    }
    Ok(())
}

/// `ReplaceField`: a struct's fields excluded, included and renamed (a null stays null).
fn replace_field(record: &mut ConnectRecord, transform: &Transform) -> Result<(), String> {
    let Transform::ReplaceField {
        part,
        exclude,
        include,
        renames,
        defaults,
    } = transform
    else {
        return Ok(());
    };
    let datum = part_mut(record, *part);
    if datum.data == Data::Null {
        return Ok(());
    }
    let kept = |name: &str| {
        !exclude.iter().any(|e| e == name)
            && (include.is_empty() || include.iter().any(|i| i == name))
    };
    let renamed = |name: &str| {
        let rename = renames.iter().rev().find(|(from, _)| from == name);
        rename.map_or(name.to_owned(), |(_, to)| to.clone())
    };
    *datum = replace_fields(datum, kept, renamed, *defaults)?;
    Ok(())
}

/// `ValueToKey`: the key becomes a struct of the value's `fields`.
fn value_to_key(
    record: &mut ConnectRecord,
    fields: &[String],
    defaults: bool,
) -> Result<(), String> {
    let (schema, values) = require_struct(&record.value, "copying fields from value to key")?;
    let mut key_fields = Vec::new();
    let mut key_values = Vec::new();
    for field in fields {
        let Some(index) = field_index(schema, field) else {
            return Err(format!("Field does not exist: {field}"));
        };
        key_fields.push(struct_fields(schema)[index].clone());
        key_values.push(field_value(schema, values, index, defaults));
    }
    record.key = Datum::new(
        Schema::required(Kind::Struct(key_fields)),
        Data::Struct(key_values),
    );
    Ok(())
}

fn part_mut(record: &mut ConnectRecord, part: Part) -> &mut Datum {
    match part {
        Part::Key => &mut record.key,
        Part::Value => &mut record.value,
    }
}

/// Kafka's `Requirements.requireStruct` (or `requireMap` without a schema, which the
/// router's data never is): the struct's schema and values.
fn require_struct<'a>(datum: &'a Datum, purpose: &str) -> Result<(&'a Schema, &'a [Data]), String> {
    match (datum.schema.as_deref(), &datum.data) {
        (
            Some(
                schema @ Schema {
                    kind: Kind::Struct(_),
                    ..
                },
            ),
            Data::Struct(values),
        ) => Ok((schema, values)),
        (None, data) => Err(format!(
            "Only Map objects supported in absence of schema for [{purpose}], found: {}",
            java_class(data)
        )),
        (Some(_), data) => Err(format!(
            "Only Struct objects supported for [{purpose}], found: {}",
            java_class(data)
        )),
    }
}

/// The Java class Kafka's error message names for a value.
fn java_class(data: &Data) -> &'static str {
    match data {
        Data::Null => "null",
        Data::Bool(_) => "java.lang.Boolean",
        Data::Int(_) => "java.lang.Long",
        Data::Float(_) => "java.lang.Double",
        Data::Decimal(_) => "java.math.BigDecimal",
        Data::Str(_) => "java.lang.String",
        Data::Bytes(_) => "java.nio.HeapByteBuffer",
        Data::Array(_) => "java.util.ArrayList",
        Data::Struct(_) => "org.apache.kafka.connect.data.Struct",
    }
}

pub(super) fn struct_fields(schema: &Schema) -> &[(String, Schema)] {
    match &schema.kind {
        Kind::Struct(fields) => fields,
        _ => &[],
    }
}

fn field_index(schema: &Schema, name: &str) -> Option<usize> {
    struct_fields(schema).iter().position(|(n, _)| n == name)
}

/// `Struct.get` (the default for a null) or `getWithoutDefault`.
fn field_value(schema: &Schema, values: &[Data], index: usize, defaults: bool) -> Data {
    let value = values.get(index).cloned().unwrap_or(Data::Null);
    let default = struct_fields(schema)
        .get(index)
        .and_then(|(_, s)| s.default.clone());
    match (value, default) {
        (Data::Null, Some(default)) if defaults => default,
        (value, _) => value,
    }
}

/// Kafka's `SchemaUtil.copySchemaBasics` onto a new struct of `fields`: name, version, doc
/// and parameters, never optional, no default.
fn struct_like(schema: &Schema, fields: Vec<(String, Schema)>) -> Schema {
    Schema {
        kind: Kind::Struct(fields),
        optional: false,
        name: schema.name.clone(),
        version: schema.version,
        doc: schema.doc.clone(),
        parameters: schema.parameters.clone(),
        default: None,
    }
}

fn header_from(
    record: &mut ConnectRecord,
    part: Part,
    fields: &[String],
    headers: &[Arc<str>],
    remove: bool,
    defaults: bool,
) -> Result<(), String> {
    let datum = part_mut(record, part);
    let purpose = if remove { "header move" } else { "header copy" };
    let (schema, values) = require_struct(datum, purpose)?;
    let mut added = Vec::new();
    for (field, header) in fields.iter().zip(headers) {
        let Some(index) = field_index(schema, field) else {
            return Err(format!(
                "field {field} is not in the struct: NullPointerException"
            ));
        };
        let field_schema = struct_fields(schema)[index].1.clone();
        let value = field_value(schema, values, index, defaults);
        added.push(Header::new(
            Arc::clone(header),
            Datum::new(field_schema, value),
        ));
    }
    if remove {
        let mut kept_fields = Vec::new();
        let mut kept_values = Vec::new();
        for (index, field) in struct_fields(schema).iter().enumerate() {
            if !fields.contains(&field.0) {
                kept_fields.push(field.clone());
                kept_values.push(field_value(schema, values, index, defaults));
            }
        }
        *datum = Datum::new(struct_like(schema, kept_fields), Data::Struct(kept_values));
    }
    record.headers.extend(added);
    Ok(())
}

fn insert_fields(
    datum: &Datum,
    additions: &[(&Insertion, Kind, Data)],
    defaults: bool,
) -> Result<Datum, String> {
    let (schema, values) = require_struct(datum, "field insertion")?;
    let mut fields = struct_fields(schema).to_vec();
    let mut data: Vec<Data> = (0..fields.len())
        .map(|i| field_value(schema, values, i, defaults))
        .collect();
    for (insertion, kind, value) in additions {
        if fields.iter().any(|(n, _)| *n == insertion.name) {
            return Err(format!(
                "Cannot create field because of field name duplication {}",
                insertion.name
            ));
        }
        let field_schema = Schema {
            optional: insertion.optional,
            ..Schema::optional(kind.clone())
        };
        if !insertion.optional && *value == Data::Null {
            return Err(format!(
                "Invalid value: null used for required field: \"{}\"",
                insertion.name
            ));
        }
        fields.push((insertion.name.clone(), field_schema));
        data.push(value.clone());
    }
    Ok(Datum::new(struct_like(schema, fields), Data::Struct(data)))
}

fn replace_fields(
    datum: &Datum,
    kept: impl Fn(&str) -> bool,
    renamed: impl Fn(&str) -> String,
    defaults: bool,
) -> Result<Datum, String> {
    let (schema, values) = require_struct(datum, "field replacement")?;
    let mut fields = Vec::new();
    let mut data = Vec::new();
    for (index, (name, field)) in struct_fields(schema).iter().enumerate() {
        if kept(name) {
            let new_name = renamed(name);
            if fields
                .iter()
                .any(|(n, _): &(String, Schema)| *n == new_name)
            {
                return Err(format!(
                    "Cannot create field because of field name duplication {new_name}"
                ));
            }
            fields.push((new_name, field.clone()));
            data.push(field_value(schema, values, index, defaults));
        }
    }
    Ok(Datum::new(struct_like(schema, fields), Data::Struct(data)))
}

fn extract_field(datum: &Datum, field: &str, defaults: bool) -> Result<Datum, String> {
    let Some(schema) = datum.schema.as_deref() else {
        return match &datum.data {
            Data::Null => Ok(Datum::null()),
            data => Err(format!(
                "Only Map objects supported in absence of schema for [field extraction], found: {}",
                java_class(data)
            )),
        };
    };
    let Some(index) = field_index(schema, field) else {
        return Err(format!("Unknown field: {field}"));
    };
    let field_schema = struct_fields(schema)[index].1.clone();
    match &datum.data {
        Data::Null => Ok(Datum::new(field_schema, Data::Null)),
        Data::Struct(values) => {
            let value = field_value(schema, values, index, defaults);
            Ok(Datum::new(field_schema, value))
        }
        data => Err(format!(
            "Only Struct objects supported for [field extraction], found: {}",
            java_class(data)
        )),
    }
}
