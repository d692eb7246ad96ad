//! TLS for both Postgres connections, with libpq's `sslmode` meanings.
//!
//! The relay opens two connections to the same server: the control connection
//! (tokio-postgres, through [`control_tls`]) and the replication stream
//! (pgwire-replication, through [`replication_tls`]). Both are derived from one
//! [`TlsPlan`], resolved once from the `--postgres-url` settings, so the two can
//! never disagree about whether to encrypt or what to trust.
//!
//! | `sslmode`     | TLS                         | chain checked              | host name checked |
//! |---------------|-----------------------------|----------------------------|-------------------|
//! | `disable`     | never                       | -                          | -                 |
//! | `allow`/`prefer` | if the server offers it  | no                         | no                |
//! | `require`     | always                      | only if a root CA is given | no                |
//! | `verify-ca`   | always                      | yes                        | no                |
//! | `verify-full` | always                      | yes                        | yes               |
//!
//! The root CA (`sslrootcert`) follows libpq: a PEM file, or the word `system`
//! for the public web PKI roots (allowed with `verify-full` only, as in libpq 16);
//! when it is not given, `~/.postgresql/root.crt` is used if it exists. With
//! `require`, a root CA that is given (or that default file) turns on chain
//! verification, exactly like `verify-ca`: libpq's backwards-compatible rule.
//! Unlike libpq, an `sslrootcert` that is named but unreadable is an error in
//! every mode, never silently skipped. `verify-ca` and `verify-full` without
//! any root CA are an error, as in libpq.
//!
//! Differences from libpq, on purpose or forced by the drivers:
//! * `prefer` never verifies the certificate, even with a root CA (libpq would,
//!   then fall back to plaintext on failure, which buys nothing).
//! * A failed TLS handshake under `prefer` is an error; libpq retries in plaintext.
//! * Client certificates are used only when `sslcert` and `sslkey` are both given;
//!   the libpq defaults `~/.postgresql/postgresql.{crt,key}` are not looked up.
//! * TLS is never used over a Unix socket (libpq ignores `sslmode` there too).
//! * pgwire-replication 0.5 checks the host name in `verify-ca` mode too (its
//!   chain-only verifier recognises rustls' old `NotValidForName` error but not
//!   the `NotValidForNameContext` that rustls 0.23 now returns), so with a
//!   certificate that does not name the host the control connection succeeds and
//!   the replication connection is refused, with a hint saying why.
//! * pgwire-replication refuses `verify-full` to an IP address unless an SNI name
//!   is set; the address itself is set, which makes rustls check the
//!   certificate's IP addresses as libpq does (and send no SNI).
//!
//! Both connections use rustls with the ring provider, chosen explicitly for
//! every configuration (never rustls' process-level default, which panics when
//! more than one provider is compiled in, as it is here).

use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::config::{PostgresConnInfo, SslMode};

/// `sslrootcert=system`: trust the public web PKI roots (libpq 16 and later).
const SYSTEM_ROOTS: &str = "system";

/// TLS settings in `--postgres-url` that cannot be used. Every message names the
/// URL parameter and the file, and says what to change.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// `verify-ca` / `verify-full` with no root CA anywhere.
    #[error(
        "sslmode={mode} needs the CA certificate that signed the server's certificate, and none \
         was given: add sslrootcert=/path/to/ca.pem to --postgres-url (or sslrootcert=system \
         for the public web PKI roots, with sslmode=verify-full), or install the CA as \
         ~/.postgresql/root.crt"
    )]
    MissingRootCert {
        /// The `sslmode` given.
        mode: &'static str,
    },
    /// `sslrootcert=system` with a mode weaker than `verify-full`.
    #[error(
        "sslrootcert=system is allowed only with sslmode=verify-full (as in libpq), not \
         sslmode={mode}: the public roots vouch for host names, so the host name must be checked"
    )]
    SystemRootsNeedVerifyFull {
        /// The `sslmode` given.
        mode: &'static str,
    },
    /// Only one of `sslcert` and `sslkey`.
    #[error(
        "--postgres-url has {given} but not {missing}: a client certificate needs both \
         sslcert=/path/to/client.crt and sslkey=/path/to/client.key"
    )]
    IncompleteClientCert {
        /// The parameter given.
        given: &'static str,
        /// The parameter missing.
        missing: &'static str,
    },
    /// A certificate or key file cannot be read.
    #[error(
        "cannot read the {what} {} (from {param} in --postgres-url); check the path and that \
         the relay's user may read the file",
        path.display()
    )]
    Read {
        /// What the file should hold.
        what: &'static str,
        /// The URL parameter that named it.
        param: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A certificate or key file is not valid PEM.
    #[error(
        "the {what} {} (from {param} in --postgres-url) is not valid PEM; it must hold PEM \
         blocks such as -----BEGIN CERTIFICATE-----",
        path.display()
    )]
    Pem {
        /// What the file should hold.
        what: &'static str,
        /// The URL parameter that named it.
        param: &'static str,
        /// The file.
        path: PathBuf,
        /// The PEM parser's error.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// A PEM file without what it should hold.
    #[error(
        "the {what} {} (from {param} in --postgres-url) holds no usable {expected}; check that \
         it is the right file",
        path.display()
    )]
    Empty {
        /// What the file should hold.
        what: &'static str,
        /// The URL parameter that named it.
        param: &'static str,
        /// The file.
        path: PathBuf,
        /// The PEM block expected.
        expected: &'static str,
    },
    /// The client certificate and key do not make a usable pair.
    #[error(
        "the client certificate {} and key {} (sslcert, sslkey) cannot be used; check that \
         the key belongs to the certificate",
        cert.display(),
        key.display()
    )]
    ClientCert {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls' refusal.
        #[source]
        source: rustls::Error,
    },
    /// The root CA store cannot make a verifier.
    #[error("cannot verify server certificates with the given root CAs")]
    Verifier {
        /// rustls' refusal.
        #[source]
        source: rustls::client::VerifierBuilderError,
    },
    /// rustls refused the protocol versions (a build problem, not a setting).
    #[error("cannot set up TLS")]
    Rustls {
        /// rustls' refusal.
        #[source]
        source: rustls::Error,
    },
}

