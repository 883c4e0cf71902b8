//! What a call gets when the store fails or does not answer in time: the strictest
//! [`FailurePolicy`] of a call's limits, its answer, and the refund of a take the store ran too
//! late.

#[allow(clippy::wildcard_imports)]
use super::*;

impl RateLimiter {
    /// The failure policy of one call: the strictest of its checks' own, the limiter's for a
    /// check that names none.
    pub(super) fn failure_policy_of(&self, checks: &[Check<'_>]) -> FailurePolicy {
        let default = self.inner.settings.failure_policy;
        checks
            .iter()
            .map(|c| c.failure_policy.unwrap_or(default))
            .fold(FailurePolicy::Allow, FailurePolicy::stricter)
    }

    /// Answers a check the store could not, with `policy` (the call's, see
    /// [`RateLimiter::failure_policy_of`]): `error` is the failure of this check's own store
    /// call, `None` when the breaker skipped the store.
    pub(super) fn on_failure(
        &self,
        checks: &[Check<'_>],
        policy: FailurePolicy,
        error: Option<StoreError>,
    ) -> Result<Verdict, StoreError> {
        // A store that answered but cannot record the call (a memory store full of live
        // callers, a Redis at its maxmemory) is a flood of minted keys, not an outage:
        // admitting what it cannot count, or counting it only in this process, would let the
        // flood switch every caller's limit off. Such a call is refused, whatever the policy.
        let refused = error.as_ref().is_some_and(StoreError::cannot_record);
        count_failure(checks, policy, refused);
        self.warn_failure(checks, policy, error.as_ref());
        if refused {
            return Err(error.unwrap_or_else(|| self.inner.breaker.last_error()));
        }
        let last_error = || self.inner.breaker.last_error();
        match policy {
            FailurePolicy::Allow => Ok(admit_all(checks)),
            FailurePolicy::Deny => Err(error.unwrap_or_else(last_error)),
            FailurePolicy::Local => match self.check_locally(checks) {
                Some(answer) => answer,
                None => Err(error.unwrap_or_else(last_error)),
            },
        }
    }

    /// The warning of a failed check, at most one per interval (the others counted as held
    /// back): what failed, and what the failure policy does meanwhile.
    fn warn_failure(
        &self,
        checks: &[Check<'_>],
        policy: FailurePolicy,
        error: Option<&StoreError>,
    ) {
        let inner = &*self.inner;
        let Some(held_back) = inner.warnings.permit() else {
            return;
        };
        let store = inner.store.name();
        let scope = checks.first().map_or("", |c| c.scope);
        let policy_name = policy.as_str();
        let action = match policy {
            // Limits may name their own policy: the warning says which one answered.
            FailurePolicy::Allow => "calls under `allow` are admitted",
            FailurePolicy::Deny => "calls under `deny` are rejected",
            FailurePolicy::Local => "calls under `local` are checked in this process's memory",
        };
        match error {
            Some(error) if !error.is_transport() => {
                tracing::warn!(target: crate::observe::log::LIMITER,
                    store,
                    scope,
                    policy = policy_name,
                    %error,
                    held_back,
                    "rate-limit store could not decide this call; the failure policy answers it, other calls are unaffected"
                );
            }
            _ => {
                let (error, what) = match error {
                    Some(error) => (error.clone(), "failed"),
                    None => (inner.breaker.last_error(), "still failing"),
                };
                tracing::warn!(target: crate::observe::log::LIMITER,
                    store,
                    scope,
                    policy = policy_name,
                    %error,
                    held_back,
                    "rate-limit store {what}; {action} until it answers again"
                );
            }
        }
    }

    /// `local`: the call checked in this process's memory, each limit scaled to this
    /// process's share of the fleet (the keys stay as they are); `None` when a call costs
    /// more than its share (refused as under `deny`).
    fn check_locally(&self, checks: &[Check<'_>]) -> Option<Result<Verdict, StoreError>> {
        let inner = &*self.inner;
        let share = inner.settings.local_share;
        let (policies, shared);
        let checks = if share.get() == 1 {
            checks
        } else {
            policies = checks
                .iter()
                .map(|c| c.policy.share(share))
                .collect::<Result<Vec<_>, _>>()
                .ok()?;
            shared = checks
                .iter()
                .zip(&policies)
                .map(|(c, policy)| Check { policy, ..*c })
                .collect::<Vec<_>>();
            &shared[..]
        };
        let verdict = inner.local.get_or_init(MemoryStore::new).check_now(checks);
        if let Ok(verdict) = &verdict
            && !verdict.is_admitted()
        {
            log_rejection(checks, verdict, "local");
        }
        Some(verdict)
    }
}

/// Counts a failed check's calls by what answers them (a call the store cannot record is a
/// refusal whatever the policy).
fn count_failure(checks: &[Check<'_>], policy: FailurePolicy, refused: bool) {
    crate::observe::count_all(
        checks.iter().map(|c| (c.scope, c.policy.algorithm())),
        match policy {
            _ if refused => crate::observe::Outcome::FailureDeny,
            FailurePolicy::Allow => crate::observe::Outcome::FailureAllow,
            FailurePolicy::Deny => crate::observe::Outcome::FailureDeny,
            FailurePolicy::Local => crate::observe::Outcome::FailureLocal,
        },
    );
}

/// `allow`: every limit admits, reporting its full capacity.
fn admit_all(checks: &[Check<'_>]) -> Verdict {
    Verdict::new(
        checks
            .iter()
            .map(|c| {
                let capacity = c.policy.capacity();
                Decision::new(true, capacity, capacity, Duration::ZERO, Duration::ZERO)
            })
            .collect(),
    )
}

/// What the refund of a timed-out take needs its receipts for beyond the timeout: the store
/// runs the refund right after the take when both waited in its queue, and about a timeout
/// after it when the take ran in time and its answer was slow to come back; the spare covers
/// a client slow to send the refund (a starved runtime, a retransmitted packet).
const TIMEOUT_RECEIPT_SPARE: Duration = Duration::from_secs(2);

/// How long the receipts of a check sent as a take only for its timeout's refund are kept
/// ([`Store::take_briefly`]): the limiter's `timeout` and
/// two seconds more. A refund later than that finds nothing and the call stays counted (never
/// more admitted than the quota; a refused call counted, which a caller may feel as a limit
/// reached sooner during an incident).
pub(super) fn timeout_receipts_keep(timeout: Duration) -> Duration {
    timeout.saturating_add(TIMEOUT_RECEIPT_SPARE)
}

/// How long the background refund of a timed-out take may wait for the store. A stalled store
/// runs the queued take, then at once the refund queued behind it, so the wait is the stall's;
/// no receipt lives longer than 10 seconds, so a later refund could give back nothing anyway.
pub(super) const REFUND_WAIT: Duration = Duration::from_secs(10);

/// Gives back, in a task of its own, what the take under `call_id` took if the store runs it
/// after all (the caller already had the failure policy's answer and never waits for this).
/// The store runs a connection's commands in order, so the refund runs after the take; a take
/// that never ran, or was rejected, left no receipt and nothing is given back.
pub(super) fn refund_when_answered(limiter: &RateLimiter, checks: &[Check<'_>], call_id: &str) {
    let store = Arc::clone(&limiter.inner.store);
    let owned: Vec<(String, String, crate::policy::Policy)> = checks
        .iter()
        .map(|c| (c.key.to_owned(), c.scope.to_owned(), *c.policy))
        .collect();
    let call_id = call_id.to_owned();
    limiter.spawn_tracked(async move {
        let checks: Vec<Check<'_>> = owned
            .iter()
            .map(|(key, scope, policy)| Check::new(key, policy).with_scope(scope))
            .collect();
        let refund = tokio::time::timeout(REFUND_WAIT, store.refund(&checks, &call_id)).await;
        if !matches!(refund, Ok(Ok(()))) {
            tracing::debug!(target: crate::observe::log::LIMITER,
                scope = checks.first().map_or("", |c| c.scope),
                "the refund of a timed-out check did not complete; it may stay counted"
            );
        }
    });
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::sync::watch;

    use super::*;
    use crate::algorithm::Algorithm;
    use crate::policy::Policy;
    use crate::store::StoreFuture;

    /// A store making its first connection until `connect` is called: every call waits for it
    /// (as a lazy Redis store's checks wait for its attempt), then is answered from memory.
    #[derive(Debug)]
    struct ConnectingStore {
        memory: MemoryStore,
        connected: watch::Sender<bool>,
        asked: AtomicUsize,
        refunds: AtomicUsize,
    }

    impl ConnectingStore {
        fn new() -> Self {
            Self {
                memory: MemoryStore::new(),
                connected: watch::channel(false).0,
                asked: AtomicUsize::new(0),
                refunds: AtomicUsize::new(0),
            }
        }

        fn answer<'a>(
            &'a self,
            checks: &'a [Check<'a>],
            call_id: Option<&'a str>,
        ) -> StoreFuture<'a> {
            self.asked.fetch_add(1, Ordering::SeqCst);
            let mut connected = self.connected.subscribe();
            Box::pin(async move {
                let _ = connected.wait_for(|up| *up).await;
                match call_id {
                    Some(id) => self.memory.take(checks, id).await,
                    None => self.memory.check(checks).await,
                }
            })
        }
    }

    impl Store for ConnectingStore {
        fn check<'a>(&'a self, checks: &'a [Check<'a>]) -> StoreFuture<'a> {
            self.answer(checks, None)
        }

        fn take<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> StoreFuture<'a> {
            self.answer(checks, Some(call_id))
        }

        fn refund<'a>(&'a self, checks: &'a [Check<'a>], id: &'a str) -> StoreFuture<'a, ()> {
            self.refunds.fetch_add(1, Ordering::SeqCst);
            self.memory.refund(checks, id)
        }

