//! The Postgres connection settings, parsed once from a libpq-style URL. The control connection
//! and the replication stream are both built from [`PostgresConnInfo`], so they always reach the
//! same server with the same credentials and TLS; the password never shows in `Debug` or a URL.

use std::fmt;
use std::path::PathBuf;

use crate::cloud::PostgresAuth;

/// How (and whether) to use TLS, with libpq's names and meanings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum SslMode {
    /// Never use TLS.
    Disable,
    /// Use TLS if the server offers it (libpq's default; `allow` means the same here).
    #[default]
    #[value(alias = "allow")]
    Prefer,
    /// Require TLS, do not verify the certificate.
    Require,
    /// Require TLS and a certificate signed by the trusted CA.
    VerifyCa,
    /// Like `VerifyCa`, and the certificate must name the host.
    VerifyFull,
}

/// Which server of several the relay may use (libpq's `target_session_attrs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum TargetSessionAttrs {
    /// The first server that answers (libpq's default).
    #[default]
    Any,
    /// A server that accepts writes (a primary not in read-only mode).
    ReadWrite,
    /// A server not in recovery.
    Primary,
    /// A server in recovery or in read-only mode.
    ReadOnly,
    /// A server in recovery.
    Standby,
    /// A standby if one answers, else any server.
    PreferStandby,
}

impl TargetSessionAttrs {
    /// libpq's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Any => "any",
            Self::ReadWrite => "read-write",
            Self::Primary => "primary",
            Self::ReadOnly => "read-only",
            Self::Standby => "standby",
            Self::PreferStandby => "prefer-standby",
        }
    }

    /// Whether a server in this state qualifies. `strict` is the first pass of `prefer-standby`
    /// (standbys only); the second pass takes any server.
    pub fn accepts(self, in_recovery: bool, read_only: bool, strict: bool) -> bool {
        match self {
            Self::Any => true,
            Self::ReadWrite => !in_recovery && !read_only,
            Self::Primary => !in_recovery,
            Self::ReadOnly => in_recovery || read_only,
            Self::Standby => in_recovery,
            Self::PreferStandby => in_recovery || !strict,
        }
    }
}

/// A parsed `postgres://` URL.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct PostgresConnInfo {
    /// Host name, IP address or Unix socket directory (`/...`): the first of [`Self::hosts`].
    pub host: String,
    /// TCP port of `host`.
    pub port: u16,
    /// Every server of the URL, in order (`postgres://u@db1:5432,db2:5432/app`).
    pub hosts: Vec<(String, u16)>,
    /// Which of `hosts` to use.
    pub target_session_attrs: TargetSessionAttrs,
    /// Role to log in as.
    pub user: String,
    /// Password, if any. Never printed.
    pub password: Option<String>,
    /// Database holding the outbox tables.
    pub dbname: String,
    /// TLS mode.
    pub sslmode: SslMode,
    /// CA certificate (PEM) for `verify-ca` / `verify-full`.
    pub sslrootcert: Option<PathBuf>,
    /// Client certificate (PEM), for certificate authentication.
    pub sslcert: Option<PathBuf>,
    /// Client key (PEM), for certificate authentication.
    pub sslkey: Option<PathBuf>,
    /// `application_name` shown in `pg_stat_activity`.
    pub application_name: Option<String>,
    /// How the relay logs in: the password above, or an AWS IAM token per connection.
    pub auth: PostgresAuth,
}

/// A `--postgres-url` that cannot be used, saying what would work; any URL in it is redacted.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PostgresUrlError(String);

