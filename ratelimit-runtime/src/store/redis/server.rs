//! What a Redis store reads of its server: the `maxmemory-policy` (`INFO memory`) and the
//! engine and version it logs (`INFO server`).

use std::sync::atomic::{AtomicBool, Ordering};

/// What the store last read of its server's `maxmemory-policy` (`INFO memory`, which answers
/// where `CONFIG` is disabled), read at connect and again after the connection dropped.
///
/// Every limit key has a TTL, so any policy but `noeviction` (`volatile-*` as well as
/// `allkeys-*`) lets a flood of minted keys evict other callers' live counters, and they start
/// again from a full quota. An evicting policy is logged once per value read (one WARN naming
/// the setting and the fix), and [`crate::limiter::Builder::require_noeviction`] makes it an error at
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

/// What a server says it is in `INFO server`: its name (`server_name`, which Valkey sends;
/// Redis sends none) and version (`valkey_version` on Valkey, which also sends the Redis
/// version it is compatible with as `redis_version`; `redis_version` on Redis). Unknown
/// fields read `unknown`.
fn engine_from_info(info: &str) -> (String, String) {
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
/// the library (`functions`), or `EVALSHA` of the scripts (no Functions, refused at connect). `info` is the
/// server's `INFO server`, `None` when it could not be read (an ACL without `INFO`). Once per
/// connect: a store connects once (a lazy one at its first check that reaches the server).
pub(crate) fn log_engine(store: &str, info: Option<&str>, functions: bool) {
    let (server, version) = info.map_or_else(
        || ("unknown".to_owned(), "unknown".to_owned()),
        engine_from_info,
    );
    let path = if functions { "FCALL" } else { "EVALSHA" };
    tracing::info!(target: crate::observe::log::STORE,
        store,
        server = %server,
        version = %version,
        path,
        "{store}: connected to {server} {version}, checks run with {path}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
