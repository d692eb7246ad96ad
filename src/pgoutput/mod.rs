//! A pure decoder for `pgoutput` protocol version 1 ("Logical Replication Message Formats";
//! streaming and two-phase tags are unknown here). [`decode`] turns one `XLogData` payload into a
//! [`Message`]. The bytes come from the network, so it never panics: reads are bounds-checked and
//! a message must be consumed exactly. Rows name their table only by OID, so the caller keeps the
//! [`Relation`]s it has seen.

mod cursor;

use bytes::Bytes;

use self::cursor::Cursor;
use crate::lsn::Lsn;

/// One decoded pgoutput message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// `'B'`: start of a committed transaction.
    Begin {
        /// LSN of the transaction's commit record (equals the Commit's `commit_lsn`).
        final_lsn: Lsn,
        /// Commit time, in microseconds since 2000-01-01 UTC (Postgres epoch).
        commit_time_micros: i64,
        /// Transaction ID on the server, for logs only.
        xid: u32,
    },
    /// `'C'`: end of the transaction opened by the last Begin.
    Commit {
        /// Commit flags; unused, always 0 so far.
        flags: u8,
        /// LSN of the commit record (equals the Begin's `final_lsn`).
        commit_lsn: Lsn,
        /// End of the commit record: the LSN to confirm once the transaction is handled.
        end_lsn: Lsn,
        /// Commit time, in microseconds since 2000-01-01 UTC (Postgres epoch).
        commit_time_micros: i64,
    },
    /// `'O'`: the transaction was replicated into this server from another.
    Origin {
        /// LSN of the commit on the origin server.
        commit_lsn: Lsn,
        /// Name of the replication origin.
        name: String,
    },
    /// `'R'`: a table's schema, sent before its first row in a session and after it changes.
    Relation(Relation),
    /// `'Y'`: a non-built-in type used by a following Relation.
    Type {
        /// OID of the type (`pg_type.oid`), as a Relation's column `type_oid` names it.
        oid: u32,
        /// Schema name of the type.
        namespace: String,
        /// Type name.
        name: String,
    },
    /// `'I'`: a new row.
    Insert {
        /// OID of the table, as announced by a Relation.
        relation_id: u32,
        /// The inserted row (`'N'` tuple).
        new: TupleData,
    },
    /// `'U'`: a changed row; unchanged TOASTed columns of `new` are [`Value::Unchanged`].
    Update {
        /// OID of the table, as announced by a Relation.
        relation_id: u32,
        /// Old key (`'K'`) or, under REPLICA IDENTITY FULL, old row (`'O'`); `None` when the key
        /// did not change.
        old: Option<TupleData>,
        /// The row after the update (`'N'` tuple).
        new: TupleData,
    },
    /// `'D'`: a deleted row.
    Delete {
        /// OID of the table, as announced by a Relation.
        relation_id: u32,
        /// Old key (`'K'`, other columns Null) or old row (`'O'`).
        old: TupleData,
    },
    /// `'T'`: one TRUNCATE statement.
    Truncate {
        /// Option bits: 1 is CASCADE, 2 is RESTART IDENTITY.
        options: u8,
        /// OIDs of the truncated tables.
        relation_ids: Vec<u32>,
    },
    /// `'M'`: a message written with `pg_logical_emit_message` (sent with `messages 'true'`);
    /// a non-transactional one comes at once, outside any transaction.
    Message {
        /// Whether the message was emitted as part of a transaction (flags byte 1).
        transactional: bool,
        /// LSN of the logical decoding message.
        lsn: Lsn,
        /// Prefix given to `pg_logical_emit_message`, naming the consumer it is for.
        prefix: String,
        /// Message payload, a zero-copy slice of the input.
        content: Bytes,
    },
}

/// A table's schema as pgoutput announces it; rows carry values in this column order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// OID of the table; rows refer to the table by this.
    pub id: u32,
    /// Schema name.
    pub namespace: String,
    /// Table name.
    pub name: String,
    /// `relreplident`: `b'd'` default, `b'n'` nothing, `b'f'` full, `b'i'` index.
    pub replica_identity: u8,
    /// Published columns, in the order row values are sent.
    pub columns: Vec<Column>,
}

impl Relation {
    /// Position of the named column, which is also its index in a [`TupleData`].
    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }
}

