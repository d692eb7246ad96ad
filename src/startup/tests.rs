//! The start-up rules, each a table of cases over plain facts, with no server: a healthy
//! server, outbox table, publication, slot and lineage record, and one change per case.

use super::checks::{self, HASH_PROBE, Refused, Step, check};
use super::facts::{Facts, FleetSlot, PublicationFacts, ShardColumn, SiblingFilters, TableFacts};
use super::lineage::LineageFacts;
use super::*;
use crate::config::{Cli, Config};
use crate::outbox::Shard;
use crate::outbox::connect::ColumnFacts;
use crate::outbox::shard::hash_text;
use crate::pgoutput::{Column, Relation};
use crate::postgres::catalog::Server;
use crate::postgres::catalog::publication::{Options, OwnRow};
use crate::postgres::catalog::slots::Slot;
use crate::postgres::catalog::tables::{ColumnType, PrimaryKey, Table};
use crate::sink::lineage::{Reshard, SlotRecord, SlotState};

/// What the relay wants with `flags` on top of a URL.
fn wanted(flags: &[&str]) -> Wanted {
    let url = [
        "outbox-relay",
        "--postgres-url",
        "postgres://relay:pw@db:5432/app",
        "--kafka-brokers",
        "kafka:9092",
    ];
    let cli = Cli::try_parse_global_from([&url[..], flags].concat()).unwrap();
    Wanted::new(&Config::from_cli(&cli).unwrap())
}

const TEXT: u32 = 25;
const UUID: u32 = 2950;
const JSONB: u32 = 3802;
const TIMESTAMPTZ: u32 = 1184;

/// `public.outbox` as `tests/support/world.rs` creates it.
fn outbox() -> Table {
    let column = |name: &str, type_oid| Column {
        flags: 0,
        name: name.to_owned(),
        type_oid,
        type_modifier: -1,
    };
    Table {
        relation: Relation {
            id: 0,
            namespace: "public".into(),
            name: "outbox".into(),
            replica_identity: b'd',
            columns: vec![
                column("id", UUID),
                column("aggregate_type", TEXT),
                column("aggregate_id", TEXT),
                column("event_type", TEXT),
                column("payload", JSONB),
                column("created_at", TIMESTAMPTZ),
            ],
        },
        partitioned: false,
        unlogged: None,
    }
}

/// A built-in type whose output is immutable.
fn column_type(name: &str, oid: u32, output: &str, is_text: bool) -> ColumnType {
    ColumnType {
        name: name.to_owned(),
        oid,
        output: output.to_owned(),
        output_immutable: true,
        is_text,
        collation: "\"default\"".to_owned(),
        collation_oid: 100,
    }
}

/// A healthy server and slot for `wanted`, its tables as [`outbox`] with the facts `wanted`
/// reads, and the slot's creation recorded.
fn healthy(wanted: &Wanted) -> Facts {
    // Debezium's format reads every column's NOT NULL and DEFAULT (gather reads them then).
    let column_facts = match wanted
        .tables
        .first()
        .and_then(|t| t.mapping.connect.as_ref())
    {
        Some(_) => (outbox().relation.columns.iter())
            .map(|c| ColumnFacts {
                name: c.name.clone(),
                not_null: false,
                default: None,
            })
            .collect(),
        None => Vec::new(),
    };
    let table = TableFacts {
        found: Some(outbox()),
        column_facts,
        shard_columns: match wanted.shard {
            Some(_) => vec![
                ShardColumn {
                    flag: "--key-column",
                    column: "aggregate_id".into(),
                    found: Some(column_type("text", TEXT, "textout", true)),
                },
                ShardColumn {
                    flag: "--id-column",
                    column: "id".into(),
                    found: Some(column_type("uuid", UUID, "uuid_out", false)),
                },
            ],
            None => Vec::new(),
        },
        primary_key: wanted.cleanup_delete.then(|| PrimaryKey {
            columns: vec!["id".into()],
            may_delete: true,
        }),
    };
    let filters = checks::row_filters(
        &Facts {
            tables: vec![table.clone(); wanted.tables.len()],
            ..empty()
        },
        wanted,
    )
    .unwrap();
    let own_rows = (wanted.tables.iter().zip(&filters))
        .map(|(t, filter)| OwnRow {
            table: t.name.quoted(),
            oid: Some(10),
            filter: Some(filter.clone()),
        })
        .collect();
    Facts {
        tables: vec![table; wanted.tables.len()],
        publication: Some(PublicationFacts {
            options: options(),
            members: (wanted.tables.iter())
                .map(|t| (t.name.quoted(), vec![10]))
                .collect(),
            own_rows,
        }),
        slot: Some(Slot {
            unusable: None,
            confirmed_flush: Some("0/10".into()),
            failover: Some(true),
            active_pid: None,
        }),
        lineage: Some(LineageFacts {
            system_identifier: "7300".into(),
            record: Some(record(&wanted.slot, SlotState::Created)),
            legacy: None,
            unreadable: None,
            other_fleets: Vec::new(),
        }),
        ..empty()
    }
}

