//! The Redis Cluster store against a real local cluster (3 masters + 3 replicas, started by the
//! tests): the shared scenarios for all six algorithms with keys on every master, stacked
//! limits in one slot (one atomic script) and across slots (refund compensation, also refunds
//! delivered late or twice), and a master killed under load.
//!
//! Each test starts its own cluster (a few seconds) and kills it on drop.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ratelimit_runtime::store::StoreFuture;
use ratelimit_runtime::{
    Algorithm, FailurePolicy, Policy, RateLimiter, RedisClusterStore, Store, Verdict, key,
    store::Check,
};
use ratelimit_tests::redis_cluster::{MASTERS, RedisCluster};
use ratelimit_tests::redis_server;
use ratelimit_tests::suite::{self, HOUR, Harness, policy};
use tokio::task::JoinSet;

/// A cluster store that records every key it was asked about, so the test can show where the
/// scenarios' keys live.
#[derive(Debug)]
struct Recording {
    inner: RedisClusterStore,
    keys: Arc<Mutex<BTreeSet<String>>>,
}

impl Store for Recording {
    fn check<'a>(&'a self, checks: &'a [Check<'a>]) -> StoreFuture<'a> {
        if let Ok(mut keys) = self.keys.lock() {
            keys.extend(checks.iter().map(|c| c.key.to_owned()));
        }
        self.inner.check(checks)
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }
}

struct ClusterHarness {
    stores: Vec<Arc<dyn Store>>,
    keys: Arc<Mutex<BTreeSet<String>>>,
    run: String,
}

impl ClusterHarness {
    /// Four independent cluster connections (each its own client) on the cluster.
    async fn new(cluster: &RedisCluster) -> Self {
        let keys = Arc::new(Mutex::new(BTreeSet::new()));
        let mut stores: Vec<Arc<dyn Store>> = Vec::new();
        for _ in 0..4 {
            let inner = RedisClusterStore::connect(cluster.urls())
                .await
                .unwrap_or_else(|e| panic!("cannot connect to the test cluster: {e}"));
            stores.push(Arc::new(Recording {
                inner,
                keys: Arc::clone(&keys),
            }));
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Self {
            stores,
            keys,
            run: format!("c{}-{nanos}", std::process::id()),
        }
    }
}

impl Harness for ClusterHarness {
    fn store(&self, conn: usize) -> Arc<dyn Store> {
        Arc::clone(&self.stores[conn % self.stores.len()])
    }

    fn pass(&self, d: Duration) -> impl std::future::Future<Output = ()> + Send {
        tokio::time::sleep(d)
    }

