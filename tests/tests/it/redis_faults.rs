//! Faults of a real `redis-server` that a client can cause or that strike mid-call:
//! a server at its `maxmemory` (`noeviction`: writes refused; an evicting policy: other
//! callers' counters evicted), and a `FUNCTION FLUSH` racing the library's reload. Each test
//! starts its own server.

use std::sync::Arc;
use std::time::Duration;

use ratelimit_runtime::{
    Algorithm, ConfigError, FailurePolicy, Policy, RateLimiter, RedisStore, Store, StoreError,
    store::Check,
};
use ratelimit_tests::redis_server::RedisServer;
use ratelimit_tests::suite;
use redis::aio::MultiplexedConnection;
use tokio::task::JoinSet;

const POLICIES: [FailurePolicy; 3] = [
    FailurePolicy::Allow,
    FailurePolicy::Deny,
    FailurePolicy::Local,
];

/// The WARN events so far that name `policy` as the server's `maxmemory-policy`, each as its
/// message and fields on one line.
fn eviction_warnings(policy: &str) -> Vec<String> {
    ratelimit_tests::logs::events()
        .into_iter()
        .filter(|e| e.level == tracing::Level::WARN && e.field("maxmemory_policy") == Some(policy))
        .map(|e| format!("{} {:?}", e.message, e.fields))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Helpers.

async fn config_set(conn: &mut MultiplexedConnection, name: &str, value: &str) {
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("CONFIG SET {name} {value}: {e}"));
}

async fn limiter(store: RedisStore, failure: FailurePolicy) -> RateLimiter {
    RateLimiter::builder()
        .store(store)
        .failure_policy(failure)
        .timeout(Duration::from_secs(2))
        .blocked_cache(0)
        .build()
        .await
        .unwrap()
}

/// A limit key as `#[rate_limit(num = 5, time = 3600, key = …)]` writes it, for caller `who`.
fn key(scope: &str, who: &str, policy: &Policy) -> String {
    ratelimit_runtime::key::build(
        "ratelimit",
        scope,
        &[ratelimit_runtime::key::Part::new(
            ratelimit_runtime::key::Source::Key,
            who.as_bytes(),
        )],
        policy,
    )
}

/// What `calls` checks of `key` got: (admitted, refused by the store's failure, limited).
async fn tally(limiter: &RateLimiter, key: &str, policy: &Policy, calls: usize) -> [usize; 3] {
    let mut out = [0; 3];
    for _ in 0..calls {
        match limiter.check(&[Check::new(key, policy)]).await {
            Ok(v) if v.is_admitted() => out[0] += 1,
            Ok(_) => out[2] += 1,
            Err(e) => {
                assert!(e.cannot_record(), "a refusal other than a full store: {e}");
                out[1] += 1;
            }
        }
    }
    out
}

/// `count` keys minted by a client (one call each, 256 at a time), as a header or an IPv6 /64
/// lets it: (admitted, refused because the server is out of memory).
async fn flood(
    store: &Arc<RedisStore>,
    scope: &str,
    policy: &Policy,
    count: usize,
) -> (usize, usize) {
    let (mut admitted, mut oom) = (0, 0);
    for chunk in (0..count).collect::<Vec<_>>().chunks(256) {
        let mut set = JoinSet::new();
        for i in chunk {
            let store = Arc::clone(store);
            let key = key(scope, &format!("minted{i}"), policy);
            let policy = *policy;
            set.spawn(async move { store.check(&[Check::new(&key, &policy)]).await });
        }
        while let Some(r) = set.join_next().await {
            match r.unwrap() {
                Ok(v) => admitted += usize::from(v.is_admitted()),
                Err(e) if e.is_out_of_memory() => oom += 1,
                Err(e) => panic!("flood: {e}"),
            }
        }
    }
    (admitted, oom)
}

// ---------------------------------------------------------------------------------------------
// Point 1: a Redis out of memory.

