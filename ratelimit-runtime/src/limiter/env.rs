//! The limiter the environment describes: `RATELIMIT_REDIS_CLUSTER_NODES`, `RATELIMIT_REDIS_URL`,
//! `REDIS_URL` and `RATELIMIT_TIMEOUT_MS`, read in one place for the default limiter and
//! [`Builder::from_env`](super::Builder::from_env).

#[allow(clippy::wildcard_imports)]
use super::*;
pub(crate) use crate::store::env::{Unreadable, var};

/// The variable that sets the timeout of the limiter built from the environment.
pub(super) const TIMEOUT_ENV: &str = "RATELIMIT_TIMEOUT_MS";

/// `RATELIMIT_TIMEOUT_MS`'s value: whole milliseconds from 1 to 60,000, spaces around allowed.
pub(super) fn parse_timeout_ms(raw: &str) -> Option<Duration> {
    let ms: u64 = raw.trim().parse().ok()?;
    (1..=60_000)
        .contains(&ms)
        .then(|| Duration::from_millis(ms))
}

/// The store the environment names, and the variable that named it: the Cluster's seed nodes
/// (`RATELIMIT_REDIS_CLUSTER_NODES`, feature `cluster`), then `RATELIMIT_REDIS_URL`, then
/// `REDIS_URL`, each only when set and not blank. The one place that precedence is written
/// (the default limiter and [`Builder::from_env`] both read it). A variable that is set but
/// unreadable is an error naming it ([`var`]), never skipped for the next one.
pub(super) fn env_store() -> Result<Option<(&'static str, builder::EnvStore)>, Unreadable> {
    #[cfg(feature = "cluster")]
    {
        let source = crate::store::cluster::NODES_ENV;
        if let Some(raw) = var(source)? {
            let nodes: Vec<String> = crate::store::cluster::split_nodes(&raw)
                .into_iter()
                .map(str::to_owned)
                .collect();
            if !nodes.is_empty() {
                return Ok(Some((source, builder::EnvStore::Cluster(nodes))));
            }
        }
    }
    for source in ["RATELIMIT_REDIS_URL", "REDIS_URL"] {
        if let Some(url) = var(source)?.filter(|v| !v.trim().is_empty()) {
            return Ok(Some((source, builder::EnvStore::Url(url))));
        }
    }
    Ok(None)
}

impl RateLimiter {
    /// The settings of the limiter built from the environment: the defaults, with the
    /// timeout of `RATELIMIT_TIMEOUT_MS` when it is set (a malformed or out-of-range value is
    /// logged and the default kept).
    pub(super) fn env_settings() -> Settings {
        let mut settings = Settings::default();
        match var(TIMEOUT_ENV) {
            Ok(None) => {}
            Ok(Some(raw)) => {
                if let Some(timeout) = parse_timeout_ms(&raw) {
                    settings.timeout = timeout;
                } else {
                    tracing::error!(target: crate::observe::log::LIMITER,
                        source = TIMEOUT_ENV,
                        "not a timeout in milliseconds from 1 to 60000; the default timeout is used"
                    );
                }
            }
            Err(Unreadable(source)) => tracing::error!(target: crate::observe::log::LIMITER,
                source, "the value is not valid UTF-8; the default timeout is used"
            ),
        }
        settings
    }

    pub(super) fn from_env() -> Self {
        overrides::warn_unseen_overrides();
        let (source, store) = match env_store() {
            Ok(Some(named)) => named,
            Ok(None) => return Self::memory_from_env(),
            Err(Unreadable(source)) => {
                // As for a malformed URL: said loudly, and the memory store.
                tracing::error!(target: crate::observe::log::LIMITER, source, "the value is not valid UTF-8: cannot use Redis; rate limits are kept in this process's memory");
                return Self::from_parts(Arc::new(MemoryStore::new()), Self::env_settings());
            }
        };

        #[allow(
            clippy::infallible_destructuring_match,
            reason = "the Cluster's variant exists with the `cluster` feature only"
        )]
        let url = match store {
            builder::EnvStore::Url(url) => url,
            #[cfg(feature = "cluster")]
            builder::EnvStore::Cluster(nodes) => {
                return match crate::store::RedisClusterStore::lazy(nodes) {
                    Ok(store) => {
                        tracing::info!(target: crate::observe::log::LIMITER, source, "rate limits are kept in a Redis Cluster");
                        Self::from_parts(Arc::new(store), Self::env_settings())
                    }
                    Err(e) => {
                        tracing::error!(target: crate::observe::log::LIMITER, source, error = %e, "cannot use the Redis Cluster; rate limits are kept in this process's memory");
                        Self::from_parts(Arc::new(MemoryStore::new()), Self::env_settings())
                    }
                };
            }
        };
        match RedisStore::lazy(&url) {
            Ok(store) => {
                tracing::info!(target: crate::observe::log::LIMITER, source, "rate limits are kept in Redis");
                Self::from_parts(Arc::new(store), Self::env_settings())
            }
            Err(e) => {
                tracing::error!(target: crate::observe::log::LIMITER, source, error = %e, "cannot use Redis; rate limits are kept in this process's memory");
                Self::from_parts(Arc::new(MemoryStore::new()), Self::env_settings())
            }
        }
    }

    /// The default limiter when the environment names no store: the memory store, said once.
    fn memory_from_env() -> Self {
        tracing::warn!(target: crate::observe::log::LIMITER,
            "no rate limiter installed and neither RATELIMIT_REDIS_URL nor REDIS_URL is set: \
             rate limits are kept in this process's memory (per process, not shared between instances)"
        );
        Self::from_parts(Arc::new(MemoryStore::new()), Self::env_settings())
    }
}
