//! PURE: `table.expand.json.payload`, as Debezium's EventRouter does it: a payload starting with
//! `{` or `[` is read as Jackson reads JSON, a Connect schema is inferred from it
//! (`JsonSchemaData`: integers as int32 or int64, other numbers as double, JSON nulls and empty
//! arrays dropped), and the document becomes a struct of that schema. What Debezium leaves
//! unchanged stays unchanged; what makes Debezium stop (a number wider than 64 bits, a
//! top-level array, values that do not fit the inferred schema) is an error here.

use super::data::{Data, Kind, Schema};

/// Jackson's default limits (`StreamReadConstraints`): deeper or longer input does not parse.
const MAX_DEPTH: usize = 1000;
const MAX_NUMBER_LEN: usize = 1000;

/// What expansion makes of a payload.
#[derive(Debug, PartialEq)]
pub enum Expanded {
    /// Left as it was: not starting with `{` or `[`, not JSON, or no schema could be inferred.
    Unchanged,
    /// A top-level empty array: Debezium drops the payload's schema and keeps the text.
    NoSchema,
    /// The document as a struct.
    Struct(Schema, Data),
    /// Debezium stops on this payload; why.
    Stops(String),
}

/// A parsed JSON value, numbers classified as Jackson's `JsonNode` does.
#[derive(Debug, Clone, PartialEq)]
enum Node {
    Null,
    Bool(bool),
    Int(i32),
    Long(i64),
    /// An integer wider than 64 bits (a `BigIntegerNode`).
    Big,
    Double(f64),
    Str(String),
    Array(Vec<Node>),
    Object(Vec<(String, Node)>),
}

/// Expands `payload` (the text of the column named `field`); `nulls_as_bytes` is
/// `table.json.payload.null.behavior=optional_bytes`.
pub fn expand(payload: &str, field: &str, nulls_as_bytes: bool) -> Expanded {
    if !payload.starts_with(['{', '[']) {
        return Expanded::Unchanged;
    }
    let Some(node) = Parser::new(payload).value(0) else {
        return Expanded::Unchanged;
    };
    let schema = match infer(Some(field), &node, nulls_as_bytes) {
        Err(()) => return Expanded::Unchanged,
        Ok(None) => return Expanded::NoSchema,
        Ok(Some(schema)) => schema,
    };
    let stops = |why: &str| Expanded::Stops(format!("the payload expands to {why}"));
    if !matches!(schema.kind, Kind::Struct(_)) {
        return stops("a top-level array, which Debezium cannot make a struct of");
    }
    match data(&node, &schema) {
        Some(data) => Expanded::Struct(schema, data),
        None => stops(
            "values that do not fit the schema Debezium infers from it (a number wider than \
             64 bits, or array items of different types)",
        ),
    }
}

/// `JsonSchemaData.toConnectSchema`: `Err` where Debezium's inference throws (and the payload
/// stays unchanged), `Ok(None)` for what it drops.
fn infer(key: Option<&str>, node: &Node, nulls_as_bytes: bool) -> Result<Option<Schema>, ()> {
    let kind = match node {
        Node::Str(_) => Kind::String,
        Node::Bool(_) => Kind::Boolean,
        Node::Int(_) => Kind::Int32,
        Node::Long(_) => Kind::Int64,
        Node::Big | Node::Double(_) => Kind::Float64,
        Node::Null if nulls_as_bytes => Kind::Bytes,
        Node::Null => return Ok(None),
        Node::Array(items) if items.is_empty() => return Ok(None),
        Node::Array(items) => Kind::Array(Box::new(items_schema(key, items, nulls_as_bytes)?)),
        Node::Object(fields) => {
            let mut schemas: Vec<(String, Schema)> = Vec::new();
            for (name, value) in fields {
                // Connect's SchemaBuilder refuses an empty field name, so Debezium keeps the text.
                if name.is_empty() {
                    return Err(());
                }
                let path = match key {
                    Some(key) if !key.trim().is_empty() => format!("{key}.{name}"),
                    _ => name.clone(),
                };
                if let Some(schema) = infer(Some(&path), value, nulls_as_bytes)?
                    && !schemas.iter().any(|(n, _)| n == name)
                {
                    schemas.push((name.clone(), schema));
                }
            }
            let mut schema = Schema::optional(Kind::Struct(schemas));
            schema.name = key.map(str::to_owned);
            return Ok(Some(schema));
        }
    };
    Ok(Some(Schema::optional(kind)))
}

