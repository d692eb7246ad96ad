//! PURE: a Postgres column as Debezium's Postgres connector reads it: the Connect schema of its
//! type (with the catalog's `NOT NULL`, its `DEFAULT` as Debezium parses it, and with
//! `column.propagate.source.type` or `datatype.propagate.source.type` the source type's
//! `__debezium.source.column.*` parameters), and each value, under `time.precision.mode`,
//! `decimal.handling.mode` and `binary.handling.mode`.
//!
//! Types are read from the Relation message's type OID and modifier. A type outside
//! [`PgType`] is refused when its table is bound; a value Debezium encodes in a way not
//! reproduced here (`infinity`, a date before the common era, a `NaN` decimal) is refused as
//! its event, never written differently.

use base64::Engine as _;
use tokio_postgres::types::Type;

use super::data::{
    CONNECT_DATE, CONNECT_TIME, CONNECT_TIMESTAMP, DECIMAL, Data, Decimal, Kind, Schema,
};
use super::temporal;
use crate::outbox::values;

/// `time.precision.mode`: how dates, times and timestamps without a zone are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum TimePrecision {
    /// Debezium's types at the column's precision: milliseconds up to 3 digits, else
    /// microseconds.
    #[default]
    Adaptive,
    /// As `adaptive`, but `time` always in microseconds.
    AdaptiveTimeMicroseconds,
    /// Kafka Connect's `Date`, `Time` and `Timestamp` (milliseconds).
    Connect,
    /// ISO 8601 strings.
    Isostring,
}

/// `decimal.handling.mode`: how `numeric` is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DecimalHandling {
    /// Kafka Connect's `Decimal` (or Debezium's `VariableScaleDecimal` without a scale).
    #[default]
    Precise,
    /// A `double`.
    Double,
    /// The plain decimal text.
    String,
}

/// `binary.handling.mode`: how `bytea` is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum BinaryHandling {
    /// Connect bytes.
    #[default]
    Bytes,
    /// A base64 string.
    Base64,
    /// A base64 string with the URL-safe alphabet.
    #[value(name = "base64-url-safe")]
    Base64UrlSafe,
    /// A lower-case hex string.
    Hex,
}

/// Debezium's column settings that shape values and schemas.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ColumnModes {
    /// `time.precision.mode`
    pub time: TimePrecision,
    /// `decimal.handling.mode`
    pub decimal: DecimalHandling,
    /// `binary.handling.mode`
    pub binary: BinaryHandling,
    /// `column.propagate.source.type` and `datatype.propagate.source.type`
    pub source_types: SourceTypes,
}

/// The columns whose schemas carry their source type, by Debezium's regular expressions.
#[derive(Clone, Debug, Default)]
pub struct SourceTypes {
    /// Matched against `schema.table.column`.
    columns: Vec<regex::Regex>,
    /// Matched against `schema.table.type` (the type's name, e.g. `varchar`).
    datatypes: Vec<regex::Regex>,
}

impl PartialEq for SourceTypes {
    fn eq(&self, other: &Self) -> bool {
        let patterns = |list: &[regex::Regex]| list.iter().map(|r| r.as_str().to_owned()).collect();
        let mine: Vec<String> = patterns(&self.columns);
        let theirs: Vec<String> = patterns(&other.columns);
        let datatypes: Vec<String> = patterns(&self.datatypes);
        mine == theirs && datatypes == patterns(&other.datatypes)
    }
}
impl Eq for SourceTypes {}

impl SourceTypes {
    /// Debezium's comma-separated lists of regular expressions, matched whole and without
    /// regard to case; `Err` names a pattern this relay's regular expressions do not read.
    pub fn parse(columns: Option<&str>, datatypes: Option<&str>) -> Result<SourceTypes, String> {
        Ok(SourceTypes {
            columns: regex_list(columns.unwrap_or_default())?,
            datatypes: regex_list(datatypes.unwrap_or_default())?,
        })
    }

    /// Whether no column's type is propagated.
    pub fn is_empty(&self) -> bool {
        self.columns.is_empty() && self.datatypes.is_empty()
    }

