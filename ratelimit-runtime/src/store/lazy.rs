//! A connection made in the background, shared by every check once it is up.
//!
//! Connecting (and loading the scripts) can take longer than one check may wait. If the
//! connection were made inside the check, the limiter's timeout would cancel it half way and
//! the next check would start from zero — on a slow network a store could never connect. So
//! the connection is made by a spawned task that outlives the check that started it: the first
//! check waits for it (within its own timeout), later checks that come while it is still
//! connecting fail at once (the failure policy answers), and the first check after it is up
//! uses it. A failed attempt is started again by the next check.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, OnceCell};

use crate::error::StoreError;

#[derive(Debug)]
struct Inner<T> {
    conn: OnceCell<T>,
    connecting: AtomicBool,
    done: Notify,
    last_error: Mutex<Option<String>>,
}

/// A connection of type `T` (a cheap-to-clone multiplexed handle), made once in the background.
#[derive(Debug)]
pub(crate) struct LazyConnection<T> {
    inner: Arc<Inner<T>>,
}

impl<T: Clone + Send + Sync + 'static> LazyConnection<T> {
    /// Not connected yet.
    pub(crate) fn new() -> Self {
        Self::with(None)
    }

    /// Already connected.
    pub(crate) fn ready(conn: T) -> Self {
        Self::with(Some(conn))
    }

    fn with(conn: Option<T>) -> Self {
        Self {
            inner: Arc::new(Inner {
                conn: OnceCell::new_with(conn),
                connecting: AtomicBool::new(false),
                done: Notify::new(),
                last_error: Mutex::new(None),
            }),
        }
    }

    /// Whether the connection is up.
    pub(crate) fn is_connected(&self) -> bool {
        self.inner.conn.initialized()
    }

    /// The connection; when there is none yet, starts `connect` in a task of its own (unless
    /// one is running) and waits for it.
    pub(crate) async fn get<F, Fut>(&self, connect: F) -> Result<T, StoreError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, redis::RedisError>> + Send + 'static,
    {
        // Registered before looking, so a task finishing in between still wakes us.
        let done = self.inner.done.notified();
        if let Some(conn) = self.inner.conn.get() {
            return Ok(conn.clone());
        }
        if self.inner.connecting.swap(true, Ordering::AcqRel) {
            return Err(StoreError::Redis(
                "still connecting (started by an earlier check)".to_owned(),
            ));
        }
        let inner = Arc::clone(&self.inner);
        let attempt = connect();
        tokio::spawn(async move {
            let result = attempt.await;
            let error = match result {
                Ok(conn) => {
                    let _ = inner.conn.set(conn);
                    None
                }
                Err(e) => Some(e.to_string()),
            };
            if let Ok(mut last) = inner.last_error.lock() {
                *last = error;
            }
            inner.connecting.store(false, Ordering::Release);
            inner.done.notify_waiters();
        });
        done.await;
        if let Some(conn) = self.inner.conn.get() {
            return Ok(conn.clone());
        }
        let error = self
            .inner
            .last_error
            .lock()
            .ok()
            .and_then(|e| e.clone())
            .unwrap_or_else(|| "could not connect".to_owned());
        Err(StoreError::Redis(error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    #[tokio::test]
    async fn a_connection_cut_short_by_a_timeout_still_completes() {
        let lazy = LazyConnection::<u32>::new();
        let attempts = Arc::new(AtomicUsize::new(0));
        let slow = |attempts: Arc<AtomicUsize>| async move {
            attempts.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok::<_, redis::RedisError>(7)
        };
        let first = tokio::time::timeout(
            Duration::from_millis(10),
            lazy.get(|| slow(attempts.clone())),
        )
        .await;
        assert!(first.is_err(), "the first check gives up at its timeout");
        let second = lazy.get(|| slow(attempts.clone())).await;
        assert!(
            second.is_err(),
            "a check during the connection fails at once"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(lazy.is_connected());
        assert_eq!(lazy.get(|| slow(attempts.clone())).await.ok(), Some(7));
        assert_eq!(
            attempts.load(Ordering::SeqCst),
            1,
            "one connection, not one per check"
        );
    }

    #[tokio::test]
    async fn a_failed_connection_is_tried_again_and_its_error_reported() {
        let lazy = LazyConnection::<u32>::new();
        let failing =
            || async { Err::<u32, _>(redis::RedisError::from((redis::ErrorKind::Io, "refused"))) };
        let err = lazy.get(failing).await.unwrap_err();
        assert!(err.to_string().contains("refused"), "{err}");
        assert_eq!(lazy.get(|| async { Ok(3) }).await.ok(), Some(3));
    }
}
