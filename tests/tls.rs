//! TLS to Postgres: a cluster that accepts only TLS on TCP (`hostssl ... scram-sha-256`,
//! `hostnossl ... reject`), with a CA and a server certificate made here by rcgen.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

use crate::support::kafka::Broker;
use crate::support::postgres::{PgCluster, PgOptions, give_to_server_user};
use crate::support::relay::{Relay, run_to_exit};
use crate::support::world::{SCHEMA, World};

/// The relay's exit code for configuration problems (`exit_code::CONFIG`).
const EXIT_CONFIG: i32 = 2;

/// Certificates for one test: the server's CA, a server certificate for
/// `localhost` and `127.0.0.1`, and an unrelated CA.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        Pki::for_names(&["localhost", "127.0.0.1"])
    }

    /// Like [`Pki::new`], with a server certificate for `names`.
    fn for_names(names: &[&str]) -> Pki {
        // Under /tmp, like the clusters: the server (user `postgres` when we are root)
        // reads the certificate and key from here.
        let dir = tempfile::Builder::new()
            .prefix("pgtls-")
            .tempdir_in("/tmp")
            .expect("temp dir for certificates");
        let ca = certificate_authority("outbox-relay test CA");
        let other = certificate_authority("some other CA");
        let server_key = KeyPair::generate().expect("server key");
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("server certificate parameters");
        params.distinguished_name.push(DnType::CommonName, names[0]);
        let server = params
            .signed_by(&server_key, &ca)
            .expect("sign server certificate");

        let write = |name: &str, contents: &str| {
            std::fs::write(dir.path().join(name), contents).expect("write PEM file");
        };
        write("ca.pem", &ca.pem());
        write("other-ca.pem", &other.pem());
        write("server.crt", &server.pem());
        write("server.key", &server_key.serialize_pem());
        set_mode(&dir.path().join("server.key"), 0o600);
        give_to_server_user(dir.path());
        Pki { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn certificate_authority(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key")).expect("CA")
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// A Postgres that refuses plaintext TCP, with the outbox schema, and a mock Kafka.
async fn tls_world(pki: &Pki) -> World {
    let file = |name: &str| pki.path(name).display().to_string();
    let pg = PgCluster::start_with(PgOptions {
        extra_conf: vec![
            ("ssl".into(), "on".into()),
            ("ssl_cert_file".into(), file("server.crt")),
            ("ssl_key_file".into(), file("server.key")),
            // Logs each connection's TLS state and authentication method.
            ("log_connections".into(), "on".into()),
        ],
        extra_hba: vec![
            "hostssl   all          all 127.0.0.1/32 scram-sha-256".into(),
            "hostssl   replication  all 127.0.0.1/32 scram-sha-256".into(),
            "hostnossl all          all 127.0.0.1/32 reject".into(),
            "hostnossl replication  all 127.0.0.1/32 reject".into(),
        ],
        major: None,
    });
    // The harness's client uses the unix socket, so this works with TCP TLS-only.
    pg.execute(SCHEMA).await;
    World {
        pg,
        broker: Broker::start(),
    }
}

fn url_with(world: &World, query: &str) -> String {
    format!("{}?{query}", world.pg.url())
}

/// Inserts one event and checks it arrives on Kafka.
async fn relays_one_event(world: &World, relay: &Relay, event_type: &str) {
    let ids = world
        .insert_tx(&[(event_type, "order-1", r#"{"over": "tls"}"#)])
        .await;
    let records = world
        .broker
        .consume(&[event_type], 1, Duration::from_secs(30));
    assert_eq!(records.len(), 1, "relay log:\n{}", relay.log());
    assert_eq!(records[0].id(), ids[0]);
    assert_eq!(
        records[0].payload_text().as_deref(),
        Some(r#"{"over": "tls"}"#)
    );
}

/// The relay's walsender is encrypted, and none is not.
async fn assert_walsender_uses_tls(world: &World) {
    let rows = world
        .pg
        .execute(
            "SELECT s.ssl::text FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.backend_type = 'walsender' AND a.application_name = 'outbox-relay'",
        )
        .await;
    assert!(!rows.is_empty(), "no walsender for the relay");
    assert!(
        rows.iter().all(|r| r[0].as_deref() == Some("true")),
        "{rows:?}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn require_streams_over_tls_and_authenticates_with_scram() {
    let pki = Pki::new();
    let world = tls_world(&pki).await;
    let mut relay = Relay::spawn(
        &url_with(&world, "sslmode=require"),
        &world.broker.bootstrap(),
        &[],
    );
    relay.wait_streaming();
    relays_one_event(&world, &relay, "OverRequire").await;
    assert_walsender_uses_tls(&world).await;

    // SCRAM-SHA-256 is what the server stores and what pg_hba demands...
    let setting = world.pg.execute("SHOW password_encryption").await;
    assert_eq!(setting[0][0].as_deref(), Some("scram-sha-256"));
    let stored = world
        .pg
        .execute(
            "SELECT (rolpassword LIKE 'SCRAM-SHA-256$%')::text FROM pg_authid \
             WHERE rolname = 'postgres'",
        )
        .await;
    assert_eq!(stored[0][0].as_deref(), Some("true"));
    // ... and what the server logged for the relay's connections, both encrypted.
    let log = std::fs::read_to_string(world.pg.log_file()).unwrap_or_default();
    let relay_lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("connection authorized") && l.contains("outbox-relay"))
        .collect();
    assert!(
        relay_lines.len() >= 2
            && relay_lines.iter().all(|l| l.contains("SSL enabled"))
            && relay_lines
                .iter()
                .any(|l| l.contains("replication connection")),
        "{relay_lines:#?}"
    );
    assert!(
        log.contains(r#"identity="postgres" method=scram-sha-256"#),
        "server log:\n{log}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn verify_full_with_the_servers_ca_streams_by_ip_address() {
    let pki = Pki::new();
    let world = tls_world(&pki).await;
    let query = format!(
        "sslmode=verify-full&sslrootcert={}",
        pki.path("ca.pem").display()
    );
    let mut relay = Relay::spawn(&url_with(&world, &query), &world.broker.bootstrap(), &[]);
    relay.wait_streaming();
    relays_one_event(&world, &relay, "OverVerifyFull").await;
    assert_walsender_uses_tls(&world).await;
}

#[tokio::test(flavor = "current_thread")]
async fn verify_full_with_another_ca_is_refused() {
    let pki = Pki::new();
    let world = tls_world(&pki).await;
    let query = format!(
        "sslmode=verify-full&sslrootcert={}",
        pki.path("other-ca.pem").display()
    );
    let (code, log) = run_to_exit(&url_with(&world, &query), &world.broker.bootstrap(), &[]);
    assert_eq!(code, Some(EXIT_CONFIG), "log:\n{log}");
    assert!(log.contains("TLS handshake"), "log:\n{log}");
    assert!(log.contains("certificate"), "log:\n{log}");
    assert!(log.contains("sslrootcert"), "log:\n{log}");
}

#[tokio::test(flavor = "current_thread")]
async fn verify_full_with_an_unreadable_ca_file_names_it() {
    let pki = Pki::new();
    let world = tls_world(&pki).await;
    let missing = pki.path("no-such-ca.pem");
    let query = format!("sslmode=verify-full&sslrootcert={}", missing.display());
    let (code, log) = run_to_exit(&url_with(&world, &query), &world.broker.bootstrap(), &[]);
    assert_eq!(code, Some(EXIT_CONFIG), "log:\n{log}");
    assert!(log.contains(&missing.display().to_string()), "log:\n{log}");
}

#[tokio::test(flavor = "current_thread")]
async fn disable_is_refused_by_a_tls_only_server() {
    let pki = Pki::new();
    let world = tls_world(&pki).await;
    let (code, log) = run_to_exit(
        &url_with(&world, "sslmode=disable"),
        &world.broker.bootstrap(),
        &[],
    );
    assert_eq!(code, Some(EXIT_CONFIG), "log:\n{log}");
    assert!(
        log.contains("pg_hba.conf rejects connection"),
        "log:\n{log}"
    );
    assert!(log.contains("no encryption"), "log:\n{log}");
}

#[tokio::test(flavor = "current_thread")]
async fn password_file_supplies_the_password_the_url_leaves_out() {
    let pki = Pki::new();
    let world = tls_world(&pki).await;
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=require",
        world.pg.port()
    );
    let secrets = tempfile::tempdir().expect("temp dir");

    // A wrong password: refused at start-up, and never printed.
    let wrong = secrets.path().join("wrong");
    std::fs::write(&wrong, "not-the-password-4711\n").expect("write password file");
    let (code, log) = run_to_exit(
        &url,
        &world.broker.bootstrap(),
        &[
            "--postgres-password-file",
            wrong.to_str().expect("utf-8 path"),
        ],
    );
    assert_eq!(code, Some(EXIT_CONFIG), "log:\n{log}");
    assert!(
        log.contains("password authentication failed"),
        "log:\n{log}"
    );
    assert!(!log.contains("not-the-password-4711"), "log:\n{log}");

    // The right one, with the trailing newline `echo` leaves.
    let right = secrets.path().join("right");
    std::fs::write(&right, format!("{}\n", PgCluster::PASSWORD)).expect("write password file");
    let mut relay = Relay::spawn(
        &url,
        &world.broker.bootstrap(),
        &[
            "--postgres-password-file",
            right.to_str().expect("utf-8 path"),
        ],
    );
    relay.wait_streaming();
    relays_one_event(&world, &relay, "WithPasswordFile").await;
    assert!(!relay.log().contains(PgCluster::PASSWORD));
}

/// pgwire-replication 0.5's verify-ca still checks the host name (its verifier misses
/// rustls 0.23's `NotValidForNameContext`): the control connection is accepted, the
/// replication connection is not. Pins the current behaviour and its message; when
/// pgwire-replication is fixed this should stream instead.
#[tokio::test(flavor = "current_thread")]
async fn verify_ca_with_a_certificate_for_another_name_is_refused_by_pgwire() {
    let pki = Pki::for_names(&["db.example"]);
    let world = tls_world(&pki).await;
    let query = format!(
        "sslmode=verify-ca&sslrootcert={}",
        pki.path("ca.pem").display()
    );
    let (code, log) = run_to_exit(&url_with(&world, &query), &world.broker.bootstrap(), &[]);
    assert_eq!(code, Some(EXIT_CONFIG), "log:\n{log}");
    // The control connection (our verifier) read the catalog; the replication connection,
    // opened for IDENTIFY_SYSTEM before anything is created, was refused, and nothing was
    // created (issue 33: this start used to leave the publication behind).
    assert!(
        log.contains("cannot open the replication connection"),
        "log:\n{log}"
    );
    assert!(!log.contains("created publication"), "log:\n{log}");
    let publications = world.pg.execute("SELECT pubname FROM pg_publication").await;
    assert!(publications.is_empty(), "{publications:?}");
    assert!(
        log.contains("pgwire-replication 0.5 checks the name"),
        "log:\n{log}"
    );
}