    fn matches(&self, table: &str, column: &str, type_name: &str) -> bool {
        let full = format!("{table}.{column}");
        let typed = format!("{table}.{type_name}");
        self.columns.iter().any(|r| r.is_match(&full))
            || self.datatypes.iter().any(|r| r.is_match(&typed))
    }
}

/// Debezium's `Strings.setOfRegex`: a comma separates patterns except after a backslash.
fn regex_list(list: &str) -> Result<Vec<regex::Regex>, String> {
    let mut patterns = vec![String::new()];
    let mut chars = list.chars();
    while let Some(c) = chars.next() {
        match (c, patterns.last_mut()) {
            ('\\', Some(current)) => match chars.next() {
                Some(',') => current.push(','),
                Some(next) => {
                    current.push('\\');
                    current.push(next);
                }
                None => current.push('\\'),
            },
            (',', _) => patterns.push(String::new()),
            (c, Some(current)) => current.push(c),
            (_, None) => {}
        }
    }
    let patterns = patterns.iter().map(|p| p.trim()).filter(|p| !p.is_empty());
    patterns
        .map(|pattern| {
            regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
                .case_insensitive(true)
                .build()
                .map_err(|e| format!("the regular expression {pattern:?} does not compile: {e}"))
        })
        .collect()
}

/// The Postgres types whose Debezium encoding is reproduced, with their modifiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PgType {
    /// `text`, `varchar(n)`, `char(n)`, `name`: Debezium's upper-case type name and length.
    Text(&'static str, Option<i32>),
    /// `uuid`
    Uuid,
    /// `json` or `jsonb` (the name).
    Json(&'static str),
    /// `smallint`
    Int2,
    /// `integer`
    Int4,
    /// `bigint`
    Int8,
    /// `boolean`
    Bool,
    /// `bytea`
    Bytea,
    /// `numeric(precision, scale)`, or `numeric` without them.
    Numeric(Option<(i32, i32)>),
    /// `real`
    Float4,
    /// `double precision`
    Float8,
    /// `date`
    Date,
    /// `time(p)`
    Time(i32),
    /// `timestamp(p)`
    Timestamp(i32),
    /// `timestamptz(p)`
    Timestamptz(i32),
}

/// Fractional second digits when a time type has no modifier.
const DEFAULT_TIME_PRECISION: i32 = 6;
/// Debezium's length for an unknown or unlimited length (pgjdbc's `Integer.MAX_VALUE`).
const UNLIMITED: i32 = i32::MAX;
/// Debezium's length for a `numeric` without precision.
const VARIABLE_SCALE_DECIMAL_LENGTH: i32 = 131_089;
/// An optional schema of Debezium's (or Connect's) logical type `name`, version 1.
fn named(kind: Kind, name: &str) -> Schema {
    Schema {
        name: Some(name.to_owned()),
        version: Some(1),
        ..Schema::optional(kind)
    }
}

/// Kafka Connect's `VariableScaleDecimal` doc.
const VARIABLE_SCALE_DOC: &str = "Variable scaled decimal";

impl PgType {
    /// The type of a column with OID `oid` and modifier `typmod`, when it is reproduced.
    pub fn of(oid: u32, typmod: i32) -> Option<PgType> {
        let length = (typmod >= 4).then(|| typmod - 4);
        let precision = if typmod >= 0 {
            typmod
        } else {
            DEFAULT_TIME_PRECISION
        };
        Some(match Type::from_oid(oid)? {
            Type::TEXT => PgType::Text("TEXT", None),
            Type::VARCHAR => PgType::Text("VARCHAR", length),
            // `char` without a length is `char(1)`.
            Type::BPCHAR => PgType::Text("BPCHAR", length.or(Some(1))),
            Type::NAME => PgType::Text("NAME", None),
            Type::UUID => PgType::Uuid,
            Type::JSON => PgType::Json("JSON"),
            Type::JSONB => PgType::Json("JSONB"),
            Type::INT2 => PgType::Int2,
            Type::INT4 => PgType::Int4,
            Type::INT8 => PgType::Int8,
            Type::BOOL => PgType::Bool,
            Type::BYTEA => PgType::Bytea,
            Type::NUMERIC => PgType::Numeric(length.map(|l| {
                // Postgres 15 stores a negative scale as 11 signed bits; pgjdbc, and so
                // Debezium, reads the low 16 bits unsigned: numeric(5,-2) has scale 2046
                // (measured: the avro-negative-scale fixture).
                ((l >> 16) & 0xffff, l & 0xffff)
            })),
            Type::FLOAT4 => PgType::Float4,
            Type::FLOAT8 => PgType::Float8,
            Type::DATE => PgType::Date,
            Type::TIME => PgType::Time(precision),
            Type::TIMESTAMP => PgType::Timestamp(precision),
            Type::TIMESTAMPTZ => PgType::Timestamptz(precision),
            _ => return None,
        })
    }

    /// Debezium's name of the type (`typname`, upper-case), its length and its scale, as the
    /// `__debezium.source.column.*` parameters give them (pgjdbc's precision and scale).
    fn source(self) -> Option<(&'static str, i32, i32)> {
        // pgjdbc's display size of the seconds and their fraction.
        let seconds = |p: i32| match p {
            0 => 0,
            1 => 3,
            p => p + 1,
        };
        Some(match self {
            // pgjdbc's length of `name` is not checked against Debezium here.
            PgType::Text("NAME", _) => return None,
            PgType::Text(name, length) => (name, length.unwrap_or(UNLIMITED), 0),
            PgType::Uuid => ("UUID", UNLIMITED, 0),
            PgType::Json(name) => (name, UNLIMITED, 0),
            PgType::Bytea => ("BYTEA", UNLIMITED, 0),
            PgType::Int2 => ("INT2", 5, 0),
            PgType::Int4 => ("INT4", 10, 0),
            PgType::Int8 => ("INT8", 19, 0),
            PgType::Bool => ("BOOL", 1, 0),
            PgType::Numeric(Some((precision, scale))) => ("NUMERIC", precision, scale),
            PgType::Numeric(None) => ("NUMERIC", VARIABLE_SCALE_DECIMAL_LENGTH, 0),
            PgType::Float4 => ("FLOAT4", 8, 8),
            PgType::Float8 => ("FLOAT8", 17, 17),
            PgType::Date => ("DATE", 13, 0),
            PgType::Time(p) => ("TIME", 8 + seconds(p), p),
            PgType::Timestamp(p) => ("TIMESTAMP", 22 + seconds(p), p),
            PgType::Timestamptz(p) => ("TIMESTAMPTZ", 28 + seconds(p), p),
        })
    }

    /// The lower-case type name `datatype.propagate.source.type` matches.
    fn type_name(self) -> String {
        self.source()
            .map_or("name", |(name, _, _)| name)
            .to_ascii_lowercase()
    }
}

/// A column's type, read under Debezium's modes into Connect schemas and values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    /// The column's type.
    pub pg: PgType,
    /// The modes in force.
    modes: ColumnModes,
    /// The Connect schema of its values.
    pub schema: Schema,
}

