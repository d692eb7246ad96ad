//! Postgres, below both start-up and the replication runtime: opening connections
//! ([`connect`]: the control session, the server `target_session_attrs` picks, a replication
//! session for commands), the catalog queries the relay reads ([`catalog`]), and the
//! statements it runs ([`sql`]). Nothing here decides anything: start-up (`startup`) judges
//! what the catalog says, and the stream (`source`) keeps its own sessions.

pub mod catalog;
pub mod connect;
pub mod sql;
mod tls;

use pgwire_replication::PgWireError;

pub use connect::Connector;
pub use tls::TlsError;

/// A Postgres connection or query failed; the message says what it was for.
#[derive(Debug, thiserror::Error)]
pub enum PostgresError {
    /// The control connection could not be opened (`url` redacted).
    #[error("cannot connect to Postgres at {url}")]
    Connect {
        /// The server's URL, password redacted.
        url: String,
        /// The connection error.
        #[source]
        source: PgError,
    },
    /// The TLS settings in the URL cannot be used (a file, a missing root CA).
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The control connection's TLS handshake failed; `hint` says what to check.
    #[error("TLS handshake with Postgres at {url} failed ({hint})")]
    TlsHandshake {
        /// The server's URL, password redacted.
        url: String,
        /// What to check in the TLS settings, from the handshake failure.
        hint: &'static str,
        /// The connection error.
        #[source]
        source: PgError,
    },
    /// The replication connection was refused (TLS or authentication).
    #[error("cannot open the replication connection to {url} ({hint})")]
    ReplicationConnect {
        /// The server's URL, password redacted.
        url: String,
        /// What to check: `pg_hba.conf`'s replication lines or the TLS settings.
        hint: &'static str,
        /// The replication client's error.
        #[source]
        source: PgWireError,
    },
    /// No AWS IAM token for a connection (`--postgres-auth aws-rds-iam`): at start-up a
    /// configuration problem; while running, retried like a broken stream.
    #[error("cannot sign the RDS IAM token to log in to Postgres")]
    Credentials(#[from] crate::cloud::CloudError),
    /// The server refused the RDS IAM token (`--postgres-auth aws-rds-iam`): at start-up a
    /// configuration problem (a missing grant or policy); while running, retried (RDS also
    /// refuses IAM logins it throttles).
    #[error(
        "Postgres at {url} refused the RDS IAM token of user {user:?}: the AWS identity needs \
         rds-db:connect on arn:aws:rds-db:REGION:ACCOUNT:dbuser:RESOURCE_ID/{user}, the database \
         IAM authentication on, and the role GRANT rds_iam (docs/operations.md, AWS IAM)"
    )]
    IamRefused {
        /// The server's URL.
        url: String,
        /// The role logged in as.
        user: String,
        /// The server's refusal.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// No server of the URL satisfies `target_session_attrs` (mid-failover): retried.
    #[error("no server of --postgres-url is {attrs} (target_session_attrs): {tried}")]
    NoSuitableHost {
        /// The `target_session_attrs` value, e.g. `read-write`.
        attrs: &'static str,
        /// Each `host:port` tried and why it was passed over, `; `-separated.
        tried: String,
    },
    /// A query failed; `what` says what it was for.
    #[error("Postgres query failed ({what})")]
    Query {
        /// What the query was for, e.g. "probe the server's role".
        what: String,
        /// The query error.
        #[source]
        source: PgError,
    },
    /// A replication command (IDENTIFY_SYSTEM, ALTER_REPLICATION_SLOT) failed.
    #[error("replication command failed ({what}) for slot {slot:?}")]
    Replication {
        /// What the command was for, e.g. "identify the system".
        what: &'static str,
        /// The replication slot name.
        slot: String,
        /// The replication client's error.
        #[source]
        source: PgWireError,
    },
}

impl PostgresError {
    /// The SQLSTATE the server answered with, on the control or a replication connection.
    pub fn sqlstate(&self) -> Option<String> {
        match self {
            PostgresError::Connect { source, .. } | PostgresError::Query { source, .. } => {
                let db = source.0.as_db_error()?;
                Some(db.code().code().to_owned())
            }
            PostgresError::Replication {
                source: PgWireError::Server(message),
                ..
            } => wire_sqlstate(message).map(str::to_owned),
            _ => None,
        }
    }

    /// Whether the server was not reached, or the connection was lost before it answered
    /// (refused, reset, timed out, closed): not an answer of the server's, nor a refused TLS
    /// setting or login, nor a bad setting.
    pub fn is_transport(&self) -> bool {
        match self {
            PostgresError::Connect { source, .. } | PostgresError::Query { source, .. } => {
                let error = &source.0;
                // tokio-postgres' kinds are private; these are the messages of its connect,
                // I/O, timeout and closed kinds.
                let transport = [
                    "error connecting to server",
                    "error communicating with the server",
                    "timeout waiting for server",
                ];
                error.is_closed() || transport.contains(&error.to_string().as_str())
            }
            PostgresError::Replication { source, .. } => source.is_transient(),
            _ => false,
        }
    }

    /// Whether a server error's SQLSTATE is in `class` (two characters, e.g. `28`).
    pub fn sqlstate_class(&self, class: &str) -> bool {
        let source = match self {
            PostgresError::Connect { source, .. } | PostgresError::Query { source, .. } => source,
            _ => return false,
        };
        let code = source.0.as_db_error().map(|db| db.code().code());
        code.is_some_and(|code| code.starts_with(class))
    }
}

/// The SQLSTATE in pgwire-replication's rendering of a server error.
pub fn wire_sqlstate(message: &str) -> Option<&str> {
    let at = message.find("SQLSTATE ")? + "SQLSTATE ".len();
    message.get(at..at + 5)
}

/// Names a failed query by what it was for.
pub fn query_err(what: &'static str) -> impl Fn(tokio_postgres::Error) -> PostgresError {
    move |source| PostgresError::Query {
        what: what.to_owned(),
        source: source.into(),
    }
}

/// A tokio-postgres error as the relay tells it: a server error's message with its SQLSTATE,
/// detail and hint on one line (tokio-postgres' own `Display` says only "db error"); any other
/// keeps its causes as its error chain.
#[derive(Debug)]
pub struct PgError(pub tokio_postgres::Error);

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some(db) = self.0.as_db_error() else {
            return write!(f, "{}", self.0);
        };
        write!(f, "{} (SQLSTATE {})", db.message(), db.code().code())?;
        for (label, text) in [("detail", db.detail()), ("hint", db.hint())] {
            if let Some(text) = text {
                write!(f, "; {label}: {text}")?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for PgError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        // A server error's whole story is in the message above.
        match self.0.as_db_error() {
            Some(_) => None,
            None => std::error::Error::source(&self.0),
        }
    }
}

impl From<tokio_postgres::Error> for PgError {
    fn from(error: tokio_postgres::Error) -> Self {
        PgError(error)
    }
}
