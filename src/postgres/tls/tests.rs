use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

use super::*;

fn info(url: &str) -> PostgresConnInfo {
    PostgresConnInfo::parse(url).unwrap()
}

fn plan(url: &str) -> Result<TlsConfig, TlsError> {
    resolve(&info(url), None)
}

fn ca_file(path: &str) -> Option<PathBuf> {
    Some(PathBuf::from(path))
}

#[test]
fn disable_and_unix_sockets_never_use_tls() {
    for url in [
        "postgres://u@h/db?sslmode=disable&sslrootcert=/ca.pem&sslcert=/c&sslkey=/k",
        "postgres://u@h/db?host=/var/run/postgresql&sslmode=verify-full",
    ] {
        let plan = plan(url).unwrap();
        assert_eq!(plan, TlsConfig::disabled(), "{url}");
        assert_eq!(
            control_mode(&plan),
            tokio_postgres::config::SslMode::Disable
        );
    }
}

#[test]
fn prefer_tries_tls_without_verification() {
    // `allow` is parsed as prefer; a root CA does not make prefer verify.
    for url in [
        "postgres://u@h/db",
        "postgres://u@h/db?sslmode=allow",
        "postgres://u@h/db?sslmode=prefer&sslrootcert=/ca.pem",
    ] {
        let tls = plan(url).unwrap();
        assert_eq!(tls.mode, pgwire_replication::SslMode::Prefer, "{url}");
        assert_eq!(tls.ca_pem_path, None);
        assert_eq!(control_mode(&tls), tokio_postgres::config::SslMode::Prefer);
    }
}

#[test]
fn require_verifies_the_chain_only_when_a_root_ca_exists() {
    let bare = plan("postgres://u@h/db?sslmode=require").unwrap();
    assert_eq!(bare, TlsConfig::require());
    assert_eq!(
        control_mode(&bare),
        tokio_postgres::config::SslMode::Require
    );

    // libpq: require with a root CA file behaves like verify-ca.
    let with_ca = plan("postgres://u@h/db?sslmode=require&sslrootcert=/ca.pem").unwrap();
    assert_eq!(with_ca, TlsConfig::verify_ca(ca_file("/ca.pem")));
    assert_eq!(
        control_mode(&with_ca),
        tokio_postgres::config::SslMode::Require
    );

    // ... and so does libpq's default ~/.postgresql/root.crt when it exists.
    let default = resolve(
        &info("postgres://u@h/db?sslmode=require"),
        Some(Path::new("/home/relay/.postgresql/root.crt")),
    )
    .unwrap();
    assert_eq!(
        default,
        TlsConfig::verify_ca(ca_file("/home/relay/.postgresql/root.crt"))
    );
}

#[test]
fn verify_modes_need_a_root_ca() {
    for (mode, name) in [("verify-ca", "verify-ca"), ("verify-full", "verify-full")] {
        let err = plan(&format!("postgres://u@h/db?sslmode={mode}")).unwrap_err();
        assert!(
            matches!(&err, TlsError::MissingRootCert { mode } if mode == name),
            "{err:?}"
        );
        assert!(err.to_string().contains("sslrootcert="), "{err}");
        let fallback = resolve(
            &info(&format!("postgres://u@h/db?sslmode={mode}")),
            Some(Path::new("/root.crt")),
        )
        .unwrap();
        assert_eq!(fallback.ca_pem_path, ca_file("/root.crt"));
    }
    let ca = plan("postgres://u@h/db?sslmode=verify-ca&sslrootcert=/ca.pem").unwrap();
    assert_eq!(ca, TlsConfig::verify_ca(ca_file("/ca.pem")));
    let full = plan("postgres://u@h/db?sslmode=verify-full&sslrootcert=/ca.pem").unwrap();
    assert_eq!(full, TlsConfig::verify_full(ca_file("/ca.pem")));
}

#[test]
fn verify_full_renders_for_pgwire_with_ip_hosts_checked_by_address() {
    let query = "/db?sslmode=verify-full&sslrootcert=/ca.pem";
    let by_name = plan(&format!("postgres://u@db.internal{query}")).unwrap();
    assert_eq!(by_name, TlsConfig::verify_full(ca_file("/ca.pem")));
    let by_ip = plan(&format!("postgres://u@127.0.0.1{query}")).unwrap();
    assert_eq!(by_ip.sni_hostname.as_deref(), Some("127.0.0.1"));
    assert_eq!(by_ip.mode, pgwire_replication::SslMode::VerifyFull);
    let by_ipv6 = plan(&format!("postgres://u@[::1]{query}")).unwrap();
    assert_eq!(by_ipv6.sni_hostname.as_deref(), Some("::1"));
    // verify-ca checks no name, so needs no SNI name either.
    let ca = plan("postgres://u@127.0.0.1/db?sslmode=verify-ca&sslrootcert=/ca.pem").unwrap();
    assert_eq!(ca.sni_hostname, None);
}

