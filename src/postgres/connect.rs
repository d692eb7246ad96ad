//! Every Postgres connection the relay opens, control and replication, starts here: the
//! server `target_session_attrs` picks ([`Connector::locate`], asked again on every
//! reconnect so a promoted standby is found without a restart), TLS as libpq's `sslmode`
//! says, and the password ([`Connector::password`], the one place it is chosen).

use std::io;
use std::time::Duration;

use pgwire_replication::{PgWireError, ReplicationClient, ReplicationConfig};
use tokio_postgres::Client;

use super::{PgError, PostgresError, catalog, tls};
use crate::config::{PostgresConnInfo, TargetSessionAttrs};
use crate::lsn::Lsn;
use crate::observability::Chain;

/// `application_name` unless the URL sets one.
const APPLICATION_NAME: &str = "outbox-relay";

/// How long opening a control connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The walsender's settings, so values arrive in one text form (ISO, UTC).
const SESSION_OPTIONS: &str =
    "-c datestyle=ISO,YMD -c timezone=UTC -c intervalstyle=postgres -c extra_float_digits=3";

/// Where Postgres is and how to log in: opens control and replication connections.
#[derive(Clone, Debug)]
pub struct Connector {
    info: PostgresConnInfo,
    /// One server, chosen already: connections go there without asking its role again.
    pinned: bool,
}

impl Connector {
    /// Connections to the server(s) of `info` (`--postgres-url` with its password).
    pub fn new(info: PostgresConnInfo) -> Self {
        Connector {
            info,
            pinned: false,
        }
    }

    /// The URL's settings (user, database, hosts).
    pub fn info(&self) -> &PostgresConnInfo {
        &self.info
    }

    /// The URL as logs may show it, password redacted.
    pub fn redacted(&self) -> String {
        self.info.redacted()
    }

    /// The password for the next connection: the URL's (or `--postgres-password`'s), or
    /// with `--postgres-auth aws-rds-iam` an RDS IAM token signed now for its server.
    async fn password(&self) -> Result<Option<String>, PostgresError> {
        let pg = &self.info;
        let configured = pg.password.as_deref();
        let password = pg.auth.password(configured, &pg.host, pg.port, &pg.user);
        Ok(password.await?)
    }

    /// Whether the relay logs in with RDS IAM tokens.
    fn iam(&self) -> bool {
        matches!(self.info.auth, crate::cloud::PostgresAuth::AwsRdsIam(_))
    }

    fn application_name(&self) -> &str {
        self.info
            .application_name
            .as_deref()
            .unwrap_or(APPLICATION_NAME)
    }

    /// This connector, reconnecting to the primary after a failover when the URL names
    /// several servers (`target_session_attrs=read-write`): for writes.
    pub fn primary(&self) -> Connector {
        let mut info = self.info.clone();
        if info.hosts.len() > 1 {
            info.target_session_attrs = TargetSessionAttrs::ReadWrite;
        }
        Connector::new(info)
    }

    /// Whether the URL leaves a choice of server (several hosts, or a session attribute).
    fn has_choice(&self) -> bool {
        let pg = &self.info;
        let choice = pg.hosts.len() > 1 || pg.target_session_attrs != TargetSessionAttrs::Any;
        choice && !self.pinned
    }

    /// A control connection to the server `target_session_attrs` picks.
    pub async fn control(&self) -> Result<Client, PostgresError> {
        Ok(self.locate().await?.0)
    }

    /// This connector pinned to the server [`Connector::control`] picks, so that a replication
    /// connection goes there too (as is, without connecting, when there is no choice).
    pub async fn pin(&self) -> Result<Connector, PostgresError> {
        match self.has_choice() {
            true => Ok(self.locate().await?.1),
            false => Ok(self.clone()),
        }
    }

