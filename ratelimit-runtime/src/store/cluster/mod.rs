//! The Redis Cluster store: the Redis store's scripts on `redis::cluster_async` (cargo feature
//! **`cluster`**).
//!
//! # Behaviour
//!
//! * **Same scripts, same keys.** Every check runs the code of [`super::RedisStore`] (`FCALL`
//!   of its Functions library, loaded on every master at connect; a master that answers that
//!   the function is missing, after a restart, a `FUNCTION FLUSH` or as a new node, gets it
//!   then and the call is repeated; `EVALSHA` on servers without Functions; time from the
//!   server's `TIME`). Keys are
//!   `<prefix>:{<scope>:<identity>}:<suffix>`: the braces are a hash tag, so every limit of one
//!   caller in one scope lands in one slot.
//! * **Redirections and failover are the client's job.** The cluster client keeps the slot map,
//!   follows `MOVED`/`ASK`, waits out `TRYAGAIN`/`CLUSTERDOWN`, and refreshes the topology when
//!   a node fails or a replica is promoted; it retries a few times with a short backoff (tens to
//!   hundreds of milliseconds). The limiter's timeout bounds each check on top of that, and its
//!   failure policy decides while a failover is under way. The client also sends a command
//!   again when its answer takes longer than the 1 s response timeout, although the first one
//!   may have run: a check answered that slowly can be counted twice. That errs on the safe
//!   side (a caller loses a unit; no limit admits more than its quota); refunds are immune to
//!   it (see below).
//! * **Stacked limits in one slot: atomic.** The limits of one call are grouped by slot. One
//!   slot (the usual case: several limits of one scope) is one script and one round trip, all
//!   or nothing, exactly as on a single server.
//! * **Stacked limits across slots: compensated.** Limits of one call in different slots (for
//!   instance a per-IP limit and a global one) cannot share a script. Each slot's group is
//!   checked in turn, in the order the limits were given; when a group rejects, the groups
//!   checked before it, which admitted and took their units, get them back (a refund script),
//!   and the groups after it are only read. No limit ever admits more than its quota, but
//!   the call is not atomic: between a take and its refund (one round trip), a concurrent
//!   call may see the limit lower than it will be and be rejected.
//!
//!   Every cross-slot call has an id of its own (random per process, plus a counter). A take
//!   under that id (every group but the last, which is never refunded) leaves a receipt next
//!   to each key it admitted (same hash tag, so same slot): the server's time at the take, the
//!   limit's `reset_after`, and for a sliding log the score of the call's first entry. A
//!   refund reads and deletes the receipt and is judged by the server's time alone (no delay
//!   measured on the client):
//!   * it is **idempotent**: a refund delivered twice (the cluster client retries a script
//!     after a timeout even when the first attempt ran) finds no receipt the second time and
//!     gives back nothing; a refund after its receipt expired gives back nothing either;
//!   * it gives back **at most what the call still holds**: to a fixed window only while the
//!     call's window is still the key's (and not within 2 ms of its end), to a sliding log
//!     exactly the call's own entries (never another caller's, nothing once they expired), to
//!     a bucket the part of the call's units that has not drained or refilled since the take.
//!     A refund that arrives late gives back less, never more.
//!
//!   The details are in `src/scripts/refund.lua` and each algorithm's `refund` (`fixed.lua`,
//!   `sliding.lua`, `bucket.lua`). Refunded at once, as usual, a fixed window or a sliding log
//!   gets back exactly what the call took, and a bucket all of it but at most the drain or
//!   refill of the round trip (which the rejected call holds for as long as that round trip
//!   took). The receipts of an admitted call stay until they expire (their
//!   TTL is the limit's `reset_after`, at most about a period): one small key per limit of
//!   each group but the last. Calls whose limits all share one slot leave none. A store
//!   error in a later group leaves what earlier groups took (the failure policy decides about
//!   the call; the error never makes a limit admit more). The takes and refunds run in a task
//!   of their own, so a check that the limiter's timeout gives up on still finishes its
//!   refunds.
//!
//! # Configuration
//!
//! Seed nodes are `redis://` URLs (`rediss://` with the `tls` feature), with the username and
//! password of the cluster when it needs them; the client discovers the other nodes. In the
//! environment, [`NODES_ENV`] (`RATELIMIT_REDIS_CLUSTER_NODES`) holds them comma-separated.
//!
//! ```no_run
//! # async fn demo() -> Result<(), ratelimit_runtime::ConfigError> {
//! use ratelimit_runtime::{RateLimiter, RedisClusterStore};
//!
//! let store = RedisClusterStore::connect([
//!     "redis://10.0.0.1:6379",
//!     "redis://10.0.0.2:6379",
//!     "redis://10.0.0.3:6379",
//! ])
//! .await?;
//! let limiter = RateLimiter::builder().store(store).build().await?;
//! limiter.install()?;
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;

