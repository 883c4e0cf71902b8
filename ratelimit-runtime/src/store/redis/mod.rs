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
//!   setting and the fix; [`crate::Builder::require_noeviction`] refuses it at build.
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
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Client, ErrorKind, Script, ServerErrorKind, Value};

use super::lazy::LazyConnection;
use super::{AdminFuture, Check, RefundFuture, Store, StoreFuture};
use crate::error::{ConfigError, StoreError};
use crate::policy::{Algorithm, Decision, Verdict};

const PRELUDE: &str = include_str!("../scripts/prelude.lua");
const FIXED: &str = include_str!("../scripts/fixed.lua");
const SLIDING: &str = include_str!("../scripts/sliding.lua");
/// The token and the leaky bucket: one rule, registered under both codes.
const BUCKET: &str = include_str!("../scripts/bucket.lua");
const GCRA: &str = include_str!("../scripts/gcra.lua");
const SLIDING_COUNTER: &str = include_str!("../scripts/sliding_counter.lua");
const DRIVER: &str = include_str!("../scripts/driver.lua");
const REFUND: &str = include_str!("../scripts/refund.lua");

/// The last line of an `EVAL` script: the driver's `check` (defined by `driver.lua`) on the
/// script's own KEYS and ARGV.
const EVAL_CHECK: &str = "return check(KEYS, ARGV)\n";
/// The last line of the companion `EVAL` script (`refund.lua`'s `compensate`).
const EVAL_COMPENSATE: &str = "return compensate(KEYS, ARGV)\n";

/// The Lua file that holds `algorithm`'s rule (its evaluate, commit and refund).
/// Every algorithm file, once each.
const ALGORITHMS: [&str; 5] = [FIXED, SLIDING, BUCKET, GCRA, SLIDING_COUNTER];

fn source(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::Fixed => FIXED,
        Algorithm::Sliding => SLIDING,
        Algorithm::Leaky | Algorithm::Token => BUCKET,
        Algorithm::Gcra => GCRA,
        Algorithm::SlidingCounter => SLIDING_COUNTER,
    }
}

/// The exact texts the Redis stores send (`FUNCTION LOAD` of the library and `FCALL` of its
/// functions, or `SCRIPT LOAD` and `EVALSHA` of the scripts' SHA1 on servers without Redis
/// Functions), for tests that run the very same bytes elsewhere (the conformance test's
/// embedded Lua).
///
/// Each script is the prelude, one or more algorithm files, a composer (the driver, or the
/// cluster's companion) and one line that calls the composer's function on the script's KEYS
/// and ARGV. The library is the same files, every one once, loaded as a Redis Functions library
/// that registers the two composers' functions: the same code, built once at `FUNCTION LOAD`
/// instead of on every call.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ScriptSources {
    /// The script [`RedisStore`] sends for a call whose limits all use one algorithm, in the
    /// order of [`Algorithm::ALL`] (fixed, sliding, leaky, token, gcra, `sliding_counter`; a position plus one is the
    /// algorithm's code in the scripts' arguments): the prelude, that algorithm's file and the
    /// driver. Leaky and token are the same text (`bucket.lua` serves both codes).
    pub single: [&'static str; 6],
    /// The script for calls that stack different algorithms: the prelude, every algorithm file
    /// and the driver.
    pub combined: &'static str,
    /// The Redis Cluster store's companion script (peek and refund modes): the prelude, every
    /// algorithm file and `refund.lua`.
    pub companion: &'static str,
    /// The Functions library (`FUNCTION LOAD REPLACE` of this text): the prelude, every
    /// algorithm file, the driver and `refund.lua`, after a `#!lua name=<library>` line, ending
    /// with the registration of [`check_function`](Self::check_function) (the driver's `check`)
    /// and [`compensate_function`](Self::compensate_function) (`refund.lua`'s `compensate`).
    pub library: &'static str,
    /// The library's name: `ratelimit_` and 16 hex digits of the SHA1 of its code, so that two
    /// versions of the scripts (two versions of an application on one Redis) are two libraries
    /// and never replace each other's.
    pub library_name: &'static str,
    /// The function that checks a call (`FCALL <this> numkeys keys… args…`, the driver
    /// script's KEYS and ARGV): the library's name and `_check`.
    pub check_function: &'static str,
    /// The companion's function (peek and refund, the companion script's KEYS and ARGV): the
    /// library's name and `_compensate`.
    pub compensate_function: &'static str,
}

impl ScriptSources {
    /// The script sent for a call whose limits all use `algorithm`.
    pub fn for_algorithm(&self, algorithm: Algorithm) -> &'static str {
        self.single[usize::from(algorithm.code() - 1)]
    }
}

/// The texts, concatenated once.
struct Texts {
    single: [String; 6],
    combined: String,
    companion: String,
    library: String,
    library_name: String,
    check_function: String,
    compensate_function: String,
}

static TEXTS: LazyLock<Texts> = LazyLock::new(|| {
    let algorithms = ALGORITHMS.concat();
    let code = [PRELUDE, algorithms.as_str(), DRIVER, REFUND].concat();
    let hash = Script::new(&code).get_hash().to_owned();
    let library_name = format!("ratelimit_{}", &hash[..16]);
    let check_function = format!("{library_name}_check");
    let compensate_function = format!("{library_name}_compensate");
    let library = format!(
        "#!lua name={library_name}\n{code}\
         redis.register_function('{check_function}', check)\n\
         redis.register_function('{compensate_function}', compensate)\n"
    );
    Texts {
        single: Algorithm::ALL.map(|a| [PRELUDE, source(a), DRIVER, EVAL_CHECK].concat()),
        combined: [PRELUDE, algorithms.as_str(), DRIVER, EVAL_CHECK].concat(),
        companion: [PRELUDE, algorithms.as_str(), REFUND, EVAL_COMPENSATE].concat(),
        library,
        library_name,
        check_function,
        compensate_function,
    }
});