fn options() -> Options {
    Options {
        oid: 1,
        all_tables: false,
        inserts: true,
        deletes: false,
        via_root: true,
        server_version: 170_002,
    }
}

fn record(slot: &str, state: SlotState) -> SlotRecord {
    SlotRecord::now(slot, "7300", state, Some("0/10".into()))
}

/// A healthy server with nothing on it.
fn empty() -> Facts {
    Facts {
        server: Server {
            version_num: 170_002,
            version: "17.2".into(),
            in_recovery: false,
            wal_level: "logical".into(),
            can_replicate: true,
            idle_timeout_secs: 0,
            synchronized_standby_slots: Some("standby1".into()),
            probe_hash: hash_text(HASH_PROBE.as_bytes()),
        },
        tables: Vec::new(),
        publication: None,
        slot: None,
        siblings: Vec::new(),
        sibling_filters: Vec::new(),
        other_fleets: Vec::new(),
        lineage: None,
    }
}

/// One case: what `flags` want of facts changed by `change`, and the words of the first
/// refusal (empty: none).
struct Case {
    name: &'static str,
    flags: &'static [&'static str],
    change: fn(&mut Facts),
    refused: &'static str,
}

/// Runs each case; returns what each checked, for cases that look further.
fn run(cases: &[Case]) -> Vec<Checked> {
    let mut all = Vec::new();
    for case in cases {
        let wanted = wanted(case.flags);
        let mut facts = healthy(&wanted);
        (case.change)(&mut facts);
        let checked = check(&facts, &wanted);
        let first = checked.refusals.first().map(ToString::to_string);
        match (first, case.refused) {
            (None, "") => {}
            (Some(refused), words) if !words.is_empty() => {
                assert!(refused.contains(words), "{}: {refused}", case.name);
            }
            (first, _) => panic!("{}: {first:?}", case.name),
        }
        all.push(checked);
    }
    all
}

fn table(facts: &mut Facts) -> &mut Table {
    facts.tables[0].found.as_mut().unwrap()
}

fn publication(facts: &mut Facts) -> &mut PublicationFacts {
    facts.publication.as_mut().unwrap()
}

#[test]
fn a_healthy_start_refuses_nothing_and_refreshes_the_lineage() {
    let wanted = wanted(&[]);
    let checked = check(&healthy(&wanted), &wanted);
    assert_eq!(
        checked,
        Checked {
            refusals: Vec::new(),
            warnings: Vec::new(),
            steps: vec![Step::RefreshLineage],
        }
    );
}

#[test]
fn cleanup_needs_a_primary_a_publication_without_deletes_and_a_key_to_delete_by() {
    let delete = &["--cleanup", "delete"];
    run(&[
        Case {
            name: "a primary with a key",
            flags: delete,
            change: |_| {},
            refused: "",
        },
        Case {
            name: "a standby",
            flags: delete,
            change: |f| f.server.in_recovery = true,
            refused: "--cleanup delete: the server at postgres://relay:***@db:5432/app is a standby",
        },
        Case {
            name: "deletes published",
            flags: delete,
            change: |f| publication(f).options.deletes = true,
            refused: "publication \"outbox_relay\" publishes deletes",
        },
        Case {
            name: "no primary key",
            flags: delete,
            change: |f| f.tables[0].primary_key = Some(PrimaryKey::default()),
            refused: "table public.outbox has no primary key",
        },
        Case {
            name: "no right to delete",
            flags: delete,
            change: |f| f.tables[0].primary_key.as_mut().unwrap().may_delete = false,
            refused: "role \"relay\" may not DELETE from public.outbox; run GRANT DELETE",
        },
        Case {
            name: "checked before the server",
            flags: delete,
            change: |f| {
                f.server.in_recovery = true;
                f.server.wal_level = "replica".into();
            },
            refused: "--cleanup delete",
        },
    ]);
}

