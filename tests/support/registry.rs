//! A small Schema Registry speaking the part of Confluent's REST API that serializers and the
//! relay use (register, look up, latest version, subjects, versions, schemas by id, config),
//! with Confluent's ids (global per schema text, from 1), versions (per subject, from 1), error
//! bodies and `BACKWARD` compatibility for Avro (the registry's default; `NONE` by config).
//! No registry server is installable here, so the tests run this one; the fixture script
//! (`scripts/debezium-fixtures/generate.sh`) runs Confluent's own Java client and converters
//! against it (`cargo run --example schema-registry`), which is what proves it speaks the API.
//!
//! Faults for the tests: answer 503 to everything (`set_unavailable`), refuse every
//! registration under a subject with 409 (`refuse_subject`), require basic auth
//! (`require_auth`), and stop and start listening on the same port (`stop`, `start`).
//! [`Registry::spawn_tls`] serves https with a certificate from a CA of its own, as a
//! company's registry does.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use serde_json::{Value, json};

/// The registry's contents and fault switches.
#[derive(Default)]
pub struct Contents {
    /// Schemas by id - 1: (type, text).
    schemas: Vec<(String, String)>,
    /// Subject -> ids by version - 1.
    subjects: BTreeMap<String, Vec<u32>>,
    /// Compatibility per subject; the global level under "".
    compatibility: BTreeMap<String, String>,
    unavailable: bool,
    refused: HashSet<String>,
    auth: Option<String>,
    /// Requests answered (all of them).
    pub requests: u64,
}

/// A registry on a loopback port.
pub struct Registry {
    contents: Arc<Mutex<Contents>>,
    addr: SocketAddr,
    server: Option<tokio::task::JoinHandle<()>>,
    /// https: the server's TLS settings and its CA's certificate (PEM).
    tls: Option<(Arc<rustls::ServerConfig>, String)>,
}

fn lock(contents: &Mutex<Contents>) -> MutexGuard<'_, Contents> {
    contents.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Registry {
    /// Starts a registry on a free loopback port (`port` 0) or on `port`.
    pub async fn start_on(port: u16) -> std::io::Result<Registry> {
        let contents = Arc::new(Mutex::new(Contents::default()));
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut registry = Registry {
            contents,
            addr,
            server: None,
            tls: None,
        };
        registry.start().await?;
        Ok(registry)
    }

    /// Starts a registry on a free loopback port.
    pub async fn spawn() -> Registry {
        Registry::start_on(0).await.expect("bind the test registry")
    }

    /// Starts a registry serving https on a free loopback port, with a certificate for
    /// `127.0.0.1` signed by a CA made for it ([`Registry::ca_pem`]).
    pub async fn spawn_tls() -> Registry {
        let mut registry = Registry {
            contents: Arc::new(Mutex::new(Contents::default())),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            server: None,
            tls: Some(tls::server()),
        };
        registry.start().await.expect("bind the test registry");
        registry
    }

    /// The PEM certificate of the CA that signed an https registry's certificate.
    pub fn ca_pem(&self) -> Option<&str> {
        self.tls.as_ref().map(|(_, ca)| ca.as_str())
    }

    /// Listens again (on the same port after a [`Registry::stop`]).
    pub async fn start(&mut self) -> std::io::Result<()> {
        let listener = tokio::net::TcpListener::bind(self.addr).await?;
        self.addr = listener.local_addr()?;
        let app = router(Arc::clone(&self.contents));
        let server = match &self.tls {
            None => tokio::spawn(async move {
                let _ = axum::serve(listener, app).await;
            }),
            Some((config, _)) => {
                let listener = tls::Listener {
                    tcp: listener,
                    acceptor: tokio_rustls::TlsAcceptor::from(Arc::clone(config)),
                };
                tokio::spawn(async move {
                    let _ = axum::serve(listener, app).await;
                })
            }
        };
        self.server = Some(server);
        Ok(())
    }

    /// Stops listening: connections are refused until [`Registry::start`].
    pub async fn stop(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
            let _ = server.await;
        }
    }

    /// `http://127.0.0.1:PORT`, or `https://` when it serves TLS.
    pub fn url(&self) -> String {
        match self.tls {
            None => format!("http://{}", self.addr),
            Some(_) => format!("https://{}", self.addr),
        }
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Answers 503 to everything while `on`.
    pub fn set_unavailable(&self, on: bool) {
        lock(&self.contents).unavailable = on;
    }

    /// Refuses every new registration under `subject` with 409.
    pub fn refuse_subject(&self, subject: &str) {
        lock(&self.contents).refused.insert(subject.to_owned());
    }

    /// Requires basic auth with `user:password`.
    pub fn require_auth(&self, user_info: &str) {
        lock(&self.contents).auth = Some(user_info.to_owned());
    }

    /// Sets the compatibility level of `subject` ("" for the global level).
    pub fn set_compatibility(&self, subject: &str, level: &str) {
        let mut contents = lock(&self.contents);
        contents
            .compatibility
            .insert(subject.to_owned(), level.to_owned());
    }

    /// Registers `schema` under `subject` as a client would, returning its id.
    pub fn register(&self, subject: &str, schema: &str) -> Result<u32, (u16, Value)> {
        let mut contents = lock(&self.contents);
        register(&mut contents, subject, "AVRO", schema)
    }

    /// Requests answered so far.
    pub fn requests(&self) -> u64 {
        lock(&self.contents).requests
    }

    /// Every subject with its versions' ids and schema texts, in version order.
    pub fn dump(&self) -> BTreeMap<String, Vec<(u32, String)>> {
        let contents = lock(&self.contents);
        let text = |id: u32| contents.schemas[id as usize - 1].1.clone();
        (contents.subjects.iter())
            .map(|(subject, ids)| {
                (
                    subject.clone(),
                    ids.iter().map(|&id| (id, text(id))).collect(),
                )
            })
            .collect()
    }

    /// Every subject with its versions' schema types (`AVRO`, `PROTOBUF`), in version order.
    pub fn types(&self) -> BTreeMap<String, Vec<String>> {
        let contents = lock(&self.contents);
        let kind = |id: &u32| contents.schemas[*id as usize - 1].0.clone();
        (contents.subjects.iter())
            .map(|(subject, ids)| (subject.clone(), ids.iter().map(kind).collect()))
            .collect()
    }

    /// The text of the schema with `id`.
    pub fn schema(&self, id: u32) -> Option<String> {
        let contents = lock(&self.contents);
        contents
            .schemas
            .get((id as usize).checked_sub(1)?)
            .map(|(_, text)| text.clone())
    }
}