/// Where a column sits and what the catalog says of it.
#[derive(Clone, Copy, Debug)]
pub struct ColumnSite<'a> {
    /// `schema.table`
    pub table: &'a str,
    /// The column's name.
    pub name: &'a str,
    /// `attnotnull`
    pub not_null: bool,
    /// `pg_get_expr(adbin, adrelid)`, when the column has a default.
    pub default: Option<&'a str>,
}

impl Column {
    /// The column of type `pg` at `site` under `modes`; `Err` says why it is not reproduced.
    pub fn new(pg: PgType, site: ColumnSite<'_>, modes: &ColumnModes) -> Result<Column, String> {
        let mut column = Column {
            pg,
            modes: modes.clone(),
            schema: Schema::optional(Kind::String),
        };
        column.schema = column.base_schema();
        column.schema.optional = !site.not_null;
        if modes
            .source_types
            .matches(site.table, site.name, &pg.type_name())
        {
            let Some((type_name, length, scale)) = pg.source() else {
                let why = "its source type parameters (column.propagate.source.type) are not reproduced for type name";
                return Err(why.to_owned());
            };
            let parameters = [
                ("__debezium.source.column.type", type_name.to_owned()),
                ("__debezium.source.column.length", length.to_string()),
                ("__debezium.source.column.scale", scale.to_string()),
                ("__debezium.source.column.name", site.name.to_owned()),
            ];
            let parameters = parameters.into_iter().map(|(k, v)| (k.to_owned(), v));
            column.schema.parameters.extend(parameters);
        }
        column.schema.default = site.default.and_then(|expr| column.default(expr));
        Ok(column)
    }