#[test]
fn the_server_must_be_14_logical_and_let_the_role_replicate() {
    run(&[
        Case {
            name: "13",
            flags: &[],
            change: |f| {
                f.server.version_num = 130_010;
                f.server.version = "13.10".into();
            },
            refused: "Postgres 13.10 is not supported: the relay needs PostgreSQL 14 or newer",
        },
        Case {
            name: "wal_level replica",
            flags: &[],
            change: |f| f.server.wal_level = "replica".into(),
            refused: "wal_level=\"replica\", but logical replication needs wal_level=logical",
        },
        Case {
            name: "no REPLICATION",
            flags: &[],
            change: |f| f.server.can_replicate = false,
            refused: "role \"relay\" lacks the REPLICATION attribute",
        },
        Case {
            name: "failover slots on 16",
            flags: &["--slot-failover"],
            change: |f| f.server.version_num = 160_004,
            refused: "--slot-failover needs PostgreSQL 17 or later",
        },
        Case {
            name: "a shard of tables on 14",
            flags: &["--shard", "0/2"],
            change: |f| f.server.version_num = 140_011,
            refused: "--shard 0/2 needs PostgreSQL 15 or later",
        },
        Case {
            name: "a shard of messages on 14",
            flags: &["--shard", "0/2", "--table", "none", "--message-prefix", "o"],
            change: |f| f.server.version_num = 140_011,
            refused: "",
        },
    ]);
}

#[test]
fn the_server_warns_of_an_idle_slot_timeout_and_of_failover_without_standby_slots() {
    let checked = run(&[
        Case {
            name: "idle timeout",
            flags: &[],
            change: |f| f.server.idle_timeout_secs = 86_400,
            refused: "",
        },
        Case {
            name: "no synchronized standby slots",
            flags: &["--slot-failover"],
            change: |f| f.server.synchronized_standby_slots = Some(" ".into()),
            refused: "",
        },
        Case {
            name: "16 has no such setting",
            flags: &[],
            change: |f| f.server.synchronized_standby_slots = None,
            refused: "",
        },
    ]);
    let warnings: Vec<&[String]> = checked.iter().map(|c| &c.warnings[..]).collect();
    assert!(
        warnings[0][0].contains("idle_replication_slot_timeout is 1day"),
        "{warnings:?}"
    );
    assert!(
        warnings[1][0].contains("synchronized_standby_slots is empty"),
        "{warnings:?}"
    );
    assert!(warnings[2].is_empty(), "{warnings:?}");
}

#[test]
fn each_table_must_exist_fit_the_format_have_the_columns_and_write_wal() {
    run(&[
        Case {
            name: "missing",
            flags: &[],
            change: |f| f.tables[0].found = None,
            refused: "outbox table public.outbox does not exist (check --table",
        },
        Case {
            name: "a column missing",
            flags: &["--key-column", "aggregateid"],
            change: |_| {},
            refused: "outbox table public.outbox has no column \"aggregateid\" (named by \
                      --key-column); its columns are: id, aggregate_type, aggregate_id",
        },
        Case {
            name: "unlogged",
            flags: &[],
            change: |f| table(f).unlogged = Some("outbox_p1".into()),
            refused: "outbox_p1 is UNLOGGED",
        },
        Case {
            name: "a format Debezium cannot reproduce",
            flags: &["--key-converter", "bytearray"],
            change: |_| {},
            refused: "ByteArrayConverter takes only bytea",
        },
        Case {
            name: "the publication's rules wait for the tables",
            flags: &[],
            change: |f| {
                f.tables[0].found = None;
                publication(f).options.inserts = false;
            },
            refused: "does not exist",
        },
    ]);
}

#[test]
fn a_shards_key_and_id_columns_must_be_hashable_by_a_row_filter() {
    let shard = &["--shard", "0/2"];
    fn key(f: &mut Facts) -> &mut ColumnType {
        f.tables[0].shard_columns[0].found.as_mut().unwrap()
    }
    run(&[
        Case {
            name: "text and uuid",
            flags: shard,
            change: |_| {},
            refused: "",
        },
        Case {
            name: "a key column missing",
            flags: shard,
            change: |f| f.tables[0].shard_columns[0].found = None,
            refused: "outbox table public.outbox has no column \"aggregate_id\" (named by \
                      --key-column)",
        },
        Case {
            name: "a domain",
            flags: shard,
            change: |f| {
                key(f).oid = 16_500;
                key(f).name = "order_key".into();
            },
            refused: "has the user-defined type order_key (a domain or an extension's)",
        },
        Case {
            name: "a user-defined collation",
            flags: shard,
            change: |f| {
                key(f).collation_oid = 16_501;
                key(f).collation = "de_phonebook".into();
            },
            refused: "has the user-defined collation de_phonebook",
        },
        Case {
            name: "a mutable output",
            flags: shard,
            change: |f| {
                *key(f) = column_type(
                    "timestamp with time zone",
                    TIMESTAMPTZ,
                    "timestamptz_out",
                    false,
                );
                key(f).output_immutable = false;
            },
            refused: "whose output function timestamptz_out is not immutable",
        },
    ]);
    // Text is hashed as itself, other types through their output function.
    let wanted = wanted(shard);
    let filters = checks::row_filters(&healthy(&wanted), &wanted).unwrap();
    assert!(
        filters[0].contains("COALESCE(\"aggregate_id\", textin(uuid_out(\"id\")), '')"),
        "{filters:?}"
    );
}

