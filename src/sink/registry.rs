//! I/O: a Confluent Schema Registry client, as much of one as the converters use: register a
//! schema, look one up under its subject, read a subject's latest schema. Every answer is
//! classified once ([`classify`], pure): the registry unreachable, slow or overloaded is
//! [`Failure::Unavailable`] (the pipeline waits and retries), a schema it refuses is
//! [`Failure::Refused`] (poison for that event), a relay it refuses is
//! [`Failure::Unauthorized`] (a configuration error). URLs are tried in turn, like the Java
//! client's `UrlList`, keeping the one that answered. Credentials are sent, never shown.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::Request;
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper_util::rt::TokioIo;
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
use rustls::pki_types::ServerName;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use tokio::net::TcpStream;

use crate::config::SchemaRegistryConfig;
use crate::outbox::connect::avro;
use crate::outbox::connect::registry::{Lookup, Pending, SchemaType};

/// The registry's media type, which the Java client sends and accepts.
const MEDIA_TYPE: &str = "application/vnd.schemaregistry.v1+json";
const ACCEPTED: &str =
    "application/vnd.schemaregistry.v1+json, application/vnd.schemaregistry+json, application/json";
/// The largest answer read (a subject's latest schema can be large).
const MAX_ANSWER: usize = 16 << 20;
/// What a subject may hold in a path segment unencoded (the Java client's `UriBuilder`).
const SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'[')
    .add(b'\\')
    .add(b']')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');

/// A boxed future of a lookup's outcome.
pub type Resolving = Pin<Box<dyn Future<Output = Result<u32, Failure>> + Send>>;

/// What the pipeline asks of a registry: the id of a schema under its subject.
pub trait SchemaRegistry: Send + Sync + 'static {
    /// Registers or finds `pending`'s schema, as its lookup says.
    fn resolve(&self, pending: Pending) -> Resolving;
}

/// Why a registry request did not give an id, classified once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// Unreachable, too slow, or answering 408, 429 or 5xx: try again later.
    #[error("the Schema Registry is unavailable: {reason}")]
    Unavailable {
        /// What happened, naming the URL without credentials.
        reason: String,
    },
    /// The registry refused this schema (or lacks it): poison for the event.
    #[error(
        "the Schema Registry refused the schema of subject {subject:?} (HTTP {status}, error \
         code {code}): {message}. {remedy}"
    )]
    Refused {
        /// The subject.
        subject: String,
        /// The HTTP status.
        status: u16,
        /// The registry's `error_code`.
        code: i64,
        /// The registry's `message`.
        message: String,
        /// What to do about it.
        remedy: &'static str,
    },
    /// The registry refused the relay's credentials (401) or rights (403).
    #[error(
        "the Schema Registry at {url} refused the relay (HTTP {status}): {message}. Check \
         --schema-registry-user-info (basic.auth.user.info) or the URL's user info, and the \
         key's rights on subject {subject:?}"
    )]
    Unauthorized {
        /// The URL, without credentials.
        url: String,
        /// 401 or 403.
        status: u16,
        /// The registry's message.
        message: String,
        /// The subject asked about.
        subject: String,
    },
}

/// The registry's error body.
#[derive(Debug, Deserialize)]
struct ErrorBody {
    error_code: Option<i64>,
    message: Option<String>,
}

/// PURE: what an answer of `status` with `body` means for `subject`; `Ok` carries the body.
pub fn classify(subject: &str, url: &str, status: u16, body: &[u8]) -> Result<(), Failure> {
    if status == 200 {
        return Ok(());
    }
    let error: Option<ErrorBody> = serde_json::from_slice(body).ok();
    let code = error.as_ref().and_then(|e| e.error_code).unwrap_or(-1);
    let message = (error.and_then(|e| e.message)).unwrap_or_else(|| {
        let text = String::from_utf8_lossy(&body[..body.len().min(200)]);
        format!("(no registry error body) {text}")
    });
    let refused = |remedy| Failure::Refused {
        subject: subject.to_owned(),
        status,
        code,
        message: message.clone(),
        remedy,
    };
    Err(match (status, code) {
        (408 | 429 | 500..=599, _) => Failure::Unavailable {
            reason: format!("{url} answered HTTP {status}: {message}"),
        },
        (401 | 403, _) => Failure::Unauthorized {
            url: url.to_owned(),
            status,
            message,
            subject: subject.to_owned(),
        },
        (409, _) => refused(
            "The event's schema is incompatible with the subject's under its compatibility \
             level (a change Debezium's converter would have been refused too): make the \
             change compatible, or set the subject's compatibility (PUT /config/SUBJECT), then \
             replay the event",
        ),
        (422, _) => refused(
            "The registry finds the schema invalid: report it with the schema, and relay such \
             events with another converter",
        ),
        (404, 40401..=40403) => refused(
            "Without --schema-registry-auto-register the schema must be registered under the \
             subject beforehand: register it, or let the relay register it",
        ),
        _ => refused(
            "The registry refused the request: check --schema-registry-url (it must be the \
             registry's base URL) and the registry's log",
        ),
    })
}

