//! PURE: what Confluent's Schema Registry converters put around a value, short of talking to
//! the registry: the subject a schema goes under (the subject name strategies), how its id
//! is found (`auto.register.schemas`, `use.latest.version`), the ids already known, and the
//! Confluent wire format (magic byte 0, the id as 4 big-endian bytes, then the body).
//!
//! Mapping stays pure: a record whose schema id is already known leaves it complete; one
//! whose id is not carries [`PendingSchemas`], which the pipeline resolves through the
//! registry (one round trip per new subject and schema) before the record goes to Kafka, then
//! [`PendingSchemas::complete`] writes the ids in.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use bytes::{Bytes, BytesMut};

use super::avro::{self, AvroSchema};
use super::data::{Data, Schema};
use super::protobuf::ProtobufSchema;
use crate::outbox::{OutboxRecord, RawParts};

/// The magic byte, id, then body: how many bytes come before the body.
pub const HEADER_LEN: usize = 5;
/// Known ids kept before the cache starts over (a forgotten id costs one round trip).
const IDS_CAPACITY: usize = 100_000;
/// Derived schemas kept per table before its cache starts over (`schemas.cache.config`'s
/// default in `AvroData`).
const DERIVED_CAPACITY: usize = 1_000;

/// How a converter names the subject a schema is registered under
/// (`key.subject.name.strategy`, `value.subject.name.strategy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SubjectStrategy {
    /// `TopicNameStrategy`: `TOPIC-key`, `TOPIC-value`.
    #[default]
    Topic,
    /// `RecordNameStrategy`: the record's full name (records only).
    Record,
    /// `TopicRecordNameStrategy`: `TOPIC-RECORD`.
    TopicRecord,
}

impl SubjectStrategy {
    /// The subject of a key's or value's schema sent to `topic`; `record` is the schema's
    /// record name, when it is a record. `Err`: the serializer throws.
    pub fn subject(self, topic: &str, key: bool, record: Option<&str>) -> Result<String, String> {
        let role = if key { "key" } else { "value" };
        let record = || {
            record.ok_or_else(|| {
                format!(
                    "{}: the {role} schema is not a record, which {} names subjects after",
                    self.config_key(key),
                    self.class(),
                )
            })
        };
        Ok(match self {
            SubjectStrategy::Topic => format!("{topic}-{role}"),
            SubjectStrategy::Record => record()?.to_owned(),
            SubjectStrategy::TopicRecord => format!("{topic}-{}", record()?),
        })
    }

    /// The strategy's Java class.
    pub fn class(self) -> &'static str {
        match self {
            SubjectStrategy::Topic => "io.confluent.kafka.serializers.subject.TopicNameStrategy",
            SubjectStrategy::Record => "io.confluent.kafka.serializers.subject.RecordNameStrategy",
            SubjectStrategy::TopicRecord => {
                "io.confluent.kafka.serializers.subject.TopicRecordNameStrategy"
            }
        }
    }

    fn config_key(self, key: bool) -> &'static str {
        if key {
            "key.subject.name.strategy"
        } else {
            "value.subject.name.strategy"
        }
    }
}

/// How the serializer finds a schema's id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Lookup {
    /// `auto.register.schemas=true` (the default): registers it (the registry returns the
    /// existing id of a schema it has).
    #[default]
    Register,
    /// `auto.register.schemas=false`: the id of this schema, already registered under the
    /// subject.
    Existing,
    /// `auto.register.schemas=false`, `use.latest.version=true`: the subject's latest schema,
    /// which must be this one but for what does not change the bytes (documentation,
    /// properties, defaults).
    Latest,
}

/// One converter's (the key's or the value's) registry settings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoleFormat {
    /// `*.subject.name.strategy`
    pub subjects: SubjectStrategy,
    /// `auto.register.schemas`, `use.latest.version`
    pub lookup: Lookup,
    /// `connect.meta.data`, `scrub.invalid.names`
    pub avro: avro::Options,
}

/// The registry converters' settings, with the ids known so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegistryFormat {
    /// The key converter's.
    pub key: RoleFormat,
    /// The value converter's.
    pub value: RoleFormat,
    /// Ids by subject and schema, shared by every table as the converter's client shares them.
    pub ids: SchemaIds,
}

impl RegistryFormat {
    /// The key's or value's settings.
    pub fn role(&self, key: bool) -> &RoleFormat {
        if key { &self.key } else { &self.value }
    }

