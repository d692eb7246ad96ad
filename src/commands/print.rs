//! One record, one line: the format `demo` prints what its consumer receives
//! in and `peek` prints what the relay would produce in, so the two compare
//! at a glance (text), or as one JSON object a line (`--json`).

use serde::Serialize;

/// Where a record is, or would be.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Position {
    /// Produced: its partition and offset.
    Kafka { partition: i32, offset: i64 },
    /// Pending in the slot: the commit LSN of its transaction.
    Wal(crate::lsn::Lsn),
}

/// The parts of a record worth showing; bytes are shown as (lossy) UTF-8.
#[derive(Debug, Serialize)]
pub(crate) struct RecordLine<'a> {
    pub topic: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lsn: Option<String>,
    pub key: Option<String>,
    #[serde(serialize_with = "as_map")]
    pub headers: Vec<(String, Option<String>)>,
    pub value: Option<String>,
    pub timestamp_ms: Option<i64>,
}

/// Headers as a JSON object, in order (a repeated name appears twice).
fn as_map<S: serde::Serializer>(
    headers: &[(String, Option<String>)],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_map(headers.iter().map(|(k, v)| (k, v)))
}

/// Bytes as text for a terminal.
pub(crate) fn text(bytes: Option<&[u8]>) -> Option<String> {
    bytes.map(|b| String::from_utf8_lossy(b).into_owned())
}

impl<'a> RecordLine<'a> {
    /// A record at `position`.
    pub(crate) fn new(topic: &'a str, position: Position) -> Self {
        let (partition, offset, lsn) = match position {
            Position::Kafka { partition, offset } => (Some(partition), Some(offset), None),
            Position::Wal(lsn) => (None, None, Some(lsn.to_string())),
        };
        RecordLine {
            topic,
            partition,
            offset,
            lsn,
            key: None,
            headers: Vec::new(),
            value: None,
            timestamp_ms: None,
        }
    }

    /// The record as one line of text:
    /// `orders.created p0@12 key=order-7 id=42 {"order_id": 7}`.
    pub(crate) fn to_text(&self) -> String {
        use std::fmt::Write;
        let mut line = String::from(self.topic);
        match (self.partition, self.offset, &self.lsn) {
            (Some(p), Some(o), _) => {
                let _ = write!(line, " p{p}@{o}");
            }
            (_, _, Some(lsn)) => {
                let _ = write!(line, " lsn={lsn}");
            }
            _ => {}
        }
        let _ = write!(line, " key={}", self.key.as_deref().unwrap_or("(null)"));
        for (name, value) in &self.headers {
            let _ = write!(line, " {name}={}", value.as_deref().unwrap_or("(null)"));
        }
        let _ = write!(line, " {}", self.value.as_deref().unwrap_or("(tombstone)"));
        line
    }

    /// The record as one JSON object.
    pub(crate) fn to_json(&self) -> String {
        // Serialising strings, integers and vectors of them cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_shows_every_part() {
        let mut line = RecordLine::new(
            "orders.created",
            Position::Kafka {
                partition: 0,
                offset: 12,
            },
        );
        line.key = Some("order-7".into());
        line.headers = vec![("id".into(), Some("42".into())), ("x".into(), None)];
        line.value = Some(r#"{"order_id": 7}"#.into());
        assert_eq!(
            line.to_text(),
            r#"orders.created p0@12 key=order-7 id=42 x=(null) {"order_id": 7}"#
        );
        let json: serde_json::Value = serde_json::from_str(&line.to_json()).unwrap();
        assert_eq!(json["offset"], 12);
        assert_eq!(json["headers"]["id"], "42");
        let pending = RecordLine::new("t", Position::Wal(crate::lsn::Lsn::ZERO));
        assert_eq!(pending.to_text(), "t lsn=0/0 key=(null) (tombstone)");
    }
}
