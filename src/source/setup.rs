//! The control connection (to the server `--postgres-url`'s `target_session_attrs`
//! picks) and what runs over it: the start-up checks, each stopping a misconfigured
//! relay with the fix, the publication and slot, and the look-ups later checks repeat.

use std::io;
use std::time::Duration;

use tokio_postgres::Client;

use super::lineage::{Guard, Lineage};
use super::{PgError, SourceError, failover, slot_monitor, tls};
use crate::config::{Config, PostgresConnInfo, TargetSessionAttrs};
use crate::lsn::Lsn;
use crate::observability::{Chain, health};
use crate::outbox::connect::ColumnFacts;
use crate::outbox::{TableName, quote_ident};
use crate::pgoutput::{Column, Relation};

/// The oldest supported major version: 14 brought pgoutput's `messages` option.
const MIN_SERVER_MAJOR: i32 = 14;

/// The first version (`server_version_num`) with failover slots.
const FAILOVER_MIN_VERSION: i32 = 170_000;

/// The first version with publication row filters, which `--shard` needs for tables.
const ROW_FILTER_MIN_VERSION: i32 = 150_000;

/// What start-up learned about the slot.
#[derive(Debug, Clone)]
pub struct SlotState {
    /// Streaming resumes here.
    pub confirmed_flush: Lsn,
    /// Whether this run created the slot.
    pub created: bool,
    /// The publication as found before streaming: later checks compare against it.
    pub publication: Publication,
}

/// The publication as found: PostgreSQL 18's pgoutput skips a missing one with a warning,
/// and rows inserted while a table is out of it are never decoded, so each look is compared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Publication {
    /// A dropped and re-created publication has another OID.
    pub oid: u32,
    /// `FOR ALL TABLES`: rows of other tables are expected (and skipped).
    pub all_tables: bool,
    /// `server_version_num`.
    pub server_version: i32,
    /// Per outbox table, the OIDs of the catalog rows that publish it (of it,
    /// an ancestor, or their schema): new ones after it was dropped and added again.
    pub members: Vec<(String, Vec<u32>)>,
}

/// Opens the control connection to the server `target_session_attrs` picks.
pub async fn connect(config: &Config) -> Result<Client, SourceError> {
    Ok(locate(&config.postgres).await?.0)
}

/// `config` pinned to the server [`connect`] picks, so the replication
/// connection goes there too (as is, without connecting, when there is no choice).
pub async fn pin(config: &Config) -> Result<Config, SourceError> {
    let mut config = config.clone();
    if has_choice(&config.postgres) {
        config.postgres = locate(&config.postgres).await?.1;
    }
    Ok(config)
}

fn has_choice(pg: &PostgresConnInfo) -> bool {
    pg.hosts.len() > 1 || pg.target_session_attrs != TargetSessionAttrs::Any
}

/// The first server that satisfies `target_session_attrs`, asked on every
/// (re)connect so a promoted standby is found without a restart.
async fn locate(pg: &PostgresConnInfo) -> Result<(Client, PostgresConnInfo), SourceError> {
    if !has_choice(pg) {
        return Ok((connect_to(pg).await?, pg.clone()));
    }
    let attrs = pg.target_session_attrs;
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
            let probe =
                "SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'";
            let passed_over = match client.query_one(probe, &[]).await {
                Ok(row) if attrs.accepts(row.get(0), row.get(1), strict) => {
                    return Ok((client, pinned));
                }
                Ok(row) if row.get::<_, bool>(0) => "a standby".to_owned(),
                Ok(_) => "read-only".to_owned(),
                // A server that goes away right after the login (mid-failover) is passed over too.
                Err(e) => format!("probing its role: {}", Chain(&PgError(e))),
            };
            tried.push(format!("{host}:{port}: {passed_over}"));
        }
    }
    Err(SourceError::NoSuitableHost {
        attrs: attrs.as_str(),
        tried: tried.join("; "),
    })
}

