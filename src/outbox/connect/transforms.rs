//! PURE: Kafka Connect's built-in transforms (SMTs) and predicates configured after the Outbox
//! Event Router, applied to the router's [`ConnectRecord`] before the converters, as a Connect
//! worker's `TransformationChain` applies them.
//!
//! The chain is configured with Kafka Connect's own keys (`transforms`, `transforms.NAME.*`,
//! `predicates`, `predicates.NAME.*`), `transforms` listing the stages after the router. The
//! transforms reproduced are `InsertHeader`, `HeaderFrom`, `DropHeaders`, `InsertField`,
//! `ReplaceField`, `ValueToKey`, `ExtractField` and `Filter`, with the predicates
//! `TopicNameMatches`, `HasHeaderKey` and `RecordIsTombstone` (and `negate`). Any other
//! transform, and any setting whose effect is not reproduced, is refused by name when the chain
//! is parsed. Where a transform throws in Kafka Connect (a struct required and absent, a field
//! that does not exist), [`Chain::apply`] returns why: the task would stop on that record.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::data::{Data, Kind, Schema};
use super::record::{ConnectRecord, Datum, Header};

/// Kafka Connect's transforms package, for full class names.
const TRANSFORMS: &str = "org.apache.kafka.connect.transforms.";
/// Kafka Connect's predicates package.
const PREDICATES: &str = "org.apache.kafka.connect.transforms.predicates.";

/// A chain configuration the relay cannot reproduce: the key, its value and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{key}={value:?}: {reason}")]
pub struct ChainError {
    /// The Kafka Connect key, e.g. `transforms.route.type`.
    pub key: String,
    /// Its value.
    pub value: String,
    /// Why, and what would work.
    pub reason: String,
}

/// Whether a transform works on the record's key or its value (`$Key` or `$Value`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The key.
    Key,
    /// The value.
    Value,
}

/// A field `InsertField` adds: its name, and whether it is optional (`?`, the default) or
/// required (`!`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Insertion {
    /// The field's name.
    pub name: String,
    /// Whether the field's schema is optional.
    pub optional: bool,
}

impl Insertion {
    /// Kafka's `InsertionSpec.parse`.
    fn parse(spec: &str) -> Insertion {
        match (spec.strip_suffix('?'), spec.strip_suffix('!')) {
            (Some(name), _) => Insertion {
                name: name.to_owned(),
                optional: true,
            },
            (_, Some(name)) => Insertion {
                name: name.to_owned(),
                optional: false,
            },
            _ => Insertion {
                name: spec.to_owned(),
                optional: true,
            },
        }
    }
}

/// One of the transforms reproduced.
#[derive(Clone, Debug, PartialEq)]
pub enum Transform {
    /// `InsertHeader`: a header with a literal value, appended.
    InsertHeader {
        /// The header's name.
        header: Arc<str>,
        /// `value.literal` as Kafka's `Values.parseString` reads it.
        value: Datum,
    },
    /// `HeaderFrom$Key` or `$Value`: fields copied or moved into headers.
    HeaderFrom {
        /// Key or value.
        part: Part,
        /// The fields.
        fields: Vec<String>,
        /// The header names, one per field.
        headers: Vec<Arc<str>>,
        /// `operation=move`: the fields leave the struct.
        remove: bool,
        /// `replace.null.with.default`
        defaults: bool,
    },
    /// `DropHeaders`: every header with one of these names is dropped.
    DropHeaders(Vec<String>),
    /// `InsertField$Key` or `$Value`: fields from the record's topic and partition, or a literal.
    InsertField {
        /// Key or value.
        part: Part,
        /// `topic.field`
        topic: Option<Insertion>,
        /// `partition.field`
        partition: Option<Insertion>,
        /// `static.field` and `static.value`
        fixed: Option<(Insertion, String)>,
        /// `replace.null.with.default`
        defaults: bool,
    },
    /// `ReplaceField$Key` or `$Value`: fields kept, dropped or renamed.
    ReplaceField {
        /// Key or value.
        part: Part,
        /// `exclude`
        exclude: Vec<String>,
        /// `include` (empty: every field)
        include: Vec<String>,
        /// `renames`, from and to.
        renames: Vec<(String, String)>,
        /// `replace.null.with.default`
        defaults: bool,
    },
    /// `ValueToKey`: a key struct of the value's fields.
    ValueToKey {
        /// The fields.
        fields: Vec<String>,
        /// `replace.null.with.default`
        defaults: bool,
    },
    /// `ExtractField$Key` or `$Value`: one field replaces the struct.
    ExtractField {
        /// Key or value.
        part: Part,
        /// The field.
        field: String,
        /// `replace.null.with.default`
        defaults: bool,
    },
    /// `Filter`: the record is dropped.
    Filter,
}