/// Where the trusted roots come from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Roots {
    /// A PEM file of CA certificates.
    File {
        /// The file.
        path: PathBuf,
        /// `sslrootcert`, or the libpq default file.
        param: &'static str,
    },
    /// The public web PKI roots (webpki-roots).
    System,
}

/// What is checked about the server's certificate once TLS is up.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verify {
    /// Nothing: encryption without authentication (`require`).
    Nothing,
    /// The chain up to the roots, not the host name (`verify-ca`).
    Chain(Roots),
    /// The chain and the host name (`verify-full`).
    Full(Roots),
}

/// Whether TLS is used, and how it is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Mode {
    /// Plaintext.
    Off,
    /// TLS if the server offers it, unverified; plaintext otherwise.
    Prefer,
    /// TLS or no connection.
    Require(Verify),
}

/// A client certificate and its key.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ClientCert {
    cert: PathBuf,
    key: PathBuf,
}

/// The resolved TLS settings of both connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TlsPlan {
    mode: Mode,
    client_cert: Option<ClientCert>,
}

impl TlsPlan {
    /// Applies libpq's rules to the URL's settings. `default_root` is libpq's
    /// `~/.postgresql/root.crt` when that file exists (a parameter so tests do
    /// not depend on the home directory).
    fn resolve(info: &PostgresConnInfo, default_root: Option<&Path>) -> Result<Self, TlsError> {
        if info.sslmode == SslMode::Disable || info.host.starts_with('/') {
            return Ok(TlsPlan {
                mode: Mode::Off,
                client_cert: None,
            });
        }
        let mode_name = mode_name(info.sslmode);
        let given_roots = match info.sslrootcert.as_deref() {
            Some(path) if path == Path::new(SYSTEM_ROOTS) => {
                if info.sslmode != SslMode::VerifyFull {
                    return Err(TlsError::SystemRootsNeedVerifyFull { mode: mode_name });
                }
                Some(Roots::System)
            }
            Some(path) => Some(Roots::File {
                path: path.to_owned(),
                param: "sslrootcert",
            }),
            None => default_root.map(|path| Roots::File {
                path: path.to_owned(),
                param: "the default ~/.postgresql/root.crt",
            }),
        };
        let mode = match info.sslmode {
            SslMode::Disable => Mode::Off,
            SslMode::Prefer => Mode::Prefer,
            SslMode::Require => Mode::Require(given_roots.map_or(Verify::Nothing, Verify::Chain)),
            SslMode::VerifyCa | SslMode::VerifyFull => {
                let roots = given_roots.ok_or(TlsError::MissingRootCert { mode: mode_name })?;
                if info.sslmode == SslMode::VerifyCa {
                    Mode::Require(Verify::Chain(roots))
                } else {
                    Mode::Require(Verify::Full(roots))
                }
            }
        };
        let client_cert = match (&info.sslcert, &info.sslkey) {
            (Some(cert), Some(key)) => Some(ClientCert {
                cert: cert.clone(),
                key: key.clone(),
            }),
            (None, None) => None,
            (Some(_), None) => {
                return Err(TlsError::IncompleteClientCert {
                    given: "sslcert",
                    missing: "sslkey",
                });
            }
            (None, Some(_)) => {
                return Err(TlsError::IncompleteClientCert {
                    given: "sslkey",
                    missing: "sslcert",
                });
            }
        };
        Ok(TlsPlan { mode, client_cert })
    }

