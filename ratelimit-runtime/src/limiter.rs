//! The limiter: a store plus the settings every check uses, installed once per process.
//!
//! # When the store fails
//!
//! Every check is bounded by [`Settings::timeout`]. A store error or a timeout is answered by
//! the [`FailurePolicy`]: the strictest among the call's limits' own
//! ([`crate::Limit::failure_policy`], `on_store_error`), the limiter's for a limit that names
//! none. After a failure, a small breaker answers with the policy at once for a
//! short backoff (100 ms, doubling up to 500 ms) instead of waiting for the timeout on every
//! call, then lets one check probe the store; the first answer puts every check back on the
//! store. Warnings are written at most once per store every 5 seconds, with the count of the
//! events held back. Logs name the scope, never the key or the caller.
//!
//! The parts live beside this file: [`Builder`] in `builder.rs`, the breaker in `breaker.rs`,
//! the blocked-caller cache in `blocked.rs` and the warning throttle in `log_throttle.rs`. The
//! events stay here, so their target is `ratelimit_runtime::limiter`.

pub(crate) mod admin;
mod blocked;
mod breaker;
mod builder;
mod env;
mod failure;
mod lease;
mod log_throttle;
mod overrides;
mod partner;
mod replica;
mod shadow;
mod shutdown;
#[cfg(test)]
pub(crate) mod test_support;

use std::num::NonZeroU32;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::caller::settings::HttpSettings;
use crate::decision::{Decision, Verdict};
use crate::error::{ConfigError, RateLimitError, StoreError};
use crate::key;
use crate::store::{Check, MemoryStore, RedisStore, Store};

use self::blocked::BlockedCache;
use self::breaker::{Breaker, Gate};
pub use self::builder::Builder;
use self::env::{TIMEOUT_ENV, env_store, parse_timeout_ms};
use self::failure::refund_when_answered;
use self::log_throttle::{LOG_INTERVAL, LogThrottle};
use self::replica::ReplicaAck;
pub use self::shutdown::ShutdownTimedOut;
use crate::limit::FailurePolicy;

/// Milliseconds since `origin`, saturating.
fn millis_since(origin: Instant, now: Instant) -> u64 {
    u64::try_from(now.saturating_duration_since(origin).as_millis()).unwrap_or(u64::MAX)
}

/// Settings shared by every check, read back with [`RateLimiter::settings`] and set through
/// the [`Builder`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Settings {
    /// Key prefix (default `ratelimit`).
    pub prefix: String,
    /// Longest wait for the store on one check (default [`Settings::DEFAULT_TIMEOUT`]).
    pub timeout: Duration,
    /// What to do when the store fails, for the limits that name no policy of their own
    /// ([`crate::Limit::failure_policy`], the attribute's `on_store_error`).
    pub failure_policy: FailurePolicy,
    /// Capacity of the blocked-caller cache: callers a remote store rejected are rejected
    /// locally, without a round trip, until the store's `retry_after` has passed. Default
    /// [`Settings::DEFAULT_BLOCKED_CACHE`] keys; 0 turns it off. A local store
    /// ([`Store::is_local`], such as the memory store) never uses it: a check there is as cheap
    /// as the cache.
    pub blocked_cache: usize,
    /// What the HTTP integrations read: trusted proxies, the forwarding header, IPv6 grouping,
    /// the response headers and the 429 message. The limiter itself never reads it.
    pub http: HttpSettings,
    /// Shadow mode for every limit ([`Builder::shadow`]): checked and counted, never enforced.
    pub shadow: bool,
    /// Exempt and denied callers of the HTTP integrations ([`Builder::exempt_networks`],
    /// [`Builder::exempt_when`], [`Builder::deny_networks`]).
    pub exemptions: crate::exempt::Exemptions,
    /// How many processes share each limit's quota when [`FailurePolicy::Local`] answers
    /// ([`Builder::local_share`]; default 1): during an outage each process checks every
    /// limit scaled to its share ([`crate::Policy::share`]), so that the fleet stays near the
    /// global quota rather than at `instances ×` it.
    pub local_share: NonZeroU32,
    /// Whether every check waits for a replica to acknowledge its write
    /// ([`Builder::replica_ack`]; default `false`). A limit can ask for it alone
    /// ([`crate::Limit::with_replica_ack`]).
    pub replica_ack: bool,
}

impl Settings {
    /// The default timeout of one check (50 ms).
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

    /// The default capacity of the blocked-caller cache (10 000 keys).
    pub const DEFAULT_BLOCKED_CACHE: usize = 10_000;
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            prefix: key::DEFAULT_PREFIX.to_owned(),
            timeout: Self::DEFAULT_TIMEOUT,
            failure_policy: FailurePolicy::Local,
            blocked_cache: Self::DEFAULT_BLOCKED_CACHE,
            http: HttpSettings::default(),
            shadow: false,
            exemptions: crate::exempt::Exemptions::default(),
            local_share: NonZeroU32::MIN,
            replica_ack: false,
        }
    }
}

struct Inner {
    store: Arc<dyn Store>,
    settings: Settings,
    /// The memory store of [`FailurePolicy::Local`], made on the first call that needs it
    /// (the limiter's policy, or one limit's own).
    local: OnceLock<MemoryStore>,
    breaker: Breaker,
    blocked: Option<BlockedCache>,
    warnings: LogThrottle,
    /// Quotas set at run time for scopes ([`RateLimiter::set_quota`]).
    overrides: overrides::Overrides,
    /// The leases this process holds on hot keys ([`crate::lease`]).
    leases: lease::Leases,
    /// Background store calls in flight, and whether [`RateLimiter::shutdown`] ran.
    background: shutdown::Background,
}

