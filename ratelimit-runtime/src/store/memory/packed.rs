//! The packed forms of a key's state: the states whose numbers fit a [`Cell`]'s words, each
//! as its own type for the fast path ([`PackedState`]), and how each is laid out in the words
//! (a fixed window and GCRA in one).
//!
//! [`Cell`]: super::cell::Cell

use crate::algorithm::Algorithm;
use crate::algorithm::bucket::Level;
use crate::algorithm::fixed::Window;
use crate::algorithm::gcra::Tat;
use crate::algorithm::sliding_counter::Counters;
use crate::algorithm::{Evaluation, Params, State};
use crate::algorithm::{bucket, fixed, gcra, sliding_counter};

/// The states whose numbers fit in a [`Cell`](super::cell::Cell)'s three words: every
/// algorithm's but the sliding log's. Their one-limit checks take the fast path
/// ([`Inner::check_packed`](super::Inner::check_packed)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Packed {
    Fixed,
    Bucket,
    Gcra,
    Counter,
}

impl Packed {
    /// The packed form of `algorithm`'s state, if it has one.
    pub(super) fn of(algorithm: Algorithm) -> Option<Self> {
        match algorithm {
            Algorithm::Fixed => Some(Self::Fixed),
            Algorithm::Leaky | Algorithm::Token => Some(Self::Bucket),
            Algorithm::Gcra => Some(Self::Gcra),
            Algorithm::SlidingCounter => Some(Self::Counter),
            // `Algorithm` is non-exhaustive within the crate too: a new one starts unpacked.
            _ => None,
        }
    }

    /// `state`'s form and numbers, if it packs (a window whose numbers do not fit its word
    /// does not: [`PackedState::fits`]).
    pub(super) fn pack(state: &State) -> Option<(Self, [u64; 3])> {
        Some(match state {
            State::Fixed(w) if w.fits() => (Self::Fixed, w.words()),
            State::Bucket(b) => (Self::Bucket, b.words()),
            State::Gcra(t) => (Self::Gcra, t.words()),
            State::SlidingCounter(c) => (Self::Counter, c.words()),
            State::Fixed(_) | State::Sliding(_) | State::Concurrency(_) => return None,
        })
    }

    /// For a form whose state is one word ([`PackedState::IDLE_OF_WORD`]: the fixed window,
    /// GCRA), when the state in `word` becomes idle, µs; `None` for the other forms.
    pub(super) fn idle_of_word(self, word: u64) -> Option<u64> {
        let idle_of = match self {
            Self::Fixed => Window::IDLE_OF_WORD,
            Self::Bucket => Level::IDLE_OF_WORD,
            Self::Gcra => Tat::IDLE_OF_WORD,
            Self::Counter => Counters::IDLE_OF_WORD,
        };
        idle_of.map(|idle_of| idle_of(word))
    }

    /// The state of these numbers (the inverse of [`Packed::pack`]).
    pub(super) fn unpack(self, w: [u64; 3]) -> State {
        match self {
            Self::Fixed => State::Fixed(Window::of_words(w)),
            Self::Bucket => State::Bucket(Level::of_words(w)),
            Self::Gcra => State::Gcra(Tat::of_words(w)),
            Self::Counter => State::SlidingCounter(Counters::of_words(w)),
        }
    }
}

/// A packed form's state as its own type, for the fast path
/// ([`Inner::check_packed`](super::Inner::check_packed)): the algorithm's rules on its plain
/// numbers, chosen once per check by the cell's form, where the [`State`] enum would choose at
/// every step (normalize, evaluate, idle time, packing) and leave a value to drop. The rules
/// stay the algorithms' own; this only names them per form.
pub(super) trait PackedState: Copy {
    /// How many of the cell's words the state uses (a write stores only these).
    const WORDS: usize;
    /// For a state that is its first word alone (GCRA's arrival time; a fixed window whose
    /// count and end fit one word): when the state in a word becomes idle, µs, read from the
    /// word alone. A fast write of such a state is one compare-and-swap of that word, as
    /// governor's is, and leaves the cell's `seq` and `idle_at` as they are: the cell reads
    /// its idle time from the word. `None` for a state of several words.
    const IDLE_OF_WORD: Option<fn(u64) -> u64> = None;
    /// Whether the state fits the cell's words (always, but for a one-word state whose
    /// numbers do not: then it is kept unpacked, and a fast write that would leave it goes to
    /// the shard's write lock instead).
    #[inline]
    fn fits(self) -> bool {
        true
    }
    /// The state of the cell's words.
    fn of_words(w: [u64; 3]) -> Self;
    /// The words of the state (unused ones 0).
    fn words(self) -> [u64; 3];
    /// The algorithm's `normalize`: a stamp ahead of `now` brought back to it.
    fn normalize(&mut self, p: &Params, now: u64) -> bool;
    /// When the state becomes idle, µs.
    fn idle_at(self, p: &Params) -> u64;
    /// When `next`, the state an admitted call left (`e` its evaluation at `now`), becomes
    /// idle, µs: [`PackedState::idle_at`], unless the evaluation already says.
    #[inline]
    fn idle_after(next: Self, e: &Evaluation, now: u64, p: &Params) -> u64 {
        let _ = (e, now);
        next.idle_at(p)
    }
    /// The algorithm's `evaluate`.
    fn evaluate(state: Option<&Self>, p: &Params, now: u64) -> (Evaluation, Option<Self>);
}