    /// The plan for `info`, with libpq's default root CA file if it exists.
    fn for_url(info: &PostgresConnInfo) -> Result<Self, TlsError> {
        let default_root = std::env::var_os("HOME")
            .filter(|home| !home.is_empty())
            .map(|home| PathBuf::from(home).join(".postgresql").join("root.crt"))
            .filter(|path| path.is_file());
        TlsPlan::resolve(info, default_root.as_deref())
    }

    fn roots(&self) -> Option<&Roots> {
        match &self.mode {
            Mode::Require(Verify::Chain(roots) | Verify::Full(roots)) => Some(roots),
            _ => None,
        }
    }

    /// pgwire-replication's rendering of the plan (no file is read here).
    fn to_pgwire(&self, host: &str) -> pgwire_replication::TlsConfig {
        use pgwire_replication::TlsConfig;
        let root_path = |roots: &Roots| match roots {
            Roots::File { path, .. } => Some(path.clone()),
            // pgwire-replication uses webpki-roots when no CA file is given.
            Roots::System => None,
        };
        let tls = match &self.mode {
            Mode::Off => return TlsConfig::disabled(),
            Mode::Prefer => TlsConfig {
                mode: pgwire_replication::SslMode::Prefer,
                ..TlsConfig::default()
            },
            Mode::Require(Verify::Nothing) => TlsConfig::require(),
            Mode::Require(Verify::Chain(roots)) => TlsConfig::verify_ca(root_path(roots)),
            Mode::Require(Verify::Full(roots)) => {
                let tls = TlsConfig::verify_full(root_path(roots));
                // pgwire-replication refuses verify-full with an IP-address host unless
                // an SNI name is set; the address itself makes rustls check the
                // certificate's IP SANs (and send no SNI), which is libpq's behaviour.
                if host.parse::<IpAddr>().is_ok() {
                    tls.with_sni_hostname(host)
                } else {
                    tls
                }
            }
        };
        match &self.client_cert {
            Some(cc) => tls.with_client_cert(cc.cert.clone(), cc.key.clone()),
            None => tls,
        }
    }

    /// Reads every file the plan names, so a bad path or file is reported the
    /// same way for both connections, before anything is sent.
    fn check_files(&self) -> Result<(), TlsError> {
        if let Some(roots) = self.roots() {
            load_roots(roots)?;
        }
        if let Some(cc) = &self.client_cert {
            load_client_cert(cc)?;
        }
        Ok(())
    }

    /// The rustls configuration of the control connection.
    fn rustls_config(&self) -> Result<ClientConfig, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|source| TlsError::Rustls { source })?
            .dangerous()
            .with_custom_certificate_verifier(self.verifier(provider)?);
        match &self.client_cert {
            Some(cc) if self.mode != Mode::Off => {
                let (chain, key) = load_client_cert(cc)?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|source| TlsError::ClientCert {
                        cert: cc.cert.clone(),
                        key: cc.key.clone(),
                        source,
                    })
            }
            _ => Ok(builder.with_no_client_auth()),
        }
    }

    /// What the control connection checks about the server's certificate.
    fn verifier(
        &self,
        provider: Arc<CryptoProvider>,
    ) -> Result<Arc<dyn ServerCertVerifier>, TlsError> {
        let chain = match &self.mode {
            Mode::Require(Verify::Full(roots)) => return Ok(webpki_verifier(roots, provider)?),
            Mode::Require(Verify::Chain(roots)) => {
                Some(webpki_verifier(roots, Arc::clone(&provider))?)
            }
            Mode::Off | Mode::Prefer | Mode::Require(Verify::Nothing) => None,
        };
        Ok(Arc::new(Lenient { chain, provider }))
    }

    /// tokio-postgres' `sslmode` for the plan (verification is the connector's job).
    fn tokio_postgres_mode(&self) -> tokio_postgres::config::SslMode {
        match self.mode {
            Mode::Off => tokio_postgres::config::SslMode::Disable,
            Mode::Prefer => tokio_postgres::config::SslMode::Prefer,
            Mode::Require(_) => tokio_postgres::config::SslMode::Require,
        }
    }
}

fn mode_name(mode: SslMode) -> &'static str {
    match mode {
        SslMode::Disable => "disable",
        SslMode::Prefer => "prefer",
        SslMode::Require => "require",
        SslMode::VerifyCa => "verify-ca",
        SslMode::VerifyFull => "verify-full",
    }
}

