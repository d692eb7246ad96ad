//! The relay's records against real Debezium's, byte for byte.
//!
//! `tests/fixtures/debezium-records/*.json` hold the records Debezium 3.6.3 (Postgres
//! connector, Outbox Event Router, Kafka Connect's converters) wrote for the rows of
//! `outbox.sql`, one file per configuration; `scripts/debezium-fixtures/generate.sh` makes them
//! again. Each test here runs the same SQL on a throwaway cluster, imports the fixture's
//! connector (and worker) config with `--debezium-config`, lets the relay relay the rows into
//! topics of 6 partitions, and compares every record: topic, partition, key, value, and the
//! headers' names, values and order. What legitimately varies between runs is compared by
//! shape: `__debezium.context.runId` (a UUID per run), a `traceparent`'s span id (new per
//! span), the partition of a null key (random), and the field order of an expanded array of
//! objects whose items have different fields (Debezium merges them in JVM-hash order).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use base64::Engine as _;
use serde_json::Value;

use crate::support::kafka::{Broker, Consumed};
use crate::support::postgres::PgCluster;
use crate::support::registry::Registry;
use crate::support::relay::Relay;
use crate::support::world::wait_until;

const DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/debezium-records"
);
const PARTITIONS: i32 = 6;
/// Rows whose expanded payload holds an array of objects with different fields.
const FIELD_ORDER_VARIES: [&str; 2] = [
    "00000000-0000-4000-8000-000000000007",
    "00000000-0000-4000-8000-00000000000e",
];

/// One record as the fixture has it.
#[derive(Debug, Clone)]
pub struct Record {
    pub topic: String,
    pub partition: Option<i32>,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl Record {
    pub fn id(&self) -> String {
        let id = self.headers.iter().find(|(n, _)| n == "id");
        String::from_utf8_lossy(id.and_then(|(_, v)| v.as_deref()).unwrap_or_default()).into()
    }
}

/// A fixture file.
pub struct Fixture {
    pub name: String,
    pub worker: BTreeMap<String, String>,
    pub connector: BTreeMap<String, String>,
    pub records: Vec<Record>,
    pub error: Option<String>,
    /// The registry's compatibility level, when not Confluent's default BACKWARD.
    pub compatibility: Option<String>,
    /// What the Schema Registry held afterwards: subject, then (id, schema) per version.
    pub registry: BTreeMap<String, Vec<(u32, String)>>,
    /// Each subject's versions' `schemaType` (`AVRO` when the registry gives none).
    pub types: BTreeMap<String, Vec<String>>,
}

impl Fixture {
    /// The text of the schema the fixture's registry gave `id`.
    fn schema(&self, id: u32) -> Option<&str> {
        let versions = self.registry.values().flatten();
        versions
            .into_iter()
            .find(|(i, _)| *i == id)
            .map(|(_, s)| s.as_str())
    }
}

fn bytes(value: &Value) -> Option<Vec<u8>> {
    match value {
        Value::Null => None,
        Value::String(text) => Some(text.as_bytes().to_vec()),
        other => {
            let b64 = other["base64"]
                .as_str()
                .expect("bytes are null, text or {base64}");
            Some(
                base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .unwrap(),
            )
        }
    }
}

fn strings(value: &Value) -> BTreeMap<String, String> {
    let object = value.as_object().cloned().unwrap_or_default();
    let text = |v: Value| v.as_str().unwrap_or_default().to_owned();
    object.into_iter().map(|(k, v)| (k, text(v))).collect()
}

pub fn fixture(name: &str) -> Fixture {
    let text = std::fs::read_to_string(format!("{DIR}/{name}.json")).unwrap();
    let json: Value = serde_json::from_str(&text).unwrap();
    let records = json["records"].as_array().unwrap().iter().map(|r| Record {
        topic: r["topic"].as_str().unwrap().to_owned(),
        partition: r["partition"].as_i64().map(|p| i32::try_from(p).unwrap()),
        key: bytes(&r["key"]),
        value: bytes(&r["value"]),
        headers: (r["headers"].as_array().unwrap().iter())
            .map(|h| (h[0].as_str().unwrap().to_owned(), bytes(&h[1])))
            .collect(),
    });
    let mut registry: BTreeMap<String, Vec<(u32, String)>> = BTreeMap::new();
    let mut types: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for entry in json["registry"].as_array().into_iter().flatten() {
        let id = u32::try_from(entry["id"].as_u64().unwrap()).unwrap();
        let versions = registry.entry(entry["subject"].as_str().unwrap().to_owned());
        let versions = versions.or_default();
        assert_eq!(
            versions.len() + 1,
            entry["version"].as_u64().unwrap() as usize
        );
        versions.push((id, entry["schema"].as_str().unwrap().to_owned()));
        let kind = entry["schemaType"].as_str().unwrap_or("AVRO");
        let kinds = types.entry(entry["subject"].as_str().unwrap().to_owned());
        kinds.or_default().push(kind.to_owned());
    }
    Fixture {
        name: name.to_owned(),
        worker: strings(&json["worker"]),
        connector: strings(&json["connector"]),
        records: records.collect(),
        error: json["error"].as_str().map(str::to_owned),
        compatibility: json["compatibility"].as_str().map(str::to_owned),
        registry,
        types,
    }
}

/// `outbox.sql` split into its tables and its row transactions.
pub fn sql() -> (String, String) {
    let text = std::fs::read_to_string(format!("{DIR}/outbox.sql")).unwrap();
    let at = text.find("\nBEGIN;").unwrap();
    (text[..at].to_owned(), text[at..].to_owned())
}

/// A cluster with the tables, the fixture's publication and slot, then `rows` inserted.
pub async fn prepared(fixture: &Fixture, rows: &str) -> PgCluster {
    let pg = PgCluster::start();
    pg.execute(&sql().0).await;
    let tables = &fixture.connector["table.include.list"];
    pg.execute(&format!("CREATE PUBLICATION fixtures FOR TABLE {tables}"))
        .await;
    let slot = &fixture.connector["slot.name"];
    pg.execute(&format!(
        "SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')"
    ))
    .await;
    pg.execute(rows).await;
    pg
}

/// The relay, started on `pg` with the fixture's connector and worker configs imported.
pub fn relay(fixture: &Fixture, pg: &PgCluster, broker: &Broker, dir: &std::path::Path) -> Relay {
    create_topics(fixture, broker);
    relay_with(fixture, pg, broker, dir, None, &[])
}

/// The fixture's topics, with Debezium's 6 partitions.
pub fn create_topics(fixture: &Fixture, broker: &Broker) {
    let topics: BTreeSet<&str> = fixture.records.iter().map(|r| r.topic.as_str()).collect();
    for topic in topics {
        broker.create_topic(topic, PARTITIONS);
    }
}

/// [`relay`] with the fixture's `${registry}` at `registry`, and `extra` flags.
pub fn relay_with(
    fixture: &Fixture,
    pg: &PgCluster,
    broker: &Broker,
    dir: &std::path::Path,
    registry: Option<&Registry>,
    extra: &[&str],
) -> Relay {
    let mut connector = fixture.connector.clone();
    if let Some(registry) = registry {
        for value in connector.values_mut() {
            *value = value.replace("${registry}", &registry.url());
        }
    }
    connector.insert("database.port".into(), pg.port().to_string());
    connector.insert("database.password".into(), PgCluster::PASSWORD.into());
    connector.insert("publication.name".into(), "fixtures".into());
    let config = serde_json::json!({ "name": fixture.name, "config": connector });
    let connector_file = dir.join("connector.json");
    std::fs::write(&connector_file, config.to_string()).unwrap();
    let worker_file = dir.join("worker.properties");
    let worker: String = fixture
        .worker
        .iter()
        .map(|(k, v)| format!("{k}={v}\n"))
        .collect();
    std::fs::write(&worker_file, worker).unwrap();
    let bootstrap = broker.bootstrap();
    let mut args = vec![
        "--debezium-config",
        connector_file.to_str().unwrap(),
        "--debezium-worker-config",
        worker_file.to_str().unwrap(),
        "--kafka-brokers",
        &bootstrap,
    ];
    args.extend_from_slice(extra);
    Relay::spawn_raw(&args)
}

/// Schema ids in Confluent-framed bytes, each mapped to its registry's schema text: the
/// fixture's on one side, the relay's on the other.
pub struct Ids<'a> {
    pub fixture: &'a Fixture,
    pub relay: &'a Registry,
}