type Shared = State<Arc<Mutex<Contents>>>;

fn router(contents: Arc<Mutex<Contents>>) -> Router {
    Router::new()
        .route("/subjects", get(subjects))
        .route("/subjects/{subject}", post(lookup))
        .route(
            "/subjects/{subject}/versions",
            get(versions).post(register_route),
        )
        .route("/subjects/{subject}/versions/{version}", get(version))
        .route("/schemas/ids/{id}", get(schema_by_id))
        .route("/config", get(global_config).put(put_global_config))
        .route(
            "/config/{subject}",
            get(subject_config).put(put_subject_config),
        )
        .with_state(contents)
}

/// A Confluent error body.
fn error(status: u16, code: u32, message: String) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = json!({ "error_code": code, "message": message });
    (status, axum::Json(body)).into_response()
}

/// The checks every request passes first: availability and credentials.
fn admit(contents: &mut Contents, headers: &HeaderMap) -> Result<(), Response> {
    contents.requests += 1;
    if contents.unavailable {
        return Err(error(503, 50003, "Service unavailable (test fault)".into()));
    }
    let Some(expected) = &contents.auth else {
        return Ok(());
    };
    let given = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|v| base64::engine::general_purpose::STANDARD.decode(v).ok());
    if given.as_deref() == Some(expected.as_bytes()) {
        return Ok(());
    }
    Err(error(401, 401, "Unauthorized".into()))
}

/// `{schema, schemaType?, references?}`
fn request_body(body: &Bytes) -> Result<(String, String), Response> {
    let json: Value = serde_json::from_slice(body)
        .map_err(|e| error(422, 42201, format!("Invalid request body: {e}")))?;
    let schema = json["schema"]
        .as_str()
        .ok_or_else(|| error(422, 42201, "Empty schema".into()))?;
    let kind = json["schemaType"].as_str().unwrap_or("AVRO").to_owned();
    if json["references"].as_array().is_some_and(|r| !r.is_empty()) {
        return Err(error(
            422,
            42201,
            "References are not supported by this test registry".into(),
        ));
    }
    Ok((kind, schema.to_owned()))
}