#[test]
fn the_publication_must_publish_inserts_through_the_root_and_cover_every_table() {
    run(&[
        Case {
            name: "no inserts",
            flags: &[],
            change: |f| publication(f).options.inserts = false,
            refused: "publication \"outbox_relay\" does not publish inserts; run ALTER \
                      PUBLICATION \"outbox_relay\" SET (publish = 'insert')",
        },
        Case {
            name: "a partitioned table, not through the root",
            flags: &[],
            change: |f| {
                table(f).partitioned = true;
                publication(f).options.via_root = false;
            },
            refused: "lacks publish_via_partition_root, so rows of the partitioned outbox \
                      table public.outbox",
        },
        Case {
            name: "a plain table, not through the root",
            flags: &[],
            change: |f| publication(f).options.via_root = false,
            refused: "",
        },
        Case {
            name: "a table not covered",
            flags: &[],
            change: |f| publication(f).members[0].1.clear(),
            refused: "does not include public.outbox; run ALTER PUBLICATION \"outbox_relay\" \
                      ADD TABLE \"public\".\"outbox\";",
        },
    ]);
}

#[test]
fn a_missing_publication_is_created_with_the_shards_filters_except_on_a_standby() {
    let checked = run(&[
        Case {
            name: "created",
            flags: &["--shard", "0/2"],
            change: |f| f.publication = None,
            refused: "",
        },
        Case {
            name: "on a standby",
            flags: &[],
            change: |f| {
                f.publication = None;
                f.server.in_recovery = true;
            },
            refused: "publication \"outbox_relay\" does not exist, and this server is a hot \
                      standby, where nothing can be created; create it on the primary",
        },
    ]);
    let Step::CreatePublication(statement) = &checked[0].steps[0] else {
        panic!("{:?}", checked[0].steps);
    };
    assert!(
        statement.starts_with(
            "CREATE PUBLICATION \"outbox_relay_shard_0_of_2\" FOR TABLE \
                               \"public\".\"outbox\" WHERE ((hashtextextended("
        ),
        "{statement}"
    );
}

#[test]
fn a_shard_needs_the_servers_hash_and_a_publication_with_its_own_row_filters() {
    let shard = &["--shard", "0/2"];
    run(&[
        Case {
            name: "another hash",
            flags: &["--shard", "0/2", "--table", "none", "--message-prefix", "o"],
            change: |f| f.server.probe_hash = 42,
            refused: "--shard 0/2: the server hashes text differently from the relay",
        },
        Case {
            name: "another hash, the publication to be created",
            flags: shard,
            change: |f| {
                f.server.probe_hash = 42;
                f.publication = None;
            },
            refused: "hashes text differently",
        },
        Case {
            name: "for all tables",
            flags: shard,
            change: |f| publication(f).options.all_tables = true,
            refused: "is FOR ALL TABLES, which cannot carry a row filter, so shard 0/2 would \
                      receive every shard's rows. Run ALTER PUBLICATION",
        },
        Case {
            name: "no filter",
            flags: shard,
            change: |f| publication(f).own_rows[0].filter = None,
            refused: "outbox table public.outbox has no row filter",
        },
        Case {
            name: "another shard's filter",
            flags: shard,
            change: |f| publication(f).own_rows[0].filter = Some("true".into()),
            refused: "has the row filter (true), not shard 0/2's",
        },
        Case {
            name: "another shard of the same K",
            flags: &["--shard", "0/2"],
            change: |f| {
                let other = Shard { index: 1, count: 2 };
                let filter = other.row_filter("\"aggregate_id\"", "textin(uuid_out(\"id\"))");
                publication(f).own_rows[0].filter = Some(filter);
            },
            refused: "not shard 0/2's, so it would not send shard 0/2 exactly its rows. Run ALTER",
        },
        Case {
            name: "a sibling hashing what this shard hashes",
            flags: &["--shard", "0/2"],
            change: |f| f.sibling_filters.push(sibling("aggregate_id")),
            refused: "",
        },
        Case {
            name: "a sibling hashing another key column",
            flags: &["--shard", "0/2"],
            change: |f| f.sibling_filters.push(sibling("customer_id")),
            refused: "--shard 0/2 would hash other columns of outbox table public.outbox than \
                      shard 1/2 of the same fleet, whose publication \"outbox_relay_shard_1_of_2\"",
        },
        Case {
            name: "another key column: a resharding",
            flags: &["--shard", "0/2"],
            change: |f| {
                let shard = Shard { index: 0, count: 2 };
                let filter = shard.row_filter("\"customer_id\"", "textin(uuid_out(\"id\"))");
                publication(f).own_rows[0].filter = Some(filter);
            },
            refused: "is sharded by another key or id column than --key-column/--id-column say \
                      now",
        },
        Case {
            name: "also through a schema",
            flags: shard,
            change: |f| publication(f).members[0].1.push(11),
            refused: "is also published through a schema or a parent table",
        },
        Case {
            name: "a table-less shard's publication carries no filter",
            flags: &["--shard", "0/2", "--table", "none", "--message-prefix", "o"],
            change: |f| publication(f).options.all_tables = true,
            refused: "",
        },
    ]);
}

