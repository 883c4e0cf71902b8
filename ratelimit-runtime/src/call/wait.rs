//! Waiting for a slot instead of failing (`wait = "5s"`): a step of the pipeline
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
//! **Bounded, per scope.** The keys of a line come from the call's arguments, which a client
//! may choose; a line lives only while some call waits in it (the last one to leave removes
//! it), so the lines are at most one per waiting call, and at most [`MAX_LINES`] lines of keys
//! in the process, [`MAX_LINES_PER_SCOPE`] of them for one scope (the scopes of a function's
//! limits, on one store): a client minting keys on one function fills that function's lines,
//! never another's. A refused call that finds no room for a line of its own waits in its
//! scope's **overflow line**, in order behind the earlier calls of its own keys only: the
//! overflow line keeps a turn per key among its calls (a lock and a count, removed by the
//! last of them to leave, so at most one per waiting call, as a line's queue of waiters
//! is), and the first call of each key sleeps for its own slot. A client's minted keys in
//! the overflow line never delay another key's call whose slot is free. Past [`MAX_SCOPES`]
//! scopes with lines, the process's one overflow line takes their calls, alike. No refused
//! call waits out of line.

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

/// The most lines of keys the process keeps at once (one per set of keys some call waits for).
pub(crate) const MAX_LINES: usize = 10_000;

/// The most lines of keys one scope keeps at once (the scopes of a function's limits, on one
/// store).
pub(crate) const MAX_LINES_PER_SCOPE: usize = 1_000;