/// An array's item schema: from its first non-null item, all items of one JSON type (and
/// numbers of one schema); objects' schemas merged, fields in first-seen order.
fn items_schema(key: Option<&str>, items: &[Node], nulls_as_bytes: bool) -> Result<Schema, ()> {
    let mut sample: Option<&Node> = None;
    for item in items.iter().filter(|i| **i != Node::Null) {
        let first = *sample.get_or_insert(item);
        let number = |n: &Node| {
            matches!(
                n,
                Node::Int(_) | Node::Long(_) | Node::Big | Node::Double(_)
            )
        };
        if std::mem::discriminant(first) != std::mem::discriminant(item)
            && !(number(first) && number(item))
        {
            return Err(());
        }
        if number(first)
            && infer(None, first, nulls_as_bytes)? != infer(None, item, nulls_as_bytes)?
        {
            return Err(());
        }
    }
    let Some(Node::Object(_)) = sample else {
        return infer(None, sample.unwrap_or(&Node::Null), nulls_as_bytes)?.ok_or(());
    };
    // Debezium merges the distinct item schemas in a HashSet's order, which follows JVM
    // identity hashes: field order varies between its runs. First-seen order is one of them.
    let mut distinct: Vec<Schema> = Vec::new();
    for item in items.iter().filter(|i| matches!(i, Node::Object(_))) {
        if let Some(schema) = infer(key, item, nulls_as_bytes)?
            && !distinct.contains(&schema)
        {
            distinct.push(schema);
        }
    }
    let mut merged = distinct.first().cloned().ok_or(())?;
    for right in &distinct[1..] {
        merged = merge(&merged, right);
    }
    Ok(merged)
}

/// `JsonSchemaData.mergeSchema`: left's fields, then right's new ones; a bytes field (from a
/// null) gives way to a typed one. The result is not optional (`SchemaUtil.copySchemaBasics`).
fn merge(left: &Schema, right: &Schema) -> Schema {
    let (Kind::Struct(left_fields), Kind::Struct(right_fields)) = (&left.kind, &right.kind) else {
        return left.clone();
    };
    let mut fields = left_fields.clone();
    for (name, schema) in right_fields {
        match fields.iter_mut().find(|(n, _)| n == name) {
            None => fields.push((name.clone(), schema.clone())),
            Some((_, old)) if old.kind == Kind::Bytes && schema.kind != Kind::Bytes => {
                *old = schema.clone();
            }
            Some(_) => {}
        }
    }
    Schema {
        kind: Kind::Struct(fields),
        optional: false,
        ..left.clone()
    }
}

/// `JsonSchemaData.toConnectData` with Connect's validation: `None` where a value does not fit.
fn data(node: &Node, schema: &Schema) -> Option<Data> {
    Some(match (node, &schema.kind) {
        (Node::Null, _) => return schema.optional.then_some(Data::Null),
        (Node::Str(s), Kind::String) => Data::Str(s.clone()),
        (Node::Bool(b), Kind::Boolean) => Data::Bool(*b),
        (Node::Int(i), Kind::Int32) => Data::Int(i64::from(*i)),
        (Node::Long(l), Kind::Int64) => Data::Int(*l),
        (Node::Double(f), Kind::Float64) => Data::Float(*f),
        (Node::Array(items), Kind::Array(item)) => {
            Data::Array(items.iter().map(|i| data(i, item)).collect::<Option<_>>()?)
        }
        (Node::Object(values), Kind::Struct(fields)) => Data::Struct(
            fields
                .iter()
                .map(
                    |(name, schema)| match values.iter().find(|(n, _)| n == name) {
                        Some((_, value)) => data(value, schema),
                        None => Some(Data::Null),
                    },
                )
                .collect::<Option<_>>()?,
        ),
        _ => return None,
    })
}