use self::acknowledge::eval_checks_replicated;
use self::connect::{cluster_client, connect_cluster};
use self::slots::{check_across_slots, collect, fill, group_by_slot, one_slot};
use super::lazy::{LazyConnection, within_attempt_limit};
use super::redis::invoke::{Calls, Mode, compensate, eval_checks};
use super::redis::server::MemoryPolicy;
use super::redis::wire::{block_cmd, extend_block_cmd, forget_pipe, reset_cmd};
use super::{Check, Store, StoreFuture};
use crate::decision::{Decision, Verdict};
use crate::error::{ConfigError, StoreError};
use crate::policy::Policy;

mod acknowledge;
mod connect;
mod slots;

pub use self::connect::{NODES_ENV, split_nodes};

/// A Redis Cluster (see the [module docs](self) for the behaviour and how stacked limits in
/// different slots are handled).
///
/// Cheap to share: wrap it in an `Arc` or hand it to [`crate::limiter::Builder::store`].
pub struct RedisClusterStore {
    client: ClusterClient,
    conn: LazyConnection<ClusterConnection>,
    calls: Arc<Calls>,
    memory: Arc<MemoryPolicy>,
}

impl fmt::Debug for RedisClusterStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The client holds the password: never print it.
        f.debug_struct("RedisClusterStore")
            .field("connected", &self.conn.is_connected())
            .finish_non_exhaustive()
    }
}

impl RedisClusterStore {
    /// Checks the seed nodes, connects to the cluster and loads the library on every master
    /// (or, where Functions are refused, the scripts on every node).
    ///
    /// A malformed URL (or none at all) is [`ConfigError::InvalidUrl`] (the message never
    /// repeats the URL); a cluster that does not answer, or has not within 10 s, is
    /// [`ConfigError::Unreachable`].
    pub async fn connect<I, S>(nodes: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let client = cluster_client(nodes)?;
        let calls = Arc::new(Calls::default());
        let memory = Arc::new(MemoryPolicy::default());
        let conn = within_attempt_limit(connect_cluster(&client, &calls, &memory))
            .await
            .map_err(|e| ConfigError::Unreachable(e.to_string()))?;
        Ok(Self {
            client,
            conn: LazyConnection::ready(conn),
            calls,
            memory,
        })
    }

    /// Checks the seed nodes and returns at once; the store connects at its first check. A
    /// failed connection fails that check (the limiter's failure policy decides) and is tried
    /// again by the next one.
    ///
    /// ```
    /// use ratelimit_runtime::RedisClusterStore;
    /// assert!(RedisClusterStore::lazy(["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]).is_ok());
    /// assert!(RedisClusterStore::lazy(["127.0.0.1:7000"]).is_err());
    /// assert!(RedisClusterStore::lazy(Vec::<String>::new()).is_err());
    /// ```
    pub fn lazy<I, S>(nodes: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(Self {
            client: cluster_client(nodes)?,
            conn: LazyConnection::new(),
            calls: Arc::new(Calls::default()),
            memory: Arc::new(MemoryPolicy::default()),
        })
    }

    /// A lazy store on the seed nodes listed in [`NODES_ENV`], or `None` when it is unset or
    /// blank; an error when it is set but not UTF-8.
    ///
    /// ```
    /// use ratelimit_runtime::RedisClusterStore;
    /// if let Some(store) = RedisClusterStore::from_env() {
    ///     let store = store?; // a malformed list is an error, never a panic
    ///     # let _ = store;
    /// }
    /// # Ok::<(), ratelimit_runtime::ConfigError>(())
    /// ```
    pub fn from_env() -> Option<Result<Self, ConfigError>> {
        let list = match crate::store::env::var(NODES_ENV) {
            Ok(list) => list?,
            Err(unreadable) => return Some(Err(unreadable.into())),
        };
        let nodes = split_nodes(&list);
        if nodes.is_empty() {
            return None;
        }
        Some(Self::lazy(nodes))
    }

    async fn connection(&self) -> Result<ClusterConnection, StoreError> {
        let client = self.client.clone();
        let calls = Arc::clone(&self.calls);
        let memory = Arc::clone(&self.memory);
        self.conn
            .get(|| async move { connect_cluster(&client, &calls, &memory).await })
            .await
    }