impl Ids<'_> {
    /// Whether Debezium's and the relay's bytes are the same after mapping ids: the same
    /// schema text behind the id, the same body after it (where Debezium's field order varies,
    /// the same schema but for field order and a body of the same length). `None` when
    /// neither is framed.
    fn same(
        &self,
        expected: &Option<Vec<u8>>,
        got: &Option<Vec<u8>>,
        order_varies: bool,
    ) -> Option<Result<(), String>> {
        let (Some(e), Some(g)) = (expected, got) else {
            return None;
        };
        let id = |b: &[u8]| {
            (b.len() >= 5 && b[0] == 0).then(|| u32::from_be_bytes([b[1], b[2], b[3], b[4]]))
        };
        let (Some(e_id), Some(g_id)) = (id(e), id(g)) else {
            return None;
        };
        let (e_schema, g_schema) = (self.fixture.schema(e_id), self.relay.schema(g_id));
        if order_varies && same_but_field_order(e_schema, g_schema.as_deref()) {
            return Some(match e.len() == g.len() {
                true => Ok(()),
                false => Err("Avro bodies differ in length".into()),
            });
        }
        if e_schema != g_schema.as_deref() {
            return Some(Err(format!(
                "schema id {e_id} is {e_schema:?} in Debezium's registry, id {g_id} {g_schema:?} in the relay's"
            )));
        }
        if e[5..] != g[5..] {
            return Some(Err(format!(
                "Avro bodies differ:\n  debezium: {:?}\n  relay:    {:?}",
                &e[5..],
                &g[5..]
            )));
        }
        Some(Ok(()))
    }
}

/// Reads back what the relay wrote for `expected`'s records, in offset order.
pub fn read_back(broker: &Broker, expected: &[Record], relay: &Relay) -> Vec<Consumed> {
    let topics: BTreeSet<&str> = expected.iter().map(|r| r.topic.as_str()).collect();
    let topics: Vec<&str> = topics.into_iter().collect();
    let got = broker.consume(&topics, expected.len(), Duration::from_secs(60));
    assert_eq!(
        got.len(),
        expected.len(),
        "records read back; relay log:\n{}",
        relay.log()
    );
    got
}