    /// Confluent's `AvroConverter.fromConnectData`: the bytes of `data` (with `schema`) sent
    /// to `topic`, the id written in when known, else left for the pipeline in `pending`.
    /// `None` for a null value (no schema is registered for it); `Err`: why the converter
    /// throws (Debezium stops).
    pub fn avro(
        &self,
        derived: &Derivations,
        key: bool,
        topic: &str,
        (schema, data): (Option<&Schema>, &Data),
        pending: &mut Option<Pending>,
    ) -> Result<Option<Bytes>, String> {
        let role = self.role(key);
        let (avro, registered) = derived.get(key, schema, role.avro)?;
        if *data == Data::Null {
            if schema.is_some_and(|s| !s.optional) {
                return Err("a null value for a schema that is not optional".into());
            }
            return Ok(None);
        }
        let subject = derived.subject(key, topic, role.subjects, avro.record_name())?;
        let pend = Pending {
            subject,
            schema: registered,
            lookup: role.lookup,
        };
        self.framed_body(pend, pending, |out| avro.encode(data, out))
    }

    /// Confluent's `ProtobufConverter.fromConnectData`, like [`RegistryFormat::avro`]: after
    /// the id, the message indexes and the protobuf body.
    pub fn protobuf(
        &self,
        derived: &Derivations,
        key: bool,
        topic: &str,
        (schema, data): (Option<&Schema>, &Data),
        pending: &mut Option<Pending>,
    ) -> Result<Option<Bytes>, String> {
        let role = self.role(key);
        let (protobuf, registered) = derived.protobuf(key, schema)?;
        if *data == Data::Null {
            return Ok(None);
        }
        let record = Some(protobuf.full_name());
        let subject = derived.subject(key, topic, role.subjects, record)?;
        let pend = Pending {
            subject,
            schema: registered,
            lookup: role.lookup,
        };
        self.framed_body(pend, pending, |out| protobuf.encode(data, out))
    }

    /// The Confluent framing around what `body` writes: the id of `schema` when known, else
    /// zeros, with `schema` left in `pending` for the pipeline.
    fn framed_body(
        &self,
        schema: Pending,
        pending: &mut Option<Pending>,
        body: impl FnOnce(&mut Vec<u8>) -> Result<(), String>,
    ) -> Result<Option<Bytes>, String> {
        let id = self.ids.get(&schema.subject, &schema.schema);
        let mut out = framed();
        if let Some(id) = id {
            out[1..HEADER_LEN].copy_from_slice(&id.to_be_bytes());
        }
        body(&mut out)?;
        if id.is_none() {
            *pending = Some(schema);
        }
        Ok(Some(Bytes::from(out)))
    }
}

/// What a Connect schema derives to: its Avro schema and the schema registered, or why the
/// converter throws.
type Derived = Result<(Arc<AvroSchema>, Arc<RegistrySchema>), String>;
/// The same for Protobuf.
type DerivedProtobuf = Result<(Arc<ProtobufSchema>, Arc<RegistrySchema>), String>;

/// One table's derived key and value schemas by Connect schema, as `AvroData` caches them (a
/// value's schema is derived once, not per event), and its topics' subjects.
#[derive(Clone, Debug, Default)]
pub struct Derivations(Arc<Mutex<DerivedMaps>>);

/// [`Derivations`]' maps, the key's then the value's.
#[derive(Debug, Default)]
struct DerivedMaps {
    schemas: [HashMap<Schema, Derived>; 2],
    schemaless: [Option<Derived>; 2],
    protobuf: [HashMap<Schema, DerivedProtobuf>; 2],
    /// `TopicNameStrategy` subjects by topic.
    subjects: [HashMap<String, Arc<str>>; 2],
}

impl Derivations {
    fn get(&self, key: bool, schema: Option<&Schema>, options: avro::Options) -> Derived {
        let role = usize::from(!key);
        let mut cache = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let cached = match schema {
            Some(schema) => cache.schemas[role].get(schema),
            None => cache.schemaless[role].as_ref(),
        };
        if let Some(derived) = cached {
            return derived.clone();
        }
        let derived = AvroSchema::from_connect(schema, options).map(|avro| {
            let text = avro.text().to_owned();
            let registered = Arc::new(RegistrySchema::new(SchemaType::Avro, text));
            (Arc::new(avro), registered)
        });
        match schema {
            Some(schema) => {
                let schemas = &mut cache.schemas[role];
                if schemas.len() >= DERIVED_CAPACITY {
                    schemas.clear();
                }
                schemas.insert(schema.clone(), derived.clone());
            }
            None => cache.schemaless[role] = Some(derived.clone()),
        }
        derived
    }

