//! Errors: what a rate-limited call returns ([`RateLimitError`]), what a store returns
//! ([`StoreError`]) and what configuration returns ([`ConfigError`]).

use std::fmt;
use std::sync::Arc;
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
    /// A limit written with `quota = …` found no [`crate::Quota`] for this call: none in the
    /// request extensions, or an argument that was `None` (HTTP: 401, as a missing user).
    MissingQuota,
    /// The quota chosen at run time (a caller's [`crate::Quota`] or a scope's override) breaks
    /// a rule of the limit's algorithm (HTTP: 500); nothing was taken.
    InvalidQuota(crate::policy::PolicyError),
    /// The call's cost (`cost = <expression>`) is larger than the limit's capacity: it could
    /// never be admitted, so it is refused at once instead of being retried for ever (HTTP:
    /// 400); nothing was taken.
    CostExceedsCapacity {
        /// What the call would take.
        cost: u64,
        /// The most the limit holds.
        capacity: u64,
    },
    /// The call's cost (`cost = <expression>`) is negative: a cost counts units taken, so the
    /// call is refused (HTTP: 400); nothing was taken.
    NegativeCost {
        /// What the expression gave.
        cost: i128,
    },
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
            _ => None,
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
            Self::MissingQuota => f.write_str(
                "no quota for this caller: the limit takes its quota from the caller (quota = …), and none was given",
            ),
            Self::InvalidQuota(e) => write!(f, "the quota chosen for this call is invalid: {e}"),
            Self::CostExceedsCapacity { cost, capacity } => write!(
                f,
                "this call costs {cost} units, more than the limit's capacity of {capacity}: it can never be admitted"
            ),
            Self::NegativeCost { cost } => write!(
                f,
                "this call's cost is negative ({cost}): a cost is the number of units a call takes, 0 or more"
            ),
        }
    }
}

impl std::error::Error for RateLimitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::StoreUnavailable(e) => Some(e),
            Self::InvalidQuota(e) => Some(e),
            _ => None,
        }
    }
}

