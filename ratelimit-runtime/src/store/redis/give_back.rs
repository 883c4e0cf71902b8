//! [`Store::take_briefly`](crate::store::Store::take_briefly) on one Redis server: a take
//! whose receipts come back in its reply, and that gives back what it took when its caller
//! stops waiting for the answer.
//!
//! Written as receipt keys, a take's receipts cost the server about half as much again as the
//! check itself (a key named, looked for and written per limit), although only a call whose
//! answer came too late ever reads them. Here the take sends `~` instead of a call id: the
//! scripts put each receipt's figures in the reply and write none. The call's future owns
//! what it needs (the connection, its keys and limits), so that when the caller drops it (the
//! limiter's timeout answered first) it is handed to a task that waits for the reply and, if
//! the call was admitted, sends those receipts back (refund.lua's `return`), which gives back
//! exactly what a refund by receipt keys would have, once. The price: a take whose reply is
//! lost with its connection stays counted (never more admitted than the quota).
//!
//! A refund under the call id of such a take (the limiter's refund of a timed-out check,
//! which its shutdown waits for) waits for that give-back instead of sending a refund of its
//! own, which would find no receipt key: [`GivingBack`].

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use redis::aio::ConnectionManager;
use tokio::sync::oneshot;

use super::invoke::{Calls, Mode, compensate, take_in_reply};
use super::wire::ReplyReceipt;
use crate::decision::Verdict;
use crate::error::StoreError;
use crate::policy::Policy;
use crate::store::Check;

/// The longest a take given up on is waited for, and its return with it: a receipt gives
/// nothing back 10 s after its take (the scripts' `RECEIPT_TTL_US`), so a reply later than
/// that has nothing left to return.
const RETURN_WAIT: Duration = Duration::from_secs(10);

/// The takes given up on whose give-back is in flight, by call id, each with the receiving
/// end of a channel its task closes when done. Entries live as long as their task (at most
/// [`RETURN_WAIT`]).
#[derive(Debug, Default)]
pub(crate) struct GivingBack(Mutex<HashMap<Box<str>, oneshot::Receiver<()>>>);

impl GivingBack {
    /// Waits until the give-back of the take under `call_id` is done, if one is in flight;
    /// whether one was.
    pub(super) async fn wait_for(&self, call_id: &str) -> bool {
        let pending = self.entries().remove(call_id);
        match pending {
            Some(done) => {
                // Closed, never sent on: the task ended, whatever it did.
                let _ = done.await;
                true
            }
            None => false,
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<Box<str>, oneshot::Receiver<()>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A call's limits and connection, owned: what its take needs once its caller is gone.
struct OwnedCall {
    conn: ConnectionManager,
    calls: Arc<Calls>,
    limits: Vec<(Box<str>, Policy)>,
}

/// What a take answered, with the receipts of an admitted call.
type Taken = Result<(Verdict, Vec<ReplyReceipt>), StoreError>;

/// The take in flight, boxed so that it can move to a task of its own.
type TakeInFlight = Pin<Box<dyn Future<Output = (OwnedCall, Taken)> + Send>>;

/// The checks of owned limits.
fn checks_of(limits: &[(Box<str>, Policy)]) -> Vec<Check<'_>> {
    limits
        .iter()
        .map(|(key, policy)| Check::new(key, policy))
        .collect()
}

impl OwnedCall {
    async fn take(mut self) -> (Self, Taken) {
        let taken = {
            let checks = checks_of(&self.limits);
            take_in_reply(&mut self.conn, &self.calls, &checks).await
        };
        (self, taken)
    }

    /// Gives back, by the receipts its reply carried, what the take under `call_id` took.
    async fn give_back(mut self, call_id: &str, receipts: &[ReplyReceipt]) {
        let checks = checks_of(&self.limits);
        let given = compensate(
            &mut self.conn,
            &self.calls,
            Mode::Return(call_id, receipts),
            &checks,
        )
        .await;
        if let Err(error) = given {
            tracing::debug!(target: crate::observe::log::STORE,
                %error,
                "redis: a take given up on could not be given back; it may stay counted"
            );
        }
    }
}

/// The take of `checks` with its receipts in the reply, given back if the returned future is
/// dropped before it answers.
pub(super) fn take_or_give_back(
    conn: ConnectionManager,
    calls: Arc<Calls>,
    giving_back: Arc<GivingBack>,
    checks: &[Check<'_>],
    call_id: &str,
) -> impl Future<Output = Result<Verdict, StoreError>> + Send + 'static {
    let call = OwnedCall {
        conn,
        calls,
        limits: checks
            .iter()
            .map(|c| (Box::from(c.key), *c.policy))
            .collect(),
    };
    GiveBackIfDropped {
        take: Some(Box::pin(call.take())),
        call_id: Box::from(call_id),
        giving_back,
    }
}

/// A take that, dropped before its answer, is finished in a task of its own and given back.
struct GiveBackIfDropped {
    take: Option<TakeInFlight>,
    call_id: Box<str>,
    /// The store's registry of give-backs in flight.
    giving_back: Arc<GivingBack>,
}

impl Future for GiveBackIfDropped {
    type Output = Result<Verdict, StoreError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(take) = self.take.as_mut() else {
            return Poll::Ready(Err(StoreError::BadReply(
                "a take polled after it answered".to_owned(),
            )));
        };
        let (_, taken) = ready!(take.as_mut().poll(cx));
        self.take = None;
        Poll::Ready(taken.map(|(verdict, _)| verdict))
    }
}

impl Drop for GiveBackIfDropped {
    fn drop(&mut self) {
        let Some(take) = self.take.take() else {
            return;
        };
        // Outside a runtime nothing can wait for the reply: the call stays counted.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let call_id = std::mem::take(&mut self.call_id);
        let (done, waited) = oneshot::channel::<()>();
        let registry = Arc::clone(&self.giving_back);
        registry.entries().insert(call_id.clone(), waited);
        runtime.spawn(async move {
            let returned = tokio::time::timeout(RETURN_WAIT, async {
                let (call, taken) = take.await;
                if let Ok((verdict, receipts)) = taken
                    && verdict.is_admitted()
                    && !receipts.is_empty()
                {
                    call.give_back(&call_id, &receipts).await;
                }
            })
            .await;
            if returned.is_err() {
                tracing::debug!(target: crate::observe::log::STORE,
                    "redis: a take given up on did not answer in time; it may stay counted"
                );
            }
            registry.entries().remove(&call_id);
            drop(done);
        });
    }
}
