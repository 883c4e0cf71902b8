//! A connection made in the background, shared by every check once it is up.
//!
//! Connecting (and loading the scripts) can take longer than one check may wait. If the
//! connection were made inside the check, the limiter's timeout would cancel it half way and
//! the next check would start from zero — on a slow network a store could never connect. So
//! the connection is made by a spawned task (an *attempt*) that outlives the check that started
//! it.
//!
//! Behaviour:
//! * the first check with no connection starts an attempt and waits for it;
//! * a check that arrives while an attempt is running waits for **that** attempt (no second
//!   one is started): a cold start under load is limited from its first call instead of being
//!   answered by the failure policy;
//! * every wait is bounded only by the check's own timeout: a waiter dropped by it (or by any
//!   cancellation) leaves the attempt running for the others and the checks after it;
//! * when the attempt succeeds, every waiter and every later check uses the connection; when it
//!   fails, every waiter gets its error ([`StoreError::Connection`], a transport error, its cause kept) and the next
//!   check starts a new attempt;
//! * an attempt that ends without an answer (its runtime shut down) fails its waiters and
//!   leaves the way open for a new attempt;
//! * an attempt lasts at most [`ATTEMPT_LIMIT`]: a server that took the connection and then
//!   stalled fails it, and the next check starts a new one.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

use crate::error::StoreError;

/// The longest a connection attempt may take, every retry and the loading of the library
/// included (the Redis client tries three times, each connect bounded by 2 s; loading the
/// library answers in milliseconds on a healthy server).
pub(crate) const ATTEMPT_LIMIT: Duration = Duration::from_secs(10);

/// `connect` within [`ATTEMPT_LIMIT`]: a lazy store's attempt, and the connection a store's
/// `connect` makes before the application serves.
pub(crate) async fn within_attempt_limit<T>(
    connect: impl Future<Output = Result<T, redis::RedisError>>,
) -> Result<T, redis::RedisError> {
    tokio::time::timeout(ATTEMPT_LIMIT, connect)
        .await
        .unwrap_or_else(|_| Err(overdue()))
}

/// An attempt that outlived [`ATTEMPT_LIMIT`].
fn overdue() -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Io,
        "the connection attempt did not finish",
        format!("{} s", ATTEMPT_LIMIT.as_secs()),
    ))
}

/// How an attempt ended: `None` while it runs, then `Ok` (the connection is in the cell) or the
/// error's message.
type Outcome = Option<Result<(), redis::RedisError>>;

#[derive(Debug)]
struct Inner<T> {
    /// The connection, once an attempt made it. Never emptied: the connection reconnects by
    /// itself.
    conn: OnceLock<T>,
    /// The running attempt's outcome, for checks that arrive while it runs; `None` when no
    /// attempt runs.
    attempt: Mutex<Option<watch::Receiver<Outcome>>>,
    /// Set when an attempt failed: the store is not at its cold start any more, but failing.
    failed: AtomicBool,
}

impl<T> Inner<T> {
    fn attempt(&self) -> std::sync::MutexGuard<'_, Option<watch::Receiver<Outcome>>> {
        // The lock guards a plain swap of an `Option`: a panic elsewhere cannot leave it half
        // written, so a poisoned lock is used as is.
        self.attempt.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Owned by an attempt's task: publishes how the attempt ended when dropped — after it
/// finished, or when the task was dropped half way (its runtime shut down) — and clears the
/// attempt so the next check starts a new one.
struct Publish<T> {
    inner: Arc<Inner<T>>,
    tx: watch::Sender<Outcome>,
    outcome: Outcome,
}

/// The outcome of an attempt that ended without one (its task was dropped with its runtime).
fn abandoned() -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Io, "the connection attempt was abandoned"))
}

