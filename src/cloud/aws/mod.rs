//! AWS IAM: one identity per relay ([`Aws`]), whose credentials come from the standard chain
//! ([`chain`]) and sign every token: the MSK IAM token each Kafka client asks for through its
//! OAUTHBEARER refresh, and the RDS IAM token each Postgres connection logs in with ([`sign`]).
//!
//! librdkafka asks for a token on its own thread of events and cannot wait for a network
//! fetch, so credentials are fetched ahead: once at start-up (no credentials there is a
//! configuration error, which names what the chain tried), then by a task that fetches them
//! again before they expire and retries while that fails ([`refresh`]). A token is signed
//! from the credentials at hand when asked for; while they are expired, signing fails,
//! librdkafka asks again ten seconds later and a Postgres reconnect is retried, so nothing
//! is acknowledged that was not delivered, and `/readyz` says why.

pub mod chain;
pub mod refresh;
pub mod region;
pub mod sign;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_credential_types::provider::ProvideCredentials;
use aws_credential_types::provider::SharedCredentialsProvider;
use metrics::{counter, gauge};
use tokio::sync::Notify;

use super::CloudError;
use crate::observability::health::{CredentialHealth, FetchFailure, Health};
use crate::observability::metrics::{
    AWS_CREDENTIALS_EXPIRY, AWS_CREDENTIALS_FETCHES, AWS_CREDENTIALS_INFO,
};

/// The user agent at the end of an MSK token (AWS's signers put their name there).
const USER_AGENT: &str = concat!("outbox-relay/", env!("CARGO_PKG_VERSION"));

/// What the flags say about AWS.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AwsSettings {
    /// `--aws-region`.
    pub region: Option<String>,
    /// `--aws-role-arn`: a role assumed with the chain's credentials.
    pub role_arn: Option<String>,
    /// `--aws-role-session-name`.
    pub session_name: String,
    /// The MSK brokers' and RDS hosts' names (`host` or `host:port`), whose names say the
    /// region when nothing else does.
    pub hosts: Vec<String>,
}

/// The relay's AWS identity, shared by its Kafka clients and Postgres connections.
pub struct Aws {
    settings: AwsSettings,
    chain: OnceLock<Started>,
    state: Mutex<State>,
    health: OnceLock<Arc<Health>>,
    /// MSK tokens signed.
    signed: AtomicU64,
    /// What a broker said when it last refused a token (SASL authentication failed).
    kafka_refusal: Mutex<Option<String>>,
    /// Wakes the refresher early: librdkafka asked for a token while the credentials were
    /// expired, so a fetch now beats the back-off (librdkafka asks every 10 s at most).
    wake: Arc<Notify>,
}

/// An MSK IAM token, and when it stops being accepted: 900 s after its signing, or when the
/// credentials that signed it expire, if sooner.
#[derive(Clone, Debug)]
pub struct MskToken {
    /// SASL/OAUTHBEARER's token value.
    pub value: String,
    /// Its end of life, librdkafka's token lifetime.
    pub expires: SystemTime,
}

/// Credentials that may sign now, and the region to sign for.
struct AtHand {
    credentials: Credentials,
    region: String,
}

/// The chain, once [`Aws::start`] built it.
struct Started {
    region: String,
    provider: SharedCredentialsProvider,
}

/// The credentials at hand and how fetching them goes.
#[derive(Default)]
struct State {
    credentials: Option<Credentials>,
    /// How fetching fails, while it does.
    failing: Option<FetchFailure>,
    /// Failed fetches in a row.
    failures: u32,
    /// The `source` label last set on [`AWS_CREDENTIALS_INFO`].
    source: Option<&'static str>,
}

impl std::fmt::Debug for Aws {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Aws")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Aws {
    /// An identity for `settings`; nothing is fetched before [`Aws::start`].
    pub fn new(settings: AwsSettings) -> Arc<Aws> {
        Arc::new(Aws {
            settings,
            chain: OnceLock::new(),
            state: Mutex::new(State::default()),
            health: OnceLock::new(),
            signed: AtomicU64::new(0),
            kafka_refusal: Mutex::new(None),
            wake: Arc::new(Notify::new()),
        })
    }