/// One of the predicates reproduced.
#[derive(Clone, Debug)]
pub enum Predicate {
    /// `TopicNameMatches`: the whole topic matches the pattern.
    TopicNameMatches(regex::Regex),
    /// `HasHeaderKey`: some header has the name.
    HasHeaderKey(String),
    /// `RecordIsTombstone`: the value is null.
    RecordIsTombstone,
}

impl PartialEq for Predicate {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Predicate::TopicNameMatches(a), Predicate::TopicNameMatches(b)) => {
                a.as_str() == b.as_str()
            }
            (Predicate::HasHeaderKey(a), Predicate::HasHeaderKey(b)) => a == b,
            (Predicate::RecordIsTombstone, Predicate::RecordIsTombstone) => true,
            _ => false,
        }
    }
}

impl Predicate {
    /// Whether `record` satisfies the predicate.
    pub fn test(&self, record: &ConnectRecord) -> bool {
        match self {
            Predicate::TopicNameMatches(pattern) => pattern.is_match(&record.topic),
            Predicate::HasHeaderKey(name) => record.headers.iter().any(|h| &*h.name == name),
            Predicate::RecordIsTombstone => record.value.data == Data::Null,
        }
    }
}

/// A transform with its name and, when it has one, its predicate and `negate`.
#[derive(Clone, Debug, PartialEq)]
pub struct Stage {
    /// The name in `transforms`.
    pub name: String,
    /// What it does.
    pub transform: Transform,
    /// The predicate, and whether it is negated.
    pub predicate: Option<(Predicate, bool)>,
}

/// The transforms after the router, in order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Chain {
    /// The stages.
    pub stages: Vec<Stage>,
}

impl Eq for Chain {}

/// The settings of one named transform or predicate, read as Kafka's `ConfigDef` reads them.
struct Settings<'a> {
    /// `transforms.NAME.` or `predicates.NAME.`
    prefix: String,
    values: BTreeMap<&'a str, &'a str>,
    /// The settings read so far; the rest are refused.
    read: Vec<&'a str>,
}

impl<'a> Settings<'a> {
    fn error(&self, key: &str, value: &str, reason: impl Into<String>) -> ChainError {
        ChainError {
            key: format!("{}{key}", self.prefix),
            value: value.to_owned(),
            reason: reason.into(),
        }
    }