    /// Test hook: takes `checks` (all in one slot) as one group of a cross-slot call under
    /// `call_id` (1 to 32 lower-case hex digits) does, receipts included. Not part of the API.
    #[doc(hidden)]
    pub async fn take_with_receipts(
        &self,
        checks: &[Check<'_>],
        call_id: &str,
    ) -> Result<Verdict, StoreError> {
        one_slot(checks)?;
        let mut conn = self.connection().await?;
        eval_checks(&mut conn, &self.calls, checks, Some(call_id), None).await
    }

    /// Test hook: the refund a rejected cross-slot call sends for a group it took under
    /// `call_id` (see [`Self::take_with_receipts`]); the reply reads the limits as they are
    /// after it. Not part of the API.
    #[doc(hidden)]
    pub async fn refund_receipts(
        &self,
        checks: &[Check<'_>],
        call_id: &str,
    ) -> Result<Verdict, StoreError> {
        one_slot(checks)?;
        let mut conn = self.connection().await?;
        compensate(&mut conn, &self.calls, Mode::Refund(call_id), checks).await
    }
}

impl RedisClusterStore {
    /// A take under `call_id`, its receipts (a call in one slot's) kept at most `keep`
    /// (`None`: the longest).
    async fn take_keeping(
        &self,
        checks: &[Check<'_>],
        call_id: &str,
        keep: Option<Duration>,
    ) -> Result<Verdict, StoreError> {
        let mut conn = self.connection().await?;
        let groups = group_by_slot(checks);
        if groups.len() > 1 {
            let across = across_slots(conn, &self.calls, checks, groups, Some(call_id), None);
            return Ok(across.await?.0);
        }
        eval_checks(&mut conn, &self.calls, checks, Some(call_id), keep).await
    }
}

/// A check or take whose limits fall in several slots. A take in one slot and its refund in
/// another are separate round trips: they run in a task of their own, so that the limiter's
/// timeout (which drops this future) cannot stop a refund half way and leave a rejected call
/// holding quota. `call_id` (a take's) names the call's concurrency leases; with
/// `replica_wait`, whether a replica acknowledged the writes comes with the verdict
/// ([`check_across_slots`]).
async fn across_slots(
    mut conn: ClusterConnection,
    calls: &Arc<Calls>,
    checks: &[Check<'_>],
    groups: Vec<Vec<usize>>,
    call_id: Option<&str>,
    replica_wait: Option<Duration>,
) -> Result<(Verdict, bool), StoreError> {
    let owned: Vec<(String, Policy, String)> = checks
        .iter()
        .map(|c| (c.key.to_owned(), *c.policy, c.scope.to_owned()))
        .collect();
    let calls = Arc::clone(calls);
    let call_id = call_id.map(str::to_owned);
    let task = tokio::spawn(async move {
        let checks: Vec<Check<'_>> = owned
            .iter()
            .map(|(key, policy, scope)| Check::new(key, policy).with_scope(scope))
            .collect();
        let id = call_id.as_deref();
        check_across_slots(&mut conn, &calls, &checks, &groups, id, replica_wait).await
    });
    task.await
        .map_err(|e| StoreError::connection(format!("the cross-slot check task failed: {e}")))?
}

impl Store for RedisClusterStore {
    fn check<'a>(&'a self, checks: &'a [Check<'a>]) -> StoreFuture<'a> {
        Box::pin(async move {
            let mut conn = self.connection().await?;
            let groups = group_by_slot(checks);
            if groups.len() <= 1 {
                return eval_checks(&mut conn, &self.calls, checks, None, None).await;
            }
            Ok(across_slots(conn, &self.calls, checks, groups, None, None)
                .await?
                .0)
        })
    }

    /// Receipts are left only when every limit of the call is in one slot (the usual case:
    /// the limits of one scope share a hash tag); a call across slots is taken without them
    /// and stays counted whatever its outcome. Its concurrency limits' leases are named by
    /// `call_id` all the same, so that [`Store::forget`] releases them.
    fn take<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> StoreFuture<'a> {
        Box::pin(self.take_keeping(checks, call_id, None))
    }

