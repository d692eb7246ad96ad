//! PURE: the two tokens AWS IAM authentication takes, presigned with SigV4 by `aws-sigv4` for
//! given credentials, region and instant: an MSK IAM token (the `kafka-cluster:Connect` URL,
//! base64url, as `aws-msk-iam-sasl-signer` makes it) and an RDS IAM token (the `rds-db`
//! `connect` URL without its scheme, as botocore's `generate_db_auth_token` makes it).
//!
//! Both are byte for byte what AWS's signers make, which the fixtures in
//! `tests/fixtures/aws-signers/` (made by `scripts/aws-signer-fixtures/generate.py` with
//! AWS's Python signers) show: the query is written in botocore's order (the operation's
//! parameters, the signing parameters, the session token, the signature) and encoding
//! (RFC 3986 unreserved characters kept, everything else percent-encoded).

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    SignableBody, SignableRequest, SignatureLocation, SigningSettings, sign,
};
use aws_sigv4::sign::v4;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// How long a presigned token is valid after its signing instant (both signers' 900 s).
pub const TOKEN_VALIDITY: Duration = Duration::from_secs(900);

/// The MSK IAM token's signing name and action.
const MSK_SERVICE: &str = "kafka-cluster";
const MSK_ACTION: &str = "kafka-cluster:Connect";

/// The RDS IAM token's signing name and action.
const RDS_SERVICE: &str = "rds-db";
const RDS_ACTION: &str = "connect";

/// The signing parameters, in the order botocore writes them after the operation's.
const SIGNING_PARAMETERS: [&str; 5] = [
    "X-Amz-Algorithm",
    "X-Amz-Credential",
    "X-Amz-Date",
    "X-Amz-Expires",
    "X-Amz-SignedHeaders",
];
const SESSION_TOKEN_PARAMETER: &str = "X-Amz-Security-Token";
const SIGNATURE_PARAMETER: &str = "X-Amz-Signature";

/// A token could not be signed; no part of the credentials is in it.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// The host cannot be part of a URL (empty, or a Unix socket directory).
    #[error("{0:?} is not a host name or address a token can be signed for")]
    Host(String),
    /// `aws-sigv4` refused the request or the parameters.
    #[error("SigV4 signing failed: {0}")]
    Sigv4(String),
    /// `aws-sigv4` did not return a parameter every presigned URL has.
    #[error("SigV4 signing returned no {0}")]
    Missing(&'static str),
}

/// An MSK IAM token and when it stops being accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MskToken {
    /// The base64url (unpadded) presigned URL, SASL/OAUTHBEARER's token value.
    pub value: String,
    /// Its expiry, in milliseconds since the Unix epoch: the signing second plus 900 s.
    pub expiry_ms: i64,
}

/// The MSK IAM token for `region` at `now`; `user_agent` is the URL's last, unsigned
/// parameter (the relay's name and version; AWS's signers put theirs there).
pub fn msk_token(
    credentials: &Credentials,
    region: &str,
    now: SystemTime,
    user_agent: &str,
) -> Result<MskToken, SignError> {
    let host = format!("kafka.{region}.amazonaws.com");
    let operation = [("Action", MSK_ACTION)];
    let query = presign(credentials, region, MSK_SERVICE, &host, &operation, now)?;
    let url = format!("https://{host}/?{query}&User-Agent={}", encode(user_agent));
    let signed_second = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let expiry = Duration::from_secs(signed_second) + TOKEN_VALIDITY;
    Ok(MskToken {
        value: URL_SAFE_NO_PAD.encode(url),
        expiry_ms: i64::try_from(expiry.as_millis()).unwrap_or(i64::MAX),
    })
}

/// The RDS IAM token (the password) for `user` on `host:port` in `region` at `now`.
pub fn rds_token(
    credentials: &Credentials,
    region: &str,
    host: &str,
    port: u16,
    user: &str,
    now: SystemTime,
) -> Result<String, SignError> {
    if host.is_empty() || host.starts_with('/') {
        return Err(SignError::Host(host.to_owned()));
    }
    // An IPv6 address is bracketed in a URL's authority.
    let host = match host.contains(':') {
        true => format!("[{host}]:{port}"),
        false => format!("{host}:{port}"),
    };
    let operation = [("Action", RDS_ACTION), ("DBUser", user)];
    let query = presign(credentials, region, RDS_SERVICE, &host, &operation, now)?;
    Ok(format!("{host}/?{query}"))
}

