//! Calling someone else's API: one budget for the whole fleet, paced by the partner's own
//! answers (the `client` feature). The guide's chapter "Calling rate-limited APIs" walks
//! through an LLM API and a GitHub-style one.
//!
//! # The design
//!
//! A partner (an LLM API, a payment provider, GitHub) limits what the fleet sends it: so many
//! requests, perhaps so many tokens, a minute. The fleet keeps **one budget** for it in the
//! shared store: a [`Limit`](crate::Limit) `by = "global"` under the partner's scope, checked
//! by every process before each request, as the attribute checks a function. What is new is
//! the other direction: **the partner's answer is a lesson for every process**.
//!
//! * **Before a request** ([`PartnerService`]): the call goes through the one pipeline with
//!   waiting (the `wait` step of `#[rate_limit(wait = "…")]`, not a second one): a spent
//!   budget makes the request wait for its slot, up to the layer's
//!   [`wait`](PartnerLayerBuilder::wait); past it the request fails with
//!   [`RateLimitError::Limited`](crate::RateLimitError::Limited) and never reaches the
//!   partner. A tokens budget takes an estimate read from the request.
//! * **After the response**: the layer reads the partner's fields with the readers it was
//!   given ([`answer`]'s [`ReadAnswer`]s: [`RetryAfter`], [`IetfFields`], [`OpenAiFields`],
//!   [`GitHubFields`], or one of your own) into an [`Advice`], cuts every duration to the
//!   layer's [`max_pause`](PartnerLayerBuilder::max_pause), and tells the store:
//!   - a pause (a 429 or 503 with `Retry-After`) becomes [`RateLimiter::defer`]: every budget
//!     of the partner is unavailable until then, for every process (waiting callers wait; the
//!     rest are refused with the partner's time);
//!   - what the partner will still admit is what it says is left (`r=3`, `remaining: 3`)
//!     less the calls in flight: those the fleet admitted after this one (what the budget
//!     lost since this call was admitted, with what it refilled and what this call's settle
//!     gave back, less what this process's lessons took meanwhile; a lowering by another
//!     process counts too, so the count errs towards fewer calls) and
//!     the unit the budget may be refilling before the next answer is learnt;
//!   - a budget with nothing left for the partner is deferred until the partner's reset, so
//!     no call is sent past the partner's window;
//!   - a budget with units left becomes [`RateLimiter::lower`]: the shared budget is brought
//!     down to them, by taking the difference; never up, so the configured quota stays the
//!     most the fleet ever sends;
//!   - a quota the partner states ([`Stated`]: `RateLimit-Policy`, `x-ratelimit-limit-*`,
//!     read from a success or a 429) below the budget's quota in force prices every call in
//!     proportion (a partner at half the quota: two units a request), so the budget admits at
//!     the partner's rate under its own key; a partner stating more prices nothing. The
//!     price is this process's, believed for the budget's period or `max_pause` (the longer)
//!     after the last answer that stated it, and never past the budget's capacity.
//!
//!   Then the tokens budget is settled to what the response says was used (a closure over
//!   the response's head, [`PartnerLayerBuilder::tokens`]).
//! * **Hostile input**: every value is the partner's. A value that does not parse is ignored
//!   with one log line (at most one every ten seconds); a pause or reset longer than
//!   `max_pause` is cut to it. A partner can slow the fleet down to what it admits, never
//!   lock it out past `max_pause` in one answer, never raise the configured quota; a quota
//!   it states slows the budget to one call each time it is whole again at the slowest, and
//!   for no longer than the budget's period or `max_pause` after it last says so.
//!
//! The response itself is handed back untouched: a 429 is still the caller's to retry (its
//! retry then waits for the pause, in its process and every other).
//!
//! **Stores.** The pause is the admin [`RateLimiter::block`] (one key per limit, hash-tagged
//! as every key is), the lowering a take through the store: on memory for one process, on
//! Redis and Redis Cluster for the fleet. Learning costs a round trip or two only when the
//! answer says something new (a pause, or no more left than the budget had).
//!
//! **Without the layer**: a function under `#[rate_limit(…, wait = "…")]` that calls a
//! partner reports a 429 it saw with [`RateLimiter::defer`] (and what is left with
//! [`RateLimiter::lower`]).
//!
//! ```
//! use std::time::Duration;
//! use ratelimit_runtime::client::{PartnerLayer, OpenAiFields, RetryAfter};
//! use ratelimit_runtime::{Algorithm, Policy, RateLimiter};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = PartnerLayer::builder("openai")
//!     .requests(Policy::new(Algorithm::Gcra, 500, Duration::from_secs(60))?)
//!     .tokens(Policy::new(Algorithm::Token, 30_000, Duration::from_secs(60))?, |_request| 1_000)
//!     .read(RetryAfter)
//!     .read(OpenAiFields)
//!     .wait(Duration::from_secs(30))
//!     .limiter(RateLimiter::builder().build().await?)
//!     .build()?;
//! # let _ = layer;
//! # Ok(()) }
//! ```

pub mod answer;
mod learn;
#[cfg(feature = "reqwest")]
mod middleware;
mod service;

pub use answer::{
    Advice, Answer, Budget, GitHubFields, IetfFields, OpenAiFields, ReadAnswer, Remaining,
    RetryAfter, Stated,
};
#[cfg(feature = "reqwest")]
pub use middleware::PartnerMiddleware;
pub use service::{PartnerError, PartnerFuture, PartnerLayer, PartnerLayerBuilder, PartnerService};

#[cfg(doc)]
use crate::limiter::RateLimiter;