#[test]
fn the_slot_must_be_usable_and_a_lost_one_is_never_replaced_silently() {
    let checked = run(&[
        Case {
            name: "physical",
            flags: &[],
            change: |f| f.slot.as_mut().unwrap().unusable = Some("is a physical slot".into()),
            refused: "replication slot \"outbox_relay\" is a physical slot; the relay needs a \
                      logical pgoutput slot in database \"app\"",
        },
        Case {
            name: "invalidated",
            flags: &[],
            change: |f| f.slot.as_mut().unwrap().confirmed_flush = None,
            refused: "replication slot \"outbox_relay\": it has no confirmed position",
        },
        Case {
            name: "lost",
            flags: &[],
            change: |f| f.slot = None,
            refused: "replication slot \"outbox_relay\" is missing on \
                      postgres://relay:***@db:5432/app, where this relay has streamed from it \
                      before (recorded in Kafka topic \"outbox-relay.lineage\"",
        },
        Case {
            name: "lost, recorded by an older relay",
            flags: &[],
            change: |f| {
                f.slot = None;
                let lineage = f.lineage.as_mut().unwrap();
                lineage.record = None;
                lineage.legacy = Some("2025-01-01".into());
            },
            refused: "recorded in public.outbox_relay_slots at 2025-01-01",
        },
        Case {
            name: "lost, replaced with consent",
            flags: &["--allow-new-slot"],
            change: |f| f.slot = None,
            refused: "",
        },
        Case {
            name: "a first start",
            flags: &["--slot-failover"],
            change: |f| {
                f.slot = None;
                f.lineage.as_mut().unwrap().record = None;
            },
            refused: "",
        },
        Case {
            name: "after drop-slot",
            flags: &[],
            change: |f| {
                f.slot = None;
                let dropped = record("outbox_relay", SlotState::Dropped);
                f.lineage.as_mut().unwrap().record = Some(dropped);
            },
            refused: "",
        },
        Case {
            name: "made by setup or by hand",
            flags: &[],
            change: |f| f.lineage.as_mut().unwrap().record = None,
            refused: "",
        },
        Case {
            name: "to be marked for failover",
            flags: &["--slot-failover"],
            change: |f| f.slot.as_mut().unwrap().failover = Some(false),
            refused: "",
        },
        Case {
            name: "status reads no lineage: a missing slot is no refusal there",
            flags: &[],
            change: |f| {
                f.slot = None;
                f.lineage = None;
            },
            refused: "",
        },
    ]);
    let steps: Vec<&[Step]> = checked.iter().map(|c| &c.steps[..]).collect();
    let create = |failover| [Step::CreateSlot { failover }, Step::RecordLineage];
    assert!(checked[4].warnings[0].contains("--allow-new-slot: creating a fresh slot"));
    assert_eq!(steps[4], create(false));
    assert_eq!(steps[5], create(true));
    assert_eq!(steps[6], create(false));
    assert_eq!(steps[7], [Step::RecordLineage]);
    assert_eq!(steps[8], [Step::RefreshLineage, Step::MarkFailover]);
}

