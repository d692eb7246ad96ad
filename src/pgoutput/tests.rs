//! Decoder tests against bytes captured from a real PostgreSQL 15 (see
//! tests/fixtures/pgoutput/capture.sh), plus hand-made malformed messages.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;

use super::*;

macro_rules! fixture {
    ($file:literal) => {
        (
            $file,
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/pgoutput/",
                $file
            )),
        )
    };
}

const FIXTURES: &[(&str, &str)] = &[
    fixture!("outbox.txt"),
    fixture!("bytea.txt"),
    fixture!("toast.txt"),
    fixture!("full.txt"),
    fixture!("truncate.txt"),
    fixture!("enum.txt"),
    fixture!("messages.txt"),
    fixture!("origin.txt"),
];

/// One captured message: the `lsn` column of `pg_logical_slot_peek_binary_changes`
/// and the message bytes.
struct Line {
    lsn: Lsn,
    bytes: Bytes,
}

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd-length hex {s:?}");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn parse(text: &str) -> Vec<Line> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (lsn, data) = l.split_once('\t').expect("<lsn>\\t<hex>");
            Line {
                lsn: lsn.parse().unwrap(),
                bytes: Bytes::from(hex(data)),
            }
        })
        .collect()
}

fn load(name: &str) -> Vec<Line> {
    let (_, text) = FIXTURES.iter().find(|(f, _)| *f == name).unwrap();
    parse(text)
}

fn decode_all(name: &str) -> Vec<(Line, Message)> {
    load(name)
        .into_iter()
        .map(|line| {
            let msg = decode(&line.bytes).unwrap_or_else(|e| panic!("{name} {}: {e}", line.lsn));
            (line, msg)
        })
        .collect()
}

fn text(v: &Value) -> &str {
    match v {
        Value::Text(b) => std::str::from_utf8(b).unwrap(),
        other => panic!("expected a text value, got {other:?}"),
    }
}

fn texts(t: &TupleData) -> Vec<Option<&str>> {
    t.0.iter()
        .map(|v| match v {
            Value::Null => None,
            v => Some(text(v)),
        })
        .collect()
}

fn relation_of(msgs: &[(Line, Message)], n: usize) -> &Relation {
    msgs.iter()
        .filter_map(|(_, m)| match m {
            Message::Relation(r) => Some(r),
            _ => None,
        })
        .nth(n)
        .unwrap()
}

fn changes(msgs: &[(Line, Message)]) -> Vec<&Message> {
    msgs.iter()
        .map(|(_, m)| m)
        .filter(|m| {
            matches!(
                m,
                Message::Insert { .. }
                    | Message::Update { .. }
                    | Message::Delete { .. }
                    | Message::Truncate { .. }
            )
        })
        .collect()
}

fn column_summary(r: &Relation) -> Vec<(&str, u32, i32, bool)> {
    r.columns
        .iter()
        .map(|c| (c.name.as_str(), c.type_oid, c.type_modifier, c.flags == 1))
        .collect()
}

const INT4: u32 = 23;
const TEXT: u32 = 25;
const BYTEA: u32 = 17;
const VARCHAR: u32 = 1043;
const NUMERIC: u32 = 1700;
const UUID: u32 = 2950;
const JSONB: u32 = 3802;
const TIMESTAMPTZ: u32 = 1184;

// ---------------------------------------------------------------- fixtures

#[test]
fn every_fixture_line_decodes_and_transactions_are_well_formed() {
    let mut tags = std::collections::BTreeSet::new();
    for (name, text) in FIXTURES {
        let lines = parse(text);
        assert!(!lines.is_empty(), "{name} has no messages");
        let mut open: Option<Lsn> = None;
        for line in lines {
            tags.insert(char::from(line.bytes[0]));
            let msg = decode(&line.bytes).unwrap_or_else(|e| panic!("{name} {}: {e}", line.lsn));
            match msg {
                Message::Begin { final_lsn, .. } => {
                    assert!(open.is_none(), "{name}: nested Begin");
                    open = Some(final_lsn);
                }
                Message::Commit {
                    flags,
                    commit_lsn,
                    end_lsn,
                    ..
                } => {
                    assert_eq!(flags, 0);
                    assert_eq!(Some(commit_lsn), open.take(), "{name}: Begin/Commit LSNs");
                    assert!(end_lsn > commit_lsn);
                    // The SQL interface reports a commit at its end LSN.
                    assert_eq!(end_lsn, line.lsn, "{name}: Commit end LSN");
                }
                Message::Message {
                    transactional, lsn, ..
                } => {
                    assert_eq!(transactional, open.is_some(), "{name}: message placement");
                    assert_eq!(lsn, line.lsn);
                }
                _ => assert!(open.is_some(), "{name}: {msg:?} outside a transaction"),
            }
        }
        assert!(open.is_none(), "{name}: unterminated transaction");
    }
    // Real bytes for every message type of protocol version 1.
    assert_eq!(tags.into_iter().collect::<String>(), "BCDIMORTUY");
}

