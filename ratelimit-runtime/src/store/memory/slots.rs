//! Concurrency limits' releases: a call's lease removed from its key by the call's id, on
//! every outcome ([`crate::Store::forget`] and [`crate::Store::refund`] both release).

use super::cell::Entry;
use super::{Inner, MemoryStore, write};
use crate::algorithm::{Algorithm, Params, State};
use crate::store::Check;

impl MemoryStore {
    /// Releases the slots the call taken under `call_id` holds of the concurrency limits among
    /// `checks` (the other limits are untouched): what [`crate::Store::forget`] does besides
    /// dropping receipts. Releasing twice, or a slot whose lease already ended, does nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, store::Check, MemoryStore, Policy};
    ///
    /// let store = MemoryStore::new();
    /// let one_at_a_time = Policy::new(Algorithm::Concurrency, 1, Duration::from_secs(30))?;
    /// let checks = [Check::new("export", &one_at_a_time)];
    /// assert!(store.take_now(&checks, "a1b2c3d4e5f6a7b8c9")?.is_admitted());
    /// assert!(!store.take_now(&checks, "a1b2c3d4e5f6a7b8ca")?.is_admitted()); // in flight
    /// store.release_now(&checks, "a1b2c3d4e5f6a7b8c9"); // the first call ended
    /// assert!(store.take_now(&checks, "a1b2c3d4e5f6a7b8ca")?.is_admitted());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn release_now(&self, checks: &[Check<'_>], call_id: &str) {
        for check in checks {
            if check.policy.algorithm() == Algorithm::Concurrency {
                self.inner.release_one(check, call_id);
            }
        }
    }
}

impl Inner {
    /// Removes `call_id`'s lease from the holders of `check`'s key.
    fn release_one(&self, check: &Check<'_>, call_id: &str) {
        let p = Params::of(check.policy);
        let hash = self.hash(check.key);
        let mut guard = write(&self.shards[self.shard_of(hash)]);
        let shard = &mut *guard;
        let Some(cell) = shard.map.get_mut(hash, check.key) else {
            return;
        };
        let State::Concurrency(mut holders) = cell.state().into_owned() else {
            return;
        };
        if !holders.release(call_id) {
            return;
        }
        // No lease left: idle now (swept with the others).
        let entry = Entry::new(State::Concurrency(holders), &p);
        let idle_at = entry.idle_at;
        cell.set(entry);
        shard.note_idle(idle_at);
    }
}