impl PostgresConnInfo {
    /// Parses a libpq URL with libpq's defaults (port 5432, user `postgres`, database = user);
    /// several hosts are separated by commas (`db1:5432,db2`, or `?host=db1,db2&port=5432,5433`).
    pub fn parse(raw: &str) -> Result<Self, PostgresUrlError> {
        // The URL parser ends the user info at the first `/`, `?` or `#`: the rest of the secret
        // would be taken for the port, database or a parameter, and printed as such.
        if credentials_span(raw).is_some_and(|span| raw[span].contains(['/', '?', '#'])) {
            return Err(malformed(
                raw,
                "a '/', '?', '#' or '@' in the password or user name must be percent-encoded \
                 (%2F, %3F, %23, %40), and so must an '@' after the host",
            ));
        }
        // The URL parser knows one host per URL: it gets the first, then each other one alone.
        let (first_only, extra_hosts) = split_hosts(raw);
        let url = url::Url::parse(&first_only).map_err(|e| malformed(raw, &e.to_string()))?;
        let scheme = url.scheme();
        if scheme != "postgres" && scheme != "postgresql" {
            return Err(PostgresUrlError(format!(
                "--postgres-url must start with postgres:// or postgresql://, got {scheme}://"
            )));
        }
        let mut servers = Servers::of(raw, &url, &extra_hosts)?;
        let mut info = PostgresConnInfo {
            user: decode("user", url.username())?,
            password: url.password().map(|p| decode("password", p)).transpose()?,
            dbname: decode("database name", url.path().trim_start_matches('/'))?,
            ..PostgresConnInfo::default()
        };
        for (name, value) in url.query_pairs() {
            info.parameter(&name, value.into_owned(), &mut servers)?;
        }
        info.hosts = servers.paired()?;
        (info.host, info.port) = info.hosts.first().cloned().unwrap_or_default();
        if info.user.is_empty() {
            info.user = "postgres".to_owned();
        }
        if info.dbname.is_empty() {
            info.dbname = info.user.clone();
        }
        Ok(info)
    }

    /// Takes the URL parameter `name=value` (`host` and `port` into `servers`).
    fn parameter(
        &mut self,
        name: &str,
        value: String,
        servers: &mut Servers,
    ) -> Result<(), PostgresUrlError> {
        match name {
            "host" => servers.hosts = value.split(',').map(str::to_owned).collect(),
            "port" => {
                let parsed: Result<_, _> = value.split(',').map(str::parse).collect();
                let expected = "a TCP port number, or one per host separated by commas";
                servers.ports = parsed.map_err(|_| invalid_parameter("port", value, expected))?;
            }
            "target_session_attrs" => {
                self.target_session_attrs = parse_param("target_session_attrs", value)?
            }
            "user" => self.user = value,
            "password" => self.password = Some(value),
            "dbname" => self.dbname = value,
            "sslmode" => self.sslmode = parse_param("sslmode", value)?,
            "sslrootcert" => self.sslrootcert = Some(value.into()),
            "sslcert" => self.sslcert = Some(value.into()),
            "sslkey" => self.sslkey = Some(value.into()),
            "application_name" => self.application_name = Some(value),
            other => {
                let supported = "host, port, user, password, dbname, sslmode, sslrootcert, \
                                 sslcert, sslkey, application_name, target_session_attrs";
                return Err(PostgresUrlError(format!(
                    "--postgres-url parameter {other:?} is not supported; supported: {supported}"
                )));
            }
        }
        Ok(())
    }

    /// The URL with the password as `***`, for logs and errors; after [`Self::pinned`], only
    /// the chosen server.
    pub fn redacted(&self) -> String {
        let password = if self.password.is_some() { ":***" } else { "" };
        let hosts = self.hosts.iter();
        let hosts = hosts.map(|(host, port)| match host.contains(':') {
            true => format!("[{host}]:{port}"),
            false => format!("{host}:{port}"),
        });
        let hosts = hosts.collect::<Vec<_>>().join(",");
        format!("postgres://{}{password}@{hosts}/{}", self.user, self.dbname)
    }

    /// The same settings, pinned to one server of [`Self::hosts`].
    pub fn pinned(&self, host: &str, port: u16) -> PostgresConnInfo {
        let mut pinned = self.clone();
        pinned.host = host.to_owned();
        pinned.port = port;
        pinned.hosts = vec![(host.to_owned(), port)];
        pinned
    }
}

impl fmt::Debug for PostgresConnInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConnInfo")
            .field("url", &self.redacted())
            .field("sslmode", &self.sslmode)
            .field("sslrootcert", &self.sslrootcert)
            .finish_non_exhaustive()
    }
}

/// The servers of a URL as written: its hosts, and one port for all or one per host.
struct Servers {
    hosts: Vec<String>,
    ports: Vec<u16>,
}