    /// The schema of the type under the modes, without optionality, parameters or default.
    fn base_schema(&self) -> Schema {
        let time = self.modes.time;
        match self.pg {
            PgType::Text(..) => Schema::optional(Kind::String),
            PgType::Uuid => named(Kind::String, "io.debezium.data.Uuid"),
            PgType::Json(_) => named(Kind::String, "io.debezium.data.Json"),
            PgType::Int2 => Schema::optional(Kind::Int16),
            PgType::Int4 => Schema::optional(Kind::Int32),
            PgType::Int8 => Schema::optional(Kind::Int64),
            PgType::Bool => Schema::optional(Kind::Boolean),
            PgType::Bytea if self.modes.binary == BinaryHandling::Bytes => {
                Schema::optional(Kind::Bytes)
            }
            PgType::Bytea => Schema::optional(Kind::String),
            PgType::Numeric(typmod) => self.numeric_schema(typmod),
            PgType::Float4 => Schema::optional(Kind::Float32),
            PgType::Float8 => Schema::optional(Kind::Float64),
            PgType::Date => match time {
                TimePrecision::Connect => named(Kind::Int32, CONNECT_DATE),
                TimePrecision::Isostring => named(Kind::String, "io.debezium.time.IsoDate"),
                _ => named(Kind::Int32, "io.debezium.time.Date"),
            },
            PgType::Time(p) => match time {
                TimePrecision::Connect => named(Kind::Int32, CONNECT_TIME),
                TimePrecision::Isostring => named(Kind::String, "io.debezium.time.IsoTime"),
                TimePrecision::Adaptive if p <= 3 => named(Kind::Int32, "io.debezium.time.Time"),
                _ => named(Kind::Int64, "io.debezium.time.MicroTime"),
            },
            PgType::Timestamp(p) => match time {
                TimePrecision::Connect => named(Kind::Int64, CONNECT_TIMESTAMP),
                TimePrecision::Isostring => named(Kind::String, "io.debezium.time.IsoTimestamp"),
                _ if p <= 3 => named(Kind::Int64, "io.debezium.time.Timestamp"),
                _ => named(Kind::Int64, "io.debezium.time.MicroTimestamp"),
            },
            PgType::Timestamptz(_) => named(Kind::String, "io.debezium.time.ZonedTimestamp"),
        }
    }

    /// A `numeric`'s schema under `decimal.handling.mode`: with a declared scale Connect's
    /// `Decimal` (scale and precision as parameters), without one `VariableScaleDecimal`.
    fn numeric_schema(&self, typmod: Option<(i32, i32)>) -> Schema {
        match (self.modes.decimal, typmod) {
            (DecimalHandling::Double, _) => Schema::optional(Kind::Float64),
            (DecimalHandling::String, _) => Schema::optional(Kind::String),
            (DecimalHandling::Precise, Some((precision, scale))) => {
                let mut schema = named(Kind::Bytes, DECIMAL);
                schema.parameters = vec![
                    ("scale".to_owned(), scale.to_string()),
                    (
                        "connect.decimal.precision".to_owned(),
                        precision.to_string(),
                    ),
                ];
                schema
            }
            (DecimalHandling::Precise, None) => {
                let fields = vec![
                    ("scale".to_owned(), Schema::required(Kind::Int32)),
                    ("value".to_owned(), Schema::required(Kind::Bytes)),
                ];
                let mut schema = named(
                    Kind::Struct(fields),
                    "io.debezium.data.VariableScaleDecimal",
                );
                schema.doc = Some(VARIABLE_SCALE_DOC.to_owned());
                schema
            }
        }
    }

    /// The value of the column's text (Postgres' output format), or why it is not reproduced.
    pub fn read(&self, text: &[u8]) -> Result<Data, String> {
        if self.pg == PgType::Bytea {
            let bytes =
                values::decode_bytea_hex(text).ok_or("bytea text is not in hex format (\\x...)")?;
            return Ok(self.bytes(&bytes));
        }
        let text = std::str::from_utf8(text).map_err(|_| "not UTF-8".to_owned())?;
        self.read_text(text)
    }