/// Compares one record of the relay's with Debezium's (see the module docs for what varies),
/// with registry ids mapped where keys and values are Confluent-framed.
pub fn compare_with(
    fixture: &str,
    expected: &Record,
    got: &Consumed,
    ids: Option<&Ids<'_>>,
) -> Result<(), String> {
    let id = expected.id();
    let differs = |what: &str, e: &dyn std::fmt::Debug, g: &dyn std::fmt::Debug| {
        Err(format!(
            "{fixture}: record {id}: {what} differs:\n  debezium: {e:?}\n  relay:    {g:?}"
        ))
    };
    if expected.topic != got.topic {
        return differs("topic", &expected.topic, &got.topic);
    }
    if expected.partition.is_some_and(|p| p != got.partition) {
        return differs("partition", &expected.partition, &got.partition);
    }
    let order_varies = FIELD_ORDER_VARIES.contains(&id.as_str());
    let framed =
        |e: &Option<Vec<u8>>, g: &Option<Vec<u8>>| ids.and_then(|ids| ids.same(e, g, order_varies));
    match framed(&expected.key, &got.key) {
        Some(Err(why)) => return Err(format!("{fixture}: record {id}: key: {why}")),
        Some(Ok(())) => {}
        None if expected.key != got.key => {
            return differs("key", &text(&expected.key), &text(&got.key));
        }
        None => {}
    }
    match framed(&expected.value, &got.payload) {
        Some(Err(why)) => return Err(format!("{fixture}: record {id}: value: {why}")),
        Some(Ok(())) => return compare_headers(fixture, expected, got),
        None => {}
    }
    let same_json = |a: &Option<Vec<u8>>, b: &Option<Vec<u8>>| {
        let parse = |v: &Option<Vec<u8>>| {
            let mut json = serde_json::from_slice::<Value>(v.as_deref()?).ok()?;
            sort_schema_fields(&mut json);
            Some(json)
        };
        parse(a).is_some() && parse(a) == parse(b)
    };
    if expected.value != got.payload
        && !(FIELD_ORDER_VARIES.contains(&id.as_str()) && same_json(&expected.value, &got.payload))
    {
        return differs("value", &text(&expected.value), &text(&got.payload));
    }
    compare_headers(fixture, expected, got)
}

/// The headers' names, values and order (a run id and a span id compared by shape).
fn compare_headers(fixture: &str, expected: &Record, got: &Consumed) -> Result<(), String> {
    let id = expected.id();
    let differs = |what: &str, e: &dyn std::fmt::Debug, g: &dyn std::fmt::Debug| {
        Err(format!(
            "{fixture}: record {id}: {what} differs:\n  debezium: {e:?}\n  relay:    {g:?}"
        ))
    };
    let names =
        |h: &[(String, Option<Vec<u8>>)]| h.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    if names(&expected.headers) != names(&got.headers) {
        return differs(
            "header names",
            &names(&expected.headers),
            &names(&got.headers),
        );
    }
    for ((name, e), (_, g)) in expected.headers.iter().zip(&got.headers) {
        let (e, g) = (text(e), text(g));
        let same = match name.as_str() {
            // A UUID per run, alone or in JsonConverter's JSON.
            "__debezium.context.runId" => {
                let (run_e, run_g) = (header_string(&e), header_string(&g));
                is_uuid_v7(&run_e)
                    && is_uuid_v7(&run_g)
                    && e.replace(&run_e, "RUN") == g.replace(&run_g, "RUN")
            }
            // 00-TRACE-SPAN-FLAGS: the span is new in every run.
            "traceparent" => e.len() == g.len() && e[..36] == g[..36] && e[52..] == g[52..],
            _ => e == g,
        };
        if !same {
            return differs(&format!("header {name}"), &e, &g);
        }
    }
    Ok(())
}

/// Whether two schema texts are the same JSON but for the order of record fields.
fn same_but_field_order(a: Option<&str>, b: Option<&str>) -> bool {
    let parse = |text: Option<&str>| {
        let mut json: Value = serde_json::from_str(text?).ok()?;
        sort_schema_fields(&mut json);
        Some(json)
    };
    parse(a).is_some() && parse(a) == parse(b)
}

/// Orders every struct schema's `fields` by name (objects compare without order already):
/// Connect's (`field`) and Avro's (`name`).
fn sort_schema_fields(json: &mut Value) {
    match json {
        Value::Object(object) => {
            if let Some(Value::Array(fields)) = object.get_mut("fields") {
                let name = |f: &Value| {
                    let name = f["field"].as_str().or(f["name"].as_str());
                    name.unwrap_or_default().to_owned()
                };
                fields.sort_by_key(name);
            }
            object.values_mut().for_each(sort_schema_fields);
        }
        Value::Array(items) => items.iter_mut().for_each(sort_schema_fields),
        _ => {}
    }
}

/// A header's string as SimpleHeaderConverter or JsonConverter (with or without schemas)
/// wrote it.
fn header_string(text: &str) -> String {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::String(s)) => s,
        Ok(Value::Object(o)) => o["payload"].as_str().unwrap_or_default().to_owned(),
        _ => text.to_owned(),
    }
}

fn is_uuid_v7(text: &str) -> bool {
    uuid::Uuid::parse_str(text).is_ok_and(|u| u.get_version_num() == 7)
}