/// The exact script texts the Redis and Redis Cluster stores send (see [`ScriptSources`]).
#[doc(hidden)]
pub fn script_sources() -> ScriptSources {
    let texts = &*TEXTS;
    ScriptSources {
        single: texts.single.each_ref().map(String::as_str),
        combined: &texts.combined,
        companion: &texts.companion,
        library: &texts.library,
        library_name: &texts.library_name,
        check_function: &texts.check_function,
        compensate_function: &texts.compensate_function,
    }
}

/// The checks' scripts, each hashed once: one per algorithm code (leaky and token share one
/// text, so one script) and one with every algorithm, for calls that stack different ones.
struct Scripts {
    /// The script of each algorithm code, by `code() - 1`: an index into `distinct`.
    single: [usize; 6],
    combined: Script,
    /// The per-algorithm scripts, each text once.
    distinct: Vec<Script>,
    /// The source of each script of [`Scripts::all`], in its order, for `SCRIPT LOAD`.
    sources: Vec<&'static str>,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| {
    let texts = script_sources();
    let mut sources: Vec<&'static str> = Vec::new();
    let single = texts.single.map(|text| {
        sources.iter().position(|s| *s == text).unwrap_or_else(|| {
            sources.push(text);
            sources.len() - 1
        })
    });
    let distinct = sources.iter().map(|s| Script::new(s)).collect();
    sources.push(texts.combined);
    Scripts {
        single,
        combined: Script::new(texts.combined),
        distinct,
        sources,
    }
});

impl Scripts {
    /// The smallest script that knows every algorithm in `checks`.
    fn for_checks(&self, checks: &[Check<'_>]) -> &Script {
        let Some(first) = checks.first() else {
            return &self.combined;
        };
        let algorithm = first.policy.algorithm();
        if checks.iter().all(|c| c.policy.algorithm() == algorithm) {
            self.for_algorithm(algorithm)
        } else {
            &self.combined
        }
    }

    /// The script of calls whose limits all use `algorithm`.
    fn for_algorithm(&self, algorithm: Algorithm) -> &Script {
        &self.distinct[self.single[usize::from(algorithm.code() - 1)]]
    }

    /// Every script, each text once: the per-algorithm ones, then the combined one.
    fn all(&self) -> impl Iterator<Item = &Script> {
        self.distinct.iter().chain(std::iter::once(&self.combined))
    }
}

/// Whether a store's server (every node of a cluster) runs the library with `FCALL`, or the
/// scripts with `EVALSHA`. Found out once: at connect (`FUNCTION LOAD` answered) or by the
/// first call. Until a server has refused Functions outright (`unknown command`: Redis before
/// 7, or a proxy in front that does not take `FCALL`; `NOPERM`: an ACL without `FCALL` or
/// `FUNCTION`), calls use `FCALL`; from then on, `EVALSHA`. A server out of memory refuses a
/// whole `FCALL` (functions without flags may write), where a script still answers the calls
/// it rejects (they write nothing): that call runs with `EVALSHA`. Any other error fails that
/// call only.
#[derive(Debug, Default)]
pub(crate) struct Calls {
    /// `true` once a server refused the library.
    scripts_only: AtomicBool,
}

impl Calls {
    fn functions(&self) -> bool {
        !self.scripts_only.load(Ordering::Relaxed)
    }

    fn refuse_functions(&self, why: &redis::RedisError) {
        if !self.scripts_only.swap(true, Ordering::Relaxed) {
            tracing::info!(target: crate::observe::log::STORE, error = %why, "redis: no Functions on this server, the scripts run with EVALSHA");
        }
    }
}

/// What the store last read of its server's `maxmemory-policy` (`INFO memory`, which answers
/// where `CONFIG` is disabled), read at connect and again after the connection dropped.
///
/// Every limit key has a TTL, so any policy but `noeviction` (`volatile-*` as well as
/// `allkeys-*`) lets a flood of minted keys evict other callers' live counters, and they start
/// again from a full quota. An evicting policy is logged once per value read (one WARN naming
/// the setting and the fix), and [`crate::Builder::require_noeviction`] makes it an error at
/// build.
///
/// After a reconnect: the connection manager reconnects by itself, and its
/// `Disconnection` push needs RESP3 (`set_push_sender` refuses a RESP2 connection). What every
/// dropped connection does show is a transport error on a check (the command in flight, or the
/// first one after the drop). So a check that fails that way marks the policy stale, and the
/// next check that succeeds (on the new connection) spawns one read of it, off the caller's
/// path; a failing server is not asked while it fails.
#[derive(Debug, Default)]
pub(crate) struct MemoryPolicy {
    /// The last value read; `None` before the first read or when `INFO memory` did not answer.
    policy: std::sync::Mutex<Option<String>>,
    /// Set when the connection dropped: the next check reads the policy again.
    reread: AtomicBool,
}

/// The advice an evicting policy is logged (and refused at build) with.
pub(crate) const NOEVICTION_FIX: &str = "set `maxmemory-policy noeviction` on the limiter's Redis \
    (CONFIG SET maxmemory-policy noeviction, and in redis.conf) and give it headroom: \
    every limit key has a TTL, so an evicting policy lets a flood of minted keys evict other \
    callers' live counters";

impl MemoryPolicy {
    /// Whether `policy` evicts keys (anything but `noeviction`).
    pub(crate) fn evicts(policy: &str) -> bool {
        policy != "noeviction"
    }

