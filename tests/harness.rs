//! Tests of the Postgres test harness itself.

use std::net::{Ipv4Addr, TcpStream};
use std::time::Duration;

use crate::support::postgres::{PgCluster, PgOptions};

fn one(rows: &[Vec<Option<String>>]) -> String {
    match rows {
        [row] => match row.as_slice() {
            [Some(v)] => v.clone(),
            other => panic!("expected one non-null column, got {other:?}"),
        },
        other => panic!("expected one row, got {other:?}"),
    }
}

fn accepts_tcp(port: u16) -> bool {
    TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, port).into(), Duration::from_secs(1)).is_ok()
}

#[tokio::test]
async fn starts_configured_for_logical_replication() {
    let pg = PgCluster::start();
    assert_ne!(pg.port(), 0);
    assert!(pg.data_dir().join("PG_VERSION").is_file());
    assert_eq!(
        pg.url(),
        format!(
            "postgres://postgres:{}@127.0.0.1:{}/postgres",
            PgCluster::PASSWORD,
            pg.port()
        )
    );

    for (setting, expected) in [
        ("wal_level", "logical"),
        ("max_wal_senders", "10"),
        ("max_replication_slots", "10"),
        ("listen_addresses", "127.0.0.1"),
        ("fsync", "off"),
        ("synchronous_commit", "on"),
        ("shared_buffers", "128MB"),
        ("log_min_messages", "warning"),
        ("password_encryption", "scram-sha-256"),
    ] {
        let value = one(&pg.execute(&format!("SHOW {setting}")).await);
        assert_eq!(value, expected, "setting {setting}");
    }
    let port = one(&pg.execute("SHOW port").await);
    assert_eq!(port, pg.port().to_string());
    let version = one(&pg.execute("SHOW server_version_num").await);
    assert!(version.as_str() >= "150000", "server_version_num {version}");

    // Several statements; rows of all of them, NULLs as None.
    let rows = pg
        .execute(
            "CREATE TABLE t (id int PRIMARY KEY, v text);
             INSERT INTO t VALUES (1, 'a'), (2, NULL);
             SELECT id::text, v FROM t ORDER BY id;
             SELECT 'x' AS x",
        )
        .await;
    assert_eq!(
        rows,
        vec![
            vec![Some("1".to_owned()), Some("a".to_owned())],
            vec![Some("2".to_owned()), None],
            vec![Some("x".to_owned())],
        ]
    );

    // Logical decoding works end to end.
    pg.execute(
        "SELECT pg_create_logical_replication_slot('harness_slot', 'test_decoding');
         CREATE PUBLICATION harness_pub FOR TABLE t;
         INSERT INTO t VALUES (3, 'c')",
    )
    .await;
    let changes = pg
        .execute("SELECT data FROM pg_logical_slot_get_changes('harness_slot', NULL, NULL)")
        .await;
    assert!(
        changes.iter().any(|r| r[0]
            .as_deref()
            .is_some_and(|d| d.contains("INSERT") && d.contains("'c'"))),
        "{changes:?}"
    );
}