    /// The settings given.
    pub fn settings(&self) -> &AwsSettings {
        &self.settings
    }

    /// Builds the chain, fetches the first credentials (none is a configuration error naming
    /// what was tried) and spawns the task that fetches them again before they expire, on the
    /// current runtime; `health` then says when fetching fails. Once per identity.
    pub async fn start(self: &Arc<Self>, health: Option<Arc<Health>>) -> Result<(), CloudError> {
        if let Some(health) = health {
            let _ = self.health.set(health);
        }
        if self.chain.get().is_some() {
            return Ok(());
        }
        let built = chain::build(&self.settings).await?;
        self.start_with(built.region, built.provider).await
    }

    /// [`Aws::start`] with this region and credential provider.
    pub(crate) async fn start_with(
        self: &Arc<Self>,
        region: String,
        provider: SharedCredentialsProvider,
    ) -> Result<(), CloudError> {
        let credentials = provider.provide_credentials().await.map_err(|error| {
            let facts = chain::ChainFacts::gather(self.settings.role_arn.as_deref());
            let explanation = chain::explain(&facts, chain::describe(&error).as_deref());
            CloudError::Credentials { explanation }
        })?;
        let source = chain::source(&credentials);
        tracing::info!(source, "AWS credentials from the {source} source");
        let _ = self.chain.set(Started { region, provider });
        let next = self.fetched(credentials, SystemTime::now());
        tokio::spawn(keep_fresh(Arc::downgrade(self), self.wake.clone(), next));
        Ok(())
    }

    /// The region tokens are signed for, once started.
    pub fn region(&self) -> Option<&str> {
        self.chain.get().map(|started| started.region.as_str())
    }

    /// An MSK IAM token signed at `now` from the credentials at hand.
    pub fn msk_token(&self, now: SystemTime) -> Result<MskToken, CloudError> {
        let at_hand = self.usable(now).inspect_err(|e| {
            if matches!(e, CloudError::Expired { .. }) {
                self.wake.notify_one();
            }
        })?;
        let credentials = &at_hand.credentials;
        let token = sign::msk_token(credentials, &at_hand.region, now, USER_AGENT)?;
        self.signed.fetch_add(1, Ordering::Relaxed);
        Ok(MskToken {
            value: token.value,
            expires: refresh::token_expiry_at(now, credentials.expiry()),
        })
    }

    /// Notes that a broker refused a token: `reason` is librdkafka's (broker and message).
    pub fn kafka_refused(&self, reason: &str) {
        let mut refusal = self
            .kafka_refusal
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *refusal = Some(reason.to_owned());
    }

    /// What a broker said when it last refused a token, if one did.
    pub fn kafka_refusal(&self) -> Option<String> {
        let refusal = self
            .kafka_refusal
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        refusal.clone()
    }

    /// MSK tokens signed so far.
    pub fn msk_tokens_signed(&self) -> u64 {
        self.signed.load(Ordering::Relaxed)
    }

    /// An RDS IAM token for `user` on `host:port`, from the credentials at hand, fetching
    /// them first when they are expired.
    pub async fn rds_token(&self, host: &str, port: u16, user: &str) -> Result<String, CloudError> {
        let now = SystemTime::now();
        let at_hand = match self.usable(now) {
            Ok(at_hand) => at_hand,
            Err(CloudError::Expired { .. }) => {
                self.fetch().await;
                self.usable(SystemTime::now())?
            }
            Err(other) => return Err(other),
        };
        let credentials = &at_hand.credentials;
        Ok(sign::rds_token(
            credentials,
            &at_hand.region,
            host,
            port,
            user,
            now,
        )?)
    }

    /// The credentials at hand and the region, if they may sign at `now`.
    fn usable(&self, now: SystemTime) -> Result<AtHand, CloudError> {
        let region = self.region().ok_or(CloudError::NotStarted)?.to_owned();
        let state = self.lock();
        let credentials = state.credentials.clone().ok_or(CloudError::NotStarted)?;
        if refresh::usable(credentials.expiry(), now) {
            return Ok(AtHand {
                credentials,
                region,
            });
        }
        let expired = credentials.expiry().map(humantime::format_rfc3339_seconds);
        let why = state.failing.as_ref().map(|failure| failure.why.clone());
        Err(CloudError::Expired {
            expired: expired.map(|t| t.to_string()).unwrap_or_default(),
            failing: why.unwrap_or_else(|| "not fetched again yet".to_owned()),
        })
    }