/// Issue 32: a lineage record the relay cannot parse is written over where the slot exists,
/// refused with the way to clear it where the slot is missing, unless --allow-new-slot.
#[test]
fn an_unreadable_lineage_record_is_written_over_or_refused_with_its_remedy() {
    fn unreadable(f: &mut Facts) {
        let lineage = f.lineage.as_mut().unwrap();
        lineage.record = None;
        lineage.unreadable = Some("not one the relay writes; drop-slot --yes-i-know".into());
    }
    let checked = run(&[
        Case {
            name: "the slot exists",
            flags: &[],
            change: unreadable,
            refused: "",
        },
        Case {
            name: "the slot is missing",
            flags: &[],
            change: |f| {
                unreadable(f);
                f.slot = None;
            },
            refused: "not one the relay writes; drop-slot --yes-i-know",
        },
        Case {
            name: "the slot is missing, replaced with consent",
            flags: &["--allow-new-slot"],
            change: |f| {
                unreadable(f);
                f.slot = None;
            },
            refused: "",
        },
    ]);
    assert_eq!(checked[0].steps, [Step::RecordLineage]);
    assert!(
        checked[0].warnings[0].contains("writes its record again"),
        "{:?}",
        checked[0].warnings
    );
    assert!(matches!(checked[1].refusals[..], [Refused::Lineage(_)]));
    let create = [Step::CreateSlot { failover: false }, Step::RecordLineage];
    assert_eq!(checked[2].steps, create);
    assert!(
        checked[2].warnings[0].contains("--allow-new-slot"),
        "{:?}",
        checked[2].warnings
    );
}

#[test]
fn a_shard_created_after_its_siblings_is_warned_of_the_rows_in_no_slot() {
    let sharded = wanted(&["--shard", "1/3"]);
    assert_eq!(
        checks::sibling_slots(&sharded),
        ["outbox_relay_shard_0_of_3", "outbox_relay_shard_2_of_3"]
    );
    assert!(checks::sibling_slots(&wanted(&[])).is_empty());
    let siblings = ["outbox_relay_shard_0_of_3".to_owned()];
    let warning = checks::late_shard(&sharded, &siblings, Lsn(0x20)).unwrap();
    for needle in [
        "shard 1/3's slot was created at 0/20",
        "(outbox_relay_shard_0_of_3)",
        "outbox-relay backfill --shard 1/3 --since",
    ] {
        assert!(warning.contains(needle), "{needle}: {warning}");
    }
    assert_eq!(checks::late_shard(&sharded, &[], Lsn(0x20)), None);
    assert_eq!(checks::late_shard(&wanted(&[]), &siblings, Lsn(0x20)), None);
}

/// Shard 1/2's publication, hashing `key` and the id.
fn sibling(key: &str) -> SiblingFilters {
    let shard = Shard { index: 1, count: 2 };
    let filter = shard.row_filter(&format!("\"{key}\""), "textin(uuid_out(\"id\"))");
    SiblingFilters {
        shard,
        publication: "outbox_relay_shard_1_of_2".into(),
        filters: vec![Some(filter)],
    }
}

/// Slots of another fleet, by name, as gathering finds them.
fn fleet_slots(names: &[&str]) -> Vec<FleetSlot> {
    let of = |name: &&str| FleetSlot {
        slot: (*name).to_owned(),
        shard: Shard::of_name("outbox_relay", name).unwrap(),
    };
    names.iter().map(of).collect()
}

/// A lineage record of `slot` in `state`, written by `reshard --from from --to to` if given.
fn reshard_record(slot: &str, state: SlotState, reshard: Option<(u32, u32)>) -> SlotRecord {
    let reshard = reshard.map(|(from, to)| Reshard { from, to });
    record(slot, state).resharding(reshard)
}

/// A slot's last lineage record in a fleet case: its state, and the resharding `(from, to)`
/// that wrote it, if one did.
type Recorded = Option<(SlotState, Option<(u32, u32)>)>;

/// One case of the fleet rule: a relay with `flags` (and `resharding`, as `reshard` sets
/// it), the other fleets' slots with their records, its own record; the words of the
/// refusal, else of the warning (empty: neither).
struct FleetCase {
    name: &'static str,
    flags: &'static [&'static str],
    resharding: Option<(u32, u32)>,
    others: &'static [(&'static str, Recorded)],
    own: Recorded,
    lineage_read: bool,
    refused: &'static [&'static str],
    warned: &'static [&'static str],
}