/// A store with the settings every check uses. Cheap to clone.
///
/// `#[rate_limit]` uses the limiter installed for the process ([`RateLimiter::install`]); when
/// none was installed, the first check builds one from the environment:
/// `RATELIMIT_REDIS_CLUSTER_NODES` (with the `cluster` feature), then `RATELIMIT_REDIS_URL`, then
/// `REDIS_URL`, else the memory store (logged once as a warning; a value that is malformed or
/// not UTF-8 is logged as an error naming its variable, and the memory store used).
/// `RATELIMIT_TIMEOUT_MS` sets that limiter's [`Settings::timeout`] in milliseconds (1 to
/// 60,000; default 50): the first checks of a process wait for the store's connection within
/// it, so a store that takes longer to reach at a cold start (a Redis Cluster: every master)
/// needs a longer one.
///
/// **The memory store's limits are per process**: several instances of an application share
/// limits only through Redis.
///
/// Checks run on Tokio and use its timer for the timeout: the runtime needs its time driver
/// (`#[tokio::main]`, `#[tokio::test]`, Axum's and Actix-web's runtimes all have it; a runtime
/// built by hand needs `enable_time()` or `enable_all()`).
#[derive(Clone)]
pub struct RateLimiter {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("store", &self.inner.store)
            .field("settings", &self.inner.settings)
            .finish()
    }
}

static GLOBAL: OnceLock<RateLimiter> = OnceLock::new();

/// The limiter of one limited call. The installed limiter is borrowed, not cloned: a clone
/// and its drop write the limiter's reference count, one cache line that every core
/// serving requests would then pass between them on every call.
#[derive(Debug, Clone)]
pub(crate) enum Current {
    /// The installed limiter (or the one built from the environment), which lives as long as
    /// the process.
    Installed(&'static RateLimiter),
    /// A limiter the request or the task names ([`RateLimiter::scope`]).
    Held(RateLimiter),
}

impl std::ops::Deref for Current {
    type Target = RateLimiter;

    fn deref(&self) -> &RateLimiter {
        match self {
            Self::Installed(limiter) => limiter,
            Self::Held(limiter) => limiter,
        }
    }
}

tokio::task_local! {
    static CURRENT: RateLimiter;
}

impl RateLimiter {
    fn from_parts(store: Arc<dyn Store>, settings: Settings) -> Self {
        let blocked = (settings.blocked_cache > 0 && !store.is_local())
            .then(|| BlockedCache::new(settings.blocked_cache));
        Self {
            inner: Arc::new(Inner {
                store,
                settings,
                local: OnceLock::new(),
                breaker: Breaker::new(),
                blocked,
                warnings: LogThrottle::new(LOG_INTERVAL),
                overrides: overrides::Overrides::default(),
                leases: lease::Leases::default(),
                background: shutdown::Background::default(),
            }),
        }
    }

    /// Makes this the limiter every `#[rate_limit]` in the process uses. Call it once, at
    /// start, before the first limited call. It takes `&self` (the limiter is a handle: the
    /// installed one and `self` are the same limiter), so the chain that builds a limiter can
    /// end in `.install()?` and keep going, and overrides set afterwards on either are seen:
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use ratelimit_runtime::{Quota, RateLimiter};
    ///
    /// let limiter = RateLimiter::builder().build().await?;
    /// limiter.install()?;
    /// limiter.set_quota("reports", Quota::per_minute(30)?)?; // what #[rate_limit] sees
    /// assert_eq!(RateLimiter::current().quota_override("reports"), Some(Quota::per_minute(30)?));
    /// # Ok(()) }
    /// ```
    ///
    /// Overrides set on a limiter that is never installed (nor used through
    /// [`RateLimiter::scope`]) reach no `#[rate_limit]`: when the first limited call then
    /// builds the default limiter from the environment, an `ERROR` event names their scopes.
    ///
    /// # Errors
    ///
    /// [`ConfigError::AlreadyInstalled`] when a limiter (this one or another) was installed
    /// before, or the default one was already built by a limited call.
    pub fn install(&self) -> Result<&'static RateLimiter, ConfigError> {
        let mut installed = false;
        let global = GLOBAL.get_or_init(|| {
            installed = true;
            overrides::mark_used(self);
            self.clone()
        });
        if installed {
            Ok(global)
        } else {
            Err(ConfigError::AlreadyInstalled)
        }
    }