/// One server's control connection.
pub(super) async fn connect_to(pg: &PostgresConnInfo) -> Result<Client, SourceError> {
    let mut cfg = tokio_postgres::Config::new();
    cfg.host(&pg.host)
        .port(pg.port)
        .user(&pg.user)
        .dbname(&pg.dbname)
        .application_name(pg.application_name.as_deref().unwrap_or("outbox-relay"))
        .connect_timeout(Duration::from_secs(10));
    if let Some(password) = password(pg).await? {
        cfg.password(password);
    }
    let (ssl_mode, connector) = tls::control_tls(pg)?;
    let connecting = cfg.ssl_mode(ssl_mode).connect(connector);
    let (client, connection) = connecting.await.map_err(|source| {
        let url = pg.redacted();
        let refused = source
            .as_db_error()
            .is_some_and(|db| db.code().code().starts_with("28"));
        if refused && matches!(pg.auth, crate::cloud::PostgresAuth::AwsRdsIam(_)) {
            let user = pg.user.clone();
            let source = Box::new(PgError(source));
            return SourceError::IamRefused { url, user, source };
        }
        // tokio-rustls wraps a failed handshake's rustls error in an `io::Error`.
        let io = std::error::Error::source(&source).and_then(|e| e.downcast_ref::<io::Error>());
        let rustls = io.and_then(|io| io.get_ref()?.downcast_ref::<rustls::Error>());
        match rustls.map(tls::handshake_hint) {
            Some(hint) => SourceError::TlsHandshake {
                url,
                hint,
                source: source.into(),
            },
            None => SourceError::Connect {
                url,
                source: source.into(),
            },
        }
    })?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "control connection closed");
        }
    });
    Ok(client)
}

/// The password of a connection to `pg`'s server: the configured one, or (with
/// `--postgres-auth aws-rds-iam`) an RDS IAM token signed now, as every connection needs.
pub(super) async fn password(pg: &PostgresConnInfo) -> Result<Option<String>, SourceError> {
    let configured = pg.password.as_deref();
    let password = pg.auth.password(configured, &pg.host, pg.port, &pg.user);
    Ok(password.await?)
}

/// Names a failed control-connection query by what it was for.
pub(crate) fn query_err(what: &'static str) -> impl Fn(tokio_postgres::Error) -> SourceError {
    move |source| SourceError::Query {
        what: what.to_owned(),
        source: source.into(),
    }
}

/// Runs every start-up check, creates what is missing, and returns the slot's position.
pub async fn prepare(client: &Client, config: &Config) -> Result<SlotState, SourceError> {
    let in_recovery = check_server(client, config).await?;
    let mut partitioned = Vec::new();
    for table in &config.tables {
        if check_table(client, config, table).await? {
            partitioned.push(table);
        }
    }
    let filters = super::shard::row_filters(client, config).await?;
    let publication = match verify_publication(client, config, &partitioned).await {
        // Before streaming, the only change is "does not exist".
        Err(SourceError::PublicationChanged { .. }) => {
            create_publication(client, config, in_recovery, &filters).await?;
            verify_publication(client, config, &partitioned).await?
        }
        found => found?,
    };
    super::shard::verify(client, config, &publication, &filters).await?;
    let (confirmed_flush, created) = ensure_slot(client, config).await?;
    Ok(SlotState {
        confirmed_flush,
        created,
        publication,
    })
}