    fn unique(&self, name: &str) -> String {
        format!("{}:{name}", self.run)
    }
}

/// Keys by the port of the master that serves them (`CLUSTER KEYSLOT` + `CLUSTER NODES`).
async fn keys_by_master(cluster: &RedisCluster, keys: &[String]) -> BTreeMap<u16, Vec<String>> {
    let masters = cluster.masters().await;
    assert_eq!(masters.len(), MASTERS, "{masters:?}");
    let mut by_master: BTreeMap<u16, Vec<String>> = BTreeMap::new();
    for k in keys {
        let slot = cluster.keyslot(k).await;
        let master = masters
            .iter()
            .find(|m| m.serves(slot))
            .unwrap_or_else(|| panic!("no master serves slot {slot} of {k}"));
        by_master.entry(master.port).or_default().push(k.clone());
    }
    by_master
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suite_passes_for_every_algorithm_with_keys_on_all_three_masters() {
    let cluster = RedisCluster::start().await;
    let h = ClusterHarness::new(&cluster).await;

    let t = Instant::now();
    suite::all(&h).await;
    eprintln!("suite::all on the cluster took {:?}", t.elapsed());

    let keys: Vec<String> = h
        .keys
        .lock()
        .map(|k| k.iter().cloned().collect())
        .unwrap_or_default();
    assert!(!keys.is_empty());
    let by_master = keys_by_master(&cluster, &keys).await;
    for (port, keys) in &by_master {
        eprintln!("master {port}: {} keys, e.g. {}", keys.len(), keys[0]);
    }
    assert_eq!(
        by_master.len(),
        MASTERS,
        "the scenarios' keys must live on every master: {by_master:?}"
    );
    // The exactness scenario of every algorithm ran against the cluster; say where.
    for algo in Algorithm::ALL {
        let tag = format!("{{exactness-{algo}}}");
        assert!(
            keys.iter().any(|k| k.contains(&tag)),
            "no exactness key for {algo}"
        );
    }
}

/// `INFO commandstats` calls of one command on one node.
async fn command_calls(cluster: &RedisCluster, port: u16, command: &str) -> u64 {
    let mut conn = cluster.node(port).await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("INFO commandstats on {port}: {e}"));
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

async fn reset_stats(cluster: &RedisCluster) {
    for port in cluster.live_ports() {
        let mut conn = cluster.node(port).await;
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("CONFIG RESETSTAT on {port}: {e}"));
    }
}

/// Script calls (`FCALL` + `EVALSHA` + `EVAL`) over every node.
async fn script_calls(cluster: &RedisCluster) -> BTreeMap<u16, u64> {
    let mut out = BTreeMap::new();
    for port in cluster.live_ports() {
        let n = command_calls(cluster, port, "fcall").await
            + command_calls(cluster, port, "evalsha").await
            + command_calls(cluster, port, "eval").await;
        if n > 0 {
            out.insert(port, n);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stacked_limits_one_slot_atomic_and_across_slots_compensated() {
    let cluster = RedisCluster::start().await;
    let store = RedisClusterStore::connect(cluster.urls())
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let run = format!("s{}", std::process::id());

    // One slot: a token bucket (2 per hour) and a fixed cap per day of one caller in one scope
    // share the hash tag: one script, one round trip, on the master of that slot.
    let per_hour = policy(Algorithm::Token, 2, HOUR, 2, 1);
    let per_day = policy(Algorithm::Fixed, 3, HOUR * 24, 3, 1);
    let (ks, kd) = (
        key::build(
            &run,
            "sms",
            &[key::Part::new(key::Source::Key, b"+15550001")],
            &per_hour,
        ),
        key::build(
            &run,
            "sms",
            &[key::Part::new(key::Source::Key, b"+15550001")],
            &per_day,
        ),
    );
    let slot = cluster.keyslot(&ks).await;
    assert_eq!(slot, cluster.keyslot(&kd).await, "one caller, one slot");
    let master = cluster.master_of_slot(slot).await;
    reset_stats(&cluster).await;
    let checks = [Check::new(&ks, &per_hour), Check::new(&kd, &per_day)];
    let v = store.check(&checks).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(v.is_admitted());
    let calls = script_calls(&cluster).await;
    assert_eq!(
        calls,
        BTreeMap::from([(master.port, 1)]),
        "one script call, on the slot's master"
    );
    // All or nothing within the slot: the bucket (2) rejects the third call, which leaves the
    // daily cap untouched.
    assert!(
        store
            .check(&checks)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .is_admitted()
    );
    let v = store.check(&checks).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(!v.is_admitted());
    assert!(!v.decisions()[0].admitted);
    assert_eq!(v.decisions()[1].remaining, 1, "the daily cap kept its unit");

    // Across slots: a per-IP limit (10 per hour, every algorithm in turn) stacked with a
    // global fixed limit (3 per hour) of the same scope: two hash tags, two slots.
    for algo in Algorithm::ALL {
        cross_slot_refunds(&cluster, &store, &run, algo).await;
    }
}

/// A per-IP limit of `algo` (10 per hour) stacked with a global fixed limit (3 per hour) in
/// another slot: refunds restore remaining, peeks take nothing, a refunded new caller leaves
/// no key.
async fn cross_slot_refunds(
    cluster: &RedisCluster,
    store: &RedisClusterStore,
    run: &str,
    algo: Algorithm,
) {
    let scope = format!("api-{algo}");
    let per_ip = policy(algo, 10, HOUR, 10, 1);
    let global = policy(Algorithm::Fixed, 3, HOUR, 3, 1);
    let ki = key::build(
        run,
        &scope,
        &[key::Part::new(key::Source::Key, b"10.1.2.3")],
        &per_ip,
    );
    let kg = key::build(run, &scope, &[], &global);
    assert_ne!(
        cluster.keyslot(&ki).await,
        cluster.keyslot(&kg).await,
        "{algo}: the two limits must be in different slots"
    );
    let ip_first = [Check::new(&ki, &per_ip), Check::new(&kg, &global)];
    let global_first = [Check::new(&kg, &global), Check::new(&ki, &per_ip)];
    for n in 1..=3 {
        let v = store
            .check(&ip_first)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(v.is_admitted(), "{algo}: call {n}");
        assert_eq!(v.decisions()[0].remaining, 10 - n, "{algo}: call {n}");
        assert_eq!(v.decisions()[1].remaining, 3 - n, "{algo}: call {n}");
    }
    // The per-IP group runs first and takes a unit; the global group rejects; the refund
    // gives the unit back, and the verdict reports the per-IP limit as it is now.
    for _ in 0..3 {
        let v = store
            .check(&ip_first)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!v.is_admitted(), "{algo}");
        let (di, dg) = (v.decisions()[0], v.decisions()[1]);
        assert!(di.admitted, "{algo}: the per-IP limit admits on its own");
        assert_eq!(di.remaining, 7, "{algo}: the refund restores remaining");
        assert!(!dg.admitted && dg.retry_after.is_some(), "{algo}: {dg:?}");
        assert_eq!(v.binding(), Some(&dg));
        // The global group rejects first: the per-IP limit is only read.
        let v = store
            .check(&global_first)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!v.is_admitted(), "{algo}");
        assert_eq!(v.decisions()[1].remaining, 7, "{algo}: peeked, not taken");
        assert!(v.decisions()[1].admitted);
    }
    // Alone, the per-IP limit shows that the six rejected calls took nothing.
    let v = store
        .check(&[Check::new(&ki, &per_ip)])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(v.is_admitted());
    assert_eq!(v.decisions()[0].remaining, 6, "{algo}: per-IP alone");

    // A new caller against the spent global limit: its first call creates the per-IP key
    // (a window, a log entry, a bucket level), the refund removes it again.
    let fresh = key::build(
        run,
        &scope,
        &[key::Part::new(key::Source::Key, b"10.9.9.9")],
        &per_ip,
    );
    let v = store
        .check(&[Check::new(&fresh, &per_ip), Check::new(&kg, &global)])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!v.is_admitted(), "{algo}");
    assert_eq!(v.decisions()[0].remaining, 10, "{algo}: fresh caller");
    let owner = cluster.master_of_slot(cluster.keyslot(&fresh).await).await;
    let mut node = cluster.node(owner.port).await;
    let exists: u8 = redis::cmd("EXISTS")
        .arg(&fresh)
        .query_async(&mut node)
        .await
        .unwrap_or_else(|e| panic!("EXISTS: {e}"));
    assert_eq!(
        exists, 0,
        "{algo}: the refund left the new caller's key behind"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn across_slots_concurrent_calls_never_over_admit_and_refunds_are_exact() {
    let _saturating = ratelimit_tests::SATURATING.lock().await;
    let cluster = RedisCluster::start().await;
    let run = format!("x{}", std::process::id());
    // Four callers (one slot each, 100 per hour: never binding) and a global sliding limit of
    // 30 per hour (another slot). 200 concurrent calls over 8 connections: exactly 30 pass,
    // and every caller's limit took exactly its own admitted calls.
    let per_ip = policy(Algorithm::Fixed, 100, HOUR, 100, 1);
    let global = policy(Algorithm::Sliding, 30, HOUR, 30, 1);
    let kg: Arc<str> = key::build(&run, "upload", &[], &global).into();
    let kis: Vec<Arc<str>> = (0..4)
        .map(|i| {
            key::build(
                &run,
                "upload",
                &[key::Part::new(
                    key::Source::Key,
                    format!("10.0.0.{i}").as_bytes(),
                )],
                &per_ip,
            )
            .into()
        })
        .collect();
    let mut stores = Vec::new();
    for _ in 0..8 {
        stores.push(Arc::new(
            RedisClusterStore::connect(cluster.urls())
                .await
                .unwrap_or_else(|e| panic!("connect: {e}")),
        ));
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(200));
    let mut tasks = JoinSet::new();
    for n in 0..200usize {
        let store = Arc::clone(&stores[n % stores.len()]);
        let (kg, ki) = (Arc::clone(&kg), Arc::clone(&kis[n % kis.len()]));
        let barrier = Arc::clone(&barrier);
        tasks.spawn(async move {
            let (ip, g) = (Check::new(&ki, &per_ip), Check::new(&kg, &global));
            let checks = if n.is_multiple_of(2) {
                [ip, g]
            } else {
                [g, ip]
            };
            barrier.wait().await;
            let v = store.check(&checks).await.unwrap_or_else(|e| panic!("{e}"));
            (n % 4, v.is_admitted())
        });
    }
    let mut admitted = [0u64; 4];
    while let Some(joined) = tasks.join_next().await {
        let (ip, ok) = joined.unwrap_or_else(|e| panic!("a task failed: {e}"));
        if ok {
            admitted[ip] += 1;
        }
    }
    assert_eq!(admitted.iter().sum::<u64>(), 30, "{admitted:?}");
    let store = &stores[0];
    for (i, ki) in kis.iter().enumerate() {
        let v = store
            .check(&[Check::new(ki, &per_ip)])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            v.decisions()[0].remaining,
            100 - admitted[i] - 1,
            "caller {i}: its limit holds exactly its admitted calls (plus this one)"
        );
    }
    let v = store
        .check(&[Check::new(&kg, &global)])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!v.is_admitted());
    assert_eq!(v.decisions()[0].remaining, 0);
}

/// What one call under load answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Outcome {
    /// The store answered.
    Answered,
    /// The store failed; the allow policy admitted the call.
    FailedOpen,
    /// The store failed; the deny policy rejected the call.
    FailedClosed,
}

