//! The Schema Registry behind the pipeline's `SchemaRegistry` trait, for schedules with
//! avro keys and values: ids per subject and schema as a registry gives them, a little
//! latency per lookup, and outages the seed schedules (`World::recv`'s faults), during which
//! every lookup fails as unavailable. Events then wait for their ids while the oracle checks
//! that nothing past them is confirmed.

use std::collections::BTreeMap;
use std::time::Duration;

use outbox_relay::outbox::connect::registry::Pending;
use outbox_relay::sink::registry::{Failure, Resolving, SchemaRegistry};
use rand::Rng;
use tokio::time::Instant;

use super::Shared;

/// What the simulated registry holds.
#[derive(Debug, Default)]
pub struct Registry {
    /// Ids by subject and schema text, from 1.
    ids: BTreeMap<(String, String), u32>,
    /// Unreachable until then.
    pub down_until: Option<Instant>,
}

/// The Avro schemas the relay derives for the simulated outbox's nullable text key and jsonb
/// payload (what a rival relay writes with).
pub const KEY_SCHEMA: &str = r#"["null","string"]"#;
pub const VALUE_SCHEMA: &str =
    r#"["null",{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Json"}]"#;

impl Registry {
    /// The id of `schema` under `subject`, registered if new.
    pub fn id(&mut self, subject: &str, schema: &str) -> u32 {
        let next = u32::try_from(self.ids.len()).unwrap_or(u32::MAX) + 1;
        let key = (subject.to_owned(), schema.to_owned());
        *self.ids.entry(key).or_insert(next)
    }

    /// An event's key and payload as the relay's avro converters write them to `topic`.
    pub fn framed(&mut self, topic: &str, key: &str, payload: &str) -> (Vec<u8>, Vec<u8>) {
        let key_id = self.id(&format!("{topic}-key"), KEY_SCHEMA);
        let value_id = self.id(&format!("{topic}-value"), VALUE_SCHEMA);
        (frame(key_id, key), frame(value_id, payload))
    }
}

/// `text` as an Avro optional string after the Confluent header with `id`.
fn frame(id: u32, text: &str) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&id.to_be_bytes());
    out.push(2);
    let mut length = (text.len() as u64) << 1;
    while length >= 0x80 {
        out.push((length as u8) | 0x80);
        length >>= 7;
    }
    out.push(length as u8);
    out.extend_from_slice(text.as_bytes());
    out
}

/// The pipeline's handle on the world's registry.
pub struct SimRegistry(pub Shared);

impl SchemaRegistry for SimRegistry {
    fn resolve(&self, pending: Pending) -> Resolving {
        let shared = self.0.clone();
        Box::pin(async move {
            let latency = shared.lock().rng.random_range(0..50);
            tokio::time::sleep(Duration::from_millis(latency)).await;
            let mut world = shared.lock();
            if (world.registry.down_until).is_some_and(|until| Instant::now() < until) {
                world.note(format!("registry down for {}", pending.subject));
                return Err(Failure::Unavailable {
                    reason: "the simulated registry is down".into(),
                });
            }
            let id = world.registry.id(&pending.subject, pending.schema.text());
            world.note(format!(
                "registry: {} {} is {id}",
                pending.subject,
                pending.schema.text()
            ));
            Ok(id)
        })
    }
}

/// The text in an Avro optional string framed as Confluent's converter frames it (magic
/// byte, 4-byte id, union branch 1, zigzag length, the bytes), or why it is not one.
pub fn unframe(bytes: &[u8]) -> Result<String, String> {
    let body = match bytes {
        [0, _, _, _, _, 2, body @ ..] => body,
        other => return Err(format!("not a framed optional string: {other:?}")),
    };
    let mut length: u64 = 0;
    let mut shift = 0;
    let mut rest = body;
    loop {
        let Some((&byte, tail)) = rest.split_first() else {
            return Err(format!("a truncated length: {bytes:?}"));
        };
        rest = tail;
        length |= u64::from(byte & 0x7f) << shift;
        shift += 7;
        if byte & 0x80 == 0 || shift > 63 {
            break;
        }
    }
    let length = usize::try_from(length >> 1).unwrap_or(usize::MAX);
    if rest.len() != length {
        return Err(format!("a length that is not the rest's: {bytes:?}"));
    }
    Ok(String::from_utf8_lossy(rest).into_owned())
}