    /// Fetches credentials once; returns when to fetch again (`None`: never).
    async fn fetch(&self) -> Option<SystemTime> {
        let started = self.chain.get()?;
        match started.provider.provide_credentials().await {
            Ok(credentials) => self.fetched(credentials, SystemTime::now()),
            Err(error) => {
                let why = crate::observability::Chain(&error).to_string();
                Some(SystemTime::now() + refresh::retry_after(self.failed(why)))
            }
        }
    }

    /// Keeps fresh `credentials`, fetched at `now`; returns when to fetch again.
    fn fetched(&self, credentials: Credentials, now: SystemTime) -> Option<SystemTime> {
        let source = chain::source(&credentials);
        let expiry = credentials.expiry();
        let mut state = self.lock();
        if let Some(failure) = &state.failing {
            let since = humantime::format_rfc3339_seconds(failure.since);
            let failures = state.failures;
            tracing::info!(
                failures,
                "AWS credentials fetched again (failing since {since})"
            );
        }
        counter!(AWS_CREDENTIALS_FETCHES, "outcome" => "ok").increment(1);
        if let Some(previous) = state.source.filter(|previous| *previous != source) {
            gauge!(AWS_CREDENTIALS_INFO, "source" => previous).set(0.0);
        }
        gauge!(AWS_CREDENTIALS_INFO, "source" => source).set(1.0);
        let unix = expiry.and_then(|e| e.duration_since(SystemTime::UNIX_EPOCH).ok());
        gauge!(AWS_CREDENTIALS_EXPIRY).set(unix.map_or(f64::INFINITY, |d| d.as_secs_f64()));
        state.credentials = Some(credentials);
        state.failing = None;
        state.failures = 0;
        state.source = Some(source);
        self.publish(&state);
        refresh::refresh_at(now, expiry)
    }

    /// Records a failed fetch; returns the failures in a row.
    fn failed(&self, why: String) -> u32 {
        counter!(AWS_CREDENTIALS_FETCHES, "outcome" => "failed").increment(1);
        let mut state = self.lock();
        let since = state
            .failing
            .as_ref()
            .map_or_else(SystemTime::now, |f| f.since);
        state.failures = state.failures.saturating_add(1);
        let failures = state.failures;
        tracing::warn!(error = %why, failures, "fetching AWS credentials failed; retrying");
        state.failing = Some(FetchFailure { since, why });
        self.publish(&state);
        failures
    }

