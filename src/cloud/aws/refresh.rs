//! PURE: the timing of AWS credentials and the tokens signed with them. Credentials from the
//! chain may expire (web identity, a role, instance and container metadata: about an hour) or
//! not (access keys); a token is valid 900 s after its signing, and no longer than the
//! credentials that signed it.

use std::time::{Duration, SystemTime};

use super::sign::TOKEN_VALIDITY;

/// Credentials are fetched again this long before they expire, or half their lifetime
/// before when that is shorter (credentials that live a minute are refreshed at 30 s).
pub const REFRESH_MARGIN: Duration = Duration::from_secs(300);

/// Credentials this close to their expiry sign no more tokens: a token must still be valid
/// when the server checks it, a moment later. Fetched again in time, credentials never get
/// this close; it matters only while fetching fails.
pub const MIN_REMAINING: Duration = Duration::from_secs(1);

/// The first wait after a failed fetch; it doubles per failure up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_secs(1);

/// The longest wait between fetches while they fail.
pub const MAX_RETRY: Duration = Duration::from_secs(60);

/// When credentials fetched at `fetched` and expiring at `expiry` are fetched again; `None`
/// for credentials that do not expire.
pub fn refresh_at(fetched: SystemTime, expiry: Option<SystemTime>) -> Option<SystemTime> {
    let expiry = expiry?;
    let lifetime = expiry.duration_since(fetched).unwrap_or_default();
    let margin = REFRESH_MARGIN.min(lifetime / 2);
    Some(expiry.checked_sub(margin).unwrap_or(fetched))
}

/// How long to wait before fetching again after `failures` failures in a row (1 or more).
pub fn retry_after(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    FIRST_RETRY.saturating_mul(1 << doublings).min(MAX_RETRY)
}

/// Whether credentials expiring at `expiry` may still sign a token at `now`.
pub fn usable(expiry: Option<SystemTime>, now: SystemTime) -> bool {
    expiry.is_none_or(|expiry| expiry > now + MIN_REMAINING)
}

/// When a token signed at `now` stops being accepted: [`TOKEN_VALIDITY`] after its signing
/// second, or when the credentials that signed it expire, if sooner.
pub fn token_expiry(
    signed_expiry: SystemTime,
    credentials_expiry: Option<SystemTime>,
) -> SystemTime {
    credentials_expiry.map_or(signed_expiry, |expiry| expiry.min(signed_expiry))
}

/// [`token_expiry`] for a token signed at `now`.
pub fn token_expiry_at(now: SystemTime, credentials_expiry: Option<SystemTime>) -> SystemTime {
    let second = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let signed = SystemTime::UNIX_EPOCH + Duration::from_secs(second) + TOKEN_VALIDITY;
    token_expiry(signed, credentials_expiry)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn credentials_are_fetched_again_before_they_expire() {
        // (fetched, expiry, fetched again at): one row per case.
        let cases = [
            // Access keys never expire: never fetched again.
            (1_000, None, None),
            // An hour's credentials (IMDS, web identity): five minutes before.
            (1_000, Some(4_600), Some(4_300)),
            // A minute's: half-way.
            (1_000, Some(1_060), Some(1_030)),
            // Ten minutes': five before (half is as much).
            (1_000, Some(1_600), Some(1_300)),
            // Already expired when fetched: at once.
            (1_000, Some(900), Some(900)),
        ];
        for (fetched, expiry, expected) in cases {
            let found = refresh_at(at(fetched), expiry.map(at));
            assert_eq!(
                found,
                expected.map(at),
                "fetched {fetched}, expiring {expiry:?}"
            );
        }
    }

    #[test]
    fn failed_fetches_back_off_to_a_minute() {
        let waits: Vec<u64> = (1..=9).map(|n| retry_after(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(retry_after(u32::MAX), MAX_RETRY);
        assert_eq!(retry_after(0), FIRST_RETRY);
    }

    #[test]
    fn credentials_sign_until_shortly_before_they_expire() {
        let cases = [
            (None, 10_000, true),
            (Some(10_000), 9_000, true),
            (Some(10_000), 9_998, true),
            (Some(10_000), 9_999, false),
            (Some(10_000), 10_000, false),
            (Some(10_000), 11_000, false),
        ];
        for (expiry, now, expected) in cases {
            assert_eq!(
                usable(expiry.map(at), at(now)),
                expected,
                "{expiry:?} at {now}"
            );
        }
    }

    #[test]
    fn a_token_lives_900_seconds_or_as_long_as_its_credentials() {
        let signed = at(10_000) + Duration::from_millis(700);
        assert_eq!(token_expiry_at(signed, None), at(10_900));
        assert_eq!(token_expiry_at(signed, Some(at(12_000))), at(10_900));
        assert_eq!(token_expiry_at(signed, Some(at(10_030))), at(10_030));
    }
}