    /// The last value read.
    pub(crate) fn get(&self) -> Option<String> {
        self.policy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Records a value read from `store`'s server(s); a new evicting value logs the WARN.
    pub(crate) fn record(&self, store: &'static str, policy: String) {
        let mut last = self
            .policy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if last.as_deref() == Some(policy.as_str()) {
            return;
        }
        if Self::evicts(&policy) {
            tracing::warn!(target: crate::observe::log::STORE,
                store,
                maxmemory_policy = %policy,
                fix = NOEVICTION_FIX,
                "redis: maxmemory-policy `{policy}` evicts rate-limit keys; {NOEVICTION_FIX}"
            );
        }
        *last = Some(policy);
    }

    /// Records the policy in an `INFO memory` reply (nothing when it names none).
    pub(crate) fn record_info(&self, store: &'static str, info: &str) {
        if let Some(policy) = parse_maxmemory_policy(info) {
            self.record(store, policy.to_owned());
        }
    }

    /// Asks for a read at the next check (the connection dropped).
    pub(crate) fn mark_stale(&self) {
        self.reread.store(true, Ordering::Relaxed);
    }

    /// `true` once after [`MemoryPolicy::mark_stale`].
    pub(crate) fn take_stale(&self) -> bool {
        self.reread.swap(false, Ordering::Relaxed)
    }
}

/// The `maxmemory_policy:` field of an `INFO memory` reply.
pub(crate) fn parse_maxmemory_policy(info: &str) -> Option<&str> {
    info.lines()
        .find_map(|line| line.strip_prefix("maxmemory_policy:"))
        .map(str::trim)
        .filter(|p| !p.is_empty())
}

/// `INFO memory`.
pub(crate) fn info_memory_cmd() -> redis::Cmd {
    let mut cmd = redis::cmd("INFO");
    cmd.arg("memory");
    cmd
}

/// `FUNCTION LOAD REPLACE <library>`: the same text under the same name is the same library,
/// so replacing it never changes another version's (each has a name of its own).
fn library_cmd() -> redis::Cmd {
    let mut cmd = redis::cmd("FUNCTION");
    cmd.arg("LOAD").arg("REPLACE").arg(script_sources().library);
    cmd
}

/// An error the server answered (as opposed to a transport error, after which nothing is
/// known about the server).
fn is_server_error(e: &redis::RedisError) -> bool {
    e.code().is_some()
}

/// `FCALL` of a function the server does not have: a restarted server without persistence, a
/// `FUNCTION FLUSH`, a node added to a cluster.
fn function_missing(e: &redis::RedisError) -> bool {
    e.code() == Some("ERR")
        && e.detail()
            .is_some_and(|d| d.starts_with("Function not found"))
}

/// `FCALL` refused outright: a server without Redis Functions (`unknown command`), a proxy
/// that does not pass it on (`unsupported command`), or an ACL that does not allow it.
fn no_functions(e: &redis::RedisError) -> bool {
    match e.code() {
        Some("ERR") => e.detail().is_some_and(|d| {
            let d = d.to_ascii_lowercase();
            d.starts_with("unknown command") || d.starts_with("unsupported command")
        }),
        Some("NOPERM") => true,
        _ => false,
    }
}

/// The server is at its `maxmemory` and refuses writes (`noeviction`): the one test of that
/// answer, for the Redis and the Redis Cluster stores alike (it is how
/// [`StoreError::OutOfMemory`] is told apart). Redis 7 refuses a whole `FCALL` (functions
/// without flags may write) with `OOM`, and fails a script at its first write with the same
/// code; before 7.0 that write's error comes back inside a script error (`ERR Error running
/// script … -OOM command not allowed …`). A script still answers the calls it rejects (they
/// write nothing), so [`invoke`] sends an `FCALL` refused this way again as `EVALSHA`: a flood
/// of keys that fills the server cannot switch the rejections of over-quota callers off.
pub(crate) fn out_of_memory(e: &redis::RedisError) -> bool {
    e.code() == Some("OOM")
        || (e.code() == Some("ERR")
            && e.detail()
                .is_some_and(|d| d.contains("OOM command not allowed")))
}

/// A connection the checks run on, which can send the Functions library to the server that
/// serves a key: the server itself, or on a cluster the key's master (the node whose `FCALL`
/// answered that the function is missing).
pub(crate) trait ScriptConnection: ConnectionLike + Send {
    /// `FUNCTION LOAD REPLACE` of the library where `key` lives.
    fn load_library_for(
        &mut self,
        key: &str,
    ) -> impl Future<Output = redis::RedisResult<()>> + Send;
}

impl ScriptConnection for ConnectionManager {
    async fn load_library_for(&mut self, _key: &str) -> redis::RedisResult<()> {
        library_cmd().query_async(self).await
    }
}

#[cfg(feature = "cluster")]
impl ScriptConnection for redis::cluster_async::ClusterConnection {
    async fn load_library_for(&mut self, key: &str) -> redis::RedisResult<()> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        let route = Route::with_key(key.as_bytes(), SlotAddr::Master);
        self.route_command(
            library_cmd(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
        )
        .await
        .map(drop)
    }
}

/// Loads the library (`FUNCTION LOAD REPLACE`; on a cluster the client sends it to every
/// master) and every script (`SCRIPT LOAD`, every node), so that the first checks need no
/// reload round trip. A server that refuses the library is left to the scripts.
#[cfg(feature = "cluster")]
pub(crate) async fn load_scripts<C>(conn: &mut C, calls: &Calls) -> Result<(), redis::RedisError>
where
    C: ConnectionLike + Send,
{
    match library_cmd().query_async::<()>(conn).await {
        Ok(()) => {}
        Err(e) if no_functions(&e) => calls.refuse_functions(&e),
        // Any other answer (a master busy loading, out of memory, a failover under way): the
        // first `FCALL` that finds the function missing loads it.
        Err(e) if is_server_error(&e) => {}
        Err(e) => return Err(e),
    }
    for script in SCRIPTS.all() {
        script.load_async(conn).await?;
    }
    COMPANION.load_async(conn).await?;
    Ok(())
}

/// What a server says it is in `INFO server`: its name (`server_name`, which Valkey sends;
/// Redis sends none) and version (`valkey_version` on Valkey, which also sends the Redis
/// version it is compatible with as `redis_version`; `redis_version` on Redis). Unknown
/// fields read `unknown`.
pub(crate) fn engine_from_info(info: &str) -> (String, String) {
    let field = |name: &str| {
        info.lines().find_map(|line| {
            line.trim_end()
                .strip_prefix(name)
                .and_then(|rest| rest.strip_prefix(':'))
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        })
    };
    let name = field("server_name").unwrap_or_else(|| "redis".to_owned());
    let version = field(&format!("{name}_version"))
        .or_else(|| field("redis_version"))
        .unwrap_or_else(|| "unknown".to_owned());
    (name, version)
}

/// Logs (INFO) which server a store connected to and which path its checks take: `FCALL` of
/// the library, or `EVALSHA` of the scripts (no Functions, refused at connect). `info` is the
/// server's `INFO server`, `None` when it could not be read (an ACL without `INFO`). Once per
/// connect: a store connects once (a lazy one at its first check that reaches the server).
pub(crate) fn log_engine(store: &str, info: Option<&str>, calls: &Calls) {
    let (server, version) = info.map_or_else(
        || ("unknown".to_owned(), "unknown".to_owned()),
        engine_from_info,
    );
    let path = if calls.functions() {
        "FCALL"
    } else {
        "EVALSHA"
    };
    tracing::info!(target: crate::observe::log::STORE,
        store,
        server = %server,
        version = %version,
        path,
        "{store}: connected to {server} {version}, checks run with {path}"
    );
}

/// Like [`load_scripts`], in one round trip (a pipeline) on a single server: connecting at a
/// cold start is on the path of the checks that wait for it. The companion script is left to
/// its first call (`NOSCRIPT`), as before: peeks and refunds are rare.
///
/// The same round trip reads the server's `maxmemory-policy` (`INFO memory`, last) into
/// `memory`; a server that refuses `INFO` leaves it unknown.
async fn load_scripts_pipelined<C>(
    conn: &mut C,
    calls: &Calls,
    memory: &MemoryPolicy,
) -> Result<(), redis::RedisError>
where
    C: ConnectionLike + Send,
{
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe.add_command(library_cmd());
    for source in &SCRIPTS.sources {
        pipe.cmd("SCRIPT").arg("LOAD").arg(source);
    }
    // Last, for the log and the eviction check: which server this is, and its memory policy.
    pipe.cmd("INFO").arg("server");
    pipe.add_command(info_memory_cmd());
    let mut replies: Vec<redis::RedisResult<String>> = pipe.query_async(conn).await?;
    match replies.pop() {
        Some(Ok(info)) => memory.record_info("redis", &info),
        Some(Err(e)) => {
            tracing::debug!(target: crate::observe::log::STORE, error = %e, "redis: INFO memory refused; maxmemory-policy unknown");
        }
        None => {}
    }
    let info = replies.pop();
    if replies.is_empty() {
        return Err(redis::RedisError::from((
            ErrorKind::Client,
            "the script pipeline got no replies",
        )));
    }
    match replies.remove(0) {
        Ok(_) => {}
        Err(e) if no_functions(&e) => calls.refuse_functions(&e),
        // Any other answer (busy loading, out of memory): the first `FCALL` that finds the
        // function missing loads it.
        Err(e) if is_server_error(&e) => {}
        Err(e) => return Err(e),
    }
    let hashes = replies.into_iter().collect::<Result<Vec<String>, _>>()?;
    let expected: Vec<&str> = SCRIPTS.all().map(Script::get_hash).collect();
    if hashes != expected {
        return Err(redis::RedisError::from((
            ErrorKind::Client,
            "SCRIPT LOAD answered unexpected hashes",
        )));
    }
    log_engine("redis", info.and_then(Result::ok).as_deref(), calls);
    Ok(())
}

/// Runs one of the library's functions (`FCALL function numkeys keys… args…`, `args` writing
/// the numkeys, keys and arguments) or, on a server without Functions, the script that holds
/// the same code (`EVALSHA sha numkeys …`, same layout). A missing function is loaded on the
/// node of `first_key` (the one that answered) and the call repeated once; missing again, the
/// call runs as the script. A missing script likewise (`NOSCRIPT`: `SCRIPT LOAD`, then once
/// more).
async fn invoke<C>(
    conn: &mut C,
    calls: &Calls,
    function: &str,
    script: &Script,
    first_key: &str,
    args: impl Fn(&mut redis::Cmd),
) -> Result<Value, redis::RedisError>
where
    C: ScriptConnection,
{
    if calls.functions() {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(function);
        args(&mut cmd);
        match cmd.query_async(conn).await {
            Err(e) if function_missing(&e) => match conn.load_library_for(first_key).await {
                Ok(()) => match cmd.query_async(conn).await {
                    // Gone again between the load and the call (a `FUNCTION FLUSH` loop): the
                    // script, which reloads itself on `NOSCRIPT`, answers this call, never the
                    // failure policy.
                    Err(e) if function_missing(&e) => {}
                    other => return other,
                },
                Err(e) if no_functions(&e) => calls.refuse_functions(&e),
                Err(e) if out_of_memory(&e) => {}
                Err(e) => return Err(e),
            },
            Err(e) if no_functions(&e) => calls.refuse_functions(&e),
            // This call only: the next one tries `FCALL` again.
            Err(e) if out_of_memory(&e) => {}
            other => return other,
        }
    }
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash());
    args(&mut cmd);
    match cmd.query_async(conn).await {
        // A restarted or flushed server: load the script and repeat the call once.
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.load_async(conn).await?;
            cmd.query_async(conn).await
        }
        other => other,
    }
}

