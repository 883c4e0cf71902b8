//! Waiting for a slot instead of failing (`wait = "5s"`, issue 26): a step of the pipeline
//! around steps 1–4, for any transport that asks for it (plain functions today).
//!
//! A call refused as [`Refused::Limited`] whose `retry_after` fits in what is left of its
//! budget sleeps `retry_after` plus a little jitter and is checked again; when the budget is
//! spent (or the next slot comes after it) it fails as it would have without waiting. Every
//! other refusal — a store failure, a missing quota, a cost beyond the capacity — answers at
//! once, as today: the failure policy has already said what a failing store means.
//!
//! **The fast path pays nothing.** A call is checked first without touching the queues (one
//! relaxed atomic load says that no call of the process is waiting); only a refused call, or
//! one arriving while others wait for the same keys, enters its queue.
//!
//! **First come, first served within a process.** The calls waiting for the same keys (of the
//! same store) form one FIFO line: a [`tokio::sync::Mutex`], which hands itself over in the
//! order it was asked for. Only the call at the head of the line sleeps and retries the store;
//! the others wait their turn behind it, each within its own budget. A call arriving while its
//! keys have a line joins the back of it instead of checking first, so it cannot take the
//! slot the head is sleeping for. Across processes the store decides; the jitter keeps a fleet
//! from retrying in lock step.
//!
//! **Cancellation leaves nothing taken.** A refused check takes nothing (a refused take leaves
//! no receipt), and nothing is held across a sleep but the call's place in its line, which its
//! drop gives up: dropping a waiting call's future costs the quota nothing.
//!
//! **Bounded.** The keys of a line come from the call's arguments, which a client may choose;
//! a line lives only while some call waits in it (the last one to leave removes it), so the
//! map holds at most one entry per waiting call. Beyond [`MAX_LINES`] lines, a refused call
//! waits without a line (it retries on its own, with its jitter and its budget, in no order).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::{Admitted, Prepared, Refused};
use crate::decision::Verdict;
use crate::limit::Limit;
use crate::limiter::RateLimiter;

/// The most lines the process keeps at once (one per set of keys some call waits for).
pub(crate) const MAX_LINES: usize = 10_000;

/// The shortest sleep between two checks of one call, so a refusal whose `retry_after` rounds
/// to 0 never spins.
const MIN_SLEEP: Duration = Duration::from_millis(1);

/// Steps 1–4 with waiting: `prepare` runs steps 1–3 (it is called again for each retry, so an
/// override set meanwhile applies), then the call is checked, and while it is limited and its
/// next slot fits in `budget`, it waits as the module docs say.
pub(crate) async fn admit<'l>(
    limiter: &RateLimiter,
    budget: Duration,
    prepare: impl FnMut() -> Result<Prepared<'l>, Refused>,
) -> Result<Admitted<'l>, Refused> {
    admit_in(&LINES, limiter, budget, prepare).await
}

/// [`admit`] with the lines of `lines`.
async fn admit_in<'l>(
    lines: &'static Lines,
    limiter: &RateLimiter,
    budget: Duration,
    mut prepare: impl FnMut() -> Result<Prepared<'l>, Refused>,
) -> Result<Admitted<'l>, Refused> {
    let deadline = Instant::now() + budget;
    let prepared = prepare()?;
    let Some(key) = lines.key(limiter, &prepared) else {
        return prepared.run(limiter).await; // exempt: nothing to wait for
    };
    // Why the call is waiting, and when it may try again.
    let mut last: Option<Limited> = None;
    if !lines.has_line(key) {
        match prepared.run(limiter).await {
            Err(Refused::Limited { limits, verdict }) => {
                let spent = Limited::new(limits, verdict);
                if !spent.fits(deadline) {
                    return Err(spent.refused());
                }
                last = Some(spent);
            }
            answered => return answered,
        }
    }
    let place = lines.join(key);
    if let (Some(place), Some(spent)) = (&place, &last) {
        place.line.record(spent);
    }
    let _turn = match &place {
        Some(place) => match tokio::time::timeout_at(deadline, place.line.turn.lock()).await {
            Ok(turn) => Some(turn),
            // The budget ran out in the line: the latest refusal this call or its line saw.
            Err(_) => {
                return match last.or_else(|| place.line.latest()) {
                    Some(spent) => Err(spent.refused()),
                    None => prepare()?.run(limiter).await,
                };
            }
        },
        None => None,
    };
    // The head of the line: sleep until the slot, check, again until admitted or out of time.
    loop {
        if let Some(spent) = &last {
            tokio::time::sleep_until(spent.next_try().min(deadline)).await;
        }
        match prepare()?.run(limiter).await {
            Err(Refused::Limited { limits, verdict }) => {
                let spent = Limited::new(limits, verdict);
                if let Some(place) = &place {
                    place.line.record(&spent);
                }
                if !spent.fits(deadline) {
                    return Err(spent.refused());
                }
                last = Some(spent);
            }
            answered => return answered,
        }
    }
}