    /// The Protobuf schema of a key's or value's `schema`, derived once.
    fn protobuf(&self, key: bool, schema: Option<&Schema>) -> DerivedProtobuf {
        let derive = || {
            let protobuf = ProtobufSchema::from_connect(schema)?;
            let text = protobuf.text().to_owned();
            let registered = Arc::new(RegistrySchema::new(SchemaType::Protobuf, text));
            Ok((Arc::new(protobuf), registered))
        };
        // Without a schema there is nothing to cache: the converter's refusal.
        let Some(schema) = schema else {
            return derive();
        };
        let mut cache = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let schemas = &mut cache.protobuf[usize::from(!key)];
        if let Some(derived) = schemas.get(schema) {
            return derived.clone();
        }
        if schemas.len() >= DERIVED_CAPACITY {
            schemas.clear();
        }
        let derived = derive();
        schemas.insert(schema.clone(), derived.clone());
        derived
    }

    /// The subject of the key's or value's schema sent to `topic`: kept per topic for
    /// `TopicNameStrategy`, so an event costs no allocation.
    fn subject(
        &self,
        key: bool,
        topic: &str,
        strategy: SubjectStrategy,
        record: Option<&str>,
    ) -> Result<Arc<str>, String> {
        if strategy != SubjectStrategy::Topic {
            return Ok(strategy.subject(topic, key, record)?.into());
        }
        let role = usize::from(!key);
        let mut cache = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(subject) = cache.subjects[role].get(topic) {
            return Ok(Arc::clone(subject));
        }
        let subject: Arc<str> = strategy.subject(topic, key, record)?.into();
        let subjects = &mut cache.subjects[role];
        if subjects.len() >= DERIVED_CAPACITY {
            subjects.clear();
        }
        subjects.insert(topic.to_owned(), Arc::clone(&subject));
        Ok(subject)
    }
}

/// A registry schema's type, as the registry's `schemaType` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SchemaType {
    /// `AVRO` (the registry's default: not sent).
    Avro,
    /// `PROTOBUF`
    Protobuf,
}

/// A schema as registered: its type and text, with the text's hash computed once.
#[derive(Debug)]
pub struct RegistrySchema {
    kind: SchemaType,
    text: String,
    hash: u64,
}

impl RegistrySchema {
    /// The schema of type `kind` whose canonical text is `text`.
    pub fn new(kind: SchemaType, text: String) -> Self {
        let mut hasher = std::hash::DefaultHasher::new();
        text.hash(&mut hasher);
        let hash = hasher.finish();
        RegistrySchema { kind, text, hash }
    }

    /// The registry's `schemaType`.
    pub fn kind(&self) -> SchemaType {
        self.kind
    }

    /// The text the converter registers.
    pub fn text(&self) -> &str {
        &self.text
    }
}

impl PartialEq for RegistrySchema {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.text == other.text
    }
}
impl Eq for RegistrySchema {}

/// A subject and schema: what an id is known by.
#[derive(Clone, Debug, PartialEq, Eq)]
struct IdKey {
    subject: Arc<str>,
    schema: Arc<RegistrySchema>,
}

impl Hash for IdKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.subject.hash(state);
        // The text was hashed once, when the schema was derived.
        self.schema.hash.hash(state);
    }
}

/// Schema ids by subject and schema: filled by the pipeline from the registry, read by
/// mapping, so a schema costs one registry round trip, not one per event.
#[derive(Clone, Debug, Default)]
pub struct SchemaIds(Arc<RwLock<HashMap<IdKey, u32>>>);

impl PartialEq for SchemaIds {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for SchemaIds {}

impl SchemaIds {
    /// The id of `schema` under `subject`, when known.
    pub fn get(&self, subject: &Arc<str>, schema: &Arc<RegistrySchema>) -> Option<u32> {
        let key = IdKey {
            subject: Arc::clone(subject),
            schema: Arc::clone(schema),
        };
        let ids = self.0.read().unwrap_or_else(PoisonError::into_inner);
        ids.get(&key).copied()
    }

    /// Remembers the id the registry gave `schema` under `subject`.
    pub fn insert(&self, subject: &Arc<str>, schema: &Arc<RegistrySchema>, id: u32) {
        let mut ids = self.0.write().unwrap_or_else(PoisonError::into_inner);
        if ids.len() >= IDS_CAPACITY {
            ids.clear();
        }
        let key = IdKey {
            subject: Arc::clone(subject),
            schema: Arc::clone(schema),
        };
        ids.insert(key, id);
    }
}

/// A schema whose id is not known yet: the subject it goes under and how it is looked up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    /// The subject.
    pub subject: Arc<str>,
    /// The schema.
    pub schema: Arc<RegistrySchema>,
    /// Register it, or find it.
    pub lookup: Lookup,
}