impl<T> Drop for Publish<T> {
    fn drop(&mut self) {
        let outcome = self.outcome.take().unwrap_or_else(|| Err(abandoned()));
        if outcome.is_err() {
            self.inner.failed.store(true, Ordering::Release);
        }
        // Under the lock: a check either found this attempt (and gets this outcome) or finds
        // none (and, when this one failed, starts the next).
        let mut attempt = self.inner.attempt();
        if attempt
            .as_ref()
            .is_some_and(|rx| rx.same_channel(&self.tx.subscribe()))
        {
            *attempt = None;
        }
        self.tx.send_replace(Some(outcome));
    }
}

/// A connection of type `T` (a cheap-to-clone multiplexed handle), made once in the background.
#[derive(Debug)]
pub(crate) struct LazyConnection<T> {
    inner: Arc<Inner<T>>,
}

impl<T: Clone + Send + Sync + 'static> LazyConnection<T> {
    /// Not connected yet.
    pub(crate) fn new() -> Self {
        Self::with(OnceLock::new())
    }

    /// Already connected.
    pub(crate) fn ready(conn: T) -> Self {
        Self::with(OnceLock::from(conn))
    }

    fn with(conn: OnceLock<T>) -> Self {
        Self {
            inner: Arc::new(Inner {
                conn,
                attempt: Mutex::new(None),
                failed: AtomicBool::new(false),
            }),
        }
    }

    /// Whether the connection is up.
    pub(crate) fn is_connected(&self) -> bool {
        self.inner.conn.get().is_some()
    }

    /// Whether the first attempt is running: never connected, no attempt failed yet. Once
    /// that attempt has ended, never `true` again (a connection is never emptied, a failure
    /// never forgotten).
    pub(crate) fn is_connecting(&self) -> bool {
        !self.is_connected()
            && !self.inner.failed.load(Ordering::Acquire)
            && self.inner.attempt().is_some()
    }

    /// The connection; when there is none yet, waits for the running attempt, or starts
    /// `connect` in a task of its own when none runs (see the [module docs](self)).
    ///
    /// Cancel-safe: dropping the returned future (a timeout) never cancels the attempt.
    pub(crate) async fn get<F, Fut>(&self, connect: F) -> Result<T, StoreError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, redis::RedisError>> + Send + 'static,
    {
        if let Some(conn) = self.inner.conn.get() {
            return Ok(conn.clone());
        }
        let (mut rx, start) = {
            let mut attempt = self.inner.attempt();
            // Connected while this check waited for the lock.
            if let Some(conn) = self.inner.conn.get() {
                return Ok(conn.clone());
            }
            if let Some(rx) = &*attempt {
                (rx.clone(), None)
            } else {
                let (tx, rx) = watch::channel(None);
                *attempt = Some(rx.clone());
                (rx, Some(tx))
            }
        };
        if let Some(tx) = start {
            // From here on the attempt is published however it ends, even if `connect` panics.
            let mut publish = Publish {
                inner: Arc::clone(&self.inner),
                tx,
                outcome: None,
            };
            let future = connect();
            tokio::spawn(async move {
                publish.outcome = Some(match within_attempt_limit(future).await {
                    Ok(conn) => {
                        // The only attempt running: the cell is empty.
                        let _ = publish.inner.conn.set(conn);
                        Ok(())
                    }
                    Err(e) => Err(e),
                });
                // Tells the waiters.
                drop(publish);
            });
        }
        let outcome = match rx.wait_for(Option::is_some).await {
            Ok(outcome) => outcome.clone(),
            // The sender publishes before it goes: unreachable, but not worth a panic.
            Err(_) => Some(Err(abandoned())),
        };
        match (outcome, self.inner.conn.get()) {
            (Some(Ok(())), Some(conn)) => Ok(conn.clone()),
            (Some(Err(e)), _) => Err(StoreError::connection(e)),
            _ => Err(StoreError::connection("could not connect")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use tokio::sync::oneshot;
    use tokio::task::JoinSet;

    /// Checks that arrive together.
    const WAITERS: usize = 20;

    /// Holds a connection attempt until the test fires (or drops) its sender.
    type Gate = Arc<Mutex<Option<oneshot::Receiver<()>>>>;

    /// A connection attempt that counts itself and ends when `release` fires (or is dropped),
    /// with `result`.
    fn gated(
        attempts: &Arc<AtomicUsize>,
        release: &Gate,
        result: Result<u32, &'static str>,
    ) -> impl Future<Output = Result<u32, redis::RedisError>> + Send + 'static {
        attempts.fetch_add(1, Ordering::SeqCst);
        let release = release.lock().unwrap().take();
        async move {
            if let Some(release) = release {
                let _ = release.await;
            }
            result.map_err(|e| {
                redis::RedisError::from((redis::ErrorKind::Io, "connect", e.to_owned()))
            })
        }
    }

    /// `WAITERS` checks started together on `lazy`, each offering a gated attempt; returns them
    /// once every one is waiting (the paused clock only moves when every task is idle).
    async fn waiters(
        lazy: &Arc<LazyConnection<u32>>,
        attempts: &Arc<AtomicUsize>,
        release: &Gate,
        result: Result<u32, &'static str>,
    ) -> JoinSet<Result<u32, StoreError>> {
        let mut set = JoinSet::new();
        for _ in 0..WAITERS {
            let lazy = Arc::clone(lazy);
            let attempts = Arc::clone(attempts);
            let release = Arc::clone(release);
            set.spawn(async move { lazy.get(|| gated(&attempts, &release, result)).await });
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        set
    }

    /// A gate and the sender that opens it.
    fn gate() -> (oneshot::Sender<()>, Gate) {
        let (tx, rx) = oneshot::channel();
        (tx, Arc::new(Mutex::new(Some(rx))))
    }

    #[tokio::test(start_paused = true)]
    async fn checks_arriving_during_a_connection_all_get_it_from_one_attempt() {
        let lazy = Arc::new(LazyConnection::<u32>::new());
        let attempts = Arc::new(AtomicUsize::new(0));
        let (release, gate) = gate();
        let mut set = waiters(&lazy, &attempts, &gate, Ok(7)).await;
        assert!(!lazy.is_connected());
        assert!(lazy.is_connecting(), "the first connection is being made");
        assert_eq!(set.len(), WAITERS, "every check is still waiting");
        assert!(
            set.try_join_next().is_none(),
            "no check is answered before the attempt ends"
        );
        release.send(()).unwrap();
        let results = set.join_all().await;
        assert_eq!(results.len(), WAITERS);
        for r in results {
            assert_eq!(r.ok(), Some(7), "every waiter uses the connection");
        }
        assert_eq!(
            attempts.load(Ordering::SeqCst),
            1,
            "one attempt, not one per check"
        );
        assert_eq!(lazy.get(|| async { Ok(8) }).await.ok(), Some(7));
        assert_eq!(attempts.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_attempt_fails_all_its_waiters_and_the_next_check_retries() {
        let lazy = Arc::new(LazyConnection::<u32>::new());
        let attempts = Arc::new(AtomicUsize::new(0));
        let (release, gate) = gate();
        let set = waiters(&lazy, &attempts, &gate, Err("refused")).await;
        release.send(()).unwrap();
        for r in set.join_all().await {
            let err = r.unwrap_err();
            assert!(err.is_connection(), "{err:?}");
            assert!(err.is_transport(), "a failed connection opens the breaker");
            assert!(err.to_string().contains("refused"), "{err}");
        }
        assert_eq!(
            attempts.load(Ordering::SeqCst),
            1,
            "the waiters shared one attempt"
        );
        assert!(!lazy.is_connected());
        assert!(
            !lazy.is_connecting(),
            "no attempt runs after the failed one"
        );
        // The next attempt is no cold start: the store failed.
        let (release_retry, retry_gate) = self::gate();
        let retry = waiters(&lazy, &attempts, &retry_gate, Ok(3)).await;
        assert!(!lazy.is_connecting(), "an attempt after a failure");
        release_retry.send(()).unwrap();
        for r in retry.join_all().await {
            assert_eq!(r.ok(), Some(3), "the next check retries");
        }
        assert!(lazy.is_connected());
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_dropped_by_its_timeout_does_not_cancel_the_attempt() {
        let lazy = LazyConnection::<u32>::new();
        let attempts = Arc::new(AtomicUsize::new(0));
        let slow = |attempts: Arc<AtomicUsize>| async move {
            attempts.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok::<_, redis::RedisError>(7)
        };
        let timeout = Duration::from_millis(10);
        let first = tokio::time::timeout(timeout, lazy.get(|| slow(attempts.clone()))).await;
        assert!(first.is_err(), "the first check gives up at its timeout");
        // Dropped by its own timeout too: it waited for the attempt instead of failing at once.
        let second = tokio::time::timeout(timeout, lazy.get(|| slow(attempts.clone()))).await;
        assert!(
            second.is_err(),
            "a check during the connection waits for it"
        );
        // A check with time to spare gets the connection of the attempt the first one started.
        assert_eq!(lazy.get(|| slow(attempts.clone())).await.ok(), Some(7));
        assert_eq!(
            attempts.load(Ordering::SeqCst),
            1,
            "one attempt, not one per check"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_attempt_fails_at_its_limit_and_the_next_check_retries() {
        let lazy = Arc::new(LazyConnection::<u32>::new());
        let stalled = || std::future::pending::<Result<u32, redis::RedisError>>();
        let waiter = {
            let lazy = Arc::clone(&lazy);
            tokio::spawn(async move { lazy.get(stalled).await })
        };
        tokio::time::sleep(ATTEMPT_LIMIT.saturating_sub(Duration::from_millis(1))).await;
        assert!(lazy.is_connecting(), "still within its limit");
        let err = waiter.await.unwrap().unwrap_err();
        assert!(
            err.is_transport(),
            "a stalled attempt fails its waiters as the store failing: {err:?}"
        );
        assert!(err.to_string().contains("did not finish"), "{err}");
        assert!(!lazy.is_connecting() && !lazy.is_connected());
        assert_eq!(
            lazy.get(|| async { Ok(5) }).await.ok(),
            Some(5),
            "the next check starts a new attempt"
        );
        assert!(!lazy.is_connecting(), "connected, no attempt");
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_whose_every_waiter_gave_up_still_completes() {
        let lazy = LazyConnection::<u32>::new();
        let slow = || async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok::<_, redis::RedisError>(7)
        };
        let first = tokio::time::timeout(Duration::from_millis(10), lazy.get(slow)).await;
        assert!(first.is_err());
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(lazy.is_connected(), "connected with nobody waiting");
        assert_eq!(lazy.get(|| async { Ok(8) }).await.ok(), Some(7));
    }

    #[test]
    fn an_attempt_dropped_with_its_runtime_fails_its_waiters_and_the_next_check_retries() {
        let lazy = Arc::new(LazyConnection::<u32>::new());
        let first = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let (release, gate) = gate();
        let attempts = Arc::new(AtomicUsize::new(0));
        // The attempt never ends on its own; its check gives up.
        let gave_up = first.block_on(async {
            tokio::time::timeout(
                Duration::from_millis(10),
                lazy.get(|| gated(&attempts, &gate, Ok(7))),
            )
            .await
        });
        assert!(gave_up.is_err());
        drop(first);
        let second = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let got = second.block_on(lazy.get(|| async { Ok(3) }));
        assert_eq!(
            got.ok(),
            Some(3),
            "a new attempt, not a wait for the dead one"
        );
        drop(release);
    }

    #[tokio::test]
    async fn a_ready_connection_is_used_without_an_attempt() {
        let lazy = LazyConnection::ready(5_u32);
        assert!(lazy.is_connected());
        let never =
            || async { Err::<u32, _>(redis::RedisError::from((redis::ErrorKind::Io, "x"))) };
        assert_eq!(lazy.get(never).await.ok(), Some(5));
    }
}
