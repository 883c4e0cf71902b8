//! The memory store: the shared scenario suite on a manual clock (exact numbers), plus what only
//! the memory store promises (eviction of idle keys, bounded memory that never forgets a live
//! caller, lock ordering across shards).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ratelimit_runtime::store::ManualClock;
use ratelimit_runtime::{
    Algorithm, FailurePolicy, MemoryStore, Policy, RateLimiter, Store, StoreError, store::Check,
};
use ratelimit_tests::suite::{self, Harness};

/// A memory store on a manual clock: `pass` moves the clock, every connection is the store.
struct Memory {
    store: Arc<MemoryStore>,
    clock: ManualClock,
}

impl Memory {
    fn new() -> Self {
        let clock = ManualClock::new();
        Self {
            store: Arc::new(MemoryStore::with_clock(clock.clone())),
            clock,
        }
    }
}

impl Harness for Memory {
    fn store(&self, _conn: usize) -> Arc<dyn Store> {
        self.store.clone()
    }

    fn pass(&self, d: Duration) -> impl Future<Output = ()> + Send {
        self.clock.advance(d);
        std::future::ready(())
    }

    fn unique(&self, name: &str) -> String {
        // One store per test: the name alone keeps scenarios apart.
        format!("mem-{name}")
    }
}

macro_rules! per_algorithm {
    ($scenario:ident, $flavor:literal, [$(($test:ident, $algo:ident)),*]) => {
        $(
            #[tokio::test(flavor = $flavor)]
            async fn $test() {
                suite::$scenario(&Memory::new(), Algorithm::$algo).await;
            }
        )*
    };
}

per_algorithm!(
    exactness,
    "multi_thread",
    [
        (exactness_fixed, Fixed),
        (exactness_sliding, Sliding),
        (exactness_leaky, Leaky),
        (exactness_token, Token),
        (exactness_gcra, Gcra),
        (exactness_sliding_counter, SlidingCounter)
    ]
);
per_algorithm!(
    cost_takes_units,
    "current_thread",
    [
        (cost_takes_units_fixed, Fixed),
        (cost_takes_units_sliding, Sliding),
        (cost_takes_units_leaky, Leaky),
        (cost_takes_units_token, Token),
        (cost_takes_units_gcra, Gcra)
    ]
);
per_algorithm!(
    decision_numbers,
    "current_thread",
    [
        (decision_numbers_fixed, Fixed),
        (decision_numbers_sliding, Sliding),
        (decision_numbers_leaky, Leaky),
        (decision_numbers_token, Token),
        (decision_numbers_gcra, Gcra)
    ]
);
per_algorithm!(
    buckets_refill_at_rate,
    "current_thread",
    [
        (buckets_refill_at_rate_leaky, Leaky),
        (buckets_refill_at_rate_token, Token),
        (buckets_refill_at_rate_gcra, Gcra)
    ]
);

#[tokio::test]
async fn fixed_admits_again_after_window() {
    suite::fixed_admits_again_after_window(&Memory::new()).await;
}

#[tokio::test]
async fn sliding_has_no_boundary_burst() {
    suite::sliding_has_no_boundary_burst(&Memory::new()).await;
}

#[tokio::test]
async fn sliding_counter_weighs_the_previous_window() {
    suite::sliding_counter_weighs_the_previous_window(&Memory::new()).await;
}

/// A store whose `stall_at`-th check stalls, as a loaded machine does: real time and the store's
/// clock both move on by `stall` before it answers.
#[derive(Debug)]
struct StallingStore {
    inner: Arc<MemoryStore>,
    clock: ManualClock,
    checks: AtomicU64,
    stall_at: u64,
    stall: Duration,
}

impl Store for StallingStore {
    fn check<'a>(&'a self, checks: &'a [Check<'a>]) -> ratelimit_runtime::store::StoreFuture<'a> {
        Box::pin(async move {
            if self.checks.fetch_add(1, Ordering::Relaxed) + 1 == self.stall_at {
                tokio::time::sleep(self.stall).await;
                self.clock.advance(self.stall);
            }
            self.inner.check(checks).await
        })
    }

    fn name(&self) -> &'static str {
        "stalling memory"
    }
}

struct Stalling {
    memory: Memory,
    store: Arc<StallingStore>,
}

