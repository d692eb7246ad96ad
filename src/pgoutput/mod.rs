//! A pure decoder for PostgreSQL's `pgoutput` logical replication protocol,
//! version 1.
//!
//! `pgoutput` is the output plugin behind built-in logical replication. Over a
//! replication connection every `XLogData` (`'w'`) CopyData message carries
//! exactly one pgoutput message in its payload; [`decode`] turns that payload
//! into a [`Message`]. The layouts follow the PostgreSQL 15 documentation,
//! "Logical Replication Message Formats". With `proto_version '1'` the server
//! sends only:
//!
//! | tag   | message                                                   |
//! |-------|-----------------------------------------------------------|
//! | `'B'` | [`Message::Begin`] of a transaction                       |
//! | `'C'` | [`Message::Commit`] of a transaction                      |
//! | `'O'` | [`Message::Origin`]: the transaction was replayed from elsewhere |
//! | `'R'` | [`Message::Relation`]: table schema, sent before its first row and again after it changes |
//! | `'Y'` | [`Message::Type`]: a non-built-in column type             |
//! | `'I'` | [`Message::Insert`]                                       |
//! | `'U'` | [`Message::Update`]                                       |
//! | `'D'` | [`Message::Delete`]                                       |
//! | `'T'` | [`Message::Truncate`]                                     |
//! | `'M'` | [`Message::Message`] from `pg_logical_emit_message` (with `messages 'true'`) |
//!
//! Streaming (`'S'`, `'E'`, `'c'`, `'A'`) and two-phase messages exist only
//! in protocol versions 2 and 3 and are rejected as unknown tags here.
//!
//! Decoding is pure: no I/O, no state and no allocation beyond the decoded
//! strings and vectors; row values are zero-copy slices of the input. It never
//! panics: the bytes come from the network, so every read is bounds-checked,
//! every length and count is checked for being negative, and a message must
//! be consumed exactly. Anything else is a typed [`DecodeError`] the caller
//! can log and act on. Relation messages are remembered by the caller in a
//! [`RelationCache`], because rows refer to their table only by OID.

mod cursor;

use std::collections::HashMap;

use bytes::Bytes;

use self::cursor::Cursor;
use crate::lsn::Lsn;

const BEGIN_TAG: u8 = b'B';
const COMMIT_TAG: u8 = b'C';
const ORIGIN_TAG: u8 = b'O';
const RELATION_TAG: u8 = b'R';
const TYPE_TAG: u8 = b'Y';
const INSERT_TAG: u8 = b'I';
const UPDATE_TAG: u8 = b'U';
const DELETE_TAG: u8 = b'D';
const TRUNCATE_TAG: u8 = b'T';
const MESSAGE_TAG: u8 = b'M';

const TUPLE_NEW: u8 = b'N';
const TUPLE_KEY: u8 = b'K';
const TUPLE_OLD: u8 = b'O';

const VALUE_NULL: u8 = b'n';
const VALUE_UNCHANGED: u8 = b'u';
const VALUE_TEXT: u8 = b't';
const VALUE_BINARY: u8 = b'b';

const MESSAGE_TRANSACTIONAL: u8 = 1;

/// Bit in [`Message::Truncate`]'s `options`: `TRUNCATE ... CASCADE`.
pub const TRUNCATE_CASCADE: u8 = 1;
/// Bit in [`Message::Truncate`]'s `options`: `TRUNCATE ... RESTART IDENTITY`.
pub const TRUNCATE_RESTART_IDENTITY: u8 = 2;

/// Bit in [`Column::flags`]: the column is part of the replica identity key.
pub const COLUMN_FLAG_KEY: u8 = 1;

