//! The control connection (an ordinary one, to the server `--postgres-url`'s
//! `target_session_attrs` picks) and what runs over it: the start-up checks,
//! the publication and the slot, and the look-ups later checks repeat.
//!
//! The start-up checks run before streaming starts, so a misconfiguration stops
//! the relay with one clear message instead of a stream that never delivers.

use tokio_postgres::Client;

use super::{SourceError, lineage, tls};
use crate::config::{Config, PostgresConnInfo, TargetSessionAttrs};
use crate::lsn::Lsn;
use crate::outbox::{TableName, quote_ident};
use crate::pgoutput::{Column, Relation};

/// The oldest PostgreSQL major version the relay supports (`server_version_num / 10000`).
const MIN_SERVER_MAJOR: i32 = 14;

/// What start-up learned about the slot.
#[derive(Debug, Clone)]
pub struct SlotState {
    /// The slot's confirmed position: streaming resumes here.
    pub confirmed_flush: Lsn,
    /// Whether this run created the slot.
    pub created: bool,
    /// The publication as found at start-up, before the stream starts: later
    /// checks compare against it.
    pub publication: Publication,
}

/// The publication as found: what a later look must find unchanged.
/// PostgreSQL 18's pgoutput skips a missing publication with only a warning,
/// and on every version rows inserted while a table is out of the
/// publication are never decoded, so the relay must look for itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Publication {
    /// A dropped and re-created publication has another OID.
    pub oid: u32,
    /// `FOR ALL TABLES`, where relations other than the outbox tables are
    /// expected (and skipped) rather than a misconfiguration.
    pub all_tables: bool,
    /// `server_version_num`.
    pub server_version: i32,
    /// Per outbox table, the OIDs of the catalog rows that publish it
    /// (`pg_publication_rel` of it or an ancestor, `pg_publication_namespace`
    /// of their schemas): a table dropped and added again has new ones.
    pub members: Vec<(String, Vec<u32>)>,
}

impl Publication {
    /// Why `self`, found now, shows rows skipped since `earlier` was found.
    pub fn changed_since(&self, earlier: &Publication, name: &str) -> Option<SourceError> {
        if self.oid != earlier.oid {
            return Some(SourceError::PublicationDropped {
                publication: name.to_owned(),
                what: "was dropped and re-created",
            });
        }
        let (table, _) = self
            .members
            .iter()
            .find(|member| !earlier.members.contains(member))?;
        Some(SourceError::PublicationTableReAdded {
            publication: name.to_owned(),
            table: table.clone(),
        })
    }
}

/// Opens the control connection, with the TLS settings of `--postgres-url`
/// (libpq's `sslmode` meanings; see `source::tls`), to the server [`locate`] chooses.
pub async fn connect(config: &Config) -> Result<Client, SourceError> {
    locate(config).await.map(|(client, _)| client)
}

/// Connects to the first server of `--postgres-url` that satisfies its
/// `target_session_attrs` and returns the settings pinned to it, so that the
/// replication connection goes to the same server. Every (re)connect asks
/// again: after a promotion the new primary is found without a restart.
pub async fn locate(config: &Config) -> Result<(Client, PostgresConnInfo), SourceError> {
    let pg = &config.postgres;
    let attrs = pg.target_session_attrs;
    if pg.hosts.len() <= 1 && attrs == TargetSessionAttrs::Any {
        return Ok((connect_to(pg).await?, pg.clone()));
    }
    let mut tried = Vec::new();
    // prefer-standby: a standby on the first pass, any server on the second.
    let passes: &[bool] = match attrs {
        TargetSessionAttrs::PreferStandby => &[true, false],
        _ => &[false],
    };
    for &strict in passes {
        for (host, port) in &pg.hosts {
            let pinned = pg.pinned(host, *port);
            let client = match connect_to(&pinned).await {
                Ok(client) => client,
                Err(e) if pg.hosts.len() == 1 => return Err(e),
                Err(e) => {
                    tried.push(format!("{host}:{port}: {e}"));
                    continue;
                }
            };
            let row = query_one(
                &client,
                "probe the server's role",
                "SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'",
                &[],
            )
            .await?;
            let (in_recovery, read_only) = row.map_or((false, false), |r| (r.get(0), r.get(1)));
            if attrs.accepts(in_recovery, read_only, strict) {
                return Ok((client, pinned));
            }
            let state = if in_recovery {
                "a standby"
            } else {
                "read-only"
            };
            tried.push(format!("{host}:{port}: {state}"));
        }
    }
    Err(SourceError::NoSuitableHost {
        attrs: attrs.as_str(),
        tried: tried.join("; "),
    })
}