impl Harness for Stalling {
    fn store(&self, _conn: usize) -> Arc<dyn Store> {
        self.store.clone()
    }

    fn pass(&self, d: Duration) -> impl Future<Output = ()> + Send {
        self.memory.pass(d)
    }

    fn unique(&self, name: &str) -> String {
        self.memory.unique(name)
    }
}

/// The second check of the scenario stalls for longer than a unit takes to refill (333 ms at
/// 3 per second), so the first try's counts are not exact: the scenario must see that from the
/// time it measured and run again on fresh keys, where it checks every number.
#[tokio::test]
async fn a_try_stalled_past_a_refill_is_run_again_on_fresh_keys() {
    let memory = Memory::new();
    let store = Arc::new(StallingStore {
        inner: memory.store.clone(),
        clock: memory.clock.clone(),
        checks: AtomicU64::new(0),
        stall_at: 2,
        stall: Duration::from_millis(400),
    });
    let h = Stalling {
        memory,
        store: store.clone(),
    };
    suite::decision_numbers(&h, Algorithm::Gcra).await;
    // The stalled try stops after its four calls; a try checked whole makes them and two
    // more (a machine that stalls again makes more tries).
    assert!(store.checks.load(Ordering::Relaxed) >= 4 + 6);
}

#[tokio::test]
async fn stacked_rejection_consumes_nothing() {
    suite::stacked_rejection_consumes_nothing(&Memory::new()).await;
}

per_algorithm!(
    same_key_twice_applies_in_order,
    "current_thread",
    [
        (same_key_twice_applies_in_order_fixed, Fixed),
        (same_key_twice_applies_in_order_sliding, Sliding),
        (same_key_twice_applies_in_order_leaky, Leaky),
        (same_key_twice_applies_in_order_token, Token),
        (same_key_twice_applies_in_order_gcra, Gcra),
        (
            same_key_twice_applies_in_order_sliding_counter,
            SlidingCounter
        )
    ]
);

/// The whole suite on one store, several times over on the same multi-thread runtime: the
/// scenarios do not depend on running alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn whole_suite_on_one_store() {
    let h = Memory::new();
    suite::all(&h).await;
}

/// 1,000,000 distinct keys, each touched once, then left idle past their window: the janitor
/// brings the store back to empty without any call for those keys. The keys are written from
/// two threads with the synchronous `check_now` (the same code path as `Store::check`) so the
/// loop stays quick in debug builds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_idle_keys_are_evicted_without_calls() {
    const KEYS: u64 = 1_000_000;
    let clock = ManualClock::new();
    let store = Arc::new(
        MemoryStore::with_clock(clock.clone()).with_sweep_interval(Duration::from_millis(10)),
    );
    let policies = [
        Policy::new(Algorithm::Fixed, 5, Duration::from_secs(1)).unwrap(),
        Policy::new(Algorithm::Sliding, 5, Duration::from_secs(1)).unwrap(),
        Policy::new(Algorithm::Token, 5, Duration::from_secs(1)).unwrap(),
        Policy::new(Algorithm::Leaky, 5, Duration::from_secs(1)).unwrap(),
    ];
    // Started inside the runtime: the janitor runs from here on.
    assert!(
        store
            .check_now(&[Check::new("warm-up", &policies[0])])
            .unwrap()
            .is_admitted()
    );
    assert!(store.has_janitor());
    std::thread::scope(|s| {
        for half in 0..2 {
            let store = &store;
            let policies = &policies;
            s.spawn(move || {
                let mut key = String::with_capacity(32);
                for i in (half..KEYS).step_by(2) {
                    key.clear();
                    key.push_str("ratelimit:{idle:");
                    push_decimal(&mut key, i);
                    key.push('}');
                    let p = &policies[usize::try_from(i % 4).unwrap()];
                    assert!(
                        store
                            .check_now(&[Check::new(&key, p)])
                            .unwrap()
                            .is_admitted()
                    );
                }
            });
        }
    });
    let held = store.held();
    assert!(
        held >= usize::try_from(KEYS).unwrap(),
        "held {held} entries"
    );
    assert_eq!(store.len(), held, "every entry is live");

    // Every entry is idle after one period (a fixed window: plus the millisecond of its key's
    // expiry; the buckets: 1/5 s per unit taken).
    clock.advance(Duration::from_millis(1001));
    assert_eq!(store.len(), 0, "idle entries are not live");
    // No call and no sweep() from here: the janitor alone empties the store.
    let mut waited = 0;
    while store.held() > 0 {
        assert!(
            waited < 6000,
            "the janitor did not evict the idle entries: {} held",
            store.held()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        waited += 1;
    }
    assert_eq!(store.held(), 0);
    assert!(store.is_empty());
}