        fn is_connecting(&self) -> bool {
            !*self.connected.borrow()
        }

        fn name(&self) -> &'static str {
            "connecting"
        }
    }

    /// A check that times out waiting for the store's first connection is answered by the
    /// policy, but opens no breaker and sends no refund: the next check waits for the same
    /// connection and is answered by the store.
    #[tokio::test(start_paused = true)]
    async fn a_timeout_during_the_first_connection_leaves_the_next_checks_to_the_store() {
        let store = Arc::new(ConnectingStore::new());
        let limiter = RateLimiter::builder()
            .store(Arc::clone(&store))
            .failure_policy(FailurePolicy::Deny)
            .build_lazy()
            .unwrap();
        let policy = Policy::new(Algorithm::Fixed, 2, Duration::from_secs(60)).unwrap();
        let checks = [Check::new("ratelimit:{app::cold}:fixed", &policy)];
        let first = limiter.check(&checks).await.unwrap_err();
        assert!(first.is_timeout(), "{first:?}");
        assert!(!limiter.store_failing(), "the breaker stays closed");

        let second = {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let checks = [Check::new("ratelimit:{app::cold}:fixed", &policy)];
                limiter.check(&checks).await
            })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(store.asked.load(Ordering::SeqCst), 2, "the store was asked");
        store.connected.send_replace(true);
        let second = second.await.unwrap().expect("the store answered");
        assert_eq!(second.decisions()[0].remaining, 1, "only this call counted");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            store.refunds.load(Ordering::SeqCst),
            0,
            "nothing to give back"
        );
    }
}