    /// `bytea` under `binary.handling.mode`.
    fn bytes(&self, bytes: &[u8]) -> Data {
        let engine = base64::engine::general_purpose::STANDARD;
        let url_safe = base64::engine::general_purpose::URL_SAFE;
        match self.modes.binary {
            BinaryHandling::Bytes => Data::Bytes(bytes.to_vec()),
            BinaryHandling::Base64 => Data::Str(engine.encode(bytes)),
            BinaryHandling::Base64UrlSafe => Data::Str(url_safe.encode(bytes)),
            BinaryHandling::Hex => Data::Str(hex::encode(bytes)),
        }
    }

    fn read_text(&self, text: &str) -> Result<Data, String> {
        Ok(match self.pg {
            PgType::Text(..) | PgType::Uuid | PgType::Json(_) => Data::Str(text.to_owned()),
            PgType::Int2 | PgType::Int4 | PgType::Int8 => {
                Data::Int(text.parse().map_err(|_| "not an integer".to_owned())?)
            }
            // Java's `Boolean.parseBoolean` for a default; Postgres prints `t` or `f`.
            PgType::Bool => Data::Bool(text == "t" || text.eq_ignore_ascii_case("true")),
            PgType::Bytea => self.bytes(text.as_bytes()),
            PgType::Numeric(typmod) => self.numeric(text, typmod)?,
            PgType::Float4 | PgType::Float8 => Data::Float(java_float_text(text)?),
            PgType::Date | PgType::Time(_) | PgType::Timestamp(_) | PgType::Timestamptz(_) => {
                self.temporal(text)?
            }
        })
    }

    /// A `date`, `time`, `timestamp` or `timestamptz` under `time.precision.mode`.
    fn temporal(&self, text: &str) -> Result<Data, String> {
        let unreadable = |what: &str| {
            format!(
                "not {what} in Postgres' ISO output, or a value Debezium encodes in a way the relay does not reproduce (infinity, a date before the common era)"
            )
        };
        let micros_to_millis = |micros: i64| micros.div_euclid(1000);
        let time = self.modes.time;
        Ok(match self.pg {
            PgType::Date => {
                let days = temporal::parse_date(text).ok_or_else(|| unreadable("a date"))?;
                match time {
                    TimePrecision::Isostring => {
                        let iso = temporal::iso_date(days).ok_or_else(|| unreadable("a date"))?;
                        Data::Str(format!("{iso}Z"))
                    }
                    _ => Data::Int(days),
                }
            }
            PgType::Time(p) => {
                let micros = temporal::parse_time(text).ok_or_else(|| unreadable("a time"))?;
                match time {
                    TimePrecision::Isostring => {
                        Data::Str(format!("{}Z", temporal::iso_time(micros, None)))
                    }
                    TimePrecision::Connect => Data::Int(micros_to_millis(micros)),
                    TimePrecision::Adaptive if p <= 3 => Data::Int(micros_to_millis(micros)),
                    _ => Data::Int(micros),
                }
            }
            PgType::Timestamp(p) => {
                let micros =
                    temporal::parse_timestamp(text).ok_or_else(|| unreadable("a timestamp"))?;
                match time {
                    TimePrecision::Isostring => {
                        let iso = temporal::iso_timestamp(micros, None);
                        Data::Str(format!(
                            "{}Z",
                            iso.ok_or_else(|| unreadable("a timestamp"))?
                        ))
                    }
                    TimePrecision::Connect => Data::Int(micros_to_millis(micros)),
                    _ if p <= 3 => Data::Int(micros_to_millis(micros)),
                    _ => Data::Int(micros),
                }
            }
            PgType::Timestamptz(p) => {
                let micros = temporal::parse_timestamptz(text)
                    .ok_or_else(|| unreadable("a timestamp with time zone"))?;
                let width = usize::try_from(p).ok().filter(|w| (1..=9).contains(w));
                let iso = temporal::iso_timestamp(micros, width);
                Data::Str(format!(
                    "{}Z",
                    iso.ok_or_else(|| unreadable("a timestamp"))?
                ))
            }
            _ => return Err(format!("{:?} is not a temporal type", self.pg)),
        })
    }