/// The server's version, `wal_level` and the role's right to replicate (warning of an idle
/// slot timeout); returns whether the server is a standby, where nothing can be created.
async fn check_server(client: &Client, config: &Config) -> Result<bool, SourceError> {
    let sql = format!(
        "SELECT current_setting('server_version_num')::int, current_setting('server_version'), \
                pg_is_in_recovery(), current_setting('wal_level'), \
                r.rolsuper OR r.rolreplication OR EXISTS (SELECT 1 FROM pg_roles g \
                    WHERE g.rolname = 'rds_replication' \
                      AND pg_has_role(current_user, g.oid, 'member')), \
                ({}) \
         FROM pg_roles r WHERE r.rolname = current_user",
        slot_monitor::IDLE_TIMEOUT_QUERY
    );
    let row = client
        .query_one(&sql, &[])
        .await
        .map_err(query_err("read the server's version and settings"))?;
    // PostgreSQL 18's idle_replication_slot_timeout drops the slot of a relay stopped longer.
    let idle_secs = u64::try_from(row.get::<_, Option<i64>>(5).unwrap_or(0)).unwrap_or(0);
    if let Some(warning) = health::idle_timeout_warning(idle_secs) {
        tracing::warn!("{warning}");
    }
    let (version_num, version, wal_level): (i32, String, String) =
        (row.get(0), row.get(1), row.get(3));
    let user = &config.postgres.user;
    let problem = if version_num / 10000 < MIN_SERVER_MAJOR {
        format!(
            "Postgres {version} is not supported: the relay needs PostgreSQL {MIN_SERVER_MAJOR} \
             or newer (for pgoutput's `messages` option)"
        )
    } else if wal_level != "logical" {
        format!(
            "Postgres has wal_level={wal_level:?}, but logical replication needs \
             wal_level=logical. Run ALTER SYSTEM SET wal_level = logical; and restart Postgres \
             (on RDS/Aurora set rds.logical_replication=1 in the parameter group; on Cloud SQL \
             set the cloudsql.logical_decoding flag)"
        )
    } else if !row.get::<_, bool>(4) {
        format!(
            "role {user:?} lacks the REPLICATION attribute (and is not a superuser or a member of \
             rds_replication). Run ALTER ROLE {user} WITH REPLICATION; (see sql/ for a \
             least-privilege role)"
        )
    } else if config.flags.slot_failover && version_num < FAILOVER_MIN_VERSION {
        format!(
            "--slot-failover needs PostgreSQL 17 or later, but the server is {version}; on older \
             servers a failover loses the slot (see docs/operations.md#failover)"
        )
    } else if let Some(shard) = config.flags.shard.filter(|_| !config.tables.is_empty())
        && version_num < ROW_FILTER_MIN_VERSION
    {
        format!(
            "--shard {shard} needs PostgreSQL 15 or later (publication row filters send each \
             shard only its rows), but the server is {version}. Run one relay without --shard, \
             or shard a table-less outbox (--table none --message-prefix ...)"
        )
    } else {
        return Ok(row.get(2));
    };
    Err(SourceError::Misconfigured(problem))
}

/// Checks the table's columns and persistence; returns whether it is partitioned.
async fn check_table(
    client: &Client,
    config: &Config,
    table: &TableName,
) -> Result<bool, SourceError> {
    let relation = relation(client, table).await?;
    let mapping = config.mapping_for(table);
    if mapping.connect.is_some() {
        // Debezium's format refuses column types and combinations before anything is sent.
        let facts = column_facts(client, &table.quoted()).await?;
        let bound = crate::outbox::TableMapping::bind_with(mapping, &relation, &facts);
        bound.map_err(|e| SourceError::Misconfigured(e.to_string()))?;
    }
    let columns = relation.columns;
    for (flag, column) in mapping.required_columns() {
        if !columns.iter().any(|c| c.name == column) {
            return Err(SourceError::Misconfigured(format!(
                "outbox table {table} has no column {column:?} (named by {flag}); its columns \
                 are: {}",
                join(columns.iter(), |c| c.name.clone())
            )));
        }
    }
    let row = client
        .query_one(
            "SELECT c.relkind = 'p', \
                    (SELECT string_agg(p.oid::regclass::text, ', ') FROM pg_class p \
                     WHERE p.relpersistence = 'u' AND (p.oid = c.oid \
                           OR p.oid IN (SELECT relid FROM pg_partition_tree(c.oid)))) \
             FROM pg_class c WHERE c.oid = to_regclass($1)",
            &[&table.quoted()],
        )
        .await
        .map_err(query_err("read the outbox table's persistence"))?;
    if let Some(unlogged) = row.get::<_, Option<String>>(1) {
        return Err(SourceError::Misconfigured(format!(
            "outbox table {table} cannot be relayed: {unlogged} is UNLOGGED, and UNLOGGED tables \
             write no WAL, so logical decoding never sees their rows. Run ALTER TABLE ... SET \
             LOGGED; on each"
        )));
    }
    Ok(row.get(0))
}

/// The table's columns as a pgoutput Relation announces them (`id` 0: no stream announced it).
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
        return Err(SourceError::Misconfigured(format!(
            "outbox table {table} does not exist (check --table and the database in \
             --postgres-url)"
        )));
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