#[tokio::test]
async fn tcp_uses_password_auth_and_hba_allows_replication() {
    let pg = PgCluster::start();

    let hba = pg
        .execute(
            "SELECT type, array_to_string(database, ','), coalesce(address, ''), auth_method
             FROM pg_hba_file_rules ORDER BY line_number",
        )
        .await;
    let hba: Vec<String> = hba
        .iter()
        .map(|r| {
            r.iter()
                .map(|c| c.clone().unwrap_or_default())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    for rule in [
        "local all  trust",
        "host all 127.0.0.1 scram-sha-256",
        "host replication 127.0.0.1 scram-sha-256",
    ] {
        assert!(hba.iter().any(|r| r == rule), "missing {rule:?} in {hba:?}");
    }

    // Wrong password: refused.
    let bad = pg.url_for("postgres", "wrong", "postgres");
    match pg.try_connect(&bad).await {
        Ok(_) => panic!("connected with a wrong password"),
        Err(e) => assert!(e.contains("password authentication failed"), "{e}"),
    }

    // Another role with an awkward password, on another database.
    let password = "p@ss:w/rd%?#&'";
    pg.execute(&format!(
        "CREATE ROLE relay LOGIN REPLICATION PASSWORD '{}'",
        password.replace('\'', "''")
    ))
    .await;
    // CREATE DATABASE cannot run in a (multi-statement, implicit) transaction.
    pg.execute("CREATE DATABASE app OWNER relay").await;
    let client = pg.connect(&pg.url_for("relay", password, "app")).await;
    let row = match client
        .query_one("SELECT current_user::text, current_database()::text", &[])
        .await
    {
        Ok(row) => row,
        Err(e) => panic!("query failed: {e}"),
    };
    assert_eq!(row.get::<_, String>(0), "relay");
    assert_eq!(row.get::<_, String>(1), "app");

    // The superuser client.
    let su = pg.client().await;
    match su
        .query_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await
    {
        Ok(row) => assert!(row.get::<_, bool>(0)),
        Err(e) => panic!("query failed: {e}"),
    }
    assert_eq!(pg.kill_walsenders().await, 0);
}

#[tokio::test]
async fn stop_and_restart_keep_port_and_data() {
    let mut pg = PgCluster::start();
    let port = pg.port();
    let data_dir = pg.data_dir().to_path_buf();
    pg.execute("CREATE TABLE kept (v text); INSERT INTO kept VALUES ('before restart')")
        .await;
    // A slot cannot be created in a transaction that wrote: separate call.
    pg.execute("SELECT pg_create_logical_replication_slot('kept_slot', 'pgoutput')")
        .await;

    pg.restart();
    assert_eq!(pg.port(), port);
    assert_eq!(pg.data_dir(), data_dir);
    assert_eq!(
        one(&pg.execute("SELECT v FROM kept").await),
        "before restart"
    );
    assert_eq!(
        one(&pg
            .execute("SELECT slot_name::text FROM pg_replication_slots")
            .await),
        "kept_slot"
    );

    pg.stop();
    pg.stop(); // idempotent
    assert!(!pg.is_running());
    assert!(!accepts_tcp(port));
    assert!(pg.try_connect(&pg.url()).await.is_err());

    pg.restart();
    assert!(pg.is_running());
    assert_eq!(one(&pg.execute("SELECT count(*) FROM kept").await), "1");
}

#[tokio::test]
async fn start_with_applies_extra_conf() {
    let pg = PgCluster::start_with(PgOptions {
        extra_conf: vec![
            ("max_replication_slots".into(), "20".into()),
            ("application_name".into(), "it's quoted".into()),
            ("wal_sender_timeout".into(), "'5s'".into()),
        ],
        extra_hba: vec!["host all blocked 127.0.0.1/32 reject".into()],
        major: None,
    });
    assert_eq!(one(&pg.execute("SHOW max_replication_slots").await), "20");
    assert_eq!(one(&pg.execute("SHOW wal_sender_timeout").await), "5s");
    // Defaults that were not overridden stay.
    assert_eq!(one(&pg.execute("SHOW wal_level").await), "logical");

    pg.execute("CREATE ROLE blocked LOGIN PASSWORD 'pw'").await;
    match pg
        .try_connect(&pg.url_for("blocked", "pw", "postgres"))
        .await
    {
        Ok(_) => panic!("the extra pg_hba line did not apply"),
        Err(e) => assert!(e.contains("rejects connection"), "{e}"),
    }
}

#[test]
fn parallel_clusters_are_independent_and_cleaned_up() {
    let clusters: Vec<PgCluster> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4).map(|_| s.spawn(PgCluster::start)).collect();
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(pg) => pg,
                Err(_) => panic!("a cluster failed to start"),
            })
            .collect()
    });
    let mut ports: Vec<u16> = clusters.iter().map(PgCluster::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), clusters.len(), "ports must be unique");
    let mut dirs: Vec<_> = clusters
        .iter()
        .map(|c| c.data_dir().to_path_buf())
        .collect();
    dirs.sort();
    dirs.dedup();
    assert_eq!(dirs.len(), clusters.len(), "data dirs must be unique");

    for pg in clusters {
        let port = pg.port();
        let data_dir = pg.data_dir().to_path_buf();
        let socket_dir = pg.socket_dir().to_path_buf();
        assert!(accepts_tcp(port));
        drop(pg);
        assert!(!accepts_tcp(port), "port {port} still open after drop");
        assert!(!data_dir.exists(), "{} left behind", data_dir.display());
        assert!(!socket_dir.exists(), "{} left behind", socket_dir.display());
    }
}

#[tokio::test]
#[should_panic(expected = "no_such_table")]
async fn execute_panics_with_the_sql() {
    let pg = PgCluster::start();
    pg.execute("SELECT * FROM no_such_table").await;
}
