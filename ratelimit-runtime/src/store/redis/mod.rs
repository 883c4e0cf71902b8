//! The Redis store: one server, one `FCALL` (`EVALSHA` without Redis Functions) per check,
//! whatever the number of stacked limits.
//!
//! # Behaviour
//!
//! * **Atomic.** Each check is one Lua script (`src/scripts/*.lua`) that reads the server's
//!   clock (`TIME`, in microseconds), evaluates every limit of the call, and writes only when
//!   all of them admit it: a rejected call leaves every key byte-for-byte as it was.
//! * **One round trip.** The Lua is loaded once as a Redis Functions library (`FUNCTION LOAD`,
//!   at [`RedisStore::connect`] or on the first check), so its helpers and tables are built at
//!   load, and each check is one `FCALL`. The library's name carries a hash of its code: two
//!   versions of an application share a Redis without replacing each other's. After a
//!   restart without persistence or a `FUNCTION FLUSH` (`Function not found`), the library is
//!   loaded again and the call repeated once. A server without Functions (before Redis 7, or
//!   an ACL without `FCALL`/`FUNCTION`) runs the same code as scripts, invoked by their SHA1
//!   with `EVALSHA` and reloaded after `NOSCRIPT`.
//! * **Fixed windows, their own function.** A call whose limits are all fixed windows on
//!   distinct keys (the usual call: one) goes to a function of its own
//!   (`scripts/fixed_only.lua`: per limit `INCRBY` and the key's `PTTL`, `PEXPIRE` for a new
//!   window, `DECRBY` to undo a call over the limit, all in the one script), which reads no
//!   clock without a call id: its waits (`reset_after`,
//!   `retry_after`) count from the start of the server's current millisecond, so they are
//!   whole milliseconds, never early and less than 1 ms later than the other paths'
//!   ([`crate::algorithm::fixed::whole_ms`]). A block, a replayed take or state it does not
//!   read itself is handed to the driver in the same script.
//! * **TTL on every key.** No key outlives its state: fixed = the window's end, sliding = newest
//!   entry + period, token = time until full, leaky = time until empty. A key is never created
//!   without its TTL in the same command.
//! * **Redis 6.2 or later** (or Valkey): a call that names one key twice works on copies of its
//!   keys (`COPY`), so that a rejection leaves each key exactly as it was, expiry included.
//! * **A server at its `maxmemory`.** Under `noeviction` Redis refuses writes: a call it would
//!   admit fails with [`StoreError::OutOfMemory`], which the limiter refuses under every
//!   failure policy, while calls over the quota are still answered (a rejection writes
//!   nothing). An evicting `maxmemory-policy` (any other: every limit key has a TTL) is read at
//!   connect and after a reconnect (`INFO memory`) and logged once as a WARN naming the
//!   setting and the fix; [`crate::limiter::Builder::require_noeviction`] refuses it at build.
//! * **Shared connection.** A [`redis::aio::ConnectionManager`]: one multiplexed connection per
//!   store, shared by every task, reconnecting by itself after the server restarts or the
//!   connection drops.
//!
//! # URLs
//!
//! `redis://[<user>][:<password>@]<host>[:<port>][/<db>]`, handled by the `redis` crate: a
//! username and password in the URL are sent with `AUTH` (percent-encode special characters).
//! `rediss://…` is TLS and needs this crate's **`tls`** feature (rustls; the server's
//! certificate is verified against the system's root certificates; certificate checks cannot be
//! turned off). For a private CA or client certificates, build a client with
//! `redis::Client::build_with_tls` and hand its `ConnectionManager` to
//! [`RedisStore::from_connection_manager`]. `unix:///path` and `redis+unix:///path` reach a Unix
//! socket.
//!
//! ```no_run
//! # async fn demo() -> Result<(), ratelimit_runtime::ConfigError> {
//! use ratelimit_runtime::{RateLimiter, RedisStore};
//!
//! let store = RedisStore::connect("redis://:secret@127.0.0.1:6379/0").await?;
//! let limiter = RateLimiter::builder().store(store).build().await?;
//! # let _ = limiter; Ok(()) }
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::Client;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use self::give_back::GivingBack;
use self::invoke::{Calls, Mode, compensate, eval_checks};
use self::load::load_scripts_pipelined;
use self::server::{MemoryPolicy, info_memory_cmd};
use self::wire::{block_cmd, extend_block_cmd, forget_pipe, reset_cmd};
use super::lazy::{LazyConnection, within_attempt_limit};
use super::{Check, Store, StoreFuture};
use crate::decision::Verdict;
use crate::error::{ConfigError, StoreError};

