//! Events that can never be delivered, and what they become: an error that
//! stops the relay (`--on-poison fail`) or a dead-letter record.
//!
//! Three places find them: mapping a row (NULL id, empty routing value,
//! invalid topic name, a value invalid for its type), librdkafka refusing the
//! record at enqueue (over `message.max.bytes`), and the broker rejecting it
//! for good (a delivery report with a record-level error).

use std::sync::Arc;

use bytes::Bytes;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::RelayError;
use crate::lsn::Lsn;
use crate::outbox::{DeadLetterInfo, EventError, OutboxRecord, RawParts, dead_letter_record};

/// One undeliverable event with everything needed to report or divert it.
pub(super) struct Poison {
    parts: RawParts,
    extra_headers: Vec<(Arc<str>, Option<Bytes>)>,
    pub(super) info: DeadLetterInfo,
    timestamp_ms: i64,
}

impl Poison {
    /// A row that could not be mapped to a record.
    pub(super) fn unmappable(
        parts: RawParts,
        error: EventError,
        lsn: Lsn,
        table: String,
        timestamp_ms: i64,
    ) -> Self {
        let intended_topic = match &error {
            EventError::InvalidTopic { topic, .. } => Some(topic.clone()),
            _ => parts.intended_topic.clone(),
        };
        Poison {
            info: DeadLetterInfo {
                error: error.to_string(),
                lsn,
                table,
                intended_topic,
                payload_omitted: None,
            },
            parts,
            extra_headers: Vec::new(),
            timestamp_ms,
        }
    }

    /// A record that librdkafka refused to enqueue or the broker rejected for good.
    pub(super) fn refused(
        record: OutboxRecord,
        error: &KafkaError,
        lsn: Lsn,
        table: String,
    ) -> Self {
        let too_large = matches!(
            error.rdkafka_error_code(),
            Some(
                RDKafkaErrorCode::MessageSizeTooLarge
                    | RDKafkaErrorCode::InvalidMessageSize
                    | RDKafkaErrorCode::MessageBatchTooLarge
            )
        );
        let size = record.payload.as_ref().map_or(0, Bytes::len);
        Poison {
            info: DeadLetterInfo {
                error: error.to_string(),
                lsn,
                table,
                intended_topic: Some(record.topic.clone()),
                payload_omitted: too_large.then(|| {
                    format!(
                        "payload of {size} bytes is the reason: larger than the producer's or \
                         broker's message.max.bytes"
                    )
                }),
            },
            timestamp_ms: record.timestamp_ms,
            parts: RawParts {
                id: record.id,
                key: record.key,
                payload: record.payload,
                intended_topic: Some(record.topic),
            },
            extra_headers: record.headers,
        }
    }

    /// The event id, for logs.
    pub(super) fn id_text(&self) -> String {
        String::from_utf8_lossy(&self.parts.id).into_owned()
    }

    /// The stop-the-relay error (`--on-poison fail`).
    pub(super) fn into_error(self) -> RelayError {
        RelayError::Poison {
            id: self.id_text(),
            lsn: self.info.lsn,
            table: self.info.table,
            topic: self.info.intended_topic.unwrap_or_default(),
            reason: self.info.error,
        }
    }

    /// The dead-letter record (`--on-poison dead-letter`).
    pub(super) fn into_dead_letter(self, topic: &str) -> OutboxRecord {
        dead_letter_record(
            topic,
            self.parts,
            self.extra_headers,
            &self.info,
            self.timestamp_ms,
        )
    }
}