/// A store could not decide.
///
/// Two kinds of failure, told apart by [`StoreError::is_transport`]:
///
/// * the store could not be asked ([`StoreError::Connection`], [`StoreError::Timeout`]): a
///   refused or dropped connection, a server that is loading or failing over, no answer in
///   time. Every other call is likely to fail the same way, so the limiter's breaker counts
///   these and answers with the failure policy for a short backoff;
/// * the store answered, but not something this call can use ([`StoreError::Backend`]: an
///   error reply such as a script error or a key holding another type;
///   [`StoreError::BadReply`]: a reply that does not parse; [`StoreError::Full`]: a memory store
///   with no room for a new key; [`StoreError::OutOfMemory`]: a Redis at its `maxmemory`): an
///   error for this call only. It never opens the breaker, so it never changes another call's
///   answer.
///
/// A store that answered but cannot record the call ([`StoreError::cannot_record`]: `Full`,
/// `OutOfMemory`) is a fault a client can cause by minting keys, not an outage: the limiter
/// refuses such a call under every [`crate::FailurePolicy`].
///
/// Branch on the predicates ([`StoreError::is_transport`], [`StoreError::is_connection`], …)
/// rather than on the variants: the enum is `#[non_exhaustive]`. The cause of a connection or
/// backend error is kept as its [`std::error::Error::source`].
///
/// ```
/// use std::error::Error as _;
/// use std::time::Duration;
/// use ratelimit_runtime::StoreError;
///
/// let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
/// let e = StoreError::connection(io);
/// assert!(e.is_connection() && e.is_transport());
/// assert_eq!(e.source().map(ToString::to_string).as_deref(), Some("refused"));
/// assert!(StoreError::Timeout(Duration::from_millis(50)).is_timeout());
/// assert!(!StoreError::backend("WRONGTYPE").is_transport());
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum StoreError {
    /// The store could not be reached or is not serving: the connection was refused or
    /// dropped, the server is loading, failing over or has no master. A transport failure.
    Connection {
        /// What the client library reported.
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// The check took longer than the configured timeout. A transport failure.
    Timeout(Duration),
    /// The store answered this call with an error (a script error, a key holding another
    /// type): an error for this call only.
    Backend {
        /// The error the store answered.
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// The store answered something this library does not understand (a reply of the wrong
    /// shape), or a call it cannot serve as asked: an error for this call only.
    BadReply(String),
    /// The memory store holds its maximum number of keys and none of them is idle: a new key
    /// cannot be added without forgetting another caller's state. An error for this call only.
    Full {
        /// The store's bound ([`crate::MemoryStore::max_keys`]).
        max_keys: usize,
    },
    /// The Redis server is at its `maxmemory` and refuses writes (`OOM`, under the
    /// `noeviction` policy): the call would have been admitted, and the server cannot count
    /// it. Calls the server rejects are still answered (a rejection writes nothing). An error
    /// for this call only.
    OutOfMemory {
        /// The error the server answered.
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// The store does not implement this operation (a store of your own that keeps the
    /// defaults of [`crate::Store::peek`], [`crate::Store::reset`] or [`crate::Store::block`]):
    /// an error for this call only. Holds the operation's name.
    Unsupported(&'static str),
    /// Replica acknowledgement is on ([`crate::limiter::Builder::replica_ack`],
    /// [`crate::Limit::with_replica_ack`]) and no replica acknowledged the call's write within
    /// the wait it holds: the master counted the call, a failover now could forget it. The
    /// failure policy answers the call (the limiter gives the count back in the background
    /// when the policy did not admit it); a master without replicas never acknowledges. An
    /// error for this call only: it does not open the breaker.
    Unreplicated(Duration),
}

impl StoreError {
    /// A connection failure caused by `source` (an error, or a message).
    pub fn connection(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::Connection {
            source: Arc::from(source.into()),
        }
    }

    /// An error the store answered to this call, caused by `source` (an error, or a message).
    pub fn backend(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::Backend {
            source: Arc::from(source.into()),
        }
    }

    /// A reply this library does not understand; `what` says what was wrong with it.
    pub fn bad_reply(what: impl Into<String>) -> Self {
        Self::BadReply(what.into())
    }

    /// `true` for a timeout.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout(_))
    }

    /// `true` when the store could not be reached or is not serving.
    pub fn is_connection(&self) -> bool {
        matches!(self, Self::Connection { .. })
    }

    /// `true` when the store answered this call with an error.
    pub fn is_backend(&self) -> bool {
        matches!(self, Self::Backend { .. })
    }

    /// `true` when the store's reply could not be used.
    pub fn is_bad_reply(&self) -> bool {
        matches!(self, Self::BadReply(_))
    }

    /// `true` when a memory store had no room for a new key.
    pub fn is_full(&self) -> bool {
        matches!(self, Self::Full { .. })
    }

    /// `true` when the Redis server refused the call's writes for want of memory.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Self::OutOfMemory { .. })
    }

    /// `true` when the store answered but has no room to record this call: a memory store at
    /// its bound ([`StoreError::Full`]) or a Redis at its `maxmemory`
    /// ([`StoreError::OutOfMemory`]). Clients control how many keys exist, so this is a fault a
    /// client can cause: the limiter refuses such a call under every failure policy, since
    /// admitting what the store cannot count would let a flood of keys switch every limit off.
    ///
    /// ```
    /// use ratelimit_runtime::StoreError;
    /// assert!(StoreError::Full { max_keys: 8 }.cannot_record());
    /// assert!(!StoreError::backend("ERR script error").cannot_record());
    /// ```
    pub fn cannot_record(&self) -> bool {
        self.is_full() || self.is_out_of_memory()
    }

    /// `true` when no replica acknowledged the call's write in time
    /// ([`StoreError::Unreplicated`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::StoreError;
    /// let e = StoreError::Unreplicated(Duration::from_millis(10));
    /// assert!(e.is_unreplicated() && !e.is_transport() && !e.cannot_record());
    /// ```
    pub fn is_unreplicated(&self) -> bool {
        matches!(self, Self::Unreplicated(_))
    }

    /// `true` when the store does not implement the operation.
    ///
    /// ```
    /// use ratelimit_runtime::StoreError;
    /// assert!(StoreError::Unsupported("peek").is_unsupported());
    /// ```
    pub fn is_unsupported(&self) -> bool {
        matches!(self, Self::Unsupported(_))
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
    /// assert!(StoreError::connection("connection refused").is_transport());
    /// assert!(!StoreError::bad_reply("remaining -1").is_transport());
    /// assert!(!StoreError::backend("ERR script error").is_transport());
    /// ```
    pub fn is_transport(&self) -> bool {
        self.is_timeout() || self.is_connection()
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Connection { source } => write!(f, "cannot reach the store: {source}"),
            Self::Timeout(d) => write!(f, "no answer within {}ms", d.as_millis()),
            Self::Backend { source } => write!(f, "the store answered an error: {source}"),
            Self::BadReply(e) => write!(f, "unexpected reply from the store: {e}"),
            Self::Full { max_keys } => write!(
                f,
                "the memory store holds its maximum of {max_keys} keys and none is idle"
            ),
            Self::OutOfMemory { source } => write!(
                f,
                "the store is out of memory and cannot count this call (Redis maxmemory): {source}"
            ),
            Self::Unsupported(operation) => {
                write!(f, "this store does not implement `{operation}`")
            }
            Self::Unreplicated(d) => write!(
                f,
                "no replica acknowledged the call's write within {}ms (replica acknowledgement \
                 is on; a master without a replica never acknowledges)",
                d.as_millis()
            ),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Connection { source }
            | Self::Backend { source }
            | Self::OutOfMemory { source } => Some(&**source),
            Self::Timeout(_)
            | Self::BadReply(_)
            | Self::Full { .. }
            | Self::Unsupported(_)
            | Self::Unreplicated(_) => None,
        }
    }
}

/// The server is at its `maxmemory` and refuses writes (`noeviction`): the one test of that
/// answer, for the Redis and the Redis Cluster stores alike (it is how
/// [`StoreError::OutOfMemory`] is told apart). Redis 7 refuses a whole `FCALL` (functions
/// without flags may write) with `OOM`, and fails a script at its first write with the same
/// code; before 7.0 that write's error comes back inside a script error (`ERR Error running
/// script … -OOM command not allowed …`). A script still answers the calls it rejects (they
/// write nothing), so the Redis stores' `invoke` sends an `FCALL` refused this way again as
/// `EVALSHA`: a flood of keys that fills the server cannot switch the rejections of over-quota
/// callers off. Here, beside the conversion that reads it, so `error` never reads `store`.
pub(crate) fn out_of_memory(e: &redis::RedisError) -> bool {
    e.code() == Some("OOM")
        || (e.code() == Some("ERR")
            && e.detail()
                .is_some_and(|d| d.contains("OOM command not allowed")))
}

impl From<redis::RedisError> for StoreError {
    /// An error reply to the script itself (`ERR …` raised by the script, a wrong type under a
    /// key) is about this call: [`StoreError::Backend`]; a reply of an unexpected type is
    /// [`StoreError::BadReply`]; `OOM` (the server at its `maxmemory`, whether it refused a
    /// whole `FCALL` or a script's first write) is [`StoreError::OutOfMemory`]. Everything else (I/O, refused or dropped connections,
    /// `LOADING`, `MASTERDOWN`, `CLUSTERDOWN`, `READONLY`, `BUSY`, …) means the store is not
    /// serving: [`StoreError::Connection`]. The redis error is kept as the source.
    fn from(e: redis::RedisError) -> Self {
        use redis::{ErrorKind, ServerErrorKind};
        if matches!(e.kind(), ErrorKind::UnexpectedReturnType) {
            return Self::BadReply(e.to_string());
        }
        if out_of_memory(&e) {
            return Self::OutOfMemory {
                source: Arc::new(e),
            };
        }
        let about_this_call = matches!(e.kind(), ErrorKind::Server(ServerErrorKind::ResponseError))
            || e.code() == Some("WRONGTYPE");
        if about_this_call {
            Self::backend(e)
        } else {
            Self::connection(e)
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

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn a_refused_connection_is_a_transport_error_that_keeps_the_redis_error_as_its_source() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = StoreError::from(redis::RedisError::from(io));
        assert!(e.is_connection() && e.is_transport(), "{e:?}");
        let source = e.source().expect("a source");
        assert!(
            source.downcast_ref::<redis::RedisError>().is_some(),
            "{source:?}"
        );
        assert!(e.to_string().contains("refused"), "{e}");
    }

    #[test]
    fn only_timeouts_and_connection_failures_are_transport_errors() {
        let cases = [
            (StoreError::Timeout(Duration::from_millis(5)), true),
            (StoreError::connection("down"), true),
            (StoreError::backend("ERR boom"), false),
            (StoreError::bad_reply("remaining -1"), false),
            (StoreError::Full { max_keys: 8 }, false),
            (
                StoreError::OutOfMemory {
                    source: Arc::from(Box::<dyn std::error::Error + Send + Sync>::from("OOM")),
                },
                false,
            ),
        ];
        for (e, transport) in cases {
            assert_eq!(e.is_transport(), transport, "{e:?}");
            let kinds = [
                e.is_timeout(),
                e.is_connection(),
                e.is_backend(),
                e.is_bad_reply(),
                e.is_full(),
                e.is_out_of_memory(),
            ];
            assert_eq!(kinds.iter().filter(|k| **k).count(), 1, "{e:?}: one kind");
        }
    }

    #[test]
    fn a_script_error_reply_is_a_backend_error_for_this_call_only() {
        let e = StoreError::from(redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "script error",
        )));
        assert!(e.is_backend() && !e.is_transport(), "{e:?}");
        assert!(e.source().is_some());
    }
}