/// A Schema Registry reached over HTTP(S).
#[derive(Clone)]
pub struct HttpRegistry(Arc<Inner>);

struct Inner {
    urls: Vec<url::Url>,
    /// The URL tried first: the last that answered.
    current: AtomicUsize,
    user_info: Option<SecretString>,
    tls: Option<tokio_rustls::TlsConnector>,
    timeout: std::time::Duration,
}

/// The registry's client cannot be set up (its CA file, say).
#[derive(Debug, thiserror::Error)]
#[error("--schema-registry-ca {path}: {reason}")]
pub struct SetupError {
    /// The CA file.
    pub path: String,
    /// Why it cannot be used.
    pub reason: String,
}

impl HttpRegistry {
    /// A client for `config`'s registry.
    pub fn new(config: &SchemaRegistryConfig) -> Result<Self, SetupError> {
        let https = config.urls.iter().any(|u| u.scheme() == "https");
        let tls = match https {
            true => Some(tls_connector(config.ca.as_deref())?),
            false => None,
        };
        Ok(HttpRegistry(Arc::new(Inner {
            urls: config.urls.clone(),
            current: AtomicUsize::new(0),
            user_info: config.user_info.clone(),
            tls,
            timeout: config.timeout,
        })))
    }
}

impl Inner {
    /// `method path` with `body`, on each URL in turn from the current one until one answers;
    /// `Ok` holds the status and the body.
    async fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<String>,
    ) -> Result<(String, u16, Bytes), Failure> {
        let first = self.current.load(Ordering::Relaxed);
        let mut failures = Vec::new();
        for step in 0..self.urls.len() {
            let index = (first + step) % self.urls.len();
            let url = &self.urls[index];
            let shown = shown(url);
            let attempt = self.once(url, method, path, body.clone());
            let outcome = match tokio::time::timeout(self.timeout, attempt).await {
                Ok(outcome) => outcome,
                Err(_) => Err(format!(
                    "no answer within --schema-registry-timeout {}",
                    humantime::format_duration(self.timeout)
                )),
            };
            match outcome {
                Ok((status, answer)) => {
                    self.current.store(index, Ordering::Relaxed);
                    return Ok((shown, status, answer));
                }
                Err(reason) => failures.push(format!("{shown}: {reason}")),
            }
        }
        Err(Failure::Unavailable {
            reason: failures.join("; "),
        })
    }

    /// One request to one URL: the status and body, or why there is none.
    async fn once(
        &self,
        url: &url::Url,
        method: &str,
        path: &str,
        body: Option<String>,
    ) -> Result<(u16, Bytes), String> {
        let host = url.host_str().ok_or("no host")?.to_owned();
        let port = url.port_or_known_default().ok_or("no port")?;
        let address = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let tcp = (TcpStream::connect((address.as_str(), port)).await)
            .map_err(|e| format!("cannot connect: {e}"))?;
        let base = url.path().trim_end_matches('/');
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{base}{path}"))
            .header(HOST, format!("{host}:{port}"))
            .header(ACCEPT, ACCEPTED)
            .header(CONTENT_TYPE, MEDIA_TYPE);
        if let Some(credentials) = self.credentials(url) {
            request = request.header(AUTHORIZATION, credentials);
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| format!("cannot build the request: {e}"))?;
        match (&self.tls, url.scheme()) {
            (Some(tls), "https") => {
                let name = ServerName::try_from(address.clone())
                    .map_err(|e| format!("not a TLS server name: {e}"))?;
                let stream = (tls.connect(name, tcp).await)
                    .map_err(|e| format!("TLS handshake failed: {e}"))?;
                exchange(TokioIo::new(stream), request).await
            }
            _ => exchange(TokioIo::new(tcp), request).await,
        }
    }

    /// `Basic ...` from `--schema-registry-user-info`, else from the URL's user info.
    fn credentials(&self, url: &url::Url) -> Option<String> {
        let pair = match &self.user_info {
            Some(info) => info.expose_secret().to_owned(),
            None if !url.username().is_empty() => {
                let decode = |s: &str| {
                    percent_encoding::percent_decode_str(s)
                        .decode_utf8_lossy()
                        .into_owned()
                };
                let password = url.password().map(decode).unwrap_or_default();
                format!("{}:{password}", decode(url.username()))
            }
            None => return None,
        };
        let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
        Some(format!("Basic {encoded}"))
    }

    /// The id of `pending`'s schema, as its lookup finds it.
    async fn id(&self, pending: Pending) -> Result<u32, Failure> {
        let subject = utf8_percent_encode(&pending.subject, SEGMENT).to_string();
        // AVRO is the registry's default type, which the Java client does not send.
        let request = match pending.schema.kind() {
            SchemaType::Avro => serde_json::json!({ "schema": pending.schema.text() }),
            SchemaType::Protobuf => serde_json::json!({
                "schemaType": "PROTOBUF",
                "schema": pending.schema.text(),
            }),
        };
        let (method, path, body) = match pending.lookup {
            Lookup::Register => (
                "POST",
                format!("/subjects/{subject}/versions?normalize=false"),
                Some(request.to_string()),
            ),
            Lookup::Existing => (
                "POST",
                format!("/subjects/{subject}?normalize=false&deleted=false"),
                Some(request.to_string()),
            ),
            Lookup::Latest => ("GET", format!("/subjects/{subject}/versions/latest"), None),
        };
        let (url, status, answer) = self.request(method, &path, body).await?;
        classify(&pending.subject, &url, status, &answer)?;
        let answer: Answer = serde_json::from_slice(&answer).map_err(|e| Failure::Unavailable {
            reason: format!("{url} answered with a body that is not the registry's: {e}"),
        })?;
        if pending.lookup == Lookup::Latest {
            latest_matches(&pending, &answer)?;
        }
        Ok(answer.id)
    }
}