const BEFORE: u8 = 0;
const FAILING_OVER: u8 = 1;
const AFTER: u8 = 2;

/// Keys of callers of one scope, three on each master: `(key, port of its master)`.
async fn keys_on_every_master(cluster: &RedisCluster, policy: &Policy) -> Vec<(String, u16)> {
    let run = format!("f{}", std::process::id());
    let masters = cluster.masters().await;
    let mut keys: Vec<(String, u16)> = Vec::new();
    let mut per_master: HashMap<u16, usize> = HashMap::new();
    for i in 0..1000 {
        if masters
            .iter()
            .all(|m| per_master.get(&m.port).copied().unwrap_or(0) >= 3)
        {
            break;
        }
        let k = key::build(
            &run,
            "load",
            &[key::Part::new(
                key::Source::Key,
                format!("user{i}").as_bytes(),
            )],
            policy,
        );
        let port = cluster.master_of_slot(cluster.keyslot(&k).await).await.port;
        let count = per_master.entry(port).or_default();
        if *count < 3 {
            *count += 1;
            keys.push((k, port));
        }
    }
    assert_eq!(keys.len(), 3 * MASTERS, "{per_master:?}");
    keys
}

/// Outcomes counted by (phase, whether the key is on the killed master, outcome).
type Seen = BTreeMap<(u8, bool, Outcome), usize>;

