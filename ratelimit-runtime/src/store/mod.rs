//! Stores: where the state of every limit lives.
//!
//! A store has one operation, [`Store::check`]: it checks **a list of limits for one call**
//! atomically. The call is admitted only if every limit admits it, and when any limit rejects
//! it, no limit takes anything. Each store reads time from its own clock (Redis:
//! `TIME` inside the script; memory: a monotonic [`Clock`]), never from the caller.
//!
//! * [`MemoryStore`] — in-process, the embedded default;
//! * [`RedisStore`] — one Redis server, one `FCALL` per check (the scripts as one Functions
//!   library; one `EVALSHA` per check on servers without Functions);
//! * `RedisClusterStore` — a Redis Cluster, the same library on every master (cargo feature
//!   `cluster`).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::decision::Verdict;
use crate::error::StoreError;
use crate::limit::FailurePolicy;
use crate::policy::Policy;

// The stores' modules are hidden: their types are re-exported here and at the crate root.
#[cfg(feature = "cluster")]
#[doc(hidden)]
pub mod cluster;
pub(crate) mod env;
mod lazy;
#[doc(hidden)]
pub mod memory;
#[doc(hidden)]
pub mod redis;

#[cfg(feature = "cluster")]
pub use self::cluster::RedisClusterStore;
pub use self::memory::{Clock, ManualClock, MemoryStore, MonotonicClock, TokioClock};
pub use self::redis::RedisStore;

/// One limit to check for one call: the full store key (see [`crate::key::build`]), the
/// policy, the scope (the bucket's name, for logs) and, when it has one of its own, the
/// failure policy.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::{Algorithm, store::Check, Policy};
///
/// let policy = Policy::new(Algorithm::Fixed, 5, Duration::from_secs(60))?;
/// let check = Check::new("ratelimit:{app::login}:fixed:5:60000", &policy).with_scope("app::login");
/// assert_eq!(check.scope, "app::login");
/// # Ok::<(), ratelimit_runtime::PolicyError>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    /// The store key of this limit for this caller.
    pub key: &'a str,
    /// The limit.
    pub policy: &'a Policy,
    /// The scope the key belongs to (empty when unknown). Logs name the scope, never the key:
    /// keys hold caller values such as IP addresses and user ids.
    pub scope: &'a str,
    /// What the limiter does with this check when the store fails or does not answer in
    /// time; `None`: the limiter's [`crate::limiter::Settings::failure_policy`]. A call is answered by
    /// the strictest policy among its checks ([`crate::FailurePolicy::stricter`]). Stores
    /// never read it.
    pub failure_policy: Option<FailurePolicy>,
    /// Whether the limiter waits for a replica to acknowledge this check's write before it
    /// admits the call ([`crate::Limit::with_replica_ack`]; the limiter's
    /// [`crate::limiter::Settings::replica_ack`] asks it of every check). Stores never read it.
    pub replica_ack: bool,
}

impl<'a> Check<'a> {
    /// A check of `policy` under `key`, with no scope.
    pub fn new(key: &'a str, policy: &'a Policy) -> Self {
        Self {
            key,
            policy,
            scope: "",
            failure_policy: None,
            replica_ack: false,
        }
    }

    /// Names the scope of this check, for logs.
    #[must_use]
    pub fn with_scope(mut self, scope: &'a str) -> Self {
        self.scope = scope;
        self
    }

    /// Gives this check a failure policy of its own (see [`Check::failure_policy`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, store::Check, FailurePolicy, Policy};
    ///
    /// let policy = Policy::new(Algorithm::Fixed, 3, Duration::from_secs(60))?;
    /// let login = Check::new("login", &policy).with_failure_policy(FailurePolicy::Deny);
    /// assert_eq!(login.failure_policy, Some(FailurePolicy::Deny));
    /// # Ok::<(), ratelimit_runtime::PolicyError>(())
    /// ```
    #[must_use]
    pub fn with_failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.failure_policy = Some(policy);
        self
    }

    /// Makes the limiter wait for a replica's acknowledgement of this check's write (see
    /// [`Check::replica_ack`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, store::Check, Policy};
    ///
    /// let policy = Policy::new(Algorithm::Fixed, 3, Duration::from_secs(60))?;
    /// assert!(Check::new("login", &policy).with_replica_ack().replica_ack);
    /// # Ok::<(), ratelimit_runtime::PolicyError>(())
    /// ```
    #[must_use]
    pub fn with_replica_ack(mut self) -> Self {
        self.replica_ack = true;
        self
    }
}

