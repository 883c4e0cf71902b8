//! Settled costs (`settle = …`): a call is charged an estimate before its body (its
//! `cost = …`) and settled after it to the units it used, so that the limit holds on actual
//! usage: the difference back when it used less, the excess charged when it used more (the
//! rule is [`crate::algorithm::settle`]; the stores' `Store::settle` applies it in one step).
//!
//! Two forms, one step of the pipeline for every transport:
//!
//! * `settle = |output| <units>`: after the body, the closure reads its output (a plain
//!   function's `Result`, a handler's response value, a gRPC method's `Result<Response<_>, _>`);
//! * `settle = "later"`: the body takes its [`Reservation`] ([`Reservation::take`]) and settles
//!   it when it knows what it used, after the function returned if need be (a streaming body
//!   that counts tokens as it sends them). A reservation dropped unsettled, or never taken,
//!   leaves the call counted at its estimate.
//!
//! A settle that fails (the store is down, slow, or the receipt expired) never gives back:
//! the call stays counted at its estimate, and its excess is charged whenever the store
//! answers the settle at all.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use super::Admitted;
use super::plan::Outcome;
use crate::cost::{IntoUnits, Units};

tokio::task_local! {
    /// The reservation of the rate-limited call whose body runs in this task
    /// (`settle = "later"`), until the body takes it.
    static RESERVATION: Slot;
}

/// Where a call's reservation waits for its body to take it.
type Slot = Arc<Mutex<Option<Admitted<'static>>>>;

/// An admitted call whose cost is still an estimate (`settle = "later"` on
/// `#[rate_limit]`): [`Reservation::settle`] charges it what it used. Taken by the body from
/// the call it runs in ([`Reservation::take`]); it is `Send + 'static`, so it can move into a
/// response stream and settle when the stream ends. Dropped unsettled, the call stays counted
/// at its estimate.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use ratelimit_runtime::{RateLimitError, RateLimiter, settle::Reservation, rate_limit};
///
/// // 10,000 tokens a minute; a completion may use up to `max_tokens`, and counts what it used.
/// #[rate_limit(num = 10_000, time = 60, cost = max_tokens, settle = "later")]
/// async fn complete(max_tokens: u32) -> Result<String, RateLimitError> {
///     let reservation = Reservation::take().expect("settle = \"later\" gives one");
///     // … the model streams its answer; at the end it reports what it used:
///     reservation.settle(120).await;
///     Ok("an answer".into())
/// }
///
/// RateLimiter::builder().build().await?.install();
/// for _ in 0..76 {
///     complete(1_000).await?; // each call is charged 1,000, then settled to 120
/// }
/// // 76 × 120 = 9,120 of 10,000 used: an estimate of 1,000 no longer fits.
/// assert!(complete(1_000).await.is_err());
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a reservation dropped unsettled leaves the call counted at its estimate: call `settle(used)`"]
pub struct Reservation {
    admitted: Admitted<'static>,
}

impl Reservation {
    /// The reservation of the rate-limited call this code runs in (`settle = "later"`), once:
    /// `None` outside such a call, in another task than the body's, or when it was taken.
    #[must_use]
    pub fn take() -> Option<Self> {
        RESERVATION
            .try_with(|slot| slot.lock().unwrap_or_else(PoisonError::into_inner).take())
            .ok()
            .flatten()
            .map(|admitted| Self { admitted })
    }

    /// Settles the call to the units it used: the difference back when it used less than its
    /// estimate, the excess charged when it used more. A negative value keeps the estimate
    /// (and is logged); 0 gives the whole estimate back.
    ///
    /// **What it returns:** nothing to handle. It returns once the store has the settle, or
    /// once it failed or ran past the limiter's timeout; then the call stays counted at its
    /// estimate (never less than it used: a store fault never gives units back) and a `WARN`
    /// event "rate-limit settle failed" says so (target `ratelimit_runtime::limiter`). The
    /// caller's own result does not change either way.
    pub async fn settle<C: IntoUnits>(self, used: C) {
        self.admitted
            .settle_to(Outcome::Ok, Some(Units::of(used)))
            .await;
    }
}

/// Runs `body` with `admitted`'s reservation available to it ([`Reservation::take`]); gives
/// back the admitted call when the body did not take it.
pub(crate) async fn with_reservation<F: Future>(
    admitted: Admitted<'static>,
    body: F,
) -> (F::Output, Option<Admitted<'static>>) {
    let slot: Slot = Arc::new(Mutex::new(Some(admitted)));
    let out = RESERVATION.scope(Arc::clone(&slot), body).await;
    let left = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
    (out, left)
}

/// `settle = |output| …`: the units the closure reads from the body's output (the macro's
/// call, so that the closure's argument type is the output's).
pub fn measure<T, C: IntoUnits>(output: &T, used: impl FnOnce(&T) -> C) -> Option<Units> {
    Some(Units::of(used(output)))
}

/// What the body's output settles: `None` with `settle = "later"` (the reservation does).
pub(crate) fn used(actual: Option<Units>) -> Option<u64> {
    match actual.map(Units::to_used) {
        None => None,
        Some(Ok(units)) => Some(units),
        Some(Err(value)) => {
            tracing::error!(target: crate::observe::log::LIMITER, value = %value,
                "a settled cost is negative; the call stays counted at its estimate");
            None
        }
    }
}