    /// Each server of the URL alone, in order.
    pub fn each_server(&self) -> impl Iterator<Item = (String, Connector)> + '_ {
        self.info.hosts.iter().map(|(host, port)| {
            let pinned = Connector {
                info: self.info.pinned(host, *port),
                pinned: true,
            };
            (format!("{host}:{port}"), pinned)
        })
    }

    /// The first server that satisfies `target_session_attrs`, with a control connection to
    /// it, and this connector pinned there.
    pub async fn locate(&self) -> Result<(Client, Connector), PostgresError> {
        if !self.has_choice() {
            return Ok((self.connect_first().await?, self.clone()));
        }
        let attrs = self.info.target_session_attrs;
        let mut tried = Vec::new();
        // prefer-standby: a standby on the first pass, any server on the second.
        let passes: &[bool] = match attrs {
            TargetSessionAttrs::PreferStandby => &[true, false],
            _ => &[false],
        };
        for &strict in passes {
            for (addr, server) in self.each_server() {
                let client = match server.connect_first().await {
                    Ok(client) => client,
                    Err(e) if self.info.hosts.len() == 1 => return Err(e),
                    Err(e) => {
                        tried.push(format!("{addr}: {e}"));
                        continue;
                    }
                };
                let passed_over = match catalog::role(&client).await {
                    Ok(role) if attrs.accepts(role.in_recovery, role.read_only, strict) => {
                        return Ok((client, server));
                    }
                    Ok(role) if role.in_recovery => "a standby".to_owned(),
                    Ok(_) => "read-only".to_owned(),
                    // A server that goes away right after the login (mid-failover) is passed
                    // over too.
                    Err(e) => format!("probing its role: {}", Chain(&PgError(e))),
                };
                tried.push(format!("{addr}: {passed_over}"));
            }
        }
        Err(PostgresError::NoSuitableHost {
            attrs: attrs.as_str(),
            tried: tried.join("; "),
        })
    }

    /// A control connection to the URL's first server.
    pub async fn connect_first(&self) -> Result<Client, PostgresError> {
        let pg = &self.info;
        let mut cfg = tokio_postgres::Config::new();
        cfg.host(&pg.host)
            .port(pg.port)
            .user(&pg.user)
            .dbname(&pg.dbname)
            .application_name(self.application_name())
            .connect_timeout(CONNECT_TIMEOUT);
        if let Some(password) = self.password().await? {
            cfg.password(password);
        }
        let (ssl_mode, connector) = tls::control_tls(pg)?;
        let connecting = cfg.ssl_mode(ssl_mode).connect(connector);
        let (client, connection) = connecting.await.map_err(|e| self.connect_error(e))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "control connection closed");
            }
        });
        Ok(client)
    }

    /// A failed login: a failed TLS handshake says what to check, a refused IAM token what
    /// to grant.
    fn connect_error(&self, source: tokio_postgres::Error) -> PostgresError {
        let url = self.redacted();
        let refused = source
            .as_db_error()
            .is_some_and(|db| db.code().code().starts_with("28"));
        if refused && self.iam() {
            let user = self.info.user.clone();
            let source = Box::new(PgError(source));
            return PostgresError::IamRefused { url, user, source };
        }
        // tokio-rustls wraps a failed handshake's rustls error in an `io::Error`.
        let io = std::error::Error::source(&source).and_then(|e| e.downcast_ref::<io::Error>());
        let rustls = io.and_then(|io| io.get_ref()?.downcast_ref::<rustls::Error>());
        match rustls.map(tls::handshake_hint) {
            Some(hint) => PostgresError::TlsHandshake {
                url,
                hint,
                source: source.into(),
            },
            None => PostgresError::Connect {
                url,
                source: source.into(),
            },
        }
    }

    /// A replication session's settings for `slot` and `publication` on the URL's first
    /// server (pin first), starting at 0/0 until the caller says otherwise; with
    /// `--postgres-auth aws-rds-iam` it logs in with a token signed now.
    pub async fn replication(
        &self,
        slot: &str,
        publication: &str,
    ) -> Result<ReplicationConfig, PostgresError> {
        let pg = &self.info;
        let password = self.password().await?;
        let config = ReplicationConfig::new(
            pg.host.clone(),
            pg.user.clone(),
            password.unwrap_or_default(),
            pg.dbname.clone(),
            slot.to_owned(),
            publication.to_owned(),
        );
        Ok(config
            .with_port(pg.port)
            .with_tls(tls::replication_tls(pg)?)
            .with_options(SESSION_OPTIONS)
            .with_application_name(self.application_name()))
    }

    /// A replication session for commands (IDENTIFY_SYSTEM, ALTER_REPLICATION_SLOT) about
    /// `slot`, on the server [`Connector::pin`] picks.
    pub async fn command_session(&self, slot: &str) -> Result<ReplicationClient, PostgresError> {
        let pinned = self.pin().await?;
        let config = pinned.replication(slot, "").await?;
        let config = config.with_start_lsn(Lsn::ZERO.into());
        let connecting = ReplicationClient::connect_gated(config).await;
        connecting.map_err(|source| pinned.replication_error("open a session", slot, source))
    }

    /// A replication connection's error: TLS and authentication failures are configuration
    /// problems, with what to check; the rest failed `what`.
    pub fn replication_error(
        &self,
        what: &'static str,
        slot: &str,
        source: PgWireError,
    ) -> PostgresError {
        match self.refused(source) {
            Ok(refused) => refused,
            Err(source) => PostgresError::Replication {
                what,
                slot: slot.to_owned(),
                source,
            },
        }
    }

    /// The replication connection was refused (TLS or authentication), or `Err` with the
    /// error when it failed otherwise.
    pub fn refused(&self, source: PgWireError) -> Result<PostgresError, PgWireError> {
        if self.iam() && login_refused(&source) {
            return Ok(PostgresError::IamRefused {
                url: self.redacted(),
                user: self.info.user.clone(),
                source: Box::new(source),
            });
        }
        if !(source.is_tls() || source.is_auth()) {
            return Err(source);
        }
        Ok(PostgresError::ReplicationConnect {
            url: self.redacted(),
            hint: tls::replication_hint(&source),
            source,
        })
    }
}

/// Whether the server refused the login (SQLSTATE class 28) or the client could not log in.
fn login_refused(error: &PgWireError) -> bool {
    match error {
        PgWireError::Server(message) => {
            super::wire_sqlstate(message).is_some_and(|code| code.starts_with("28"))
        }
        other => other.is_auth(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connector(url: &str) -> Connector {
        Connector::new(PostgresConnInfo::parse(url).unwrap())
    }

    #[test]
    fn a_server_once_chosen_is_not_asked_its_role_again() {
        let one = connector("postgres://u@db1/app");
        assert!(!one.has_choice());
        let writable = connector("postgres://u@db1/app?target_session_attrs=read-write");
        assert!(writable.has_choice());
        let several = connector("postgres://u@db1,db2/app?target_session_attrs=read-write");
        assert!(several.has_choice());
        let servers: Vec<(String, Connector)> = several.each_server().collect();
        assert_eq!(servers[1].0, "db2:5432");
        assert!(servers.iter().all(|(_, server)| !server.has_choice()));
        // Writes after a failover go to whichever server is the primary then.
        assert!(several.primary().has_choice());
        let primary = connector("postgres://u@db1,db2/app").primary();
        assert_eq!(
            primary.info().target_session_attrs,
            TargetSessionAttrs::ReadWrite
        );
    }
}
