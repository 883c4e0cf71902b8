//! The cell: one key's entry in its packed form's words, and what lets one-limit checks
//! update it under the shard's read lock: one compare-and-swap of a one-word state, the
//! sequence lock over the others.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering, fence};

use super::packed::{Packed, PackedState};
use crate::algorithm::{self, Params, State};

/// One key's state and when it becomes idle (equal to no state at all), in µs: what the rules
/// read and write. A [`Cell`] holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) idle_at: u64,
    pub(super) state: State,
}

impl Entry {
    pub(super) fn new(state: State, p: &Params) -> Self {
        Self {
            idle_at: algorithm::idle_at(&state, p),
            state,
        }
    }

    pub(super) fn live(&self, now: u64) -> bool {
        now < self.idle_at
    }

    /// State stamped in the future — by a [`Clock`] that went backwards — is treated as
    /// stamped now ([`algorithm::normalize`]), as the Redis scripts treat state written by a
    /// master whose clock was ahead. A monotonic clock never changes anything here.
    /// `true` when it changed (and so did `idle_at`).
    pub(super) fn normalize(&mut self, p: &Params, now: u64) -> bool {
        let changed = self.live(now) && algorithm::normalize(&mut self.state, p, now);
        if changed {
            self.idle_at = algorithm::idle_at(&self.state, p);
        }
        changed
    }
}

/// Where a cell's `seq` keeps its packed form: its top two bits (see [`Cell`]).
const TAG_SHIFT: u32 = 62;
/// The bits of a cell's `seq` that count its writes.
const COUNTER: u64 = (1 << TAG_SHIFT) - 1;

/// A form's place in a cell's `seq`.
impl Packed {
    /// The form's tag in a cell's `seq` (its top two bits).
    const fn tag(self) -> u64 {
        (self as u64) << TAG_SHIFT
    }

    /// The form a cell's `seq` names.
    const fn of_seq(seq: u64) -> Self {
        match seq >> TAG_SHIFT {
            0 => Self::Fixed,
            1 => Self::Bucket,
            2 => Self::Gcra,
            _ => Self::Counter,
        }
    }
}

/// Where an [`Entry`] lives, so that one-limit checks can update it under the shard's *read*
/// lock, as governor's keyed limiter does: a sequence lock over atomic words.
///
/// * `seq` is even while the words are stable and odd while a writer stores them. A writer
///   holds the shard's read lock, reads the words (after an even `seq`), evaluates, and claims
///   the cell by a compare-and-swap of `seq` from the value it read to the next odd one: it
///   succeeds only when no other write happened since its read, so every write is computed on
///   the state it replaces (a lost race evaluates again on the new state). It then stores the
///   words and makes `seq` even again.
/// * A reader that writes nothing (a rejection) checks that `seq` did not move during its
///   read: its answer is that of a consistent state.
/// * Everything else — stacked checks, takes, refunds, new keys, sweeps, a key changing
///   algorithm — holds the shard's *write* lock, which no fast writer holds a read lock
///   against: it reads and writes the cells through `&mut`, with every fast write either done
///   before it or begun after it. That is how a stacked check stays all or nothing against
///   the same entries.
///
/// A state of one word ([`PackedState::IDLE_OF_WORD`]: GCRA's arrival time, a fixed window's
/// count and end) skips the sequence: a fast write is a compare-and-swap of the word from the
/// value the rule read to the value it wrote, retried on the value that won. The word is the
/// whole state, so a read of it is consistent by itself, and the cell's idle time is read from
/// it ([`Cell::idle_at`]): the `idle_at` field and `seq`'s count are left as [`Cell::set`]
/// wrote them. A write that succeeds was computed on the value it replaces, which is the whole
/// state: the rule depends on nothing else but the time and the policy. The value may have
/// been written and written back since it was read (a restamp moves a word back: a clock that
/// stepped back, or a key shared by a policy with a shorter period or a smaller burst), so the
/// write may have been computed at a time earlier than the latest write's: the call then takes
/// effect as if made at its own reading of the clock, on the same state, which a rule allows
/// (GCRA is stricter at an earlier time, a window that exists then is the same window).
///
/// The cell keeps its form in the top two bits of `seq` (which [`Packed`] the words hold; set
/// only with exclusive access, so a fast writer's compare-and-swap keeps it), and a state
/// that does not pack (the sliding log) in `other`, beside the words: a cell is 48 bytes, so
/// that a map entry (the key and its cell) fills one cache line.
pub(super) struct Cell {
    seq: AtomicU64,
    idle_at: AtomicU64,
    words: [AtomicU64; 3],
    /// The state when it does not pack; changed only under the shard's write lock.
    other: Option<Box<State>>,
}