fn register(
    contents: &mut Contents,
    subject: &str,
    kind: &str,
    schema: &str,
) -> Result<u32, (u16, Value)> {
    let fail = |status: u16, code: u32, message: String| {
        Err((status, json!({ "error_code": code, "message": message })))
    };
    let existing = contents
        .schemas
        .iter()
        .position(|(k, t)| k == kind && t == schema);
    let versions = contents.subjects.get(subject).cloned().unwrap_or_default();
    if let Some(index) = existing {
        let id = index as u32 + 1;
        if versions.contains(&id) {
            return Ok(id);
        }
    }
    if kind == "AVRO" && avro::parse(schema).is_err() {
        return fail(422, 42201, format!("Invalid schema {schema}"));
    }
    let incompatible = format!(
        "Schema being registered is incompatible with an earlier schema for subject \"{subject}\""
    );
    if contents.refused.contains(subject) {
        return fail(409, 409, incompatible);
    }
    let level = (contents.compatibility.get(subject))
        .or_else(|| contents.compatibility.get(""))
        .map_or("BACKWARD", String::as_str);
    if let Some(&latest) = versions.last() {
        let (latest_kind, latest_text) = &contents.schemas[latest as usize - 1];
        let checked = match level {
            "NONE" => true,
            "BACKWARD" if kind == "AVRO" && latest_kind == "AVRO" => {
                avro::can_read(schema, latest_text)
            }
            "BACKWARD" => kind == latest_kind,
            other => {
                return fail(
                    422,
                    42203,
                    format!("Compatibility level {other} is not supported by this test registry"),
                );
            }
        };
        if !checked {
            return fail(409, 409, incompatible);
        }
    }
    let id = match existing {
        Some(index) => index as u32 + 1,
        None => {
            contents.schemas.push((kind.to_owned(), schema.to_owned()));
            contents.schemas.len() as u32
        }
    };
    contents
        .subjects
        .entry(subject.to_owned())
        .or_default()
        .push(id);
    Ok(id)
}

async fn register_route(
    State(contents): Shared,
    Path(subject): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut contents = lock(&contents);
    if let Err(response) = admit(&mut contents, &headers) {
        return response;
    }
    let (kind, schema) = match request_body(&body) {
        Ok(parsed) => parsed,
        Err(response) => return response,
    };
    match register(&mut contents, &subject, &kind, &schema) {
        Ok(id) => axum::Json(json!({ "id": id })).into_response(),
        Err((status, body)) => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            (status, axum::Json(body)).into_response()
        }
    }
}

/// A version's body: `{subject, version, id, schema}` (`schemaType` unless Avro).
fn version_body(contents: &Contents, subject: &str, version: usize) -> Value {
    let id = contents.subjects[subject][version - 1];
    let (kind, text) = &contents.schemas[id as usize - 1];
    let mut body = json!({ "subject": subject, "version": version, "id": id, "schema": text });
    if kind != "AVRO" {
        body["schemaType"] = json!(kind);
    }
    body
}

async fn lookup(
    State(contents): Shared,
    Path(subject): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut contents = lock(&contents);
    if let Err(response) = admit(&mut contents, &headers) {
        return response;
    }
    let (kind, schema) = match request_body(&body) {
        Ok(parsed) => parsed,
        Err(response) => return response,
    };
    let Some(ids) = contents.subjects.get(&subject) else {
        return error(404, 40401, format!("Subject '{subject}' not found."));
    };
    let found = ids.iter().position(|&id| {
        let (k, t) = &contents.schemas[id as usize - 1];
        *k == kind && *t == schema
    });
    match found {
        Some(index) => axum::Json(version_body(&contents, &subject, index + 1)).into_response(),
        None => error(404, 40403, "Schema not found".into()),
    }
}

async fn subjects(State(contents): Shared, headers: HeaderMap) -> Response {
    let mut contents = lock(&contents);
    if let Err(response) = admit(&mut contents, &headers) {
        return response;
    }
    axum::Json(contents.subjects.keys().cloned().collect::<Vec<_>>()).into_response()
}

