//! A pure decoder for PostgreSQL's `pgoutput` logical replication protocol, version 1.
//!
//! Each `XLogData` payload is one message; [`decode`] turns it into a [`Message`], following
//! "Logical Replication Message Formats" in the PostgreSQL 15 docs. Streaming and two-phase
//! messages (protocol 2 and 3) are unknown tags here. The bytes come from the network, so
//! decoding never panics: every read is bounds-checked, negative lengths are errors, and a
//! message must be consumed exactly. Row values are zero-copy slices of the input. Rows name
//! their table only by OID, so the caller keeps the [`Relation`]s it has seen.

mod cursor;

use bytes::Bytes;

use self::cursor::Cursor;
use crate::lsn::Lsn;

/// One decoded pgoutput message. Times are microseconds since 2000-01-01 UTC, as Postgres keeps
/// them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// `'B'`: start of a committed transaction. `final_lsn` is its commit record's LSN (the
    /// Commit's `commit_lsn`); `xid` is for logs only.
    Begin {
        /// LSN of the transaction's commit record (equals the Commit's `commit_lsn`).
        final_lsn: Lsn,
        /// Commit time, in microseconds since 2000-01-01 UTC (Postgres epoch).
        commit_time_micros: i64,
        /// Transaction ID on the server, for logs only.
        xid: u32,
    },
    /// `'C'`: end of the transaction opened by the last Begin. `end_lsn` is the end of the commit
    /// record: the position to confirm once the transaction is handled. `flags` is always 0 so
    /// far.
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
    /// `'O'`: the transaction was replicated into this server from the origin `name`, where it
    /// committed at `commit_lsn`.
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
    /// `'I'`: a new row of the table `relation_id` (as announced by a Relation).
    Insert {
        /// OID of the table, as announced by a Relation.
        relation_id: u32,
        /// The inserted row (`'N'` tuple).
        new: TupleData,
    },
    /// `'U'`: a changed row. `old` is the old key (`'K'`) or, under REPLICA IDENTITY FULL, the old
    /// row (`'O'`), absent when the key did not change; in `new`, unchanged TOASTed columns are
    /// [`Value::Unchanged`].
    Update {
        /// OID of the table, as announced by a Relation.
        relation_id: u32,
        /// Old key (`'K'`) or old row (`'O'`); `None` when the key did not change.
        old: Option<TupleData>,
        /// The row after the update (`'N'` tuple).
        new: TupleData,
    },
    /// `'D'`: a deleted row; `old` is the old key (`'K'`, other columns Null) or the old row
    /// (`'O'`).
    Delete {
        /// OID of the table, as announced by a Relation.
        relation_id: u32,
        /// Old key (`'K'`, other columns Null) or old row (`'O'`).
        old: TupleData,
    },
    /// `'T'`: one TRUNCATE statement; `options` bit 1 is CASCADE, bit 2 RESTART IDENTITY.
    Truncate {
        /// Option bits: 1 is CASCADE, 2 is RESTART IDENTITY.
        options: u8,
        /// OIDs of the truncated tables.
        relation_ids: Vec<u32>,
    },
    /// `'M'`: a message written with `pg_logical_emit_message` (sent with `messages 'true'`).
    /// A transactional one comes inside its transaction, the others at once, outside any; the
    /// `prefix` tells consumers apart and `content` is a zero-copy slice of the input.
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
    /// The payload held no bytes, not even a tag.
    #[error("empty pgoutput message")]
    Empty,
    /// The first byte is not a protocol version 1 message tag.
    #[error("unknown pgoutput message tag 0x{0:02X}")]
    UnknownTag(u8),
    /// The message ended in the middle of a field.
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
    /// The tuple marker byte of a message with tag `tag` was not one allowed there.
    #[error("unexpected tuple kind 0x{found:02X} in pgoutput '{tag}' message, expected {expected}")]
    UnexpectedTupleKind {
        /// Tag of the message being decoded.
        tag: char,
        /// The markers allowed at that point, for the error text.
        expected: &'static str,
        /// The marker byte found.
        found: u8,
    },
    /// A column value started with a kind other than `n`, `u`, `t` or `b`.
    #[error("unknown tuple value kind 0x{0:02X} in pgoutput message")]
    UnknownValueKind(u8),
    /// A logical decoding message's flags were neither 0 nor 1.
    #[error("unknown flags 0x{0:02X} in pgoutput 'M' message")]
    UnknownMessageFlags(u8),
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
    if cur.remaining() == 0 {
        return Err(DecodeError::Empty);
    }
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
        b'R' => Message::Relation(relation(&mut cur)?),
        b'Y' => Message::Type {
            oid: cur.u32("Type OID")?,
            namespace: cur.cstr("Type namespace")?,
            name: cur.cstr("Type name")?,
        },
        b'I' => {
            let relation_id = cur.u32("Insert relation OID")?;
            tuple_kind(&mut cur, tag, b"N", "'N'")?;
            Message::Insert {
                relation_id,
                new: tuple(&mut cur)?,
            }
        }
        b'U' => {
            let relation_id = cur.u32("Update relation OID")?;
            let old = match tuple_kind(&mut cur, tag, b"KON", "'K', 'O' or 'N'")? {
                b'N' => None,
                _ => {
                    let old = tuple(&mut cur)?;
                    tuple_kind(&mut cur, tag, b"N", "'N' after the old tuple")?;
                    Some(old)
                }
            };
            Message::Update {
                relation_id,
                old,
                new: tuple(&mut cur)?,
            }
        }
        b'D' => {
            let relation_id = cur.u32("Delete relation OID")?;
            tuple_kind(&mut cur, tag, b"KO", "'K' or 'O'")?;
            Message::Delete {
                relation_id,
                old: tuple(&mut cur)?,
            }
        }
        b'T' => {
            let count = cur.len_i32("Truncate relation count")?;
            let options = cur.u8("Truncate options")?;
            // Capped by what the buffer can hold, so a corrupt count cannot reserve gigabytes.
            let mut relation_ids = Vec::with_capacity(count.min(cur.remaining() / 4));
            for _ in 0..count {
                relation_ids.push(cur.u32("Truncate relation OID")?);
            }
            Message::Truncate {
                options,
                relation_ids,
            }
        }
        b'M' => {
            let transactional = match cur.u8("Message flags")? {
                0 => false,
                1 => true,
                other => return Err(DecodeError::UnknownMessageFlags(other)),
            };
            let lsn = cur.lsn("Message LSN")?;
            let prefix = cur.cstr("Message prefix")?;
            let len = cur.len_i32("Message content length")?;
            Message::Message {
                transactional,
                lsn,
                prefix,
                content: cur.bytes(len, "Message content")?,
            }
        }
        other => return Err(DecodeError::UnknownTag(other)),
    };
    cur.finish(tag)?;
    Ok(message)
}

/// Reads a tuple marker, which must be one of `allowed`.
fn tuple_kind(
    cur: &mut Cursor,
    tag: u8,
    allowed: &[u8],
    expected: &'static str,
) -> Result<u8, DecodeError> {
    match cur.u8("tuple kind")? {
        found if allowed.contains(&found) => Ok(found),
        found => Err(DecodeError::UnexpectedTupleKind {
            tag: char::from(tag),
            expected,
            found,
        }),
    }
}

/// The body of a Relation (`'R'`) message.
fn relation(cur: &mut Cursor) -> Result<Relation, DecodeError> {
    let id = cur.u32("Relation OID")?;
    let namespace = cur.cstr("Relation namespace")?;
    let name = cur.cstr("Relation name")?;
    let replica_identity = cur.u8("Relation replica identity")?;
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
    Ok(Relation {
        id,
        namespace,
        name,
        replica_identity,
        columns,
    })
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
            other => return Err(DecodeError::UnknownValueKind(other)),
        });
    }
    Ok(TupleData(values))
}

#[cfg(test)]
mod tests;