/// A limited answer, and when to try again.
#[derive(Clone)]
struct Limited {
    limits: Vec<Limit>,
    verdict: Verdict,
    /// When the slot comes: the answer's time plus its `retry_after`.
    at: Instant,
}

impl Limited {
    fn new(limits: Vec<Limit>, verdict: Verdict) -> Self {
        let after = verdict.retry_after().unwrap_or_default();
        Self {
            limits,
            verdict,
            at: Instant::now() + after,
        }
    }

    /// Whether the slot comes before `deadline`.
    fn fits(&self, deadline: Instant) -> bool {
        self.at <= deadline
    }

    /// When to check again: at the slot, plus jitter (up to a tenth of the wait, between 2 and
    /// 25 ms: enough to break the tie of processes waking for one slot, little enough that
    /// a slot is not left unused for long), at least [`MIN_SLEEP`] from now.
    fn next_try(&self) -> Instant {
        let now = Instant::now();
        let wait = self.at.saturating_duration_since(now);
        let spread = (wait / 10).clamp(Duration::from_millis(2), Duration::from_millis(25));
        (self.at + jitter(spread)).max(now + MIN_SLEEP)
    }

    fn refused(self) -> Refused {
        Refused::Limited {
            limits: self.limits,
            verdict: self.verdict,
        }
    }
}

/// Which line a call waits in: its store and its keys (two limiters on one store share their
/// counts, so they share their lines). A hash: two sets of keys that collide share a line,
/// which only orders them.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct LineKey(u64);

/// One line: its turn, handed over first come first served, and the latest refusal its head
/// saw (what a call whose budget ends in the line answers).
#[derive(Default)]
struct Line {
    turn: tokio::sync::Mutex<()>,
    latest: Mutex<Option<Limited>>,
}

impl Line {
    fn record(&self, limited: &Limited) {
        *self.latest.lock().unwrap_or_else(PoisonError::into_inner) = Some(limited.clone());
    }

    fn latest(&self) -> Option<Limited> {
        self.latest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The process's lines, by key, each with how many calls hold a place in it.
struct Lines {
    map: Mutex<HashMap<LineKey, (Arc<Line>, usize)>>,
    /// How many calls hold a place in some line: 0 is the fast path's one load.
    waiting: AtomicUsize,
    /// The most lines at once.
    max: usize,
    hasher: std::collections::hash_map::RandomState,
}

static LINES: LazyLock<Lines> = LazyLock::new(|| Lines::new(MAX_LINES));

impl Lines {
    fn new(max: usize) -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            waiting: AtomicUsize::new(0),
            max,
            hasher: std::collections::hash_map::RandomState::new(),
        }
    }

    /// The line of a prepared call: its store and its keys (none for an exempt call).
    fn key(&self, limiter: &RateLimiter, prepared: &Prepared<'_>) -> Option<LineKey> {
        let keys: &[String] = match prepared {
            Prepared::Exempt => return None,
            Prepared::Fixed { keys, .. } => keys,
            Prepared::Planned { plan, .. } => &plan.keys,
        };
        let mut h = self.hasher.build_hasher();
        Arc::as_ptr(limiter.store())
            .cast::<()>()
            .addr()
            .hash(&mut h);
        keys.hash(&mut h);
        Some(LineKey(h.finish()))
    }

    fn map(&self) -> MutexGuard<'_, HashMap<LineKey, (Arc<Line>, usize)>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether some call waits for `key` (without a lock while no call waits at all).
    fn has_line(&self, key: LineKey) -> bool {
        self.waiting.load(Ordering::Relaxed) > 0 && self.map().contains_key(&key)
    }