impl Cell {
    pub(super) fn new(entry: Entry) -> Self {
        let mut cell = Self {
            seq: AtomicU64::new(0),
            idle_at: AtomicU64::new(0),
            words: Default::default(),
            other: None,
        };
        cell.set(entry);
        cell
    }

    /// When the entry becomes idle: the `idle_at` field, or for a one-word state what its
    /// word says, which its fast writes change alone.
    pub(super) fn idle_at(&self) -> u64 {
        if let Some(form) = self.packed()
            && let Some(idle_at) = form.idle_of_word(self.words[0].load(Ordering::Acquire))
        {
            return idle_at;
        }
        self.idle_at.load(Ordering::Acquire)
    }

    pub(super) fn live(&self, now: u64) -> bool {
        now < self.idle_at()
    }

    /// Replaces the entry (exclusive access: no fast writer is running).
    ///
    /// A one-word state's idle time is read from its word, so an entry marked idle before its
    /// state is (a refund or a settle that gave back all a call held: idle now, swept with the
    /// others) is kept unpacked, with its idle time, until a write through the shard's write
    /// lock (an admitted call, a restamp) packs it again.
    pub(super) fn set(&mut self, entry: Entry) {
        *self.idle_at.get_mut() = entry.idle_at;
        let packed = Packed::pack(&entry.state).filter(|(form, words)| {
            form.idle_of_word(words[0])
                .is_none_or(|idle_at| idle_at == entry.idle_at)
        });
        if let Some((form, words)) = packed {
            for (w, v) in self.words.iter_mut().zip(words) {
                *w.get_mut() = v;
            }
            let seq = self.seq.get_mut();
            *seq = (*seq & COUNTER) | form.tag();
            self.other = None;
        } else if let Some(held) = &mut self.other {
            **held = entry.state;
        } else {
            self.other = Some(Box::new(entry.state));
        }
    }

    /// The packed form of the state held, if it packs. Under the shard's read lock too: the
    /// form changes only with exclusive access.
    pub(super) fn packed(&self) -> Option<Packed> {
        match self.other {
            Some(_) => None,
            None => Some(Packed::of_seq(self.seq.load(Ordering::Relaxed))),
        }
    }

    /// When the entry becomes idle and its state, to change in place, when it is not packed
    /// (exclusive access: no fast writer is running). Whoever changes the state sets
    /// `idle_at` to match.
    pub(super) fn unpacked_mut(&mut self) -> Option<(&mut u64, &mut State)> {
        let state = self.other.as_deref_mut()?;
        Some((self.idle_at.get_mut(), state))
    }

    /// [`Entry::normalize`] in place, with exclusive access; `true` when it changed.
    pub(super) fn normalize(&mut self, p: &Params, now: u64) -> bool {
        if let Some(state) = &mut self.other {
            let idle_at = self.idle_at.get_mut();
            let changed = now < *idle_at && algorithm::normalize(state, p, now);
            if changed {
                *idle_at = algorithm::idle_at(state, p);
            }
            return changed;
        }
        let mut entry = Entry {
            idle_at: self.idle_at(),
            state: self.state().into_owned(),
        };
        let changed = entry.normalize(p, now);
        if changed {
            self.set(entry);
        }
        changed
    }