fn push_decimal(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + u8::try_from(n % 10).unwrap();
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend(digits[i..].iter().map(|&b| char::from(b)));
}

/// Without a runtime (so without a janitor) and without `sweep()`, the shards sweep themselves
/// on inserts: keys that come and go never pile up.
#[test]
fn shards_sweep_themselves_on_inserts() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let p = Policy::new(Algorithm::Fixed, 1, Duration::from_secs(1)).unwrap();
    let per_round = 10_000;
    let mut most = 0;
    for round in 0..10 {
        for i in 0..per_round {
            let key = format!("churn:{round}:{i}");
            assert!(
                store
                    .check_now(&[Check::new(&key, &p)])
                    .unwrap()
                    .is_admitted()
            );
        }
        most = most.max(store.held());
        assert_eq!(store.len(), per_round, "round {round}");
        clock.advance(Duration::from_millis(1001));
    }
    assert!(!store.has_janitor());
    // 100,000 keys went through; at most two rounds' worth (plus slack) were ever held.
    assert!(most <= 2 * per_round + 64 * 64, "held up to {most}");
}

/// More live keys than `max_keys`: the store stays within the bound, the keys beyond it get
/// `Full`, and no key it took is ever dropped for another (each is still spent at the end).
#[test]
fn memory_is_bounded_by_max_keys() {
    let store = MemoryStore::with_clock(ManualClock::new()).with_max_keys(6400);
    assert_eq!(store.max_keys(), 6400);
    let p = Policy::new(Algorithm::Sliding, 2, suite::HOUR).unwrap();
    let mut taken = Vec::new();
    for i in 0..100_000 {
        let key = format!("flood:{i}");
        let checks = [Check::new(&key, &p)];
        match store.check_now(&checks) {
            Ok(first) => {
                assert!(first.is_admitted());
                assert!(store.check_now(&checks).unwrap().is_admitted());
                assert!(!store.check_now(&checks).unwrap().is_admitted());
                taken.push(key);
            }
            Err(StoreError::Full { max_keys }) => assert_eq!(max_keys, 6400),
            Err(e) => panic!("{e}"),
        }
        assert!(store.held() <= 6400);
    }
    assert!(store.held() > 6400 / 2, "the bound is not used at all");
    assert_eq!(store.held(), taken.len(), "a held key was dropped");
    for key in &taken {
        let v = store.check_now(&[Check::new(key, &p)]).unwrap();
        assert!(!v.is_admitted(), "{key} was reset");
    }
}