    fn get(&mut self, key: &'a str) -> Option<&'a str> {
        let (key, value) = self.values.get_key_value(key)?;
        self.read.push(key);
        Some(value)
    }

    fn required(&mut self, key: &'a str) -> Result<&'a str, ChainError> {
        self.get(key)
            .ok_or_else(|| self.error(key, "", "missing; Kafka Connect requires it"))
    }

    /// A `LIST` setting: comma-separated, each item trimmed, empty for an empty value.
    fn list(&mut self, key: &'a str) -> Vec<String> {
        let value = self.get(key).unwrap_or_default().trim();
        if value.is_empty() {
            return Vec::new();
        }
        value
            .split(',')
            .map(|item| item.trim().to_owned())
            .collect()
    }

    fn non_empty_list(&mut self, key: &'a str) -> Result<Vec<String>, ChainError> {
        let list = self.list(key);
        if list.is_empty() {
            return Err(self.error(key, "", "must list at least one name"));
        }
        Ok(list)
    }

    /// A `BOOLEAN` setting.
    fn boolean(&mut self, key: &'a str, default: bool) -> Result<bool, ChainError> {
        match self.get(key).map(str::trim) {
            None => Ok(default),
            Some(value) if value.eq_ignore_ascii_case("true") => Ok(true),
            Some(value) if value.eq_ignore_ascii_case("false") => Ok(false),
            Some(value) => Err(self.error(key, value, "expected true or false")),
        }
    }

    /// Refuses the first setting not read: Kafka Connect would ignore it, and the relay
    /// refuses rather than take a typo for intent.
    fn done(&self, class: &str) -> Result<(), ChainError> {
        let unread = self.values.iter().find(|(k, _)| !self.read.contains(k));
        match unread {
            None => Ok(()),
            Some((key, value)) => Err(self.error(
                key,
                value,
                format!("not a setting of {class} the relay reproduces; remove it"),
            )),
        }
    }
}

impl Chain {
    /// Reads the chain from Kafka Connect's `transforms*` and `predicates*` settings.
    pub fn parse(settings: &[(String, String)]) -> Result<Chain, ChainError> {
        let lookup: BTreeMap<&str, &str> = settings
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let names = |key: &str| -> Vec<&str> {
            let list = lookup.get(key).copied().unwrap_or_default();
            list.split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .collect()
        };
        let transforms = names("transforms");
        let predicates = names("predicates");
        for key in lookup.keys() {
            let owned = |list: &[&str], group: &str| {
                *key == group
                    || list
                        .iter()
                        .any(|n| key.starts_with(&format!("{group}.{n}.")))
            };
            if !owned(&transforms, "transforms") && !owned(&predicates, "predicates") {
                let reason = "names no transform in transforms= or predicate in predicates=";
                return Err(ChainError {
                    key: (*key).to_owned(),
                    value: lookup[key].to_owned(),
                    reason: reason.to_owned(),
                });
            }
        }
        let settings_of = |group: &str, name: &str| {
            let prefix = format!("{group}.{name}.");
            let values = lookup
                .iter()
                .filter_map(|(k, v)| Some((k.strip_prefix(&prefix)?, *v)))
                .collect();
            Settings {
                prefix,
                values,
                read: Vec::new(),
            }
        };
        let mut stages = Vec::new();
        for name in transforms {
            let mut settings = settings_of("transforms", name);
            let predicate = match settings.get("predicate") {
                None => None,
                Some(predicate) if predicates.contains(&predicate.trim()) => {
                    let negate = settings.boolean("negate", false)?;
                    let mut of = settings_of("predicates", predicate.trim());
                    Some((parse_predicate(&mut of)?, negate))
                }
                Some(predicate) => {
                    let why = "names no predicate in predicates=";
                    return Err(settings.error("predicate", predicate, why));
                }
            };
            let transform = parse_transform(&mut settings)?;
            stages.push(Stage {
                name: name.to_owned(),
                transform,
                predicate,
            });
        }
        Ok(Chain { stages })
    }

    /// Whether there is no stage.
    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }

    /// `record` after every stage whose predicate holds: `None` when a `Filter` dropped it,
    /// `Err` with why when Kafka Connect's transform would throw on it.
    pub fn apply(&self, mut record: ConnectRecord) -> Result<Option<ConnectRecord>, String> {
        for stage in &self.stages {
            let applies = match &stage.predicate {
                None => true,
                Some((predicate, negate)) => predicate.test(&record) != *negate,
            };
            if !applies {
                continue;
            }
            let applied = apply(&stage.transform, record)
                .map_err(|why| format!("transform {}: {why}", stage.name))?;
            match applied {
                Some(next) => record = next,
                None => return Ok(None),
            }
        }
        Ok(Some(record))
    }
}

/// The class a `type` names, without the package of Kafka's built-in transforms.
fn short_class<'a>(class: &'a str, package: &str) -> &'a str {
    class.trim().strip_prefix(package).unwrap_or(class.trim())
}

fn parse_predicate(settings: &mut Settings<'_>) -> Result<Predicate, ChainError> {
    let class = settings.required("type")?;
    let predicate = match short_class(class, PREDICATES) {
        "TopicNameMatches" => {
            let pattern = settings.required("pattern")?;
            let regex = regex::Regex::new(&format!("^(?:{pattern})$")).map_err(|e| {
                let why =
                    format!("a Java regular expression the relay does not read the same way: {e}");
                settings.error("pattern", pattern, why)
            })?;
            Predicate::TopicNameMatches(regex)
        }
        "HasHeaderKey" => Predicate::HasHeaderKey(settings.required("name")?.to_owned()),
        "RecordIsTombstone" => Predicate::RecordIsTombstone,
        _ => {
            let why = "a predicate the relay does not reproduce (it reproduces TopicNameMatches, HasHeaderKey and RecordIsTombstone)";
            return Err(settings.error("type", class, why));
        }
    };
    settings.done(class)?;
    Ok(predicate)
}

/// `Foo$Key` or `Foo$Value` as the part, or `None` for another class.
fn part_of(class: &str, base: &str) -> Option<Part> {
    match class.strip_prefix(base)? {
        "$Key" => Some(Part::Key),
        "$Value" => Some(Part::Value),
        _ => None,
    }
}

