//! PURE: Kafka Connect's converters that write without a registry (StringConverter,
//! ByteArrayConverter, JsonConverter, BinaryDataConverter's pass-through) and the header
//! converters, from a Connect datum to bytes; and what of Java's own text is not reproduced.

use bytes::Bytes;

use super::data::{self, Data, JsonSettings, Schema};
use super::record::Datum;
use super::{Converter, DecimalFormat, HeaderConverter};
use crate::outbox::EventError;

/// Why StringConverter's (or, with `structs`, SimpleHeaderConverter's) text of values of
/// `schema` is not reproduced: Java's `toString()` of a struct, or Connect's temporal types,
/// which Java formats in the worker JVM's time zone.
pub(super) fn text_refusal(schema: &Schema, structs: bool) -> Option<String> {
    let composite = matches!(schema.kind, data::Kind::Struct(_) | data::Kind::Array(_));
    if composite && !structs {
        let name = schema.name.as_deref().unwrap_or("a struct");
        return Some(format!(
            "its value is {name}, which StringConverter writes as Java's Struct.toString(); use decimal.handling.mode double or string, or JsonConverter"
        ));
    }
    let temporal = [
        data::CONNECT_DATE,
        data::CONNECT_TIME,
        data::CONNECT_TIMESTAMP,
    ];
    let name = schema.name.as_deref().filter(|n| temporal.contains(n))?;
    Some(format!(
        "its value is Kafka Connect's {name}, whose text Kafka formats in the worker JVM's time zone (time.precision.mode=connect); use another time.precision.mode or JsonConverter"
    ))
}

/// Where JsonConverter throws (a value that does not fit its schema, a null for a required
/// field), Debezium stops on the event.
fn json_stops(refused: data::Refused) -> EventError {
    EventError::DebeziumStops { reason: refused.0 }
}

/// What the relay does not write, rather than write differently.
fn not_reproduced(refused: data::Refused) -> EventError {
    EventError::NotReproduced { reason: refused.0 }
}

/// Bytes of `datum` as a Connect `converter` (not a registry's) writes them; `None` is a null
/// key or a tombstone.
pub(super) fn convert(
    converter: Converter,
    datum: &Datum,
    decimals: DecimalFormat,
) -> Result<Option<Bytes>, EventError> {
    let schema = datum.schema.as_deref();
    match converter {
        Converter::Json | Converter::JsonWithSchemas => {
            let settings = JsonSettings {
                schemas: converter == Converter::JsonWithSchemas,
                numeric_decimals: decimals == DecimalFormat::Numeric,
            };
            let json = data::to_json_with(schema, &datum.data, settings).map_err(json_stops)?;
            Ok(json.map(Bytes::from))
        }
        Converter::Bytearray => match &datum.data {
            Data::Null => Ok(None),
            Data::Bytes(bytes) => Ok(Some(Bytes::copy_from_slice(bytes))),
            _ => Err(EventError::DebeziumStops {
                reason: "ByteArrayConverter takes only bytes".into(),
            }),
        },
        Converter::BinaryData => match &datum.data {
            Data::Null => Ok(None),
            Data::Bytes(bytes) => Ok(Some(Bytes::copy_from_slice(bytes))),
            _ => Err(EventError::DebeziumStops {
                reason: "BinaryDataConverter passes only bytes through".into(),
            }),
        },
        Converter::Avro | Converter::Protobuf => Err(EventError::NotReproduced {
            reason: "a Schema Registry converter writes through the registry".into(),
        }),
        Converter::String | Converter::Relay => string_converter(schema, &datum.data),
    }
}

/// `StringConverter`: the Java object's `toString()`.
fn string_converter(schema: Option<&Schema>, data: &Data) -> Result<Option<Bytes>, EventError> {
    let text = match data {
        Data::Null => return Ok(None),
        // Debezium holds bytea as a ByteBuffer, whose toString() describes it.
        Data::Bytes(b) => format!("java.nio.HeapByteBuffer[pos=0 lim={0} cap={0}]", b.len()),
        Data::Struct(_) | Data::Array(_) => {
            let reason = "StringConverter prints a struct or an array as Java's toString()";
            return Err(EventError::NotReproduced {
                reason: reason.into(),
            });
        }
        Data::Str(s) => s.clone(),
        _ => data::to_text(schema, data)
            .map_err(not_reproduced)?
            .unwrap_or_default(),
    };
    Ok(Some(Bytes::from(text)))
}

/// A header's bytes as the header converter writes them; `None` for a null value.
pub(super) fn header_bytes(
    converter: HeaderConverter,
    datum: &Datum,
    decimals: DecimalFormat,
) -> Result<Option<Bytes>, EventError> {
    let schema = datum.schema.as_deref();
    let settings = JsonSettings {
        schemas: converter == HeaderConverter::JsonWithSchemas,
        numeric_decimals: decimals == DecimalFormat::Numeric,
    };
    let text = match converter {
        HeaderConverter::Simple => data::to_text(schema, &datum.data).map_err(not_reproduced)?,
        HeaderConverter::Json | HeaderConverter::JsonWithSchemas => {
            data::to_json_with(schema, &datum.data, settings).map_err(json_stops)?
        }
    };
    Ok(text.map(Bytes::from))
}
