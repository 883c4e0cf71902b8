//! The janitor: the background task that sweeps idle entries, and its start and end.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError, Weak};

use super::{Inner, MemoryStore, lock, write};

impl Drop for MemoryStore {
    fn drop(&mut self) {
        let handle = self
            .janitor
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(handle) = handle {
            handle.abort();
        }
    }
}

/// How many checks a thread that found no runtime makes before it asks tokio again.
const ASKS_SKIPPED: u8 = 63;

thread_local! {
    /// Checks this thread makes before it next asks tokio for a runtime (see
    /// [`MemoryStore::has_janitor`]).
    static SKIP_ASKS: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}

impl MemoryStore {
    /// Whether the background janitor task is running. It starts at the first check made
    /// inside a tokio runtime, and again at the next such check when its runtime shut down —
    /// except on a thread whose last check found no runtime: such a thread asks tokio again
    /// only at every 64th of its checks (whatever the store), so that checks made outside a
    /// runtime do not pay for asking, and a store it then checks inside a runtime starts its
    /// janitor within 64 checks. Until then only memory waits: new keys still sweep idle
    /// entries as they come, and no decision depends on the janitor.
    pub fn has_janitor(&self) -> bool {
        self.inner.janitor_running.load(Ordering::Acquire)
    }

    /// Starts the janitor when none is running and this runs inside a tokio runtime.
    #[inline]
    pub(super) fn start_janitor(&self) {
        if self.inner.janitor_running.load(Ordering::Acquire) {
            return;
        }
        // Asking tokio costs a thread-local lookup and a handle's clone: a thread that found no
        // runtime skips the next 63 asks (one thread-local counter, for every store).
        let skip = SKIP_ASKS.get();
        if skip > 0 {
            SKIP_ASKS.set(skip - 1);
        } else if tokio::runtime::Handle::try_current().is_ok() {
            self.start_janitor_now();
        } else {
            SKIP_ASKS.set(ASKS_SKIPPED);
        }
    }

    /// [`MemoryStore::start_janitor`] once it found none running inside a runtime (out of
    /// line: the check made on every call stays a load and tokio's thread-local read).
    #[cold]
    fn start_janitor_now(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.inner.janitor_running.swap(true, Ordering::AcqRel) {
            return;
        }
        let running = JanitorRunning(Arc::downgrade(&self.inner));
        let handle = runtime.spawn(janitor(running)).abort_handle();
        if let Some(old) = lock(&self.janitor).replace(handle) {
            old.abort();
        }
    }
}

/// The janitor's hold on the store: weak, and it clears the store's "janitor running" flag
/// when the task ends or is dropped (by an abort or by its runtime shutting down).
struct JanitorRunning(Weak<Inner>);

impl Drop for JanitorRunning {
    fn drop(&mut self) {
        if let Some(inner) = self.0.upgrade() {
            inner.janitor_running.store(false, Ordering::Release);
        }
    }
}

/// Sweeps every shard each interval, one shard's lock at a time, until the store is dropped.
async fn janitor(running: JanitorRunning) {
    let store = &running.0;
    loop {
        let Some(interval) = store.upgrade().map(|s| s.sweep_interval()) else {
            return;
        };
        tokio::time::sleep(interval).await;
        let Some(shards) = store.upgrade().map(|s| s.shards.len()) else {
            return;
        };
        for i in 0..shards {
            let Some(inner) = store.upgrade() else {
                return;
            };
            let now = inner.now();
            write(&inner.shards[i]).sweep(now);
            drop(inner);
            tokio::task::yield_now().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{MS, one, policy};
    use crate::algorithm::Algorithm;
    use crate::store::{ManualClock, MemoryStore, TokioClock};

    /// Under tokio's paused time the janitor sweeps on its own, and it ends with the store.
    #[tokio::test(start_paused = true)]
    async fn the_janitor_sweeps_and_ends_with_the_store() {
        let store = MemoryStore::with_clock(TokioClock::default());
        let p = policy(Algorithm::Fixed, 1, 1000 * MS, 1);
        let tasks = tokio::runtime::Handle::current().metrics();
        let before = tasks.num_alive_tasks();
        for i in 0..1000 {
            assert!(one(&store, &format!("k{i}"), &p).admitted);
        }
        assert!(store.has_janitor());
        assert_eq!(tasks.num_alive_tasks(), before + 1, "one janitor");
        assert_eq!(store.held(), 1000);
        tokio::time::sleep(999 * MS).await;
        assert_eq!(store.len(), 1000);
        // The window ends at 1 s; the janitor sweeps every second: by 2 s all are gone,
        // without a call.
        tokio::time::sleep(1001 * MS + MS).await;
        assert_eq!(store.held(), 0);
        drop(store);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            tasks.num_alive_tasks(),
            before,
            "the janitor outlived its store"
        );
    }

    /// A janitor whose runtime shut down is started again in the next runtime: at once, or
    /// within 64 checks on a thread whose last check found no runtime.
    #[test]
    fn the_janitor_restarts_in_a_new_runtime() {
        let store = MemoryStore::with_clock(ManualClock::new());
        let p = policy(Algorithm::Fixed, 1000, 1000 * MS, 1000);
        for _ in 0..100 {
            assert!(one(&store, "k", &p).admitted);
        }
        assert!(!store.has_janitor(), "no runtime, no janitor");
        for _ in 0..2 {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            rt.block_on(async {
                let mut checks = 0;
                while !store.has_janitor() {
                    assert!(one(&store, "k", &p).admitted);
                    checks += 1;
                }
                assert!(checks <= 64, "started after {checks} checks");
                tokio::task::yield_now().await;
                assert!(store.has_janitor());
            });
            drop(rt);
            assert!(!store.has_janitor(), "the janitor died with its runtime");
        }
    }
}