#[test]
fn outbox_relation_and_inserts() {
    let msgs = decode_all("outbox.txt");
    let Message::Begin {
        final_lsn,
        commit_time_micros: begin_time,
        xid,
    } = msgs[0].1
    else {
        panic!("first message is not Begin: {:?}", msgs[0].1);
    };
    let Message::Commit {
        flags,
        commit_lsn,
        end_lsn,
        commit_time_micros,
    } = msgs[5].1
    else {
        panic!("last message is not Commit: {:?}", msgs[5].1);
    };
    // LSNs and xids are stable across re-captures (same script, fresh
    // cluster); commit times are not, so only their agreement is checked.
    assert_eq!(xid, 738);
    assert_eq!(final_lsn.to_string(), "0/154BE10");
    assert_eq!(flags, 0);
    assert_eq!(commit_lsn, final_lsn);
    assert_eq!(end_lsn.to_string(), "0/154BE40");
    assert_eq!(commit_time_micros, begin_time);
    // Captured after 2024 (microseconds since 2000-01-01).
    assert!(commit_time_micros > 757_382_400_000_000);

    let rel = relation_of(&msgs, 0);
    assert_eq!(
        (rel.id, rel.namespace.as_str(), rel.name.as_str()),
        (16384, "public", "outbox")
    );
    assert_eq!(rel.replica_identity, b'd');
    assert_eq!(
        column_summary(rel),
        [
            ("id", UUID, -1, true),
            ("aggregate_type", TEXT, -1, false),
            ("aggregate_id", TEXT, -1, false),
            ("event_type", TEXT, -1, false),
            ("payload", JSONB, -1, false),
            ("created_at", TIMESTAMPTZ, -1, false),
        ]
    );
    assert_eq!(rel.column_index("payload"), Some(4));
    assert_eq!(rel.column_index("nope"), None);

    let rows: Vec<_> = changes(&msgs)
        .into_iter()
        .map(|m| match m {
            Message::Insert { relation_id, new } => {
                assert_eq!(*relation_id, rel.id);
                texts(new)
            }
            other => panic!("expected Insert, got {other:?}"),
        })
        .collect();
    assert_eq!(
        rows,
        [
            vec![
                Some("00000000-0000-4000-8000-000000000001"),
                Some("order"),
                Some("o-1"),
                Some("OrderPlaced"),
                // jsonb comes back normalized: keys sorted, one space after ':'.
                Some(r#"{"items": ["a", "b"], "total": 42}"#),
                Some("2024-01-02 03:04:05.123456+00"),
            ],
            vec![
                Some("00000000-0000-4000-8000-000000000002"),
                Some("order"),
                Some("o-1"),
                Some("OrderCancelled"),
                None,
                Some("2024-01-02 03:04:06+00"),
            ],
            vec![
                Some("00000000-0000-4000-8000-000000000003"),
                Some("customer"),
                Some("c-ü"),
                Some("Renamed"),
                Some(r#"{"name": "Zoë 東京 🚀"}"#),
                Some("2024-01-02 03:04:07+00"),
            ],
        ]
    );
}

#[test]
fn values_are_zero_copy_slices_of_the_input() {
    let (line, msg) = decode_all("outbox.txt").swap_remove(2);
    let Message::Insert { new, .. } = msg else {
        panic!("not an Insert: {msg:?}");
    };
    let input = line.bytes.as_ptr_range();
    for v in &new.0 {
        let Value::Text(b) = v else { panic!("{v:?}") };
        let range = b.as_ptr_range();
        assert!(input.start <= range.start && range.end <= input.end);
    }
}

#[test]
fn bytea_is_sent_as_hex_text_and_relation_is_reannounced() {
    let msgs = decode_all("bytea.txt");
    let first = relation_of(&msgs, 0);
    let second = relation_of(&msgs, 1);
    assert_eq!(first.id, second.id);
    assert_eq!(
        column_summary(first),
        [("id", INT4, -1, true), ("data", BYTEA, -1, false)]
    );
    assert_eq!(
        column_summary(second),
        [
            ("id", INT4, -1, true),
            ("data", BYTEA, -1, false),
            ("note", TEXT, -1, false)
        ]
    );
    let rows: Vec<_> = changes(&msgs)
        .into_iter()
        .map(|m| match m {
            Message::Insert { new, .. } => texts(new),
            other => panic!("expected Insert, got {other:?}"),
        })
        .collect();
    assert_eq!(
        rows,
        [
            vec![Some("1"), Some(r"\x00ff10")],
            vec![Some("2"), Some(r"\x")],
            vec![Some("3"), Some(r"\xdeadbeef"), Some("after alter")],
        ]
    );
}

#[test]
fn unchanged_toast_and_key_tuples() {
    let msgs = decode_all("toast.txt");
    let rel = relation_of(&msgs, 0);
    assert_eq!(rel.name, "docs");
    assert_eq!(rel.replica_identity, b'd');
    let key: Vec<_> = rel.columns.iter().map(|c| c.flags == 1).collect();
    assert_eq!(key, [true, false, false]);

    let ch = changes(&msgs);
    assert_eq!(ch.len(), 4);
    let Message::Insert { new, .. } = ch[0] else {
        panic!("{:?}", ch[0])
    };
    let big = text(&new.0[1]);
    assert_eq!(big.len(), 4000);
    assert!(big.starts_with("c4ca4238a0b923820dcc509a6f75849b")); // md5('1')

    // Only `note` changed: the TOASTed `big` is not resent.
    assert_eq!(
        ch[1],
        &Message::Update {
            relation_id: rel.id,
            old: None,
            new: TupleData(vec![
                Value::Text(Bytes::from_static(b"1")),
                Value::Unchanged,
                Value::Text(Bytes::from_static(b"second")),
            ]),
        }
    );
    // The key changed: the old key comes first ('K'), non-key columns Null.
    assert_eq!(
        ch[2],
        &Message::Update {
            relation_id: rel.id,
            old: Some(TupleData(vec![
                Value::Text(Bytes::from_static(b"1")),
                Value::Null,
                Value::Null,
            ])),
            new: TupleData(vec![
                Value::Text(Bytes::from_static(b"2")),
                Value::Unchanged,
                Value::Text(Bytes::from_static(b"second")),
            ]),
        }
    );
    assert_eq!(
        ch[3],
        &Message::Delete {
            relation_id: rel.id,
            old: TupleData(vec![
                Value::Text(Bytes::from_static(b"2")),
                Value::Null,
                Value::Null,
            ]),
        }
    );
}

#[test]
fn replica_identity_full_sends_old_rows() {
    let msgs = decode_all("full.txt");
    let rel = relation_of(&msgs, 0);
    assert_eq!(
        (rel.name.as_str(), rel.replica_identity),
        ("accounts", b'f')
    );
    assert_eq!(
        column_summary(rel),
        [
            ("id", INT4, -1, true),
            ("owner", VARCHAR, 64 + 4, true),
            ("balance", NUMERIC, ((12 << 16) | 2) + 4, true),
        ]
    );
    let ch = changes(&msgs);
    let summary: Vec<_> = ch
        .iter()
        .map(|m| match m {
            Message::Insert { new, .. } => (None, Some(texts(new))),
            Message::Update { old, new, .. } => (old.as_ref().map(texts), Some(texts(new))),
            Message::Delete { old, .. } => (Some(texts(old)), None),
            other => panic!("{other:?}"),
        })
        .collect();
    let row = |b| vec![Some("7"), Some("alice"), Some(b)];
    assert_eq!(
        summary,
        [
            (None, Some(row("100.50"))),
            (Some(row("100.50")), Some(row("75.25"))),
            (Some(row("75.25")), None),
        ]
    );
}

#[test]
fn truncate_options_and_relations() {
    let msgs = decode_all("truncate.txt");
    let a = relation_of(&msgs, 0).id;
    let b = relation_of(&msgs, 2).id;
    assert_eq!(relation_of(&msgs, 2).name, "audit_b");
    let truncates: Vec<_> = msgs
        .iter()
        .filter(|(_, m)| matches!(m, Message::Truncate { .. }))
        .map(|(_, m)| m.clone())
        .collect();
    assert_eq!(
        truncates,
        [
            Message::Truncate {
                options: 2, // RESTART IDENTITY
                relation_ids: vec![a, b],
            },
            Message::Truncate {
                options: 1, // CASCADE
                relation_ids: vec![b],
            },
        ]
    );
}

#[test]
fn enum_column_announces_its_type() {
    let msgs = decode_all("enum.txt");
    let Message::Type {
        oid,
        namespace,
        name,
    } = &msgs[1].1
    else {
        panic!("expected Type right after Begin: {:?}", msgs[1].1);
    };
    assert_eq!((namespace.as_str(), name.as_str()), ("public", "mood"));
    assert!(*oid >= 16384, "user type OID {oid}");
    let rel = relation_of(&msgs, 0);
    assert_eq!(rel.name, "moods");
    assert_eq!(rel.columns[1].name, "m");
    assert_eq!(rel.columns[1].type_oid, *oid);
    let rows: Vec<_> = changes(&msgs)
        .into_iter()
        .map(|m| match m {
            Message::Insert { new, .. } => texts(new),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        rows,
        [vec![Some("1"), Some("happy")], vec![Some("2"), None]]
    );
}

#[test]
fn logical_decoding_messages() {
    let msgs: Vec<_> = decode_all("messages.txt")
        .into_iter()
        .filter_map(|(_, m)| match m {
            Message::Message {
                transactional,
                lsn,
                prefix,
                content,
            } => Some((transactional, lsn.to_string(), prefix, content)),
            _ => None,
        })
        .collect();
    assert_eq!(
        msgs,
        [
            (
                true,
                "0/1550ED8".to_owned(),
                "outbox".to_owned(),
                Bytes::from_static(b"hello, transactional")
            ),
            (
                false,
                "0/1550F48".to_owned(),
                "relay".to_owned(),
                Bytes::from_static(&[0x00, 0x01, 0x7f, 0x80, 0xff])
            ),
        ]
    );
}

#[test]
fn origin_follows_begin() {
    let msgs = decode_all("origin.txt");
    // pg_replication_origin_xact_setup('0/ABCDEF', '2024-01-02 03:04:09+00')
    let origin_time = 757_479_849_000_000; // microseconds since 2000-01-01 UTC
    let Message::Begin {
        commit_time_micros, ..
    } = msgs[0].1
    else {
        panic!("{:?}", msgs[0].1);
    };
    assert_eq!(commit_time_micros, origin_time);
    assert_eq!(
        msgs[1].1,
        Message::Origin {
            commit_lsn: Lsn(0xAB_CDEF),
            name: "fixture_origin".to_owned(),
        }
    );
}

// --------------------------------------------------------------- malformed

fn msg(parts: &[&[u8]]) -> Bytes {
    Bytes::from(parts.concat())
}

#[test]
fn empty_and_unknown_tag() {
    assert_eq!(
        decode(&Bytes::new()),
        Err(DecodeError::Truncated {
            what: "message tag",
            needed: 1,
            available: 0
        })
    );
    assert_eq!(
        decode(&msg(&[b"Z"])),
        Err(DecodeError::Unexpected {
            what: "message tag",
            found: b'Z'
        })
    );
    // Protocol v2 streaming start is not v1.
    assert_eq!(
        decode(&msg(&[b"S", &[0; 5]])),
        Err(DecodeError::Unexpected {
            what: "message tag",
            found: b'S'
        })
    );
}

#[test]
fn every_truncation_of_every_fixture_message_is_an_error() {
    for (name, text) in FIXTURES {
        for line in parse(text) {
            for len in 0..line.bytes.len() {
                let prefix = line.bytes.slice(..len);
                match decode(&prefix) {
                    Err(DecodeError::Truncated { .. } | DecodeError::MissingNul { .. }) => {}
                    other => panic!("{name} {} cut at {len}: {other:?}", line.lsn),
                }
            }
        }
    }
}

#[test]
fn every_fixture_message_with_an_extra_byte_is_trailing() {
    for (_, text) in FIXTURES {
        for line in parse(text) {
            let tag = char::from(line.bytes[0]);
            let longer = msg(&[&line.bytes, b"\0"]);
            assert_eq!(
                decode(&longer),
                Err(DecodeError::TrailingBytes { tag, remaining: 1 })
            );
        }
    }
}

#[test]
fn random_corruption_never_panics() {
    // xorshift, fixed seed: deterministic and dependency-free.
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for (_, text) in FIXTURES {
        for line in parse(text) {
            for _ in 0..200 {
                let mut bytes = line.bytes.to_vec();
                for _ in 0..1 + next() % 3 {
                    let at = usize::try_from(next()).unwrap() % bytes.len();
                    bytes[at] = match next() % 4 {
                        0 => 0xFF,
                        1 => 0x00,
                        2 => 0x80,
                        _ => (next() & 0xFF) as u8,
                    };
                }
                let _ = decode(&Bytes::from(bytes));
            }
        }
    }
}

#[test]
fn negative_counts_and_lengths() {
    let rel = 16384u32.to_be_bytes();
    // Insert with a column count of -1.
    assert_eq!(
        decode(&msg(&[b"I", &rel, b"N", &(-1i16).to_be_bytes()])),
        Err(DecodeError::NegativeLength {
            what: "tuple column count",
            value: -1
        })
    );
    // Text value with length -5.
    assert_eq!(
        decode(&msg(&[
            b"I",
            &rel,
            b"N",
            &1i16.to_be_bytes(),
            b"t",
            &(-5i32).to_be_bytes()
        ])),
        Err(DecodeError::NegativeLength {
            what: "text value length",
            value: -5
        })
    );
    assert_eq!(
        decode(&msg(&[
            b"I",
            &rel,
            b"N",
            &1i16.to_be_bytes(),
            b"b",
            &i32::MIN.to_be_bytes()
        ])),
        Err(DecodeError::NegativeLength {
            what: "binary value length",
            value: i32::MIN
        })
    );
    // Relation with a column count of -2.
    assert_eq!(
        decode(&msg(&[b"R", &rel, b"public\0t\0d", &(-2i16).to_be_bytes()])),
        Err(DecodeError::NegativeLength {
            what: "Relation column count",
            value: -2
        })
    );
    // Truncate with a relation count of -1.
    assert_eq!(
        decode(&msg(&[b"T", &(-1i32).to_be_bytes(), &[0]])),
        Err(DecodeError::NegativeLength {
            what: "Truncate relation count",
            value: -1
        })
    );
    // Message with content length -1.
    assert_eq!(
        decode(&msg(&[b"M", &[1], &[0; 8], b"p\0", &(-1i32).to_be_bytes()])),
        Err(DecodeError::NegativeLength {
            what: "Message content length",
            value: -1
        })
    );
}

#[test]
fn huge_counts_fail_without_allocating() {
    assert_eq!(
        decode(&msg(&[
            b"T",
            &i32::MAX.to_be_bytes(),
            &[0],
            &1u32.to_be_bytes()
        ])),
        Err(DecodeError::Truncated {
            what: "Truncate relation OID",
            needed: 4,
            available: 0
        })
    );
    assert_eq!(
        decode(&msg(&[
            b"I",
            &1u32.to_be_bytes(),
            b"N",
            &1i16.to_be_bytes(),
            b"t",
            &i32::MAX.to_be_bytes()
        ])),
        Err(DecodeError::Truncated {
            what: "text value",
            needed: i32::MAX as usize,
            available: 0
        })
    );
}

#[test]
fn trailing_bytes() {
    let (_, text) = FIXTURES[0];
    let begin = &parse(text)[0].bytes;
    let longer = msg(&[begin, b"xyz"]);
    let err = decode(&longer).unwrap_err();
    assert_eq!(
        err,
        DecodeError::TrailingBytes {
            tag: 'B',
            remaining: 3
        }
    );
    assert_eq!(
        err.to_string(),
        "3 trailing bytes after pgoutput 'B' message"
    );
}

#[test]
fn bad_tuple_and_value_kinds() {
    let rel = 1u32.to_be_bytes();
    let one_null = [&1i16.to_be_bytes()[..], b"n"].concat();
    assert_eq!(
        decode(&msg(&[b"I", &rel, b"K", &one_null])),
        Err(DecodeError::Unexpected {
            what: "Insert tuple kind ('N')",
            found: b'K'
        })
    );
    assert_eq!(
        decode(&msg(&[b"U", &rel, b"X", &one_null])),
        Err(DecodeError::Unexpected {
            what: "Update tuple kind ('K', 'O' or 'N')",
            found: b'X'
        })
    );
    assert_eq!(
        decode(&msg(&[b"U", &rel, b"K", &one_null, b"O", &one_null])),
        Err(DecodeError::Unexpected {
            what: "Update new tuple kind ('N')",
            found: b'O'
        })
    );
    assert_eq!(
        decode(&msg(&[b"D", &rel, b"N", &one_null])),
        Err(DecodeError::Unexpected {
            what: "Delete tuple kind ('K' or 'O')",
            found: b'N'
        })
    );
    assert_eq!(
        decode(&msg(&[b"I", &rel, b"N", &1i16.to_be_bytes(), b"x"])),
        Err(DecodeError::Unexpected {
            what: "tuple value kind ('n', 'u', 't' or 'b')",
            found: b'x'
        })
    );
    // Hand-made well-formed variants of the same shapes decode.
    assert_eq!(
        decode(&msg(&[b"D", &rel, b"O", &one_null])),
        Ok(Message::Delete {
            relation_id: 1,
            old: TupleData(vec![Value::Null])
        })
    );
    assert_eq!(
        decode(&msg(&[
            b"I",
            &rel,
            b"N",
            &2i16.to_be_bytes(),
            b"b",
            &2i32.to_be_bytes(),
            &[0xde, 0xad],
            b"u"
        ])),
        Ok(Message::Insert {
            relation_id: 1,
            new: TupleData(vec![
                Value::Binary(Bytes::from_static(&[0xde, 0xad])),
                Value::Unchanged
            ])
        })
    );
}

#[test]
fn bad_message_flags() {
    assert_eq!(
        decode(&msg(&[b"M", &[2], &[0; 8], b"p\0", &0i32.to_be_bytes()])),
        Err(DecodeError::Unexpected {
            what: "Message flags (0 or 1)",
            found: 2
        })
    );
}

#[test]
fn invalid_utf8_and_missing_nul_in_relation() {
    let msgs = load("outbox.txt");
    let relation = &msgs[1].bytes;
    assert_eq!(relation[0], b'R');
    // Layout: 'R', OID (4), "public\0", "outbox\0", ...
    let name_at = 1 + 4 + b"public\0".len();
    assert_eq!(&relation[name_at..name_at + 6], b"outbox");

    let mut bad = relation.to_vec();
    bad[name_at] = 0xFF;
    assert_eq!(
        decode(&Bytes::from(bad)),
        Err(DecodeError::InvalidUtf8 {
            what: "Relation name"
        })
    );

    let mut bad = relation.to_vec();
    bad[name_at + 1] = 0xC3; // start of a 2-byte sequence followed by ASCII
    assert_eq!(
        decode(&Bytes::from(bad)),
        Err(DecodeError::InvalidUtf8 {
            what: "Relation name"
        })
    );

    let no_nul = msg(&[b"R", &1u32.to_be_bytes(), b"public"]);
    assert_eq!(
        decode(&no_nul),
        Err(DecodeError::MissingNul {
            what: "Relation namespace"
        })
    );
}

#[test]
fn error_messages_name_the_problem() {
    let err = decode(&msg(&[b"B", &[0; 3]])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "pgoutput message truncated reading Begin final LSN: needed 8 bytes, 3 left"
    );
    assert_eq!(
        decode(&msg(&[b"Z"])).unwrap_err().to_string(),
        "unexpected byte 0x5A in pgoutput message reading message tag"
    );
}