/// A client minting keys fills the store; through a `RateLimiter`, the new key that does not fit
/// is refused for that call only, under `allow` as under `deny` (the security review showed that
/// admitting it let a flood of keys switch every new caller's limit off: 50 of 50 through a
/// login limit of 1), while a spent caller stays rejected and the breaker stays closed. Once the
/// entries go idle the store takes new keys again.
#[tokio::test(flavor = "current_thread")]
async fn a_full_memory_store_refuses_new_keys_and_keeps_spent_callers() {
    for failure in [FailurePolicy::Allow, FailurePolicy::Deny] {
        let clock = ManualClock::new();
        let store = Arc::new(MemoryStore::with_clock(clock.clone()).with_max_keys(64));
        let limiter = RateLimiter::builder()
            .store(store.clone())
            .failure_policy(failure)
            .build_lazy()
            .unwrap();
        let p = Policy::new(Algorithm::Fixed, 2, suite::HOUR).unwrap();
        let spent = [Check::new("ratelimit:{login:=203.0.113.7}", &p)];
        assert!(limiter.check(&spent).await.unwrap().is_admitted());
        assert!(limiter.check(&spent).await.unwrap().is_admitted());
        assert!(!limiter.check(&spent).await.unwrap().is_admitted());

        let mut refused = 0;
        for i in 0..2000 {
            let key = format!("ratelimit:{{login:=minted-{i}}}");
            let answer = limiter.check(&[Check::new(&key, &p)]).await;
            match (failure, answer) {
                (_, Ok(v)) if v.decisions()[0].remaining == 1 => {} // the store's answer
                (_, Err(StoreError::Full { max_keys: 64 })) => refused += 1,
                (_, other) => panic!("{failure:?} {key}: {other:?}"),
            }
            assert!(!limiter.store_failing(), "{failure:?}: the breaker opened");
        }
        assert_eq!(store.held(), 64, "{failure:?}: every shard is full");
        assert_eq!(refused, 2000 - 63, "{failure:?}");
        assert!(
            !limiter.check(&spent).await.unwrap().is_admitted(),
            "{failure:?}: the spent caller was reset"
        );

        // Every window ended: the spent caller starts afresh in its own entry, and new keys
        // take the 63 other idle slots, in every shard (2,000 keys fill each shard's share of
        // the bound, the spent caller's shard one key short of it).
        clock.advance(suite::HOUR + Duration::from_millis(1));
        let v = limiter.check(&spent).await.unwrap();
        assert_eq!(
            v.decisions()[0].remaining,
            1,
            "{failure:?}: the spent caller"
        );
        let mut admitted = 0;
        for i in 0..2000 {
            let key = format!("ratelimit:{{login:=later-{i}}}");
            match limiter.check(&[Check::new(&key, &p)]).await {
                Ok(v) if v.decisions()[0].remaining == 1 => admitted += 1,
                Err(StoreError::Full { max_keys: 64 }) => {}
                other => panic!("{failure:?} {key}: {other:?}"),
            }
        }
        assert_eq!(
            admitted, 63,
            "{failure:?}: the idle slots were not taken again"
        );
        assert_eq!(store.held(), 64, "{failure:?}");
    }
}

/// Stacked checks over many keys in different shards, in different orders, from many tasks at
/// once: no deadlock, no over-admission, and every rejected call took nothing (each key's count
/// of admitted calls is exactly what its remaining says).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stacked_checks_across_shards_neither_deadlock_nor_over_admit() {
    const KEYS: usize = 24;
    const LIMIT: u64 = 40;
    let store = Arc::new(MemoryStore::with_clock(ManualClock::new()));
    let p = Policy::new(Algorithm::Fixed, LIMIT, suite::HOUR).unwrap();
    let keys: Arc<Vec<String>> = Arc::new((0..KEYS).map(|i| format!("stacked:{{k{i}}}")).collect());
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..16u64 {
        let (store, keys, counts) = (store.clone(), keys.clone(), counts.clone());
        tasks.spawn(async move {
            let mut seed = task.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            for _ in 0..200 {
                // 2 to 6 distinct keys, in a random order.
                let mut picked: Vec<usize> = Vec::new();
                let want = 2 + usize::try_from(next(&mut seed) % 5).unwrap();
                while picked.len() < want {
                    let k = usize::try_from(next(&mut seed) % KEYS as u64).unwrap();
                    if !picked.contains(&k) {
                        picked.push(k);
                    }
                }
                let checks: Vec<Check<'_>> =
                    picked.iter().map(|&k| Check::new(&keys[k], &p)).collect();
                let v = store.check(&checks).await.unwrap();
                if v.is_admitted() {
                    for &k in &picked {
                        counts[k].fetch_add(1, Ordering::Relaxed);
                    }
                }
                tokio::task::yield_now().await;
            }
        });
    }
    let all = async {
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(100), all)
        .await
        .expect("stacked checks deadlocked");
    let mut admitted_somewhere = 0;
    for (k, key) in keys.iter().enumerate() {
        let taken = counts[k].load(Ordering::Relaxed);
        assert!(taken <= LIMIT, "key {k} admitted {taken} > {LIMIT}");
        admitted_somewhere += taken;
        // One more call on the key alone shows what is left: exactly LIMIT - taken.
        let d = store.check_now(&[Check::new(key, &p)]).unwrap().decisions()[0];
        if taken < LIMIT {
            assert!(d.admitted);
            assert_eq!(d.remaining, LIMIT - taken - 1, "key {k}");
        } else {
            assert!(!d.admitted, "key {k}");
            assert_eq!(d.remaining, 0);
        }
    }
    assert!(admitted_somewhere > 0);
}