/// A JSON reader with Jackson's defaults: standard JSON only, the first value read and what
/// follows it ignored, a repeated key's last value kept at its first position.
struct Parser<'a> {
    text: &'a [u8],
    at: usize,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Self {
        Parser {
            text: text.as_bytes(),
            at: 0,
        }
    }

    fn peek(&mut self) -> Option<u8> {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.text.get(self.at) {
            self.at += 1;
        }
        self.text.get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    fn literal(&mut self, word: &str, node: Node) -> Option<Node> {
        let end = self.at + word.len();
        (self.text.get(self.at..end)? == word.as_bytes()).then(|| {
            self.at = end;
            node
        })
    }

    fn value(&mut self, depth: usize) -> Option<Node> {
        if depth > MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'{' => {
                let mut fields: Vec<(String, Node)> = Vec::new();
                self.sequence(b'}', |p| {
                    p.peek()?;
                    let name = p.string()?;
                    p.eat(b':')?;
                    let value = p.value(depth + 1)?;
                    match fields.iter_mut().find(|(n, _)| *n == name) {
                        Some((_, old)) => *old = value,
                        None => fields.push((name, value)),
                    }
                    Some(())
                })?;
                Some(Node::Object(fields))
            }
            b'[' => {
                let mut items = Vec::new();
                self.sequence(b']', |p| p.value(depth + 1).map(|v| items.push(v)))?;
                Some(Node::Array(items))
            }
            b'"' => self.string().map(Node::Str),
            b't' => self.literal("true", Node::Bool(true)),
            b'f' => self.literal("false", Node::Bool(false)),
            b'n' => self.literal("null", Node::Null),
            _ => self.number(),
        }
    }

    /// After an opening bracket: comma-separated items, each read by `item`, up to `close`.
    fn sequence(&mut self, close: u8, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.at += 1;
        if self.eat(close).is_some() {
            return Some(());
        }
        loop {
            item(self)?;
            if self.eat(b',').is_none() {
                return self.eat(close);
            }
        }
    }

    fn number(&mut self) -> Option<Node> {
        let start = self.at;
        let digits = |p: &mut Self| {
            let from = p.at;
            while p.text.get(p.at).is_some_and(u8::is_ascii_digit) {
                p.at += 1;
            }
            p.at - from
        };
        if self.text.get(self.at) == Some(&b'-') {
            self.at += 1;
        }
        let int_start = self.at;
        let int_digits = digits(self);
        if int_digits == 0 || (int_digits > 1 && self.text[int_start] == b'0') {
            return None;
        }
        let mut float = false;
        if self.text.get(self.at) == Some(&b'.') {
            self.at += 1;
            float = true;
            (digits(self) > 0).then_some(())?;
        }
        if let Some(b'e' | b'E') = self.text.get(self.at) {
            self.at += 1;
            float = true;
            if let Some(b'+' | b'-') = self.text.get(self.at) {
                self.at += 1;
            }
            (digits(self) > 0).then_some(())?;
        }
        if self.at - start > MAX_NUMBER_LEN {
            return None;
        }
        let text = std::str::from_utf8(&self.text[start..self.at]).ok()?;
        Some(match (float, text.parse::<i64>()) {
            (true, _) => Node::Double(text.parse().ok()?),
            (false, Ok(n)) => i32::try_from(n).map_or(Node::Long(n), Node::Int),
            (false, Err(_)) => Node::Big,
        })
    }

    fn string(&mut self) -> Option<String> {
        if self.text.get(self.at) != Some(&b'"') {
            return None;
        }
        self.at += 1;
        let mut units: Vec<u16> = Vec::new();
        let mut out = String::new();
        loop {
            let rest = std::str::from_utf8(&self.text[self.at..]).ok()?;
            let c = rest.chars().next()?;
            self.at += c.len_utf8();
            let unit = match c {
                '"' => break,
                c if c < ' ' => return None,
                '\\' => {
                    let escape = *self.text.get(self.at)?;
                    self.at += 1;
                    match escape {
                        b'"' | b'\\' | b'/' => u16::from(escape),
                        b'b' => 8,
                        b'f' => 12,
                        b'n' => 10,
                        b'r' => 13,
                        b't' => 9,
                        b'u' => {
                            let hex = self.text.get(self.at..self.at + 4)?;
                            self.at += 4;
                            u16::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?
                        }
                        _ => return None,
                    }
                }
                c => {
                    // Pending escaped units must form whole characters before a literal one.
                    out.push_str(&String::from_utf16(&units).ok()?);
                    units.clear();
                    out.push(c);
                    continue;
                }
            };
            units.push(unit);
        }
        // A lone surrogate (which Java would keep) is not read: Rust strings cannot hold it.
        out.push_str(&String::from_utf16(&units).ok()?);
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::data::to_json;
    use super::*;

    fn expanded(payload: &str) -> String {
        match expand(payload, "payload", false) {
            Expanded::Struct(schema, data) => to_json(Some(&schema), &data, false)
                .unwrap()
                .unwrap_or_default(),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn expands_objects_compactly_dropping_nulls_and_empty_arrays() {
        assert_eq!(
            expanded(
                "{\"x\": null, \"y\": 1, \"z\": {\"w\": null, \"v\": \"kept\"}, \"e\": [], \"arr\": [null, 1]}"
            ),
            "{\"y\":1,\"z\":{\"v\":\"kept\"},\"arr\":[null,1]}"
        );
        assert_eq!(expanded("{\"a\": 1} trailing"), "{\"a\":1}");
        assert_eq!(
            expanded("{\"k\": 1, \"k\": 2, \"b\": 0.0000001}"),
            "{\"k\":2,\"b\":1.0E-7}"
        );
        assert_eq!(
            expanded("{\"s\": \"\\ud83d\\ude42\\u001f\"}"),
            "{\"s\":\"\\uD83D\\uDE42\\u001F\"}"
        );
    }

    #[test]
    fn leaves_what_debezium_leaves() {
        for payload in [
            " {}",
            "\"text\"",
            "{bad",
            "{\"m\": [1, \"two\"]}",
            "{\"i\": [1, 3000000000]}",
            "{\"n\": [null]}",
            "{\"a\": 01}",
            "{\"s\": \"\\ud800\"}",
            "{\"\": 1}",
            "{\"a\": {\"\": 2}, \"b\": 3}",
            "{\"c\": [{\"\": 4}]}",
        ] {
            assert_eq!(
                expand(payload, "payload", false),
                Expanded::Unchanged,
                "{payload}"
            );
        }
        assert_eq!(expand("[]", "payload", false), Expanded::NoSchema);
    }

    #[test]
    fn stops_where_debezium_stops() {
        for payload in [
            "{\"big\": 1000000000000000000000}",
            "[{\"a\": 1}]",
            "{\"o\": [{\"a\": 1}, {\"a\": \"x\"}]}",
            "{\"o\": [{\"a\": 1}, null, {\"b\": 2}]}",
        ] {
            assert!(
                matches!(expand(payload, "payload", false), Expanded::Stops(_)),
                "{payload}"
            );
        }
    }

    #[test]
    fn merges_object_items_and_names_structs_by_path() {
        let Expanded::Struct(schema, data) = expand(
            "{\"o\": [{\"x\": 1}, {\"x\": 2, \"y\": \"two\"}], \"n\": {\"m\": null}}",
            "payload",
            true,
        ) else {
            panic!("not expanded");
        };
        let json = to_json(Some(&schema), &data, true).unwrap().unwrap();
        assert!(
            json.contains("\"name\":\"payload.o\"},\"optional\":true,\"field\":\"o\""),
            "{json}"
        );
        assert!(
            json.contains("{\"type\":\"bytes\",\"optional\":true,\"field\":\"m\"}"),
            "{json}"
        );
        assert!(json.ends_with("\"payload\":{\"o\":[{\"x\":1,\"y\":null},{\"x\":2,\"y\":\"two\"}],\"n\":{\"m\":null}}}"), "{json}");
    }
}
