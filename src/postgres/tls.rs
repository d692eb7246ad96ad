//! TLS for both Postgres connections, with libpq's `sslmode` meanings (docs/operations.md's TLS table).
//! The URL resolves into pgwire-replication's [`TlsConfig`] and the control connection's rustls
//! config derives from it, so the two never disagree. The ring provider is named explicitly:
//! rustls' process-level default panics with two providers compiled in.

use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::ValueEnum;
use pgwire_replication::TlsConfig;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::config::{PostgresConnInfo, SslMode};

/// TLS settings in `--postgres-url` that cannot be used; each message says what to change.
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
        /// The URL's `sslmode`.
        mode: String,
    },
    /// `sslrootcert=system` with a mode weaker than `verify-full`.
    #[error(
        "sslrootcert=system is allowed only with sslmode=verify-full (as in libpq), not \
         sslmode={mode}: the public roots vouch for host names, so the host name must be checked"
    )]
    SystemRootsNeedVerifyFull {
        /// The URL's `sslmode`.
        mode: String,
    },
    /// Only one of `sslcert` and `sslkey`.
    #[error(
        "--postgres-url has only one of sslcert and sslkey: a client certificate needs both \
         sslcert=/path/to/client.crt and sslkey=/path/to/client.key"
    )]
    IncompleteClientCert,
    /// A certificate or key file cannot be read.
    #[error(
        "cannot read the {param} file {} (from --postgres-url): check the path and that the \
         relay's user may read it",
        path.display()
    )]
    Read {
        /// The URL parameter that names the file, e.g. `sslrootcert`.
        param: &'static str,
        /// The file's path.
        path: PathBuf,
        /// The read error.
        #[source]
        source: io::Error,
    },
    /// A certificate or key file without what it should hold (or not valid PEM).
    #[error(
        "the {param} file {} holds no usable {expected}: check that it is the right file",
        path.display()
    )]
    Unusable {
        /// The URL parameter that names the file, e.g. `sslrootcert`.
        param: &'static str,
        /// The file's path.
        path: PathBuf,
        /// What the file should hold, e.g. a CA certificate.
        expected: &'static str,
        /// The PEM parse error; `None` when the file parsed but held nothing usable.
        #[source]
        source: Option<pem::Error>,
    },
    /// The client certificate and key do not make a usable pair.
    #[error(
        "the client certificate {} and key {} (sslcert, sslkey) cannot be used: check that \
         the key belongs to the certificate",
        cert.display(),
        key.display()
    )]
    ClientCert {
        /// The `sslcert` file's path.
        cert: PathBuf,
        /// The `sslkey` file's path.
        key: PathBuf,
        /// Why rustls rejected the pair.
        #[source]
        source: rustls::Error,
    },
    /// rustls refused the configuration (a build problem, not a setting).
    #[error("cannot set up TLS")]
    Setup(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Applies libpq's rules to the URL's settings. `default_root` is libpq's
/// `~/.postgresql/root.crt` if it exists (a parameter so tests do not depend on `$HOME`).
fn resolve(info: &PostgresConnInfo, default_root: Option<&Path>) -> Result<TlsConfig, TlsError> {
    // libpq ignores sslmode over a Unix socket too.
    if info.sslmode == SslMode::Disable || info.host.starts_with('/') {
        return Ok(TlsConfig::disabled());
    }
    let mode = || {
        let value = info.sslmode.to_possible_value();
        value.map_or_else(String::new, |v| v.get_name().to_owned())
    };
    let system = info.sslrootcert.as_deref() == Some(Path::new("system"));
    if system && info.sslmode != SslMode::VerifyFull {
        return Err(TlsError::SystemRootsNeedVerifyFull { mode: mode() });
    }
    // pgwire-replication's `None` CA file means the public web PKI roots.
    let ca_file = (info.sslrootcert.as_deref().or(default_root))
        .filter(|_| !system)
        .map(Path::to_owned);
    let has_roots = system || ca_file.is_some();
    let mut tls = match info.sslmode {
        SslMode::Disable => TlsConfig::disabled(),
        // `prefer` never verifies, even with a root CA: falling back to plaintext
        // on a failed check, as libpq does, would buy nothing.
        SslMode::Prefer => TlsConfig {
            mode: pgwire_replication::SslMode::Prefer,
            ..TlsConfig::default()
        },
        SslMode::Require if !has_roots => TlsConfig::require(),
        _ if !has_roots => return Err(TlsError::MissingRootCert { mode: mode() }),
        // libpq's backwards-compatible rule: `require` with a root CA is `verify-ca`.
        SslMode::Require | SslMode::VerifyCa => TlsConfig::verify_ca(ca_file),
        SslMode::VerifyFull => TlsConfig::verify_full(ca_file),
    };
    // pgwire-replication refuses verify-full to an IP address without an SNI name;
    // the address itself makes rustls check the certificate's IP addresses, as libpq does.
    if tls.mode.verifies_hostname() && info.host.parse::<IpAddr>().is_ok() {
        tls = tls.with_sni_hostname(&info.host);
    }
    // Unlike libpq, ~/.postgresql/postgresql.{crt,key} are not looked up.
    match (&info.sslcert, &info.sslkey) {
        (Some(cert), Some(key)) => Ok(tls.with_client_cert(cert, key)),
        (None, None) => Ok(tls),
        _ => Err(TlsError::IncompleteClientCert),
    }
}

/// libpq's default root CA file, `~/.postgresql/root.crt`, if it exists.
fn default_root() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").filter(|home| !home.is_empty())?;
    Some(PathBuf::from(home).join(".postgresql/root.crt")).filter(|path| path.is_file())
}