/// A Redis at its `maxmemory` under `noeviction` refuses writes. A call it would admit is
/// refused under every failure policy (it was admitted uncounted under `allow`: 10 of 10 for a
/// caller at 2 of 5 and 10 of 10 for a fresh one; `local` counted it in process only), while a
/// caller over the quota is still answered `Limited` by the server (a rejection writes
/// nothing) and the breaker stays closed. The error is `OutOfMemory` whether the server refused
/// a whole `FCALL` or a script's first write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_out_of_memory_refuses_what_it_cannot_count_under_every_failure_policy() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let mut admin = server.connection().await;
    for algorithm in Algorithm::ALL {
        let policy = Policy::new(algorithm, 5, suite::HOUR).unwrap();
        let scope = format!("app::oom_{algorithm}");
        let mut limiters = Vec::new();
        for failure in POLICIES {
            let limiter = limiter(server.store().await, failure).await;
            let (two, spent) = (
                key(&scope, &format!("two_{failure:?}"), &policy),
                key(&scope, &format!("spent_{failure:?}"), &policy),
            );
            assert_eq!(tally(&limiter, &two, &policy, 2).await, [2, 0, 0]);
            assert_eq!(tally(&limiter, &spent, &policy, 5).await, [5, 0, 0]);
            limiters.push((failure, limiter, two, spent));
        }
        // Less than the server already uses: every command that may write is refused.
        config_set(&mut admin, "maxmemory", "1").await;
        for (failure, limiter, two, spent) in &limiters {
            let fresh = key(&scope, &format!("fresh_{failure:?}"), &policy);
            let two = tally(limiter, two, &policy, 10).await;
            let fresh = tally(limiter, &fresh, &policy, 10).await;
            let spent = tally(limiter, spent, &policy, 10).await;
            println!(
                "{algorithm} {failure:?}: caller at 2 of 5 {two:?}, fresh {fresh:?}, spent {spent:?} (admitted, refused, limited)"
            );
            // Nothing the server cannot count is admitted. (Redis lets a script's later writes
            // through once one write ran, so every script's first write is one it refuses for
            // memory: the sliding log adds before it trims, else it grew past maxmemory.)
            assert_eq!(two, [0, 10, 0], "{algorithm} {failure:?}: caller at 2 of 5");
            assert_eq!(fresh, [0, 10, 0], "{algorithm} {failure:?}: fresh caller");
            assert_eq!(
                spent,
                [0, 0, 10],
                "{algorithm} {failure:?}: a spent caller is still limited by the server"
            );
            assert!(!limiter.store_failing(), "{failure:?}: the breaker opened");
        }
        // The same classification for the two shapes of the answer: a whole FCALL refused,
        // and a script failing at its first write.
        {
            let store = server.store().await;
            let fresh = key(&scope, "fresh_direct", &policy);
            let e = store
                .check(&[Check::new(&fresh, &policy)])
                .await
                .unwrap_err();
            assert!(
                e.is_out_of_memory() && e.cannot_record() && !e.is_transport(),
                "{e:?}"
            );
            let mut conn = server.connection().await;
            // The store loaded the library only (on a server with Functions): the script is
            // loaded here, as a store falling back to it would (Redis runs `SCRIPT LOAD` at
            // its maxmemory).
            let script = redis::Script::new(
                ratelimit_runtime::store::redis::script_sources().for_algorithm(algorithm),
            );
            let _: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(ratelimit_runtime::store::redis::script_sources().for_algorithm(algorithm))
                .query_async(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("SCRIPT LOAD at maxmemory: {e}"));
            let refused: redis::RedisResult<redis::Value> = redis::cmd("EVALSHA")
                .arg(script.get_hash())
                // The key and its block marker: every key a script touches is declared.
                .arg(2)
                .arg(&fresh)
                .arg(format!("{fresh}:b"))
                // The limit's one argument: code, limit, period µs, burst, cost.
                .arg(format!(
                    "{}:5:3600000000:{}:1",
                    Algorithm::ALL.iter().position(|a| *a == algorithm).unwrap() + 1,
                    policy.burst()
                ))
                .query_async(&mut conn)
                .await;
            let e = StoreError::from(refused.unwrap_err());
            assert!(e.is_out_of_memory(), "EVALSHA's first write: {e:?}");
        }
        config_set(&mut admin, "maxmemory", "0").await;
        for (failure, limiter, two, _) in &limiters {
            assert_eq!(
                tally(limiter, two, &policy, 5).await,
                [3, 0, 2],
                "{algorithm} {failure:?}: memory back, the caller at 2 of 5 gets the rest of 3"
            );
        }
    }
}