/// The future every [`Store`] method returns: a [`Verdict`] for the checks, `()` for the
/// refunds and the operator's calls, a verdict and whether its writes reached the replicas
/// for [`Store::take_replicated`].
pub type StoreFuture<'a, T = Verdict> =
    Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// The longest block a store writes: a hundred years, for ever in practice. A longer one
/// ([`Duration::MAX`] for "until reset") is cut to it, so that every store can name its end
/// (Redis refuses an expiry past its clock's range) and so can the blocked-caller cache.
pub(crate) const LONGEST_BLOCK: Duration = Duration::from_secs(100 * 365 * 86_400);

/// A block's length as the stores write it: whole milliseconds, at least 1, at most
/// [`LONGEST_BLOCK`].
pub(crate) fn block_ms(duration: Duration) -> u64 {
    let ms = duration.min(LONGEST_BLOCK).as_millis();
    u64::try_from(ms).unwrap_or(u64::MAX).max(1)
}

/// A fresh id for one call's receipts ([`Store::take`], and a cluster call across slots that
/// was not given one): this process's random 64-bit value and a counter, as 17 to 32
/// lower-case hex digits (the scripts' call id format). The receipts of two calls never share
/// a name: within a process the counter differs, across processes the random value does.
pub(crate) fn new_call_id() -> String {
    use std::hash::{BuildHasher as _, Hasher as _};
    use std::sync::LazyLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static PROCESS: LazyLock<u64> = LazyLock::new(|| {
        let mut h = std::hash::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.finish()
    });
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    call_id(*PROCESS, COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// Whether `id` is a call id the scripts take: 1 to 32 lower-case hex digits (the prelude's
/// `valid_call_id`).
pub(crate) fn is_call_id(id: &str) -> bool {
    (1..=32).contains(&id.len()) && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// `process` as 16 hex digits, then `count` in hex without leading zeros (`{:016x}{:x}`),
/// written out rather than formatted: every check under the `deny` and `local` policies makes
/// one.
fn call_id(process: u64, count: u64) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    fn push_digits(id: &mut String, value: u64, digits: u32) {
        for shift in (0..digits).rev() {
            let nibble = (value >> (shift * 4)) & 0xf;
            id.push(char::from(HEX[usize::try_from(nibble).unwrap_or(0)]));
        }
    }
    let mut id = String::with_capacity(32);
    push_digits(&mut id, process, 16);
    push_digits(
        &mut id,
        count,
        (64 - count.leading_zeros()).div_ceil(4).max(1),
    );
    id
}

/// The error of a [`Store::settle`] whose amounts do not match its checks one for one (every
/// store refuses it the same way, so that the limiter logs it).
pub(crate) fn settle_arguments(checks: &[Check<'_>], actual: &[u64]) -> Result<(), StoreError> {
    if checks.len() == actual.len() {
        return Ok(());
    }
    Err(StoreError::connection(format!(
        "a settle names {} limits and {} amounts",
        checks.len(),
        actual.len()
    )))
}

/// The answer of an operation a store does not implement (the default of [`Store::peek`],
/// [`Store::reset`] and [`Store::block`]).
fn unsupported<'a, T: Send + 'a>(
    operation: &'static str,
) -> Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>> {
    Box::pin(async move { Err(StoreError::Unsupported(operation)) })
}

/// Where limits keep their state.
///
/// Implementations must be exact under any concurrency: N concurrent calls against a quota of
/// `num` get exactly `num` admissions.
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// Checks every limit in `checks` for one call, all or nothing.
    ///
    /// The returned [`Verdict`] has one [`crate::Decision`] per check, in order. `checks` is
    /// never empty.
    fn check<'a>(&'a self, checks: &'a [Check<'a>]) -> StoreFuture<'a>;

    /// A short name for logs and the demo: `"memory"`, `"redis"`, `"redis-cluster"`.
    fn name(&self) -> &'static str;

    /// Whether the state lives in this process, so that a check costs no round trip. The
    /// limiter keeps a blocked-caller cache ([`crate::limiter::Settings::blocked_cache`]) only in front
    /// of stores that are not local.
    ///
    /// `false` by default; the built-in [`MemoryStore`] answers `true`, and so should a store
    /// of your own that keeps its state in process.
    fn is_local(&self) -> bool {
        false
    }

    /// Whether the store is making its first connection: it has never been connected, no
    /// attempt has failed, and one is under way. A check that reaches its timeout meanwhile is
    /// answered by the failure policy, but it is no sign that the store fails, so the
    /// limiter's breaker stays closed and the next checks wait for that same attempt.
    ///
    /// **A contract, not a hint.** While this answers `true`, no call of this store may have
    /// reached its server: the limiter sends no refund for a check that timed out then, so a
    /// store that answered `true` after sending a take would leave that call counted. Once
    /// its first attempt has ended (connected or failed), it never answers `true` again.
    ///
    /// `false` by default. The built-in Redis and Redis Cluster stores built with `lazy`
    /// answer `true` from their first check until their first attempt connects or fails.
    ///
    /// ```
    /// use ratelimit_runtime::{RedisStore, Store};
    /// let store = RedisStore::lazy("redis://127.0.0.1:6379")?;
    /// assert!(!store.is_connecting(), "no check has started an attempt yet");
    /// # Ok::<(), ratelimit_runtime::ConfigError>(())
    /// ```
    fn is_connecting(&self) -> bool {
        false
    }

    /// Answers [`Store::check`] (without `call_id`) or [`Store::take`] (with one) at once,
    /// when the store can without waiting for anything, or `None` to be asked through those
    /// futures. The limiter asks this first: an answer at once needs no timeout, no boxed
    /// future and no clock read around it (hundreds of instructions a check, more than the
    /// memory store's whole check).
    ///
    /// `None` by default; the built-in [`MemoryStore`] answers every call, as its futures do
    /// on their first poll. A store of your own answers only what it can decide in this
    /// process without blocking: the answer is not bounded by the limiter's timeout. A store
    /// that wraps another (to log, audit or refuse calls) forwards this method only when its
    /// own `check` and `take` add nothing to the inner store's: the limiter asks this first and
    /// does not call them when it answers.
    fn check_at_once(
        &self,
        checks: &[Check<'_>],
        call_id: Option<&str>,
    ) -> Option<Result<Verdict, StoreError>> {
        let _ = (checks, call_id);
        None
    }

    /// The `maxmemory-policy` the store last read from its server (Redis: `INFO memory`, at
    /// connect and after a dropped connection; a cluster: the first evicting policy among its
    /// masters, else theirs), or `None` when it has not read one: a lazy store before its first
    /// connection, a server that refuses `INFO`, a store without such a setting.
    /// [`crate::limiter::Builder::require_noeviction`] refuses to build on anything but `noeviction`.
    ///
    /// `None` by default.
    fn maxmemory_policy(&self) -> Option<String> {
        None
    }

    /// Like [`Store::check`], and when the call is admitted, leaves a receipt per limit under
    /// `call_id` (17 to 32 lower-case hex digits, fresh for each call) so that
    /// [`Store::refund`] can give back what the call took: `count = "err"` and the other
    /// outcome filters of `#[rate_limit]` take before the body runs and give back after an
    /// outcome that does not count.
    ///
    /// The default takes without receipts (it is [`Store::check`]): a store of your own that
    /// does not override both methods keeps every admitted call counted, whatever its outcome
    /// (it fails closed: never more admitted than the quota).
    fn take<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> StoreFuture<'a> {
        let _ = call_id;
        self.check(checks)
    }

    /// [`Store::take`] for a call whose receipts serve only a refund sent right after its
    /// answer came too late: they are kept at most `keep` (and never more than a receipt of
    /// [`Store::take`]), so that a flood of such calls cannot fill the store with receipts.
    ///
    /// [`RateLimiter`](crate::RateLimiter) sends its checks so under the `deny` and `local`
    /// failure policies, with `keep` its timeout and two seconds more: a check the store
    /// answers too late is answered by the policy, and what the store took for it is given
    /// back ([`Store::refund`]), or by the store itself. The Redis store writes no receipt key
    /// (but for a concurrency limit's): it takes with the receipts in its reply, and a take
    /// whose future is dropped before it answers, for whatever reason, is given back by the
    /// store when its reply comes, once (a `settled` marker per limit, kept 10 s); a refund
    /// under its call id waits for that. A reply lost with its connection, or later than
    /// 10 s, leaves the call counted. The Redis Cluster store keeps each receipt its
    /// limit's `reset_after`, at most `keep` rounded up to whole milliseconds, at most 10 s; a
    /// Cluster call across slots, which leaves no receipts to refund by, takes as
    /// [`Store::take`] does.
    ///
    /// The default is [`Store::take`]: receipts kept as long as any.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, MemoryStore, Policy, Store, store::Check};
    ///
    /// let store = MemoryStore::new();
    /// let policy = Policy::new(Algorithm::Fixed, 1, Duration::from_secs(60))?;
    /// let checks = [Check::new("user:7", &policy)];
    /// let keep = Duration::from_millis(1050);
    /// assert!(store.take_briefly(&checks, "7a3f", keep).await?.is_admitted());
    /// // The answer came too late and the call was refused without the store: give it back.
    /// store.refund(&checks, "7a3f").await?;
    /// assert!(store.check(&checks).await?.is_admitted());
    /// # Ok(()) }
    /// ```
    fn take_briefly<'a>(
        &'a self,
        checks: &'a [Check<'a>],
        call_id: &'a str,
        keep: Duration,
    ) -> StoreFuture<'a> {
        let _ = keep;
        self.take(checks, call_id)
    }

    /// Gives back what the admitted call taken under `call_id` still holds of its first
    /// `checks.len()` limits (`checks` is that prefix of the take's checks, in order). At most
    /// what the call took, and once: the receipts, which record each limit's key and units, are
    /// read and deleted; a check that names another key, or a larger cost, gets no more back.
    /// A receipt outlives the take by the limit's `reset_after`, at most 10 seconds (at most
    /// the `keep` of [`Store::take_briefly`]); a refund after that gives back nothing, and the
    /// call stays counted.
    ///
    /// The default gives back nothing (see [`Store::take`]).
    fn refund<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> StoreFuture<'a, ()> {
        let _ = (checks, call_id);
        Box::pin(async { Ok(()) })
    }

    /// Drops the receipts the admitted call taken under `call_id` left ([`Store::take`];
    /// `checks` are that take's checks, in order), giving nothing back: the call stays
    /// counted. Sent when a call's outcome counts, and when an outcome-filtered call ends
    /// without one (cancelled or panicked), so that receipts live only while their call runs:
    /// a flood of counted calls never fills the store with receipts. Dropping receipts that
    /// are already gone does nothing.
    ///
    /// The default does nothing (see [`Store::take`]).
    fn forget<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> StoreFuture<'a, ()> {
        let _ = (checks, call_id);
        Box::pin(async { Ok(()) })
    }

    /// Settles the admitted call taken under `call_id` ([`Store::take`]; `checks` are that
    /// take's checks, in order, their cost the call's estimate; the estimate settled from is
    /// the units its receipt recorded while it lives) to the units it used:
    /// `actual[i]` for limit `i`. Less than the estimate gives the difference back by the
    /// call's receipt (never more than the call still holds; nothing once the receipt
    /// expired); more charges the excess whatever the limit's state (a debt the next calls
    /// wait out); the same leaves it counted. The receipts are dropped. The rule is
    /// [`crate::algorithm::settle`]; an amount past what the scripts take is charged as that
    /// most ([`crate::algorithm::settled_units`]: the whole quota and more), never refused. A settle sent twice (a client's retry after a timeout)
    /// settles once on the Redis stores, which mark the receipts settled; the pipeline sends
    /// one settle per call.
    ///
    /// The default answers [`StoreError::Unsupported`]: the call stays counted at its
    /// estimate, and the limiter logs that its excess was not charged.
    fn settle<'a>(
        &'a self,
        checks: &'a [Check<'a>],
        call_id: &'a str,
        actual: &'a [u64],
    ) -> StoreFuture<'a, ()> {
        let _ = (checks, call_id, actual);
        unsupported("settle")
    }

    /// [`Store::take`], then waits at most `wait` until a replica of each server the take
    /// wrote acknowledged its writes (Redis `WAIT 1`): the verdict, and `true` once one did on
    /// each, `false` when one did not in time (a master without replicas, a replica behind).
    /// A process keeps a lease ([`crate::lease`]) only once its take is replicated, and a
    /// check asking for replica acknowledgement ([`Check::replica_ack`]) is admitted only
    /// then, so that a failover to the replica cannot forget what the call took.
    ///
    /// The acknowledgement must be of this take's writes: Redis's `WAIT` counts the writes of
    /// the connection it is sent on, so it must run on the connection the take ran on. For a
    /// rejected take, which wrote nothing, the answer is `true` without waiting.
    ///
    /// The default takes ([`Store::take`]) and answers `true`: a store with no replicas to
    /// wait for. A store of your own that wraps another forwards this method too, or the
    /// wrapped store's wait is lost. So do the memory store and [`RedisStore`] (one server: a failover to one of
    /// its replicas, by Sentinel, may find it behind by the last writes, leases or not);
    /// `RedisClusterStore` waits, on the master of each slot the take wrote.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, MemoryStore, Policy, store::{Check, Store}};
    ///
    /// let store = MemoryStore::new();
    /// let policy = Policy::new(Algorithm::Fixed, 1, Duration::from_secs(60))?;
    /// let checks = [Check::new("login:203.0.113.9", &policy)];
    /// let wait = Duration::from_millis(10);
    /// let (verdict, replicated) = store.take_replicated(&checks, "7a3f", wait).await?;
    /// assert!(verdict.is_admitted() && replicated);
    /// # Ok(()) }
    /// ```
    fn take_replicated<'a>(
        &'a self,
        checks: &'a [Check<'a>],
        call_id: &'a str,
        wait: Duration,
    ) -> StoreFuture<'a, (Verdict, bool)> {
        let _ = wait;
        Box::pin(async move { Ok((self.take(checks, call_id).await?, true)) })
    }

    // The operations below are for operators (the admin calls of
    // [`crate::RateLimiter::peek`], [`crate::RateLimiter::reset`] and
    // [`crate::RateLimiter::block`]); a store of your own that does not implement them
    // answers [`StoreError::Unsupported`].

    /// Reads the state of every limit in `checks` now, taking nothing: one [`crate::Decision`]
    /// per check, in order, as a call of that check's cost would be decided now (`admitted`,
    /// `remaining`, `reset_after`, `retry_after`). A blocked key ([`Store::block`]) reads as
    /// rejected until the block's end.
    ///
    /// The default answers [`StoreError::Unsupported`].
    fn peek<'a>(&'a self, checks: &'a [Check<'a>]) -> StoreFuture<'a> {
        let _ = checks;
        unsupported("peek")
    }

    /// Deletes the state of `keys` (and any block on them): the next call under each starts
    /// from a full quota.
    ///
    /// The default answers [`StoreError::Unsupported`].
    fn reset<'a>(&'a self, keys: &'a [&'a str]) -> StoreFuture<'a, ()> {
        let _ = keys;
        unsupported("reset")
    }

    /// Rejects every call under `keys` for `duration` (from now, on the store's clock),
    /// whatever their state; a later block replaces an earlier one, [`Store::reset`] lifts it.
    /// The built-in stores cut a block past a hundred years to a hundred years.
    ///
    /// The default answers [`StoreError::Unsupported`].
    fn block<'a>(&'a self, keys: &'a [&'a str], duration: Duration) -> StoreFuture<'a, ()> {
        let _ = (keys, duration);
        unsupported("block")
    }

    /// As [`Store::block`], but never shortening a block: a key whose block already ends
    /// after `duration` from now keeps it, decided atomically per key (a block written
    /// between the read and the write cannot be cut short). [`crate::RateLimiter::defer`]
    /// pauses a budget with it, so that a partner's pause never shortens an operator's block.
    ///
    /// The default answers [`StoreError::Unsupported`]: a store that cannot decide it
    /// atomically must not fall back to [`Store::block`].
    fn extend_block<'a>(&'a self, keys: &'a [&'a str], duration: Duration) -> StoreFuture<'a, ()> {
        let _ = (keys, duration);
        unsupported("extend_block")
    }
}