/// The most scopes the process keeps lines for at once.
pub(crate) const MAX_SCOPES: usize = 1_000;

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
        return prepared.run_soon(limiter).await; // exempt: nothing to wait for
    };
    // Why the call is waiting, and when it may try again.
    let mut last: Option<Limited> = None;
    if !lines.has_line(key) {
        match prepared.run_soon(limiter).await {
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
    if let Some(spent) = &last {
        place.line.record(spent);
    }
    let Ok(_turn) = tokio::time::timeout_at(deadline, place.turn.lock()).await else {
        // The budget ran out in the line: the latest refusal this call or its line saw.
        return match last.or_else(|| place.latest()) {
            Some(spent) => Err(spent.refused()),
            None => prepare()?.run_soon(limiter).await,
        };
    };
    // The head of the line: sleep until the slot, check, again until admitted or out of time.
    // A slot that passed while the call waited in the line is checked at once; a refusal
    // just answered is slept on (at least [`MIN_SLEEP`], so it never spins).
    let mut fresh = false;
    loop {
        if let Some(spent) = &last
            && (fresh || spent.at > Instant::now())
        {
            tokio::time::sleep_until(spent.next_try().min(deadline)).await;
        }
        match prepare()?.run_soon(limiter).await {
            Err(Refused::Limited { limits, verdict }) => {
                let spent = Limited::new(limits, verdict);
                place.line.record(&spent);
                if !spent.fits(deadline) {
                    return Err(spent.refused());
                }
                last = Some(spent);
                fresh = true;
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

/// Whose capacity a line takes: its store and the scopes of the function's limits (static
/// names, written in the program: a client cannot mint them).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct ScopeKey(u64);

/// The line a call holds a place in.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Seat {
    /// The line of its keys.
    Keys(ScopeKey, LineKey),
    /// Its scope's overflow line: the scope keeps its most lines.
    Overflow(ScopeKey),
    /// The process's overflow line: the process keeps its most scopes.
    Spill,
}

impl Seat {
    fn scope(self) -> Option<ScopeKey> {
        match self {
            Self::Keys(scope, _) | Self::Overflow(scope) => Some(scope),
            Self::Spill => None,
        }
    }
}

/// How many lines the process keeps at once.
#[derive(Clone, Copy, Debug)]
struct Bounds {
    /// Lines of keys, the whole process.
    lines: usize,
    /// Lines of keys, one scope.
    per_scope: usize,
    /// Scopes with a line (each may add its overflow line).
    scopes: usize,
}

/// The bounds of the process's lines: one scope's keys fill at most a tenth of the process's
/// lines, so a client minting keys on one function leaves the others theirs.
const BOUNDS: Bounds = Bounds {
    lines: MAX_LINES,
    per_scope: MAX_LINES_PER_SCOPE,
    scopes: MAX_SCOPES,
};

/// A turn, handed over first come first served.
type Turn = Arc<tokio::sync::Mutex<()>>;

/// One line: its turn, and the latest refusal its head saw (what a call whose budget ends in
/// the line answers). An overflow line holds calls of many keys: it keeps a turn per key
/// among its calls instead (with how many hold a place in it), so that a call waits only
/// behind earlier calls of its own keys, never behind another key's sleep.
#[derive(Default)]
struct Line {
    turn: Turn,
    latest: Mutex<Option<Limited>>,
    by_key: Mutex<HashMap<LineKey, (Turn, usize)>>,
}

impl Line {
    /// A place in the turn of `key`, in an overflow line (made when there is none).
    fn enter_key(&self, key: LineKey) -> Turn {
        let mut by_key = self.by_key.lock().unwrap_or_else(PoisonError::into_inner);
        let (turn, places) = by_key.entry(key).or_default();
        *places += 1;
        Arc::clone(turn)
    }

    /// Leaves the turn of `key`; the last to leave removes it.
    fn leave_key(&self, key: LineKey) {
        let mut by_key = self.by_key.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, places)) = by_key.get_mut(&key) {
            *places -= 1;
            if *places == 0 {
                by_key.remove(&key);
            }
        }
    }

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

/// The lines that exist, each with how many calls hold a place in it, and how many lines each
/// scope has (its lines of keys and its overflow line).
#[derive(Default)]
struct Seats {
    lines: HashMap<Seat, (Arc<Line>, usize)>,
    /// Lines of keys in `lines`.
    keyed: usize,
    per_scope: HashMap<ScopeKey, usize>,
}

impl Seats {
    /// Where a call waiting for `scope`'s line `key` sits: that line when it exists or fits
    /// in the bounds, else its scope's overflow line, else (the process keeps its most
    /// scopes) the process's.
    fn seat_for(&self, scope: ScopeKey, key: LineKey, bounds: Bounds) -> Seat {
        let keyed = Seat::Keys(scope, key);
        if self.lines.contains_key(&keyed) {
            return keyed;
        }
        let scope_lines = self.per_scope.get(&scope).copied();
        if scope_lines.is_none() && self.per_scope.len() >= bounds.scopes {
            return Seat::Spill;
        }
        let full = scope_lines.unwrap_or(0) >= bounds.per_scope || self.keyed >= bounds.lines;
        if full { Seat::Overflow(scope) } else { keyed }
    }

    /// A place in `seat`'s line, made when there is none.
    fn enter(&mut self, seat: Seat) -> Arc<Line> {
        let (line, places) = self.lines.entry(seat).or_insert_with(|| {
            if let Some(scope) = seat.scope() {
                *self.per_scope.entry(scope).or_default() += 1;
            }
            if matches!(seat, Seat::Keys(..)) {
                self.keyed += 1;
            }
            (Arc::default(), 0)
        });
        *places += 1;
        Arc::clone(line)
    }

    /// Leaves `seat`'s line; the last to leave removes it.
    fn leave(&mut self, seat: Seat) {
        let Some((_, places)) = self.lines.get_mut(&seat) else {
            return;
        };
        *places -= 1;
        if *places > 0 {
            return;
        }
        self.lines.remove(&seat);
        if matches!(seat, Seat::Keys(..)) {
            self.keyed -= 1;
        }
        if let Some(scope) = seat.scope()
            && let Some(n) = self.per_scope.get_mut(&scope)
        {
            *n -= 1;
            if *n == 0 {
                self.per_scope.remove(&scope);
            }
        }
    }
}

/// The process's lines.
struct Lines {
    seats: Mutex<Seats>,
    /// How many calls hold a place in some line: 0 is the fast path's one load.
    waiting: AtomicUsize,
    bounds: Bounds,
    hasher: std::collections::hash_map::RandomState,
}

static LINES: LazyLock<Lines> = LazyLock::new(|| Lines::new(BOUNDS));

impl Lines {
    fn new(bounds: Bounds) -> Self {
        Self {
            seats: Mutex::new(Seats::default()),
            waiting: AtomicUsize::new(0),
            bounds,
            hasher: std::collections::hash_map::RandomState::new(),
        }
    }

    /// The scope and the line of a prepared call: its store, its function's scopes and its
    /// keys (none for an exempt call).
    fn key(&self, limiter: &RateLimiter, prepared: &Prepared<'_>) -> Option<(ScopeKey, LineKey)> {
        let (limits, keys): (&[Limit], &[String]) = match prepared {
            Prepared::Exempt => return None,
            Prepared::Fixed { limits, keys } => (limits, keys),
            Prepared::Planned { limits, plan } => (limits, &plan.keys),
        };
        let store = Arc::as_ptr(limiter.store()).cast::<()>().addr();
        let mut h = self.hasher.build_hasher();
        store.hash(&mut h);
        for limit in limits {
            limit.scope.hash(&mut h);
        }
        let scope = ScopeKey(h.finish());
        let mut h = self.hasher.build_hasher();
        store.hash(&mut h);
        keys.hash(&mut h);
        Some((scope, LineKey(h.finish())))
    }

    fn seats(&self) -> MutexGuard<'_, Seats> {
        self.seats.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether some call waits in the line of `key` (without a lock while no call waits at
    /// all).
    fn has_line(&self, (scope, key): (ScopeKey, LineKey)) -> bool {
        self.waiting.load(Ordering::Relaxed) > 0
            && self.seats().lines.contains_key(&Seat::Keys(scope, key))
    }

    /// A place at the back of the line of `key` (made when there is none), or of the
    /// overflow line of its scope when the scope or the process keeps its most lines.
    fn join(&'static self, (scope, key): (ScopeKey, LineKey)) -> Place {
        let mut seats = self.seats();
        let seat = seats.seat_for(scope, key, self.bounds);
        let line = seats.enter(seat);
        let turn = match seat {
            Seat::Keys(..) => Arc::clone(&line.turn),
            Seat::Overflow(_) | Seat::Spill => line.enter_key(key),
        };
        self.waiting.fetch_add(1, Ordering::Relaxed);
        Place {
            lines: self,
            seat,
            key,
            line,
            turn,
        }
    }

    /// How many lines there are, overflow lines included (for the tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.seats().lines.len()
    }
}

/// A call's place in a line; its drop leaves the line, and the last to leave removes it.
struct Place {
    lines: &'static Lines,
    seat: Seat,
    key: LineKey,
    line: Arc<Line>,
    /// The turn the call waits for: its line's, or in an overflow line its key's.
    turn: Turn,
}

impl Place {
    /// The latest refusal of the line, when it is the line of the call's own keys (an
    /// overflow line's is another key's).
    fn latest(&self) -> Option<Limited> {
        match self.seat {
            Seat::Keys(..) => self.line.latest(),
            Seat::Overflow(_) | Seat::Spill => None,
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if !matches!(self.seat, Seat::Keys(..)) {
            self.line.leave_key(self.key);
        }
        self.lines.seats().leave(self.seat);
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
    use crate::limiter::test_support::limiter;
    use crate::policy::Policy;

    /// One call per 100 ms, no burst.
    fn one_per_100ms() -> [Limit; 1] {
        let policy = Policy::new(Algorithm::Gcra, 1, Duration::from_millis(100))
            .and_then(|p| p.with_burst(1))
            .unwrap();
        [Limit::new(policy, "wait_tests", By::Global)]
    }

    fn lines(bounds: Bounds) -> &'static Lines {
        Box::leak(Box::new(Lines::new(bounds)))
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
        let (lines, limiter, limits) = (lines(BOUNDS), limiter().await, one_per_100ms());
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
        let (lines, limiter, limits) = (lines(BOUNDS), limiter().await, one_per_100ms());
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
        let (lines, limiter, limits) = (lines(BOUNDS), limiter().await, one_per_100ms());
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
        let (lines, limiter) = (lines(BOUNDS), limiter().await);
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

    /// A flood of distinct keys (a client picks the arguments that make them): the scope holds
    /// at most its most lines and its overflow line, every call still waits within its
    /// budget, and the lines empty as the calls leave.
    #[tokio::test(start_paused = true)]
    async fn a_flood_of_distinct_keys_never_grows_the_lines_past_their_bound() {
        let bounds = Bounds {
            lines: 1_000,
            per_scope: 64,
            scopes: 8,
        };
        let (lines, limiter, limits) = (lines(bounds), limiter().await, one_per_100ms());
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
            64 + 1,
            "the scope's most lines and its overflow line while 1000 keys wait"
        );
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        assert!(peak.load(Ordering::Relaxed) <= 64 + 1);
        assert_eq!(lines.len(), 0);
        assert_eq!(lines.waiting.load(Ordering::Relaxed), 0);
    }

    /// The bounds: a scope past its most lines sits in its overflow line, the process past
    /// its most lines puts every scope's new keys in that scope's overflow line, and past its
    /// most scopes in the process's; the lines of keys never pass the process's bound.
    #[test]
    fn seats_stay_within_their_bounds() {
        let bounds = Bounds {
            lines: 5,
            per_scope: 3,
            scopes: 2,
        };
        let mut seats = Seats::default();
        let (a, b, c) = (ScopeKey(1), ScopeKey(2), ScopeKey(3));
        let taken: Vec<Seat> = (0..4)
            .map(|k| {
                let seat = seats.seat_for(a, LineKey(k), bounds);
                seats.enter(seat);
                seat
            })
            .collect();
        assert_eq!(taken[3], Seat::Overflow(a), "{taken:?}");
        assert_eq!(
            seats.seat_for(a, LineKey(0), bounds),
            Seat::Keys(a, LineKey(0))
        );
        for k in 10..12 {
            assert_eq!(
                seats.seat_for(b, LineKey(k), bounds),
                Seat::Keys(b, LineKey(k))
            );
            seats.enter(Seat::Keys(b, LineKey(k)));
        }
        assert_eq!(seats.keyed, 5);
        assert_eq!(seats.seat_for(b, LineKey(12), bounds), Seat::Overflow(b));
        assert_eq!(seats.seat_for(c, LineKey(20), bounds), Seat::Spill);
        for seat in taken {
            seats.leave(seat);
        }
        assert_eq!(seats.per_scope.get(&a), None);
        assert_eq!(
            seats.seat_for(c, LineKey(20), bounds),
            Seat::Keys(c, LineKey(20))
        );
    }

    /// A GCRA limit of `num` calls per `period`, no burst, in `scope`.
    fn gcra(num: u64, period: Duration, scope: &'static str) -> [Limit; 1] {
        let policy = Policy::new(Algorithm::Gcra, num, period)
            .and_then(|p| p.with_burst(1))
            .unwrap();
        [Limit::new(policy, scope, By::Global)]
    }

    /// Waiters of one function (of `scope`), 3 ms apart, waiter `i` giving up at
    /// `(i + 1) * 100 + 60` ms on a limit of 10 a second whose slot is spent: the ids of those
    /// admitted, in the order they were.
    async fn ten_waiters(
        lines: &'static Lines,
        limiter: &RateLimiter,
        scope: &'static str,
    ) -> Vec<u32> {
        let limits = gcra(10, Duration::from_secs(1), scope);
        call(lines, limiter, &limits, "v", Duration::ZERO)
            .await
            .unwrap();
        let start = Instant::now();
        let order = Arc::new(StdMutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..10_u32 {
            let (limiter, order) = (limiter.clone(), Arc::clone(&order));
            let gives_up = Duration::from_millis(u64::from(i + 1) * 100 + 60);
            tasks.push(tokio::spawn(async move {
                let budget = gives_up.saturating_sub(start.elapsed());
                if call(lines, &limiter, &limits, "v", budget).await.is_ok() {
                    order.lock().unwrap().push(i);
                }
            }));
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        for t in tasks {
            t.await.unwrap();
        }
        order.lock().unwrap().clone()
    }

    /// `n` calls of the flooding function, each under a key of its own whose slot is spent,
    /// waiting for it (10 s away, within their budget).
    async fn flood(
        lines: &'static Lines,
        limiter: &RateLimiter,
        n: usize,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let limits = gcra(1, Duration::from_secs(10), "wait_flood");
        let mut tasks = Vec::with_capacity(n);
        for i in 0..n {
            let key = format!("minted-{i}");
            call(lines, limiter, &limits, &key, Duration::ZERO)
                .await
                .unwrap();
            let limiter = limiter.clone();
            tasks.push(tokio::spawn(async move {
                let _ = call(lines, &limiter, &limits, &key, Duration::from_secs(20)).await;
            }));
        }
        // Every flooding call has found its place before the other function's calls come.
        tokio::time::sleep(Duration::from_millis(1)).await;
        tasks
    }

    /// One function's minted keys cannot take another's order: with 10,000 (and more) keys
    /// of one function waiting, the 10 waiters of another are all admitted, in arrival order.
    #[tokio::test(start_paused = true)]
    async fn a_flood_of_one_function_s_keys_leaves_another_s_line_in_order() {
        for n in [0, 10_000, 12_000] {
            let (lines, limiter) = (lines(BOUNDS), limiter().await);
            let flooding = flood(lines, &limiter, n).await;
            let order = ten_waiters(lines, &limiter, "wait_victim").await;
            let ids: Vec<u32> = (0..10).collect();
            let shown: Vec<String> = order.iter().map(u32::to_string).collect();
            assert_eq!(
                order,
                ids,
                "{n} minted keys: {} of 10 admitted, order {}",
                order.len(),
                shown.join("-")
            );
            for t in flooding {
                t.abort();
            }
        }
    }

    /// The flooding function's own calls past its most lines wait in its overflow line: in
    /// order and within their budgets.
    #[tokio::test(start_paused = true)]
    async fn a_flooded_scope_s_overflow_callers_wait_in_order() {
        let (lines, limiter) = (lines(BOUNDS), limiter().await);
        let flooding = flood(lines, &limiter, MAX_LINES_PER_SCOPE).await;
        assert_eq!(lines.len(), MAX_LINES_PER_SCOPE);
        let order = ten_waiters(lines, &limiter, "wait_flood").await;
        assert_eq!(order, (0..10).collect::<Vec<u32>>());
        assert_eq!(
            lines.len(),
            MAX_LINES_PER_SCOPE,
            "the overflow line left with its last call"
        );
        for t in flooding {
            t.abort();
        }
    }

    /// Minted keys past the flooded function's most lines wait in its overflow line, each for
    /// a slot 10 s away: an innocent caller of that function, whose own slot comes every
    /// 100 ms, waits only for its own key. Its 10 waiters are all admitted, in arrival order,
    /// within their budgets; the lines stay within their bounds.
    #[tokio::test(start_paused = true)]
    async fn an_innocent_caller_of_a_flooded_function_waits_only_for_its_own_key() {
        let (lines, limiter) = (lines(BOUNDS), limiter().await);
        let flooding = flood(lines, &limiter, MAX_LINES_PER_SCOPE + 100).await;
        assert_eq!(
            lines.len(),
            MAX_LINES_PER_SCOPE + 1,
            "the scope's lines and its overflow"
        );
        let order = ten_waiters(lines, &limiter, "wait_flood").await;
        let shown: Vec<String> = order.iter().map(u32::to_string).collect();
        assert_eq!(
            order,
            (0..10).collect::<Vec<u32>>(),
            "{} of 10 admitted, order {}",
            order.len(),
            shown.join("-")
        );
        assert_eq!(lines.len(), MAX_LINES_PER_SCOPE + 1);
        for t in flooding {
            t.abort();
        }
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