/// An evicting `maxmemory-policy` is one WARN at connect naming the setting and the fix (and
/// again after a reconnect that finds another evicting value); `require_noeviction(true)` makes
/// it a `ConfigError` at build, passes on `noeviction`, and refuses a store that has not read
/// the policy (a lazy one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_maxmemory_policy_is_warned_about_and_can_be_refused_at_build() {
    ratelimit_tests::logs::capture();
    let server = RedisServer::start_with(&["--maxmemory-policy", "volatile-lru"]);
    let store = server.store().await;
    assert_eq!(store.maxmemory_policy().as_deref(), Some("volatile-lru"));
    let warnings = eviction_warnings("volatile-lru");
    assert!(!warnings.is_empty(), "no WARN for volatile-lru");
    println!("{}", warnings[0]);
    assert!(warnings[0].contains("maxmemory-policy") && warnings[0].contains("noeviction"));
    let refused = RateLimiter::builder()
        .redis_url(server.url())
        .require_noeviction(true)
        .build()
        .await;
    let Err(ConfigError::Invalid(message)) = refused else {
        panic!("built on volatile-lru: {refused:?}");
    };
    println!("{message}");
    assert!(message.contains("maxmemory-policy `volatile-lru`") && message.contains("noeviction"));
    let lazy = RateLimiter::builder()
        .store(RedisStore::lazy(&server.url()).unwrap())
        .require_noeviction(true)
        .build_lazy();
    assert!(matches!(lazy, Err(ConfigError::Invalid(_))), "{lazy:?}");
    // The memory store has no such setting.
    assert!(
        RateLimiter::builder()
            .require_noeviction(true)
            .build()
            .await
            .is_ok()
    );

    // After a reconnect, the policy is read again.
    let mut admin = server.connection().await;
    config_set(&mut admin, "maxmemory-policy", "allkeys-lfu").await;
    ratelimit_tests::redis_server::kill_other_clients(&mut admin)
        .await
        .unwrap();
    let policy = Policy::new(Algorithm::Fixed, 5, suite::HOUR).unwrap();
    let k = key("app::evict", "reconnect", &policy);
    let mut read = None;
    for _ in 0..100 {
        let _ = store.check(&[Check::new(&k, &policy)]).await;
        read = store.maxmemory_policy();
        if read.as_deref() == Some("allkeys-lfu") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        read.as_deref(),
        Some("allkeys-lfu"),
        "not read again after the reconnect"
    );
    assert!(!eviction_warnings("allkeys-lfu").is_empty());

    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let built = RateLimiter::builder()
        .redis_url(server.url())
        .require_noeviction(true)
        .build()
        .await;
    assert!(built.is_ok(), "{:?}", built.err());
    assert!(eviction_warnings("noeviction").is_empty());
}

/// The hostile-fault run: `maxmemory 2mb`, a client mints 30,000 keys, then a
/// caller who had used 2 of 5 before the flood and a fresh caller try 10 calls each, under each
/// failure policy. Under `noeviction` every policy holds the quota: the caller at 2 of 5 gets
/// at most 3 more, the fresh one at most 5 (both are refused while the server is full; under
/// `allow` they were admitted 10 of 10). Under `volatile-lru` the flood evicts live counters
/// (a limit key's TTL makes it evictable): the figures are printed, the WARN is the guard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_fault_run_a_flood_of_minted_keys_against_a_2mb_redis() {
    ratelimit_tests::logs::capture();
    let policy = Policy::new(Algorithm::Fixed, 5, suite::HOUR).unwrap();
    for eviction in ["noeviction", "volatile-lru"] {
        let server =
            RedisServer::start_with(&["--maxmemory", "2mb", "--maxmemory-policy", eviction]);
        let scope = "app::hostile";
        let mut limiters = Vec::new();
        for failure in POLICIES {
            let limiter = limiter(server.store().await, failure).await;
            let two = key(scope, &format!("two_{failure:?}"), &policy);
            assert_eq!(tally(&limiter, &two, &policy, 2).await, [2, 0, 0]);
            limiters.push((failure, limiter, two));
        }
        let store = Arc::new(server.store().await);
        let (admitted, oom) = flood(&store, scope, &policy, 30_000).await;
        println!(
            "{eviction}: the flood's 30000 keys: {admitted} admitted, {oom} refused (out of memory)"
        );
        for (failure, limiter, two) in &limiters {
            let fresh = key(scope, &format!("fresh_{failure:?}"), &policy);
            let two = tally(limiter, two, &policy, 10).await;
            let fresh = tally(limiter, &fresh, &policy, 10).await;
            println!(
                "{eviction} {failure:?}: caller at 2 of 5 got {} more ({} refused, {} limited); fresh caller {} ({} refused, {} limited)",
                two[0], two[1], two[2], fresh[0], fresh[1], fresh[2]
            );
            assert!(
                fresh[0] <= 5,
                "{eviction} {failure:?}: fresh caller {fresh:?}"
            );
            if eviction == "noeviction" {
                assert!(
                    two[0] <= 3,
                    "{eviction} {failure:?}: caller at 2 of 5 {two:?}"
                );
                assert!(!limiter.store_failing());
            }
        }
        if eviction != "noeviction" {
            let warnings = eviction_warnings(eviction);
            assert!(!warnings.is_empty());
            println!("{}", warnings[0]);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Point 8: FUNCTION FLUSH racing the reload.

/// A loop of `FUNCTION FLUSH` while calls run against a limit of 10 an hour under `allow`: a
/// call whose reloaded library is gone again runs as the script (`EVALSHA`), never as the
/// failure policy, so at most 10 are admitted (1,889 in 4 s before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_flush_loop_never_hands_calls_to_the_failure_policy() {
    let server = RedisServer::start();
    let limiter = limiter(server.store().await, FailurePolicy::Allow).await;
    let policy = Policy::new(Algorithm::Fixed, 10, suite::HOUR).unwrap();
    let k = key("app::flush", "caller", &policy);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut admin = server.connection().await;
    let flushing = {
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            let mut flushes = 0_u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let () = redis::cmd("FUNCTION")
                    .arg("FLUSH")
                    .query_async(&mut admin)
                    .await
                    .unwrap();
                flushes += 1;
            }
            flushes
        })
    };
    let (mut admitted, mut calls) = (0, 0);
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        if let Ok(v) = limiter.check(&[Check::new(&k, &policy)]).await {
            admitted += usize::from(v.is_admitted());
        }
        calls += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let flushes = flushing.await.unwrap();
    println!("{calls} calls, {flushes} flushes: {admitted} admitted");
    assert!(admitted <= 10, "{admitted} admitted of 10 an hour");
}