/// A shared store is a store: `Arc<MemoryStore>`, `Arc<dyn Store>` and the like go wherever a
/// store does ([`Builder::store`](crate::limiter::Builder::store), the layer's limiter), every
/// call passed to the store inside.
///
/// ```
/// use std::sync::Arc;
/// use ratelimit_runtime::{MemoryStore, RateLimiter, Store};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let shared: Arc<dyn Store> = Arc::new(MemoryStore::new());
/// let a = RateLimiter::builder().store(Arc::clone(&shared)).build().await?;
/// let b = RateLimiter::builder().store(shared).build().await?;
/// assert!(Arc::ptr_eq(a.store(), b.store()), "one store, not a copy");
/// # Ok(()) }
/// ```
impl<S: Store + ?Sized> Store for Arc<S> {
    fn check<'a>(&'a self, checks: &'a [Check<'a>]) -> StoreFuture<'a> {
        (**self).check(checks)
    }

    fn name(&self) -> &'static str {
        (**self).name()
    }

    fn is_local(&self) -> bool {
        (**self).is_local()
    }

    fn is_connecting(&self) -> bool {
        (**self).is_connecting()
    }

    fn check_at_once(
        &self,
        checks: &[Check<'_>],
        call_id: Option<&str>,
    ) -> Option<Result<Verdict, StoreError>> {
        (**self).check_at_once(checks, call_id)
    }

    fn maxmemory_policy(&self) -> Option<String> {
        (**self).maxmemory_policy()
    }

    fn take<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> StoreFuture<'a> {
        (**self).take(checks, call_id)
    }

    fn take_briefly<'a>(
        &'a self,
        checks: &'a [Check<'a>],
        call_id: &'a str,
        keep: Duration,
    ) -> StoreFuture<'a> {
        (**self).take_briefly(checks, call_id, keep)
    }

    fn refund<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> StoreFuture<'a, ()> {
        (**self).refund(checks, call_id)
    }

    fn forget<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> StoreFuture<'a, ()> {
        (**self).forget(checks, call_id)
    }

    fn settle<'a>(
        &'a self,
        checks: &'a [Check<'a>],
        call_id: &'a str,
        actual: &'a [u64],
    ) -> StoreFuture<'a, ()> {
        (**self).settle(checks, call_id, actual)
    }

    fn take_replicated<'a>(
        &'a self,
        checks: &'a [Check<'a>],
        call_id: &'a str,
        wait: Duration,
    ) -> StoreFuture<'a, (Verdict, bool)> {
        (**self).take_replicated(checks, call_id, wait)
    }

    fn peek<'a>(&'a self, checks: &'a [Check<'a>]) -> StoreFuture<'a> {
        (**self).peek(checks)
    }

    fn reset<'a>(&'a self, keys: &'a [&'a str]) -> StoreFuture<'a, ()> {
        (**self).reset(keys)
    }

    fn block<'a>(&'a self, keys: &'a [&'a str], duration: Duration) -> StoreFuture<'a, ()> {
        (**self).block(keys, duration)
    }

    fn extend_block<'a>(&'a self, keys: &'a [&'a str], duration: Duration) -> StoreFuture<'a, ()> {
        (**self).extend_block(keys, duration)
    }
}