/// `config` with its Postgres settings pinned to the server [`locate`] chooses
/// (unchanged, without connecting, for one host and `target_session_attrs=any`).
pub async fn pin(config: &Config) -> Result<Config, SourceError> {
    let pg = &config.postgres;
    if pg.hosts.len() <= 1 && pg.target_session_attrs == TargetSessionAttrs::Any {
        return Ok(config.clone());
    }
    let (_, postgres) = locate(config).await?;
    Ok(Config {
        postgres,
        ..config.clone()
    })
}

/// One server's control connection.
async fn connect_to(pg: &PostgresConnInfo) -> Result<Client, SourceError> {
    let mut cfg = tokio_postgres::Config::new();
    cfg.host(&pg.host)
        .port(pg.port)
        .user(&pg.user)
        .dbname(&pg.dbname)
        .application_name(pg.application_name.as_deref().unwrap_or("outbox-relay"))
        .connect_timeout(std::time::Duration::from_secs(10));
    if let Some(password) = &pg.password {
        cfg.password(password);
    }
    let (ssl_mode, connector) = tls::control_tls(pg)?;
    cfg.ssl_mode(ssl_mode);
    let (client, connection) =
        cfg.connect(connector)
            .await
            .map_err(|source| match rustls_error(&source) {
                Some(tls_error) => SourceError::TlsHandshake {
                    url: pg.redacted(),
                    reason: super::pg_error_text(&source),
                    hint: tls::handshake_hint(tls_error),
                    source,
                },
                None => SourceError::Connect {
                    url: pg.redacted(),
                    reason: super::pg_error_text(&source),
                    source,
                },
            })?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "control connection closed");
        }
    });
    Ok(client)
}

/// The rustls error behind a failed connection, if the TLS handshake failed
/// (tokio-rustls reports it as an `io::Error` wrapping the `rustls::Error`).
fn rustls_error(error: &tokio_postgres::Error) -> Option<&rustls::Error> {
    let io = std::error::Error::source(error)?.downcast_ref::<std::io::Error>()?;
    io.get_ref()?.downcast_ref::<rustls::Error>()
}

/// Runs every start-up check, creates what is missing, and returns the slot's position.
pub async fn prepare(client: &Client, config: &Config) -> Result<SlotState, SourceError> {
    let server = check_server(client, &config.postgres.user).await?;
    let mut partitioned = Vec::new();
    for table in &config.tables {
        if check_table(client, config, table).await? {
            partitioned.push(table);
        }
    }
    let publication = match verify_publication(client, config, &partitioned).await {
        Err(SourceError::PublicationDropped { .. }) => {
            create_publication(client, config, server.in_recovery).await?;
            verify_publication(client, config, &partitioned).await?
        }
        found => found?,
    };
    warn_idle_slot_timeout(client).await?;
    let (confirmed_flush, created) = ensure_slot(client, config, &server).await?;
    Ok(SlotState {
        confirmed_flush,
        created,
        publication,
    })
}

/// What start-up learned about the server.
pub(super) struct Server {
    /// `server_version_num`.
    pub(super) version_num: i32,
    /// `server_version`, for messages.
    pub(super) version: String,
    /// A standby, where nothing can be written.
    in_recovery: bool,
}

/// The server's version, `wal_level` and the role's right to replicate, in one
/// look. Versions before 14 lack pgoutput's `messages` option (the stream would
/// fail at START_REPLICATION): say so once instead.
async fn check_server(client: &Client, user: &str) -> Result<Server, SourceError> {
    let row = client
        .query_one(
            "SELECT current_setting('server_version_num')::int, current_setting('server_version'), \
                    pg_is_in_recovery(), current_setting('wal_level'), \
                    r.rolsuper OR r.rolreplication OR EXISTS (SELECT 1 FROM pg_roles g \
                        WHERE g.rolname = 'rds_replication' \
                          AND pg_has_role(current_user, g.oid, 'member')) \
             FROM pg_roles r WHERE r.rolname = current_user",
            &[],
        )
        .await
        .map_err(query_err("read the server's version and settings"))?;
    let server = Server {
        version_num: row.get(0),
        version: row.get(1),
        in_recovery: row.get(2),
    };
    let (wal_level, may_replicate): (String, bool) = (row.get(3), row.get(4));
    if server.version_num / 10000 < MIN_SERVER_MAJOR {
        return Err(SourceError::ServerTooOld {
            version: server.version,
            minimum: MIN_SERVER_MAJOR,
        });
    }
    if wal_level != "logical" {
        return Err(SourceError::WalLevel { actual: wal_level });
    }
    if !may_replicate {
        return Err(SourceError::NoReplicationPrivilege {
            user: user.to_owned(),
        });
    }
    Ok(server)
}