fn parse_transform(settings: &mut Settings<'_>) -> Result<Transform, ChainError> {
    let class = settings.required("type")?;
    let short = short_class(class, TRANSFORMS);
    let part = |base| part_of(short, base);
    let transform = if short == "InsertHeader" {
        let header = settings.required("header")?;
        let literal = settings.required("value.literal")?;
        let value =
            parse_literal(literal).map_err(|why| settings.error("value.literal", literal, why))?;
        Transform::InsertHeader {
            header: Arc::from(header),
            value,
        }
    } else if let Some(part) = part("HeaderFrom") {
        let fields = settings.non_empty_list("fields")?;
        let headers = settings.non_empty_list("headers")?;
        if fields.len() != headers.len() {
            let why = "needs one header per field";
            return Err(settings.error("headers", &headers.join(","), why));
        }
        let operation = settings.required("operation")?;
        let remove = match operation {
            "move" => true,
            "copy" => false,
            _ => return Err(settings.error("operation", operation, "expected move or copy")),
        };
        Transform::HeaderFrom {
            part,
            fields,
            headers: headers.iter().map(|h| Arc::from(h.as_str())).collect(),
            remove,
            defaults: settings.boolean("replace.null.with.default", true)?,
        }
    } else if short == "DropHeaders" {
        Transform::DropHeaders(settings.non_empty_list("headers")?)
    } else if let Some(part) = part("InsertField") {
        parse_insert_field(settings, part)?
    } else if let Some(part) = part("ReplaceField") {
        let mut renames = Vec::new();
        for mapping in settings.list("renames") {
            match mapping.split(':').collect::<Vec<_>>()[..] {
                [from, to] => renames.push((from.to_owned(), to.to_owned())),
                _ => return Err(settings.error("renames", &mapping, "expected FROM:TO")),
            }
        }
        Transform::ReplaceField {
            part,
            exclude: settings.list("exclude"),
            include: settings.list("include"),
            renames,
            defaults: settings.boolean("replace.null.with.default", true)?,
        }
    } else if short == "ValueToKey" {
        Transform::ValueToKey {
            fields: settings.non_empty_list("fields")?,
            defaults: settings.boolean("replace.null.with.default", true)?,
        }
    } else if let Some(part) = part("ExtractField") {
        if let Some(version) = settings.get("field.syntax.version")
            && !version.trim().eq_ignore_ascii_case("v1")
        {
            let why = "the relay reproduces field names as written (V1), not nested paths";
            return Err(settings.error("field.syntax.version", version, why));
        }
        Transform::ExtractField {
            part,
            field: settings.required("field")?.to_owned(),
            defaults: settings.boolean("replace.null.with.default", true)?,
        }
    } else if short == "Filter" {
        Transform::Filter
    } else {
        return Err(settings.error("type", class, refused_transform(short)));
    };
    settings.done(class)?;
    Ok(transform)
}

fn parse_insert_field(settings: &mut Settings<'_>, part: Part) -> Result<Transform, ChainError> {
    for (key, why) in [
        (
            "offset.field",
            "a sink record's offset: a source connector's InsertField stops on it",
        ),
        (
            "timestamp.field",
            "the record timestamp, which Debezium takes from its processing time (the relay's is the commit time)",
        ),
    ] {
        if let Some(value) = settings.get(key) {
            return Err(settings.error(key, value, why));
        }
    }
    let topic = settings.get("topic.field").map(Insertion::parse);
    let partition = settings.get("partition.field").map(Insertion::parse);
    let fixed = match settings.get("static.field").map(Insertion::parse) {
        None => None,
        Some(field) => Some((field, settings.required("static.value")?.to_owned())),
    };
    if topic.is_none() && partition.is_none() && fixed.is_none() {
        return Err(settings.error("type", "InsertField", "no field insertion configured"));
    }
    Ok(Transform::InsertField {
        part,
        topic,
        partition,
        fixed,
        defaults: settings.boolean("replace.null.with.default", true)?,
    })
}