async fn versions(
    State(contents): Shared,
    Path(subject): Path<String>,
    headers: HeaderMap,
) -> Response {
    let mut contents = lock(&contents);
    if let Err(response) = admit(&mut contents, &headers) {
        return response;
    }
    match contents.subjects.get(&subject) {
        Some(ids) => axum::Json((1..=ids.len()).collect::<Vec<_>>()).into_response(),
        None => error(404, 40401, format!("Subject '{subject}' not found.")),
    }
}

async fn version(
    State(contents): Shared,
    Path((subject, version)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let mut contents = lock(&contents);
    if let Err(response) = admit(&mut contents, &headers) {
        return response;
    }
    let Some(count) = contents.subjects.get(&subject).map(Vec::len) else {
        return error(404, 40401, format!("Subject '{subject}' not found."));
    };
    let version = match version.as_str() {
        "latest" | "-1" => count,
        other => other.parse().unwrap_or(0),
    };
    if version == 0 || version > count {
        return error(404, 40402, format!("Version {version} not found."));
    }
    axum::Json(version_body(&contents, &subject, version)).into_response()
}

async fn schema_by_id(
    State(contents): Shared,
    Path(id): Path<u32>,
    headers: HeaderMap,
) -> Response {
    let mut contents = lock(&contents);
    if let Err(response) = admit(&mut contents, &headers) {
        return response;
    }
    match contents.schemas.get((id as usize).wrapping_sub(1)) {
        Some((kind, text)) if kind == "AVRO" => {
            axum::Json(json!({ "schema": text })).into_response()
        }
        Some((kind, text)) => {
            axum::Json(json!({ "schema": text, "schemaType": kind })).into_response()
        }
        None => error(404, 40403, format!("Schema {id} not found")),
    }
}

fn level(contents: &Contents, subject: &str) -> Value {
    let level = (contents.compatibility.get(subject)).or_else(|| contents.compatibility.get(""));
    json!({ "compatibilityLevel": level.map_or("BACKWARD", String::as_str) })
}

async fn global_config(State(contents): Shared, headers: HeaderMap) -> Response {
    let mut contents = lock(&contents);
    if let Err(response) = admit(&mut contents, &headers) {
        return response;
    }
    axum::Json(level(&contents, "")).into_response()
}

async fn subject_config(
    State(contents): Shared,
    Path(subject): Path<String>,
    headers: HeaderMap,
) -> Response {
    let mut contents = lock(&contents);
    if let Err(response) = admit(&mut contents, &headers) {
        return response;
    }
    axum::Json(level(&contents, &subject)).into_response()
}

fn put_config(
    contents: &Arc<Mutex<Contents>>,
    subject: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> Response {
    let mut contents = lock(contents);
    if let Err(response) = admit(&mut contents, headers) {
        return response;
    }
    let json: Value = serde_json::from_slice(body).unwrap_or_default();
    let Some(level) = json["compatibility"].as_str() else {
        return error(422, 42203, "Invalid compatibility level".into());
    };
    contents
        .compatibility
        .insert(subject.to_owned(), level.to_owned());
    axum::Json(json!({ "compatibility": level })).into_response()
}

async fn put_global_config(State(contents): Shared, headers: HeaderMap, body: Bytes) -> Response {
    put_config(&contents, "", &headers, &body)
}

async fn put_subject_config(
    State(contents): Shared,
    Path(subject): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    put_config(&contents, &subject, &headers, &body)
}

/// https for the registry: a CA of its own, and a listener that does the TLS handshake.
mod tls {
    use std::sync::Arc;

    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair,
        KeyUsagePurpose,
    };
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    use tokio::net::{TcpListener, TcpStream};
    use tokio_rustls::TlsAcceptor;
    use tokio_rustls::server::TlsStream;

    /// The server's TLS settings (a certificate for `127.0.0.1` signed by a new CA) and the
    /// CA's certificate in PEM.
    pub fn server() -> (Arc<rustls::ServerConfig>, String) {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "test registry CA");
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key"))
            .expect("CA certificate");
        let key = KeyPair::generate().expect("server key");
        let params = CertificateParams::new(vec!["127.0.0.1".to_owned()]).expect("parameters");
        let cert = params.signed_by(&key, &ca).expect("server certificate");
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let chain = vec![CertificateDer::from(cert.der().to_vec())];
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("server certificate and key");
        (Arc::new(config), ca.pem())
    }

    /// TCP connections on loopback that complete a TLS handshake; a failed handshake (a client
    /// that does not trust the CA) is dropped.
    pub struct Listener {
        pub tcp: TcpListener,
        pub acceptor: TlsAcceptor,
    }

    impl axum::serve::Listener for Listener {
        type Io = TlsStream<TcpStream>;
        type Addr = std::net::SocketAddr;

        async fn accept(&mut self) -> (Self::Io, Self::Addr) {
            loop {
                let Ok((tcp, addr)) = self.tcp.accept().await else {
                    continue;
                };
                if let Ok(tls) = self.acceptor.accept(tcp).await {
                    return (tls, addr);
                }
            }
        }

        fn local_addr(&self) -> std::io::Result<Self::Addr> {
            self.tcp.local_addr()
        }
    }
}