fn next(seed: &mut u64) -> u64 {
    // xorshift64
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// The security review's case: once minted keys fill the store, a login limit of 1 a minute
/// for a caller not seen yet must not admit every attempt: it admits none until the store has
/// room, never more than 1.
#[tokio::test(flavor = "current_thread")]
async fn a_flood_of_minted_keys_never_switches_a_new_callers_limit_off() {
    let limiter = RateLimiter::builder()
        .store(MemoryStore::new().with_max_keys(64))
        .build()
        .await
        .unwrap();
    let api = Policy::new(Algorithm::Fixed, 100, suite::HOUR).unwrap();
    for i in 0..10_000 {
        let key = format!("ratelimit:{{app::api:h.x-api-key=minted{i}}}:fixed:100:3600000");
        let _ = limiter.check(&[Check::new(&key, &api)]).await;
    }
    let login = Policy::new(Algorithm::Fixed, 1, suite::HOUR / 60).unwrap();
    let key = "ratelimit:{app::login:ip=203.0.113.9}:fixed:1:60000";
    let mut admitted = 0;
    for _ in 0..50 {
        if let Ok(v) = limiter.check(&[Check::new(key, &login)]).await {
            admitted += usize::from(v.is_admitted());
        }
    }
    assert!(
        admitted <= 1,
        "a login limit of 1 admitted {admitted} of 50"
    );
    assert!(!limiter.store_failing());
}

/// A one-limit check on a held key updates its entry by compare-and-swap under the
/// shard's read lock, while stacked checks and takes hold the write lock. One hot key hammered
/// from many threads at once with a mix of the two (and stacked calls naming it second, and
/// takes): exactly the quota is admitted, for every algorithm, and every call that a stacked
/// check rejected took nothing from its other key.
#[test]
fn one_hot_key_under_mixed_single_and_stacked_checks_admits_exactly_the_quota() {
    const THREADS: u64 = 6;
    const CALLS: u64 = 3000;
    const LIMIT: u64 = 4000;
    for algo in Algorithm::ALL {
        // The clock stands still: nothing refills, so the quota is exactly LIMIT.
        let clock = ManualClock::new();
        clock.advance(Duration::from_secs(7));
        let store = Arc::new(MemoryStore::with_clock(clock));
        let hot = Policy::new(algo, LIMIT, suite::HOUR).unwrap();
        // Roomy keys for the stacked calls: never the one that rejects.
        let roomy = Policy::new(Algorithm::Fixed, THREADS * CALLS, suite::HOUR).unwrap();
        let roomy_keys: Arc<Vec<String>> =
            Arc::new((0..THREADS).map(|t| format!("roomy:{algo}:{t}")).collect());
        let hot_key = Arc::new(format!("hot:{algo}"));
        let barrier = Arc::new(std::sync::Barrier::new(usize::try_from(THREADS).unwrap()));
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (store, roomy_keys, hot_key, barrier) = (
                    store.clone(),
                    roomy_keys.clone(),
                    hot_key.clone(),
                    barrier.clone(),
                );
                std::thread::spawn(move || {
                    let mine = &roomy_keys[usize::try_from(t).unwrap()];
                    let (mut admitted, mut stacked_admitted) = (0u64, 0u64);
                    barrier.wait();
                    for i in 0..CALLS {
                        let single = [Check::new(&hot_key, &hot)];
                        let first = [Check::new(&hot_key, &hot), Check::new(mine, &roomy)];
                        let second = [Check::new(mine, &roomy), Check::new(&hot_key, &hot)];
                        let (v, stacked) = match (i + t) % 8 {
                            0 => (store.check_now(&first).unwrap(), true),
                            1 => (store.check_now(&second).unwrap(), true),
                            2 => (
                                store.take_now(&single, &format!("{t:x}{i:016x}")).unwrap(),
                                false,
                            ),
                            _ => (store.check_now(&single).unwrap(), false),
                        };
                        if v.is_admitted() {
                            admitted += 1;
                            stacked_admitted += u64::from(stacked);
                        }
                    }
                    (admitted, stacked_admitted)
                })
            })
            .collect();
        let mut total = 0;
        for (t, h) in threads.into_iter().enumerate() {
            let (admitted, stacked) = h.join().unwrap();
            total += admitted;
            // The roomy key took exactly its thread's admitted stacked calls.
            let d = store
                .peek_now(&[Check::new(&roomy_keys[t], &roomy)])
                .decisions()[0];
            assert_eq!(d.remaining, THREADS * CALLS - stacked, "{algo}: thread {t}");
        }
        assert_eq!(
            total, LIMIT,
            "{algo}: admitted {total} of a quota of {LIMIT}"
        );
        let d = store.check_now(&[Check::new(&hot_key, &hot)]).unwrap();
        assert!(!d.is_admitted(), "{algo}");
        assert_eq!(d.decisions()[0].remaining, 0, "{algo}");
    }
}