/// The replication stream's TLS settings, with libpq's meanings (see the module docs).
pub(crate) fn replication_tls(
    info: &PostgresConnInfo,
) -> Result<pgwire_replication::TlsConfig, TlsError> {
    let plan = TlsPlan::for_url(info)?;
    plan.check_files()?;
    Ok(plan.to_pgwire(&info.host))
}

/// The control connection's `sslmode` and TLS connector, with the same meanings
/// as [`replication_tls`].
pub(crate) fn control_tls(
    info: &PostgresConnInfo,
) -> Result<(tokio_postgres::config::SslMode, MakeRustlsConnect), TlsError> {
    let plan = TlsPlan::for_url(info)?;
    let config = plan.rustls_config()?;
    Ok((plan.tokio_postgres_mode(), MakeRustlsConnect::new(config)))
}

/// A short explanation of a failed handshake, for the connection error.
pub(crate) fn handshake_hint(error: &rustls::Error) -> &'static str {
    match error {
        rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature,
        ) => {
            "the server's certificate is not signed by a CA in sslrootcert: point sslrootcert at \
             the CA that issued it"
        }
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => {
            "the server's certificate does not name the host in --postgres-url: connect by a \
             name the certificate holds, or use sslmode=verify-ca"
        }
        rustls::Error::InvalidCertificate(
            CertificateError::Expired
            | CertificateError::ExpiredContext { .. }
            | CertificateError::NotValidYet
            | CertificateError::NotValidYetContext { .. },
        ) => "the server's certificate is expired or not yet valid: renew it",
        rustls::Error::InvalidCertificate(_) => {
            "the server's certificate was refused: check sslrootcert and sslmode"
        }
        _ => "check the server's TLS settings and sslmode in --postgres-url",
    }
}

/// A short explanation of a refused replication connection, for the error.
pub(crate) fn replication_hint(error: &pgwire_replication::PgWireError) -> &'static str {
    match error {
        pgwire_replication::PgWireError::Tls(message) if message.contains("not valid for name") => {
            "the certificate does not name the host, and pgwire-replication 0.5 checks the name \
             even for sslmode=verify-ca (or require with sslrootcert), although the control \
             connection accepted it: connect by a name the certificate holds"
        }
        _ => {
            "the control connection with the same settings succeeded; check pg_hba.conf's \
             replication lines and the TLS settings in --postgres-url"
        }
    }
}

fn read_file(what: &'static str, param: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        param,
        path: path.to_owned(),
        source,
    })
}

fn load_certs(
    what: &'static str,
    param: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read_file(what, param, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem {
            what,
            param,
            path: path.to_owned(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what,
            param,
            path: path.to_owned(),
            expected: "certificate (-----BEGIN CERTIFICATE-----)",
        });
    }
    Ok(certs)
}

fn load_roots(roots: &Roots) -> Result<RootCertStore, TlsError> {
    match roots {
        Roots::System => Ok(RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        }),
        Roots::File { path, param } => {
            let what = "root CA certificate file";
            let mut store = RootCertStore::empty();
            let (added, _ignored) = store.add_parsable_certificates(load_certs(what, param, path)?);
            if added == 0 {
                return Err(TlsError::Empty {
                    what,
                    param,
                    path: path.clone(),
                    expected: "CA certificate that parses as X.509",
                });
            }
            Ok(store)
        }
    }
}

fn load_client_cert(
    cc: &ClientCert,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    let chain = load_certs("client certificate file", "sslcert", &cc.cert)?;
    let (what, param) = ("client key file", "sslkey");
    let pem = read_file(what, param, &cc.key)?;
    let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|source| match source {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::Empty {
            what,
            param,
            path: cc.key.clone(),
            expected: "private key (PKCS#8, PKCS#1 or SEC1 PEM)",
        },
        source => TlsError::Pem {
            what,
            param,
            path: cc.key.clone(),
            source,
        },
    })?;
    Ok((chain, key))
}

fn webpki_verifier(
    roots: &Roots,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, TlsError> {
    let store = Arc::new(load_roots(roots)?);
    WebPkiServerVerifier::builder_with_provider(store, provider)
        .build()
        .map_err(|source| TlsError::Verifier { source })
}

/// `verify-ca` (a `chain` verifier): the standard checks, except that a
/// certificate which does not name the host is accepted; `require` and
/// `prefer` without a root CA (no `chain`): any certificate. The handshake
/// signatures are checked either way, so the session key is bound to the
/// certificate the server presented.
#[derive(Debug)]
struct Lenient {
    chain: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            // webpki checks the name last, so the chain and validity were accepted.
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests;