/// The replication stream's TLS settings; the files they name are read here, so a bad one is
/// refused as for the control connection.
pub(crate) fn replication_tls(info: &PostgresConnInfo) -> Result<TlsConfig, TlsError> {
    let tls = resolve(info, default_root().as_deref())?;
    rustls_config(&tls)?;
    Ok(tls)
}

/// The control connection's `sslmode` and TLS connector, from the same settings.
pub(crate) fn control_tls(
    info: &PostgresConnInfo,
) -> Result<(tokio_postgres::config::SslMode, MakeRustlsConnect), TlsError> {
    let tls = resolve(info, default_root().as_deref())?;
    let connector = MakeRustlsConnect::new(rustls_config(&tls)?);
    Ok((control_mode(&tls), connector))
}

/// tokio-postgres' `sslmode` for `tls` (verification is the connector's job).
fn control_mode(tls: &TlsConfig) -> tokio_postgres::config::SslMode {
    match tls.mode {
        pgwire_replication::SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        pgwire_replication::SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        _ => tokio_postgres::config::SslMode::Require,
    }
}

fn rustls_config(tls: &TlsConfig) -> Result<ClientConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|error| TlsError::Setup(error.into()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier(tls, provider)?);
    let (Some(cert), Some(key)) = (&tls.client_cert_pem_path, &tls.client_key_pem_path) else {
        return Ok(builder.with_no_client_auth());
    };
    let chain = read_pem("sslcert", cert, "certificate (-----BEGIN CERTIFICATE-----)")?;
    let mut keys =
        read_pem::<PrivateKeyDer>("sslkey", key, "private key (PKCS#8, PKCS#1 or SEC1 PEM)")?;
    builder
        .with_client_auth_cert(chain, keys.swap_remove(0))
        .map_err(|source| TlsError::ClientCert {
            cert: cert.clone(),
            key: key.clone(),
            source,
        })
}

/// The server certificate check: chain and name (`verify-full`), chain only, or nothing.
fn verifier(
    tls: &TlsConfig,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn ServerCertVerifier>, TlsError> {
    let mut chain = None;
    if tls.mode.verifies_certificate() {
        let roots = Arc::new(load_roots(tls.ca_pem_path.as_deref())?);
        let verifier = WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(&provider))
            .build()
            .map_err(|error| TlsError::Setup(error.into()))?;
        if tls.mode.verifies_hostname() {
            return Ok(verifier);
        }
        chain = Some(verifier);
    }
    let algorithms = provider.signature_verification_algorithms;
    Ok(Arc::new(Lenient { chain, algorithms }))
}

/// What to fix after a failed handshake, for the connection error.
pub(crate) fn handshake_hint(error: &rustls::Error) -> &'static str {
    let rustls::Error::InvalidCertificate(error) = error else {
        return "check the server's TLS settings and sslmode in --postgres-url";
    };
    match error {
        CertificateError::UnknownIssuer | CertificateError::BadSignature => {
            "the server's certificate is not signed by a CA in sslrootcert: point sslrootcert at \
             the CA that issued it"
        }
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
            "the server's certificate does not name the host in --postgres-url: connect by a \
             name the certificate holds, or use sslmode=verify-ca"
        }
        CertificateError::Expired
        | CertificateError::ExpiredContext { .. }
        | CertificateError::NotValidYet
        | CertificateError::NotValidYetContext { .. } => {
            "the server's certificate is expired or not yet valid: renew it"
        }
        _ => "the server's certificate was refused: check sslrootcert and sslmode",
    }
}

/// What to fix after a refused replication connection, for the error.
pub(crate) fn replication_hint(error: &pgwire_replication::PgWireError) -> &'static str {
    match error {
        // pgwire-replication 0.5's chain-only verifier misses rustls 0.23's
        // `NotValidForNameContext`, so it checks the name in verify-ca mode too.
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

/// The items of a PEM file, at least one; `param` names the file in errors.
fn read_pem<T: PemObject>(
    param: &'static str,
    path: &Path,
    expected: &'static str,
) -> Result<Vec<T>, TlsError> {
    let unusable = |source| TlsError::Unusable {
        param,
        path: path.to_owned(),
        expected,
        source,
    };
    match T::pem_file_iter(path).and_then(Iterator::collect::<Result<Vec<T>, _>>) {
        Ok(items) if !items.is_empty() => Ok(items),
        Ok(_) | Err(pem::Error::NoItemsFound) => Err(unusable(None)),
        Err(pem::Error::Io(source)) => Err(TlsError::Read {
            param,
            path: path.to_owned(),
            source,
        }),
        Err(source) => Err(unusable(Some(source))),
    }
}

/// The roots in a CA file, or the public web PKI roots (`None`).
fn load_roots(ca_file: Option<&Path>) -> Result<RootCertStore, TlsError> {
    let Some(path) = ca_file else {
        let roots = webpki_roots::TLS_SERVER_ROOTS.to_vec();
        return Ok(RootCertStore { roots });
    };
    let param = "sslrootcert";
    let expected = "CA certificate that parses as X.509";
    let mut store = RootCertStore::empty();
    let certificates = read_pem(param, path, expected)?;
    let (added, _ignored) = store.add_parsable_certificates(certificates);
    if added == 0 {
        return Err(TlsError::Unusable {
            param,
            path: path.to_owned(),
            expected,
            source: None,
        });
    }
    Ok(store)
}

/// `verify-ca` (with a `chain` verifier): the standard checks but the host name; otherwise any
/// certificate. Handshake signatures are checked either way.
#[derive(Debug)]
struct Lenient {
    chain: Option<Arc<WebPkiServerVerifier>>,
    algorithms: WebPkiSupportedAlgorithms,
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
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests;