/// A key a script touches, declared in the call's KEYS (the scripts build no key: see the
/// prelude's `declared_keys`): a limit's own key, or one named after it (the same hash tag,
/// so the same cluster slot).
#[derive(Debug, Clone, Copy)]
enum Declared<'a> {
    /// The limit's key.
    Key(&'a str),
    /// `<key>:b`: its block marker ([`block_key`]).
    Block(&'a str),
    /// `<key>:w`: the driver's working copy, when a key repeats in the call.
    Copy(&'a str),
    /// `<key>:r:<id>:<i>`: receipt `i` (from 1) of the call id.
    Receipt(&'a str, &'a str, usize),
}

impl fmt::Display for Declared<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Key(key) => f.write_str(key),
            Self::Block(key) => write!(f, "{key}:b"),
            Self::Copy(key) => write!(f, "{key}:w"),
            Self::Receipt(key, id, i) => write!(f, "{key}:r:{id}:{i}"),
        }
    }
}

impl redis::ToRedisArgs for Declared<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        // Straight into the command's buffer: no String per key on the hot path.
        let _ = io::Write::write_fmt(&mut out.writer_for_next_arg(), format_args!("{self}"));
    }
}

/// Whether a key is named by more than one limit of the call (the driver then works on
/// copies, which the call declares). Calls hold a handful of limits: pairwise is cheapest.
fn keys_repeat(checks: &[Check<'_>]) -> bool {
    checks
        .iter()
        .enumerate()
        .any(|(i, a)| checks[..i].iter().any(|b| a.key == b.key))
}

/// The KEYS of a check (the driver) or of the companion's peek and refund, in the prelude's
/// order (`declared_keys`): the limits' keys, their block markers, the working copies when
/// `copies` (a key repeats), the receipts under `receipts` (a call id).
fn declared<'a>(
    checks: &'a [Check<'a>],
    copies: bool,
    receipts: Option<&'a str>,
) -> impl ExactSizeIterator<Item = Declared<'a>> + 'a {
    let n = checks.len();
    let groups = 2 + usize::from(copies) + usize::from(receipts.is_some());
    (0..n * groups).map(move |at| {
        let (group, i) = (at / n, at % n);
        let key = checks[i].key;
        match group {
            0 => Declared::Key(key),
            1 => Declared::Block(key),
            2 if copies => Declared::Copy(key),
            // The last group, counted in `groups` only with a call id.
            _ => Declared::Receipt(key, receipts.unwrap_or_default(), i + 1),
        }
    })
}