/// One published column of a [`Relation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// 1 when the column is part of the replica identity key (sent in old-key `'K'` tuples).
    pub flags: u8,
    /// Column name.
    pub name: String,
    /// OID of the column's type (`pg_type.oid`).
    pub type_oid: u32,
    /// `atttypmod`, e.g. the length of `varchar(n)` + 4; -1 when none.
    pub type_modifier: i32,
}

/// The values of one row, in the column order of its [`Relation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TupleData(pub Vec<Value>);

/// One column value of a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// A TOASTed value the change did not touch, so the server did not resend it.
    Unchanged,
    /// The value in its type's text output format (pgoutput's default).
    Text(Bytes),
    /// The value in its type's binary format (only with `binary 'true'`).
    Binary(Bytes),
}

/// Why a pgoutput message could not be decoded; `what` names the field being read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The message ended in the middle of a field (an empty one before its tag).
    #[error("pgoutput message truncated reading {what}: needed {needed} bytes, {available} left")]
    Truncated {
        /// The field being read.
        what: &'static str,
        /// Bytes the field needed.
        needed: usize,
        /// Bytes left in the message.
        available: usize,
    },
    /// A length or count field was negative.
    #[error("negative {what} in pgoutput message: {value}")]
    NegativeLength {
        /// The length or count field read.
        what: &'static str,
        /// The negative value found.
        value: i32,
    },
    /// A string field was not valid UTF-8.
    #[error("invalid UTF-8 in {what} of pgoutput message")]
    InvalidUtf8 {
        /// The string field read.
        what: &'static str,
    },
    /// A string field had no terminating NUL.
    #[error("missing NUL terminator for {what} in pgoutput message")]
    MissingNul {
        /// The string field read.
        what: &'static str,
    },
    /// A tag, kind or flags byte not allowed there (an unknown message tag included).
    #[error("unexpected byte 0x{found:02X} in pgoutput message reading {what}")]
    Unexpected {
        /// The field being read, and what it allows.
        what: &'static str,
        /// The byte found.
        found: u8,
    },
    /// Bytes were left after the message.
    #[error("{remaining} trailing bytes after pgoutput '{tag}' message")]
    TrailingBytes {
        /// Tag of the message decoded.
        tag: char,
        /// Number of bytes left unread.
        remaining: usize,
    },
}

/// Decodes one pgoutput message, the whole payload of one `XLogData`; never panics.
pub fn decode(buf: &Bytes) -> Result<Message, DecodeError> {
    let mut cur = Cursor::new(buf);
    let tag = cur.u8("message tag")?;
    let message = match tag {
        b'B' => Message::Begin {
            final_lsn: cur.lsn("Begin final LSN")?,
            commit_time_micros: cur.i64("Begin commit timestamp")?,
            xid: cur.u32("Begin xid")?,
        },
        b'C' => Message::Commit {
            flags: cur.u8("Commit flags")?,
            commit_lsn: cur.lsn("Commit LSN")?,
            end_lsn: cur.lsn("Commit end LSN")?,
            commit_time_micros: cur.i64("Commit timestamp")?,
        },
        b'O' => Message::Origin {
            commit_lsn: cur.lsn("Origin commit LSN")?,
            name: cur.cstr("Origin name")?,
        },
        b'R' => Message::Relation(Relation {
            id: cur.u32("Relation OID")?,
            namespace: cur.cstr("Relation namespace")?,
            name: cur.cstr("Relation name")?,
            replica_identity: cur.u8("Relation replica identity")?,
            columns: columns(&mut cur)?,
        }),
        b'Y' => Message::Type {
            oid: cur.u32("Type OID")?,
            namespace: cur.cstr("Type namespace")?,
            name: cur.cstr("Type name")?,
        },
        b'I' => insert(&mut cur)?,
        b'U' => update(&mut cur)?,
        b'D' => delete(&mut cur)?,
        b'T' => truncate(&mut cur)?,
        b'M' => logical_message(&mut cur)?,
        found => {
            let what = "message tag";
            return Err(DecodeError::Unexpected { what, found });
        }
    };
    cur.finish(tag)?;
    Ok(message)
}