/// Many threads race to open each new window (or refill each bucket) of one hot key: rounds in
/// which the clock stands, each started by moving it three periods on, so the key's state is
/// idle and every thread's first call finds it so. The one-limit fast path then opens the new
/// state by compare-and-swap (one word for a fixed window and GCRA, the sequence lock for the
/// others) while the other threads do the same: exactly the quota is admitted in every round,
/// for every algorithm.
#[test]
fn threads_racing_to_open_a_new_window_admit_exactly_the_quota_each_time() {
    const THREADS: usize = 4;
    const CALLS: u64 = 12;
    const LIMIT: u64 = 20;
    const ROUNDS: u64 = 150;
    let period = Duration::from_millis(10);
    for algo in Algorithm::ALL {
        let clock = ManualClock::new();
        clock.advance(Duration::from_secs(1));
        let store = Arc::new(MemoryStore::with_clock(clock.clone()));
        let policy = Policy::new(algo, LIMIT, period).unwrap();
        let key = format!("racing:{algo}");
        // The key held first, so that each round finds it in the map.
        assert!(
            store
                .check_now(&[Check::new(&key, &policy)])
                .unwrap()
                .is_admitted()
        );
        let start = Arc::new(std::sync::Barrier::new(THREADS + 1));
        let done = Arc::new(std::sync::Barrier::new(THREADS + 1));
        let admitted = Arc::new(AtomicU64::new(0));
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                let (store, key, policy) = (&store, &key, &policy);
                let (start, done, admitted) = (start.clone(), done.clone(), admitted.clone());
                s.spawn(move || {
                    for _ in 0..ROUNDS {
                        start.wait();
                        for _ in 0..CALLS {
                            // An error counts as refused (a panic here would leave the
                            // other threads at a barrier).
                            let v = store.check_now(&[Check::new(key, policy)]);
                            if v.is_ok_and(|v| v.is_admitted()) {
                                admitted.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        done.wait();
                    }
                });
            }
            // Asserted after the threads are joined: a failed round must not leave them at a
            // barrier.
            let rounds: Vec<u64> = (0..ROUNDS)
                .map(|_| {
                    clock.advance(3 * period);
                    start.wait();
                    done.wait();
                    admitted.swap(0, Ordering::Relaxed)
                })
                .collect();
            let wrong: Vec<(usize, u64)> = rounds
                .into_iter()
                .enumerate()
                .filter(|&(_, got)| got != LIMIT)
                .collect();
            assert!(
                wrong.is_empty(),
                "{algo}: rounds admitting other than {LIMIT}: {wrong:?}"
            );
        });
    }
}

/// A clock a test sets anywhere, backwards included (a wall clock that jumped).
#[derive(Debug, Clone, Default)]
struct SettableClock(Arc<AtomicU64>);

impl ratelimit_runtime::store::Clock for SettableClock {
    fn now(&self) -> Duration {
        Duration::from_micros(self.0.load(Ordering::SeqCst))
    }
}

/// One step of a trace run on two stores.
#[derive(Debug, Clone)]
enum Op {
    /// The clock moves by this many µs (backwards when negative, as a clock that jumped).
    Clock(i64),
    /// One limit: policy `p` on key `k`.
    One(usize, usize),
    /// Several limits in one call.
    Stacked(Vec<(usize, usize)>),
    /// A take of one limit, refunded (`true`) or not.
    Take(usize, usize, bool),
    Peek(usize, usize),
    Reset(usize),
    Block(usize, u64),
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    let limit = (0usize..3, 0usize..POLICIES);
    prop_oneof![
        3 => (-2_000_000i64..3_000_000).prop_map(Op::Clock),
        1 => (0i64..2_000).prop_map(Op::Clock),
        8 => limit.clone().prop_map(|(k, p)| Op::One(k, p)),
        2 => proptest::collection::vec(limit.clone(), 1..4).prop_map(Op::Stacked),
        1 => (limit.clone(), any::<bool>()).prop_map(|((k, p), r)| Op::Take(k, p, r)),
        1 => limit.prop_map(|(k, p)| Op::Peek(k, p)),
        1 => (0usize..3).prop_map(Op::Reset),
        1 => ((0usize..3), 1u64..3_000).prop_map(|(k, ms)| Op::Block(k, ms)),
    ]
}