    /// Tells `/readyz` how fetching goes.
    fn publish(&self, state: &State) {
        let Some(health) = self.health.get() else {
            return;
        };
        let credentials = state.credentials.as_ref();
        health.set_credentials(CredentialHealth {
            expires: credentials.and_then(Credentials::expiry),
            failing: state.failing.clone(),
        });
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Fetches credentials again before they expire, and retries while that fails (at once when
/// `wake` says a token was asked for meanwhile), until the identity is dropped; credentials
/// that never expire are never fetched again.
async fn keep_fresh(aws: Weak<Aws>, wake: Arc<Notify>, mut next: Option<SystemTime>) {
    while let Some(at) = next {
        let wait = at.duration_since(SystemTime::now()).unwrap_or_default();
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = wake.notified() => {}
        }
        let Some(aws) = aws.upgrade() else {
            return;
        };
        next = aws.fetch().await;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::atomic::AtomicU32;
    use std::time::Duration;

    use aws_credential_types::provider::error::CredentialsError;
    use aws_credential_types::provider::future;

    use super::*;

    /// Credentials that expire `lifetime` after each fetch, or fail after `fetches_ok`
    /// fetches; counts the fetches.
    #[derive(Debug)]
    pub(crate) struct Expiring {
        pub lifetime: Duration,
        pub fetches_ok: u32,
        pub fetches: Arc<AtomicU32>,
    }

    impl ProvideCredentials for Expiring {
        fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
        where
            Self: 'a,
        {
            let n = self.fetches.fetch_add(1, Ordering::Relaxed);
            let expiry = SystemTime::now() + self.lifetime;
            let token = format!("session-{n}");
            let credentials =
                Credentials::new("AKIDTEST", "secret-key", Some(token), Some(expiry), "test");
            future::ProvideCredentials::ready(match n < self.fetches_ok {
                true => Ok(credentials),
                false => Err(CredentialsError::provider_error("STS: AccessDenied")),
            })
        }
    }

    /// An identity started with [`Expiring`] credentials, and the count of their fetches.
    pub(crate) struct Identity {
        pub aws: Arc<Aws>,
        pub fetches: Arc<AtomicU32>,
    }

    /// An identity started with [`Expiring`] credentials.
    pub(crate) async fn started(lifetime: Duration, fetches_ok: u32) -> Identity {
        let fetches = Arc::new(AtomicU32::new(0));
        let provider = Expiring {
            lifetime,
            fetches_ok,
            fetches: fetches.clone(),
        };
        let aws = Aws::new(AwsSettings::default());
        let provider = SharedCredentialsProvider::new(provider);
        aws.start_with("us-east-1".to_owned(), provider)
            .await
            .unwrap();
        Identity { aws, fetches }
    }

    #[tokio::test]
    async fn a_token_lives_as_long_as_the_credentials_that_signed_it() {
        let aws = started(Duration::from_secs(3600), u32::MAX).await.aws;
        let now = SystemTime::now();
        let token = aws.msk_token(now).unwrap();
        let expiry = token.expires;
        assert!(
            expiry > now + Duration::from_secs(899) && expiry <= now + Duration::from_secs(900)
        );
        assert!(!token.value.contains("secret-key"));
        let short = started(Duration::from_secs(60), u32::MAX).await.aws;
        let expiry = short.msk_token(now).unwrap().expires;
        assert!(expiry <= now + Duration::from_secs(61), "{expiry:?}");
        let rds = aws.rds_token("db.example", 5432, "relay").await.unwrap();
        assert!(
            rds.starts_with("db.example:5432/?Action=connect&DBUser=relay&"),
            "{rds}"
        );
        assert!(rds.contains("X-Amz-Security-Token=session-0"), "{rds}");
        assert_eq!(aws.msk_tokens_signed(), 1);
    }

    #[tokio::test]
    async fn credentials_are_fetched_again_before_they_expire() {
        // Refreshed half-way through their 4 s; each fetch replaces them.
        let Identity { aws, fetches } = started(Duration::from_secs(4), u32::MAX).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while fetches.load(Ordering::Relaxed) < 3 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(fetches.load(Ordering::Relaxed) >= 3);
        let state = aws.lock();
        let expiry = state.credentials.as_ref().and_then(Credentials::expiry);
        assert!(expiry.is_some_and(|e| e > SystemTime::now()), "{expiry:?}");
        assert!(state.failing.is_none());
    }

    #[tokio::test]
    async fn expired_credentials_sign_nothing_and_readiness_says_why() {
        // Usable for less than MIN_REMAINING, and every later fetch is refused.
        let aws = started(Duration::from_millis(500), 1).await.aws;
        let health = Arc::new(Health::default());
        let _ = aws.health.set(health.clone());
        let err = aws
            .rds_token("db.example", 5432, "relay")
            .await
            .unwrap_err();
        let text = crate::observability::Chain(&err).to_string();
        assert!(matches!(err, CloudError::Expired { .. }), "{text}");
        assert!(text.contains("STS: AccessDenied"), "{text}");
        assert!(
            !text.contains("secret-key") && !text.contains("session-"),
            "{text}"
        );
        assert!(aws.msk_token(SystemTime::now()).is_err());
        let snapshot = health.snapshot(std::time::Instant::now());
        let credentials = snapshot.credentials.unwrap();
        assert!(
            credentials
                .failing
                .is_some_and(|failure| failure.why.contains("AccessDenied"))
        );
    }
}