/// The `NOT NULL` and `DEFAULT` of a table's columns (generated columns have no default);
/// `table` is its OID or quoted name.
pub(crate) async fn column_facts(
    client: &Client,
    table: &str,
) -> Result<Vec<ColumnFacts>, SourceError> {
    let rows = client
        .query(
            "SELECT a.attname::text, a.attnotnull, \
               CASE WHEN a.attgenerated = '' THEN pg_get_expr(d.adbin, d.adrelid) END \
             FROM pg_attribute a LEFT JOIN pg_attrdef d \
               ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
             WHERE a.attrelid = CASE WHEN $1 ~ '^[0-9]+$' THEN $1::oid ELSE $1::regclass END \
               AND a.attnum > 0 AND NOT a.attisdropped",
            &[&table],
        )
        .await
        .map_err(query_err("read the outbox table's NOT NULL and DEFAULT"))?;
    Ok(rows
        .iter()
        .map(|r| ColumnFacts {
            name: r.get(0),
            not_null: r.get(1),
            default: r.get(2),
        })
        .collect())
}

/// Creates the missing publication, with a shard's `filters` (on a standby, says what to run
/// on the primary).
async fn create_publication(
    client: &Client,
    config: &Config,
    in_recovery: bool,
    filters: &[String],
) -> Result<(), SourceError> {
    let publication = &config.flags.publication;
    let sql = super::sql::create_publication(publication, &config.tables, filters);
    if in_recovery {
        return Err(SourceError::Misconfigured(format!(
            "publication {publication:?} does not exist, and this server is a hot standby, where \
             nothing can be created; create it on the primary (it reaches the standby through \
             replication): {sql};"
        )));
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
    let name = &config.flags.publication;
    let row = client
        .query_opt(
            "SELECT puballtables, pubinsert, pubviaroot, oid, \
             current_setting('server_version_num')::int FROM pg_publication WHERE pubname = $1",
            &[name],
        )
        .await
        .map_err(query_err("look up the publication"))?
        .ok_or_else(|| SourceError::PublicationChanged {
            publication: name.clone(),
            change: "does not exist".to_owned(),
        })?;
    let unusable = |problem| SourceError::Misconfigured(format!("publication {name:?} {problem}"));
    let (all_tables, oid, server_version) = (row.get(0), row.get(3), row.get(4));
    if !row.get::<_, bool>(1) {
        return Err(unusable(format!(
            "does not publish inserts; run ALTER PUBLICATION {} SET (publish = 'insert'); or use \
             another --publication",
            quote_ident(name)
        )));
    }
    // Without it, a partitioned outbox's rows arrive under each partition's name.
    if !row.get::<_, bool>(2) && !partitioned.is_empty() {
        return Err(unusable(format!(
            "lacks publish_via_partition_root, so rows of the partitioned outbox table {} would \
             arrive under each partition's name; run ALTER PUBLICATION {} SET \
             (publish_via_partition_root = true);",
            join(partitioned.iter(), ToString::to_string),
            quote_ident(name)
        )));
    }
    let members = match all_tables {
        true => Vec::new(),
        false => members(client, config, oid, server_version).await?,
    };
    let uncovered = |t: &&TableName| members.contains(&(t.quoted(), Vec::new()));
    let missing: Vec<&TableName> = config.tables.iter().filter(uncovered).collect();
    if !missing.is_empty() {
        return Err(unusable(format!(
            "does not include {}; run ALTER PUBLICATION {} ADD TABLE {};",
            join(missing.iter(), ToString::to_string),
            quote_ident(name),
            join(missing.iter(), |t| t.quoted())
        )));
    }
    Ok(Publication {
        oid,
        all_tables,
        server_version,
        members,
    })
}

fn join<T>(items: impl Iterator<Item = T>, show: impl Fn(T) -> String) -> String {
    items.map(show).collect::<Vec<_>>().join(", ")
}

/// [`Publication::members`]; none for a table the publication does not cover.
async fn members(
    client: &Client,
    config: &Config,
    publication: u32,
    server_version: i32,
) -> Result<Vec<(String, Vec<u32>)>, SourceError> {
    // Schemas in a publication (FOR TABLES IN SCHEMA) came with 15;
    // pg_partition_ancestors gives nothing for a table that is not partitioned.
    let schemas = if server_version >= 150_000 {
        " UNION ALL SELECT n.oid FROM pg_publication_namespace n \
         JOIN pg_class c ON c.relnamespace = n.pnnspid \
         WHERE n.pnpubid = $1 AND c.oid IN (SELECT * FROM rels)"
    } else {
        ""
    };
    let sql = format!(
        "SELECT t, ARRAY(WITH rels AS (SELECT to_regclass(t) UNION \
         SELECT relid FROM pg_partition_ancestors(to_regclass(t))) \
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

/// The slot's confirmed position, and whether it was created now. The relay streams only
/// from a slot whose creation the lineage topic records ([`lineage`]).
async fn ensure_slot(client: &Client, config: &Config) -> Result<(Lsn, bool), SourceError> {
    let slot = &config.flags.slot;
    let row = client
        .query_opt(
            "SELECT CASE WHEN slot_type <> 'logical' THEN 'is a physical slot' \
                         WHEN plugin <> 'pgoutput' THEN format('uses the \"%s\" plugin', plugin) \
                         WHEN database <> current_database() \
                         THEN format('belongs to database \"%s\"', database) END, \
                    confirmed_flush_lsn::text \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[slot],
        )
        .await
        .map_err(query_err("look up the replication slot"))?;
    let failover = config.flags.slot_failover;
    let mark_failover = failover && failover::check(client, config).await?;
    let mut lineage = Lineage::open(config).await?;
    let Some(row) = row else {
        match lineage.judge(client, false).await? {
            Guard::Refuse(recorded) => {
                let (slot, url) = (slot.clone(), config.postgres.redacted());
                return Err(SourceError::SlotLost {
                    slot,
                    url,
                    recorded,
                });
            }
            Guard::Replace(recorded) => tracing::warn!(
                slot = %slot,
                recorded,
                "--allow-new-slot: creating a fresh slot where this relay streamed before; events \
                 committed between the last acknowledgement and now are relayed only by \
                 `outbox-relay backfill`"
            ),
            Guard::Create | Guard::Keep { .. } => {}
        }
        let row = client
            .query_one(&super::sql::create_slot(slot, failover), &[])
            .await
            .map_err(query_err("create the replication slot"))?;
        let lsn = parse_lsn(slot, row.get(1))?;
        tracing::info!(slot = %slot, lsn = %lsn, "created logical replication slot (pgoutput)");
        if failover {
            failover::log_standby_snapshot(client).await;
        }
        // Kept when this fails: the next start records it and relays from its creation.
        lineage.created(lsn).await.map_err(|e| match e {
            SourceError::Lineage(e) => SourceError::Lineage(e.slot_kept()),
            e => e,
        })?;
        return Ok((lsn, true));
    };
    let dbname = &config.postgres.dbname;
    if let Some(problem) = row.get::<_, Option<String>>(0) {
        return Err(SourceError::Misconfigured(format!(
            "replication slot {slot:?} {problem}; the relay needs a logical pgoutput slot in \
             database {dbname:?} of --postgres-url. Use another --slot, or drop it with SELECT \
             pg_drop_replication_slot('{slot}'); if nothing uses it"
        )));
    }
    let confirmed_flush = parse_lsn(slot, row.get(1))?;
    match lineage.judge(client, true).await? {
        // A slot created by `setup`, by hand, or before the lineage topic existed.
        Guard::Keep { record: true } => lineage.created(confirmed_flush).await?,
        // Written again, so that time-based retention does not drop it.
        _ => lineage.refresh().await?,
    }
    if mark_failover {
        failover::mark(client, config).await?;
    }
    Ok((confirmed_flush, false))
}

/// A slot's confirmed position; none means it lost its WAL.
fn parse_lsn(slot: &str, text: Option<String>) -> Result<Lsn, SourceError> {
    let lsn = text.and_then(|text| text.parse().ok());
    lsn.ok_or_else(|| {
        SourceError::Misconfigured(format!(
            "replication slot {slot:?}: it has no confirmed position (it may have been \
             invalidated after exceeding max_slot_wal_keep_size); drop and recreate it, and \
             re-publish or reconcile events written meanwhile"
        ))
    })
}