// The store, its URLs and its connection are here; the Redis Cluster store shares the rest.
mod give_back;
pub(crate) mod invoke;
pub(crate) mod load;
mod script;
pub(crate) mod seat;
pub(crate) mod server;
pub(crate) mod wire;

pub use self::script::{ScriptSources, eval_form, script_sources};
pub use self::wire::{
    ReplyReceipt, check_keys, compensate_keys, parse_reply, parse_reply_with_receipts,
};

/// Parses a Redis URL into a client, with errors that never repeat the URL (it may hold a
/// password).
fn client(url: &str) -> Result<Client, ConfigError> {
    let url = url.trim();
    if url.is_empty() {
        return Err(ConfigError::InvalidUrl("the URL is empty".to_owned()));
    }
    let Some((scheme, _)) = url.split_once("://") else {
        return Err(ConfigError::InvalidUrl(
            "expected redis://[user][:password@]host[:port][/db], rediss://… (TLS) or unix:///path"
                .to_owned(),
        ));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "redis" | "valkey" | "unix" | "redis+unix" | "valkey+unix" => {}
        "rediss" | "valkeys" => {
            if !cfg!(feature = "tls") {
                return Err(ConfigError::InvalidUrl(
                    "rediss:// (TLS) needs the `tls` feature: ratelimit-runtime = { version = \"…\", features = [\"tls\"] }"
                        .to_owned(),
                ));
            }
        }
        other => {
            let shown: String = other.chars().take(16).collect();
            return Err(ConfigError::InvalidUrl(format!(
                "unsupported scheme `{shown}`: expected redis://, rediss:// (TLS) or unix://"
            )));
        }
    }
    Client::open(url).map_err(|e| {
        // The redis crate's messages name the problem, not the URL; a detail quoting part of
        // the URL is blanked all the same.
        let mut message = e.to_string();
        if let Some(detail) = e.detail().filter(|d| !d.is_empty() && url.contains(d)) {
            message = message.replace(detail, "…");
        }
        ConfigError::InvalidUrl(message)
    })
}

/// How the connection manager connects and reconnects: a few quick retries with a short
/// backoff, so an unreachable server is reported within seconds and a restarted one is found
/// again quickly.
///
/// No response timeout: the limiter's own timeout ([`crate::limiter::Builder::timeout`]) bounds every check
/// already, and the connection manager's would register a second tokio timer per request.
fn manager_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_response_timeout(None)
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(50))
        .set_max_delay(Duration::from_millis(500))
}

async fn connect_manager(
    client: Client,
    calls: Arc<Calls>,
    memory: Arc<MemoryPolicy>,
) -> Result<ConnectionManager, redis::RedisError> {
    let mut manager = ConnectionManager::new_with_config(client, manager_config()).await?;
    load_scripts_pipelined(&mut manager, &calls, &memory).await?;
    Ok(manager)
}

/// After a check on `conn`: a transport failure marks the server's `maxmemory-policy` stale;
/// the first success after it reads the policy again (see [`MemoryPolicy`]).
fn watch_memory_policy<T>(
    conn: &ConnectionManager,
    memory: &Arc<MemoryPolicy>,
    result: &Result<T, StoreError>,
) {
    match result {
        Err(e) if e.is_transport() => memory.mark_stale(),
        Ok(_) if memory.take_stale() => reread_memory_policy(conn.clone(), memory),
        _ => {}
    }
}

/// Reads the server's `maxmemory-policy` again (after a dropped connection), in a task of its
/// own: the check that noticed never waits for it.
fn reread_memory_policy(mut conn: ConnectionManager, memory: &Arc<MemoryPolicy>) {
    let memory = Arc::clone(memory);
    tokio::spawn(async move {
        let read = tokio::time::timeout(
            Duration::from_secs(2),
            info_memory_cmd().query_async::<String>(&mut conn),
        )
        .await;
        match read {
            Ok(Ok(info)) => memory.record_info("redis", &info),
            // Not read this time: the next dropped connection tries again.
            Ok(Err(e)) => {
                tracing::debug!(target: crate::observe::log::STORE, error = %e, "redis: INFO memory failed");
            }
            Err(_) => {
                tracing::debug!(target: crate::observe::log::STORE, "redis: INFO memory did not answer in time");
            }
        }
    });
}