    /// As [`Store::take`] (receipts only for a call in one slot), those receipts kept at most
    /// `keep`.
    fn take_briefly<'a>(
        &'a self,
        checks: &'a [Check<'a>],
        call_id: &'a str,
        keep: Duration,
    ) -> StoreFuture<'a> {
        Box::pin(self.take_keeping(checks, call_id, Some(keep)))
    }

    fn refund<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            if checks.is_empty() || group_by_slot(checks).len() > 1 {
                return Ok(());
            }
            let mut conn = self.connection().await?;
            compensate(&mut conn, &self.calls, Mode::Refund(call_id), checks)
                .await
                .map(drop)
        })
    }

    /// One settle per slot of the call: a call within one slot (the usual case) settles by
    /// its receipts; a call across slots left none, so its limits get their excess charged
    /// and give nothing back (it fails closed).
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
            let mut conn = self.connection().await?;
            for group in group_by_slot(checks) {
                let group_checks: Vec<Check<'_>> = group.iter().map(|&i| checks[i]).collect();
                let group_actual: Vec<u64> = group.iter().map(|&i| actual[i]).collect();
                compensate(
                    &mut conn,
                    &self.calls,
                    Mode::Settle(call_id, &group_actual),
                    &group_checks,
                )
                .await?;
            }
            Ok(())
        })
    }

    fn forget<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let holds = checks
                .iter()
                .any(|c| c.policy.algorithm() == crate::algorithm::Algorithm::Concurrency);
            let groups = group_by_slot(checks);
            // A take across slots left no receipts (see `take`), only leases to release.
            if checks.is_empty() || (groups.len() > 1 && !holds) {
                return Ok(());
            }
            let mut conn = self.connection().await?;
            for group in &groups {
                let sub: Vec<Check<'_>> = group.iter().map(|&i| checks[i]).collect();
                forget_pipe(&sub, call_id)
                    .query_async::<()>(&mut conn)
                    .await?;
            }
            Ok(())
        })
    }

    /// Each slot's take, then, when it admitted, `WAIT 1 <wait>` on the connection it ran on
    /// (see [`Store::take_replicated`] and `eval_checks_replicated`); a take across slots
    /// keeps receipts as [`Store::take`] does.
    fn take_replicated<'a>(
        &'a self,
        checks: &'a [Check<'a>],
        call_id: &'a str,
        wait: Duration,
    ) -> StoreFuture<'a, (Verdict, bool)> {
        Box::pin(async move {
            let mut conn = self.connection().await?;
            let groups = group_by_slot(checks);
            if groups.len() > 1 {
                let id = Some(call_id);
                return across_slots(conn, &self.calls, checks, groups, id, Some(wait)).await;
            }
            eval_checks_replicated(&mut conn, &self.calls, checks, Some(call_id), wait).await
        })
    }

    fn is_connecting(&self) -> bool {
        self.conn.is_connecting()
    }

    fn name(&self) -> &'static str {
        "redis-cluster"
    }

    fn maxmemory_policy(&self) -> Option<String> {
        self.memory.get()
    }

    fn peek<'a>(&'a self, checks: &'a [Check<'a>]) -> StoreFuture<'a> {
        Box::pin(async move {
            let mut conn = self.connection().await?;
            let mut decisions: Vec<Option<Decision>> = vec![None; checks.len()];
            // One read per slot (a script touches one slot).
            for group in group_by_slot(checks) {
                let sub: Vec<Check<'_>> = group.iter().map(|&i| checks[i]).collect();
                let verdict = compensate(&mut conn, &self.calls, Mode::Peek, &sub).await?;
                fill(&mut decisions, &group, verdict.decisions());
            }
            collect(decisions)
        })
    }

    fn reset<'a>(&'a self, keys: &'a [&'a str]) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let mut conn = self.connection().await?;
            for key in keys {
                reset_cmd(key).query_async::<()>(&mut conn).await?;
            }
            Ok(())
        })
    }

    fn block<'a>(&'a self, keys: &'a [&'a str], duration: Duration) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let mut conn = self.connection().await?;
            for key in keys {
                block_cmd(key, duration)
                    .query_async::<()>(&mut conn)
                    .await?;
            }
            Ok(())
        })
    }

    fn extend_block<'a>(&'a self, keys: &'a [&'a str], duration: Duration) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let mut conn = self.connection().await?;
            for key in keys {
                extend_block_cmd(key, duration)
                    .query_async::<()>(&mut conn)
                    .await?;
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_node_errors_are_clear_and_never_echo_the_password() {
        for bad in [
            "",
            "   ",
            "10.0.0.1:7000",
            "http://x:7000",
            "redis://:hunter2@[::1",
        ] {
            let e = RedisClusterStore::lazy([bad]).unwrap_err();
            assert!(matches!(e, ConfigError::InvalidUrl(_)), "{bad}: {e}");
            assert!(!e.to_string().contains("hunter2"), "{e}");
        }
        assert!(RedisClusterStore::lazy(["redis://a:1", "bad"]).is_err());
        assert!(RedisClusterStore::lazy(Vec::<&str>::new()).is_err());
        let store = RedisClusterStore::lazy(["redis://user:hunter2@127.0.0.1:7000"]).unwrap();
        assert!(!format!("{store:?}").contains("hunter2"));
        assert_eq!(store.name(), "redis-cluster");
    }
}
