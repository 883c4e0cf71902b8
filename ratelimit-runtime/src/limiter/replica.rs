//! Waiting for a replica to acknowledge the store's writes: the one rule for a lease's take
//! (kept only once replicated) and for the checks that ask for replica acknowledgement
//! ([`Settings::replica_ack`], [`crate::Limit::with_replica_ack`]).

#[allow(clippy::wildcard_imports)]
use super::*;

/// The longest a write waits for a replica to acknowledge it ([`Store::replicate`]; at most
/// the limiter's timeout). On loopback a healthy replica answers in well under 1 ms.
const REPLICA_WAIT: Duration = Duration::from_millis(10);

impl RateLimiter {
    /// How long a write waits for a replica: [`REPLICA_WAIT`], or the timeout when shorter.
    fn replica_wait(&self) -> Duration {
        self.inner.settings.timeout.min(REPLICA_WAIT)
    }

    /// Whether a replica acknowledged, within [`RateLimiter::replica_wait`], every write this
    /// store sent the server that holds `key` (Redis `WAIT 1`). An error, or no answer within
    /// twice the wait, is `false`.
    pub(super) async fn replicated(&self, key: &str) -> bool {
        let wait = self.replica_wait();
        tokio::time::timeout(wait * 2, self.inner.store.replicate(key, wait))
            .await
            .is_ok_and(|r| r.is_ok_and(|acknowledged| acknowledged))
    }

    /// Whether a call of `checks` waits for a replica's acknowledgement once admitted.
    pub(super) fn wants_replica_ack(&self, checks: &[Check<'_>]) -> bool {
        self.inner.settings.replica_ack || checks.iter().any(|c| c.replica_ack)
    }

    /// `Ok` once a replica acknowledged the write of every check that asks for it (every
    /// check, when the limiter does), each key once; [`StoreError::Unreplicated`] when one
    /// was not acknowledged in time: the master counted the call, a failover could forget it.
    pub(super) async fn acknowledged(&self, checks: &[Check<'_>]) -> Result<(), StoreError> {
        let all = self.inner.settings.replica_ack;
        for (i, check) in checks.iter().enumerate() {
            let asks = all || check.replica_ack;
            let seen = checks[..i].iter().any(|c| c.key == check.key);
            if asks && !seen && !self.replicated(check.key).await {
                return Err(StoreError::Unreplicated(self.replica_wait()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::algorithm::Algorithm;
    use crate::policy::Policy;
    use crate::store::StoreFuture;

    /// A store that counts in memory, answers through futures (a remote store), and whose
    /// replica acknowledges nothing; it records the refunds it gets.
    #[derive(Debug, Default)]
    struct NoReplicaStore {
        memory: MemoryStore,
        refunds: Mutex<Vec<String>>,
    }

    impl Store for NoReplicaStore {
        fn check<'a>(&'a self, checks: &'a [Check<'a>]) -> StoreFuture<'a> {
            self.memory.check(checks)
        }
        fn take<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> StoreFuture<'a> {
            self.memory.take(checks, call_id)
        }
        fn refund<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> StoreFuture<'a, ()> {
            self.refunds.lock().unwrap().push(call_id.to_owned());
            self.memory.refund(checks, call_id)
        }
        fn replicate<'a>(&'a self, _: &'a str, _: Duration) -> StoreFuture<'a, bool> {
            Box::pin(async { Ok(false) })
        }
        fn name(&self) -> &'static str {
            "no-replica"
        }
    }

    fn limiter(store: &Arc<NoReplicaStore>, policy: FailurePolicy, ack: bool) -> RateLimiter {
        RateLimiter::builder()
            .store(store.clone())
            .failure_policy(policy)
            .replica_ack(ack)
            .build_lazy()
            .unwrap()
    }

    /// No replica acknowledges: under `deny` every call asking for it is refused (never
    /// admitted uncounted) and its count given back; the breaker stays closed; a check that
    /// does not ask is admitted as usual; under `local` the process's memory answers.
    #[tokio::test(start_paused = true)]
    async fn a_write_no_replica_acknowledged_is_answered_by_the_policy_and_given_back() {
        let policy = Policy::new(Algorithm::Fixed, 3, Duration::from_secs(60)).unwrap();
        let store = Arc::new(NoReplicaStore::default());
        let deny = limiter(&store, FailurePolicy::Deny, true);
        for _ in 0..5 {
            let e = deny.check(&[Check::new("k", &policy)]).await.unwrap_err();
            assert!(e.is_unreplicated(), "{e}");
            assert!(!deny.store_failing(), "the breaker opened");
            // The count is given back in a task of its own.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(
            store.refunds.lock().unwrap().len(),
            5,
            "every count given back"
        );
        let peeked = store
            .memory
            .peek(&[Check::new("k", &policy)])
            .await
            .unwrap();
        assert_eq!(peeked.decisions()[0].remaining, 3);

        let per_limit = limiter(&store, FailurePolicy::Deny, false);
        let asks = Check::new("login", &policy).with_replica_ack();
        assert!(
            per_limit
                .check(&[asks])
                .await
                .unwrap_err()
                .is_unreplicated()
        );
        let plain = Check::new("search", &policy);
        assert!(per_limit.check(&[plain]).await.unwrap().is_admitted());

        let local = limiter(&store, FailurePolicy::Local, true);
        let answers: Vec<bool> = futures_admitted(&local, &policy).await;
        assert_eq!(answers, [true, true, true, false, false]);
    }

    async fn futures_admitted(limiter: &RateLimiter, policy: &Policy) -> Vec<bool> {
        let mut answers = Vec::new();
        for _ in 0..5 {
            let v = limiter.check(&[Check::new("l", policy)]).await.unwrap();
            answers.push(v.is_admitted());
        }
        answers
    }
}