/// An Insert, after its tag: the relation, then the new tuple.
fn insert(cur: &mut Cursor) -> Result<Message, DecodeError> {
    let relation_id = cur.u32("Insert relation OID")?;
    one_of(cur, b"N", "Insert tuple kind ('N')")?;
    Ok(Message::Insert {
        relation_id,
        new: tuple(cur)?,
    })
}

/// An Update, after its tag: the relation, the old key or row if sent, then the new tuple.
fn update(cur: &mut Cursor) -> Result<Message, DecodeError> {
    let relation_id = cur.u32("Update relation OID")?;
    let old = match one_of(cur, b"KON", "Update tuple kind ('K', 'O' or 'N')")? {
        b'N' => None,
        _ => {
            let old = tuple(cur)?;
            one_of(cur, b"N", "Update new tuple kind ('N')")?;
            Some(old)
        }
    };
    Ok(Message::Update {
        relation_id,
        old,
        new: tuple(cur)?,
    })
}

/// A Delete, after its tag: the relation, then the old key or row.
fn delete(cur: &mut Cursor) -> Result<Message, DecodeError> {
    let relation_id = cur.u32("Delete relation OID")?;
    one_of(cur, b"KO", "Delete tuple kind ('K' or 'O')")?;
    Ok(Message::Delete {
        relation_id,
        old: tuple(cur)?,
    })
}

/// A Truncate, after its tag: the relation count, the options, then each relation.
fn truncate(cur: &mut Cursor) -> Result<Message, DecodeError> {
    let count = cur.len_i32("Truncate relation count")?;
    let options = cur.u8("Truncate options")?;
    // Capped by what the buffer can hold, so a corrupt count cannot reserve gigabytes.
    let mut relation_ids = Vec::with_capacity(count.min(cur.remaining() / 4));
    for _ in 0..count {
        relation_ids.push(cur.u32("Truncate relation OID")?);
    }
    Ok(Message::Truncate {
        options,
        relation_ids,
    })
}

/// A logical decoding message, after its tag: its flags, position, prefix and content.
fn logical_message(cur: &mut Cursor) -> Result<Message, DecodeError> {
    let transactional = one_of(cur, &[0, 1], "Message flags (0 or 1)")? == 1;
    let lsn = cur.lsn("Message LSN")?;
    let prefix = cur.cstr("Message prefix")?;
    let len = cur.len_i32("Message content length")?;
    Ok(Message::Message {
        transactional,
        lsn,
        prefix,
        content: cur.bytes(len, "Message content")?,
    })
}

/// Reads a byte that must be one of `allowed`.
fn one_of(cur: &mut Cursor, allowed: &[u8], what: &'static str) -> Result<u8, DecodeError> {
    match cur.u8(what)? {
        found if allowed.contains(&found) => Ok(found),
        found => Err(DecodeError::Unexpected { what, found }),
    }
}

/// A Relation's columns: an Int16 count, then each column.
fn columns(cur: &mut Cursor) -> Result<Vec<Column>, DecodeError> {
    let count = cur.count_i16("Relation column count")?;
    // A column takes at least 10 bytes.
    let mut columns = Vec::with_capacity(count.min(cur.remaining() / 10));
    for _ in 0..count {
        columns.push(Column {
            flags: cur.u8("Relation column flags")?,
            name: cur.cstr("Relation column name")?,
            type_oid: cur.u32("Relation column type OID")?,
            type_modifier: cur.i32("Relation column type modifier")?,
        });
    }
    Ok(columns)
}

/// A TupleData: an Int16 column count, then one kind-prefixed value per column.
fn tuple(cur: &mut Cursor) -> Result<TupleData, DecodeError> {
    let count = cur.count_i16("tuple column count")?;
    let mut values = Vec::with_capacity(count.min(cur.remaining()));
    for _ in 0..count {
        values.push(match cur.u8("tuple value kind")? {
            b'n' => Value::Null,
            b'u' => Value::Unchanged,
            b't' => {
                let len = cur.len_i32("text value length")?;
                Value::Text(cur.bytes(len, "text value")?)
            }
            b'b' => {
                let len = cur.len_i32("binary value length")?;
                Value::Binary(cur.bytes(len, "binary value")?)
            }
            found => {
                let what = "tuple value kind ('n', 'u', 't' or 'b')";
                return Err(DecodeError::Unexpected { what, found });
            }
        });
    }
    Ok(TupleData(values))
}

#[cfg(test)]
mod tests;
