//! Seeded random traces: policies worth testing, and (time step, cost) sequences that dwell on
//! the edges (0 and 1 µs steps, millisecond boundaries, one period, exactly `retry_after`).

use ratelimit_runtime::{Algorithm, Policy};

/// `SplitMix64`: small, deterministic, good enough to pick test inputs.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform in `lo..=hi`.
    pub(crate) fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// `true` with probability `percent` / 100.
    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    pub(crate) fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        let i = usize::try_from(self.below(items.len() as u64)).unwrap_or(0);
        &items[i]
    }
}

const DAY_MS: u64 = 86_400_000;

/// `(num, period ms, burst)` worth testing: fractional rates (3 per 10 s), `burst` ≠ `num`, 1 ms
/// and 1 day periods, rates finer and coarser than a µs, periods that are not whole seconds.
const SHAPES: &[(u64, u64, u64)] = &[
    (5, 1000, 5),
    (3, 10_000, 3),
    (3, 10_000, 7),
    (1, 1, 1),
    (10, 1, 4),
    (6, 1, 13),
    (2, 7, 2),
    (7, 3, 2),
    (4, DAY_MS, 9),
    (1000, DAY_MS, 1000),
    (1000, 1000, 10),
    (100, 60_000, 30),
    (9, 250, 9),
];

/// A random valid policy of `algorithm` (cost 1: the cost is drawn per call).
pub(crate) fn policy(rng: &mut Rng, algorithm: Algorithm) -> Policy {
    let &(num, period_ms, burst) = rng.pick(SHAPES);
    Policy::from_parts(algorithm, num, period_ms, burst, 1).expect("a valid policy")
}

/// A cost for one call: mostly 1, often the whole capacity (`cost = burst`), else any.
pub(crate) fn cost(rng: &mut Rng, policy: &Policy) -> u64 {
    let cap = policy.capacity();
    match rng.below(10) {
        0..=5 => 1,
        6 | 7 => cap,
        _ => rng.between(1, cap),
    }
}

/// The next time step, µs, for a call whose limits have periods up to `period_us` and whose
/// last rejection said `retry_us` (0 when none), at time `now_us`.
pub(crate) fn step(rng: &mut Rng, now_us: u64, period_us: u64, unit_us: u64, retry_us: u64) -> u64 {
    match rng.below(100) {
        0..=24 => 0,
        25..=29 => 1,
        30..=39 => rng.between(1, 1000),
        // To the next millisecond boundary, or 1 µs either side of it.
        40..=49 => (1000 - now_us % 1000) + rng.below(3) - 1,
        // About the time one unit takes to come back.
        50..=64 => rng.between(0, unit_us.saturating_mul(2).max(2)),
        65..=74 => rng.between(0, period_us),
        75..=79 => period_us + rng.below(3) - 1 + if rng.chance(30) { 1000 } else { 0 },
        80..=84 => rng.between(0, period_us.saturating_mul(3)),
        // At `retry_after`, or 1 µs before or after it.
        _ if retry_us > 0 => retry_us + rng.below(3) - 1,
        _ => rng.between(0, 5000),
    }
}