impl Servers {
    /// The URL's host and port, then those of `extra_hosts` (`raw` is the whole URL, for errors).
    fn of(raw: &str, url: &url::Url, extra_hosts: &[&str]) -> Result<Servers, PostgresUrlError> {
        let mut servers = Servers {
            hosts: vec![host_name(url)?],
            ports: vec![url.port().unwrap_or(5432)],
        };
        for extra in extra_hosts {
            let url = url::Url::parse(&format!("postgres://{extra}")).ok();
            let url = url.filter(|url| url.host().is_some());
            let reason = format!("host {extra:?} is not HOST or HOST:PORT");
            let url = url.ok_or_else(|| malformed(raw, &reason))?;
            servers.hosts.push(host_name(&url)?);
            servers.ports.push(url.port().unwrap_or(5432));
        }
        Ok(servers)
    }

    /// Each host with its port: libpq takes one port for every host, or one per host.
    fn paired(self) -> Result<Vec<(String, u16)>, PostgresUrlError> {
        let hosts = self.hosts.len();
        let ports = self.ports.len();
        if ports != 1 && ports != hosts {
            let value = format!("{ports} ports for {hosts} hosts");
            return Err(invalid_parameter(
                "port",
                value,
                "one port, or one per host",
            ));
        }
        let port = |i: usize| self.ports.get(i).or(self.ports.first()).copied();
        let paired = self.hosts.iter().enumerate();
        let paired = paired.map(|(i, host)| (host.clone(), port(i).unwrap_or(5432)));
        Ok(paired.collect())
    }
}

/// A URL the URL parser refuses (`raw`, redacted in the message), saying what would work.
fn malformed(raw: &str, reason: &str) -> PostgresUrlError {
    let url = redact_url(raw);
    let expected = "postgres://USER:PASSWORD@HOST:PORT/DBNAME?sslmode=...";
    PostgresUrlError(format!(
        "--postgres-url {url} is not a valid URL ({reason}); expected {expected}"
    ))
}

fn invalid_parameter(name: &str, value: String, expected: &str) -> PostgresUrlError {
    PostgresUrlError(format!(
        "--postgres-url parameter {name}={value:?} is invalid: expected {expected}"
    ))
}

/// A libpq enum parameter, by its libpq spelling (the variants' kebab-case).
fn parse_param<T: clap::ValueEnum>(
    name: &'static str,
    value: String,
) -> Result<T, PostgresUrlError> {
    T::from_str(&value, false).map_err(|_| {
        let names = T::value_variants().iter().filter_map(T::to_possible_value);
        let names: Vec<_> = names.map(|v| v.get_name().to_owned()).collect();
        invalid_parameter(name, value, &names.join(", "))
    })
}

/// The URL with only the first of its comma-separated hosts, and the other hosts; for a URL whose
/// credentials hold no '/', '?' or '#' (checked before).
fn split_hosts(raw: &str) -> (String, Vec<&str>) {
    let Some(scheme_end) = raw.find("://") else {
        return (raw.to_owned(), Vec::new());
    };
    let hosts_start = credentials_span(raw).map_or(scheme_end + 3, |span| span.end + 1);
    let rest = &raw[hosts_start..];
    let end = hosts_start + rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let mut hosts = raw[hosts_start..end].split(',');
    let first = hosts.next().unwrap_or_default();
    let url = format!("{}{first}{}", &raw[..hosts_start], &raw[end..]);
    (url, hosts.collect())
}

/// The URL's host, percent-decoded; IPv6 without brackets; `localhost` when empty.
fn host_name(url: &url::Url) -> Result<String, PostgresUrlError> {
    match url.host() {
        Some(url::Host::Ipv6(addr)) => Ok(addr.to_string()),
        Some(host) => decode("host", &host.to_string()),
        None => Ok("localhost".to_owned()),
    }
}

fn decode(part: &'static str, s: &str) -> Result<String, PostgresUrlError> {
    let decoded = percent_encoding::percent_decode_str(s).decode_utf8();
    let err = format!("--postgres-url: the {part} is not valid UTF-8 after percent-decoding");
    decoded
        .map(|d| d.into_owned())
        .map_err(|_| PostgresUrlError(err))
}