const POLICIES: usize = 13;

/// Two policies per algorithm, small enough that traces reach their limits: a key is checked
/// under several algorithms in one trace (its state changes form), with costs above 1. And a
/// fixed window whose count outgrows the one word the store packs a window in (2^28 − 1
/// units: the store's `WINDOW_MAX_COUNT`) by its second call, so that the fast path meets
/// windows it cannot hold.
fn policies() -> Vec<Policy> {
    let s = Duration::from_secs;
    let mut all: Vec<Policy> = Algorithm::ALL
        .into_iter()
        .flat_map(|a| {
            [
                Policy::new(a, 3, s(2)).unwrap(),
                Policy::new(a, 5, s(1))
                    .and_then(|p| p.with_burst(7))
                    .and_then(|p| p.with_cost(2))
                    .unwrap(),
            ]
        })
        .collect();
    all.push(
        Policy::new(Algorithm::Fixed, 5 << 27, s(2))
            .and_then(|p| p.with_cost(1 << 27))
            .unwrap(),
    );
    all
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config::with_cases(256))]

    /// The one-limit fast path (read lock, compare-and-swap on the entry's packed state)
    /// answers exactly what the locked path answers, decision by decision, over random traces
    /// of single, stacked, taken, refunded, peeked, reset and blocked calls on a clock that
    /// also jumps back: the same rules on the same state, only the locking differs.
    #[test]
    fn the_fast_path_decides_as_the_locked_path(ops in proptest::collection::vec(op(), 1..120)) {
        let policies = policies();
        let keys = ["a", "b", "{c}"];
        let clock = SettableClock::default();
        clock.0.store(50_000_000, Ordering::SeqCst);
        let fast = MemoryStore::with_clock(clock.clone());
        let locked = MemoryStore::with_clock(clock.clone()).with_fast_path(false);
        for (n, op) in ops.iter().enumerate() {
            let (a, b) = match op {
                Op::Clock(by) => {
                    let now = clock.0.load(Ordering::SeqCst);
                    clock.0.store(now.saturating_add_signed(*by), Ordering::SeqCst);
                    continue;
                }
                Op::One(k, p) => {
                    let c = [Check::new(keys[*k], &policies[*p])];
                    (format!("{:?}", fast.check_now(&c)), format!("{:?}", locked.check_now(&c)))
                }
                Op::Stacked(limits) => {
                    let c: Vec<Check<'_>> =
                        limits.iter().map(|&(k, p)| Check::new(keys[k], &policies[p])).collect();
                    (format!("{:?}", fast.check_now(&c)), format!("{:?}", locked.check_now(&c)))
                }
                Op::Take(k, p, refund) => {
                    let c = [Check::new(keys[*k], &policies[*p])];
                    let id = format!("{n:017x}");
                    let out = (format!("{:?}", fast.take_now(&c, &id)), format!("{:?}", locked.take_now(&c, &id)));
                    if *refund {
                        fast.refund_now(&c, &id);
                        locked.refund_now(&c, &id);
                    }
                    out
                }
                Op::Peek(k, p) => {
                    let c = [Check::new(keys[*k], &policies[*p])];
                    (format!("{:?}", fast.peek_now(&c)), format!("{:?}", locked.peek_now(&c)))
                }
                Op::Reset(k) => {
                    fast.reset_now(&[keys[*k]]);
                    locked.reset_now(&[keys[*k]]);
                    continue;
                }
                Op::Block(k, ms) => {
                    fast.block_now(&[keys[*k]], Duration::from_millis(*ms));
                    locked.block_now(&[keys[*k]], Duration::from_millis(*ms));
                    continue;
                }
            };
            proptest::prop_assert_eq!(a, b, "step {} ({:?})", n, op);
            proptest::prop_assert_eq!(fast.len(), locked.len(), "step {}", n);
        }
    }
}