/// Avro schemas as far as compatibility needs them, and Avro's reader/writer rules.
pub mod avro {
    use std::collections::{BTreeMap, BTreeSet};

    use serde_json::Value;

    /// A parsed schema.
    #[derive(Clone, Debug)]
    pub enum Schema {
        /// A primitive type by name.
        Primitive(String),
        /// A record: full name and fields (name, schema, whether it has a default).
        Record(String, Vec<(String, Schema, bool)>),
        /// An enum: full name and symbols.
        Enum(String, Vec<String>),
        /// A fixed: full name and size.
        Fixed(String, u64),
        /// An array of items.
        Array(Box<Schema>),
        /// A map of values.
        Map(Box<Schema>),
        /// A union.
        Union(Vec<Schema>),
        /// A named type defined elsewhere, by full name.
        Ref(String),
    }

    /// Parses a schema's JSON text, with the named types it defines.
    pub fn parse(text: &str) -> Result<(Schema, BTreeMap<String, Schema>), String> {
        let json: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let mut names = BTreeMap::new();
        let schema = parse_value(&json, None, &mut names)?;
        Ok((schema, names))
    }

    const PRIMITIVES: [&str; 8] = [
        "null", "boolean", "int", "long", "float", "double", "bytes", "string",
    ];

    fn full(name: &str, space: Option<&str>) -> String {
        match space {
            Some(space) if !name.contains('.') && !space.is_empty() => format!("{space}.{name}"),
            _ => name.to_owned(),
        }
    }

    fn parse_value(
        json: &Value,
        space: Option<&str>,
        names: &mut BTreeMap<String, Schema>,
    ) -> Result<Schema, String> {
        match json {
            Value::String(name) if PRIMITIVES.contains(&name.as_str()) => {
                Ok(Schema::Primitive(name.clone()))
            }
            Value::String(name) => {
                let name = full(name, space);
                match names.contains_key(&name) {
                    true => Ok(Schema::Ref(name)),
                    false => Err(format!("undefined name: {name}")),
                }
            }
            Value::Array(branches) => {
                let branches = branches.iter().map(|b| parse_value(b, space, names));
                Ok(Schema::Union(branches.collect::<Result<_, _>>()?))
            }
            Value::Object(object) => {
                let kind = object.get("type").ok_or("no type")?;
                let Value::String(kind) = kind else {
                    return parse_value(kind, space, names);
                };
                let name = || -> Result<String, String> {
                    let name = object
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or("no name")?;
                    let namespace = object.get("namespace").and_then(Value::as_str).or(space);
                    Ok(full(name, namespace))
                };
                match kind.as_str() {
                    "record" | "error" => {
                        let name = name()?;
                        let inner = name.rsplit_once('.').map(|(s, _)| s.to_owned());
                        names.insert(name.clone(), Schema::Record(name.clone(), Vec::new()));
                        let mut fields = Vec::new();
                        let mut seen = BTreeSet::new();
                        for field in object
                            .get("fields")
                            .and_then(Value::as_array)
                            .ok_or("no fields")?
                        {
                            let field_name =
                                field["name"].as_str().ok_or("a field without name")?;
                            if !seen.insert(field_name.to_owned()) {
                                return Err(format!("duplicate field {field_name}"));
                            }
                            let schema = parse_value(&field["type"], inner.as_deref(), names)?;
                            fields.push((
                                field_name.to_owned(),
                                schema,
                                field.get("default").is_some(),
                            ));
                        }
                        let record = Schema::Record(name.clone(), fields);
                        names.insert(name, record.clone());
                        Ok(record)
                    }
                    "enum" => {
                        let symbols = object
                            .get("symbols")
                            .and_then(Value::as_array)
                            .ok_or("no symbols")?;
                        let symbols = symbols
                            .iter()
                            .filter_map(Value::as_str)
                            .map(str::to_owned)
                            .collect();
                        let schema = Schema::Enum(name()?, symbols);
                        names.insert(name()?, schema.clone());
                        Ok(schema)
                    }
                    "fixed" => {
                        let size = object
                            .get("size")
                            .and_then(Value::as_u64)
                            .ok_or("no size")?;
                        let schema = Schema::Fixed(name()?, size);
                        names.insert(name()?, schema.clone());
                        Ok(schema)
                    }
                    "array" => Ok(Schema::Array(Box::new(parse_value(
                        object.get("items").ok_or("no items")?,
                        space,
                        names,
                    )?))),
                    "map" => Ok(Schema::Map(Box::new(parse_value(
                        object.get("values").ok_or("no values")?,
                        space,
                        names,
                    )?))),
                    primitive if PRIMITIVES.contains(&primitive) => {
                        Ok(Schema::Primitive(primitive.to_owned()))
                    }
                    other => Err(format!("unknown type {other}")),
                }
            }
            other => Err(format!("not a schema: {other}")),
        }
    }