#[test]
fn system_roots_only_with_verify_full() {
    let full = plan("postgres://u@h/db?sslmode=verify-full&sslrootcert=system").unwrap();
    assert_eq!(full, TlsConfig::verify_full(None));
    assert!(load_roots(None).unwrap().len() > 50);
    for mode in ["require", "verify-ca", "prefer"] {
        let err = plan(&format!(
            "postgres://u@h/db?sslmode={mode}&sslrootcert=system"
        ))
        .unwrap_err();
        assert!(
            matches!(err, TlsError::SystemRootsNeedVerifyFull { .. }),
            "{mode}: {err:?}"
        );
    }
}

#[test]
fn client_certificates_need_both_files() {
    let tls = plan("postgres://u@h/db?sslmode=require&sslcert=/c.crt&sslkey=/c.key").unwrap();
    assert!(tls.is_mtls());
    assert_eq!(tls.client_cert_pem_path, Some(PathBuf::from("/c.crt")));
    assert_eq!(tls.client_key_pem_path, Some(PathBuf::from("/c.key")));
    let err = plan("postgres://u@h/db?sslmode=require&sslcert=/c.crt").unwrap_err();
    assert!(matches!(err, TlsError::IncompleteClientCert), "{err:?}");
    let err = plan("postgres://u@h/db?sslmode=require&sslkey=/c.key").unwrap_err();
    assert!(matches!(err, TlsError::IncompleteClientCert), "{err:?}");
}

/// A CA and a server certificate for `names`, written as PEM files.
struct Pki {
    dir: tempfile::TempDir,
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    fn new(name: &str) -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        Pki { dir, ca }
    }

    fn ca_path(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A leaf for `names`, its PEM files written as `<stem>.crt` / `<stem>.key`.
    fn leaf(&self, stem: &str, names: &[&str]) -> CertificateDer<'static> {
        let key = KeyPair::generate().unwrap();
        let params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        std::fs::write(self.dir.path().join(format!("{stem}.crt")), cert.pem()).unwrap();
        std::fs::write(
            self.dir.path().join(format!("{stem}.key")),
            key.serialize_pem(),
        )
        .unwrap();
        cert.der().clone()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn verifier_for(url: &str) -> Arc<dyn ServerCertVerifier> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    verifier(&plan(url).unwrap(), provider).unwrap()
}

fn check(verifier: &dyn ServerCertVerifier, leaf: &CertificateDer<'_>, host: &str) -> bool {
    let name = ServerName::try_from(host.to_owned()).unwrap();
    verifier
        .verify_server_cert(leaf, &[], &name, &[], UnixTime::now())
        .is_ok()
}

#[test]
fn verifiers_check_what_each_mode_promises() {
    let pki = Pki::new("relay test CA");
    let other = Pki::new("someone else's CA");
    let leaf = pki.leaf("server", &["db.internal", "127.0.0.1"]);
    let stranger = other.leaf("server", &["db.internal"]);
    let ca = pki.ca_path().display().to_string();

    let full = verifier_for(&format!(
        "postgres://u@db.internal/db?sslmode=verify-full&sslrootcert={ca}"
    ));
    assert!(check(full.as_ref(), &leaf, "db.internal"));
    assert!(check(full.as_ref(), &leaf, "127.0.0.1"));
    assert!(!check(full.as_ref(), &leaf, "other.internal"));
    assert!(!check(full.as_ref(), &stranger, "db.internal"));

    // verify-ca (and require with a root CA): the name does not matter, the CA does.
    for mode in ["verify-ca", "require"] {
        let chain = verifier_for(&format!(
            "postgres://u@h/db?sslmode={mode}&sslrootcert={ca}"
        ));
        assert!(check(chain.as_ref(), &leaf, "other.internal"), "{mode}");
        assert!(!check(chain.as_ref(), &stranger, "db.internal"), "{mode}");
    }

    // require without a CA: anything.
    let any = verifier_for("postgres://u@h/db?sslmode=require");
    assert!(check(any.as_ref(), &stranger, "other.internal"));
    assert!(!any.supported_verify_schemes().is_empty());
}