    /// A place at the back of `key`'s line (made when there is none), or `None` when the
    /// process already keeps its most lines.
    fn join(&'static self, key: LineKey) -> Option<Place> {
        let mut map = self.map();
        if map.len() >= self.max && !map.contains_key(&key) {
            return None;
        }
        let (line, places) = map.entry(key).or_insert_with(|| (Arc::default(), 0));
        *places += 1;
        self.waiting.fetch_add(1, Ordering::Relaxed);
        Some(Place {
            lines: self,
            key,
            line: Arc::clone(line),
        })
    }

    /// How many lines there are (for the tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map().len()
    }
}

/// A call's place in a line; its drop leaves the line, and the last to leave removes it.
struct Place {
    lines: &'static Lines,
    key: LineKey,
    line: Arc<Line>,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut map = self.lines.map();
        if let Some((_, places)) = map.get_mut(&self.key) {
            *places -= 1;
            if *places == 0 {
                map.remove(&self.key);
            }
        }
        self.lines.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A random duration in `[0, spread]`: splitmix64 over a counter, seeded per process from the
/// time, the process id and an address, so that processes started together differ. Not
/// cryptographic; it only spreads retries.
fn jitter(spread: Duration) -> Duration {
    static SEED: LazyLock<u64> = LazyLock::new(|| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        std::time::SystemTime::now().hash(&mut h);
        std::process::id().hash(&mut h);
        (&raw const SEED).addr().hash(&mut h);
        h.finish()
    });
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut z = COUNTER
        .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
        .wrapping_add(*SEED);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let nanos = u64::try_from(spread.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(z % nanos.saturating_add(1))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex as StdMutex;

    use super::*;
    use crate::algorithm::Algorithm;
    use crate::call::{Call, prepare};
    use crate::caller::Caller;
    use crate::limit::By;
    use crate::policy::Policy;
    use crate::store::{MemoryStore, TokioClock};

    /// One call per 100 ms, no burst.
    fn one_per_100ms() -> [Limit; 1] {
        let policy = Policy::new(Algorithm::Gcra, 1, Duration::from_millis(100))
            .and_then(|p| p.with_burst(1))
            .unwrap();
        [Limit::new(policy, "wait_tests", By::Global)]
    }

    async fn limiter() -> RateLimiter {
        RateLimiter::builder()
            .store(MemoryStore::with_clock(TokioClock::default()))
            .build()
            .await
            .unwrap()
    }

    fn lines(max: usize) -> &'static Lines {
        Box::leak(Box::new(Lines::new(max)))
    }