/// Why a transform other than those reproduced is refused.
fn refused_transform(class: &str) -> String {
    let why = match class.split('$').next().unwrap_or(class) {
        "RegexRouter" => {
            "RegexRouter rewrites topics with a Java regular expression; write the topic you want in route.topic.replacement (--topic-template)"
        }
        "TimestampRouter" => {
            "TimestampRouter names topics by the record timestamp, which Debezium takes from its processing time (the relay's is the commit time)"
        }
        "Cast" | "Flatten" | "HoistField" | "MaskField" | "SetSchemaMetadata"
        | "TimestampConverter" => {
            "a Kafka transform whose schema and value changes the relay does not reproduce; the reproduced ones are InsertHeader, HeaderFrom, DropHeaders, InsertField, ReplaceField, ValueToKey, ExtractField and Filter"
        }
        _ if class.starts_with("io.debezium.") => {
            "a Debezium transform, written for Debezium's change events; after the Outbox Event Router the relay reproduces only Kafka's InsertHeader, HeaderFrom, DropHeaders, InsertField, ReplaceField, ValueToKey, ExtractField and Filter"
        }
        _ => {
            "a transform the relay does not know, so it cannot reproduce its records; the reproduced ones are Kafka's InsertHeader, HeaderFrom, DropHeaders, InsertField, ReplaceField, ValueToKey, ExtractField and Filter"
        }
    };
    why.to_owned()
}

/// `Values.parseString` for the literals whose reading is reproduced: text, `true`, `false`,
/// `null` and integers (the smallest of int8 to int64 that holds them).
fn parse_literal(literal: &str) -> Result<Datum, String> {
    let refused = |what: &str| {
        Err(format!(
            "Kafka's Values.parseString reads this as {what}, which the relay does not reproduce; use text that does not start with a digit, a sign, '[' or '{{'"
        ))
    };
    if literal.trim() != literal {
        return refused("text with its surrounding spaces trimmed, or a number");
    }
    let text = |s: &str| Datum::new(Schema::required(Kind::String), Data::Str(s.to_owned()));
    let Some(first) = literal.chars().next() else {
        return Ok(text(""));
    };
    match literal {
        "null" => return Ok(Datum::null()),
        "true" | "false" => {
            let value = Data::Bool(literal == "true");
            return Ok(Datum::new(Schema::required(Kind::Boolean), value));
        }
        _ => {}
    }
    if first == '[' || first == '{' {
        return refused("a list or a map");
    }
    if !(first.is_ascii_digit() || first == '+' || first == '-') {
        return Ok(text(literal));
    }
    let digits = literal.strip_prefix(['+', '-']).unwrap_or(literal);
    let integer = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
    let Some(value) = integer.then(|| literal.parse::<i64>().ok()).flatten() else {
        return refused("a number, a date or a time");
    };
    let kind = if i8::try_from(value).is_ok() {
        Kind::Int8
    } else if i16::try_from(value).is_ok() {
        Kind::Int16
    } else if i32::try_from(value).is_ok() {
        Kind::Int32
    } else {
        Kind::Int64
    };
    Ok(Datum::new(Schema::required(kind), Data::Int(value)))
}

/// One transform on `record`; `Ok(None)` drops it.
fn apply(
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
        Transform::InsertField {
            part,
            topic,
            partition,
            fixed,
            defaults,
        } => {
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
            let datum = part_mut(&mut record, *part);
            if datum.data != Data::Null {
                *datum = insert_fields(datum, &additions, *defaults)?;
            }
        }
        Transform::ReplaceField {
            part,
            exclude,
            include,
            renames,
            defaults,
        } => {
            let datum = part_mut(&mut record, *part);
            if datum.data != Data::Null {
                let kept = |name: &str| {
                    !exclude.iter().any(|e| e == name)
                        && (include.is_empty() || include.iter().any(|i| i == name))
                };
                let renamed = |name: &str| {
                    let rename = renames.iter().rev().find(|(from, _)| from == name);
                    rename.map_or(name.to_owned(), |(_, to)| to.clone())
                };
                *datum = replace_fields(datum, kept, renamed, *defaults)?;
            }
        }
        Transform::ValueToKey { fields, defaults } => {
            let (schema, values) =
                require_struct(&record.value, "copying fields from value to key")?;
            let mut key_fields = Vec::new();
            let mut key_values = Vec::new();
            for field in fields {
                let Some(index) = field_index(schema, field) else {
                    return Err(format!("Field does not exist: {field}"));
                };
                key_fields.push(struct_fields(schema)[index].clone());
                key_values.push(field_value(schema, values, index, *defaults));
            }
            record.key = Datum::new(
                Schema::required(Kind::Struct(key_fields)),
                Data::Struct(key_values),
            );
        }
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

fn struct_fields(schema: &Schema) -> &[(String, Schema)] {
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

#[cfg(test)]
mod tests;