#[test]
fn a_fleet_of_another_shard_count_is_refused_unless_a_resharding_put_it_there() {
    use SlotState::{Created, Dropped};
    const CREATED: Recorded = Some((Created, None));
    let cases = [
        FleetCase {
            name: "one fleet",
            flags: &["--shard", "1/3"],
            resharding: None,
            others: &[],
            own: CREATED,
            lineage_read: true,
            refused: &[],
            warned: &[],
        },
        FleetCase {
            name: "0/2 running, 1/3 started",
            flags: &["--shard", "1/3"],
            resharding: None,
            others: &[("outbox_relay_shard_0_of_2", CREATED)],
            own: None,
            lineage_read: true,
            refused: &[
                "shard 1/3 (slot \"outbox_relay_shard_1_of_3\")",
                "\"outbox_relay_shard_0_of_2\" (K = 2)",
                "never relayed and others are relayed twice",
                "outbox-relay reshard --from 2 --to 3",
                "outbox-relay drop-slot",
            ],
            warned: &[],
        },
        FleetCase {
            name: "an unsharded relay beside shards",
            flags: &[],
            resharding: None,
            others: &[("outbox_relay_shard_0_of_2", None)],
            own: CREATED,
            lineage_read: true,
            refused: &[
                "this relay without --shard (slot \"outbox_relay\")",
                "outbox-relay reshard --from 2 --to 1",
            ],
            warned: &[],
        },
        FleetCase {
            name: "status, without the lineage",
            flags: &["--shard", "1/3"],
            resharding: None,
            others: &[("outbox_relay_shard_0_of_2", None)],
            own: None,
            lineage_read: false,
            refused: &[],
            warned: &[
                "\"outbox_relay_shard_0_of_2\" (K = 2)",
                "unless `outbox-relay reshard`",
            ],
        },
        FleetCase {
            name: "an old shard restarted while resharding 2 -> 4",
            flags: &["--shard", "0/2"],
            resharding: None,
            others: &[
                ("outbox_relay_shard_0_of_4", Some((Created, Some((2, 4))))),
                ("outbox_relay_shard_1_of_4", Some((Created, Some((2, 4))))),
            ],
            own: CREATED,
            lineage_read: true,
            refused: &[],
            warned: &[
                "`outbox-relay reshard --from 2 --to 4` is under way",
                "--finish",
            ],
        },
        FleetCase {
            name: "reshard creating the new slots beside the old",
            flags: &["--shard", "1/4"],
            resharding: Some((2, 4)),
            others: &[("outbox_relay_shard_0_of_2", CREATED)],
            own: None,
            lineage_read: true,
            refused: &[],
            warned: &[],
        },
        FleetCase {
            name: "a new shard started before --finish",
            flags: &["--shard", "1/4"],
            resharding: None,
            others: &[("outbox_relay_shard_0_of_2", CREATED)],
            own: Some((Created, Some((2, 4)))),
            lineage_read: true,
            refused: &[
                "new shard of `outbox-relay reshard --from 2 --to 4`, which is not finished",
                "run `outbox-relay reshard --from 2 --to 4 --finish`",
            ],
            warned: &[],
        },
        FleetCase {
            name: "an old shard after --finish, the new records not cleared yet",
            flags: &["--shard", "0/2"],
            resharding: None,
            others: &[("outbox_relay_shard_0_of_4", Some((Created, Some((2, 4)))))],
            own: Some((Dropped, Some((2, 4)))),
            lineage_read: true,
            refused: &[
                "shard 0/2 (slot \"outbox_relay_shard_0_of_2\") was retired by \
                 `outbox-relay reshard --from 2 --to 4 --finish`",
                "Run the 4 new relays",
            ],
            warned: &[],
        },
        FleetCase {
            name: "slots of a resharding to another count",
            flags: &["--shard", "0/2"],
            resharding: None,
            others: &[("outbox_relay_shard_0_of_4", Some((Created, Some((3, 4)))))],
            own: CREATED,
            lineage_read: true,
            refused: &["outbox-relay reshard --from 4 --to 2"],
            warned: &[],
        },
        FleetCase {
            name: "an old shard after 2 -> 4 -> 2, its name used again",
            flags: &["--shard", "0/2"],
            resharding: Some((4, 2)),
            others: &[("outbox_relay_shard_0_of_4", CREATED)],
            own: Some((Dropped, Some((2, 4)))),
            lineage_read: true,
            refused: &[],
            warned: &[],
        },
    ];
    for case in cases {
        let mut wanted = wanted(case.flags);
        wanted.resharding = case.resharding.map(|(from, to)| Reshard { from, to });
        let mut facts = healthy(&wanted);
        let names: Vec<&str> = case.others.iter().map(|(name, _)| *name).collect();
        facts.other_fleets = fleet_slots(&names);
        let lineage = facts.lineage.as_mut().unwrap();
        lineage.record = case
            .own
            .map(|(state, by)| reshard_record(&wanted.slot, state, by));
        for (name, record) in case.others {
            if let Some((state, by)) = record {
                lineage.other_fleets.push(reshard_record(name, *state, *by));
            }
        }
        if !case.lineage_read {
            facts.lineage = None;
        }
        let checked = check(&facts, &wanted);
        let refused: Vec<String> = checked.refusals.iter().map(ToString::to_string).collect();
        let refused = refused.join("\n");
        let warned = checked.warnings.join("\n");
        if case.refused.is_empty() {
            assert!(refused.is_empty(), "{}: refused {refused}", case.name);
        }
        for words in case.refused {
            assert!(
                refused.contains(words),
                "{}: {words:?} in {refused}",
                case.name
            );
        }
        for words in case.warned {
            assert!(
                warned.contains(words),
                "{}: {words:?} in {warned}",
                case.name
            );
        }
        if case.warned.is_empty() && case.refused.is_empty() {
            assert!(warned.is_empty(), "{}: warned {warned}", case.name);
        }
    }
}

