//! PURE: reading a transform chain from Kafka Connect's settings, as Kafka's `ConfigDef`
//! reads them: every setting of a reproduced transform or predicate read, any other refused.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::super::data::{Data, Kind, Schema};
use super::super::record::Datum;
use super::{Chain, ChainError, Insertion, Part, Predicate, Stage, Transform};

/// Kafka Connect's transforms package, for full class names.
const TRANSFORMS: &str = "org.apache.kafka.connect.transforms.";
/// Kafka Connect's predicates package.
const PREDICATES: &str = "org.apache.kafka.connect.transforms.predicates.";

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

/// Reads the chain from Kafka Connect's `transforms*` and `predicates*` settings.
pub(super) fn chain(settings: &[(String, String)]) -> Result<Chain, ChainError> {
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
    check_owned(&lookup, &transforms, &predicates)?;
    let mut stages = Vec::new();
    for name in transforms {
        stages.push(stage(&lookup, name, &predicates)?);
    }
    Ok(Chain { stages })
}

/// Refuses a setting that belongs to no transform or predicate listed.
fn check_owned(
    lookup: &BTreeMap<&str, &str>,
    transforms: &[&str],
    predicates: &[&str],
) -> Result<(), ChainError> {
    for key in lookup.keys() {
        let owned = |list: &[&str], group: &str| {
            *key == group
                || list
                    .iter()
                    .any(|n| key.starts_with(&format!("{group}.{n}.")))
        };
        if !owned(transforms, "transforms") && !owned(predicates, "predicates") {
            let reason = "names no transform in transforms= or predicate in predicates=";
            return Err(ChainError {
                key: (*key).to_owned(),
                value: lookup[key].to_owned(),
                reason: reason.to_owned(),
            });
        }
    }
    Ok(())
}

/// The settings under `GROUP.NAME.`.
fn settings_of<'a>(lookup: &BTreeMap<&'a str, &'a str>, group: &str, name: &str) -> Settings<'a> {
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
}

/// The transform `name`, with its predicate.
fn stage(
    lookup: &BTreeMap<&str, &str>,
    name: &str,
    predicates: &[&str],
) -> Result<Stage, ChainError> {
    let mut settings = settings_of(lookup, "transforms", name);
    let predicate = match settings.get("predicate") {
        None => None,
        Some(predicate) if predicates.contains(&predicate.trim()) => {
            let negate = settings.boolean("negate", false)?;
            let mut of = settings_of(lookup, "predicates", predicate.trim());
            Some((parse_predicate(&mut of)?, negate))
        }
        Some(predicate) => {
            let why = "names no predicate in predicates=";
            return Err(settings.error("predicate", predicate, why));
        }
    };
    let transform = parse_transform(&mut settings)?;
    Ok(Stage {
        name: name.to_owned(),
        transform,
        predicate,
    })
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
    let transform = match header_transform(settings, short)? {
        Some(transform) => transform,
        None => match field_transform(settings, short)? {
            Some(transform) => transform,
            None => return Err(settings.error("type", class, refused_transform(short))),
        },
    };
    settings.done(class)?;
    Ok(transform)
}

/// The transforms of headers (and `Filter`), by their class's short name; `None` for others.
fn header_transform(
    settings: &mut Settings<'_>,
    short: &str,
) -> Result<Option<Transform>, ChainError> {
    let transform = if short == "InsertHeader" {
        let header = settings.required("header")?;
        let literal = settings.required("value.literal")?;
        let value =
            parse_literal(literal).map_err(|why| settings.error("value.literal", literal, why))?;
        Transform::InsertHeader {
            header: Arc::from(header),
            value,
        }
    } else if let Some(part) = part_of(short, "HeaderFrom") {
        parse_header_from(settings, part)?
    } else if short == "DropHeaders" {
        Transform::DropHeaders(settings.non_empty_list("headers")?)
    } else if short == "Filter" {
        Transform::Filter
    } else {
        return Ok(None);
    };
    Ok(Some(transform))
}

fn parse_header_from(settings: &mut Settings<'_>, part: Part) -> Result<Transform, ChainError> {
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
    Ok(Transform::HeaderFrom {
        part,
        fields,
        headers: headers.iter().map(|h| Arc::from(h.as_str())).collect(),
        remove,
        defaults: settings.boolean("replace.null.with.default", true)?,
    })
}

/// The transforms of a key's or value's fields, by their class's short name; `None` for
/// others.
fn field_transform(
    settings: &mut Settings<'_>,
    short: &str,
) -> Result<Option<Transform>, ChainError> {
    let part = |base| part_of(short, base);
    let transform = if let Some(part) = part("InsertField") {
        parse_insert_field(settings, part)?
    } else if let Some(part) = part("ReplaceField") {
        parse_replace_field(settings, part)?
    } else if short == "ValueToKey" {
        Transform::ValueToKey {
            fields: settings.non_empty_list("fields")?,
            defaults: settings.boolean("replace.null.with.default", true)?,
        }
    } else if let Some(part) = part("ExtractField") {
        parse_extract_field(settings, part)?
    } else {
        return Ok(None);
    };
    Ok(Some(transform))
}

fn parse_replace_field(settings: &mut Settings<'_>, part: Part) -> Result<Transform, ChainError> {
    let mut renames = Vec::new();
    for mapping in settings.list("renames") {
        match mapping.split(':').collect::<Vec<_>>()[..] {
            [from, to] => renames.push((from.to_owned(), to.to_owned())),
            _ => return Err(settings.error("renames", &mapping, "expected FROM:TO")),
        }
    }
    Ok(Transform::ReplaceField {
        part,
        exclude: settings.list("exclude"),
        include: settings.list("include"),
        renames,
        defaults: settings.boolean("replace.null.with.default", true)?,
    })
}

fn parse_extract_field(settings: &mut Settings<'_>, part: Part) -> Result<Transform, ChainError> {
    if let Some(version) = settings.get("field.syntax.version")
        && !version.trim().eq_ignore_ascii_case("v1")
    {
        let why = "the relay reproduces field names as written (V1), not nested paths";
        return Err(settings.error("field.syntax.version", version, why));
    }
    Ok(Transform::ExtractField {
        part,
        field: settings.required("field")?.to_owned(),
        defaults: settings.boolean("replace.null.with.default", true)?,
    })
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
pub(super) fn parse_literal(literal: &str) -> Result<Datum, String> {
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