/// Where credentials may stand in `raw`: from after `://` to the last `@`. Found textually, as
/// an unencoded `/`, `?`, `#` or `@` in a password makes a URL parser end the user info early.
fn credentials_span(raw: &str) -> Option<std::ops::Range<usize>> {
    let start = raw.find("://")? + 3;
    let at = raw[start..].rfind('@')? + start;
    Some(start..at)
}

/// Replaces the password in anything URL-shaped with `***`, so that even a malformed URL can be
/// quoted: all from `://` to the last `@` but a plain user name, and a `password=` parameter.
fn redact_url(raw: &str) -> String {
    let mut out = raw.to_owned();
    if let Some(span) = credentials_span(raw) {
        let userinfo = &raw[span.clone()];
        let user_end = userinfo.find(':').unwrap_or(userinfo.len());
        let plain_user = !userinfo[..user_end].contains(['/', '?', '#', '@']);
        let (hidden, mask) = match plain_user {
            true => (span.start + user_end..span.end, ":***"),
            false => (span, "***"),
        };
        if !hidden.is_empty() {
            out.replace_range(hidden, mask);
        }
    }
    if let Some(start) = out.find("password=") {
        let value_start = start + "password=".len();
        let value = &out[value_start..];
        let value_end = value_start + value.find(['&', ' ']).unwrap_or(value.len());
        out.replace_range(value_start..value_end, "***");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_full_url() {
        let info = PostgresConnInfo::parse(
            "postgres://relay:s%40cret@db.internal:6543/shop?sslmode=verify-full&sslrootcert=/ca.pem&application_name=r1",
        )
        .unwrap();
        assert_eq!(info.host, "db.internal");
        assert_eq!(info.port, 6543);
        assert_eq!(info.user, "relay");
        assert_eq!(info.password.as_deref(), Some("s@cret"));
        assert_eq!(info.dbname, "shop");
        assert_eq!(info.sslmode, SslMode::VerifyFull);
        assert_eq!(info.sslrootcert, Some(PathBuf::from("/ca.pem")));
        assert_eq!(info.application_name.as_deref(), Some("r1"));
    }

    #[test]
    fn applies_libpq_defaults() {
        let info = PostgresConnInfo::parse("postgresql://app@localhost").unwrap();
        assert_eq!(info.port, 5432);
        assert_eq!(info.dbname, "app");
        assert_eq!(info.sslmode, SslMode::Prefer);
        assert_eq!(info.password, None);
    }

    #[test]
    fn never_shows_the_password() {
        let raw = "postgres://relay:hunter2@127.0.0.1:5432/db";
        let info = PostgresConnInfo::parse(raw).unwrap();
        assert!(!info.redacted().contains("hunter2"));
        assert!(!format!("{info:?}").contains("hunter2"));
        assert_eq!(redact_url(raw), "postgres://relay:***@127.0.0.1:5432/db");
        assert_eq!(
            redact_url("postgres://u@h/db?password=hunter2&sslmode=require"),
            "postgres://u@h/db?password=***&sslmode=require"
        );
        let err = PostgresConnInfo::parse("postgres://relay:hunter2@[bad/db").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn parses_several_hosts_and_target_session_attrs() {
        let info = PostgresConnInfo::parse(
            "postgres://relay:pw@db1:5432,db2,[::1]:6000/app?target_session_attrs=read-write",
        )
        .unwrap();
        assert_eq!(
            info.hosts,
            vec![
                ("db1".to_owned(), 5432),
                ("db2".to_owned(), 5432),
                ("::1".to_owned(), 6000)
            ]
        );
        assert_eq!((info.host.as_str(), info.port), ("db1", 5432));
        assert_eq!(info.dbname, "app");
        assert_eq!(info.target_session_attrs, TargetSessionAttrs::ReadWrite);
        assert_eq!(
            info.redacted(),
            "postgres://relay:***@db1:5432,db2:5432,[::1]:6000/app"
        );
        let pinned = info.pinned("db2", 5432);
        assert_eq!(pinned.redacted(), "postgres://relay:***@db2:5432/app");
        let info = PostgresConnInfo::parse("postgres://u@x/db?host=a,b&port=1,2").unwrap();
        assert_eq!(info.hosts, vec![("a".to_owned(), 1), ("b".to_owned(), 2)]);
        assert!(PostgresConnInfo::parse("postgres://u@a,b,c/db?port=1,2").is_err());
        assert!(PostgresConnInfo::parse("postgres://u@a/db?target_session_attrs=x").is_err());
        assert!(TargetSessionAttrs::PreferStandby.accepts(false, false, false));
        assert!(!TargetSessionAttrs::PreferStandby.accepts(false, false, true));
        assert!(!TargetSessionAttrs::ReadWrite.accepts(true, false, false));
    }

    #[test]
    fn several_hosts_follow_the_last_at_sign_of_the_credentials() {
        // split_hosts finds the hosts after the credentials' last '@', as the URL parser does.
        let info = PostgresConnInfo::parse("postgres://relay:p@ss,w@db1:5433,db2/app").unwrap();
        let hosts = vec![("db1".to_owned(), 5433), ("db2".to_owned(), 5432)];
        assert_eq!(info.hosts, hosts);
        assert_eq!(info.password.as_deref(), Some("p@ss,w"));
        assert_eq!(info.dbname, "app");
        let info = PostgresConnInfo::parse("postgres://db1,db2:6000?dbname=app").unwrap();
        let hosts = vec![("db1".to_owned(), 5432), ("db2".to_owned(), 6000)];
        assert_eq!((info.hosts, info.user.as_str()), (hosts, "postgres"));
    }

    #[test]
    fn passwords_with_unencoded_delimiters_are_never_printed() {
        for (raw, secret) in [
            ("postgres://relay:pa/ss@db/app", "pa/ss"),
            ("postgres://relay:123/abc@db/app", "123/abc"),
            ("postgres://relay:123?abc@db/app", "123?abc"),
            ("postgres://relay:123#abc@db/app", "123#abc"),
            ("postgres://relay:a@b/c@db/app", "b/c"),
            ("postgres://relay:a@b?c@db/app", "b?c"),
            (
                "postgres://relay:p@ss@127.0.0.1:5432/app?sslmode=maybe",
                "p@ss",
            ),
        ] {
            let redacted = redact_url(raw);
            assert!(!redacted.contains(secret), "{raw}: {redacted}");
            let shown = match PostgresConnInfo::parse(raw) {
                Ok(info) => format!("{} {info:?}", info.redacted()),
                Err(e) => e.to_string(),
            };
            assert!(!shown.contains(secret), "{raw}: {shown}");
            let tail = secret.rsplit(['/', '?', '#', '@']).next().unwrap_or(secret);
            assert!(!shown.contains(&format!("{tail}@")), "{raw}: {shown}");
        }
        assert_eq!(
            redact_url("postgres://relay:pa/ss@db/app"),
            "postgres://relay:***@db/app"
        );
        assert_eq!(
            redact_url("postgres://re/lay@db/app"),
            "postgres://***@db/app"
        );
        assert_eq!(
            redact_url("postgres://relay@db/app"),
            "postgres://relay@db/app"
        );
        // An '@' in the password alone is what the parser expects (the last one ends it).
        let info = PostgresConnInfo::parse("postgres://relay:p@ss@db/app").unwrap();
        assert_eq!(info.password.as_deref(), Some("p@ss"));
        assert_eq!(info.host, "db");
    }

    #[test]
    fn rejects_unknown_parameters_and_modes() {
        for (url, expected) in [
            (
                "postgres://u@h/db?sslmode=maybe",
                "--postgres-url parameter sslmode=\"maybe\" is invalid: expected disable, prefer, \
                 require, verify-ca, verify-full",
            ),
            (
                "postgres://u@h/db?gssencmode=disable",
                "--postgres-url parameter \"gssencmode\" is not supported; supported: host, port",
            ),
            (
                "mysql://u@h/db",
                "--postgres-url must start with postgres:// or postgresql://, got mysql://",
            ),
            (
                "postgres://u%FF@h/db",
                "--postgres-url: the user is not valid UTF-8 after percent-decoding",
            ),
        ] {
            let err = PostgresConnInfo::parse(url).unwrap_err().to_string();
            assert!(err.starts_with(expected), "{url}: {err}");
        }
    }
}