fn text(bytes: &Option<Vec<u8>>) -> String {
    match bytes {
        None => "<null>".into(),
        Some(b) => String::from_utf8_lossy(b).into_owned(),
    }
}

/// Every relay record matches Debezium's, each (topic, partition) holds them in Debezium's
/// order, and one run id is on all of them.
pub fn assert_identical(fixture: &str, expected: &[Record], got: &[Consumed]) {
    assert_identical_with(fixture, expected, got, None);
}

/// [`assert_identical`], with registry ids mapped.
pub fn assert_identical_with(
    fixture: &str,
    expected: &[Record],
    got: &[Consumed],
    ids: Option<&Ids<'_>>,
) {
    let mut failures = Vec::new();
    let mut order: BTreeMap<(String, i32), Vec<String>> = BTreeMap::new();
    for record in got {
        order
            .entry((record.topic.clone(), record.partition))
            .or_default()
            .push(record.id());
    }
    let positions: BTreeMap<String, usize> = expected
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id(), i))
        .collect();
    for ((topic, partition), ids) in &order {
        let mut sorted = ids.clone();
        sorted.sort_by_key(|id| positions.get(id).copied());
        if *ids != sorted {
            failures.push(format!(
                "{fixture}: {topic}[{partition}] holds {ids:?}, Debezium's order is {sorted:?}"
            ));
        }
    }
    for e in expected {
        match got.iter().find(|g| g.id() == e.id()) {
            None => failures.push(format!("{fixture}: record {} not relayed", e.id())),
            Some(g) => failures.extend(compare_with(fixture, e, g, ids).err()),
        }
    }
    let runs: BTreeSet<String> = got
        .iter()
        .filter_map(|g| g.header("__debezium.context.runId"))
        .collect();
    if runs.len() > 1 {
        failures.push(format!("{fixture}: several run ids {runs:?}"));
    }
    assert!(
        failures.is_empty(),
        "{} of {} records differ:\n{}",
        failures.len(),
        expected.len(),
        failures.join("\n")
    );
}

/// Relays the fixture's rows and compares the records with Debezium's.
async fn relays_like_debezium(name: &str) {
    let fixture = fixture(name);
    assert!(
        fixture.error.is_none(),
        "{name} records an error: use refuses_like_debezium"
    );
    let pg = prepared(&fixture, &sql().1).await;
    let broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    let mut relay = relay(&fixture, &pg, &broker, dir.path());
    let got = read_back(&broker, &fixture.records, &relay);
    relay.stop();
    assert_identical(name, &fixture.records, &got);
}

/// A record a Kafka Connect `Filter` drops is acknowledged without being sent: after the
/// fixture's rows, a transaction holding only a dropped row is confirmed on the slot.
#[tokio::test(flavor = "current_thread")]
async fn a_filtered_event_is_acknowledged_without_a_record() {
    let fixture = fixture("smt-filter");
    let pg = prepared(&fixture, &sql().1).await;
    let broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    let mut relay = relay(&fixture, &pg, &broker, dir.path());
    let got = read_back(&broker, &fixture.records, &relay);
    assert_identical("smt-filter", &fixture.records, &got);
    pg.execute(
        "INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload) \
         VALUES ('00000000-0000-4000-8000-000000000901', 'customer', 'c', 'Dropped', '{}')",
    )
    .await;
    let end = pg.execute("SELECT pg_current_wal_lsn()::text").await[0][0]
        .clone()
        .unwrap();
    let slot = &fixture.connector["slot.name"];
    let past_end = format!(
        "SELECT 1 FROM pg_replication_slots WHERE slot_name = '{slot}' \
         AND confirmed_flush_lsn >= '{end}'::pg_lsn"
    );
    assert!(
        wait_until(Duration::from_secs(60), || async {
            !pg.execute(&past_end).await.is_empty()
        })
        .await,
        "the slot was not confirmed past the dropped event at {end}:\n{}",
        relay.log()
    );
    relay.stop();
}

/// A fresh registry at the fixture's compatibility level.
async fn registry_for(fixture: &Fixture) -> Registry {
    let registry = Registry::spawn().await;
    if let Some(level) = &fixture.compatibility {
        registry.set_compatibility("", level);
    }
    registry
}

/// The subjects and every version's schema text the relay registered are Debezium's.
fn assert_same_registry(fixture: &Fixture, registry: &Registry) {
    let texts =
        |versions: &Vec<(u32, String)>| versions.iter().map(|(_, s)| s.clone()).collect::<Vec<_>>();
    let expected: BTreeMap<&String, Vec<String>> = fixture
        .registry
        .iter()
        .map(|(k, v)| (k, texts(v)))
        .collect();
    let relay = registry.dump();
    let got: BTreeMap<&String, Vec<String>> = relay.iter().map(|(k, v)| (k, texts(v))).collect();
    let same = |e: &Vec<String>, g: &Vec<String>| {
        e.len() == g.len()
            && e.iter()
                .zip(g)
                .all(|(e, g)| e == g || same_but_field_order(Some(e), Some(g)))
    };
    let alike = expected.len() == got.len()
        && expected
            .iter()
            .zip(&got)
            .all(|((es, e), (gs, g))| es == gs && same(e, g));
    // Schemas differ only where Debezium's field order varies (see the module docs).
    assert!(
        alike,
        "{}: the relay's registry differs from Debezium's:\n{got:#?}\n{expected:#?}",
        fixture.name
    );
    assert_eq!(
        registry.types(),
        fixture.types,
        "{}: schema types",
        fixture.name
    );
}