    /// `numeric` under `decimal.handling.mode`, at the column's scale.
    fn numeric(&self, text: &str, typmod: Option<(i32, i32)>) -> Result<Data, String> {
        let decimal = Decimal::parse(text).ok_or_else(|| {
            "a numeric that is not a finite decimal (NaN or infinity), which Debezium encodes in a way the relay does not reproduce".to_owned()
        })?;
        let decimal = match typmod {
            Some((_, scale)) => decimal.widened(scale),
            None => decimal,
        };
        Ok(match (self.modes.decimal, typmod) {
            (DecimalHandling::Double, _) => Data::Float(decimal.to_f64()),
            (DecimalHandling::String, _) => Data::Str(decimal.to_plain_string()),
            (DecimalHandling::Precise, Some(_)) => Data::Decimal(decimal),
            (DecimalHandling::Precise, None) => Data::Struct(vec![
                Data::Int(i64::from(decimal.scale)),
                Data::Bytes(decimal.unscaled_bytes()),
            ]),
        })
    }

    /// Debezium's reading of a column default (`PostgresDefaultValueConverter`): a literal's
    /// text, a bare constant, or for a computed default (`now()`, `CURRENT_TIMESTAMP`,
    /// `gen_random_uuid()`) a placeholder per type; then read as a value of the column. `None`
    /// where Debezium gives no default (`NULL::...`, bytea, a struct, text it cannot read).
    fn default(&self, expr: &str) -> Option<Data> {
        let raw = debezium_default_text(self.pg, expr)?;
        let data = self.read_text(&raw).ok()?;
        // Connect allows no struct default (KAFKA-12694), so Debezium drops it.
        (!matches!(data, Data::Struct(_))).then_some(data)
    }
}

/// Java's `Float.parseFloat`/`Double.parseDouble` of Postgres' float text.
fn java_float_text(text: &str) -> Result<f64, String> {
    match text {
        "NaN" => Ok(f64::NAN),
        "Infinity" => Ok(f64::INFINITY),
        "-Infinity" => Ok(f64::NEG_INFINITY),
        text => text.parse().map_err(|_| "not a number".to_owned()),
    }
}

/// The text Debezium reads a default expression as, before the column's converter.
fn debezium_default_text(pg: PgType, expr: &str) -> Option<String> {
    let trimmed = !matches!(pg, PgType::Text(..) | PgType::Json(_) | PgType::Bytea);
    let expr = if trimmed { expr.trim() } else { expr };
    let placeholder = match pg {
        PgType::Bytea => return None,
        PgType::Text(..) => "",
        PgType::Json(_) => "{}",
        PgType::Uuid => "00000000-0000-0000-0000-000000000000",
        PgType::Bool => "false",
        PgType::Numeric(_) | PgType::Float4 | PgType::Float8 => "0.0",
        PgType::Int2 | PgType::Int4 | PgType::Int8 => "0",
        PgType::Date | PgType::Timestamp(_) | PgType::Timestamptz(_) => "1970-01-01",
        PgType::Time(_) => "00:00",
    };
    const CURRENT: [&str; 5] = [
        "current_timestamp",
        "current_time",
        "current_date",
        "localtime",
        "localtimestamp",
    ];
    if is_function_call(expr) || CURRENT.contains(&expr.to_ascii_lowercase().as_str()) {
        return Some(placeholder.to_owned());
    }
    if !expr.contains('\'') {
        return (!expr.starts_with("NULL::")).then(|| expr.to_owned());
    }
    // The first quoted literal, `''` read as a quote.
    let (_, rest) = expr.split_once('\'')?;
    let mut literal = String::new();
    let mut chars = rest.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('\'', Some('\'')) => {
                literal.push('\'');
                chars.next();
            }
            ('\'', _) => return Some(literal),
            (c, _) => literal.push(c),
        }
    }
    None
}

/// Debezium's `^[(]?[A-Za-z0-9_.]+\((?:.+(?:, ?.+)*)?\)` found at the start: a call.
fn is_function_call(expr: &str) -> bool {
    let name = expr.strip_prefix('(').unwrap_or(expr);
    let end = name
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        .unwrap_or(name.len());
    end > 0 && name[end..].starts_with('(') && name[end + 1..].contains(')')
}

#[cfg(test)]
mod tests;