/// The KEYS the driver is called with for `checks` (under `call_id`), as the store sends
/// them.
#[doc(hidden)] // public for the conformance test, which calls the scripts as the stores do
pub fn check_keys(checks: &[Check<'_>], call_id: Option<&str>) -> Vec<String> {
    declared(checks, keys_repeat(checks), call_id)
        .map(|k| k.to_string())
        .collect()
}

/// The KEYS the companion is called with for `checks`: a peek (`refund: None`) or a refund
/// under that call id, as the stores send them.
#[doc(hidden)] // public for the conformance test
pub fn compensate_keys(checks: &[Check<'_>], refund: Option<&str>) -> Vec<String> {
    declared(checks, false, refund)
        .map(|k| k.to_string())
        .collect()
}

/// Checks every limit of one call in one invocation of the driver: `FCALL` of the library's
/// `check` (or `EVALSHA` of the driver script with the same code, see [`invoke`]).
///
/// Generic over the connection so that any Redis deployment whose connection sends all keys of
/// the call to one node (a single server, or a cluster with hash-tagged keys) reuses it.
///
/// With a `call_id` (1 to 32 lower-case hex digits), an admitted call also leaves a receipt per
/// limit for the Redis Cluster store's refunds (see `scripts/driver.lua` and
/// `scripts/prelude.lua`).
pub(crate) async fn eval_checks<C>(
    conn: &mut C,
    calls: &Calls,
    checks: &[Check<'_>],
    call_id: Option<&str>,
) -> Result<Verdict, StoreError>
where
    C: ScriptConnection,
{
    let Some(first) = checks.first() else {
        return Ok(Verdict::new(Vec::new()));
    };
    let script = SCRIPTS.for_checks(checks);
    // The command is built directly, each argument written once into the command's buffer (a
    // `ScriptInvocation` would first copy every key and argument into vectors of its own, then
    // again into the command): numkeys keys… args….
    // The working copies only when a key repeats: most calls have no use for them.
    let copies = keys_repeat(checks);
    let args = |cmd: &mut redis::Cmd| {
        let keys = declared(checks, copies, call_id);
        cmd.arg(keys.len());
        for key in keys {
            cmd.arg(key);
        }
        limit_args(cmd, checks);
        if let Some(id) = call_id {
            cmd.arg(id);
        }
    };
    let function = script_sources().check_function;
    let reply = invoke(conn, calls, function, script, first.key, args).await?;
    parse_reply(&reply, checks)
}

/// The 5 arguments of each limit, in the scripts' order (see the prelude): algorithm code,
/// limit, period in µs, burst, cost.
fn limit_args(cmd: &mut redis::Cmd, checks: &[Check<'_>]) {
    for check in checks {
        let p = check.policy;
        cmd.arg(p.algorithm().code())
            .arg(p.limit())
            .arg(p.period_ms().saturating_mul(1000))
            .arg(p.burst())
            .arg(p.cost());
    }
}

/// The companion script (the prelude, every algorithm and `refund.lua`): its `peek` mode reads
/// limits without taking anything ([`Store::peek`]), its `refund` mode gives back by receipt
/// (the refunds of outcome-filtered calls, `count = …`, and of the cluster's cross-slot calls).
/// Run as the library's `compensate` function where the server has Functions.
pub(crate) static COMPANION: LazyLock<Script> =
    LazyLock::new(|| Script::new(script_sources().companion));

/// What the companion script does.
pub(crate) enum Mode<'a> {
    /// Read only ([`Store::peek`], and the limits of a rejected cross-slot call that were
    /// never checked).
    Peek,
    /// Give back what the take under this call id still holds (its receipts), then read: the
    /// refunds of outcome-filtered calls (`count = …`) and of the cluster's cross-slot calls.
    Refund(&'a str),
}

/// Runs the companion script on `checks` (all on one node, in one slot on a cluster; loaded on
/// `NOSCRIPT`): keys in order, their block markers, then for a refund each key's receipt
/// `<key>:r:<id>:<i>` (i from 1, the driver's name for it). A receipt is read once and deleted: a second refund gives
/// back nothing. The reply reads the limits as they are after it.
pub(crate) async fn compensate<C>(
    conn: &mut C,
    calls: &Calls,
    mode: Mode<'_>,
    checks: &[Check<'_>],
) -> Result<Verdict, StoreError>
where
    C: ScriptConnection,
{
    let Some(first) = checks.first() else {
        return Ok(Verdict::new(Vec::new()));
    };
    let receipts = match mode {
        Mode::Peek => None,
        Mode::Refund(id) => Some(id),
    };
    let args = |cmd: &mut redis::Cmd| {
        let keys = declared(checks, false, receipts);
        cmd.arg(keys.len());
        for key in keys {
            cmd.arg(key);
        }
        match mode {
            Mode::Peek => cmd.arg("peek"),
            Mode::Refund(id) => cmd.arg("refund").arg(id),
        };
        limit_args(cmd, checks);
    };
    let function = script_sources().compensate_function;
    let reply = invoke(conn, calls, function, &COMPANION, first.key, args).await?;
    parse_reply(&reply, checks)
}

/// `DEL` of every receipt the take of `checks` under `call_id` left ([`Store::forget`]): one
/// command, so on a cluster only for checks in one slot (the only takes that leave receipts).
pub(crate) fn forget_cmd(checks: &[Check<'_>], call_id: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("DEL");
    for (i, check) in checks.iter().enumerate() {
        cmd.arg(Declared::Receipt(check.key, call_id, i + 1));
    }
    cmd
}

/// The block marker of a limit's key (`driver.lua` rejects every call on the key while it
/// exists): the same hash tag, so the same cluster slot.
pub(crate) fn block_key(key: &str) -> String {
    Declared::Block(key).to_string()
}

/// `DEL key key:b`: a limit's state and its block (one slot: the same hash tag).
pub(crate) fn reset_cmd(key: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("DEL");
    cmd.arg(key).arg(block_key(key));
    cmd
}

/// `SET key:b 1 PX ms`: the block marker, with the block's length as its TTL (at least 1 ms).
pub(crate) fn block_cmd(key: &str, duration: Duration) -> redis::Cmd {
    let ms = u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    let mut cmd = redis::cmd("SET");
    cmd.arg(block_key(key)).arg(1).arg("PX").arg(ms);
    cmd
}

/// Reads the script's reply: one `[admitted, remaining, reset_after_us, retry_after_us]` per
/// check. Numbers are clamped into range (a negative count is 0, `remaining` is at most the
/// capacity), so no state under a key can turn into a reply that fails the call; anything that is
/// not that shape is [`StoreError::BadReply`], an error for this call only.
#[doc(hidden)] // public for the conformance test, which reads the embedded Lua's replies with it
pub fn parse_reply(reply: &Value, checks: &[Check<'_>]) -> Result<Verdict, StoreError> {
    let bad = |what: String| StoreError::BadReply(what);
    let Value::Array(rows) = reply else {
        return Err(bad(format!("expected an array, got {reply:?}")));
    };
    if rows.len() != checks.len() {
        return Err(bad(format!(
            "expected {} decisions, got {}",
            checks.len(),
            rows.len()
        )));
    }
    let int = |v: &Value| -> Result<u64, StoreError> {
        match v {
            Value::Int(n) => Ok(u64::try_from(*n).unwrap_or(0)),
            other => Err(bad(format!("expected an integer, got {other:?}"))),
        }
    };
    let decisions = rows
        .iter()
        .zip(checks)
        .map(|(row, check)| {
            let Value::Array(fields) = row else {
                return Err(bad(format!("expected a decision array, got {row:?}")));
            };
            let [admitted, remaining, reset_us, retry_us] = fields.as_slice() else {
                return Err(bad(format!(
                    "expected 4 numbers per decision, got {}",
                    fields.len()
                )));
            };
            let admitted = match admitted {
                Value::Int(0) => false,
                Value::Int(1) => true,
                other => return Err(bad(format!("admitted must be 0 or 1, got {other:?}"))),
            };
            let limit = check.policy.capacity();
            Ok(Decision::new(
                admitted,
                limit,
                int(remaining)?.min(limit),
                Duration::from_micros(int(reset_us)?),
                Duration::from_micros(int(retry_us)?),
            ))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Verdict::new(decisions))
}

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
/// No response timeout: the limiter's own timeout ([`crate::Builder::timeout`]) bounds every check
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
                tracing::debug!(target: crate::observe::log::STORE, error = %e, "redis: INFO memory failed")
            }
            Err(_) => {
                tracing::debug!(target: crate::observe::log::STORE, "redis: INFO memory did not answer in time")
            }
        }
    });
}

/// One Redis server, one `FCALL` (or `EVALSHA`) per check (see the [module docs](self) for the
/// behaviour and the accepted URLs).
///
/// Cheap to share: wrap it in an `Arc` or hand it to [`crate::Builder::store`].
pub struct RedisStore {
    client: Option<Client>,
    manager: LazyConnection<ConnectionManager>,
    calls: Arc<Calls>,
    memory: Arc<MemoryPolicy>,
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
    /// Parses `url`, connects and loads the scripts.
    ///
    /// A malformed URL is [`ConfigError::InvalidUrl`] (the message never repeats the URL); a
    /// server that does not answer, or refuses the credentials, is [`ConfigError::Unreachable`].
    pub async fn connect(url: &str) -> Result<Self, ConfigError> {
        let client = client(url)?;
        let calls = Arc::new(Calls::default());
        let memory = Arc::new(MemoryPolicy::default());
        let manager = connect_manager(client.clone(), Arc::clone(&calls), Arc::clone(&memory))
            .await
            .map_err(|e| ConfigError::Unreachable(e.to_string()))?;
        Ok(Self {
            client: Some(client),
            manager: LazyConnection::ready(manager),
            calls,
            memory,
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

impl Store for RedisStore {
    fn check<'a>(&'a self, checks: &'a [Check<'a>]) -> StoreFuture<'a> {
        Box::pin(async move {
            let mut conn = self.manager().await?;
            let result = eval_checks(&mut conn, &self.calls, checks, None).await;
            watch_memory_policy(&conn, &self.memory, &result);
            result
        })
    }

    fn take<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> StoreFuture<'a> {
        Box::pin(async move {
            let mut conn = self.manager().await?;
            let result = eval_checks(&mut conn, &self.calls, checks, Some(call_id)).await;
            watch_memory_policy(&conn, &self.memory, &result);
            result
        })
    }

    fn refund<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> RefundFuture<'a> {
        Box::pin(async move {
            let mut conn = self.manager().await?;
            compensate(&mut conn, &self.calls, Mode::Refund(call_id), checks)
                .await
                .map(drop)
        })
    }

    fn forget<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> RefundFuture<'a> {
        Box::pin(async move {
            if checks.is_empty() {
                return Ok(());
            }
            let mut conn = self.manager().await?;
            forget_cmd(checks, call_id)
                .query_async::<()>(&mut conn)
                .await?;
            Ok(())
        })
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

    fn reset<'a>(&'a self, keys: &'a [&'a str]) -> AdminFuture<'a> {
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

    fn block<'a>(&'a self, keys: &'a [&'a str], duration: Duration) -> AdminFuture<'a> {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;

    fn policy(a: Algorithm) -> Policy {
        Policy::new(a, 5, Duration::from_secs(1)).unwrap()
    }

    #[test]
    fn malformed_replies_are_errors_and_out_of_range_numbers_are_clamped() {
        let p = policy(Algorithm::Fixed);
        let checks = [Check::new("k", &p)];
        let row = |v: Vec<Value>| Value::Array(vec![Value::Array(v)]);
        let cases = [
            Value::Nil,
            Value::Int(1),
            Value::Array(vec![]),
            row(vec![Value::Int(1), Value::Int(2), Value::Int(3)]),
            row(vec![
                Value::Int(2),
                Value::Int(2),
                Value::Int(3),
                Value::Int(0),
            ]),
            row(vec![
                Value::Int(1),
                Value::BulkString(b"2".to_vec()),
                Value::Int(3),
                Value::Int(0),
            ]),
        ];
        for case in cases {
            assert!(
                matches!(parse_reply(&case, &checks), Err(StoreError::BadReply(_))),
                "{case:?}"
            );
        }
        // Out-of-range numbers are clamped, never an error that fails the call.
        let negative = row(vec![
            Value::Int(1),
            Value::Int(-1),
            Value::Int(-3),
            Value::Int(-9),
        ]);
        let d = parse_reply(&negative, &checks).unwrap().decisions()[0];
        assert_eq!((d.remaining, d.reset_after), (0, Duration::ZERO));
        let above = row(vec![
            Value::Int(0),
            Value::Int(6),
            Value::Int(3),
            Value::Int(0),
        ]);
        let d = parse_reply(&above, &checks).unwrap().decisions()[0];
        assert_eq!((d.remaining, d.retry_after), (5, Some(Duration::ZERO)));
        let ok = row(vec![
            Value::Int(0),
            Value::Int(0),
            Value::Int(1500),
            Value::Int(700),
        ]);
        let v = parse_reply(&ok, &checks).unwrap();
        let d = v.decisions()[0];
        assert!(!d.admitted);
        assert_eq!(d.limit, 5);
        assert_eq!(d.reset_after, Duration::from_micros(1500));
        assert_eq!(d.retry_after, Some(Duration::from_micros(700)));
    }

    #[test]
    #[allow(clippy::many_single_char_names)] // one policy per algorithm, by its initial
    fn one_script_per_algorithm_the_buckets_share_one_and_one_for_mixed_calls() {
        let [f, s, l, t, g, c] = Algorithm::ALL.map(policy);
        let hash = |checks: &[Check<'_>]| SCRIPTS.for_checks(checks).get_hash().to_owned();
        let fixed = hash(&[Check::new("a", &f), Check::new("b", &f)]);
        let sliding = hash(&[Check::new("a", &s)]);
        let leaky = hash(&[Check::new("a", &l), Check::new("b", &l)]);
        let token = hash(&[Check::new("a", &t), Check::new("b", &t)]);
        let gcra = hash(&[Check::new("a", &g)]);
        let counter = hash(&[Check::new("a", &c)]);
        let mixed = hash(&[Check::new("a", &t), Check::new("b", &l)]);
        // The token and the leaky bucket are one rule (bucket.lua): one script serves both.
        assert_eq!(leaky, token);
        assert_eq!(mixed, SCRIPTS.combined.get_hash());
        let distinct: std::collections::HashSet<_> =
            [&fixed, &sliding, &token, &gcra, &counter, &mixed]
                .into_iter()
                .collect();
        assert_eq!(distinct.len(), 6, "{distinct:?}");
        // What is loaded is every script once, and each is the text `script_sources` gives.
        let loaded: Vec<&str> = SCRIPTS.all().map(Script::get_hash).collect();
        assert_eq!(loaded, [&fixed, &sliding, &token, &gcra, &counter, &mixed]);
        let texts = script_sources();
        for (a, p) in Algorithm::ALL.into_iter().zip([&f, &s, &l, &t, &g, &c]) {
            assert_eq!(
                Script::new(texts.for_algorithm(a)).get_hash(),
                hash(&[Check::new("a", p)]),
                "{a}"
            );
        }
        assert_eq!(Script::new(texts.combined).get_hash(), mixed);
        let sources: Vec<String> = SCRIPTS
            .sources
            .iter()
            .map(|s| Script::new(s).get_hash().to_owned())
            .collect();
        assert_eq!(sources, loaded);
    }

    #[test]
    fn each_script_is_the_prelude_its_algorithm_files_and_one_composer() {
        let texts = script_sources();
        for (a, text) in Algorithm::ALL.into_iter().zip(texts.single) {
            assert_eq!(
                text,
                [PRELUDE, source(a), DRIVER, EVAL_CHECK].concat(),
                "{a}"
            );
        }
        assert_eq!(texts.single[2], texts.single[3]);
        let algorithms = ALGORITHMS.concat();
        assert_eq!(
            texts.combined,
            [PRELUDE, &algorithms, DRIVER, EVAL_CHECK].concat()
        );
        assert_eq!(
            texts.companion,
            [PRELUDE, &algorithms, REFUND, EVAL_COMPENSATE].concat()
        );
        // The library: the same files once each, named by the hash of that code, registering
        // the two composers' functions under names of its own.
        let code = [PRELUDE, &algorithms, DRIVER, REFUND].concat();
        let name = format!("ratelimit_{}", &Script::new(&code).get_hash()[..16]);
        assert_eq!(texts.library_name, name);
        assert_eq!(texts.check_function, format!("{name}_check"));
        assert_eq!(texts.compensate_function, format!("{name}_compensate"));
        let (shebang, rest) = texts.library.split_once('\n').unwrap();
        assert_eq!(shebang, format!("#!lua name={name}"));
        assert_eq!(
            rest,
            format!(
                "{code}redis.register_function('{name}_check', check)\n\
                 redis.register_function('{name}_compensate', compensate)\n"
            )
        );
        // Every rule file registers its codes; the composers register none.
        for (file, codes) in [
            (FIXED, &["ALGOS[1]"][..]),
            (SLIDING, &["ALGOS[2]"]),
            (BUCKET, &["ALGOS[3]", "ALGOS[4]"]),
            (GCRA, &["ALGOS[5]"]),
            (SLIDING_COUNTER, &["ALGOS[6]"]),
        ] {
            for code in codes {
                assert!(file.contains(code), "{code}");
            }
        }
        for composer in [PRELUDE, DRIVER, REFUND] {
            for code in [
                "ALGOS[1]", "ALGOS[2]", "ALGOS[3]", "ALGOS[4]", "ALGOS[5]", "ALGOS[6]",
            ] {
                assert!(!composer.contains(code), "a composer registers {code}");
            }
        }
    }

    #[test]
    fn the_engine_is_read_from_info_server() {
        let redis = "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\n";
        assert_eq!(engine_from_info(redis), ("redis".into(), "7.0.15".into()));
        let valkey =
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.1.2\r\n";
        assert_eq!(engine_from_info(valkey), ("valkey".into(), "9.1.2".into()));
        assert_eq!(
            engine_from_info("garbage"),
            ("redis".into(), "unknown".into())
        );
    }

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