/// One decoded pgoutput message; timestamps are microseconds since
/// 2000-01-01 00:00:00 UTC, as Postgres keeps them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Start of a committed transaction; its changes follow.
    Begin {
        /// LSN of the transaction's commit record; equals the Commit's `commit_lsn`.
        final_lsn: Lsn,
        /// Commit time of the transaction.
        commit_time_micros: i64,
        /// Transaction id, for logs and correlation only.
        xid: u32,
    },
    /// End of the transaction opened by the last Begin.
    Commit {
        /// Currently always 0; kept so unexpected values can be noticed.
        flags: u8,
        /// LSN of the commit record.
        commit_lsn: Lsn,
        /// End of the commit record: the position to confirm once the
        /// transaction is safely handled.
        end_lsn: Lsn,
        /// Commit time of the transaction.
        commit_time_micros: i64,
    },
    /// The transaction was replicated into this server from the named origin.
    Origin {
        /// Commit LSN of the transaction on the origin server.
        commit_lsn: Lsn,
        /// Replication origin name.
        name: String,
    },
    /// Schema of a table, sent before its first change in a session and after
    /// any change to it.
    Relation(Relation),
    /// A non-built-in type used by a column of a following Relation.
    Type {
        /// OID of the type.
        oid: u32,
        /// Schema of the type.
        namespace: String,
        /// Name of the type.
        name: String,
    },
    /// A new row.
    Insert {
        /// OID of the table, as announced in a Relation message.
        relation_id: u32,
        /// The new row.
        new: TupleData,
    },
    /// A changed row.
    Update {
        /// OID of the table, as announced in a Relation message.
        relation_id: u32,
        /// The old key ('K') or, under REPLICA IDENTITY FULL, the whole old
        /// row ('O'); absent when the key did not change.
        old: Option<TupleData>,
        /// The new row; TOASTed columns that did not change are
        /// [`Value::Unchanged`].
        new: TupleData,
    },
    /// A deleted row.
    Delete {
        /// OID of the table, as announced in a Relation message.
        relation_id: u32,
        /// The old key ('K') or the whole old row ('O'); other columns are Null.
        old: TupleData,
    },
    /// One TRUNCATE statement over one or more tables.
    Truncate {
        /// [`TRUNCATE_CASCADE`] and/or [`TRUNCATE_RESTART_IDENTITY`].
        options: u8,
        /// OIDs of the truncated tables.
        relation_ids: Vec<u32>,
    },
    /// A message written with `pg_logical_emit_message`.
    Message {
        /// Sent inside its transaction's Begin/Commit when true; immediately,
        /// outside any transaction, when false.
        transactional: bool,
        /// LSN of the message's WAL record.
        lsn: Lsn,
        /// The prefix the writer chose, to tell consumers apart.
        prefix: String,
        /// The payload, a zero-copy slice of the input.
        content: Bytes,
    },
}

/// A table's schema as pgoutput announces it; rows carry values in this
/// column order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// OID of the table; changes refer to the table by this.
    pub id: u32,
    /// Schema name.
    pub namespace: String,
    /// Table name.
    pub name: String,
    /// `relreplident`: `b'd'` default (primary key), `b'n'` nothing,
    /// `b'f'` full, `b'i'` index.
    pub replica_identity: u8,
    /// Published columns, in the order row values are sent.
    pub columns: Vec<Column>,
}

impl Relation {
    /// Position of the named column, which is also its index in a
    /// [`TupleData`] of this relation.
    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }
}

/// One published column of a [`Relation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// [`COLUMN_FLAG_KEY`] or 0.
    pub flags: u8,
    /// Column name.
    pub name: String,
    /// OID of the column's type (`pg_type.oid`).
    pub type_oid: u32,
    /// `atttypmod`, e.g. the length of `varchar(n)` + 4; -1 when none.
    pub type_modifier: i32,
}

impl Column {
    /// Whether the column belongs to the replica identity, i.e. is sent in
    /// old-key ('K') tuples.
    pub fn is_key(&self) -> bool {
        self.flags & COLUMN_FLAG_KEY != 0
    }
}

/// The values of one row, in the column order of its [`Relation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TupleData(pub Vec<Value>);

/// One column value of a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// A TOASTed value that the change did not touch; the server does not
    /// resend it.
    Unchanged,
    /// The value in the type's text output format (pgoutput's default).
    Text(Bytes),
    /// The value in the type's binary format (only with `binary 'true'`).
    Binary(Bytes),
}

