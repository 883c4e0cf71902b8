//! Errors: what a rate-limited call returns ([`RateLimitError`]), what a store returns
//! ([`StoreError`]) and what configuration returns ([`ConfigError`]).

use std::fmt;
use std::time::Duration;

/// Why a rate-limited call did not run.
///
/// Plain functions under `#[rate_limit]` return `Result<T, E>` with
/// `E: From<RateLimitError>`; the error tells "limited" apart from "store unavailable".
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::RateLimitError;
///
/// fn explain(e: &RateLimitError) -> String {
///     match e.retry_after() {
///         Some(wait) => format!("slow down, retry in {wait:?}"),
///         None => "the rate-limit store is down".to_owned(),
///     }
/// }
/// # let _ = explain;
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum RateLimitError {
    /// The quota is spent.
    Limited {
        /// The earliest time the same call would be admitted.
        retry_after: Duration,
        /// The binding limit's capacity.
        limit: u64,
        /// Units left (0 unless `cost > 1`).
        remaining: u64,
        /// Time until the binding limit's quota is whole again.
        reset_after: Duration,
    },
    /// The store did not answer in time or failed, and the failure policy is `deny`.
    StoreUnavailable(StoreError),
}

impl RateLimitError {
    /// `true` when the quota is spent (not a store failure).
    pub fn is_limited(&self) -> bool {
        matches!(self, Self::Limited { .. })
    }

    /// `true` when the store failed and the failure policy denied the call.
    pub fn is_store_unavailable(&self) -> bool {
        matches!(self, Self::StoreUnavailable(_))
    }

    /// For [`RateLimitError::Limited`]: how long to wait before trying again.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Limited { retry_after, .. } => Some(*retry_after),
            Self::StoreUnavailable(_) => None,
        }
    }
}

impl fmt::Display for RateLimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Limited {
                retry_after, limit, ..
            } => write!(
                f,
                "rate limit of {limit} exceeded, retry after {:.3}s",
                retry_after.as_secs_f64()
            ),
            Self::StoreUnavailable(e) => write!(f, "rate-limit store unavailable: {e}"),
        }
    }
}

impl std::error::Error for RateLimitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::StoreUnavailable(e) => Some(e),
            Self::Limited { .. } => None,
        }
    }
}

/// A store could not decide.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum StoreError {
    /// The check took longer than the configured timeout.
    Timeout(Duration),
    /// Redis (or the connection to it) failed.
    Redis(String),
    /// The store answered something this library does not understand (a bug or a foreign
    /// script under the same name).
    BadReply(String),
}

impl StoreError {
    /// `true` for a timeout.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout(_))
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout(d) => write!(f, "no answer within {}ms", d.as_millis()),
            Self::Redis(e) => write!(f, "redis: {e}"),
            Self::BadReply(e) => write!(f, "unexpected reply from the store: {e}"),
        }
    }
}

impl std::error::Error for StoreError {}

impl From<redis::RedisError> for StoreError {
    fn from(e: redis::RedisError) -> Self {
        Self::Redis(e.to_string())
    }
}

/// The configuration could not be installed.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConfigError {
    /// The Redis URL is malformed (the message says why; the URL itself is not repeated since
    /// it may hold a password).
    InvalidUrl(String),
    /// Redis did not answer at install time.
    Unreachable(String),
    /// A trusted-proxy entry is not an IP address or CIDR block.
    InvalidProxy(String),
    /// A setting is out of range (the message names it).
    Invalid(String),
    /// A limiter was already installed for this process.
    AlreadyInstalled,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidUrl(e) => write!(f, "invalid Redis URL: {e}"),
            Self::Unreachable(e) => write!(f, "Redis is unreachable: {e}"),
            Self::InvalidProxy(p) => write!(
                f,
                "invalid trusted proxy {p:?}: expected an IP address or a CIDR block such as 10.0.0.0/8"
            ),
            Self::Invalid(e) => f.write_str(e),
            Self::AlreadyInstalled => {
                f.write_str("a rate limiter is already installed for this process")
            }
        }
    }
}

impl std::error::Error for ConfigError {}