// ---------------------------------------------------------------------------------------------
// Point 7: a stall under `deny` and `local`.

/// A server that stalls (`CLIENT PAUSE` for 2 s) under `deny` and `local` with a 50 ms
/// timeout: the calls made during the stall get the policy's answer (503, or the local
/// store's), and the ones that reached the server run when it wakes. They must not count
/// there: each was sent as a take and is refunded by receipt once the server answers, so the
/// limit key is empty afterwards and the caller has its 5 of 5 (before: the key read 3 and
/// the caller had 2 of 5, or 0 of 5 after a caller's own calls).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_refused_during_a_stall_is_not_counted_when_the_store_wakes() {
    let server = RedisServer::start();
    let policy = Policy::new(Algorithm::Fixed, 5, suite::HOUR).unwrap();
    for failure in [FailurePolicy::Deny, FailurePolicy::Local] {
        let limiter = RateLimiter::builder()
            .store(server.store().await)
            .failure_policy(failure)
            .timeout(Duration::from_millis(50))
            .blocked_cache(0)
            .build()
            .await
            .unwrap();
        let k = key("app::stall", &format!("caller_{failure:?}"), &policy);
        server.pause(Duration::from_secs(2)).await;
        let started = tokio::time::Instant::now();
        let (mut refused, mut local) = (0, 0);
        while started.elapsed() < Duration::from_millis(1800) {
            match limiter.check(&[Check::new(&k, &policy)]).await {
                Ok(v) => local += usize::from(v.is_admitted()),
                Err(_) => refused += 1,
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The server wakes at 2 s; the queued takes run, then their refunds.
        tokio::time::sleep_until(started + Duration::from_secs(3)).await;
        let mut conn = server.connection().await;
        let counter: Option<u64> = redis::cmd("GET")
            .arg(&k)
            .query_async(&mut conn)
            .await
            .unwrap();
        let after = limiter_after(&server).await;
        let got = tally(&after, &k, &policy, 10).await;
        println!(
            "{failure:?}: {refused} refused and {local} admitted locally during the stall; the counter read {counter:?} after; the caller then got {} of 5",
            got[0]
        );
        assert_eq!(
            counter.unwrap_or(0),
            0,
            "{failure:?}: refused calls were counted"
        );
        assert_eq!(got, [5, 0, 5], "{failure:?}");
    }
}

/// A limiter on its own connection, to read a key's state after a fault.
async fn limiter_after(server: &RedisServer) -> RateLimiter {
    limiter(server.store().await, FailurePolicy::Deny).await
}