/// Why a pgoutput message could not be decoded; each names what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The payload held no bytes at all, not even a tag.
    #[error("empty pgoutput message")]
    Empty,
    /// The first byte is not a pgoutput protocol version 1 message tag.
    #[error("unknown pgoutput message tag 0x{0:02X}")]
    UnknownTag(u8),
    /// The message ended in the middle of a field.
    #[error("pgoutput message truncated reading {what}: needed {needed} bytes, {available} left")]
    Truncated {
        /// The field being read.
        what: &'static str,
        /// Bytes the field needs.
        needed: usize,
        /// Bytes that were left.
        available: usize,
    },
    /// A length or count field was negative.
    #[error("negative {what} in pgoutput message: {value}")]
    NegativeLength {
        /// The length or count field.
        what: &'static str,
        /// The value as sent.
        value: i32,
    },
    /// A string field was not valid UTF-8.
    #[error("invalid UTF-8 in {what} of pgoutput message")]
    InvalidUtf8 {
        /// The string field.
        what: &'static str,
    },
    /// A string field had no terminating NUL before the end of the message.
    #[error("missing NUL terminator for {what} in pgoutput message")]
    MissingNul {
        /// The string field.
        what: &'static str,
    },
    /// The tuple marker byte was not one the message allows there.
    #[error("unexpected tuple kind 0x{found:02X} in pgoutput '{tag}' message, expected {expected}")]
    UnexpectedTupleKind {
        /// Tag of the message being decoded.
        tag: char,
        /// The markers allowed at that point.
        expected: &'static str,
        /// The marker found.
        found: u8,
    },
    /// A column value started with a kind other than 'n', 'u', 't' or 'b'.
    #[error("unknown tuple value kind 0x{0:02X} in pgoutput message")]
    UnknownValueKind(u8),
    /// A logical decoding message's flags were neither 0 nor 1.
    #[error("unknown flags 0x{0:02X} in pgoutput 'M' message")]
    UnknownMessageFlags(u8),
    /// The message was decoded but bytes were left after it.
    #[error("{remaining} trailing bytes after pgoutput '{tag}' message")]
    TrailingBytes {
        /// Tag of the message.
        tag: char,
        /// Bytes left over.
        remaining: usize,
    },
}