impl SchemaRegistry for HttpRegistry {
    fn resolve(&self, pending: Pending) -> Resolving {
        let inner = Arc::clone(&self.0);
        Box::pin(async move { inner.id(pending).await })
    }
}

/// A registry's answer: the id, and for `versions/latest` the schema.
#[derive(Debug, Deserialize)]
struct Answer {
    id: u32,
    schema: Option<String>,
    #[serde(rename = "schemaType")]
    schema_type: Option<String>,
}

/// `use.latest.version`: the latest schema must encode as the relay's does (the same Parsing
/// Canonical Form: documentation, properties, defaults and namespaces written out may differ).
fn latest_matches(pending: &Pending, answer: &Answer) -> Result<(), Failure> {
    let refused = |message: String| Failure::Refused {
        subject: pending.subject.to_string(),
        status: 200,
        code: 0,
        message,
        remedy: "With --schema-registry-use-latest-version the relay writes only events whose schema is the subject's latest but for documentation and properties: register the event's schema as the latest version, or turn auto-registration on",
    };
    let latest = answer.schema.as_deref().unwrap_or_default();
    if latest == pending.schema.text() {
        return Ok(());
    }
    let expected = match pending.schema.kind() {
        SchemaType::Avro => "AVRO",
        SchemaType::Protobuf => "PROTOBUF",
    };
    let latest_type = answer.schema_type.as_deref().unwrap_or("AVRO");
    if latest_type != expected {
        return Err(refused(format!(
            "the latest schema is of type {latest_type}, not {expected}"
        )));
    }
    if pending.schema.kind() == SchemaType::Protobuf {
        // The registry may print a schema otherwise than it was registered: only the same text
        // is known to encode the same bytes.
        return Err(refused(format!(
            "the latest schema (id {}) is not the event's: {latest}",
            answer.id
        )));
    }
    let canonical = |text: &str| avro::parsing_canonical_form(text);
    match (canonical(latest), canonical(pending.schema.text())) {
        (Ok(latest), Ok(ours)) if latest == ours => Ok(()),
        (Err(e), _) => Err(refused(format!("the latest schema does not parse: {e}"))),
        _ => Err(refused(format!(
            "the latest schema (id {}) is not the event's: {latest}",
            answer.id
        ))),
    }
}

/// Sends `request` on a new HTTP/1.1 connection over `io` and reads the answer.
async fn exchange<I>(io: I, request: Request<Full<Bytes>>) -> Result<(u16, Bytes), String>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| format!("HTTP handshake failed: {e}"))?;
    let driver = tokio::spawn(connection);
    let outcome = async {
        let response =
            (sender.send_request(request).await).map_err(|e| format!("no answer: {e}"))?;
        let status = response.status().as_u16();
        let body = Limited::new(response.into_body(), MAX_ANSWER);
        let body = (body.collect().await).map_err(|e| format!("the answer broke off: {e}"))?;
        Ok((status, body.to_bytes()))
    }
    .await;
    driver.abort();
    outcome
}