/// Relays a registry fixture's rows against a fresh registry; compares records after mapping
/// ids, and the registered subjects and schemas.
async fn relays_like_debezium_with_a_registry(name: &str) {
    let fixture = fixture(name);
    assert!(fixture.error.is_none(), "{name} records an error");
    assert!(
        !fixture.registry.is_empty(),
        "{name} has no registry contents"
    );
    let pg = prepared(&fixture, &sql().1).await;
    let broker = Broker::start();
    let registry = registry_for(&fixture).await;
    let dir = tempfile::tempdir().unwrap();
    create_topics(&fixture, &broker);
    let mut relay = relay_with(&fixture, &pg, &broker, dir.path(), Some(&registry), &[]);
    let got = tokio::task::block_in_place(|| read_back(&broker, &fixture.records, &relay));
    relay.stop();
    let ids = Ids {
        fixture: &fixture,
        relay: &registry,
    };
    assert_identical_with(name, &fixture.records, &got, Some(&ids));
    assert_same_registry(&fixture, &registry);
}

/// Where Debezium stopped, the relay stops before sending anything, naming why.
async fn stops_like_debezium(name: &str, because: &str) {
    let fixture = fixture(name);
    assert!(
        fixture.error.is_some() && fixture.records.is_empty(),
        "{name} should record a stop"
    );
    let pg = prepared(&fixture, &sql().1).await;
    let broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    let mut relay = relay(&fixture, &pg, &broker, dir.path());
    let status = relay.wait_exit(Duration::from_secs(60));
    assert!(
        status.is_some_and(|s| !s.success()),
        "the relay stops:\n{}",
        relay.log()
    );
    assert!(
        relay.log().contains(because),
        "{because:?} in:\n{}",
        relay.log()
    );
}

/// Debezium with ProtobufConverter wrote expanded payloads as messages numbered in the order
/// its structs gave the keys, then stopped on an array of arrays: the relay refuses the
/// combination at start-up, naming the option and what was measured, and sends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_converter_with_expanded_payloads_is_refused_naming_what_debezium_did() {
    let fixture = fixture("protobuf-expand");
    let error = fixture.error.as_deref().unwrap_or_default();
    assert!(error.contains("Array cannot be nested"), "{error}");
    let pg = prepared(&fixture, &sql().1).await;
    let broker = Broker::start();
    let registry = registry_for(&fixture).await;
    let dir = tempfile::tempdir().unwrap();
    let mut relay = relay_with(&fixture, &pg, &broker, dir.path(), Some(&registry), &[]);
    let status = tokio::task::block_in_place(|| relay.wait_exit(Duration::from_secs(60)));
    let log = relay.log();
    assert!(
        status.is_some_and(|s| !s.success()),
        "the relay stops:\n{log}"
    );
    for needle in [
        "--expand-json-payload",
        "Array cannot be nested",
        "field numbers",
    ] {
        assert!(log.contains(needle), "{needle:?} in:\n{log}");
    }
    assert_eq!(registry.requests(), 0, "nothing registered");
}

macro_rules! identical_with_a_registry {
    ($($test:ident: $fixture:literal,)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            relays_like_debezium_with_a_registry($fixture).await;
        }
    )*};
}

identical_with_a_registry! {
    avro_converter_keys_and_values: "avro",
    avro_converter_envelopes_versioned_by_a_column: "avro-envelope",
    avro_converter_expanded_payloads: "avro-expand",
    avro_converter_without_metadata_by_topic_and_record_name: "avro-options",
    avro_converter_scrubbing_invalid_names_in_expanded_payloads: "avro-scrub-expand",
    binary_data_converter_with_an_avro_delegate: "binary-data-avro-delegate",
    avro_converter_typed_columns_as_connect_logical_types: "avro-types-connect",
    avro_converter_typed_columns_propagating_their_source_types: "avro-types-propagate",
    avro_converter_typed_columns_in_microseconds_and_doubles: "avro-types-micro-double",
    avro_converter_bytea_as_hex: "avro-binary-hex",
    avro_converter_after_transforms: "avro-smt",
    avro_converter_a_negative_scale_in_an_envelope: "avro-negative-scale",
    avro_converter_a_decimal_key: "avro-decimal-key",
    avro_converter_after_inserting_a_header_and_filtering: "avro-smt-headers-filter",
    protobuf_converter_keys_and_values_as_wrappers: "protobuf",
    protobuf_converter_envelopes: "protobuf-envelope",
    protobuf_converter_envelopes_of_several_column_types: "protobuf-envelope-types",
}

macro_rules! identical {
    ($($test:ident: $fixture:literal,)*) => {$(
        #[tokio::test(flavor = "current_thread")]
        async fn $test() {
            relays_like_debezium($fixture).await;
        }
    )*};
}

