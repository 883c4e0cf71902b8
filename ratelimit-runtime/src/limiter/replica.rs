//! Waiting for a replica to acknowledge the store's writes: the one rule for a lease's take
//! (kept only once replicated) and for the checks that ask for replica acknowledgement
//! ([`Settings::replica_ack`], [`crate::Limit::with_replica_ack`]).

#[allow(clippy::wildcard_imports)]
use super::*;

/// The longest a take waits for a replica to acknowledge it ([`Store::take_replicated`]; at
/// most the limiter's timeout). On loopback a healthy replica answers in well under 1 ms.
const REPLICA_WAIT: Duration = Duration::from_millis(10);

/// What a call does with a replica's acknowledgement of its take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReplicaAck {
    /// Waits when its checks ask ([`RateLimiter::wants_replica_ack`]) and its failure policy
    /// is not `allow` (which would admit an unacknowledged call all the same); an admission no
    /// replica acknowledged is [`StoreError::Unreplicated`], which the failure policy answers
    /// as it answers a timeout.
    AsAsked,
    /// Always waits; an admission no replica acknowledged is kept, and told to the caller: a
    /// lease's take that did not ask, which serves its call as a check would.
    Told,
}

impl RateLimiter {
    /// How long a take waits for a replica: [`REPLICA_WAIT`], or the timeout when shorter.
    fn replica_wait(&self) -> Duration {
        self.inner.settings.timeout.min(REPLICA_WAIT)
    }

    /// Whether a call of `checks` waits for a replica's acknowledgement once admitted.
    pub(super) fn wants_replica_ack(&self, checks: &[Check<'_>]) -> bool {
        self.inner.settings.replica_ack || checks.iter().any(|c| c.replica_ack)
    }

    /// A take of `checks` under `call_id` whose writes a replica acknowledged within
    /// [`RateLimiter::replica_wait`], on each server it wrote: the verdict, and whether one
    /// did. Under [`ReplicaAck::AsAsked`] an admission no replica acknowledged is
    /// [`StoreError::Unreplicated`]: the master counted the call, a failover could forget it.
    pub(super) async fn take_acknowledged(
        &self,
        checks: &[Check<'_>],
        call_id: &str,
        ack: ReplicaAck,
    ) -> Result<(Verdict, bool), StoreError> {
        let wait = self.replica_wait();
        let (verdict, replicated) = self
            .inner
            .store
            .take_replicated(checks, call_id, wait)
            .await?;
        if ack == ReplicaAck::AsAsked && verdict.is_admitted() && !replicated {
            return Err(StoreError::Unreplicated(wait));
        }
        Ok((verdict, replicated))
    }

    /// [`RateLimiter::ask`] of a lease's take under `call_id`, which always waits for a
    /// replica: the answer, and whether the store admitted the take and no replica
    /// acknowledged it. A take whose checks ask for replica acknowledgement (under a policy
    /// other than `allow`) is then answered as any such check is ([`ReplicaAck::AsAsked`]);
    /// one that does not ask keeps its admission ([`ReplicaAck::Told`]).
    pub(super) async fn ask_told(&self, checks: &[Check<'_>], call_id: &str) -> (Asked, bool) {
        match self.ask_now(checks, Some(call_id)) {
            Ok(asked) => (asked, false),
            Err(call) => {
                let asks = call.policy != FailurePolicy::Allow && self.wants_replica_ack(checks);
                let ack = if asks {
                    ReplicaAck::AsAsked
                } else {
                    ReplicaAck::Told
                };
                let result = self
                    .ask_remote(checks, Some(call_id), call.policy, ack)
                    .await;
                let unacknowledged = match &result {
                    Ok((verdict, replicated)) => verdict.is_admitted() && !replicated,
                    Err(e) => e.is_unreplicated(),
                };
                let result = result.map(|(verdict, _)| verdict);
                (
                    self.answered(checks, Some(call_id), call, result),
                    unacknowledged,
                )
            }
        }
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
        /// Takes that waited for a replica.
        waits: std::sync::atomic::AtomicUsize,
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
        fn take_replicated<'a>(
            &'a self,
            checks: &'a [Check<'a>],
            call_id: &'a str,
            _: Duration,
        ) -> StoreFuture<'a, (Verdict, bool)> {
            self.waits
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Box::pin(async move { Ok((self.take(checks, call_id).await?, false)) })
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
        let answers: Vec<bool> = futures_admitted(&local, "l", &policy).await;
        assert_eq!(answers, [true, true, true, false, false]);

        // Under `allow`, which admits an unacknowledged call all the same, nothing waits.
        let waits = store.waits.load(std::sync::atomic::Ordering::Relaxed);
        let allow = limiter(&store, FailurePolicy::Allow, true);
        let answers: Vec<bool> = futures_admitted(&allow, "a", &policy).await;
        assert_eq!(answers, [true, true, true, false, false]);
        assert_eq!(
            store.waits.load(std::sync::atomic::Ordering::Relaxed),
            waits
        );
    }

    async fn futures_admitted(limiter: &RateLimiter, key: &str, policy: &Policy) -> Vec<bool> {
        let mut answers = Vec::new();
        for _ in 0..5 {
            let v = limiter.check(&[Check::new(key, policy)]).await.unwrap();
            answers.push(v.is_admitted());
        }
        answers
    }
}