/// Decodes one pgoutput message, i.e. the whole payload of one `XLogData`.
///
/// Values are zero-copy slices of `buf`. Any malformation, including bytes
/// left after the message, is an error; this never panics.
pub fn decode(buf: &Bytes) -> Result<Message, DecodeError> {
    let mut cur = Cursor::new(buf);
    if cur.remaining() == 0 {
        return Err(DecodeError::Empty);
    }
    let tag = cur.u8("message tag")?;
    let message = match tag {
        BEGIN_TAG => Message::Begin {
            final_lsn: cur.lsn("Begin final LSN")?,
            commit_time_micros: cur.i64("Begin commit timestamp")?,
            xid: cur.u32("Begin xid")?,
        },
        COMMIT_TAG => Message::Commit {
            flags: cur.u8("Commit flags")?,
            commit_lsn: cur.lsn("Commit LSN")?,
            end_lsn: cur.lsn("Commit end LSN")?,
            commit_time_micros: cur.i64("Commit timestamp")?,
        },
        ORIGIN_TAG => Message::Origin {
            commit_lsn: cur.lsn("Origin commit LSN")?,
            name: cur.cstr("Origin name")?,
        },
        RELATION_TAG => Message::Relation(relation(&mut cur)?),
        TYPE_TAG => Message::Type {
            oid: cur.u32("Type OID")?,
            namespace: cur.cstr("Type namespace")?,
            name: cur.cstr("Type name")?,
        },
        INSERT_TAG => {
            let relation_id = cur.u32("Insert relation OID")?;
            expect_kind(&mut cur, tag, TUPLE_NEW, "'N'")?;
            Message::Insert {
                relation_id,
                new: tuple(&mut cur)?,
            }
        }
        UPDATE_TAG => {
            let relation_id = cur.u32("Update relation OID")?;
            let old = match cur.u8("Update tuple kind")? {
                TUPLE_KEY | TUPLE_OLD => {
                    let old = tuple(&mut cur)?;
                    expect_kind(&mut cur, tag, TUPLE_NEW, "'N' after the old tuple")?;
                    Some(old)
                }
                TUPLE_NEW => None,
                found => {
                    return Err(DecodeError::UnexpectedTupleKind {
                        tag: char::from(tag),
                        expected: "'K', 'O' or 'N'",
                        found,
                    });
                }
            };
            Message::Update {
                relation_id,
                old,
                new: tuple(&mut cur)?,
            }
        }
        DELETE_TAG => {
            let relation_id = cur.u32("Delete relation OID")?;
            match cur.u8("Delete tuple kind")? {
                TUPLE_KEY | TUPLE_OLD => {}
                found => {
                    return Err(DecodeError::UnexpectedTupleKind {
                        tag: char::from(tag),
                        expected: "'K' or 'O'",
                        found,
                    });
                }
            }
            Message::Delete {
                relation_id,
                old: tuple(&mut cur)?,
            }
        }
        TRUNCATE_TAG => {
            let count = cur.len_i32("Truncate relation count")?;
            let options = cur.u8("Truncate options")?;
            // Cap the reservation by what the buffer can hold (4 bytes each),
            // so a corrupt count cannot request a huge allocation.
            let mut relation_ids = Vec::with_capacity(count.min(cur.remaining() / 4));
            for _ in 0..count {
                relation_ids.push(cur.u32("Truncate relation OID")?);
            }
            Message::Truncate {
                options,
                relation_ids,
            }
        }
        MESSAGE_TAG => {
            let transactional = match cur.u8("Message flags")? {
                0 => false,
                MESSAGE_TRANSACTIONAL => true,
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

/// Reads a tuple marker that must be `kind`.
fn expect_kind(
    cur: &mut Cursor,
    tag: u8,
    kind: u8,
    expected: &'static str,
) -> Result<(), DecodeError> {
    match cur.u8("tuple kind")? {
        found if found == kind => Ok(()),
        found => Err(DecodeError::UnexpectedTupleKind {
            tag: char::from(tag),
            expected,
            found,
        }),
    }
}

/// The body of a Relation ('R') message.
fn relation(cur: &mut Cursor) -> Result<Relation, DecodeError> {
    let id = cur.u32("Relation OID")?;
    let namespace = cur.cstr("Relation namespace")?;
    let name = cur.cstr("Relation name")?;
    let replica_identity = cur.u8("Relation replica identity")?;
    let count = cur.count_i16("Relation column count")?;
    // Each column takes at least 10 bytes; cap the reservation accordingly.
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

/// A TupleData: Int16 column count, then one kind-prefixed value each.
fn tuple(cur: &mut Cursor) -> Result<TupleData, DecodeError> {
    let count = cur.count_i16("tuple column count")?;
    let mut values = Vec::with_capacity(count.min(cur.remaining()));
    for _ in 0..count {
        let value = match cur.u8("tuple value kind")? {
            VALUE_NULL => Value::Null,
            VALUE_UNCHANGED => Value::Unchanged,
            VALUE_TEXT => {
                let len = cur.len_i32("text value length")?;
                Value::Text(cur.bytes(len, "text value")?)
            }
            VALUE_BINARY => {
                let len = cur.len_i32("binary value length")?;
                Value::Binary(cur.bytes(len, "binary value")?)
            }
            other => return Err(DecodeError::UnknownValueKind(other)),
        };
        values.push(value);
    }
    Ok(TupleData(values))
}

/// The Relation messages seen so far on a replication stream.
///
/// Rows name their table only by OID and pgoutput announces each relation
/// once per session (again after a schema change), so the relay must keep
/// the latest announcement to interpret rows; the by-name index lets it find
/// its outbox table.
#[derive(Debug, Clone, Default)]
pub struct RelationCache {
    by_id: HashMap<u32, Relation>,
    /// namespace -> name -> OID, nested so lookups need no allocation.
    by_name: HashMap<String, HashMap<String, u32>>,
}

impl RelationCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores a (re-)announced relation, replacing any earlier one with the
    /// same OID (its columns may have changed, or it was renamed), and returns
    /// the replaced one. A name now held by a new OID (table dropped and
    /// recreated) resolves to the newest announcement.
    pub fn insert(&mut self, relation: Relation) -> Option<Relation> {
        let id = relation.id;
        self.by_name
            .entry(relation.namespace.clone())
            .or_default()
            .insert(relation.name.clone(), id);
        let previous = self.by_id.insert(id, relation);
        if let Some(old) = &previous
            && let Some(current) = self.by_id.get(&id)
            && (old.namespace != current.namespace || old.name != current.name)
        {
            self.remove_name_if(&old.namespace, &old.name, id);
        }
        previous
    }

    /// The latest announcement of the relation with this OID.
    pub fn get(&self, id: u32) -> Option<&Relation> {
        self.by_id.get(&id)
    }

    /// The latest announced relation called `namespace.name`.
    pub fn get_by_name(&self, namespace: &str, name: &str) -> Option<&Relation> {
        let id = self.by_name.get(namespace)?.get(name)?;
        self.by_id.get(id)
    }

    /// Drops the name entry `namespace.name` if it still points at `id`.
    fn remove_name_if(&mut self, namespace: &str, name: &str, id: u32) {
        if let Some(names) = self.by_name.get_mut(namespace) {
            if names.get(name) == Some(&id) {
                names.remove(name);
            }
            if names.is_empty() {
                self.by_name.remove(namespace);
            }
        }
    }

    /// Forgets every relation, e.g. when a new replication session starts
    /// (the server announces them all again).
    pub fn clear(&mut self) {
        self.by_id.clear();
        self.by_name.clear();
    }

    /// Number of relations known.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether no relation is known yet.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

#[cfg(test)]
mod tests;
