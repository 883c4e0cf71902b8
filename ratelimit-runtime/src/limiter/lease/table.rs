//! The table of a limiter's leased keys: a [`Slot`] per key (its lease, its demand, the admin
//! calls running on it), at most [`MAX_KEYS`] of them, idle ones swept when the table is full.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use tokio::time::Instant;

use super::lock;
use crate::policy::Policy;

/// The keys a limiter keeps lease state for. A key past it (a flood of minted keys on a leased
/// limit) is checked at the store call by call, exactly as without leases.
pub(super) const MAX_KEYS: usize = 4096;

/// How long a key with no lease keeps its state before a full table may drop it, and the
/// least time between two such sweeps (a full table of busy keys is not scanned per call).
pub(super) const IDLE: Duration = Duration::from_secs(2);

/// The lease state of a limiter: one slot per leased key, and the units unused in all of them.
#[derive(Default)]
pub(in crate::limiter) struct Leases {
    pub(super) table: RwLock<Table>,
    pub(super) held: AtomicU64,
}

#[derive(Default)]
pub(super) struct Table {
    pub(super) slots: HashMap<Box<str>, Arc<Slot>>,
    pub(super) swept_at: Option<Instant>,
}

impl Leases {
    /// The slot of `key`, or `None` when the table is full of keys in use.
    pub(super) fn slot(&self, key: &str, now: Instant) -> Option<Arc<Slot>> {
        // Calls on known keys share the read lock; a new key takes the write lock.
        if let Some(slot) = self
            .table
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .slots
            .get(key)
        {
            return Some(Arc::clone(slot));
        }
        let mut table = self.table.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = table.slots.get(key) {
            return Some(Arc::clone(slot));
        }
        if table.slots.len() >= MAX_KEYS {
            if table.swept_at.is_some_and(|t| now.duration_since(t) < IDLE) {
                return None;
            }
            table.swept_at = Some(now);
            // A slot someone else holds (a call, a take, a return, a lease's timer, a reset)
            // is in use: dropped, its key would get a second slot that the holder's
            // bookkeeping never sees (a reset's epoch, a lease taken across it).
            table
                .slots
                .retain(|_, slot| Arc::strong_count(slot) > 1 || !lock(&slot.state).idle(now));
            if table.slots.len() >= MAX_KEYS {
                return None;
            }
        }
        let slot = Arc::new(Slot::default());
        table.slots.insert(key.into(), Arc::clone(&slot));
        Some(slot)
    }

    /// Units held in leases now.
    pub(in crate::limiter) fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// The slot of `key`, made even when the table is full: the keys of an admin call (a
    /// reset), which must stay in the table while it runs, so that no lease of them is taken
    /// or held meanwhile. A reset names a few keys; the sweep drops them once idle.
    pub(super) fn slot_of_admin(&self, key: &str) -> Arc<Slot> {
        if let Some(slot) = self.existing(key) {
            return slot;
        }
        let mut table = self.table.write().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(table.slots.entry(key.into()).or_default())
    }

    /// The slot of `key` if it has one.
    pub(super) fn existing(&self, key: &str) -> Option<Arc<Slot>> {
        let table = self.table.read().unwrap_or_else(PoisonError::into_inner);
        table.slots.get(key).map(Arc::clone)
    }
}

/// One key's lease and demand.
#[derive(Default)]
pub(super) struct Slot {
    pub(super) state: Mutex<State>,
    /// Held by the one call that takes the next lease for this key (and by its task).
    pub(super) refill: Arc<tokio::sync::Mutex<()>>,
    /// Read by each return of unused units while it runs, written by a reset while it runs:
    /// a return lands before the reset or is judged after it (by the epoch), never on top of
    /// the fresh state.
    pub(super) returns: Arc<tokio::sync::RwLock<()>>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) held: Option<Held>,
    /// Units asked for since `since` (served from the lease or not): the rate `k` follows.
    pub(super) demand: u64,
    pub(super) since: Option<Instant>,
    /// The units of the last take (the next is at most twice as many).
    pub(super) last_k: u64,
    /// The units the store said were left at its last answer: a take never asks for more.
    pub(super) room: Option<u64>,
    /// Until then, no lease: the last take was not replicated in time.
    pub(super) unreplicated_until: Option<Instant>,
    pub(super) touched: Option<Instant>,
    /// Moved on by every admin call on the key: a lease whose epoch is older was taken before
    /// one, and is neither held nor given back.
    pub(super) epoch: u64,
    /// Resets of the key running now: no lease is served, taken or held meanwhile.
    pub(super) resetting: u32,
}

/// A lease this process holds.
pub(super) struct Held {
    /// The limit's scope (the return's labels).
    pub(super) scope: &'static str,
    /// The take's receipts.
    pub(super) call_id: String,
    /// The limit's policy with the take's units as its cost.
    pub(super) policy: Policy,
    /// Units not used yet.
    pub(super) left: u64,
    /// Units it had when this process began to hold it (the gauge's share of it).
    pub(super) granted: u64,
    /// The key's epoch when it was taken (or when a block ended it, to give back by).
    pub(super) epoch: u64,
    /// When it ends: its life, never past the window its units were counted in.
    pub(super) until: Instant,
    /// The store's answer to the take.
    pub(super) limit: u64,
    pub(super) remaining: u64,
    pub(super) reset_at: Instant,
}

impl State {
    /// Whether the table may drop this key: no lease, no reset running, untouched for `IDLE`.
    pub(super) fn idle(&self, now: Instant) -> bool {
        self.held.is_none()
            && self.resetting == 0
            && self.touched.is_none_or(|t| now.duration_since(t) >= IDLE)
    }
}

impl Slot {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full table takes no new key until one goes idle (its calls are then checked at the
    /// store one by one), and sweeps at most once per `IDLE`.
    #[test]
    fn a_full_table_refuses_new_keys_and_sweeps_idle_ones() {
        let leases = Leases::default();
        let start = Instant::now();
        for i in 0..MAX_KEYS {
            let slot = leases.slot(&format!("k{i}"), start).expect("room");
            lock(&slot.state).touched = Some(start);
        }
        assert!(
            leases.slot("k0", start).is_some(),
            "a known key keeps its slot"
        );
        assert!(leases.slot("new", start).is_none());
        let later = start + IDLE;
        assert!(
            leases.slot("new", later).is_some(),
            "the idle keys were swept"
        );
        assert_eq!(leases.table.read().expect("the table").slots.len(), 1);
    }
}