identical! {
    json_converter_with_schemas_from_the_worker: "json-schemas",
    json_converter_without_schemas: "json",
    json_converter_expanding_payloads: "json-expand",
    json_converter_with_schemas_expanding_payloads: "json-schemas-expand",
    expanded_payloads_keeping_nulls: "json-expand-null-bytes",
    string_converter: "string",
    string_keys_and_bytearray_values: "bytearray",
    string_keys_and_json_values: "string-key-json-value",
    envelope_header_and_partition_placements: "json-placement",
    envelope_schemas_versioned_by_a_column: "json-schemas-placement",
    string_converter_tombstones_on_empty_payloads: "string-tombstones",
    json_converter_tombstones_on_empty_payloads: "json-schemas-tombstones",
    without_extended_headers_routed_by_type: "no-extended-headers",
    trace_context_becomes_traceparent: "tracing",
    typed_columns_adaptive_and_precise: "types-adaptive",
    typed_columns_adaptive_time_microseconds_and_double: "types-micro-double",
    typed_columns_connect_and_string_with_json_headers: "types-connect-string",
    typed_columns_isostring_and_numeric_decimals: "types-isostring-numeric",
    typed_columns_propagating_their_source_types: "types-propagate",
    bytea_as_base64: "binary-base64",
    bytea_as_url_safe_base64_in_a_header_too: "binary-base64-url-safe",
    bytea_as_hex_with_schemas: "binary-hex",
    bytea_in_a_simple_header: "bytes-header",
    source_types_of_every_column: "propagate-columns",
    source_types_of_some_datatypes: "propagate-datatypes",
    json_header_converter_with_schemas: "header-json",
    json_header_converter_without_schemas: "header-json-no-schemas",
    expanded_payloads_inside_an_envelope: "json-schemas-expand-envelope",
    an_empty_field_name_keeps_the_payload_as_text: "json-schemas-expand-empty-name",
    transforms_inserting_copying_and_dropping_headers: "smt-headers",
    transforms_inserting_replacing_and_extracting_fields: "smt-fields",
    transforms_filtering_by_topic_tombstone_and_header: "smt-filter",
    binary_data_converter_passes_bytea_through: "binary-data",
    binary_data_converters_hand_the_rest_to_their_delegates: "binary-data-delegates",
}

