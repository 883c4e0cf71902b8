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
///
/// Two kinds of failure, told apart by [`StoreError::is_transport`]:
///
/// * the store could not be asked (a timeout, a refused or dropped connection, a server that is
///   loading or failing over): every other call is likely to fail the same way, so the limiter's
///   breaker counts these and answers with the failure policy for a short backoff;
/// * the store answered, but not something this call can use (a reply that does not parse, a
///   script error, a memory store with no room for a new key): an error for this call only. It
///   never opens the breaker, so it never changes another call's answer.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum StoreError {
    /// The check took longer than the configured timeout.
    Timeout(Duration),
    /// Redis could not be reached or is not serving (connection refused or dropped, loading,
    /// failing over).
    Redis(String),
    /// The store answered something this library does not understand, or refused this call
    /// (a script error). An error for this call only.
    BadReply(String),
    /// The memory store holds its maximum number of keys and none of them is idle: a new key
    /// cannot be added without forgetting another caller's state.
    Full {
        /// The store's bound ([`crate::MemoryStore::max_keys`]).
        max_keys: usize,
    },
}

impl StoreError {
    /// `true` for a timeout.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout(_))
    }

    /// `true` when the store could not be asked at all (a timeout or a connection failure),
    /// which says nothing good about the next call either; `false` when it answered this call
    /// with something unusable, which says nothing about other calls. Only transport failures
    /// open the limiter's breaker.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::StoreError;
    /// assert!(StoreError::Timeout(Duration::from_millis(50)).is_transport());
    /// assert!(!StoreError::BadReply("remaining -1".into()).is_transport());
    /// ```
    pub fn is_transport(&self) -> bool {
        matches!(self, Self::Timeout(_) | Self::Redis(_))
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout(d) => write!(f, "no answer within {}ms", d.as_millis()),
            Self::Redis(e) => write!(f, "redis: {e}"),
            Self::BadReply(e) => write!(f, "unexpected reply from the store: {e}"),
            Self::Full { max_keys } => write!(
                f,
                "the memory store holds its maximum of {max_keys} keys and none is idle"
            ),
        }
    }
}

impl std::error::Error for StoreError {}

impl From<redis::RedisError> for StoreError {
    /// An error reply to the script itself (`ERR …` raised by the script, a wrong type under a
    /// key, an unexpected reply type) is about this call: [`StoreError::BadReply`]. Everything
    /// else (I/O, refused or dropped connections, `LOADING`, `MASTERDOWN`, `CLUSTERDOWN`,
    /// `READONLY`, `BUSY`, …) means the store is not serving: [`StoreError::Redis`].
    fn from(e: redis::RedisError) -> Self {
        use redis::{ErrorKind, ServerErrorKind};
        let about_this_call = matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::ResponseError) | ErrorKind::UnexpectedReturnType
        ) || e.code() == Some("WRONGTYPE");
        if about_this_call {
            Self::BadReply(e.to_string())
        } else {
            Self::Redis(e.to_string())
        }
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
