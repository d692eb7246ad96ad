//! The outbox tables as cleanup knows them: each with its primary key, bound to the relations
//! the stream announces (a partition's rows are deleted through its root), and the key of the
//! row an insert wrote.

use std::collections::HashMap;
use std::sync::Arc;

use crate::outbox::{BindError, TableName, column_index};
use crate::pgoutput::{Relation, TupleData, Value};
use crate::source::deleter::Table;

/// A row to delete: its table and its primary key as a JSON object of text values.
pub type Row = (Arc<Table>, String);

/// The outbox tables, and where each announced relation holds their key columns.
#[derive(Debug)]
pub(crate) struct Tables {
    tables: Vec<Arc<Table>>,
    /// Relation id → its table and the key columns' positions in its tuples.
    bound: HashMap<u32, (Arc<Table>, Vec<usize>)>,
}

impl Tables {
    pub(crate) fn new(tables: Vec<Table>) -> Self {
        Tables {
            tables: tables.into_iter().map(Arc::new).collect(),
            bound: HashMap::new(),
        }
    }

    /// A Relation message: where an outbox table's (or its partition's) key columns are; rows
    /// of a partition are deleted through its `root`.
    pub(crate) fn relation(
        &mut self,
        relation: &Relation,
        root: Option<&TableName>,
    ) -> Result<(), BindError> {
        let name = match root {
            Some(root) => root.to_string(),
            None => format!("{}.{}", relation.namespace, relation.name),
        };
        let Some(table) = self.tables.iter().find(|t| t.name() == name) else {
            self.bound.remove(&relation.id);
            return Ok(());
        };
        let flag = "--cleanup delete (primary key)";
        let positions = (table.columns().iter())
            .map(|column| column_index(relation, &name, flag, column))
            .collect::<Result<_, _>>()?;
        self.bound
            .insert(relation.id, (Arc::clone(table), positions));
        Ok(())
    }

    /// The row an insert into an outbox table wrote (none for other tables).
    pub(crate) fn row(&self, relation_id: u32, tuple: &TupleData) -> Option<Row> {
        let (table, positions) = self.bound.get(&relation_id)?;
        let text = |(column, &i): (&String, &usize)| match tuple.0.get(i) {
            Some(Value::Text(b)) => Some((column.clone(), String::from_utf8_lossy(b).into())),
            _ => None,
        };
        let key = table.columns().iter().zip(positions).map(text);
        let key = serde_json::Value::Object(key.collect::<Option<_>>()?);
        Some((Arc::clone(table), key.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::pgoutput::Column;

    fn relation(id: u32, name: &str, columns: &[&str]) -> Relation {
        let column = |name: &&str| Column {
            flags: 0,
            name: (*name).to_owned(),
            type_oid: 25,
            type_modifier: -1,
        };
        Relation {
            id,
            namespace: "public".into(),
            name: name.into(),
            replica_identity: b'd',
            columns: columns.iter().map(column).collect(),
        }
    }

    fn tuple(values: &[Option<&str>]) -> TupleData {
        let value = |v: &Option<&str>| match v {
            Some(text) => Value::Text(Bytes::from(text.to_string())),
            None => Value::Null,
        };
        TupleData(values.iter().map(value).collect())
    }

    #[test]
    fn a_rows_key_is_read_where_its_relation_holds_the_key_columns() {
        let outbox = TableName::parse("public.outbox").unwrap();
        let key = vec!["id".to_owned(), "day".to_owned()];
        let mut tables = Tables::new(vec![Table::new(&outbox, key)]);
        // A partition of the outbox, its columns in another order, deleted through the root.
        let partition = relation(7, "outbox_2025", &["day", "payload", "id"]);
        tables.relation(&partition, Some(&outbox)).unwrap();
        let (table, key) = tables
            .row(7, &tuple(&[Some("mon"), None, Some("e1")]))
            .unwrap();
        assert_eq!(table.name(), "public.outbox");
        assert_eq!(key, r#"{"day":"mon","id":"e1"}"#);
        // Another table's rows, and a key column sent as NULL or unchanged, are not deleted.
        tables
            .relation(&relation(8, "orders", &["id"]), None)
            .unwrap();
        assert!(tables.row(8, &tuple(&[Some("o1")])).is_none());
        assert!(tables.row(7, &tuple(&[None, None, Some("e1")])).is_none());
        // A relation without a key column cannot be cleaned: refused by name.
        let broken = relation(9, "outbox", &["payload"]);
        let refused = tables.relation(&broken, None).unwrap_err().to_string();
        assert!(
            refused.contains("--cleanup delete (primary key)"),
            "{refused}"
        );
    }
}
