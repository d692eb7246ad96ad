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

mod apply;
mod parse;

use std::sync::Arc;

use super::data::Data;
use super::record::{ConnectRecord, Datum};

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

impl Chain {
    /// Reads the chain from Kafka Connect's `transforms*` and `predicates*` settings.
    pub fn parse(settings: &[(String, String)]) -> Result<Chain, ChainError> {
        parse::chain(settings)
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
            let applied = apply::apply(&stage.transform, record)
                .map_err(|why| format!("transform {}: {why}", stage.name))?;
            match applied {
                Some(next) => record = next,
                None => return Ok(None),
            }
        }
        Ok(Some(record))
    }
}

#[cfg(test)]
mod tests;