#[test]
fn connectors_build_for_every_mode_without_a_default_provider() {
    let pki = Pki::new("relay test CA");
    pki.leaf("client", &["relay"]);
    let ca = pki.ca_path().display().to_string();
    let cert = pki.path("client.crt");
    let key = pki.path("client.key");
    for (query, expected) in [
        ("sslmode=disable", tokio_postgres::config::SslMode::Disable),
        ("sslmode=prefer", tokio_postgres::config::SslMode::Prefer),
        ("sslmode=require", tokio_postgres::config::SslMode::Require),
        (
            &format!("sslmode=verify-ca&sslrootcert={ca}"),
            tokio_postgres::config::SslMode::Require,
        ),
        (
            &format!(
                "sslmode=verify-full&sslrootcert={ca}&sslcert={}&sslkey={}",
                cert.display(),
                key.display()
            ),
            tokio_postgres::config::SslMode::Require,
        ),
    ] {
        let url = format!("postgres://u@h/db?{query}");
        let (mode, _connector) = control_tls(&info(&url)).unwrap();
        assert_eq!(mode, expected, "{query}");
        replication_tls(&info(&url)).unwrap();
    }
}

#[test]
fn unusable_files_are_named_with_their_parameter() {
    let pki = Pki::new("relay test CA");
    pki.leaf("client", &["relay"]);
    let other = Pki::new("other");
    other.leaf("other", &["relay"]);
    std::fs::write(pki.path("garbage.pem"), "this is not PEM\n").unwrap();
    std::fs::write(
        pki.path("truncated.pem"),
        "-----BEGIN CERTIFICATE-----\nMIIB\n",
    )
    .unwrap();
    let missing = pki.path("missing.pem");

    let err_for = |query: String| -> TlsError {
        let info = info(&format!("postgres://u@h/db?{query}"));
        let control = control_tls(&info).err().expect("control connector refused");
        let replication = replication_tls(&info).unwrap_err();
        // Both connections report the same problem.
        assert_eq!(control.to_string(), replication.to_string());
        control
    };

    let err = err_for(format!(
        "sslmode=verify-full&sslrootcert={}",
        missing.display()
    ));
    assert!(
        matches!(
            err,
            TlsError::Read {
                param: "sslrootcert",
                ..
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains(&missing.display().to_string()), "{text}");
    assert!(text.contains("sslrootcert"), "{text}");

    let err = err_for(format!(
        "sslmode=require&sslrootcert={}",
        pki.path("garbage.pem").display()
    ));
    assert!(
        matches!(err, TlsError::Unusable { source: None, .. }),
        "{err:?}"
    );

    let err = err_for(format!(
        "sslmode=verify-ca&sslrootcert={}",
        pki.path("truncated.pem").display()
    ));
    assert!(
        matches!(
            err,
            TlsError::Unusable {
                source: Some(_),
                ..
            }
        ),
        "{err:?}"
    );

    // A key file holding a certificate: no private key in it.
    let err = err_for(format!(
        "sslmode=require&sslcert={}&sslkey={}",
        pki.path("client.crt").display(),
        pki.path("client.crt").display()
    ));
    assert!(
        matches!(
            err,
            TlsError::Unusable {
                param: "sslkey",
                source: None,
                ..
            }
        ),
        "{err:?}"
    );

    let err = err_for(format!(
        "sslmode=require&sslcert={}&sslkey={}",
        missing.display(),
        pki.path("client.key").display()
    ));
    assert!(
        matches!(
            err,
            TlsError::Read {
                param: "sslcert",
                ..
            }
        ),
        "{err:?}"
    );

    // The wrong key for the certificate: refused when the control connector is built.
    let info = info(&format!(
        "postgres://u@h/db?sslmode=require&sslcert={}&sslkey={}",
        pki.path("client.crt").display(),
        other.path("other.key").display()
    ));
    let err = control_tls(&info).err().expect("mismatched key refused");
    assert!(matches!(err, TlsError::ClientCert { .. }), "{err:?}");
}

#[test]
fn handshake_hints_name_the_fix() {
    let unknown = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
    assert!(handshake_hint(&unknown).contains("sslrootcert"));
    let name = rustls::Error::InvalidCertificate(CertificateError::NotValidForName);
    assert!(handshake_hint(&name).contains("verify-ca"));
}