    /// The state held, with exclusive access (the shard's write lock): borrowed when it is
    /// not packed.
    pub(super) fn state(&self) -> Cow<'_, State> {
        if let Some(state) = &self.other {
            return Cow::Borrowed(state);
        }
        // Exclusive access: no writer can be storing.
        let form = Packed::of_seq(self.seq.load(Ordering::Relaxed));
        Cow::Owned(form.unpack(self.words.each_ref().map(|w| w.load(Ordering::Relaxed))))
    }

    /// A copy of the entry, consistent even while fast writers run (under a read lock).
    pub(super) fn snapshot(&self) -> Entry {
        if let Some(state) = &self.other {
            return Entry {
                idle_at: self.idle_at(),
                state: (**state).clone(),
            };
        }
        let (seq, idle_at, words) = self.read_packed();
        let form = Packed::of_seq(seq);
        Entry {
            idle_at: form.idle_of_word(words[0]).unwrap_or(idle_at),
            state: form.unpack(words),
        }
    }

    /// A write under the shard's read lock, as governor's `measure_and_replace` does it: `rule`
    /// gets a consistent read of the state (of the cell's packed form, `S`), its idle time and
    /// the time `now` gives after the read of `seq`, and answers with its result and the state
    /// and idle time to write, if any. The write claims the cell by a compare-and-swap of
    /// `seq`; one that loses the race calls `rule` again, on the state that won, at a fresh
    /// time. A one-word state is read and written by one compare-and-swap of its word instead
    /// ([`Cell::measure_and_swap`]). Returns `rule`'s result and, when it wrote, when the
    /// written state becomes idle; `None` when the state `rule` would write does not fit the
    /// cell's one-word form ([`PackedState::fits`]): nothing is written, the call goes to the
    /// shard's write lock.
    #[inline]
    pub(super) fn measure_and_replace<S: PackedState, T>(
        &self,
        now: impl Fn() -> u64,
        mut rule: impl FnMut(S, u64, u64) -> (T, Option<(S, u64)>),
    ) -> Option<(T, Option<u64>)> {
        if let Some(idle_of) = S::IDLE_OF_WORD {
            return self.measure_and_swap(now, idle_of, rule);
        }
        let mut spins = 0;
        loop {
            let seq = self.seq.load(Ordering::Acquire);
            if seq & 1 == 1 {
                backoff(&mut spins);
                continue;
            }
            // The time is read after the state's `seq`: it is no earlier than the time of the
            // write that left the state (that write's clock read happened before its `seq`).
            let now = now();
            let (idle_at, words) = self.load_words();
            if !self.unchanged_since(seq) {
                continue;
            }
            let (answer, write) = rule(S::of_words(words), idle_at, now);
            let Some((state, idle_at)) = write else {
                return Some((answer, None));
            };
            if !self.claim(seq) {
                continue;
            }
            self.publish(seq, idle_at, &state.words()[..S::WORDS]);
            return Some((answer, Some(idle_at)));
        }
    }

    /// [`Cell::measure_and_replace`] of a one-word state ([`PackedState::IDLE_OF_WORD`]: its
    /// idle time `idle_of` the word): the word is read, `rule` runs on it at the time `now`
    /// gives after the read, and a write is one compare-and-swap from the value read; one that
    /// loses the race runs `rule` again on the value that won.
    #[inline]
    fn measure_and_swap<S: PackedState, T>(
        &self,
        now: impl Fn() -> u64,
        idle_of: fn(u64) -> u64,
        mut rule: impl FnMut(S, u64, u64) -> (T, Option<(S, u64)>),
    ) -> Option<(T, Option<u64>)> {
        let word = &self.words[0];
        let mut current = word.load(Ordering::Acquire);
        loop {
            // After the read: no earlier than the time of the write that left the value.
            let now = now();
            let (answer, write) = rule(S::of_words([current, 0, 0]), idle_of(current), now);
            let Some((state, idle_at)) = write else {
                return Some((answer, None));
            };
            if !state.fits() {
                return None;
            }
            // The sweep mark follows what the cell will read as the entry's idle time.
            debug_assert_eq!(idle_at, idle_of(state.words()[0]));
            match word.compare_exchange_weak(
                current,
                state.words()[0],
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some((answer, Some(idle_at))),
                Err(seen) => current = seen,
            }
        }
    }

    /// The packed numbers and the `seq` they were read at: a read that waits out any write
    /// under way.
    fn read_packed(&self) -> (u64, u64, [u64; 3]) {
        let mut spins = 0;
        loop {
            let seq = self.seq.load(Ordering::Acquire);
            if seq & 1 == 0 {
                let (idle_at, words) = self.load_words();
                if self.unchanged_since(seq) {
                    return (seq, idle_at, words);
                }
            }
            backoff(&mut spins);
        }
    }

    /// `idle_at` and the words, as they are (checked by [`Cell::unchanged_since`]).
    fn load_words(&self) -> (u64, [u64; 3]) {
        (
            self.idle_at.load(Ordering::Relaxed),
            self.words.each_ref().map(|w| w.load(Ordering::Relaxed)),
        )
    }

    /// Whether no write began since `seq` was read (the loads before it saw one state).
    fn unchanged_since(&self, seq: u64) -> bool {
        fence(Ordering::Acquire);
        self.seq.load(Ordering::Relaxed) == seq
    }

    /// Claims the cell for a write, if it is still at `seq` (even); then [`Cell::publish`].
    fn claim(&self, seq: u64) -> bool {
        let claimed = self
            .seq
            .compare_exchange(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok();
        if claimed {
            // The words' stores below come after the odd `seq` for any reader that sees them.
            fence(Ordering::Release);
        }
        claimed
    }

    /// Stores a claimed cell's new entry (same packed form: `words` are the ones it uses) and
    /// releases it. The words past those keep what [`Cell::set`] wrote when the cell took this
    /// form (zeros: it writes all three), which no reader of the form looks at.
    fn publish(&self, seq: u64, idle_at: u64, words: &[u64]) {
        self.idle_at.store(idle_at, Ordering::Relaxed);
        for (w, &v) in self.words.iter().zip(words) {
            w.store(v, Ordering::Relaxed);
        }
        self.seq.store(next_seq(seq), Ordering::Release);
    }
}

