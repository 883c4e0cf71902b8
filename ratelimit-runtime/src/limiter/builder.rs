//! [`Builder`]: how a [`RateLimiter`] is put together, and the checks of its settings.

use std::sync::Arc;
use std::time::Duration;

use super::{FailurePolicy, RateLimiter, Settings};
use crate::caller::settings::{ForwardedHeader, HeaderStyle};
use crate::error::ConfigError;
use crate::key;
use crate::net::{IntoNetwork, IpNet};
use crate::store::{MemoryStore, RedisStore, Store};

impl RateLimiter {
    /// A builder with the defaults: memory store, prefix `ratelimit`, no trusted proxies,
    /// IPv6 grouped by /64, 50 ms timeout, [`FailurePolicy::Local`] while the store fails, IETF
    /// headers.
    pub fn builder() -> Builder {
        Builder {
            store: StoreChoice::Memory,
            settings: Settings::default(),
            proxies: Vec::new(),
            exempt: Vec::new(),
            deny: Vec::new(),
            require_noeviction: false,
            overrides: Vec::new(),
            local_share: Some(1),
            unreadable_timeout: None,
        }
    }
}

impl Builder {
    /// A builder that reads the environment as the default limiter does (see
    /// [`RateLimiter`]): the store from `RATELIMIT_REDIS_CLUSTER_NODES` (feature `cluster`),
    /// then `RATELIMIT_REDIS_URL`, then `REDIS_URL` (the first one set and not blank), else the
    /// memory store; the timeout from `RATELIMIT_TIMEOUT_MS`. Every other setting is the
    /// default, for the chain to change: an application that needs the builder (trusted
    /// proxies, overrides, shadow mode) keeps the environment's store without reading the
    /// variables itself. Unlike the default limiter, a malformed URL or timeout, or a variable
    /// that is set but not UTF-8, is an error at `build()` naming it, not a log line and the
    /// memory store.
    ///
    /// ```
    /// use ratelimit_runtime::limiter::Builder;
    /// let limiter = Builder::from_env()
    ///     .trusted_proxies(["10.0.0.0/8"])
    ///     .build_lazy()?;
    /// # let _ = limiter;
    /// # Ok::<(), ratelimit_runtime::ConfigError>(())
    /// ```
    pub fn from_env() -> Self {
        let mut builder = RateLimiter::builder();
        match super::env_store() {
            Ok(Some((_, EnvStore::Url(url)))) => builder.store = StoreChoice::RedisUrl(url),
            #[cfg(feature = "cluster")]
            Ok(Some((_, EnvStore::Cluster(nodes)))) => {
                builder.store = StoreChoice::RedisCluster(nodes);
            }
            Ok(None) => {}
            Err(unreadable) => builder.store = StoreChoice::Unreadable(unreadable),
        }
        match super::env::var(super::TIMEOUT_ENV) {
            // A malformed value fails the build (a zero timeout is refused there).
            Ok(Some(raw)) => {
                builder.settings.timeout = super::parse_timeout_ms(&raw).unwrap_or(Duration::ZERO);
            }
            Ok(None) => {}
            Err(unreadable) => builder.unreadable_timeout = Some(unreadable),
        }
        builder
    }
}

/// The store the environment names.
pub(super) enum EnvStore {
    /// `RATELIMIT_REDIS_URL` or `REDIS_URL`.
    Url(String),
    /// `RATELIMIT_REDIS_CLUSTER_NODES`, split.
    #[cfg(feature = "cluster")]
    Cluster(Vec<String>),
}

enum StoreChoice {
    Memory,
    /// [`Builder::from_env`]: a store variable set but unreadable (fails the build unless
    /// another store is chosen).
    Unreadable(super::env::Unreadable),
    RedisUrl(String),
    #[cfg(feature = "cluster")]
    RedisCluster(Vec<String>),
    Store(Arc<dyn Store>),
}