/// The query of `https://{host}/?{operation}` presigned for `service` in `region` at `now`,
/// valid for [`TOKEN_VALIDITY`], in botocore's order and encoding.
fn presign(
    credentials: &Credentials,
    region: &str,
    service: &str,
    host: &str,
    operation: &[(&str, &str)],
    now: SystemTime,
) -> Result<String, SignError> {
    let operation = query(operation.iter().copied());
    let url = format!("https://{host}/?{operation}");
    let mut settings = SigningSettings::default();
    settings.signature_location = SignatureLocation::QueryParams;
    settings.expires_in = Some(TOKEN_VALIDITY);
    let identity = credentials.clone().into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(service)
        .time(now)
        .settings(settings)
        .build()
        .map_err(|e| SignError::Sigv4(e.to_string()))?;
    let request = SignableRequest::new("GET", &url, std::iter::empty(), SignableBody::Bytes(&[]))
        .map_err(|e| SignError::Sigv4(e.to_string()))?;
    let (instructions, _signature) = sign(request, &params.into())
        .map_err(|e| SignError::Sigv4(e.to_string()))?
        .into_parts();
    let signed = instructions.params();
    let find = |name: &'static str| {
        let found = signed.iter().find(|(key, _)| *key == name);
        found.map(|(_, value)| value.as_ref())
    };
    let mut ordered = Vec::with_capacity(SIGNING_PARAMETERS.len() + 2);
    for name in SIGNING_PARAMETERS {
        ordered.push((name, find(name).ok_or(SignError::Missing(name))?));
    }
    if let Some(token) = find(SESSION_TOKEN_PARAMETER) {
        ordered.push((SESSION_TOKEN_PARAMETER, token));
    }
    let signature = find(SIGNATURE_PARAMETER).ok_or(SignError::Missing(SIGNATURE_PARAMETER))?;
    ordered.push((SIGNATURE_PARAMETER, signature));
    Ok(format!("{operation}&{}", query(ordered.into_iter())))
}

/// `key=value&...`, both percent-encoded.
fn query<'a>(pairs: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let encoded = pairs.map(|(key, value)| format!("{}={}", encode(key), encode(value)));
    encoded.collect::<Vec<_>>().join("&")
}

/// Percent-encodes all but RFC 3986's unreserved characters, as botocore and SigV4 do.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(char::from(byte));
            }
            _ => {
                let _ = write!(out, "%{byte:02X}");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tests/fixtures/aws-signers/tokens.json`, made by AWS's own signers.
    #[derive(serde::Deserialize)]
    struct Fixtures {
        access_key: String,
        secret_key: String,
        cases: Vec<Case>,
    }

    #[derive(serde::Deserialize)]
    struct Case {
        kind: String,
        region: String,
        time: u64,
        session_token: Option<String>,
        user_agent: Option<String>,
        host: Option<String>,
        port: Option<u16>,
        user: Option<String>,
        token: String,
        expiry_ms: Option<i64>,
    }

    fn fixtures() -> Fixtures {
        let text = include_str!("../../../tests/fixtures/aws-signers/tokens.json");
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn tokens_are_byte_for_byte_those_of_aws_signers() {
        let fixtures = fixtures();
        let mut msk = 0;
        let mut rds = 0;
        for case in &fixtures.cases {
            let credentials = Credentials::new(
                &fixtures.access_key,
                &fixtures.secret_key,
                case.session_token.clone(),
                None,
                "fixture",
            );
            let now = UNIX_EPOCH + Duration::from_secs(case.time);
            match case.kind.as_str() {
                "msk" => {
                    let agent = case.user_agent.as_deref().unwrap();
                    let token = msk_token(&credentials, &case.region, now, agent).unwrap();
                    assert_eq!(token.value, case.token, "{} at {}", case.region, case.time);
                    assert_eq!(Some(token.expiry_ms), case.expiry_ms);
                    msk += 1;
                }
                "rds" => {
                    let host = case.host.as_deref().unwrap();
                    let user = case.user.as_deref().unwrap();
                    let port = case.port.unwrap();
                    let token = rds_token(&credentials, &case.region, host, port, user, now);
                    assert_eq!(token.unwrap(), case.token, "{host} at {}", case.time);
                    rds += 1;
                }
                other => panic!("unknown fixture kind {other}"),
            }
        }
        assert!(msk >= 6 && rds >= 6, "{msk} MSK and {rds} RDS cases");
    }

    #[test]
    fn a_token_signed_a_second_later_differs_and_expires_a_second_later() {
        let credentials = Credentials::new("AKID", "secret", None, None, "test");
        let at = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let first = msk_token(&credentials, "us-east-1", at, "outbox-relay/test").unwrap();
        let later = at + Duration::from_millis(1_500);
        let second = msk_token(&credentials, "us-east-1", later, "outbox-relay/test").unwrap();
        assert_ne!(first.value, second.value);
        assert_eq!(second.expiry_ms - first.expiry_ms, 1_000);
        assert_eq!(first.expiry_ms, 1_800_000_900_000);
    }

    #[test]
    fn no_token_for_a_socket_directory_and_brackets_for_ipv6() {
        let credentials = Credentials::new("AKID", "secret", None, None, "test");
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        for host in ["", "/var/run/postgresql"] {
            let err = rds_token(&credentials, "us-east-1", host, 5432, "u", now).unwrap_err();
            assert!(matches!(err, SignError::Host(_)), "{err}");
        }
        let token = rds_token(&credentials, "us-east-1", "::1", 5432, "u", now).unwrap();
        assert!(
            token.starts_with("[::1]:5432/?Action=connect&DBUser=u&"),
            "{token}"
        );
    }

    #[test]
    fn encoding_keeps_only_unreserved_characters() {
        assert_eq!(encode("aZ09-_.~"), "aZ09-_.~");
        assert_eq!(encode("a b/c+d=e:f@g"), "a%20b%2Fc%2Bd%3De%3Af%40g");
        assert_eq!(encode("é"), "%C3%A9");
    }
}