/// One Redis server, one `FCALL` (or `EVALSHA`) per check (see the [module docs](self) for the
/// behaviour and the accepted URLs).
///
/// Cheap to share: wrap it in an `Arc` or hand it to [`crate::limiter::Builder::store`].
pub struct RedisStore {
    client: Option<Client>,
    manager: LazyConnection<ConnectionManager>,
    calls: Arc<Calls>,
    memory: Arc<MemoryPolicy>,
    /// The takes given up on whose receipts are being sent back ([`Store::take_briefly`]).
    giving_back: Arc<GivingBack>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The client's connection info holds the password: never print it.
        f.debug_struct("RedisStore")
            .field("connected", &self.manager.is_connected())
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Parses `url`, connects and loads the library (or, on a server without Functions, the
    /// scripts).
    ///
    /// A malformed URL is [`ConfigError::InvalidUrl`] (the message never repeats the URL); a
    /// server that does not answer, refuses the credentials, or has not answered within 10 s
    /// (every retry included), is [`ConfigError::Unreachable`].
    pub async fn connect(url: &str) -> Result<Self, ConfigError> {
        let client = client(url)?;
        let calls = Arc::new(Calls::default());
        let memory = Arc::new(MemoryPolicy::default());
        let connect = connect_manager(client.clone(), Arc::clone(&calls), Arc::clone(&memory));
        let manager = within_attempt_limit(connect)
            .await
            .map_err(|e| ConfigError::Unreachable(e.to_string()))?;
        Ok(Self {
            client: Some(client),
            manager: LazyConnection::ready(manager),
            calls,
            memory,
            giving_back: Arc::default(),
        })
    }

    /// Parses `url` and returns at once; the store connects at its first check. A failed
    /// connection fails that check (the limiter's failure policy decides) and is tried again
    /// by the next one.
    ///
    /// ```
    /// use ratelimit_runtime::RedisStore;
    /// assert!(RedisStore::lazy("redis://127.0.0.1:6379").is_ok());
    /// assert!(RedisStore::lazy("127.0.0.1:6379").is_err());
    /// ```
    pub fn lazy(url: &str) -> Result<Self, ConfigError> {
        Ok(Self {
            client: Some(client(url)?),
            manager: LazyConnection::new(),
            calls: Arc::new(Calls::default()),
            memory: Arc::new(MemoryPolicy::default()),
            giving_back: Arc::default(),
        })
    }

    /// A store on a connection manager the application built itself (to tune its timeouts or
    /// retries). The scripts are loaded by the first check that needs them, and the server's
    /// `maxmemory-policy` is read in the background after the first check that succeeds (and
    /// again after a reconnect, as for [`RedisStore::connect`]).
    pub fn from_connection_manager(manager: ConnectionManager) -> Self {
        let memory = Arc::new(MemoryPolicy::default());
        memory.mark_stale();
        Self {
            client: None,
            manager: LazyConnection::ready(manager),
            calls: Arc::new(Calls::default()),
            memory,
            giving_back: Arc::default(),
        }
    }

    async fn manager(&self) -> Result<ConnectionManager, StoreError> {
        let client = self.client.clone();
        let calls = Arc::clone(&self.calls);
        let memory = Arc::clone(&self.memory);
        self.manager
            .get(|| async move {
                match client {
                    Some(client) => connect_manager(client, calls, memory).await,
                    // `from_connection_manager` fills the cell at construction.
                    None => Err(redis::RedisError::from((
                        redis::ErrorKind::Client,
                        "no connection manager",
                    ))),
                }
            })
            .await
    }
}

impl RedisStore {
    /// A take under `call_id` whose receipts are kept at most `keep` (`None`: the longest).
    async fn take_keeping(
        &self,
        checks: &[Check<'_>],
        call_id: &str,
        keep: Option<Duration>,
    ) -> Result<Verdict, StoreError> {
        let mut conn = self.manager().await?;
        let result = eval_checks(&mut conn, &self.calls, checks, Some(call_id), keep).await;
        watch_memory_policy(&conn, &self.memory, &result);
        result
    }
}

impl Store for RedisStore {
    fn check<'a>(&'a self, checks: &'a [Check<'a>]) -> StoreFuture<'a> {
        Box::pin(async move {
            let mut conn = self.manager().await?;
            let result = eval_checks(&mut conn, &self.calls, checks, None, None).await;
            watch_memory_policy(&conn, &self.memory, &result);
            result
        })
    }

    fn take<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> StoreFuture<'a> {
        Box::pin(self.take_keeping(checks, call_id, None))
    }

    /// The receipts come back in the take's reply: none is written (a concurrency limit's
    /// slot, held under the call id, is taken as [`Store::take`] takes it, its receipts kept at
    /// most `keep`). A take whose future is dropped before it answers is finished in a task of
    /// its own, and what it took given back when its reply comes: exactly what a refund by
    /// receipts would give back, once. A take whose reply is lost with its connection stays
    /// counted.
    fn take_briefly<'a>(
        &'a self,
        checks: &'a [Check<'a>],
        call_id: &'a str,
        keep: Duration,
    ) -> StoreFuture<'a> {
        if checks.is_empty()
            || !crate::store::is_call_id(call_id)
            || checks
                .iter()
                .any(|c| c.policy.algorithm() == crate::algorithm::Algorithm::Concurrency)
        {
            return Box::pin(self.take_keeping(checks, call_id, Some(keep)));
        }
        Box::pin(async move {
            let conn = self.manager().await?;
            let take = give_back::take_or_give_back(
                conn.clone(),
                Arc::clone(&self.calls),
                Arc::clone(&self.giving_back),
                checks,
                call_id,
            );
            let result = take.await;
            watch_memory_policy(&conn, &self.memory, &result);
            result
        })
    }

    /// A take under `call_id` given up on ([`Store::take_briefly`]) is being given back by the
    /// store: the refund waits for that, and sends nothing (the take left no receipt key).
    fn refund<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            if self.giving_back.wait_for(call_id).await {
                return Ok(());
            }
            let mut conn = self.manager().await?;
            compensate(&mut conn, &self.calls, Mode::Refund(call_id), checks)
                .await
                .map(drop)
        })
    }

    fn settle<'a>(
        &'a self,
        checks: &'a [Check<'a>],
        call_id: &'a str,
        actual: &'a [u64],
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            super::settle_arguments(checks, actual)?;
            if checks.is_empty() {
                return Ok(());
            }
            let mut conn = self.manager().await?;
            compensate(
                &mut conn,
                &self.calls,
                Mode::Settle(call_id, actual),
                checks,
            )
            .await
            .map(drop)
        })
    }

    fn forget<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            if checks.is_empty() {
                return Ok(());
            }
            let mut conn = self.manager().await?;
            forget_pipe(checks, call_id)
                .query_async::<()>(&mut conn)
                .await?;
            Ok(())
        })
    }

    fn is_connecting(&self) -> bool {
        self.manager.is_connecting()
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    fn maxmemory_policy(&self) -> Option<String> {
        self.memory.get()
    }

    fn peek<'a>(&'a self, checks: &'a [Check<'a>]) -> StoreFuture<'a> {
        Box::pin(async move {
            let mut conn = self.manager().await?;
            compensate(&mut conn, &self.calls, Mode::Peek, checks).await
        })
    }

    fn reset<'a>(&'a self, keys: &'a [&'a str]) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let mut conn = self.manager().await?;
            let mut pipe = redis::pipe();
            for key in keys {
                pipe.add_command(reset_cmd(key)).ignore();
            }
            pipe.query_async::<()>(&mut conn).await?;
            Ok(())
        })
    }

    fn block<'a>(&'a self, keys: &'a [&'a str], duration: Duration) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let mut conn = self.manager().await?;
            let mut pipe = redis::pipe();
            for key in keys {
                pipe.add_command(block_cmd(key, duration)).ignore();
            }
            pipe.query_async::<()>(&mut conn).await?;
            Ok(())
        })
    }

    fn extend_block<'a>(&'a self, keys: &'a [&'a str], duration: Duration) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let mut conn = self.manager().await?;
            let mut pipe = redis::pipe();
            for key in keys {
                pipe.add_command(extend_block_cmd(key, duration)).ignore();
            }
            pipe.query_async::<()>(&mut conn).await?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_errors_are_clear_and_never_echo_the_password() {
        for url in [
            "",
            "localhost:6379",
            "http://user:hunter2@host",
            "redis://user:hunter2@",
            "redis://:hunter2@host:notaport",
            "redis://:hunter2@host/notadb",
        ] {
            match RedisStore::lazy(url) {
                Err(ConfigError::InvalidUrl(m)) => assert!(!m.contains("hunter2"), "{m}"),
                other => panic!("{url}: {other:?}"),
            }
        }
        if !cfg!(feature = "tls") {
            let Err(ConfigError::InvalidUrl(m)) = RedisStore::lazy("rediss://host") else {
                panic!("rediss without the tls feature must be rejected");
            };
            assert!(m.contains("`tls` feature"), "{m}");
        }
        assert_eq!(
            RedisStore::lazy("rediss://127.0.0.1:6380").is_ok(),
            cfg!(feature = "tls")
        );
        assert!(RedisStore::lazy("redis://user:pw@127.0.0.1:6380/2").is_ok());
    }
}