/// PostgreSQL 18's `idle_replication_slot_timeout` drops the slot of a relay
/// stopped for longer (at a checkpoint): the operator should know at start-up.
async fn warn_idle_slot_timeout(client: &Client) -> Result<(), SourceError> {
    use super::slot_monitor;
    use crate::observability::health;
    let row = query_one(
        client,
        "read idle_replication_slot_timeout",
        slot_monitor::IDLE_TIMEOUT_QUERY,
        &[],
    )
    .await?;
    let secs = row.and_then(|r| r.get::<_, Option<i64>>(0)).unwrap_or(0);
    if let Some(warning) = health::idle_timeout_warning(u64::try_from(secs).unwrap_or(0)) {
        tracing::warn!("{warning}");
    }
    Ok(())
}

/// Names a failed control-connection query by what it was for.
pub(crate) fn query_err(what: &'static str) -> impl Fn(tokio_postgres::Error) -> SourceError {
    move |source| SourceError::Query { what, source }
}

async fn query_one(
    client: &Client,
    what: &'static str,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Option<tokio_postgres::Row>, SourceError> {
    client.query_opt(sql, params).await.map_err(query_err(what))
}

/// Checks the table's columns and persistence; returns whether it is partitioned.
async fn check_table(
    client: &Client,
    config: &Config,
    table: &TableName,
) -> Result<bool, SourceError> {
    let columns = relation(client, table).await?.columns;
    for (flag, column) in config.mapping_for(table).required_columns() {
        if !columns.iter().any(|c| c.name == column) {
            let available: Vec<&str> = columns.iter().map(|c| c.name.as_str()).collect();
            return Err(SourceError::ColumnMissing {
                table: table.to_string(),
                flag,
                column: column.to_owned(),
                available: available.join(", "),
            });
        }
    }
    // An UNLOGGED table (or partition) writes no WAL, so its rows are never decoded.
    let row = query_one(
        client,
        "read the outbox table's persistence",
        "SELECT c.relkind = 'p', \
                (SELECT string_agg(p.oid::regclass::text, ', ') FROM pg_class p \
                 WHERE p.relpersistence = 'u' AND (p.oid = c.oid \
                       OR p.oid IN (SELECT relid FROM pg_partition_tree(c.oid)))) \
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = $2",
        &[&table.schema, &table.name],
    )
    .await?;
    let (partitioned, unlogged) = row.map_or((false, None), |r| (r.get(0), r.get(1)));
    if let Some(unlogged) = unlogged {
        return Err(SourceError::TableUnlogged {
            table: table.to_string(),
            unlogged,
        });
    }
    Ok(partitioned)
}

/// The table's columns as a pgoutput Relation announces them (`id` 0: no
/// stream announced it); [`SourceError::TableMissing`] when there is no such table.
pub(crate) async fn relation(client: &Client, table: &TableName) -> Result<Relation, SourceError> {
    let rows = client
        .query(
            "SELECT a.attname::text, a.atttypid, a.atttypmod FROM pg_attribute a \
             JOIN pg_class c ON c.oid = a.attrelid \
             WHERE c.oid = to_regclass($1) AND c.relkind IN ('r', 'p') \
               AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            &[&table.quoted()],
        )
        .await
        .map_err(query_err("read the outbox table's columns"))?;
    if rows.is_empty() {
        return Err(SourceError::TableMissing {
            table: table.to_string(),
        });
    }
    let columns = rows.iter().map(|r| Column {
        flags: 0,
        name: r.get(0),
        type_oid: r.get(1),
        type_modifier: r.get(2),
    });
    Ok(Relation {
        id: 0,
        namespace: table.schema.clone(),
        name: table.name.clone(),
        replica_identity: b'd',
        columns: columns.collect(),
    })
}

/// Creates the missing publication (on a standby, says what to run on the primary).
async fn create_publication(
    client: &Client,
    config: &Config,
    in_recovery: bool,
) -> Result<(), SourceError> {
    let publication = &config.publication;
    let sql = super::sql::create_publication(publication, &config.tables);
    if in_recovery {
        return Err(SourceError::PublicationMissingOnStandby {
            publication: publication.clone(),
            sql,
        });
    }
    client
        .batch_execute(&sql)
        .await
        .map_err(query_err("create the publication"))?;
    tracing::info!(publication = %publication, sql = %sql, "created publication");
    Ok(())
}