    /// Whether data written with `writer` can be read with `reader` (BACKWARD: the new schema
    /// reads the latest), by Avro's resolution rules.
    pub fn can_read(reader: &str, writer: &str) -> bool {
        let (Ok((reader, reader_names)), Ok((writer, writer_names))) =
            (parse(reader), parse(writer))
        else {
            return false;
        };
        let mut checker = Checker {
            reader_names,
            writer_names,
            assumed: BTreeSet::new(),
        };
        checker.reads(&reader, &writer)
    }

    struct Checker {
        reader_names: BTreeMap<String, Schema>,
        writer_names: BTreeMap<String, Schema>,
        /// Record pairs assumed compatible while their fields are checked (recursion).
        assumed: BTreeSet<(String, String)>,
    }

    fn short(name: &str) -> &str {
        name.rsplit('.').next().unwrap_or(name)
    }

    impl Checker {
        fn resolve<'a>(names: &'a BTreeMap<String, Schema>, schema: &'a Schema) -> &'a Schema {
            match schema {
                Schema::Ref(name) => names.get(name).unwrap_or(schema),
                other => other,
            }
        }

        fn reads(&mut self, reader: &Schema, writer: &Schema) -> bool {
            let reader = Self::resolve(&self.reader_names, reader).clone();
            let writer = Self::resolve(&self.writer_names, writer).clone();
            match (&reader, &writer) {
                (_, Schema::Union(branches)) => branches.iter().all(|w| self.reads(&reader, w)),
                (Schema::Union(branches), _) => branches.iter().any(|r| self.reads(r, &writer)),
                (Schema::Primitive(r), Schema::Primitive(w)) => {
                    r == w
                        || matches!(
                            (r.as_str(), w.as_str()),
                            ("long", "int")
                                | ("float", "int" | "long")
                                | ("double", "int" | "long" | "float")
                                | ("string", "bytes")
                                | ("bytes", "string")
                        )
                }
                (Schema::Array(r), Schema::Array(w)) | (Schema::Map(r), Schema::Map(w)) => {
                    self.reads(r, w)
                }
                (Schema::Enum(r, rs), Schema::Enum(w, ws)) => {
                    short(r) == short(w) && ws.iter().all(|s| rs.contains(s))
                }
                (Schema::Fixed(r, rs), Schema::Fixed(w, ws)) => short(r) == short(w) && rs == ws,
                (Schema::Record(r, reader_fields), Schema::Record(w, writer_fields)) => {
                    if short(r) != short(w) {
                        return false;
                    }
                    if !self.assumed.insert((r.clone(), w.clone())) {
                        return true;
                    }
                    reader_fields.iter().all(|(name, schema, default)| {
                        match writer_fields.iter().find(|(n, _, _)| n == name) {
                            Some((_, written, _)) => self.reads(schema, written),
                            None => *default,
                        }
                    })
                }
                _ => false,
            }
        }
    }
}