/// The `seq` after a write claimed at `seq` (even): the count moves on, the form's tag stays
/// (the count wraps within its bits, after 2^61 writes).
const fn next_seq(seq: u64) -> u64 {
    (seq & !COUNTER) | (seq.wrapping_add(2) & COUNTER)
}

/// Waits a little for a write under way to finish: spins, then yields (the writer may have
/// been preempted between its few stores).
fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 32 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::super::packed::{WINDOW_END_MS, WINDOW_MAX_COUNT};
    use super::*;
    use crate::algorithm::fixed::Window;
    use crate::algorithm::gcra::Tat;
    use crate::algorithm::sliding_counter::Counters;

    fn entry(state: State) -> Entry {
        Entry { idle_at: 7, state }
    }

    /// An entry whose idle time is its state's own, as the rules make them (a one-word
    /// state's is read from its word), else 7.
    fn consistent(form: Packed, words: [u64; 3]) -> Entry {
        Entry {
            idle_at: form.idle_of_word(words[0]).unwrap_or(7),
            state: form.unpack(words),
        }
    }

    /// A one-word state's fast write changes its word alone: the cell's idle time, its
    /// liveness and its snapshot all read the word it wrote, where the `idle_at` field keeps
    /// the value of the cell's last exclusive write.
    #[test]
    fn a_one_word_write_moves_the_cell_s_idle_time() {
        let cell = Cell::new(Entry {
            idle_at: 5,
            state: State::Gcra(Tat(5)),
        });
        let ((), wrote) = cell
            .measure_and_replace::<Tat, _>(
                || 3,
                |tat, idle_at, now| {
                    assert_eq!((tat, idle_at, now), (Tat(5), 5, 3));
                    ((), Some((Tat(9), 9)))
                },
            )
            .unwrap();
        assert_eq!(wrote, Some(9));
        assert_eq!(cell.idle_at(), 9);
        assert!(cell.live(8) && !cell.live(9));
        let held = Entry {
            idle_at: 9,
            state: State::Gcra(Tat(9)),
        };
        assert_eq!(cell.snapshot(), held);
        assert_eq!(cell.state().into_owned(), held.state);
        // A rule that writes nothing leaves the word.
        let (answer, wrote) = cell
            .measure_and_replace::<Tat, _>(|| 4, |tat, _, _| (tat.0, None))
            .unwrap();
        assert_eq!((answer, wrote), (9, None));
        assert_eq!(cell.snapshot(), held);
    }

    /// A fixed window is one word while its count and end fit it: its idle time is read from
    /// the word; a window the word cannot hold is not written by a fast write and is kept
    /// unpacked; an entry marked idle before its state is stays unpacked, with its idle time.
    #[test]
    fn a_window_is_one_word_while_it_fits() {
        let window = |count, expires_ms| Window { count, expires_ms };
        let mut cell = Cell::new(Entry::new(
            State::Gcra(Tat(5)),
            &crate::algorithm::Params::new(5, 10_000, 5, 1),
        ));
        cell.set(Entry::new(
            State::Fixed(window(2, 40)),
            &crate::algorithm::Params::new(5, 10_000, 5, 1),
        ));
        assert_eq!(cell.packed(), Some(Packed::Fixed));
        let ((), wrote) = cell
            .measure_and_replace::<Window, _>(
                || 39_500,
                |w, idle_at, _| {
                    assert_eq!((w, idle_at), (window(2, 40), 41_000));
                    ((), Some((window(3, 40), 41_000)))
                },
            )
            .unwrap();
        assert_eq!(wrote, Some(41_000));
        assert_eq!(
            cell.snapshot(),
            consistent(Packed::Fixed, window(3, 40).words())
        );
        // A window the word cannot hold is not written by a fast write: the caller takes the
        // write lock, which keeps it unpacked.
        for too_big in [window(WINDOW_MAX_COUNT + 1, 40), window(3, WINDOW_END_MS)] {
            assert!(!too_big.fits());
            cell.set(consistent(Packed::Fixed, window(3, 40).words()));
            let wrote = cell
                .measure_and_replace::<Window, _>(|| 39_600, |_, _, _| ((), Some((too_big, 1))));
            assert!(wrote.is_none(), "{too_big:?}");
            assert_eq!(cell.snapshot().state, State::Fixed(window(3, 40)));
            let entry = Entry {
                idle_at: Window::idle_at(&too_big),
                state: State::Fixed(too_big),
            };
            cell.set(entry.clone());
            assert_eq!(cell.packed(), None);
            assert_eq!(cell.snapshot(), entry);
            assert_eq!(cell.idle_at(), entry.idle_at);
        }
        for fits in [window(WINDOW_MAX_COUNT, WINDOW_END_MS - 1), window(0, 0)] {
            assert!(fits.fits());
            let entry = consistent(Packed::Fixed, fits.words());
            assert_eq!(entry.state, State::Fixed(fits));
            cell.set(entry.clone());
            assert_eq!(cell.packed(), Some(Packed::Fixed));
            assert_eq!(cell.snapshot(), entry);
        }

        // An entry marked idle before its state is (a refund that gave back everything) is
        // kept unpacked, with its own idle time, for both one-word forms.
        for state in [State::Gcra(Tat(9)), State::Fixed(window(1, 40))] {
            let early = Entry { idle_at: 4, state };
            cell.set(early.clone());
            assert_eq!(cell.packed(), None);
            assert!(!cell.live(4) && cell.live(3));
            assert_eq!(cell.snapshot(), early);
        }
    }

    /// A cell answers the form it holds through every change of form, and the fast writes'
    /// count never reaches the form's bits, even where it wraps.
    #[test]
    fn the_form_survives_every_write_and_the_count_s_wrap() {
        let forms = [Packed::Fixed, Packed::Bucket, Packed::Gcra, Packed::Counter];
        let mut cell = Cell::new(entry(Packed::Gcra.unpack([5, 0, 0])));
        for round in 0..3 {
            for form in forms {
                let held = consistent(form, [round + 1, round + 2, round + 3]);
                cell.set(held.clone());
                assert_eq!(cell.packed(), Some(form));
                assert_eq!(cell.snapshot(), held);
                assert_eq!(cell.state().into_owned(), held.state);
            }
            cell.set(entry(State::Sliding(
                crate::algorithm::sliding::Log::default(),
            )));
            assert_eq!(cell.packed(), None);
            assert!(cell.unpacked_mut().is_some());
        }
        for form in forms {
            let last = form.tag() | (COUNTER - 1);
            assert_eq!(next_seq(last), form.tag(), "{form:?}");
            assert_eq!(Packed::of_seq(next_seq(last)), form);
            assert_eq!(next_seq(form.tag() | 4), form.tag() | 6);
        }
        // A fast write keeps the form.
        let mut cell = Cell::new(entry(Packed::Counter.unpack([1, 2, 3])));
        *cell.seq.get_mut() = Packed::Counter.tag() | (COUNTER - 1);
        let ((), wrote) = cell
            .measure_and_replace::<Counters, _>(
                || 8,
                |c, _, _| {
                    (
                        (),
                        Some((
                            Counters {
                                cur: c.cur + 1,
                                ..c
                            },
                            9,
                        )),
                    )
                },
            )
            .unwrap();
        assert_eq!(wrote, Some(9));
        assert_eq!(cell.packed(), Some(Packed::Counter));
        assert_eq!(cell.snapshot().state, Packed::Counter.unpack([1, 3, 3]));
    }
}