/// The URL without its user info.
fn shown(url: &url::Url) -> String {
    let mut url = url.clone();
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.to_string()
}

/// TLS to the registry: its CA's certificates (`ca`), else the public web roots.
fn tls_connector(ca: Option<&std::path::Path>) -> Result<tokio_rustls::TlsConnector, SetupError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        Some(path) => {
            let error = |reason: String| SetupError {
                path: path.display().to_string(),
                reason,
            };
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(Iterator::collect::<Result<Vec<_>, _>>)
                .map_err(|e| error(format!("cannot read PEM certificates: {e}")))?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(error(
                    "holds no X.509 CA certificate (-----BEGIN CERTIFICATE-----)".into(),
                ));
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| SetupError {
            path: String::new(),
            reason: e.to_string(),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::connect::registry::RegistrySchema;

    #[test]
    fn answers_are_classified_once() {
        let body = |code: i64| format!(r#"{{"error_code":{code},"message":"said {code}"}}"#);
        // (status, body) -> the class, as a word
        let table: Vec<(u16, String, &str)> = vec![
            (200, r#"{"id":1}"#.into(), "ok"),
            (409, body(409), "refused"),
            (422, body(42201), "refused"),
            (404, body(40401), "refused"),
            (404, body(40403), "refused"),
            (404, "<html>".into(), "refused"),
            (401, body(401), "unauthorized"),
            (403, body(40301), "unauthorized"),
            (408, body(408), "unavailable"),
            (429, "".into(), "unavailable"),
            (500, body(50001), "unavailable"),
            (503, "busy".into(), "unavailable"),
        ];
        for (status, answer, expected) in table {
            let class = match classify("t-value", "http://127.0.0.1:1/", status, answer.as_bytes())
            {
                Ok(()) => "ok",
                Err(Failure::Refused { .. }) => "refused",
                Err(Failure::Unauthorized { .. }) => "unauthorized",
                Err(Failure::Unavailable { .. }) => "unavailable",
            };
            assert_eq!(class, expected, "{status} {answer}");
        }
        let Err(refused) = classify("t-value", "u", 409, body(409).as_bytes()) else {
            panic!("not refused");
        };
        let text = refused.to_string();
        assert!(
            text.contains("\"t-value\"") && text.contains("said 409"),
            "{text}"
        );
    }

    #[test]
    fn use_latest_version_takes_a_protobuf_schema_only_by_its_text() {
        let pending = |kind, text: &str| Pending {
            subject: "t-value".into(),
            schema: Arc::new(RegistrySchema::new(kind, text.to_owned())),
            lookup: Lookup::Latest,
        };
        let answer = |kind: Option<&str>, text: &str| Answer {
            id: 3,
            schema: Some(text.to_owned()),
            schema_type: kind.map(str::to_owned),
        };
        let proto =
            "syntax = \"proto3\";\npackage p;\n\nmessage Value {\n  string payload = 1;\n}\n";
        // (the event's, the latest) -> accepted
        let table = [
            (
                pending(SchemaType::Protobuf, proto),
                answer(Some("PROTOBUF"), proto),
                true,
            ),
            (
                pending(SchemaType::Protobuf, proto),
                answer(Some("PROTOBUF"), &proto.replace("payload", "body")),
                false,
            ),
            (
                pending(SchemaType::Protobuf, proto),
                answer(None, "\"string\""),
                false,
            ),
            (
                pending(SchemaType::Avro, "\"string\""),
                answer(None, "{\"type\":\"string\"}"),
                true,
            ),
            (
                pending(SchemaType::Avro, "\"string\""),
                answer(Some("PROTOBUF"), proto),
                false,
            ),
        ];
        for (pending, latest, accepted) in table {
            let outcome = latest_matches(&pending, &latest);
            assert_eq!(
                outcome.is_ok(),
                accepted,
                "{pending:?} {latest:?}: {outcome:?}"
            );
        }
    }

    #[test]
    fn shown_urls_hold_no_credentials() {
        let url = url::Url::parse("https://key:s3cret@registry.example:8081/sr").unwrap();
        assert_eq!(shown(&url), "https://registry.example:8081/sr");
        let config = SchemaRegistryConfig {
            urls: vec![url],
            user_info: None,
            ca: None,
            timeout: std::time::Duration::from_secs(1),
        };
        let client = HttpRegistry::new(&config).unwrap();
        let basic = client.0.credentials(&config.urls[0]).unwrap();
        assert_eq!(
            basic,
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode("key:s3cret")
            )
        );
    }
}