/// The bits of a fixed window's word ([`Window`] packed) that hold its count; the bits above
/// hold the millisecond its key expires at.
///
/// The split is a trade between the two ways a window can outgrow the word, each of which
/// sends its checks to the shard's write lock (the same answers, one writer at a time):
/// a count past 2^28 − 1 in one window (a hot key under a large limit: at 24 bits, a key
/// checked ten million times a second crossed it within two seconds, and its checks ran at
/// half the speed), or a window ending past 2^36 ms of the store's clock (two years and two
/// months of a process's life).
const WINDOW_COUNT_BITS: u32 = 28;
/// The most a packed window counts (limits of up to 268,435,455 units a window pack).
pub(super) const WINDOW_MAX_COUNT: u64 = (1 << WINDOW_COUNT_BITS) - 1;
/// The first expiry millisecond a packed window cannot hold: 2^36 ms, 795 days of the memory
/// store's clock. The store's own clocks count from their creation; a [`Clock`] whose origin
/// is further back (the Unix epoch) leaves every window unpacked, checked under the shard's
/// write lock: the same answers, without the read-lock path.
///
/// [`Clock`]: super::Clock
pub(super) const WINDOW_END_MS: u64 = 1 << (64 - WINDOW_COUNT_BITS);

/// A fixed window is one word, its count and its expiry millisecond, so that a fast write is
/// one compare-and-swap (when they fit: [`PackedState::fits`]).
impl PackedState for Window {
    const WORDS: usize = 1;
    const IDLE_OF_WORD: Option<fn(u64) -> u64> =
        Some(|word| Window::idle_at(&Window::of_words([word, 0, 0])));
    #[inline]
    fn fits(self) -> bool {
        self.count <= WINDOW_MAX_COUNT && self.expires_ms < WINDOW_END_MS
    }
    fn of_words(w: [u64; 3]) -> Self {
        Self {
            count: w[0] & WINDOW_MAX_COUNT,
            expires_ms: w[0] >> WINDOW_COUNT_BITS,
        }
    }
    fn words(self) -> [u64; 3] {
        [(self.expires_ms << WINDOW_COUNT_BITS) | self.count, 0, 0]
    }
    fn normalize(&mut self, p: &Params, now: u64) -> bool {
        fixed::normalize(self, p, now)
    }
    fn idle_at(self, _: &Params) -> u64 {
        Window::idle_at(&self)
    }
    fn evaluate(state: Option<&Self>, p: &Params, now: u64) -> (Evaluation, Option<Self>) {
        fixed::evaluate(state, p, now)
    }
}

impl PackedState for Level {
    const WORDS: usize = 2;
    fn of_words(w: [u64; 3]) -> Self {
        Self {
            at_us: w[0],
            units: w[1],
        }
    }
    fn words(self) -> [u64; 3] {
        [self.at_us, self.units, 0]
    }
    fn normalize(&mut self, p: &Params, now: u64) -> bool {
        bucket::normalize(self, p, now)
    }
    fn idle_at(self, p: &Params) -> u64 {
        Level::idle_at(&self, p)
    }
    #[inline]
    fn idle_after(_: Self, e: &Evaluation, now: u64, _: &Params) -> u64 {
        Level::idle_after(e, now)
    }
    #[inline(always)]
    #[allow(
        clippy::inline_always,
        reason = "inlined into the memory store's check, measured: `#[inline]` alone leaves it a call"
    )]
    fn evaluate(state: Option<&Self>, p: &Params, now: u64) -> (Evaluation, Option<Self>) {
        bucket::evaluate(state, p, now)
    }
}

/// GCRA's arrival time is one word, and when its state becomes idle.
impl PackedState for Tat {
    const WORDS: usize = 1;
    const IDLE_OF_WORD: Option<fn(u64) -> u64> = Some(|word| word);
    fn of_words(w: [u64; 3]) -> Self {
        Self(w[0])
    }
    fn words(self) -> [u64; 3] {
        [self.0, 0, 0]
    }
    fn normalize(&mut self, p: &Params, now: u64) -> bool {
        gcra::normalize(self, p, now)
    }
    fn idle_at(self, _: &Params) -> u64 {
        Tat::idle_at(self)
    }
    fn evaluate(state: Option<&Self>, p: &Params, now: u64) -> (Evaluation, Option<Self>) {
        gcra::evaluate(state, p, now)
    }
}

impl PackedState for Counters {
    const WORDS: usize = 3;
    fn of_words(w: [u64; 3]) -> Self {
        Self {
            window: w[0],
            cur: w[1],
            prev: w[2],
        }
    }
    fn words(self) -> [u64; 3] {
        [self.window, self.cur, self.prev]
    }
    fn normalize(&mut self, p: &Params, now: u64) -> bool {
        sliding_counter::normalize(self, p, now)
    }
    fn idle_at(self, p: &Params) -> u64 {
        Counters::idle_at(self, p)
    }
    #[inline]
    fn idle_after(_: Self, e: &Evaluation, now: u64, _: &Params) -> u64 {
        Counters::idle_after(e, now)
    }
    #[inline(always)]
    #[allow(
        clippy::inline_always,
        reason = "inlined into the memory store's check, measured: `#[inline]` alone leaves it a call"
    )]
    fn evaluate(state: Option<&Self>, p: &Params, now: u64) -> (Evaluation, Option<Self>) {
        sliding_counter::evaluate(state, p, now)
    }
}