/// Builds a [`RateLimiter`].
///
/// ```
/// # async fn demo() -> Result<(), ratelimit_runtime::ConfigError> {
/// use std::time::Duration;
/// use ratelimit_runtime::{FailurePolicy, RateLimiter};
///
/// let limiter = RateLimiter::builder()
///     .redis_url("redis://127.0.0.1:6379")
///     .prefix("myapp")
///     .trusted_proxies(["10.0.0.0/8"])
///     .timeout(Duration::from_millis(30))
///     .failure_policy(FailurePolicy::Local)
///     .build()
///     .await?;
/// limiter.install()?;
/// # Ok(()) }
/// ```
#[must_use]
pub struct Builder {
    store: StoreChoice,
    settings: Settings,
    /// The networks of the three lists, as given (checked at build).
    proxies: Vec<Result<IpNet, String>>,
    exempt: Vec<Result<IpNet, String>>,
    deny: Vec<Result<IpNet, String>>,
    /// [`Builder::require_noeviction`].
    require_noeviction: bool,
    /// Scope quotas set from the start ([`Builder::override_quota`]).
    pub(super) overrides: Vec<(String, crate::quota::Quota)>,
    /// [`Builder::local_share`], as given (0, or a number past `u32::MAX`: `None`, fails the
    /// build).
    local_share: Option<u32>,
    /// `RATELIMIT_TIMEOUT_MS` was set but unreadable ([`Builder::from_env`]; fails the build
    /// unless [`Builder::timeout`] sets one).
    unreadable_timeout: Option<super::env::Unreadable>,
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Builder {
    /// Use the in-process memory store (the default).
    pub fn memory(mut self) -> Self {
        self.store = StoreChoice::Memory;
        self
    }

    /// Use one Redis server (`redis://`, `rediss://`, with user and password when needed).
    pub fn redis_url(mut self, url: impl Into<String>) -> Self {
        self.store = StoreChoice::RedisUrl(url.into());
        self
    }

    /// Use a Redis Cluster, reached through these seed nodes (`redis://host:port` each; the
    /// client discovers the rest). Needs the `cluster` feature.
    #[cfg(feature = "cluster")]
    pub fn redis_cluster<I, S>(mut self, nodes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.store = StoreChoice::RedisCluster(nodes.into_iter().map(Into::into).collect());
        self
    }

    /// Use a store built by the caller: any [`Store`], a shared one (`Arc<dyn Store>`,
    /// `Arc<MemoryStore>`) included. An `Arc<dyn Store>` is kept as it is, so limiters given
    /// clones of it share one store (a shared store is a [`Store`] too).
    pub fn store<S: Store>(mut self, store: S) -> Self {
        let mut slot = Some(store);
        let shared = (&mut slot as &mut dyn std::any::Any)
            .downcast_mut::<Option<Arc<dyn Store>>>()
            .and_then(Option::take);
        // Exactly one of the two holds the store.
        if let Some(store) = shared.or_else(|| slot.map(|s| Arc::new(s) as Arc<dyn Store>)) {
            self.store = StoreChoice::Store(store);
        }
        self
    }

    /// The prefix of every key (default `ratelimit`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.settings.prefix = prefix.into();
        self
    }

    /// Peers (IP addresses or CIDR blocks such as `10.0.0.0/8`) whose forwarding header is
    /// believed: from one of them, the header named by [`Builder::forwarded_header`] (default
    /// `X-Forwarded-For`) is walked right to left, skipping hops that are trusted proxies too,
    /// and the first other hop is the client. From any other peer no header is read. None by
    /// default; a value that is not an address or block makes the build fail with
    /// [`ConfigError::InvalidProxy`].
    pub fn trusted_proxies<I>(mut self, proxies: I) -> Self
    where
        I: IntoIterator,
        I::Item: IntoNetwork,
    {
        self.proxies = proxies.into_iter().map(IntoNetwork::into_network).collect();
        self
    }

    /// The one header the trusted proxies set (default [`ForwardedHeader::XForwardedFor`]);
    /// the other two are ignored, so a client cannot pass its own `Forwarded` or `X-Real-IP`
    /// through a proxy that only appends to `X-Forwarded-For`. Pick the header your proxies
    /// *write*, not one they pass through. It matters only with [`Builder::trusted_proxies`].
    ///
    /// ```
    /// use ratelimit_runtime::{http::ForwardedHeader, RateLimiter};
    ///
    /// // nginx in front, with `proxy_set_header X-Real-IP $remote_addr;`
    /// let limiter = RateLimiter::builder()
    ///     .trusted_proxies(["10.0.0.0/8", "fd00::/8"])
    ///     .forwarded_header(ForwardedHeader::XRealIp)
    ///     .build_lazy()?;
    /// assert_eq!(limiter.settings().http.forwarded_header, ForwardedHeader::XRealIp);
    /// # Ok::<(), ratelimit_runtime::ConfigError>(())
    /// ```
    pub fn forwarded_header(mut self, header: ForwardedHeader) -> Self {
        self.settings.http.forwarded_header = header;
        self
    }