    /// One call under `key`, waiting up to `budget` in `lines`: admitted or not.
    async fn call(
        lines: &'static Lines,
        limiter: &RateLimiter,
        limits: &[Limit],
        key: &str,
        budget: Duration,
    ) -> Result<(), Refused> {
        let templates = [Some(key)];
        let call = Call::fixed(limits, &templates);
        admit_in(lines, limiter, budget, || {
            prepare(limiter, call, &Caller::PLAIN)
        })
        .await
        .map(drop)
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_are_admitted_first_come_first_served_one_slot_apart() {
        let (lines, limiter, limits) = (lines(MAX_LINES), limiter().await, one_per_100ms());
        let start = Instant::now();
        call(lines, &limiter, &limits, "k", Duration::ZERO)
            .await
            .unwrap();
        let order = Arc::new(StdMutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..10 {
            let (limiter, order) = (limiter.clone(), Arc::clone(&order));
            tasks.push(tokio::spawn(async move {
                call(lines, &limiter, &limits, "k", Duration::from_secs(5))
                    .await
                    .unwrap();
                order.lock().unwrap().push((i, start.elapsed()));
            }));
            // Each starts waiting before the next arrives.
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        for t in tasks {
            t.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        let ids: Vec<usize> = order.iter().map(|(i, _)| *i).collect();
        assert_eq!(ids, (0..10).collect::<Vec<_>>(), "{order:?}");
        let mut before = Duration::ZERO;
        for (_, at) in &order {
            // One slot after the one before, within the jitter (a tenth of the slot).
            let after = at.checked_sub(before).unwrap();
            let slot = Duration::from_millis(100);
            assert!(
                after >= slot && after <= slot + Duration::from_millis(11),
                "{order:?}"
            );
            before = *at;
        }
        assert_eq!(lines.len(), 0, "the line left with its last call");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_beyond_the_budget_fails_at_once_and_one_within_it_is_waited_for() {
        let (lines, limiter, limits) = (lines(MAX_LINES), limiter().await, one_per_100ms());
        call(lines, &limiter, &limits, "k", Duration::ZERO)
            .await
            .unwrap();
        let start = Instant::now();
        let refused = call(lines, &limiter, &limits, "k", Duration::from_millis(50)).await;
        assert!(
            matches!(refused, Err(Refused::Limited { .. })),
            "{refused:?}"
        );
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "no sleep for a slot it cannot reach"
        );
        call(lines, &limiter, &limits, "k", Duration::from_millis(150))
            .await
            .unwrap();
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(100) && waited <= Duration::from_millis(115));
        assert_eq!(lines.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_whose_budget_ends_in_the_line_answers_the_line_s_latest_refusal() {
        let (lines, limiter, limits) = (lines(MAX_LINES), limiter().await, one_per_100ms());
        call(lines, &limiter, &limits, "k", Duration::ZERO)
            .await
            .unwrap();
        let first = {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                call(lines, &limiter, &limits, "k", Duration::from_secs(1)).await
            })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        // Behind the first, 30 ms of budget: its turn never comes.
        let start = Instant::now();
        let second = call(lines, &limiter, &limits, "k", Duration::from_millis(30)).await;
        assert_eq!(start.elapsed(), Duration::from_millis(30));
        let Err(Refused::Limited { verdict, .. }) = second else {
            panic!("{second:?}")
        };
        assert!(verdict.retry_after().is_some_and(|d| d > Duration::ZERO));
        first.await.unwrap().unwrap();
        assert_eq!(lines.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_waiter_takes_nothing_and_leaves_its_line() {
        let policy = Policy::new(Algorithm::Gcra, 1, Duration::from_secs(10))
            .and_then(|p| p.with_burst(1))
            .unwrap();
        let limits = [Limit::new(policy, "wait_tests", By::Global)];
        let (lines, limiter) = (lines(MAX_LINES), limiter().await);
        call(lines, &limiter, &limits, "k", Duration::ZERO)
            .await
            .unwrap();
        // 20 waiters for the slot at 10 s, each dropped 450 ms into its wait; the last ones
        // just before the slot.
        for _ in 0..20 {
            let waiting = call(lines, &limiter, &limits, "k", Duration::from_secs(20));
            let dropped = tokio::time::timeout(Duration::from_millis(450), waiting).await;
            assert!(dropped.is_err());
        }
        assert_eq!(lines.len(), 0);
        assert_eq!(lines.waiting.load(Ordering::Relaxed), 0);
        // The slot after the spent one is there, whole: none of the 20 took it.
        tokio::time::sleep(Duration::from_secs(1)).await;
        call(lines, &limiter, &limits, "k", Duration::ZERO)
            .await
            .unwrap();
        assert!(
            call(lines, &limiter, &limits, "k", Duration::ZERO)
                .await
                .is_err()
        );
    }

    /// A flood of distinct keys (a client picks the arguments that make them): the map holds
    /// at most its most lines, every call still waits within its budget, and the map empties
    /// as the calls leave.
    #[tokio::test(start_paused = true)]
    async fn a_flood_of_distinct_keys_never_grows_the_lines_past_their_bound() {
        let (lines, limiter, limits) = (lines(64), limiter().await, one_per_100ms());
        let keys: Vec<String> = (0..1000).map(|i| format!("user-{i}")).collect();
        for key in &keys {
            call(lines, &limiter, &limits, key, Duration::ZERO)
                .await
                .unwrap();
        }
        let peak = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for key in keys {
            let (limiter, peak) = (limiter.clone(), Arc::clone(&peak));
            tasks.push(tokio::spawn(async move {
                let answer = call(lines, &limiter, &limits, &key, Duration::from_secs(1)).await;
                peak.fetch_max(lines.len(), Ordering::Relaxed);
                answer
            }));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            lines.len(),
            64,
            "as many lines as allowed while 1000 keys wait"
        );
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        assert!(peak.load(Ordering::Relaxed) <= 64);
        assert_eq!(lines.len(), 0);
        assert_eq!(lines.waiting.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn jitter_stays_within_its_spread_and_varies() {
        let spread = Duration::from_millis(10);
        let draws: Vec<Duration> = (0..1000).map(|_| jitter(spread)).collect();
        assert!(draws.iter().all(|d| *d <= spread));
        let distinct: std::collections::BTreeSet<Duration> = draws.iter().copied().collect();
        assert!(distinct.len() > 900, "{}", distinct.len());
        assert_eq!(jitter(Duration::ZERO), Duration::ZERO);
    }
}