#[cfg(test)]
mod tests {
    use super::{call_id, is_call_id, new_call_id};

    #[test]
    fn a_call_id_is_its_process_and_count_in_hex() {
        let values = [
            0,
            1,
            9,
            10,
            15,
            16,
            255,
            256,
            0xabc_def,
            1 << 63,
            u64::MAX - 1,
            u64::MAX,
        ];
        for process in values {
            for count in values {
                assert_eq!(call_id(process, count), format!("{process:016x}{count:x}"));
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn any_call_id_is_written_as_formatted(process: u64, count: u64) {
            proptest::prop_assert_eq!(call_id(process, count), format!("{process:016x}{count:x}"));
        }
    }

    #[test]
    fn call_ids_are_fresh_hex_the_scripts_accept() {
        let (a, b) = (new_call_id(), new_call_id());
        assert_ne!(a, b);
        for id in [a, b] {
            assert!((17..=32).contains(&id.len()), "{id}");
            assert!(is_call_id(&id), "{id}");
        }
    }

    #[test]
    fn a_call_id_is_one_to_32_lower_case_hex_digits() {
        for good in ["0", "7a3f", &"f".repeat(32)] {
            assert!(is_call_id(good), "{good}");
        }
        for bad in ["", "7A3F", "7a3g", "7a 3f", "7a3f\n", &"f".repeat(33), "é"] {
            assert!(!is_call_id(bad), "{bad:?}");
        }
    }
}
