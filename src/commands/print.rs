//! One record, one line: `demo` prints what its consumer receives and `peek`
//! what the relay would produce in this format, so the two compare at a
//! glance (text), or as one JSON object a line (`--json`).

use serde::Serialize;

/// Where a record is, or would be.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(crate) enum Position {
    /// Produced: its partition and offset.
    Kafka { partition: i32, offset: i64 },
    /// Pending in the slot: the commit LSN of its transaction.
    Wal { lsn: String },
}

/// The parts of a record worth showing, bytes as (lossy) UTF-8.
#[derive(Debug, Serialize)]
pub(crate) struct RecordLine<'a> {
    pub topic: &'a str,
    #[serde(flatten)]
    pub position: Position,
    pub key: Option<String>,
    /// A JSON object, in order (a repeated name appears twice).
    #[serde(serialize_with = "as_map")]
    pub headers: Vec<(String, Option<String>)>,
    pub value: Option<String>,
    pub timestamp_ms: Option<i64>,
}

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

impl RecordLine<'_> {
    /// `orders.created p0@12 key=order-7 id=42 {"order_id": 7}`.
    pub(crate) fn to_text(&self) -> String {
        let position = match &self.position {
            Position::Kafka { partition, offset } => format!("p{partition}@{offset}"),
            Position::Wal { lsn } => format!("lsn={lsn}"),
        };
        let or_null = |text: &Option<String>| text.as_deref().unwrap_or("(null)").to_owned();
        let headers = self.headers.iter();
        let headers = headers.map(|(name, value)| format!(" {name}={}", or_null(value)));
        let (topic, key) = (self.topic, or_null(&self.key));
        let value = self.value.as_deref().unwrap_or("(tombstone)");
        format!(
            "{topic} {position} key={key}{} {value}",
            headers.collect::<String>()
        )
    }

    /// The record as one JSON object.
    pub(crate) fn to_json(&self) -> String {
        // Strings, integers and vectors of them always serialise.
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_shows_every_part() {
        let line = RecordLine {
            topic: "orders.created",
            position: Position::Kafka {
                partition: 0,
                offset: 12,
            },
            key: Some("order-7".into()),
            headers: vec![("id".into(), Some("42".into())), ("x".into(), None)],
            value: Some(r#"{"order_id": 7}"#.into()),
            timestamp_ms: None,
        };
        assert_eq!(
            line.to_text(),
            r#"orders.created p0@12 key=order-7 id=42 x=(null) {"order_id": 7}"#
        );
        let json: serde_json::Value = serde_json::from_str(&line.to_json()).unwrap();
        assert_eq!(json["offset"], 12);
        assert_eq!(json["headers"]["id"], "42");
        let pending = RecordLine {
            topic: "t",
            position: Position::Wal { lsn: "0/0".into() },
            key: None,
            headers: Vec::new(),
            value: None,
            timestamp_ms: None,
        };
        assert_eq!(pending.to_text(), "t lsn=0/0 key=(null) (tombstone)");
        let json: serde_json::Value = serde_json::from_str(&pending.to_json()).unwrap();
        assert_eq!(json["lsn"], "0/0");
        assert!(json.get("offset").is_none(), "{json}");
    }
}