#[test]
fn setup_prints_the_publication_and_the_slot_it_would_create() {
    let tables = wanted(&[]).table_names();
    let steps = checks::setup_steps("p", &tables, &[], true);
    let sql: Vec<String> = steps.iter().filter_map(|s| s.sql("s")).collect();
    assert_eq!(
        sql,
        [
            "CREATE PUBLICATION \"p\" FOR TABLE \"public\".\"outbox\" WITH (publish = 'insert', \
             publish_via_partition_root = true)",
            "SELECT slot_name::text, lsn::text FROM pg_create_logical_replication_slot('s', \
             'pgoutput', false, false, true)",
        ]
    );
}

#[test]
fn only_an_outage_is_worth_waiting_out() {
    let refused = StartupError::Refused(Refused::Misconfigured("no".into()));
    let no_host = StartupError::Postgres(PostgresError::NoSuitableHost {
        attrs: "read-write",
        tried: "db1:5432: a standby".into(),
    });
    let tls = StartupError::Postgres(PostgresError::Tls(
        crate::postgres::TlsError::IncompleteClientCert,
    ));
    assert!(!refused.transient());
    assert!(no_host.transient());
    assert!(!tls.transient());
}

/// What `peekable` answers: the confirmed position, or words its refusal contains.
type PeekAnswer = Result<&'static str, &'static [&'static str]>;

#[test]
fn peek_reads_a_slot_by_the_rules_start_up_has_for_a_found_one() {
    let healthy = Slot {
        unusable: None,
        confirmed_flush: Some("0/10".into()),
        failover: None,
        active_pid: None,
    };
    let missing: Option<Slot> = None;
    let streamed = Slot {
        active_pid: Some(4242),
        ..healthy.clone()
    };
    let physical = Slot {
        unusable: Some("is a physical slot".into()),
        ..healthy.clone()
    };
    let lost = Slot {
        confirmed_flush: None,
        ..healthy.clone()
    };
    let cases: [(&str, Option<&Slot>, PeekAnswer); 5] = [
        ("healthy", Some(&healthy), Ok("0/10")),
        (
            "missing",
            missing.as_ref(),
            Err(&[
                "\"s\" does not exist",
                "nothing is pending",
                "outbox-relay setup",
            ]),
        ),
        (
            "streamed from",
            Some(&streamed),
            Err(&["in use by server process 4242", "stop the relay first"]),
        ),
        (
            "physical",
            Some(&physical),
            Err(&[
                "is a physical slot",
                "logical pgoutput slot in database \"app\"",
            ]),
        ),
        ("lost its WAL", Some(&lost), Err(&["no confirmed position"])),
    ];
    for (case, found, expected) in cases {
        let got = checks::peekable("s", "app", found, "stop the relay first");
        match (got, expected) {
            (Ok(lsn), Ok(want)) => assert_eq!(lsn.to_string(), want, "{case}"),
            (Err(text), Err(needles)) => {
                for needle in needles {
                    assert!(text.contains(needle), "{case}: {needle}: {text}");
                }
            }
            (got, _) => panic!("{case}: {got:?}"),
        }
    }
}
