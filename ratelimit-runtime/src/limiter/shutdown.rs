//! A limiter's shutdown ([`RateLimiter::shutdown`]): the units this process holds in leases go
//! back to the store, and the store calls the limiter runs in the background (the return of a
//! lease, the release of a cancelled call's receipts and concurrency slots, the refund of a
//! timed-out take) finish, within a deadline.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use super::RateLimiter;

/// The limiter's background store calls in flight, and whether it was shut down.
#[derive(Default)]
pub(super) struct Background {
    pending: AtomicUsize,
    idle: Notify,
    closed: AtomicBool,
    /// Wakes the tasks that wait for shutdown ([`RateLimiter::shut_down`]).
    closing: Notify,
}

impl Background {
    /// Returns once no background store call is in flight.
    async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            // Registered before the count is read: a task ending in between still wakes it.
            notified.as_mut().enable();
            if self.pending.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// One background store call of a limiter, counted from its start until it is dropped.
pub(crate) struct Tracked {
    limiter: RateLimiter,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let background = &self.limiter.inner.background;
        if background.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            background.idle.notify_waiters();
        }
    }
}

/// [`RateLimiter::shutdown`] ran out of time: some of the limiter's background store calls had
/// not finished (the store is slow or unreachable). What they would have given back stays
/// counted until its window ends or its receipt expires (never more admitted than the quota).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShutdownTimedOut {
    /// The background store calls still in flight at the deadline.
    pub pending: usize,
    /// The deadline that passed.
    pub timeout: Duration,
}

impl std::fmt::Display for ShutdownTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the rate limiter's shutdown timed out after {:?} with {} store call(s) pending",
            self.timeout, self.pending
        )
    }
}

impl std::error::Error for ShutdownTimedOut {}

impl RateLimiter {
    /// Counts a background store call until the returned guard is dropped; shutdown waits for it.
    pub(crate) fn track(&self) -> Tracked {
        self.inner.background.pending.fetch_add(1, Ordering::AcqRel);
        Tracked {
            limiter: self.clone(),
        }
    }

    /// Runs `fut` on a task of its own, as a background store call shutdown waits for.
    pub(crate) fn spawn_tracked<F>(&self, fut: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let tracked = self.track();
        tokio::spawn(async move {
            let _tracked = tracked;
            fut.await
        })
    }

    /// Runs `fut` to the end on a task of its own, even when the caller's future is dropped
    /// first: a result nobody awaits any more is dropped on that task, while shutdown still
    /// counts it as a background call (so a drop that releases something, as a call's receipts
    /// do, is waited for). Outside a Tokio runtime it runs in place.
    ///
    /// `None` when the task was cancelled (its runtime shut down). A panic in `fut` resumes in
    /// the caller.
    pub(crate) async fn run_detached<F>(&self, fut: F) -> Option<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Some(fut.await);
        };
        let tracked = self.track();
        // A tuple drops its fields in order: an unclaimed output before the guard.
        let task = runtime.spawn(async move { (fut.await, tracked) });
        match task.await {
            Ok((output, _tracked)) => Some(output),
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(_) => None,
        }
    }

    /// Whether the limiter's store keeps its state in this process ([`crate::Store::is_local`]).
    pub(crate) fn store_is_local(&self) -> bool {
        self.inner.store.is_local()
    }

    /// Returns once [`RateLimiter::shutdown`] was called on this limiter (or a clone of it):
    /// a background task that waits for something else (a lease's end) ends early with it.
    pub(super) async fn shut_down(&self) {
        let notified = self.inner.background.closing.notified();
        tokio::pin!(notified);
        // Registered before the flag is read: a shutdown in between still wakes it.
        notified.as_mut().enable();
        if !self.is_shut_down() {
            notified.await;
        }
    }

    /// Whether [`RateLimiter::shutdown`] was called on this limiter (or a clone of it).
    pub fn is_shut_down(&self) -> bool {
        self.inner.background.closed.load(Ordering::Acquire)
    }

    /// Shuts the limiter down for a process that is about to exit: gives the units it holds in
    /// leases back to the store ([`crate::lease`]), and waits, at most `timeout`, for the store
    /// calls it runs in the background to finish: those returns, the release of the receipts
    /// and concurrency slots of calls that were cancelled or panicked, and the refund of takes
    /// that timed out. Call it after the server stopped taking requests and drained the ones
    /// in flight (Axum's `with_graceful_shutdown`, Actix-web's server handle): a call still
    /// running releases its own slot when it ends, not here.
    ///
    /// Without it, a process that exits normally leaves up to one lease's units per leased key
    /// counted and unused until the lease's window ends, as a process that dies does.
    ///
    /// **After shutdown** the limiter still answers: every check goes to the store directly, as
    /// if its limit had no lease, so a call that arrives late is decided exactly, never from a
    /// lease. Calling it again (on any clone) returns once the background calls are done.
    ///
    /// # Errors
    ///
    /// [`ShutdownTimedOut`] when `timeout` passed first; the calls still pending keep running
    /// while the runtime does.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use ratelimit_runtime::RateLimiter;
    ///
    /// let limiter = RateLimiter::builder().build().await?;
    /// // … serve until a shutdown signal, drain the requests in flight, then:
    /// limiter.shutdown(Duration::from_secs(5)).await?;
    /// assert!(limiter.is_shut_down());
    /// limiter.shutdown(Duration::from_secs(5)).await?; // idempotent
    /// # Ok(()) }
    /// ```
    pub async fn shutdown(&self, timeout: Duration) -> Result<(), ShutdownTimedOut> {
        let background = &self.inner.background;
        background.closed.store(true, Ordering::Release);
        background.closing.notify_waiters();
        self.return_leases();
        if tokio::time::timeout(timeout, background.idle())
            .await
            .is_ok()
        {
            return Ok(());
        }
        Err(ShutdownTimedOut {
            pending: background.pending.load(Ordering::Acquire),
            timeout,
        })
    }
}
