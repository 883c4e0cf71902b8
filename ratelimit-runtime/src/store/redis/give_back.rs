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

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use redis::aio::ConnectionManager;

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

/// A call's limits and connection, owned: what its take needs once its caller is gone.
struct OwnedCall {
    conn: ConnectionManager,
    calls: Arc<Calls>,
    limits: Vec<(Box<str>, Policy)>,
    call_id: Box<str>,
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

    /// Gives back, by the receipts its reply carried, what the take took.
    async fn give_back(mut self, receipts: &[ReplyReceipt]) {
        let checks = checks_of(&self.limits);
        let given = compensate(
            &mut self.conn,
            &self.calls,
            Mode::Return(&self.call_id, receipts),
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
        call_id: Box::from(call_id),
    };
    GiveBackIfDropped(Some(Box::pin(call.take())))
}

/// A take that, dropped before its answer, is finished in a task of its own and given back.
struct GiveBackIfDropped(Option<TakeInFlight>);

impl Future for GiveBackIfDropped {
    type Output = Result<Verdict, StoreError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(take) = self.0.as_mut() else {
            return Poll::Ready(Err(StoreError::BadReply(
                "a take polled after it answered".to_owned(),
            )));
        };
        let (_, taken) = ready!(take.as_mut().poll(cx));
        self.0 = None;
        Poll::Ready(taken.map(|(verdict, _)| verdict))
    }
}

impl Drop for GiveBackIfDropped {
    fn drop(&mut self) {
        let Some(take) = self.0.take() else {
            return;
        };
        // Outside a runtime nothing can wait for the reply: the call stays counted.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let returned = tokio::time::timeout(RETURN_WAIT, async move {
                let (call, taken) = take.await;
                if let Ok((verdict, receipts)) = taken
                    && verdict.is_admitted()
                    && !receipts.is_empty()
                {
                    call.give_back(&receipts).await;
                }
            })
            .await;
            if returned.is_err() {
                tracing::debug!(target: crate::observe::log::STORE,
                    "redis: a take given up on did not answer in time; it may stay counted"
                );
            }
        });
    }
}