/// The schemas a record waits for, with what could be read of its event (its dead letter,
/// should the registry refuse a schema).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingSchemas {
    /// The key's schema, when its id is not known.
    pub key: Option<Pending>,
    /// The value's schema, when its id is not known.
    pub value: Option<Pending>,
    /// The event's columns as the relay's own format has them.
    pub raw: RawParts,
}

impl PendingSchemas {
    /// The schemas, key first.
    pub fn each(&self) -> impl Iterator<Item = &Pending> {
        self.key.iter().chain(&self.value)
    }

    /// Writes the ids `ids` knows into `record`'s key and value; false (the record left
    /// waiting) while one is unknown.
    pub fn complete(record: &mut OutboxRecord, ids: &SchemaIds) -> bool {
        let Some(pending) = record.schemas.take() else {
            return true;
        };
        let id = |p: &Option<Pending>| match p {
            Some(p) => ids.get(&p.subject, &p.schema).map(Some),
            None => Some(None),
        };
        let (Some(key), Some(value)) = (id(&pending.key), id(&pending.value)) else {
            record.schemas = Some(pending);
            return false;
        };
        if let Some(id) = key {
            record.key = record.key.take().map(|bytes| with_id(bytes, id));
        }
        if let Some(id) = value {
            record.payload = record.payload.take().map(|bytes| with_id(bytes, id));
        }
        true
    }
}

/// A buffer for a framed body: the magic byte and room for the id.
pub fn framed() -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&[0; HEADER_LEN]);
    out
}

/// `framed` with the id written in.
pub fn with_id(bytes: Bytes, id: u32) -> Bytes {
    let mut bytes = BytesMut::from(bytes);
    if let Some(slot) = bytes.get_mut(1..HEADER_LEN) {
        slot.copy_from_slice(&id.to_be_bytes());
    }
    bytes.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_follow_the_strategy() {
        let table = [
            (SubjectStrategy::Topic, true, None, Ok("orders-key")),
            (
                SubjectStrategy::Topic,
                false,
                Some("a.B"),
                Ok("orders-value"),
            ),
            (SubjectStrategy::Record, false, Some("a.B"), Ok("a.B")),
            (
                SubjectStrategy::TopicRecord,
                false,
                Some("a.B"),
                Ok("orders-a.B"),
            ),
            (
                SubjectStrategy::Record,
                true,
                None,
                Err("key.subject.name.strategy"),
            ),
            (
                SubjectStrategy::TopicRecord,
                false,
                None,
                Err("RecordNameStrategy"),
            ),
        ];
        for (strategy, key, record, expected) in table {
            let subject = strategy.subject("orders", key, record);
            match expected {
                Ok(subject_) => assert_eq!(subject.as_deref(), Ok(subject_)),
                Err(needle) => assert!(
                    subject.as_ref().is_err_and(|e| e.contains(needle)),
                    "{strategy:?} {key}: {subject:?}"
                ),
            }
        }
    }

    #[test]
    fn ids_complete_a_record_once_both_are_known() {
        let ids = SchemaIds::default();
        let schema = Arc::new(RegistrySchema::new(SchemaType::Avro, "\"string\"".into()));
        let (key, value): (Arc<str>, Arc<str>) = ("t-key".into(), "t-value".into());
        let pending = |subject: &Arc<str>| Pending {
            subject: Arc::clone(subject),
            schema: Arc::clone(&schema),
            lookup: Lookup::Register,
        };
        let mut body = framed();
        body.push(7);
        let mut record = OutboxRecord {
            topic: "t".into(),
            key: Some(Bytes::from(body.clone())),
            payload: Some(Bytes::from(body)),
            id: Bytes::new(),
            headers: Vec::new(),
            id_header_at: Some(0),
            timestamp_ms: 0,
            partition: None,
            schemas: Some(Box::new(PendingSchemas {
                key: Some(pending(&key)),
                value: Some(pending(&value)),
                raw: RawParts::default(),
            })),
        };
        ids.insert(&key, &schema, 1);
        assert!(!PendingSchemas::complete(&mut record, &ids));
        assert!(record.schemas.is_some());
        // The same text is the same schema, whichever derivation made it.
        let again = Arc::new(RegistrySchema::new(SchemaType::Avro, "\"string\"".into()));
        ids.insert(&value, &again, 258);
        assert!(PendingSchemas::complete(&mut record, &ids));
        assert_eq!(record.key.as_deref(), Some(&[0, 0, 0, 0, 1, 7][..]));
        assert_eq!(record.payload.as_deref(), Some(&[0, 0, 0, 1, 2, 7][..]));
        assert!(record.schemas.is_none());
    }
}