/// Checks the publication (at start-up, `partitioned` names the partitioned
/// outbox tables, which need `publish_via_partition_root`) and returns it.
pub async fn verify_publication(
    client: &Client,
    config: &Config,
    partitioned: &[&TableName],
) -> Result<Publication, SourceError> {
    let row = query_one(
        client,
        "look up the publication",
        "SELECT puballtables, pubinsert, pubviaroot, oid, \
         current_setting('server_version_num')::int FROM pg_publication WHERE pubname = $1",
        &[&config.publication],
    )
    .await?
    .ok_or_else(|| SourceError::PublicationDropped {
        publication: config.publication.clone(),
        what: "does not exist",
    })?;
    let all_tables = check_publication(client, config, &row, partitioned).await?;
    let (oid, server_version): (u32, i32) = (row.get(3), row.get(4));
    let members = match all_tables {
        true => Vec::new(),
        false => members(client, config, oid, server_version).await?,
    };
    Ok(Publication {
        oid,
        all_tables,
        server_version,
        members,
    })
}

/// [`Publication::members`].
async fn members(
    client: &Client,
    config: &Config,
    publication: u32,
    server_version: i32,
) -> Result<Vec<(String, Vec<u32>)>, SourceError> {
    // Schemas in a publication (FOR TABLES IN SCHEMA) came with 15;
    // pg_partition_ancestors gives nothing for a table that is not partitioned.
    let schemas = match server_version >= 150_000 {
        true => {
            " UNION ALL SELECT n.oid FROM pg_publication_namespace n \
             JOIN pg_class c ON c.relnamespace = n.pnnspid \
             WHERE n.pnpubid = $1 AND c.oid IN (SELECT * FROM rels)"
        }
        false => "",
    };
    let sql = format!(
        "SELECT t, ARRAY(WITH rels AS (SELECT t::regclass UNION \
         SELECT relid FROM pg_partition_ancestors(t::regclass)) \
         SELECT r.oid FROM pg_publication_rel r WHERE r.prpubid = $1 \
         AND r.prrelid IN (SELECT * FROM rels){schemas} ORDER BY 1) FROM unnest($2::text[]) AS t"
    );
    let tables: Vec<String> = config.tables.iter().map(TableName::quoted).collect();
    let rows = client
        .query(&sql, &[&publication, &tables])
        .await
        .map_err(query_err(
            "list the catalog rows that publish the outbox tables",
        ))?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Checks an existing publication (`row`: puballtables, pubinsert, pubviaroot).
async fn check_publication(
    client: &Client,
    config: &Config,
    row: &tokio_postgres::Row,
    partitioned: &[&TableName],
) -> Result<bool, SourceError> {
    let publication = &config.publication;
    let (all_tables, publishes_inserts, via_root): (bool, bool, bool) =
        (row.get(0), row.get(1), row.get(2));
    if !publishes_inserts {
        return Err(SourceError::PublicationNoInsert {
            publication: publication.clone(),
        });
    }
    // Without it, a partitioned outbox's rows arrive under each partition's name.
    if !via_root && !partitioned.is_empty() {
        return Err(SourceError::PublicationNotViaRoot {
            publication: publication.clone(),
            tables: partitioned
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            remedy: format!(
                "ALTER PUBLICATION {} SET (publish_via_partition_root = true);",
                quote_ident(publication)
            ),
        });
    }
    if all_tables {
        return Ok(true);
    }
    let rows = client
        .query(
            "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1",
            &[publication],
        )
        .await
        .map_err(query_err("list the publication's tables"))?;
    let covered: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let missing: Vec<&TableName> = config
        .tables
        .iter()
        .filter(|t| !covered.iter().any(|(s, n)| *s == t.schema && *n == t.name))
        .collect();
    if !missing.is_empty() {
        return Err(SourceError::PublicationMissingTables {
            publication: publication.clone(),
            missing: missing
                .iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            remedy: format!(
                "ALTER PUBLICATION {} ADD TABLE {};",
                quote_ident(publication),
                missing
                    .iter()
                    .map(|t| t.quoted())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        });
    }
    Ok(false)
}

/// The slot's confirmed position, and whether it was created now.
async fn ensure_slot(
    client: &Client,
    config: &Config,
    server: &Server,
) -> Result<(Lsn, bool), SourceError> {
    let slot = &config.slot;
    let row = query_one(
        client,
        "look up the replication slot",
        "SELECT slot_type::text, plugin::text, database::text, confirmed_flush_lsn::text \
         FROM pg_replication_slots WHERE slot_name = $1",
        &[slot],
    )
    .await?;
    let mark_failover = match config.slot_failover {
        true => lineage::check_failover(client, config, server).await?,
        false => false,
    };
    let Some(row) = row else {
        lineage::check_missing_slot(client, config).await?;
        let sql = super::sql::create_slot(slot, config.slot_failover);
        let row = query_one(client, "create the replication slot", &sql, &[]).await?;
        let lsn = parse_lsn(row.and_then(|r| r.get::<_, Option<String>>(1)))?;
        tracing::info!(slot = %slot, lsn = %lsn, "created logical replication slot (pgoutput)");
        lineage::record_slot(client, slot).await;
        return Ok((lsn, true));
    };
    let slot_type: Option<String> = row.get(0);
    let plugin: Option<String> = row.get(1);
    let database: Option<String> = row.get(2);
    if slot_type.as_deref() != Some("logical") {
        return Err(SourceError::SlotPhysical { slot: slot.clone() });
    }
    if plugin.as_deref() != Some("pgoutput") {
        return Err(SourceError::SlotWrongPlugin {
            slot: slot.clone(),
            plugin: plugin.unwrap_or_default(),
        });
    }
    if database.as_deref() != Some(config.postgres.dbname.as_str()) {
        return Err(SourceError::SlotOtherDatabase {
            slot: slot.clone(),
            database: database.unwrap_or_default(),
            expected: config.postgres.dbname.clone(),
        });
    }
    let confirmed_flush = parse_lsn(row.get(3))?;
    // A slot created before the record existed (or by `setup`) is recorded now.
    lineage::record_slot(client, slot).await;
    if mark_failover {
        lineage::mark_failover(config).await?;
    }
    Ok((confirmed_flush, false))
}

fn parse_lsn(text: Option<String>) -> Result<Lsn, SourceError> {
    let text = text.ok_or(SourceError::SlotInvalidated)?;
    text.parse().map_err(|_| SourceError::SlotInvalidated)
}

/// When Postgres reports the slot invalidated (`invalidation_reason`,
/// `conflicting`): why, and what to do.
pub async fn slot_invalidation(client: &Client, slot: &str) -> Result<Option<String>, SourceError> {
    use crate::observability::health::{SlotObservation, slot_invalidated_remedy};
    let observation = super::slot_monitor::poll(client, slot)
        .await
        .map_err(query_err("read the slot's invalidation"))?;
    Ok(match observation {
        SlotObservation::Seen(status) => status.facts.invalidated(),
        SlotObservation::Missing | SlotObservation::Unknown => None,
    }
    .map(|reason| slot_invalidated_remedy(&reason)))
}

/// One outbox table's primary key, for `--cleanup delete`.
#[derive(Debug, Clone)]
pub struct PrimaryKey {
    /// The table.
    pub table: TableName,
    /// `(column, type)` in key order; the type as `format_type` spells it.
    pub columns: Vec<(String, String)>,
}

/// The `--cleanup delete` checks: every outbox table has a primary key and
/// the role may DELETE from it, and the publication does not publish deletes.
pub async fn cleanup_keys(
    client: &Client,
    config: &Config,
) -> Result<Vec<PrimaryKey>, SourceError> {
    let row = query_one(
        client,
        "look up the publication",
        "SELECT pubdelete FROM pg_publication WHERE pubname = $1",
        &[&config.publication],
    )
    .await?;
    if row.is_some_and(|r| r.get::<_, bool>(0)) {
        return Err(SourceError::CleanupPublishesDeletes {
            publication: config.publication.clone(),
        });
    }
    let mut keys = Vec::with_capacity(config.tables.len());
    for table in &config.tables {
        let rows = client
            .query(
                "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), \
                        has_table_privilege(i.indrelid, 'DELETE') \
                 FROM pg_index i JOIN pg_attribute a \
                   ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey) \
                 WHERE i.indrelid = $1::text::regclass AND i.indisprimary \
                 ORDER BY array_position(i.indkey::int2[], a.attnum)",
                &[&table.quoted()],
            )
            .await
            .map_err(query_err("read the outbox table's primary key"))?;
        if rows.is_empty() {
            return Err(SourceError::CleanupNoPrimaryKey {
                table: table.to_string(),
            });
        }
        if !rows.iter().all(|r| r.get::<_, bool>(2)) {
            return Err(SourceError::CleanupNoDeletePrivilege {
                table: table.to_string(),
                user: config.postgres.user.clone(),
            });
        }
        keys.push(PrimaryKey {
            table: table.clone(),
            columns: rows.iter().map(|r| (r.get(0), r.get(1))).collect(),
        });
    }
    Ok(keys)
}
