//! Names the user writes on the command line: tables, topic templates, header columns.

use std::fmt;

/// A schema-qualified table name, as Postgres stores it (case preserved).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TableName {
    /// Schema (namespace).
    pub schema: String,
    /// Table.
    pub name: String,
}

impl TableName {
    /// Parses `schema.table` or `table` (schema `public`), case kept, quotes around a part removed.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let unquote = |s: &str| s.trim().trim_matches('"').to_owned();
        let (schema, name) = match raw.trim().split_once('.') {
            None => ("public".to_owned(), unquote(raw)),
            Some((schema, name)) => (unquote(schema), unquote(name)),
        };
        if schema.is_empty() || name.is_empty() || name.contains('.') {
            return Err("expected SCHEMA.TABLE or TABLE".to_owned());
        }
        Ok(TableName { schema, name })
    }

    /// The name quoted for SQL: `"schema"."table"`.
    pub fn quoted(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.name))
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}

/// Quotes an identifier for SQL, doubling embedded quotes.
pub fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// One piece of a topic template; the mapping resolves a column name `C` to where it reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment<C = String> {
    /// Text copied as is.
    Literal(String),
    /// `${routedByValue}` (named as in Debezium's `route.topic.replacement`): the route-by value.
    RoutedByValue,
    /// `${column}`: the value of a named column.
    Column(C),
}

/// A parsed `--topic-template`, e.g. `outbox.event.${routedByValue}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicTemplate {
    segments: Vec<Segment>,
}

impl TopicTemplate {
    /// Parses `${name}` placeholders; `$$` is a literal `$`.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let mut segments = Vec::new();
        let mut literal = String::new();
        let mut rest = raw;
        while let Some(pos) = rest.find('$') {
            literal.push_str(&rest[..pos]);
            rest = &rest[pos + 1..];
            if let Some(tail) = rest.strip_prefix('$') {
                literal.push('$');
                rest = tail;
                continue;
            }
            let Some((name, tail)) = rest.strip_prefix('{').and_then(|r| r.split_once('}')) else {
                return Err(
                    "`$` must start a `${column}` placeholder closed by `}` (write `$$` for a \
                     literal `$`)"
                        .to_owned(),
                );
            };
            if !literal.is_empty() {
                segments.push(Segment::Literal(std::mem::take(&mut literal)));
            }
            segments.push(match name {
                "" => return Err("empty placeholder `${}`".to_owned()),
                "routedByValue" => Segment::RoutedByValue,
                column => Segment::Column(column.to_owned()),
            });
            rest = tail;
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            segments.push(Segment::Literal(literal));
        }
        if segments.is_empty() {
            return Err("the topic template is empty".to_owned());
        }
        Ok(TopicTemplate { segments })
    }

    /// The template's pieces, in order.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }
}

/// `--header-column COLUMN[:HEADER]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderColumn {
    /// Outbox column to read.
    pub column: String,
    /// Header name to write.
    pub header: String,
}

impl HeaderColumn {
    /// Parses `COLUMN` or `COLUMN:HEADER`.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let (column, header) = raw.split_once(':').unwrap_or((raw, raw));
        let (column, header) = (column.trim(), header.trim());
        if column.is_empty() || header.is_empty() {
            return Err("expected COLUMN or COLUMN:HEADER".to_owned());
        }
        Ok(HeaderColumn {
            column: column.to_owned(),
            header: header.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_debezium_style_templates() {
        let t = TopicTemplate::parse("outbox.event.${routedByValue}").unwrap();
        assert_eq!(
            t.segments(),
            &[
                Segment::Literal("outbox.event.".into()),
                Segment::RoutedByValue
            ]
        );
        let t = TopicTemplate::parse("${aggregate_type}-$${x}-${routedByValue}.v1").unwrap();
        assert_eq!(
            t.segments(),
            &[
                Segment::Column("aggregate_type".into()),
                Segment::Literal("-${x}-".into()),
                Segment::RoutedByValue,
                Segment::Literal(".v1".into()),
            ]
        );
    }

    #[test]
    fn rejects_broken_templates() {
        for bad in ["", "a.${", "a.${}", "a$b"] {
            assert!(TopicTemplate::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn parses_table_names() {
        assert_eq!(
            TableName::parse("outbox").unwrap(),
            TableName {
                schema: "public".into(),
                name: "outbox".into()
            }
        );
        let t = TableName::parse("\"Billing\".\"Outbox\"").unwrap();
        assert_eq!(t.schema, "Billing");
        assert_eq!(t.quoted(), "\"Billing\".\"Outbox\"");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert!(TableName::parse("a.b.c").is_err());
        assert!(TableName::parse(".x").is_err());
    }

    #[test]
    fn parses_header_columns() {
        assert_eq!(
            HeaderColumn::parse("aggregate_type:type").unwrap(),
            HeaderColumn {
                column: "aggregate_type".into(),
                header: "type".into()
            }
        );
        assert_eq!(HeaderColumn::parse("x").unwrap().header, "x");
        assert!(HeaderColumn::parse(":h").is_err());
    }
}