#[tokio::test(flavor = "current_thread")]
async fn a_number_wider_than_64_bits_stops_expansion_as_it_stopped_debezium() {
    stops_like_debezium("json-expand-poison", "Debezium would stop on this event").await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_top_level_array_stops_expansion_as_it_stopped_debezium() {
    stops_like_debezium(
        "json-expand-poison-array",
        "Debezium would stop on this event",
    )
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn an_empty_array_expanded_into_an_envelope_stops_as_it_stopped_debezium() {
    stops_like_debezium(
        "json-expand-envelope",
        "a payload expanded without schema (an empty JSON array) cannot go into an envelope",
    )
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_second_expanded_schema_of_a_version_stops_as_it_stopped_debezium() {
    stops_like_debezium(
        "json-expand-envelope-versioned",
        "Struct schemas do not match",
    )
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn binary_data_converter_without_a_delegate_on_text_is_refused() {
    stops_like_debezium("binary-data-no-delegate", "delegate.converter.type").await;
}

#[tokio::test(flavor = "current_thread")]
async fn bytearray_converter_on_text_columns_is_refused() {
    stops_like_debezium("bytearray-text-columns", "ByteArrayConverter").await;
}

/// Writes `records` to the broker as Debezium's Connect worker did: same topic, partition,
/// key, value and headers (a null-key record's partition was random: any will do).
fn produce_as_debezium(broker: &Broker, records: &[Record]) {
    use rdkafka::ClientConfig;
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .create()
        .unwrap();
    for r in records {
        let mut headers = OwnedHeaders::new();
        for (key, value) in &r.headers {
            headers = headers.insert(Header {
                key,
                value: value.as_deref(),
            });
        }
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&r.topic).headers(headers);
        record.key = r.key.as_deref();
        record.payload = r.value.as_deref();
        record.partition = Some(r.partition.unwrap_or(0));
        producer.send(record).map_err(|(e, _)| e).unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// Debezium relayed the rows above `-- cutover` in `outbox.sql` (its fixture records are
/// produced as it produced them, and the slot confirmed past them, as Debezium confirms);
/// then the relay takes over the same slot and topics with the imported config. Every key's
/// records, Debezium's and the relay's, are on one partition, in the order they were written.
#[tokio::test(flavor = "current_thread")]
async fn a_cutover_from_debezium_keeps_each_key_on_its_partition_in_order() {
    let fixture = fixture("json-schemas");
    let rows = sql().1;
    let (before, after) = rows.split_once("-- cutover").unwrap();
    let pg = prepared(&fixture, before).await;
    let count = "SELECT (SELECT count(*) FROM public.outbox) + (SELECT count(*) FROM public.outbox_text) + (SELECT count(*) FROM public.outbox_bytes)";
    let debeziums: usize = pg.execute(count).await[0][0]
        .as_deref()
        .unwrap()
        .parse()
        .unwrap();
    let broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    let topics: BTreeSet<&str> = fixture.records.iter().map(|r| r.topic.as_str()).collect();
    for topic in &topics {
        broker.create_topic(topic, PARTITIONS);
    }
    produce_as_debezium(&broker, &fixture.records[..debeziums]);
    let slot = &fixture.connector["slot.name"];
    pg.execute(&format!(
        "SELECT pg_replication_slot_advance('{slot}', pg_current_wal_lsn())"
    ))
    .await;
    pg.execute(after).await;

    // The relay creates no topic: they exist, with Debezium's records in them.
    let mut connector = fixture.connector.clone();
    connector.insert("database.port".into(), pg.port().to_string());
    connector.insert("database.password".into(), PgCluster::PASSWORD.into());
    connector.insert("publication.name".into(), "fixtures".into());
    let file = dir.path().join("connector.json");
    let config = serde_json::json!({ "name": fixture.name, "config": connector });
    std::fs::write(&file, config.to_string()).unwrap();
    let mut relay = Relay::spawn_raw(&[
        "--debezium-config",
        file.to_str().unwrap(),
        "--kafka-brokers",
        &broker.bootstrap(),
    ]);
    let got = read_back(&broker, &fixture.records, &relay);
    relay.stop();

    let relays: Vec<Consumed> = got
        .iter()
        .filter(|g| {
            g.header("__debezium.context.runId")
                != fixture.records[0]
                    .headers
                    .iter()
                    .find(|(n, _)| n == "__debezium.context.runId")
                    .and_then(|(_, v)| v.as_ref())
                    .map(|v| String::from_utf8_lossy(v).into_owned())
        })
        .cloned()
        .collect();
    assert_eq!(
        relays.len(),
        fixture.records.len() - debeziums,
        "the relay relayed only what Debezium had not"
    );
    assert_identical(
        "json-schemas after the cutover",
        &fixture.records[debeziums..],
        &relays,
    );
    let mut partitions: BTreeMap<Vec<u8>, BTreeSet<i32>> = BTreeMap::new();
    for record in &got {
        let key = record.key.clone().unwrap();
        partitions.entry(key).or_default().insert(record.partition);
    }
    let moved: Vec<_> = partitions
        .iter()
        .filter(|(_, p)| p.len() > 1)
        .map(|(k, p)| (String::from_utf8_lossy(k), p))
        .collect();
    assert!(
        moved.is_empty(),
        "keys on more than one partition: {moved:?}"
    );
    let keys_on_both_sides = fixture.records[..debeziums]
        .iter()
        .filter(|d| fixture.records[debeziums..].iter().any(|r| r.key == d.key))
        .count();
    assert!(
        keys_on_both_sides >= 24,
        "the cutover is tested on keys written before and after it"
    );
    // In each partition, Debezium's records then the relay's, in the order they were written.
    assert_identical_order(&fixture.records, &got);
}

/// Each (topic, partition) holds its records in `expected`'s order.
fn assert_identical_order(expected: &[Record], got: &[Consumed]) {
    let position: BTreeMap<String, usize> = expected
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id(), i))
        .collect();
    let mut last: BTreeMap<(String, i32), usize> = BTreeMap::new();
    for record in got {
        let at = position[&record.id()];
        let previous = last.insert((record.topic.clone(), record.partition), at);
        assert!(
            previous.is_none_or(|p| p < at),
            "{} out of order in {}[{}]",
            record.id(),
            record.topic,
            record.partition
        );
    }
}

/// Debezium with AvroConverter and expanded payloads against a registry at its default
/// BACKWARD compatibility: the registry refuses a later row's schema and Debezium stops there.
/// The relay writes the same records up to it, then treats the refused event as poison: it
/// stops (exit 5) naming the subject and the registry's message; under `--on-poison
/// dead-letter` it dead-letters the event with that reason and goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_a_backward_registry_refuses_is_poison_as_it_stopped_debezium() {
    let fixture = fixture("avro-expand-backward");
    let stopped = fixture.error.as_deref().unwrap_or_default();
    assert!(stopped.contains("409"), "{stopped}");
    let pg = prepared(&fixture, &sql().1).await;
    let broker = Broker::start();
    let registry = registry_for(&fixture).await;
    let dir = tempfile::tempdir().unwrap();
    create_topics(&fixture, &broker);
    let mut relay = relay_with(&fixture, &pg, &broker, dir.path(), Some(&registry), &[]);
    let status = tokio::task::block_in_place(|| relay.wait_exit(Duration::from_secs(60)));
    assert_eq!(status.and_then(|s| s.code()), Some(5), "{}", relay.log());
    let log = relay.log();
    for needle in [
        "\"outbox.event.order-value\"",
        "Schema being registered is incompatible with an earlier schema",
        "--on-poison dead-letter",
    ] {
        assert!(log.contains(needle), "{needle:?} in:\n{log}");
    }
    let got = tokio::task::block_in_place(|| read_back(&broker, &fixture.records, &relay));
    let ids = Ids {
        fixture: &fixture,
        relay: &registry,
    };
    assert_identical_with(&fixture.name, &fixture.records, &got, Some(&ids));
    assert_same_registry(&fixture, &registry);

    // Dead-lettered instead: the refused event goes to the dead-letter topic with the reason.
    let pg = prepared(&fixture, &sql().1).await;
    let broker = Broker::start();
    let registry = registry_for(&fixture).await;
    let extra = ["--on-poison", "dead-letter", "--dead-letter-topic", "dlq"];
    create_topics(&fixture, &broker);
    let mut relay = relay_with(&fixture, &pg, &broker, dir.path(), Some(&registry), &extra);
    let dead = tokio::task::block_in_place(|| {
        let wanted = ["00000000-0000-4000-8000-00000000000a".to_owned()];
        broker.consume_ids(&["dlq"], &wanted, Duration::from_secs(60))
    });
    relay.stop();
    let refused = "00000000-0000-4000-8000-00000000000a";
    let dead: Vec<_> = dead.into_iter().filter(|d| d.id() == refused).collect();
    let error = dead
        .first()
        .and_then(|d| d.header("outbox.error"))
        .unwrap_or_default();
    assert!(
        error.contains("outbox.event.order-value") && error.contains("incompatible"),
        "{error:?}; relay log:\n{}",
        relay.log()
    );
    assert_eq!(dead[0].payload_text().as_deref(), Some("[]"));
}

/// The cutover with AvroConverter: Debezium relayed the rows above `-- cutover` (its records
/// are produced as it produced them, the registry holds the schemas it registered for them, and
/// the slot confirmed past them); then the relay takes over the slot, topics and registry.
/// It registers no new version under any subject Debezium used, its records equal Debezium's
/// after the cutover (ids mapped), and every key's records, Debezium's and the relay's, are on
/// one partition in the order they were written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cutover_from_debezium_with_avro_registers_nothing_new_and_keeps_keys_in_order() {
    let fixture = fixture("avro");
    let rows = sql().1;
    let (before, after) = rows.split_once("-- cutover").unwrap();
    let pg = prepared(&fixture, before).await;
    let count = "SELECT (SELECT count(*) FROM public.outbox) + (SELECT count(*) FROM public.outbox_text) + (SELECT count(*) FROM public.outbox_bytes)";
    let debeziums: usize = pg.execute(count).await[0][0]
        .as_deref()
        .unwrap()
        .parse()
        .unwrap();
    let broker = Broker::start();
    let topics: BTreeSet<&str> = fixture.records.iter().map(|r| r.topic.as_str()).collect();
    for topic in &topics {
        broker.create_topic(topic, PARTITIONS);
    }
    tokio::task::block_in_place(|| produce_as_debezium(&broker, &fixture.records[..debeziums]));
    // The registry as Debezium left it: the schemas its records name, registered in id order
    // (so they keep Debezium's ids).
    let registry = registry_for(&fixture).await;
    let framed_id = |b: &Option<Vec<u8>>| {
        b.as_ref()
            .map(|b| u32::from_be_bytes([b[1], b[2], b[3], b[4]]))
    };
    let used: BTreeSet<u32> = fixture.records[..debeziums]
        .iter()
        .flat_map(|r| [framed_id(&r.key), framed_id(&r.value)])
        .flatten()
        .collect();
    let mut entries: Vec<(u32, &String, &String)> = (fixture.registry.iter())
        .flat_map(|(subject, versions)| {
            versions
                .iter()
                .map(move |(id, schema)| (*id, subject, schema))
        })
        .filter(|(id, _, _)| used.contains(id))
        .collect();
    entries.sort();
    for (id, subject, schema) in entries {
        assert_eq!(registry.register(subject, schema), Ok(id), "{subject}");
    }
    let before_switch = registry.dump();
    let slot = &fixture.connector["slot.name"];
    pg.execute(&format!(
        "SELECT pg_replication_slot_advance('{slot}', pg_current_wal_lsn())"
    ))
    .await;
    pg.execute(after).await;

    let dir = tempfile::tempdir().unwrap();
    let mut relay = relay_with(&fixture, &pg, &broker, dir.path(), Some(&registry), &[]);
    let got = tokio::task::block_in_place(|| read_back(&broker, &fixture.records, &relay));
    relay.stop();
    let run_id = |r: &Record| {
        r.headers
            .iter()
            .find(|(n, _)| n == "__debezium.context.runId")
            .and_then(|(_, v)| v.clone())
    };
    let debezium_run =
        run_id(&fixture.records[0]).map(|v| String::from_utf8_lossy(&v).into_owned());
    let relays: Vec<Consumed> = (got.iter())
        .filter(|g| g.header("__debezium.context.runId") != debezium_run)
        .cloned()
        .collect();
    assert_eq!(
        relays.len(),
        fixture.records.len() - debeziums,
        "the relay relayed only what Debezium had not"
    );
    let ids = Ids {
        fixture: &fixture,
        relay: &registry,
    };
    assert_identical_with(
        "avro after the cutover",
        &fixture.records[debeziums..],
        &relays,
        Some(&ids),
    );
    let after_switch = registry.dump();
    for (subject, versions) in &before_switch {
        assert_eq!(
            &after_switch[subject], versions,
            "{subject}: a new version at the switch"
        );
    }
    let mut partitions: BTreeMap<(String, Vec<u8>), BTreeSet<i32>> = BTreeMap::new();
    for record in &got {
        let Some(key) = record.key.clone() else {
            continue;
        };
        partitions
            .entry((record.topic.clone(), key))
            .or_default()
            .insert(record.partition);
    }
    let moved: Vec<_> = partitions.iter().filter(|(_, p)| p.len() > 1).collect();
    assert!(
        moved.is_empty(),
        "keys on more than one partition: {moved:?}"
    );
    let keys_on_both_sides = fixture.records[..debeziums]
        .iter()
        .filter(|d| d.key.is_some() && fixture.records[debeziums..].iter().any(|r| r.key == d.key))
        .count();
    assert!(
        keys_on_both_sides >= 24,
        "the cutover is tested on keys written before and after it"
    );
    assert_identical_order(&fixture.records, &got);
}