    /// The installed limiter, or one built from the environment on first use (see the type's
    /// docs). A malformed URL in the environment, or a value that is not UTF-8, is logged as an
    /// error naming its variable and the memory store used.
    fn global() -> &'static RateLimiter {
        GLOBAL.get_or_init(Self::from_env)
    }

    /// The limiter `#[rate_limit]` uses here: the one set by [`RateLimiter::scope`] around the
    /// running task, else the installed one ([`RateLimiter::install`]), else one built from
    /// the environment on first use (see the type's docs; a malformed URL in the environment,
    /// or a value that is not UTF-8, is logged as an error naming its variable and the memory
    /// store used). A clone: it shares the store and settings of the one it names.
    pub fn current() -> RateLimiter {
        match Self::current_for_call() {
            Current::Installed(limiter) => limiter.clone(),
            Current::Held(limiter) => limiter,
        }
    }

    /// [`RateLimiter::current`] as a limited call holds it: the installed limiter borrowed, a
    /// scoped one cloned.
    pub(crate) fn current_for_call() -> Current {
        CURRENT
            .try_with(|limiter| Current::Held(limiter.clone()))
            .unwrap_or_else(|_| Current::Installed(Self::global()))
    }

    /// Runs `fut` with this limiter as the one `#[rate_limit]` uses inside it (instead of the
    /// installed one): for tests, and for applications that keep several limiters.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), ratelimit_runtime::ConfigError> {
    /// use ratelimit_runtime::RateLimiter;
    /// let limiter = RateLimiter::builder().prefix("tenant-a").build().await?;
    /// let prefix = limiter.clone().scope(async { RateLimiter::current().settings().prefix.clone() }).await;
    /// assert_eq!(prefix, "tenant-a");
    /// # Ok(()) }
    /// ```
    pub async fn scope<F: std::future::Future>(self, fut: F) -> F::Output {
        overrides::mark_used(&self);
        CURRENT.scope(self, fut).await
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// Checks `checks` for one call (all or nothing), with the timeout and the failure policy
    /// applied. `Err` only when the store failed and the policy is [`FailurePolicy::Deny`].
    ///
    /// Behaviour:
    /// * a caller the store rejected recently is rejected from the blocked-caller cache (remote
    ///   stores; see [`Settings::blocked_cache`]) without a round trip;
    /// * otherwise the store is asked, for at most [`Settings::timeout`] (a store that answers
    ///   at once, as the memory store does, is asked without one: [`Store::check_at_once`]);
    /// * a store error or a timeout is answered by the [`FailurePolicy`], and so are the checks
    ///   made while the store is known to be failing (the breaker; see the module docs), until
    ///   a probe finds the store answering again. The policy is the strictest of the checks'
    ///   own ([`Check::with_failure_policy`]), the limiter's [`Settings::failure_policy`]
    ///   standing for a check that names none ([`FailurePolicy::stricter`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, store::Check, FailurePolicy, Policy, RateLimiter};
    ///
    /// // A Redis nobody listens on, with the default policy (local: checked in this process).
    /// let limiter = RateLimiter::builder().redis_url("redis://127.0.0.1:1").build_lazy()?;
    /// let policy = Policy::new(Algorithm::Fixed, 3, Duration::from_secs(60))?;
    /// let search = Check::new("search", &policy);
    /// let login = Check::new("login", &policy).with_failure_policy(FailurePolicy::Deny);
    /// assert!(limiter.check(&[search]).await?.is_admitted());
    /// assert!(limiter.check(&[login]).await.unwrap_err().is_transport());
    /// assert!(limiter.check(&[search, login]).await.is_err()); // the strictest answers
    /// # Ok(()) }
    /// ```
    pub async fn check(&self, checks: &[Check<'_>]) -> Result<Verdict, StoreError> {
        self.check_as(checks, None).await
    }

    /// [`RateLimiter::check`]; with a `call_id`, an admitted call leaves receipts for
    /// [`RateLimiter::refund`] ([`Store::take`]), and a rejection is not cached (units held by
    /// calls in flight may come back at once).
    async fn check_as(
        &self,
        checks: &[Check<'_>],
        call_id: Option<&str>,
    ) -> Result<Verdict, StoreError> {
        self.ask(checks, call_id).await.into_result()
    }

    /// [`RateLimiter::check_as`], telling the store's answer (or the blocked-caller cache's,
    /// which is a copy of it) from the failure policy's.
    async fn ask(&self, checks: &[Check<'_>], call_id: Option<&str>) -> Asked {
        match self.ask_now(checks, call_id) {
            Ok(asked) => asked,
            Err(sent) => self.ask_remote_answered(checks, call_id, sent).await,
        }
    }

    /// The part of [`RateLimiter::ask`] that waits for nothing: the blocked-caller cache, the
    /// breaker, the failure policy and a store that answers at once (the memory store).
    /// `Err` for a store that answers over the network, before anything was asked of it:
    /// what its call carries to [`RateLimiter::ask_remote_answered`].
    fn ask_now<'s>(
        &'s self,
        checks: &[Check<'_>],
        call_id: Option<&str>,
    ) -> Result<Asked, StoreCall<'s>> {
        let inner = &*self.inner;
        // When the store is asked, read once for the two that need it: the blocked-caller
        // cache (its lookup, and a rejection's block, which counts from before the store
        // answered so that it never ends after the store's own) and the latency metric. A
        // store with no cache (a local one) reads no clock here without `metrics`.
        let sent_at =
            (inner.blocked.is_some() || cfg!(feature = "metrics")).then(tokio::time::Instant::now);
        if let (Some(blocked), Some(now)) = (&inner.blocked, sent_at)
            && let Some(verdict) = blocked.lookup(checks, now)
        {
            log_rejection(checks, &verdict, "blocked-cache");
            return Ok(Asked::Store(verdict));
        }
        let policy = self.failure_policy_of(checks);
        let probe = match inner.breaker.gate() {
            Gate::Open => return Ok(Asked::Policy(self.on_failure(checks, policy, None))),
            Gate::Closed => None,
            Gate::Probe(guard) => Some(guard),
        };
        let call = StoreCall {
            sent_at,
            policy,
            probe,
        };
        // A store that answers at once needs no timeout and no future, so no call id of the
        // limiter's own either (see `ask_remote`).
        match inner.store.check_at_once(checks, call_id) {
            Some(result) => Ok(self.answered(checks, call_id, call, result)),
            None => Err(call),
        }
    }

    /// The rest of [`RateLimiter::ask`] for a store that answers over the network.
    async fn ask_remote_answered(
        &self,
        checks: &[Check<'_>],
        call_id: Option<&str>,
        call: StoreCall<'_>,
    ) -> Asked {
        let result = self.ask_remote(checks, call_id, call.policy, ReplicaAck::AsAsked);
        let result = result.await.map(|(verdict, _)| verdict);
        self.answered(checks, call_id, call, result)
    }

    /// What the store answered `call` (or its failure): counted, told to the breaker, and a
    /// failure answered by the call's failure policy.
    fn answered(
        &self,
        checks: &[Check<'_>],
        call_id: Option<&str>,
        call: StoreCall<'_>,
        result: Result<Verdict, StoreError>,
    ) -> Asked {
        let inner = &*self.inner;
        let StoreCall {
            sent_at,
            policy,
            probe,
        } = call;
        crate::observe::store_latency(inner.store.name(), sent_at);
        if let Err(error) = &result {
            crate::observe::store_error(inner.store.name(), error);
        }
        match result {
            Ok(verdict) => {
                self.store_answered(checks, &verdict, call_id, sent_at);
                drop(probe);
                Asked::Store(verdict)
            }
            Err(error) if error.is_transport() => {
                // A check that timed out waiting for the store's first connection says nothing
                // of the store: the attempt goes on for the next checks. If it fails, the checks
                // waiting for it get its error, and every timeout after it counts.
                if !(error.is_timeout() && inner.store.is_connecting()) {
                    inner.breaker.failure(&error, probe.is_some());
                }
                drop(probe);
                Asked::Policy(self.on_failure(checks, policy, Some(error)))
            }
            Err(error) => {
                // The store answered, with something this call cannot use: an error for this
                // call only. Other calls keep their answers, and a probe that got this far
                // found the store reachable.
                if inner.breaker.success() {
                    inner.warnings.reset();
                }
                drop(probe);
                Asked::Policy(self.on_failure(checks, policy, Some(error)))
            }
        }
    }

    /// A store that answers over the network, within the limiter's timeout.
    ///
    /// A call the store does not answer in time is still queued there and runs when the
    /// store wakes. Under `allow` it was admitted, so the store counting it is right; under
    /// `deny` and `local` it was answered without the store, which must not count it. So
    /// under those policies every check is sent as a take whose receipts serve that refund
    /// only ([`Store::take_briefly`]: kept only as long as it needs, or carried in the reply
    /// and given back by the store itself), and one that timed out is given back in the
    /// background. (A local store answers at once: it is never asked for receipts.)
    ///
    /// With `ack`, a take waits for a replica to acknowledge its writes
    /// ([`Store::take_replicated`]); the verdict comes with whether one did (`true` when the
    /// call did not wait).
    async fn ask_remote(
        &self,
        checks: &[Check<'_>],
        call_id: Option<&str>,
        policy: FailurePolicy,
        ack: ReplicaAck,
    ) -> Result<(Verdict, bool), StoreError> {
        let inner = &*self.inner;
        let timeout = inner.settings.timeout;
        let refunds_timeouts = policy != FailurePolicy::Allow && !inner.store.is_local();
        // Under `allow` an admission no replica acknowledged would be admitted all the same.
        let waits = ack == ReplicaAck::Told
            || (policy != FailurePolicy::Allow && self.wants_replica_ack(checks));
        let own_id =
            (call_id.is_none() && (refunds_timeouts || waits)).then(crate::store::new_call_id);
        let sent_id = call_id.or(own_id.as_deref());
        let call = async {
            match (sent_id, &own_id) {
                (Some(id), _) if waits => self.take_acknowledged(checks, id, ack).await,
                // Receipts for the refund of a timeout only: kept no longer than that needs.
                (Some(id), Some(_)) => {
                    let keep = failure::timeout_receipts_keep(timeout);
                    Ok((inner.store.take_briefly(checks, id, keep).await?, true))
                }
                (Some(id), _) => Ok((inner.store.take(checks, id).await?, true)),
                (None, _) => Ok((inner.store.check(checks).await?, true)),
            }
        };
        let result = tokio::time::timeout(timeout, call)
            .await
            .unwrap_or(Err(StoreError::Timeout(timeout)));
        // The policy answers in the store's place: what the store counted (or will, once it
        // wakes) is given back, as the call was not admitted by it. A check that timed out
        // waiting for the first connection sent nothing.
        if let (Err(e), Some(id)) = (&result, sent_id.filter(|_| refunds_timeouts))
            && (e.is_timeout() || e.is_unreplicated())
            && !inner.store.is_connecting()
        {
            refund_when_answered(self, checks, id);
        }
        result
    }

    /// The store answered: the breaker closes (saying so once), and a rejection is
    /// remembered by the blocked-caller cache (for calls without receipts) and logged.
    #[inline]
    fn store_answered(
        &self,
        checks: &[Check<'_>],
        verdict: &Verdict,
        call_id: Option<&str>,
        sent_at: Option<tokio::time::Instant>,
    ) {
        let inner = &*self.inner;
        if inner.breaker.success() {
            let held_back = inner.warnings.reset();
            tracing::warn!(target: crate::observe::log::LIMITER,
                store = inner.store.name(),
                held_back,
                "rate-limit store answers again; checks use it again"
            );
        }
        if !verdict.is_admitted() {
            if let (Some(blocked), Some(sent_at)) = (&inner.blocked, sent_at)
                && call_id.is_none()
            {
                blocked.record(checks, verdict, sent_at);
            }
            log_rejection(checks, verdict, inner.store.name());
        }
    }

    /// Like [`RateLimiter::check`], but a rejection is an `Err(RateLimitError::Limited)`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, store::Check, Policy, RateLimiter};
    ///
    /// let limiter = RateLimiter::builder().build().await?;
    /// let policy = Policy::new(Algorithm::Fixed, 1, Duration::from_secs(60))?;
    /// assert!(limiter.acquire(&[Check::new("demo", &policy)]).await.is_ok());
    /// let err = limiter.acquire(&[Check::new("demo", &policy)]).await.unwrap_err();
    /// assert!(err.is_limited());
    /// # Ok(()) }
    /// ```
    pub async fn acquire(&self, checks: &[Check<'_>]) -> Result<Verdict, RateLimitError> {
        let verdict = self
            .check(checks)
            .await
            .map_err(RateLimitError::StoreUnavailable)?;
        Self::verdict_to_result(verdict)
    }

    /// A verdict as [`RateLimiter::acquire`] answers it.
    pub(crate) fn verdict_to_result(verdict: Verdict) -> Result<Verdict, RateLimitError> {
        if verdict.is_admitted() {
            return Ok(verdict);
        }
        let binding = verdict
            .binding()
            .copied()
            .unwrap_or_else(|| unreachable!("a rejected verdict has a rejecting decision"));
        Err(RateLimitError::Limited {
            retry_after: binding.retry_after.unwrap_or_default(),
            limit: binding.limit,
            remaining: binding.remaining,
            reset_after: binding.reset_after,
        })
    }

    /// Whether the store failed and has not answered since (checks get the failure policy's
    /// answer).
    pub fn store_failing(&self) -> bool {
        self.inner.breaker.is_open()
    }
}

/// One call to the store, from [`RateLimiter::ask_now`] to its answer: when it was sent (for
/// the blocked-caller cache and the latency metric), its failure policy, and the breaker's
/// probe when it is the one.
struct StoreCall<'s> {
    sent_at: Option<Instant>,
    policy: FailurePolicy,
    probe: Option<breaker::ProbeGuard<'s>>,
}

/// Who answered a check: the store (or the blocked-caller cache, a copy of its rejections), or
/// the failure policy in its place.
enum Asked {
    Store(Verdict),
    Policy(Result<Verdict, StoreError>),
}

impl Asked {
    fn into_result(self) -> Result<Verdict, StoreError> {
        match self {
            Self::Store(verdict) => Ok(verdict),
            Self::Policy(result) => result,
        }
    }
}

/// A debug event for a rejection: the scope of the binding limit and the wait, never the key.
fn log_rejection(checks: &[Check<'_>], verdict: &Verdict, source: &str) {
    if !tracing::enabled!(target: crate::observe::log::LIMITER, tracing::Level::DEBUG) {
        return;
    }
    let binding = verdict
        .decisions()
        .iter()
        .enumerate()
        .filter(|(_, d)| !d.admitted)
        .max_by_key(|(_, d)| d.retry_after);
    if let Some((i, d)) = binding {
        let scope = checks.get(i).map_or("", |c| c.scope);
        let retry_after_ms = d.retry_after.unwrap_or_default().as_millis();
        tracing::debug!(target: crate::observe::log::LIMITER,
            scope,
            source,
            limit = d.limit,
            retry_after_ms,
            "rate limit exceeded"
        );
    }
}

#[cfg(test)]
pub(crate) mod tests {
    /// A limited call borrows the installed limiter (no write to its reference count) and
    /// holds the one a task names; both are the limiter `current` names.
    #[tokio::test]
    async fn a_call_borrows_the_installed_limiter_and_holds_a_scoped_one() {
        let installed = RateLimiter::global();
        match RateLimiter::current_for_call() {
            Current::Installed(limiter) => assert!(std::ptr::eq(limiter, installed)),
            Current::Held(_) => panic!("the installed limiter was cloned"),
        }
        assert!(Arc::ptr_eq(&RateLimiter::current().inner, &installed.inner));
        let scoped = RateLimiter::builder()
            .prefix("scoped")
            .build_lazy()
            .unwrap();
        let seen = scoped
            .clone()
            .scope(async { (RateLimiter::current_for_call(), RateLimiter::current()) })
            .await;
        match seen {
            (Current::Held(held), current) => {
                assert!(Arc::ptr_eq(&held.inner, &scoped.inner));
                assert!(Arc::ptr_eq(&current.inner, &scoped.inner));
            }
            (Current::Installed(_), _) => panic!("the scoped limiter was not the call's"),
        }
    }

    #[test]
    fn the_environment_timeout_is_whole_milliseconds_in_range() {
        assert_eq!(parse_timeout_ms("2000"), Some(Duration::from_secs(2)));
        assert_eq!(parse_timeout_ms(" 1 "), Some(Duration::from_millis(1)));
        assert_eq!(parse_timeout_ms("60000"), Some(Duration::from_secs(60)));
        for bad in [
            "",
            "0",
            "60001",
            "-5",
            "1.5",
            "50ms",
            "18446744073709551616",
        ] {
            assert_eq!(parse_timeout_ms(bad), None, "{bad:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_timeout_text_parses_or_is_refused_without_panicking(raw in "\\PC*") {
            if let Some(t) = parse_timeout_ms(&raw) {
                proptest::prop_assert!(t >= Duration::from_millis(1) && t <= Duration::from_secs(60));
            }
        }
    }

    use std::fmt::Write as _;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::algorithm::Algorithm;
    use crate::policy::Policy;
    use crate::store::StoreFuture;

    /// A store that fails (or rejects) every call and counts them.
    #[derive(Debug, Default)]
    struct FakeStore {
        calls: AtomicUsize,
        reject: bool,
        local: bool,
    }

    impl Store for FakeStore {
        fn check<'a>(&'a self, checks: &'a [Check<'a>]) -> StoreFuture<'a> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let reject = self.reject;
            Box::pin(async move {
                if reject {
                    Ok(Verdict::new(
                        checks
                            .iter()
                            .map(|c| {
                                let limit = c.policy.capacity();
                                let wait = Duration::from_secs(30);
                                Decision::new(false, limit, 0, wait, wait)
                            })
                            .collect(),
                    ))
                } else {
                    Err(StoreError::connection("connection refused"))
                }
            })
        }

        fn name(&self) -> &'static str {
            "fake"
        }

        fn is_local(&self) -> bool {
            self.local
        }
    }

    /// Answers one key with a reply it cannot parse and every other key from memory.
    #[derive(Debug, Default)]
    struct PoisonedKeyStore {
        memory: MemoryStore,
    }

    impl Store for PoisonedKeyStore {
        fn check<'a>(&'a self, checks: &'a [Check<'a>]) -> StoreFuture<'a> {
            Box::pin(async move {
                if checks.iter().any(|c| c.key == "poison") {
                    return Err(StoreError::bad_reply("remaining -1"));
                }
                self.memory.check(checks).await
            })
        }

        fn name(&self) -> &'static str {
            "poisoned"
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_bad_reply_to_one_call_never_opens_the_breaker_or_changes_other_answers() {
        let policy = Policy::new(Algorithm::Fixed, 3, Duration::from_secs(60)).unwrap();
        for failure in [
            FailurePolicy::Allow,
            FailurePolicy::Deny,
            FailurePolicy::Local,
        ] {
            let limiter = RateLimiter::builder()
                .store(PoisonedKeyStore::default())
                .failure_policy(failure)
                .build_lazy()
                .unwrap();
            let other = [Check::new("other", &policy)];
            let mut admitted = 0;
            for _ in 0..10 {
                let poisoned = limiter.check(&[Check::new("poison", &policy)]).await;
                assert_eq!(
                    poisoned.is_err(),
                    failure == FailurePolicy::Deny,
                    "{failure:?}: {poisoned:?}"
                );
                assert!(!limiter.store_failing(), "{failure:?}: the breaker opened");
                admitted += usize::from(limiter.check(&other).await.unwrap().is_admitted());
            }
            assert_eq!(
                admitted, 3,
                "{failure:?}: another caller's limit still holds"
            );
        }
    }

    /// Collects the events of the current thread as `LEVEL field=value …`.
    ///
    /// A process-wide subscriber writing to a per-thread sink: with per-thread subscribers,
    /// tests running in parallel race on tracing's per-callsite interest cache.
    #[derive(Debug, Clone)]
    pub(crate) struct Capture(Arc<Mutex<Vec<String>>>);

    std::thread_local! {
        static SINK: std::cell::RefCell<Option<Capture>> = const { std::cell::RefCell::new(None) };
    }

    impl Capture {
        /// Starts capturing this thread's events (until the thread ends).
        pub(crate) fn start() -> Self {
            static GLOBAL: std::sync::Once = std::sync::Once::new();
            GLOBAL.call_once(|| {
                let _ = tracing::subscriber::set_global_default(Global);
            });
            let capture = Self(Arc::default());
            SINK.with(|s| *s.borrow_mut() = Some(capture.clone()));
            capture
        }

        pub(crate) fn lines(&self) -> Vec<String> {
            self.0.lock().unwrap().clone()
        }
    }

    struct Global;

    struct Fields<'a>(&'a mut String);

    impl tracing::field::Visit for Fields<'_> {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }

    impl tracing::Subscriber for Global {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            SINK.with(|sink| {
                if let Some(capture) = &*sink.borrow() {
                    let mut line = event.metadata().level().to_string();
                    event.record(&mut Fields(&mut line));
                    capture.0.lock().unwrap().push(line);
                }
            });
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    const KEY: &str = "ratelimit:{app::login:ip=203.0.113.7}:fixed:1:60000";

    fn limiter(store: &Arc<FakeStore>, policy: FailurePolicy) -> RateLimiter {
        RateLimiter::builder()
            .store(store.clone())
            .failure_policy(policy)
            .build_lazy()
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_store_is_skipped_for_the_backoff_and_logged_once_with_the_count() {
        let capture = Capture::start();
        let store = Arc::new(FakeStore::default());
        let limiter = limiter(&store, FailurePolicy::Allow);
        let policy = Policy::new(Algorithm::Fixed, 1, Duration::from_secs(60)).unwrap();
        let checks = [Check::new(KEY, &policy).with_scope("app::login")];
        for _ in 0..100 {
            assert!(limiter.check(&checks).await.unwrap().is_admitted());
        }
        assert_eq!(
            store.calls.load(Ordering::SeqCst),
            1,
            "the breaker skips the store"
        );
        assert!(limiter.store_failing());
        // Calls keep coming: the store is probed about once per backoff, never more.
        for _ in 0..400 {
            tokio::time::advance(Duration::from_millis(10)).await;
            assert!(limiter.check(&checks).await.unwrap().is_admitted());
        }
        let probes = store.calls.load(Ordering::SeqCst) - 1;
        assert!((4..=40).contains(&probes), "{probes} probes in 4 s");
        tokio::time::advance(LOG_INTERVAL).await;
        assert!(limiter.check(&checks).await.unwrap().is_admitted());

        let lines = capture.lines();
        let warnings: Vec<&String> = lines.iter().filter(|l| l.starts_with("WARN")).collect();
        assert_eq!(warnings.len(), 2, "{lines:#?}");
        assert!(warnings[0].contains("held_back=0"), "{}", warnings[0]);
        assert!(
            warnings[0].contains("scope=\"app::login\""),
            "{}",
            warnings[0]
        );
        assert!(warnings[0].contains("policy=\"allow\""), "{}", warnings[0]);
        assert!(warnings[1].contains("held_back=499"), "{}", warnings[1]);
        for line in &lines {
            assert!(
                !line.contains("203.0.113.7") && !line.contains(KEY),
                "{line}"
            );
        }
    }

    /// A store whose futures never finish but which answers at once from memory: every
    /// call is answered at once, never by the timeout (which `Deny` would turn into errors).
    #[derive(Debug, Default)]
    struct AtOnceStore {
        memory: MemoryStore,
        /// Whether each call came with a call id.
        with_ids: Mutex<Vec<bool>>,
    }

    impl Store for AtOnceStore {
        fn check<'a>(&'a self, _: &'a [Check<'a>]) -> StoreFuture<'a> {
            Box::pin(std::future::pending())
        }

        fn check_at_once(
            &self,
            checks: &[Check<'_>],
            call_id: Option<&str>,
        ) -> Option<Result<Verdict, StoreError>> {
            self.with_ids.lock().unwrap().push(call_id.is_some());
            self.memory.check_at_once(checks, call_id)
        }

        fn name(&self) -> &'static str {
            "at-once"
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_that_answers_at_once_is_never_timed_out() {
        let policy = Policy::new(Algorithm::Fixed, 3, Duration::from_secs(60)).unwrap();
        let checks = [Check::new(KEY, &policy)];
        let store = Arc::new(AtOnceStore::default());
        let limiter = RateLimiter::builder()
            .store(store.clone())
            .failure_policy(FailurePolicy::Deny)
            .build_lazy()
            .unwrap();
        let answers: Vec<bool> = five_checks(&limiter, &checks).await;
        assert_eq!(answers, [true, true, true, false, false]);
        assert!(!limiter.store_failing());
        // Nothing to refund after a timeout that cannot happen: no call id of the limiter's
        // own, so no receipts left behind. (The fifth call was answered by the blocked-caller
        // cache: the store is not local.)
        assert_eq!(*store.with_ids.lock().unwrap(), [false; 4]);
        // The memory store answers at once for checks and for takes alike.
        let memory = MemoryStore::new();
        let at_once = memory.check_at_once(&checks, None).unwrap().unwrap();
        assert_eq!(at_once.decisions()[0].remaining, 2);
        let took = memory
            .check_at_once(&checks, Some("0a1b"))
            .unwrap()
            .unwrap();
        assert_eq!(took.decisions()[0].remaining, 1);
        // Other stores are asked through their futures.
        assert!(FakeStore::default().check_at_once(&checks, None).is_none());
    }

    /// Five checks one after the other: whether each was admitted (an error fails the test).
    async fn five_checks(limiter: &RateLimiter, checks: &[Check<'_>]) -> Vec<bool> {
        let mut answers = Vec::new();
        for _ in 0..5 {
            let verdict = limiter.check(checks).await.unwrap();
            answers.push(verdict.is_admitted());
        }
        answers
    }

    #[tokio::test(start_paused = true)]
    async fn deny_and_local_answer_while_the_breaker_is_open() {
        let store = Arc::new(FakeStore::default());
        let policy = Policy::new(Algorithm::Fixed, 3, Duration::from_secs(60)).unwrap();
        let checks = [Check::new(KEY, &policy)];
        let deny = limiter(&store, FailurePolicy::Deny);
        for _ in 0..5 {
            let err = deny.acquire(&checks).await.unwrap_err();
            assert!(err.is_store_unavailable(), "{err}");
            assert!(err.to_string().contains("connection refused"), "{err}");
        }
        let local = limiter(&store, FailurePolicy::Local);
        let admitted = {
            let mut n = 0;
            for _ in 0..10 {
                n += usize::from(local.check(&checks).await.unwrap().is_admitted());
            }
            n
        };
        assert_eq!(admitted, 3, "the local fallback keeps the quota");
    }

    #[test]
    fn deny_is_stricter_than_local_which_is_stricter_than_allow() {
        use FailurePolicy::{Allow, Deny, Local};
        for (a, b, stricter) in [
            (Allow, Allow, Allow),
            (Allow, Local, Local),
            (Allow, Deny, Deny),
            (Local, Allow, Local),
            (Local, Local, Local),
            (Local, Deny, Deny),
            (Deny, Allow, Deny),
            (Deny, Local, Deny),
            (Deny, Deny, Deny),
        ] {
            assert_eq!(a.stricter(b), stricter, "{a:?} {b:?}");
        }
        assert_eq!(
            [Allow, Deny, Local].map(FailurePolicy::as_str),
            ["allow", "deny", "local"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_call_is_answered_by_the_strictest_policy_of_its_checks() {
        let store = Arc::new(FakeStore::default());
        let policy = Policy::new(Algorithm::Fixed, 3, Duration::from_secs(60)).unwrap();
        let search = Check::new("search", &policy);
        let login = Check::new("login", &policy).with_failure_policy(FailurePolicy::Deny);
        let allow = limiter(&store, FailurePolicy::Allow);
        assert!(allow.check(&[search]).await.unwrap().is_admitted());
        let err = allow.check(&[login]).await.unwrap_err();
        assert!(err.is_connection(), "{err}");
        assert!(allow.check(&[search, login]).await.is_err());
        assert!(allow.check(&[login, search]).await.is_err());
        // An explicit `allow` admits that limit under a deny limiter; a limit stacked with it
        // that names no policy takes the limiter's deny.
        let deny = limiter(&store, FailurePolicy::Deny);
        let open = Check::new("open", &policy).with_failure_policy(FailurePolicy::Allow);
        assert!(deny.check(&[open]).await.unwrap().is_admitted());
        assert!(deny.check(&[open, search]).await.is_err());
        assert!(deny.check(&[search]).await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_local_check_under_an_allow_limiter_keeps_its_quota_in_a_memory_store_made_for_it() {
        let store = Arc::new(FakeStore::default());
        let policy = Policy::new(Algorithm::Fixed, 3, Duration::from_secs(60)).unwrap();
        let allow = limiter(&store, FailurePolicy::Allow);
        let search = Check::new("search", &policy);
        let local = Check::new("local", &policy).with_failure_policy(FailurePolicy::Local);
        for _ in 0..10 {
            assert!(allow.check(&[search]).await.unwrap().is_admitted());
        }
        assert!(
            allow.inner.local.get().is_none(),
            "made before a call needs it"
        );
        let mut admitted = 0;
        for _ in 0..10 {
            let v = allow.check(&[local]).await.unwrap();
            assert_eq!(v.decisions()[0].limit, 3);
            admitted += usize::from(v.is_admitted());
        }
        assert_eq!(admitted, 3, "the local store keeps the quota");
        let local = allow
            .inner
            .local
            .get()
            .expect("made by the first local call");
        let peeked = local.check_now(&[Check::new("local", &policy)]).unwrap();
        assert!(
            !peeked.is_admitted(),
            "the local store counted the 3 admitted calls"
        );
        // The default still admits everything: the local store never saw those checks.
        assert!(allow.check(&[search]).await.unwrap().is_admitted());
        assert!(
            local
                .check_now(&[Check::new("search", &policy)])
                .unwrap()
                .decisions()[0]
                .remaining
                == 2,
            "search was never checked locally"
        );
    }

    /// Calls admitted by a limiter with `share` under [`FailurePolicy::Local`] on a store that
    /// always fails, out of `calls`, each with `policy` on one key.
    async fn admitted_with_share(share: u32, policy: Policy, calls: usize) -> usize {
        let store = Arc::new(FakeStore::default());
        let limiter = RateLimiter::builder()
            .store(store.clone())
            .failure_policy(FailurePolicy::Local)
            .local_share(share)
            .build_lazy()
            .unwrap();
        let check = Check::new("k", &policy);
        let mut admitted = 0;
        for _ in 0..calls {
            admitted += usize::from(limiter.check(&[check]).await.unwrap().is_admitted());
        }
        admitted
    }

    #[tokio::test(start_paused = true)]
    async fn a_local_share_checks_each_limit_scaled_to_the_process_s_part() {
        let minute = Duration::from_secs(60);
        let fixed = Policy::new(Algorithm::Fixed, 10, minute).unwrap();
        assert_eq!(admitted_with_share(3, fixed, 50).await, 3, "floor(10 / 3)");
        assert_eq!(
            admitted_with_share(20, fixed, 50).await,
            1,
            "num < instances: one each"
        );
        assert_eq!(
            admitted_with_share(1, fixed, 50).await,
            10,
            "one share: the whole quota"
        );
        for algo in [Algorithm::Token, Algorithm::Gcra, Algorithm::Leaky] {
            let bucket = Policy::new(algo, 10, minute)
                .unwrap()
                .with_burst(40)
                .unwrap();
            assert_eq!(
                admitted_with_share(4, bucket, 50).await,
                10,
                "{algo}: burst 40 / 4"
            );
            assert_eq!(admitted_with_share(1, bucket, 50).await, 40, "{algo}");
        }
        // The decisions report the share.
        let store = Arc::new(FakeStore::default());
        let limiter = RateLimiter::builder()
            .store(store)
            .failure_policy(FailurePolicy::Local)
            .local_share(4)
            .build_lazy()
            .unwrap();
        let hundred = Policy::new(Algorithm::Sliding, 100, minute).unwrap();
        let v = limiter.check(&[Check::new("k", &hundred)]).await.unwrap();
        assert_eq!(
            (v.decisions()[0].limit, v.decisions()[0].remaining),
            (25, 24)
        );
        // A cost above the share is refused as under `deny`, never admitted.
        let costly = hundred.with_cost(30).unwrap();
        assert!(limiter.check(&[Check::new("c", &costly)]).await.is_err());
        let fits = hundred.with_cost(25).unwrap();
        assert!(
            limiter
                .check(&[Check::new("c", &fits)])
                .await
                .unwrap()
                .is_admitted()
        );
    }

    /// What users hold (a `usize` from configuration, an `i64`) is taken; what does not fit a
    /// process count (0, negative, past `u32::MAX`) is a config error, never a panic.
    #[test]
    fn a_local_share_takes_any_integer_and_refuses_what_does_not_fit() {
        let share = |b: Builder| b.build_lazy().map(|l| l.settings().local_share.get());
        assert_eq!(
            share(RateLimiter::builder().local_share(3_usize)).ok(),
            Some(3)
        );
        assert_eq!(
            share(RateLimiter::builder().local_share(5_i64)).ok(),
            Some(5)
        );
        assert_eq!(
            share(RateLimiter::builder().local_share(u32::MAX)).ok(),
            Some(u32::MAX)
        );
        for refused in [
            RateLimiter::builder().local_share(u64::from(u32::MAX) + 1),
            RateLimiter::builder().local_share(usize::MAX),
            RateLimiter::builder().local_share(-1_i32),
        ] {
            let err = share(refused).unwrap_err();
            assert!(
                matches!(&err, ConfigError::Invalid(m) if m.contains("local_share")),
                "{err}"
            );
        }
    }

    #[test]
    fn a_local_share_of_zero_is_a_config_error() {
        let err = RateLimiter::builder()
            .local_share(0)
            .build_lazy()
            .unwrap_err();
        assert!(
            matches!(&err, ConfigError::Invalid(m) if m.contains("local_share")),
            "{err}"
        );
        let ok = RateLimiter::builder().local_share(1).build_lazy().unwrap();
        assert_eq!(ok.settings().local_share.get(), 1);
        assert_eq!(Settings::default().local_share.get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_shadow_limit_s_own_deny_never_refuses_a_call() {
        use crate::limit::{By, Limit};
        let store = Arc::new(FakeStore::default());
        let policy = Policy::new(Algorithm::Fixed, 3, Duration::from_secs(60)).unwrap();
        let allow = limiter(&store, FailurePolicy::Allow);
        let keys = ["a".to_owned(), "b".to_owned()];
        let deny = Limit::new(policy, "login", By::Global).failure_policy(FailurePolicy::Deny);
        let search = Limit::new(policy, "search", By::Global);
        assert!(allow.decide(&[deny, search], &keys).await.is_err());
        let shadowed = [deny.in_shadow(), search];
        assert!(allow.decide(&shadowed, &keys).await.unwrap().is_admitted());
    }

    #[tokio::test(start_paused = true)]
    async fn rejections_are_cached_for_remote_stores_and_logged_without_the_key() {
        let capture = Capture::start();
        let store = Arc::new(FakeStore {
            reject: true,
            ..FakeStore::default()
        });
        let policy = Policy::new(Algorithm::Fixed, 1, Duration::from_secs(60)).unwrap();
        let checks = [Check::new(KEY, &policy).with_scope("app::login")];
        let cached = limiter(&store, FailurePolicy::Allow);
        for _ in 0..10 {
            let v = cached.check(&checks).await.unwrap();
            assert!(!v.is_admitted());
            assert!(v.retry_after().unwrap() <= Duration::from_secs(30));
        }
        assert_eq!(store.calls.load(Ordering::SeqCst), 1);
        tokio::time::advance(Duration::from_secs(30)).await;
        assert!(!cached.check(&checks).await.unwrap().is_admitted());
        assert_eq!(
            store.calls.load(Ordering::SeqCst),
            2,
            "expired with Redis's wait"
        );

        let uncached = RateLimiter::builder()
            .store(store.clone())
            .blocked_cache(0)
            .build_lazy()
            .unwrap();
        for _ in 0..3 {
            assert!(!uncached.check(&checks).await.unwrap().is_admitted());
        }
        assert_eq!(store.calls.load(Ordering::SeqCst), 5);

        let lines = capture.lines();
        let debug: Vec<&String> = lines.iter().filter(|l| l.starts_with("DEBUG")).collect();
        assert_eq!(debug.len(), 14, "{lines:#?}");
        assert!(debug.iter().all(|l| l.contains("scope=\"app::login\"")));
        assert!(
            debug[1].contains("source=\"blocked-cache\""),
            "{}",
            debug[1]
        );
        for line in &lines {
            assert!(
                !line.contains("203.0.113.7") && !line.contains(KEY),
                "{line}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn only_stores_that_are_not_local_get_a_blocked_cache() {
        let policy = Policy::new(Algorithm::Fixed, 1, Duration::from_secs(60)).unwrap();
        let checks = [Check::new(KEY, &policy)];
        for (local, calls) in [(false, 1), (true, 5)] {
            let store = Arc::new(FakeStore {
                reject: true,
                local,
                ..FakeStore::default()
            });
            let limiter = limiter(&store, FailurePolicy::Allow);
            for _ in 0..5 {
                assert!(!limiter.check(&checks).await.unwrap().is_admitted());
            }
            assert_eq!(store.calls.load(Ordering::SeqCst), calls, "local: {local}");
        }
        // The memory store is local: no cache in front of it.
        assert!(MemoryStore::new().is_local());
        let limiter = RateLimiter::builder().build_lazy().unwrap();
        assert!(limiter.inner.blocked.is_none());
    }
}