/// One worker of the steady load: a bounded loop of calls over every key, alternating the
/// allow and deny limiters, until `stop`.
async fn load_worker(
    w: usize,
    limiters: [RateLimiter; 2],
    keys: Arc<Vec<(String, u16)>>,
    victim: u16,
    flags: (Arc<AtomicU8>, Arc<AtomicBool>, Arc<AtomicUsize>),
    policy: Policy,
) -> Seen {
    let (phase, stop, calls) = flags;
    let [allow, deny] = limiters;
    let mut seen = Seen::new();
    for i in 0..100_000usize {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let (k, port) = &keys[(i + w) % keys.len()];
        let at = phase.load(Ordering::Relaxed);
        let check = [Check::new(k, &policy)];
        let outcome = if (i + w).is_multiple_of(2) {
            let v = allow
                .check(&check)
                .await
                .unwrap_or_else(|e| panic!("the allow policy never errs: {e}"));
            assert!(v.is_admitted(), "fail open or a generous limit: {v:?}");
            // A store answer counts the call; a fail-open answer shows the full quota.
            if v.decisions()[0].remaining == policy.capacity() {
                Outcome::FailedOpen
            } else {
                Outcome::Answered
            }
        } else {
            match deny.check(&check).await {
                Ok(v) => {
                    assert!(v.is_admitted(), "{v:?}");
                    Outcome::Answered
                }
                Err(_) => Outcome::FailedClosed,
            }
        };
        *seen.entry((at, *port == victim, outcome)).or_default() += 1;
        calls.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    seen
}

/// Waits (at most `within`) until one round of checks over every key is answered by the store.
async fn every_key_answered(
    limiter: &RateLimiter,
    keys: &[(String, u16)],
    policy: &Policy,
    within: Duration,
) -> Option<()> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let mut all = true;
        for (k, _) in keys {
            if limiter.check(&[Check::new(k, policy)]).await.is_err() {
                all = false;
            }
        }
        if all {
            return Some(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// `limiter`'s verdict on `checks`, asked again until it answers or `within` has passed. One
/// call may miss the limiter's timeout on a loaded machine while the client refreshes its
/// slots after a failover: what the callers assert is the verdict, not one call's latency.
async fn verdict_within(limiter: &RateLimiter, checks: &[Check<'_>], within: Duration) -> Verdict {
    let deadline = Instant::now() + within;
    loop {
        match limiter.check(checks).await {
            Ok(v) => return v,
            Err(e) if Instant::now() < deadline => {
                eprintln!("asked again after: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("no verdict in {within:?}: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn master_killed_under_load_fails_over_and_calls_follow_the_failure_policy() {
    let mut cluster = RedisCluster::start().await;
    let store: Arc<dyn Store> = Arc::new(
        RedisClusterStore::connect(cluster.urls())
            .await
            .unwrap_or_else(|e| panic!("connect: {e}")),
    );
    let timeout = Duration::from_millis(300);
    let allow = RateLimiter::builder()
        .store(Arc::clone(&store))
        .timeout(timeout)
        .failure_policy(FailurePolicy::Allow)
        .build()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let deny = RateLimiter::builder()
        .store(Arc::clone(&store))
        .timeout(timeout)
        .failure_policy(FailurePolicy::Deny)
        .build()
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    let generous = policy(Algorithm::Fixed, 1_000_000, HOUR, 1_000_000, 1);
    let keys = keys_on_every_master(&cluster, &generous).await;
    let victim = keys[0].1;
    let keys: Arc<Vec<(String, u16)>> = Arc::new(keys);

    // The steady load: a bounded loop of calls over every key, alternating the two policies.
    let phase = Arc::new(AtomicU8::new(BEFORE));
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let mut workers = JoinSet::new();
    for w in 0..4usize {
        let flags = (Arc::clone(&phase), Arc::clone(&stop), Arc::clone(&calls));
        let limiters = [allow.clone(), deny.clone()];
        workers.spawn(load_worker(
            w,
            limiters,
            Arc::clone(&keys),
            victim,
            flags,
            generous,
        ));
    }

    // Let the load run on a healthy cluster, then kill the master of the first key.
    let start = Instant::now();
    while calls.load(Ordering::Relaxed) < 200 && start.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    phase.store(FAILING_OVER, Ordering::Relaxed);
    let killed_at = Instant::now();
    let promoted = cluster.kill_master_and_wait_failover(victim).await;
    let failover = killed_at.elapsed();
    phase.store(AFTER, Ordering::Relaxed);

    // After the promotion the client finds the new master: soon every key is answered again.
    let recovered = every_key_answered(&deny, &keys, &generous, Duration::from_secs(20))
        .await
        .map(|()| killed_at.elapsed());
    // Keep the load going on the recovered cluster for a moment.
    let after = calls.load(Ordering::Relaxed);
    let start = Instant::now();
    while calls.load(Ordering::Relaxed) < after + 200 && start.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);

    let mut seen = Seen::new();
    while let Some(joined) = workers.join_next().await {
        let worker = joined.unwrap_or_else(|e| panic!("a load worker panicked: {e}"));
        for (k, n) in worker {
            *seen.entry(k).or_default() += n;
        }
    }
    eprintln!(
        "killed master {victim}, replica {promoted} promoted after {failover:?}, all keys answered after {recovered:?}; outcomes (phase, on killed master, outcome): {seen:?}"
    );
    let count = |at: u8, victim: Option<bool>, outcome: Outcome| -> usize {
        seen.iter()
            .filter(|((a, v, o), _)| *a == at && victim.is_none_or(|x| x == *v) && *o == outcome)
            .map(|(_, n)| n)
            .sum()
    };
    assert!(count(BEFORE, None, Outcome::Answered) > 0);
    assert!(
        recovered.is_some(),
        "checks did not proceed after the failover: {seen:?}"
    );
    // While the master was down, calls for its keys followed the failure policy: admitted by
    // `allow`, rejected by `deny`.
    assert!(
        count(FAILING_OVER, Some(true), Outcome::FailedOpen) > 0,
        "{seen:?}"
    );
    assert!(
        count(FAILING_OVER, Some(true), Outcome::FailedClosed) > 0,
        "{seen:?}"
    );
    // After the failover the store answers again, for the promoted master's keys too.
    assert!(count(AFTER, Some(true), Outcome::Answered) > 0, "{seen:?}");
    // The promoted master holds what was counted before it took over.
    let on_promoted = keys.iter().find(|(_, p)| *p == victim).map(|(k, _)| k);
    let checks = [Check::new(
        on_promoted.map_or("", String::as_str),
        &generous,
    )];
    let v = verdict_within(&deny, &checks, Duration::from_secs(20)).await;
    assert!(v.decisions()[0].remaining < generous.capacity());
}

/// Regression: the limiter's timeout drops a check's future. Across slots, a take and its
/// refund are separate round trips, so a check dropped between them used to leave the
/// rejected call holding quota in the first slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_slot_check_cut_short_by_a_timeout_still_refunds() {
    let cluster = RedisCluster::start().await;
    let run = format!("t{}", std::process::id());
    let per_ip = policy(Algorithm::Fixed, 100, HOUR, 100, 1);
    let global = policy(Algorithm::Fixed, 1, HOUR, 1, 1);
    let ki = key::build(
        &run,
        "upload",
        &[key::Part::new(key::Source::Key, b"10.0.0.9")],
        &per_ip,
    );
    let kg = key::build(&run, "upload", &[], &global);
    let (slot_i, slot_g) = (cluster.keyslot(&ki).await, cluster.keyslot(&kg).await);
    assert_ne!(
        slot_i, slot_g,
        "the test needs the two limits in different slots"
    );
    let store = RedisClusterStore::connect(cluster.urls())
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    // Spend the global limit: from now on every stacked call takes from the per-IP limit
    // first, is rejected by the global one, and must give the per-IP unit back.
    let spent = store
        .check(&[Check::new(&kg, &global)])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(spent.is_admitted());
    let checks = [Check::new(&ki, &per_ip), Check::new(&kg, &global)];
    let mut cut_short = 0;
    for step in 0..60u64 {
        // Timeouts from 0 to ~3 ms: some land before the take, some between the take and
        // the refund, some after.
        let wait = Duration::from_micros(step * 50);
        match tokio::time::timeout(wait, store.check(&checks)).await {
            Err(_) => cut_short += 1,
            Ok(v) => assert!(!v.unwrap_or_else(|e| panic!("{e}")).is_admitted()),
        }
    }
    assert!(
        cut_short > 0,
        "no check was cut short: the test proved nothing"
    );
    // Let every refund still in flight land, then look: nothing was taken.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let now = store
        .check(&[Check::new(&ki, &per_ip)])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        now.decisions()[0].remaining,
        99,
        "{cut_short} checks were cut short; the per-IP limit holds only this last call"
    );
}

// Refunds across slots. A cross-slot call takes its units slot by slot and,
// when a later slot rejects, gives back what the earlier slots took. Each case below sends a
// refund the way the cluster can deliver it — late (a retried or queued script), twice (the
// cluster client retries after a timeout although the first attempt ran) — through the store's
// own take and refund (the same scripts, call id and receipts as `check`), and counts what the
// limit then admits: never more than its quota.

/// Sends `checks` `n` times in a row and returns how many calls were admitted.
async fn admitted_of(store: &RedisClusterStore, checks: &[Check<'_>], n: usize) -> u64 {
    let mut admitted = 0;
    for _ in 0..n {
        let v = store.check(checks).await.unwrap_or_else(|e| panic!("{e}"));
        if v.is_admitted() {
            admitted += 1;
        }
    }
    admitted
}

/// The most that `policy` can admit (cost 1) over `span`, starting from an untouched limit: a
/// full quota per period begun for the windows, the burst plus what drains or refills over the
/// span for the buckets. `span` is measured on the client around the calls, so it bounds the
/// server's own span from above and the bound never undercounts.
fn most_admitted(policy: &Policy, span: Duration) -> u64 {
    let (span, period) = (span.as_micros(), policy.period().as_micros());
    let count = |n: u128| u64::try_from(n).unwrap_or(u64::MAX);
    match policy.algorithm() {
        Algorithm::Leaky | Algorithm::Token => policy
            .burst()
            .saturating_add(count(span * u128::from(policy.limit()) / period)),
        _ => policy.limit().saturating_mul(count(span / period + 1)),
    }
}

/// Takes one unit of `checks` (one slot) as the first group of a cross-slot call does, under
/// `call_id`.
async fn take(store: &RedisClusterStore, checks: &[Check<'_>], call_id: &str) {
    let v = store
        .take_with_receipts(checks, call_id)
        .await
        .unwrap_or_else(|e| panic!("take {call_id}: {e}"));
    assert!(v.is_admitted(), "take {call_id}: {v:?}");
}

/// Gives back what the take under `call_id` still holds, as a rejected cross-slot call does.
async fn refund(store: &RedisClusterStore, checks: &[Check<'_>], call_id: &str) {
    store
        .refund_receipts(checks, call_id)
        .await
        .unwrap_or_else(|e| panic!("refund {call_id}: {e}"));
}

/// Regression: a sliding refund popped the OLDEST live entries. Run a period after its take,
/// when the call's own entry had expired, it removed another caller's entry: 4 admitted in
/// 1 s against 3. A refund removes exactly the call's own entries, never another caller's.
async fn a_late_sliding_refund_removes_no_other_callers_entries(
    store: &RedisClusterStore,
    run: &str,
) {
    let p = policy(Algorithm::Sliding, 3, Duration::from_secs(1), 3, 1);
    let k = key::build(
        run,
        "late-sliding",
        &[key::Part::new(key::Source::Ip, b"10.0.0.1")],
        &p,
    );
    let checks = [Check::new(&k, &p)];
    take(store, &checks, "5a").await;
    // The call's entry expires; three other calls fill the window.
    tokio::time::sleep(p.period() + Duration::from_millis(100)).await;
    let start = Instant::now();
    let mut admitted = admitted_of(store, &checks, 3).await;
    assert_eq!(admitted, 3, "the window was free again");
    refund(store, &checks, "5a").await;
    admitted += admitted_of(store, &checks, 3).await;
    let span = start.elapsed();
    assert!(
        admitted <= most_admitted(&p, span),
        "{admitted} admitted in {span:?} against 3 per {:?}: the late refund removed another caller's entry",
        p.period()
    );
}

/// Regression: the cluster client retries a script after a timeout although the first attempt
/// ran, so a refund can arrive twice; it gave back twice. A refund consumes the take's receipt:
/// the second gives back nothing. Every algorithm: 3 per hour, one call taken and refunded
/// (twice), the others admit exactly 3.
async fn a_refund_sent_twice_gives_back_once(store: &RedisClusterStore, run: &str) {
    let mut bad = Vec::new();
    for (n, algo) in Algorithm::ALL.into_iter().enumerate() {
        let p = policy(algo, 3, HOUR, 3, 1);
        let k = key::build(
            run,
            &format!("twice-{algo}"),
            &[key::Part::new(key::Source::Ip, b"10.0.0.2")],
            &p,
        );
        let checks = [Check::new(&k, &p)];
        let id = format!("7{n}");
        let start = Instant::now();
        take(store, &checks, &id).await;
        let mut admitted = admitted_of(store, &checks, 2).await;
        assert_eq!(admitted, 2, "{algo}");
        refund(store, &checks, &id).await;
        refund(store, &checks, &id).await;
        admitted += admitted_of(store, &checks, 3).await;
        let span = start.elapsed();
        if admitted > most_admitted(&p, span) {
            bad.push(format!(
                "{algo}: {admitted} other calls admitted against 3: the second refund gave back again"
            ));
        } else if admitted != 3 {
            bad.push(format!(
                "{algo}: {admitted} other calls admitted, not 3: the first refund did not give the call's unit back"
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("; "));
}

/// A take that the cluster client sends again (it retries a script after a timeout, although
/// the first attempt ran) is taken once: the caller's limit holds one unit, not two (the
/// test above, across slots under load, once found a limit holding one unit too many).
async fn a_take_sent_twice_takes_once(store: &RedisClusterStore, run: &str) {
    let mut bad = Vec::new();
    for (n, algo) in Algorithm::ALL.into_iter().enumerate() {
        let p = policy(algo, 3, HOUR, 3, 1);
        let k = key::build(
            run,
            &format!("take-twice-{algo}"),
            &[key::Part::new(key::Source::Ip, b"10.0.0.6")],
            &p,
        );
        let checks = [Check::new(&k, &p)];
        let id = format!("8{n}");
        take(store, &checks, &id).await;
        take(store, &checks, &id).await;
        let left = admitted_of(store, &checks, 3).await;
        if left != 2 {
            bad.push(format!(
                "{algo}: {left} calls admitted after one take of 3, not 2"
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("; "));
}

/// Regression: a fixed-window refund judged by a delay measured on the client (before the
/// refund was sent) landed in the next window when it arrived late, and that window admitted
/// one too many. A refund is judged by the server's time: after its window ended it gives back
/// nothing.
async fn a_fixed_refund_after_its_window_leaves_the_next_window_alone(
    store: &RedisClusterStore,
    run: &str,
) {
    let p = policy(Algorithm::Fixed, 3, Duration::from_secs(1), 3, 1);
    let k = key::build(
        run,
        "late-fixed",
        &[key::Part::new(key::Source::Ip, b"10.0.0.3")],
        &p,
    );
    let checks = [Check::new(&k, &p)];
    take(store, &checks, "9f").await;
    // The call's window ends; three other calls open and fill the next one.
    tokio::time::sleep(p.period() + Duration::from_millis(100)).await;
    let start = Instant::now();
    let mut admitted = admitted_of(store, &checks, 3).await;
    assert_eq!(admitted, 3, "a new window");
    refund(store, &checks, "9f").await;
    admitted += admitted_of(store, &checks, 3).await;
    let span = start.elapsed();
    assert!(
        admitted <= most_admitted(&p, span),
        "{admitted} admitted in {span:?} against 3 per {:?}: the late refund decremented the next window",
        p.period()
    );
}

/// Regression: a bucket refund credited the whole cost, also the part that had already drained
/// (leaky) or refilled (token) since the take: run once the bucket had recovered on its own, it
/// gave a spent bucket a unit it never held, 4 admitted against a burst of 3. A refund gives
/// back only the part of the call's units that has not drained or refilled yet.
async fn a_late_bucket_refund_credits_no_refill_that_already_happened(
    store: &RedisClusterStore,
    run: &str,
) {
    let mut bad = Vec::new();
    for (n, algo) in [Algorithm::Leaky, Algorithm::Token].into_iter().enumerate() {
        let p = policy(algo, 3, Duration::from_secs(1), 3, 1);
        let k = key::build(
            run,
            &format!("late-{algo}"),
            &[key::Part::new(key::Source::Ip, b"10.0.0.4")],
            &p,
        );
        let checks = [Check::new(&k, &p)];
        let id = format!("b{n}");
        take(store, &checks, &id).await;
        // The call's unit drains (leaky) or refills (token) within a third of the period; the
        // bucket is whole again, and three other calls spend it.
        tokio::time::sleep(p.period() + Duration::from_millis(100)).await;
        let start = Instant::now();
        let mut admitted = admitted_of(store, &checks, 3).await;
        assert_eq!(admitted, 3, "{algo}: a whole bucket");
        refund(store, &checks, &id).await;
        admitted += admitted_of(store, &checks, 3).await;
        let span = start.elapsed();
        if admitted > most_admitted(&p, span) {
            bad.push(format!(
                "{algo}: {admitted} admitted in {span:?} against a burst of 3 refilled at 3 per {:?}: the late refund credited refill",
                p.period()
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("; "));
}

/// The keys under `pattern` on the master that serves `key`.
async fn keys_like(cluster: &RedisCluster, key: &str, pattern: &str) -> Vec<String> {
    let owner = cluster.master_of_slot(cluster.keyslot(key).await).await;
    let mut node = cluster.node(owner.port).await;
    redis::cmd("KEYS")
        .arg(pattern)
        .query_async(&mut node)
        .await
        .unwrap_or_else(|e| panic!("KEYS {pattern}: {e}"))
}

/// Through `check`: a cross-slot call's takes leave a receipt only while the call may still be
/// refunded: an admitted call drops them (nothing will be given back; before, each stayed
/// until its TTL, adding keys a client's calls make), and a rejected call's refund consumes
/// them.
async fn receipts_are_left_by_takes_that_may_be_refunded_and_consumed_by_refunds(
    cluster: &RedisCluster,
    store: &RedisClusterStore,
    run: &str,
) {
    let per_ip = policy(Algorithm::Sliding, 10, HOUR, 10, 1);
    let global = policy(Algorithm::Fixed, 1, HOUR, 1, 1);
    let ki = key::build(
        run,
        "receipts",
        &[key::Part::new(key::Source::Ip, b"10.0.0.5")],
        &per_ip,
    );
    let kg = key::build(run, "receipts", &[], &global);
    assert_ne!(cluster.keyslot(&ki).await, cluster.keyslot(&kg).await);
    let checks = [Check::new(&ki, &per_ip), Check::new(&kg, &global)];
    let v = store.check(&checks).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(v.is_admitted());
    for key in [&ki, &kg] {
        let left = keys_like(cluster, key, &format!("{key}:r:*")).await;
        assert!(
            left.is_empty(),
            "an admitted call keeps no receipt: {left:?}"
        );
    }
    // Rejected by the global limit: the per-IP take is refunded, its receipt consumed.
    let v = store.check(&checks).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(!v.is_admitted());
    assert_eq!(v.decisions()[0].remaining, 9, "refunded");
    assert!(
        keys_like(cluster, &ki, &format!("{ki}:r:*"))
            .await
            .is_empty(),
        "the refund consumed the rejected call's receipt"
    );
}

/// The receipt check, then the refund cases above side by side, on one cluster (each case its
/// own keys); every case that fails is reported by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_slot_refunds_give_back_at_most_what_the_call_still_holds() {
    let cluster = RedisCluster::start().await;
    let store = Arc::new(
        RedisClusterStore::connect(cluster.urls())
            .await
            .unwrap_or_else(|e| panic!("connect: {e}")),
    );
    let run = format!("r{}", std::process::id());
    receipts_are_left_by_takes_that_may_be_refunded_and_consumed_by_refunds(&cluster, &store, &run)
        .await;
    let mut cases = JoinSet::new();
    macro_rules! case {
        ($name:ident) => {{
            let (store, run) = (Arc::clone(&store), run.clone());
            cases.spawn(async move {
                let outcome = tokio::spawn(async move { $name(&store, &run).await }).await;
                outcome.err().map(|e| format!("{}: {e}", stringify!($name)))
            });
        }};
    }
    case!(a_late_sliding_refund_removes_no_other_callers_entries);
    case!(a_refund_sent_twice_gives_back_once);
    case!(a_take_sent_twice_takes_once);
    case!(a_fixed_refund_after_its_window_leaves_the_next_window_alone);
    case!(a_late_bucket_refund_credits_no_refill_that_already_happened);
    let mut failed = Vec::new();
    while let Some(joined) = cases.join_next().await {
        failed.extend(joined.unwrap_or_else(|e| panic!("{e}")));
    }
    assert!(
        failed.is_empty(),
        "{} case(s) failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// A master out of memory refuses the whole `FCALL` (the library's functions may write), so
/// the check runs as a script there; the store connected with the library only, so the
/// script's first call finds `NOSCRIPT` and loads it on that master alone (a load sent to
/// every node would fail with any one of them down): a caller over its quota is still
/// rejected, and no other node holds the script.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_master_out_of_memory_loads_its_script_alone_and_still_rejects() {
    if redis_server::skip_without_functions(
        "a_master_out_of_memory_loads_its_script_alone_and_still_rejects",
    ) {
        return;
    }
    let cluster = RedisCluster::start().await;
    let store = RedisClusterStore::connect(cluster.urls())
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let limit = policy(Algorithm::Fixed, 2, HOUR, 2, 1);
    let spent = key::build(
        &format!("oom{}", std::process::id()),
        "oom",
        &[key::Part::new(key::Source::Key, b"spent")],
        &limit,
    );
    for _ in 0..2 {
        let v = store.check(&[Check::new(&spent, &limit)]).await.unwrap();
        assert!(v.is_admitted());
    }
    let master = cluster
        .master_of_slot(cluster.keyslot(&spent).await)
        .await
        .port;
    let mut conn = cluster.node(master).await;
    let config = |name: &str, value: &str| {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("SET").arg(name).arg(value);
        cmd
    };
    let _: () = config("maxmemory-policy", "noeviction")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = config("maxmemory", "1")
        .query_async(&mut conn)
        .await
        .unwrap();
    let v = store.check(&[Check::new(&spent, &limit)]).await;
    let _: () = config("maxmemory", "0")
        .query_async(&mut conn)
        .await
        .unwrap();
    let v = v.unwrap_or_else(|e| panic!("a rejection at maxmemory: {e}"));
    assert!(!v.is_admitted(), "the spent caller is still rejected");
    assert_eq!(v.decisions()[0].remaining, 0);
    let sources = ratelimit_runtime::store::redis::script_sources();
    let hash = redis::Script::new(sources.fixed_only).get_hash().to_owned();
    for port in cluster.live_ports() {
        let mut node = cluster.node(port).await;
        let found: Vec<u8> = redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(&hash)
            .query_async(&mut node)
            .await
            .unwrap();
        assert_eq!(found, [u8::from(port == master)], "node {port}");
    }
}

/// `FUNCTION FLUSH` on every master of a live store's cluster: the next check of each master's
/// keys loads the library again on that master (the node whose `FCALL` answered that the
/// function is missing) and answers as Redis counts; a cross-slot call that rejects after the
/// flush still gets its refund (the companion function, reloaded the same way).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn function_flush_on_every_master_the_next_checks_reload_the_library() {
    if redis_server::skip_without_functions(
        "function_flush_on_every_master_the_next_checks_reload_the_library",
    ) {
        return;
    }
    let cluster = RedisCluster::start().await;
    let store = RedisClusterStore::connect(cluster.urls())
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let run = format!("ff{}", std::process::id());
    let masters = cluster.masters().await;
    assert_eq!(masters.len(), MASTERS);
    let limit = policy(Algorithm::Fixed, 5, HOUR, 5, 1);
    // One caller's key on each master.
    let mut keys: BTreeMap<u16, String> = BTreeMap::new();
    for i in 0..1000 {
        let k = key::build(
            &run,
            "flush",
            &[key::Part::new(key::Source::Key, format!("c{i}").as_bytes())],
            &limit,
        );
        let slot = cluster.keyslot(&k).await;
        let port = masters
            .iter()
            .find(|m| m.serves(slot))
            .unwrap_or_else(|| panic!("no master serves {slot}"))
            .port;
        keys.entry(port).or_insert(k);
        if keys.len() == MASTERS {
            break;
        }
    }
    assert_eq!(keys.len(), MASTERS, "a key on every master");
    let remaining = |v: &ratelimit_runtime::Verdict| v.decisions()[0].remaining;
    for k in keys.values() {
        let v = store.check(&[Check::new(k, &limit)]).await.unwrap();
        assert_eq!(remaining(&v), 4, "{k}");
    }
    let flush_all = || async {
        for m in &masters {
            let mut conn = cluster.node(m.port).await;
            let _: () = redis::cmd("FUNCTION")
                .arg("FLUSH")
                .query_async(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("FUNCTION FLUSH on {}: {e}", m.port));
        }
    };
    flush_all().await;
    for k in keys.values() {
        let v = store
            .check(&[Check::new(k, &limit)])
            .await
            .unwrap_or_else(|e| panic!("{k} after FUNCTION FLUSH: {e}"));
        assert!(v.is_admitted());
        assert_eq!(remaining(&v), 3, "{k}: counted by Redis after the reload");
    }
    for m in &masters {
        let mut conn = cluster.node(m.port).await;
        let listed: redis::Value = redis::cmd("FUNCTION")
            .arg("LIST")
            .arg("LIBRARYNAME")
            .arg(ratelimit_runtime::store::redis::script_sources().library_name)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            matches!(&listed, redis::Value::Array(l) if l.len() == 1),
            "master {}: {listed:?}",
            m.port
        );
    }

    // Across slots, after another flush: the first master's key admits and takes, a full
    // limit on the second master's rejects, and the refund gives the first its unit back.
    let mut ports = keys.keys();
    let (first, second) = (&keys[ports.next().unwrap()], &keys[ports.next().unwrap()]);
    // The second key has taken 2: a limit of 3 admits one more, then rejects.
    let full = policy(Algorithm::Fixed, 3, HOUR, 3, 1);
    let v = store.check(&[Check::new(second, &full)]).await.unwrap();
    assert!(v.is_admitted() && remaining(&v) == 0, "{v:?}");
    flush_all().await;
    let v = store
        .check(&[Check::new(first, &limit), Check::new(second, &full)])
        .await
        .unwrap_or_else(|e| panic!("cross-slot after FUNCTION FLUSH: {e}"));
    assert!(!v.is_admitted());
    assert!(!v.decisions()[1].admitted);
    assert_eq!(
        v.decisions()[0].remaining,
        3,
        "the first slot's unit was given back"
    );
    let peeked = store.peek(&[Check::new(first, &limit)]).await.unwrap();
    assert_eq!(remaining(&peeked), 3);
}