    /// IPv6 callers are grouped by this prefix length (default 64; 128 keys each address).
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.settings.http.ipv6_prefix = bits;
        self
    }

    /// The longest wait for the store on one check (default 50 ms).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeout = timeout;
        self.unreadable_timeout = None;
        self
    }

    /// What to do when the store fails (default [`FailurePolicy::Local`]: the same limits,
    /// checked in this process, so that an outage or a failover never switches a limit off;
    /// [`FailurePolicy::Allow`] to fail open, [`FailurePolicy::Deny`] to fail closed).
    ///
    /// ```
    /// use ratelimit_runtime::{FailurePolicy, RateLimiter};
    /// let limiter = RateLimiter::builder().redis_url("redis://127.0.0.1:6379").build_lazy()?;
    /// assert_eq!(limiter.settings().failure_policy, FailurePolicy::Local);
    /// assert_eq!(FailurePolicy::default(), FailurePolicy::Local);
    /// # Ok::<(), ratelimit_runtime::ConfigError>(())
    /// ```
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.settings.failure_policy = policy;
        self
    }

    /// How many processes share each limit when [`FailurePolicy::Local`] answers (default 1:
    /// each process keeps the whole quota). With `instances` processes, each checks every
    /// limit during an outage against its share ([`Policy::share`](crate::Policy::share)):
    /// `num` and `burst` divided by `instances`, rounded down, at least 1. The fleet then
    /// admits at most `instances × max(1, ⌊num / instances⌋) ≤ max(num, instances)` per
    /// window instead of `instances × num`: the quota itself when `num ≥ instances`, one call
    /// per process for the limits with fewer units than processes.
    ///
    /// A call whose `cost` is more than its share's capacity cannot be admitted within the
    /// share: it is refused as under [`FailurePolicy::Deny`] while the store is down. The
    /// healthy path is untouched: the store keeps the whole quota. Count the processes that
    /// serve the limits (replicas); more than there are only makes each share smaller. It takes
    /// any integer (a replica count read from configuration is often a `usize`); `0`, a
    /// negative number or one past `u32::MAX` fails the build ([`ConfigError::Invalid`]).
    ///
    /// ```
    /// use ratelimit_runtime::{FailurePolicy, RateLimiter};
    /// // Four replicas: during an outage, each admits a quarter of every limit.
    /// let limiter = RateLimiter::builder()
    ///     .redis_url("redis://127.0.0.1:6379")
    ///     .failure_policy(FailurePolicy::Local)
    ///     .local_share(4)
    ///     .build_lazy()?;
    /// assert_eq!(limiter.settings().local_share.get(), 4);
    /// assert!(RateLimiter::builder().local_share(0).build_lazy().is_err());
    ///
    /// let replicas: usize = 3; // as read from configuration
    /// let limiter = RateLimiter::builder().local_share(replicas).build_lazy()?;
    /// assert_eq!(limiter.settings().local_share.get(), 3);
    /// # #[cfg(target_pointer_width = "64")]
    /// assert!(RateLimiter::builder().local_share(usize::MAX).build_lazy().is_err());
    /// # Ok::<(), ratelimit_runtime::ConfigError>(())
    /// ```
    pub fn local_share(mut self, instances: impl TryInto<u32>) -> Self {
        self.local_share = instances.try_into().ok();
        self
    }

    /// Whether an admitted check waits for a replica of the store's master to acknowledge its
    /// write (Redis `WAIT 1`, at most 10 ms or the timeout if shorter) before the call is
    /// admitted; default `false`. A Redis master acknowledges a write before its replica has
    /// it, so a failover can forget the last counts it acknowledged and admit those calls
    /// again; with this on, no admitted call's count is lost by a failover to the replica that
    /// acknowledged it. A write no replica acknowledged in time is a store failure for that
    /// call ([`StoreError::Unreplicated`](crate::StoreError::Unreplicated)): the failure policy
    /// answers it, and the count is given back when the policy does not admit the call. Costs
    /// one more round trip per admitted call (measured in BENCHMARKS.md); a rejected call
    /// waits for nothing. Under the `allow` failure policy, which would admit such a call all
    /// the same, checks do not wait.
    ///
    /// It applies to `RedisClusterStore`, whose masters have replicas. A master without a
    /// replica never acknowledges: every admitted call would be answered by the failure
    /// policy (and logged). The memory store and [`RedisStore`] (one server) have no replica
    /// to wait for: there it changes nothing. See the guide's stores chapter, "Failover".
    ///
    /// ```
    /// use ratelimit_runtime::RateLimiter;
    /// let limiter = RateLimiter::builder()
    ///     .redis_url("redis://127.0.0.1:6379") // `redis_cluster([...])` in production
    ///     .replica_ack(true)
    ///     .build_lazy()?;
    /// assert!(limiter.settings().replica_ack);
    /// # Ok::<(), ratelimit_runtime::ConfigError>(())
    /// ```
    pub fn replica_ack(mut self, on: bool) -> Self {
        self.settings.replica_ack = on;
        self
    }

    /// Which rate-limit fields responses carry (default `HeaderStyle::Ietf(IetfDraft::Draft11)`:
    /// [`HeaderStyle`]).
    pub fn header_style(mut self, style: HeaderStyle) -> Self {
        self.settings.http.header_style = style;
        self
    }

    /// The message of a 429 body.
    pub fn message(mut self, message: impl Into<String>) -> Self {
        self.settings.http.message = message.into();
        self
    }

    /// The capacity of the blocked-caller cache (default [`Settings::DEFAULT_BLOCKED_CACHE`] keys; `0`
    /// turns it off). See [`Settings::blocked_cache`].
    ///
    /// ```
    /// # async fn demo() -> Result<(), ratelimit_runtime::ConfigError> {
    /// use ratelimit_runtime::RateLimiter;
    /// // Every check goes to Redis, even for callers it just rejected.
    /// let limiter = RateLimiter::builder()
    ///     .redis_url("redis://127.0.0.1:6379")
    ///     .blocked_cache(0)
    ///     .build_lazy()?;
    /// # Ok(()) }
    /// ```
    pub fn blocked_cache(mut self, capacity: usize) -> Self {
        self.settings.blocked_cache = capacity;
        self
    }

    /// Shadow mode for every limit: each call is checked and counted as usual, but a
    /// rejection is only logged (`INFO`, "rate limit would reject (shadow mode)") and counted
    /// (`ratelimit_calls_total{outcome="shadow_rejected"}`, feature `metrics`); the function
    /// runs. Handlers in shadow mode answer as if no limit were there: no 429 and **no
    /// rate-limit headers**. The attribute's `shadow = true` does the same for one limit.
    ///
    /// ```
    /// use ratelimit_runtime::RateLimiter;
    /// let limiter = RateLimiter::builder().shadow(true).build_lazy()?;
    /// assert!(limiter.settings().shadow);
    /// # Ok::<(), ratelimit_runtime::ConfigError>(())
    /// ```
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.settings.shadow = shadow;
        self
    }

    /// Networks whose clients bypass every limit of the HTTP handlers and gRPC methods (no
    /// store call, no rate-limit headers or metadata). The client's address is the one `by = "ip"` uses: the peer, or
    /// what a trusted proxy's header names; a forwarding header from any other peer is never
    /// believed. See [`crate::exempt::Exemptions`].
    ///
    /// Networks are spelled as for [`Builder::trusted_proxies`] (text, [`IpNet`] or
    /// `IpAddr`); one that is not a network fails the build.
    ///
    /// ```
    /// use ratelimit_runtime::RateLimiter;
    /// let limiter = RateLimiter::builder()
    ///     .exempt_networks(["10.0.0.0/8", "127.0.0.1"])
    ///     .build_lazy()?;
    /// assert_eq!(limiter.settings().exemptions.exempt_networks().len(), 2);
    /// assert!(RateLimiter::builder().exempt_networks(["10.0.0.0/33"]).build_lazy().is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn exempt_networks<I>(mut self, networks: I) -> Self
    where
        I: IntoIterator,
        I::Item: IntoNetwork,
    {
        self.exempt = networks
            .into_iter()
            .map(IntoNetwork::into_network)
            .collect();
        self
    }

    /// A predicate over the caller ([`crate::exempt::CallerView`]: address, user, path, headers) that
    /// exempts the HTTP requests and gRPC calls it answers `true` for (health checks, internal
    /// users; a gRPC call's metadata are its headers, its path is `/`). It runs on every
    /// limited request, before the store: keep it cheap. See [`crate::exempt::Exemptions`].
    ///
    /// ```
    /// use ratelimit_runtime::RateLimiter;
    /// let limiter = RateLimiter::builder()
    ///     .exempt_when(|caller| caller.path() == "/healthz")
    ///     .build_lazy()?;
    /// assert!(limiter.settings().exemptions.has_predicate());
    /// # Ok::<(), ratelimit_runtime::ConfigError>(())
    /// ```
    pub fn exempt_when(
        mut self,
        predicate: impl Fn(&crate::exempt::CallerView<'_>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.settings.exemptions.predicate = Some(Arc::new(predicate));
        self
    }

    /// Networks whose clients every limited HTTP handler answers with 403
    /// (`{"error":"forbidden","message":…}`), and every limited gRPC method with
    /// `PERMISSION_DENIED`, before any store call. Denial wins over an exemption. A request
    /// whose peer address is unknown (an Axum app served without
    /// `into_make_service_with_connect_info`) is refused with a 500 (`INTERNAL`) that says so,
    /// never served as if the list were empty. See [`crate::exempt::Exemptions`].
    ///
    /// Networks are spelled as for [`Builder::trusted_proxies`] (text, [`IpNet`] or
    /// `IpAddr`); one that is not a network fails the build.
    ///
    /// ```
    /// use ratelimit_runtime::{net::IpNet, RateLimiter};
    /// let limiter = RateLimiter::builder()
    ///     .deny_networks(["198.51.100.0/24"])
    ///     .build_lazy()?;
    /// assert!(limiter.settings().exemptions.is_denied_ip("198.51.100.7".parse()?));
    /// // Parsed networks work too.
    /// let parsed: IpNet = "203.0.113.0/24".parse()?;
    /// let limiter = RateLimiter::builder().deny_networks([parsed]).build_lazy()?;
    /// assert!(limiter.settings().exemptions.is_denied_ip("203.0.113.1".parse()?));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn deny_networks<I>(mut self, networks: I) -> Self
    where
        I: IntoIterator,
        I::Item: IntoNetwork,
    {
        self.deny = networks
            .into_iter()
            .map(IntoNetwork::into_network)
            .collect();
        self
    }

    /// Refuses to build on a Redis whose `maxmemory-policy` may evict limit keys: with `true`,
    /// [`Builder::build`] answers [`ConfigError::Invalid`] (naming `maxmemory-policy` and the
    /// fix) unless the store read `noeviction` from its server when it connected. Every limit
    /// key has a TTL, so `volatile-*` policies evict them as surely as `allkeys-*` do: a client
    /// that mints keys then evicts other callers' live counters, and they start again from a
    /// full quota. Without this option an evicting policy is one WARN at connect.
    ///
    /// A store that has not read its server's policy (a lazy store, [`Builder::build_lazy`], or
    /// a store of your own that does not report it, [`Store::maxmemory_policy`]) is refused
    /// too: the requirement cannot be checked. A local store (the memory store) has no such
    /// setting and passes. Read at build: a server whose policy changes later is logged (WARN
    /// after the next reconnect), not refused.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), ratelimit_runtime::ConfigError> {
    /// use ratelimit_runtime::RateLimiter;
    ///
    /// let limiter = RateLimiter::builder()
    ///     .redis_url("redis://127.0.0.1:6379")
    ///     .require_noeviction(true)
    ///     .build()
    ///     .await?;
    /// # let _ = limiter; Ok(()) }
    /// ```
    pub fn require_noeviction(mut self, require: bool) -> Self {
        self.require_noeviction = require;
        self
    }

    fn settings(mut self) -> Result<(StoreChoice, Settings), ConfigError> {
        if !key::valid_prefix(&self.settings.prefix) {
            return Err(ConfigError::Invalid(format!(
                "invalid key prefix {:?}: use 1 to 200 characters of A-Z a-z 0-9 _ : . - /",
                self.settings.prefix
            )));
        }
        if !(1..=128).contains(&self.settings.http.ipv6_prefix) {
            return Err(ConfigError::Invalid(format!(
                "ipv6_prefix must be between 1 and 128, not {}",
                self.settings.http.ipv6_prefix
            )));
        }
        self.settings.local_share = (self.local_share)
            .and_then(std::num::NonZeroU32::new)
            .ok_or_else(|| {
                ConfigError::Invalid(
                    "local_share must be between 1 and 4294967295: the number of processes that share each limit during an outage"
                        .to_owned(),
                )
            })?;
        if let Some(unreadable) = self.unreadable_timeout {
            return Err(unreadable.into());
        }
        if self.settings.timeout.is_zero() {
            return Err(ConfigError::Invalid(
                "the timeout must be positive".to_owned(),
            ));
        }
        self.settings.http.trusted_proxies = std::mem::take(&mut self.proxies)
            .into_iter()
            .collect::<Result<_, _>>()
            .map_err(ConfigError::InvalidProxy)?;
        let network = |list: &'static str| {
            move |text: String| {
                ConfigError::Invalid(format!(
                    "invalid network {text:?} in {list}: expected an IP address or a CIDR block such as 10.0.0.0/8"
                ))
            }
        };
        self.settings.exemptions.exempt = std::mem::take(&mut self.exempt)
            .into_iter()
            .collect::<Result<_, _>>()
            .map_err(network("exempt_networks"))?;
        self.settings.exemptions.deny = std::mem::take(&mut self.deny)
            .into_iter()
            .collect::<Result<_, _>>()
            .map_err(network("deny_networks"))?;
        Ok((self.store, self.settings))
    }

    /// Builds the limiter, connecting to Redis when one was named: a malformed URL or an
    /// unreachable server is an error here, not at the first check.
    pub async fn build(mut self) -> Result<RateLimiter, ConfigError> {
        let overrides = std::mem::take(&mut self.overrides);
        let require_noeviction = self.require_noeviction;
        let (store, settings) = self.settings()?;
        let store: Arc<dyn Store> = match store {
            StoreChoice::Memory => Arc::new(MemoryStore::new()),
            StoreChoice::Unreadable(unreadable) => return Err(unreadable.into()),
            StoreChoice::RedisUrl(url) => Arc::new(RedisStore::connect(&url).await?),
            #[cfg(feature = "cluster")]
            StoreChoice::RedisCluster(nodes) => {
                Arc::new(crate::store::RedisClusterStore::connect(nodes).await?)
            }
            StoreChoice::Store(s) => s,
        };
        if require_noeviction {
            noeviction(&*store)?;
        }
        super::overrides::install(RateLimiter::from_parts(store, settings), overrides)
    }

    /// Builds the limiter without waiting for any server: a Redis store connects at its first
    /// check (and again after each failure). A malformed URL is still an error here.
    ///
    /// With [`Builder::require_noeviction`], only a store that has read its server's policy
    /// already (or a local one) builds: nothing is asked of a server here.
    pub fn build_lazy(mut self) -> Result<RateLimiter, ConfigError> {
        let overrides = std::mem::take(&mut self.overrides);
        let require_noeviction = self.require_noeviction;
        let (store, settings) = self.settings()?;
        let store: Arc<dyn Store> = match store {
            StoreChoice::Memory => Arc::new(MemoryStore::new()),
            StoreChoice::Unreadable(unreadable) => return Err(unreadable.into()),
            StoreChoice::RedisUrl(url) => Arc::new(RedisStore::lazy(&url)?),
            #[cfg(feature = "cluster")]
            StoreChoice::RedisCluster(nodes) => {
                Arc::new(crate::store::RedisClusterStore::lazy(nodes)?)
            }
            StoreChoice::Store(s) => s,
        };
        if require_noeviction {
            noeviction(&*store)?;
        }
        super::overrides::install(RateLimiter::from_parts(store, settings), overrides)
    }
}

/// [`Builder::require_noeviction`]: `store` read `noeviction` from its server, or keeps its
/// state in process.
fn noeviction(store: &dyn Store) -> Result<(), ConfigError> {
    if store.is_local() {
        return Ok(());
    }
    let fix = crate::store::redis::server::NOEVICTION_FIX;
    match store.maxmemory_policy() {
        Some(policy) if !crate::store::redis::server::MemoryPolicy::evicts(&policy) => Ok(()),
        Some(policy) => Err(ConfigError::Invalid(format!(
            "require_noeviction: the {} store's server has maxmemory-policy `{policy}`, which evicts rate-limit keys; {fix}",
            store.name()
        ))),
        None => Err(ConfigError::Invalid(format!(
            "require_noeviction: the {} store has not read its server's maxmemory-policy (a lazy store before its first connection, a server that refuses INFO, or a store that does not report it): build with a connected store (RedisStore::connect, Builder::build)",
            store.name()
        ))),
    }
}
