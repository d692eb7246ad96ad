//! The Schema Registry client's settings, each shown against the test registry: several URLs
//! (the first down), https with the registry's own CA (`--schema-registry-ca`, and a converter's
//! PEM `schema.registry.ssl.truststore.*` with `basic.auth.credentials.source=USER_INFO`
//! imported by `--debezium-config`), `use.latest.version` without auto-registration (the
//! subject's latest schema is used and nothing is registered; a latest schema that is not the
//! event's is refused by name), and a schema missing without auto-registration (refused,
//! naming the subject and the remedy).

use std::time::Duration;

use crate::registry::{assert_avro, avro_relay, framed};
use crate::support::kafka::Consumed;
use crate::support::postgres::{PgCluster, reserve_free_port};
use crate::support::registry::Registry;
use crate::support::relay::Relay;
use crate::support::world::World;

const SLOT: &str = "outbox_relay";
/// The relay's exit code for a poison event under the default `--on-poison stop`.
const EXIT_POISON: i32 = 5;

/// Inserts two events of `event_type`, waits until the slot confirms them and reads them back.
async fn relayed(world: &World, event_type: &str) -> Vec<Consumed> {
    let rows = [
        (event_type, "a", r#"{"n": 1}"#),
        (event_type, "b", r#"{"n": 1}"#),
    ];
    let ids = world.insert_tx(&rows).await;
    delivered(world, event_type, &ids).await
}

/// Waits until the slot confirms the WAL's end, then reads `ids` back from `topic`, once each.
async fn delivered(world: &World, topic: &str, ids: &[String]) -> Vec<Consumed> {
    world.wait_caught_up(SLOT, Duration::from_secs(60)).await;
    let mut records = tokio::task::block_in_place(|| {
        world
            .broker
            .consume_ids(&[topic], ids, Duration::from_secs(30))
    });
    records.retain(|r| ids.contains(&r.id()));
    let mut got: Vec<String> = records.iter().map(Consumed::id).collect();
    got.sort();
    let mut expected = ids.to_vec();
    expected.sort();
    assert_eq!(got, expected, "each event once");
    records
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_of_several_urls_answers_when_the_first_is_down() {
    let world = World::start().await;
    let registry = Registry::spawn().await;
    let down = format!("http://127.0.0.1:{}", reserve_free_port());
    let urls = format!("{down},{}", registry.url());
    let args = [
        "--key-converter",
        "avro",
        "--value-converter",
        "avro",
        "--schema-registry-url",
        &urls,
    ];
    let mut relay = Relay::spawn(&world.pg.url(), &world.broker.bootstrap(), &args);
    tokio::task::block_in_place(|| relay.wait_streaming());
    let records = relayed(&world, "Urls").await;
    assert_avro(&records, &registry);
    // The first URL's refusals are not the registry's: no request counts as unavailable.
    let requests = relay.metric_samples("outbox_relay_schema_registry_requests_total");
    let outcome = |name: &str| {
        let sample = requests.iter().find(|(labels, _)| labels.contains(name));
        sample.map_or(0.0, |(_, v)| *v)
    };
    assert_eq!(
        (outcome("\"ok\""), outcome("unavailable")),
        (2.0, 0.0),
        "{requests:?}"
    );
    relay.stop();
}

/// The https `registry`'s CA certificate, written into `dir`.
fn ca_file(registry: &Registry, dir: &std::path::Path) -> std::path::PathBuf {
    let ca = dir.join("registry-ca.pem");
    std::fs::write(&ca, registry.ca_pem().unwrap()).unwrap();
    ca
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_registry_is_trusted_through_its_own_ca() {
    let world = World::start().await;
    let registry = Registry::spawn_tls().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = ca_file(&registry, dir.path());

    // Without its CA (the public roots), the registry is not trusted: events wait, and
    // /readyz says why.
    let mut relay = avro_relay(&world, &registry, &[]);
    tokio::task::block_in_place(|| relay.wait_streaming());
    let first = world.insert_tx(&[("Tls", "a", r#"{"n": 1}"#)]).await;
    let inserted = world.current_lsn().await;
    let untrusted = relay.wait_for(Duration::from_secs(60), |r| {
        r.readyz()
            .is_some_and(|z| z["ready"] == false && z.to_string().contains("TLS handshake"))
    });
    assert!(
        untrusted,
        "readyz names the TLS failure; log:\n{}",
        relay.log()
    );
    assert!(world.confirmed_flush(SLOT).await.unwrap() < inserted);
    assert_eq!(registry.requests(), 0);
    // A clean stop would wait --shutdown-timeout for the registry.
    relay.kill();

    let ca = ca.to_str().unwrap();
    let mut relay = avro_relay(&world, &registry, &["--schema-registry-ca", ca]);
    let records = delivered(&world, "Tls", &first).await;
    assert_avro(&records, &registry);
    relay.stop();
}

/// A connector config for [`World`]'s outbox with Confluent's `AvroConverter` for keys and
/// values, each with `settings` (`key.converter.` and `value.converter.` prefixed).
fn avro_connector(world: &World, settings: &[(&str, &str)]) -> serde_json::Value {
    let mut config = serde_json::json!({
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "plugin.name": "pgoutput",
        "database.hostname": "127.0.0.1",
        "database.port": world.pg.port().to_string(),
        "database.user": "postgres",
        "database.password": PgCluster::PASSWORD,
        "database.dbname": "postgres",
        "slot.name": SLOT,
        "topic.prefix": "dbserver1",
        "table.include.list": "public.outbox",
        "transforms": "outbox",
        "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
        "transforms.outbox.table.field.event.key": "aggregate_id",
        "transforms.outbox.table.field.event.type": "event_type",
        "transforms.outbox.route.by.field": "event_type",
        "transforms.outbox.route.topic.replacement": "${routedByValue}",
        "key.converter": "io.confluent.connect.avro.AvroConverter",
        "value.converter": "io.confluent.connect.avro.AvroConverter",
    });
    for role in ["key", "value"] {
        for (name, value) in settings {
            config[format!("{role}.converter.{name}")] = serde_json::json!(value);
        }
    }
    serde_json::json!({ "name": "outbox-connector", "config": config })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_pem_truststore_and_user_info_reach_a_registry_that_requires_both() {
    let world = World::start().await;
    let registry = Registry::spawn_tls().await;
    let secret = "api-key:s3cret-api-secret";
    registry.require_auth(secret);
    let dir = tempfile::tempdir().unwrap();
    let ca = ca_file(&registry, dir.path());
    let url = registry.url();
    let connector = avro_connector(
        &world,
        &[
            ("schema.registry.url", &url),
            ("basic.auth.credentials.source", "USER_INFO"),
            ("basic.auth.user.info", secret),
            (
                "schema.registry.ssl.truststore.location",
                ca.to_str().unwrap(),
            ),
            ("schema.registry.ssl.truststore.type", "PEM"),
        ],
    );
    let file = dir.path().join("connector.json");
    std::fs::write(&file, connector.to_string()).unwrap();
    let mut relay = Relay::spawn_raw(&[
        "--debezium-config",
        file.to_str().unwrap(),
        "--kafka-brokers",
        &world.broker.bootstrap(),
    ]);
    tokio::task::block_in_place(|| relay.wait_streaming());
    let records = relayed(&world, "Imported").await;
    assert_avro(&records, &registry);
    relay.stop();
    assert!(!relay.log().contains("s3cret"), "{}", relay.log());
}

/// `subject`'s registered versions' ids.
fn versions(registry: &Registry, subject: &str) -> Vec<u32> {
    let dump = registry.dump();
    dump.get(subject)
        .map(|versions| versions.iter().map(|(id, _)| *id).collect())
        .unwrap_or_default()
}

/// The Avro schemas the relay registers for an event of [`World`]'s outbox: its key (the
/// aggregate id, nullable text) and its value (the jsonb payload).
const KEY_SCHEMA: &str = r#"["null","string"]"#;
const VALUE_SCHEMA: &str =
    r#"["null",{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Json"}]"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn use_latest_version_writes_with_the_latest_schema_and_registers_nothing() {
    let world = World::start().await;
    let registry = Registry::spawn().await;
    registry.set_compatibility("", "NONE");
    // Each subject's latest is the relay's schema with documentation the relay does not
    // write, after an older version: only the latest version's id can be the records'.
    let documented = VALUE_SCHEMA.replace(
        r#""type":"string","#,
        r#""type":"string","doc":"the event, as JSON","#,
    );
    for (subject, latest) in [
        ("Latest-key", KEY_SCHEMA),
        ("Latest-value", documented.as_str()),
        ("Unfit-key", KEY_SCHEMA),
    ] {
        registry.register(subject, r#""bytes""#).unwrap();
        registry.register(subject, latest).unwrap();
    }
    registry.register("Unfit-value", r#""long""#).unwrap();
    let before = registry.dump();

    let args = [
        "--schema-registry-auto-register",
        "false",
        "--schema-registry-use-latest-version",
        "true",
    ];
    let mut relay = avro_relay(&world, &registry, &args);
    tokio::task::block_in_place(|| relay.wait_streaming());
    let records = relayed(&world, "Latest").await;
    for record in &records {
        let (key_id, _) = framed(record.key.as_ref());
        let (value_id, _) = framed(record.payload.as_ref());
        assert_eq!(key_id, versions(&registry, "Latest-key")[1], "{record:?}");
        assert_eq!(
            value_id,
            versions(&registry, "Latest-value")[1],
            "{record:?}"
        );
    }
    assert_eq!(registry.dump(), before, "the relay registered nothing");

    // A subject whose latest schema cannot encode the event: refused, by subject.
    let encoded = world.current_lsn().await;
    world.insert_tx(&[("Unfit", "c", r#"{"n": 1}"#)]).await;
    let status = tokio::task::block_in_place(|| relay.wait_exit(Duration::from_secs(60)));
    let log = relay.log();
    assert_eq!(status.and_then(|s| s.code()), Some(EXIT_POISON), "{log}");
    for needle in [
        "\"Unfit-value\"",
        "is not the event's",
        "register the event's schema",
    ] {
        assert!(log.contains(needle), "{needle:?} in:\n{log}");
    }
    assert!(world.confirmed_flush(SLOT).await.unwrap() <= encoded);
    assert_eq!(registry.dump(), before, "the relay registered nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_auto_registration_a_missing_schema_is_refused_naming_the_subject() {
    let world = World::start().await;
    let registry = Registry::spawn().await;
    // The key's schema is there, the value's is not.
    registry.register("Missing-key", KEY_SCHEMA).unwrap();
    let args = ["--schema-registry-auto-register", "false"];
    let mut relay = avro_relay(&world, &registry, &args);
    tokio::task::block_in_place(|| relay.wait_streaming());
    let before = world.current_lsn().await;
    world.insert_tx(&[("Missing", "a", r#"{"n": 1}"#)]).await;
    let status = tokio::task::block_in_place(|| relay.wait_exit(Duration::from_secs(60)));
    let log = relay.log();
    assert_eq!(status.and_then(|s| s.code()), Some(EXIT_POISON), "{log}");
    for needle in [
        "\"Missing-value\"",
        "HTTP 404",
        "Subject 'Missing-value' not found",
        "--schema-registry-auto-register",
    ] {
        assert!(log.contains(needle), "{needle:?} in:\n{log}");
    }
    assert!(world.confirmed_flush(SLOT).await.unwrap() <= before);
    assert_eq!(registry.dump().len(), 1, "the relay registered nothing");
}
