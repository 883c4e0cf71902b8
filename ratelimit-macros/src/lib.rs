//! The `#[rate_limit]` attribute. Use it through `ratelimit-runtime`, which re-exports it:
//! `use ratelimit_runtime::rate_limit;`.
//!
//! The crate is split by phase: `attr` reads one attribute's arguments, `valid`
//! cross-checks them against each other and the function, `expand` generates the code. The
//! numeric rules of a policy are the runtime's own file (`rules`), compiled here too.
//! `async_trait` recognises a method `#[async_trait]` rewrote; `pat` reads the names a pattern
//! binds for both it and `valid` (`valid` reads `async_trait`, never the other way).

#![warn(missing_docs)]

mod async_trait;
mod attr;
mod expand;
mod pat;
// The runtime's policy rules: this file is a link to `ratelimit-runtime/src/policy/rules.rs`.
#[allow(dead_code, unreachable_pub)]
mod rules;
mod valid;

use proc_macro::TokenStream;

/// Puts a rate limit on an async function.
///
/// ```
/// use ratelimit_runtime::{rate_limit, RateLimitError};
///
/// #[rate_limit(algo = "sliding", num = 3, time = 10, key = "sms:{phone}")]
/// async fn send_sms(phone: &str) -> Result<(), RateLimitError> {
///     Ok(())
/// }
/// ```
///
/// # Arguments
///
/// | argument | meaning | default |
/// | --- | --- | --- |
/// | `algo` | `"fixed"`, `"sliding"`, `"sliding_counter"`, `"leaky"`, `"token"`, `"gcra"`, or `"concurrency"` (calls in flight, `time` is a slot's lease) | `"fixed"` |
/// | `num` | calls allowed per `time` (a positive integer); for the buckets, the refill/drain amount per `time` and the capacity unless `burst` is given | required |
/// | `time` | the period: integer seconds, or `"500ms"`, `"10s"`, `"1m"`, `"1h"`, `"1d"` | required |
/// | `by` | what identifies a caller: `"global"`, `"ip"`, `"url"`, `"user"`, `"app_id"`, `"header:<name>"` | `"global"` |
/// | `key` | a fixed key (`"login"`) or a template over the arguments: `"sms:{phone}"`, `"{form.phone}"`, `"{self.tenant}"`; `{{` and `}}` are literal braces; values are formatted with `Display` | none |
/// | `burst` | bucket capacity for `"leaky"`/`"token"`/`"gcra"` when it differs from `num` (the windows take none) | `num` |
/// | `cost` | units one call takes (at most the capacity) | `1` |
/// | `scope` | the bucket's name: functions with the same scope share quota; 1–200 of `A-Z a-z 0-9 _ : . - /` | the module path and function name |
/// | `framework` | `"axum"` or `"actix"`: makes the function a handler of that framework (checked against the enabled features) | none |
/// | `quota` | the limit's `num`, period and `burst` per caller, at run time: `"request"` (handlers and gRPC methods: the `Quota` the auth layer put in the request extensions) or `"{arg}"` (an argument of type `Quota`, `&Quota` or `Option<Quota>`); replaces `num`/`time`/`burst` | none |
/// | `count` | which outcomes count: `"err"` or `"ok"` (plain functions and gRPC methods: the result; `"errors"` is `"err"` on a gRPC method); `"errors"` (4xx and 5xx), `"4xx"`, `"5xx"`, `"4xx,5xx"` (handlers: the status) | every call |
/// | `shadow` | `true`: shadow mode — checked and counted as usual, a rejection is only logged and counted (`shadow_rejected`), never enforced; the function runs, and a handler's responses carry no rate-limit headers | `false` |
/// | `export` | `"NAME"`: a `const NAME: &'static [Limit]` beside the function holding the limits it checks, for the admin calls (see [Exported limits](#exported-limits)) | none |
/// | `on_store_error` | what a call gets when the store fails or does not answer within the limiter's timeout: `"deny"` (refused: 503 for handlers, `UNAVAILABLE` for gRPC, `RateLimitError::StoreUnavailable` for plain functions), `"local"` (this process's memory store checks the call) or `"allow"` (admitted). Stacked limits are checked in one store call, so the strictest policy among them answers it (deny, then local, then allow) | the limiter's `FailurePolicy` |
/// | `wait` | plain functions only: the longest a limited call waits for a slot before it fails, as `time` is written (`wait = 5`, `"500ms"`, `"5s"`, `"1m"`; positive, at most `"1h"`). A limited call sleeps its `retry_after` (plus a little jitter) and is checked again, first come first served among the calls of the process waiting for the same keys; once the next slot comes after the budget, it fails with `RateLimitError::Limited` as it would have at once. A store failure is never retried (`on_store_error` answers it); dropping the call's future while it waits takes nothing. One `wait` per function (it bounds every stacked limit) | none: a limited call fails at once |
/// | `lease` | a hot key's units taken a lease at a time: the lease's longest life, as `time` is written, from `"1ms"` to `"1s"` (`lease = "100ms"`). A process that sees the key called often takes up to `lease_max` units in one store call (never more than the store has left, so never over the quota) and serves the next calls from them in memory, giving back what it did not use when the lease ends; at one unit a call is the ordinary check, so a quiet key is decided as without `lease`. Fixed, sliding counter, token, leaky and gcra (the sliding log stamps each call, a concurrency limit counts calls in flight: refused); a function's one limit, not beside `count`, `settle` or `shadow`. Units unused in one process's lease are unavailable to the others for at most its life (`ratelimit_runtime::lease`) | none: every call checks the store |
/// | `lease_max` | with `lease`: the most units one lease takes (also at most a tenth of the capacity) | `1000` |
/// | `settle` | the call's `cost` is an estimate, settled after the body to what the call used: the difference given back when it used less, the excess charged when it used more, up to one full capacity (a debt the next calls wait out; per algorithm in `ratelimit_runtime::algorithm::settle`). Either a closure over the function's output, `settle = |reply| reply.usage.total_tokens` (its argument's type is the output's; a handler's output must be a named type, not `impl IntoResponse`), a function path, or `"later"`: the body takes `ratelimit_runtime::settle::Reservation::take()` and settles it when it knows, after the function returned if need be (a streaming body). Needs `cost = …` (the estimate); one per function; plain functions, handlers (not beside `count` yet) and gRPC methods; not on plain `#[async_trait]` methods. A failed or late settle (the receipt lives at most 10 s) gives nothing back: the estimate stays counted | none: the cost is final |
///
/// `num`, `time`, `burst` and `cost` also take a `const` item (`num = LOGIN_ATTEMPTS`: a
/// `u64`; `time = WINDOW`: a `std::time::Duration`), checked at compile time by the same rules
/// as literals, and `cost` an expression over the arguments (`cost = items.len()`), evaluated
/// per call and checked against the capacity then (a call that can never fit is refused with
/// `RateLimitError::CostExceedsCapacity`, 400 for handlers). The expression's `+ - * /`
/// (through parentheses) run in checked 128-bit arithmetic over integer operands of any
/// primitive type, so a client's huge argument never wraps a cost to a small one nor panics:
/// `cost = req.n * 1000` with `n = 2^60` is refused as too large, a negative result with
/// `RateLimitError::NegativeCost` (400), a division by zero as too large. Arithmetic on types
/// of your own goes inside a block, `cost = { a.total(b) }`, which is evaluated as written.
///
/// A caller's bucket is the scope, the rendered `key` and the `by` value together.
///
/// # Modes
///
/// * **Plain** (`by = "global"`, no `framework`): free functions, methods (`&self`,
///   `&mut self`, `self`), generic functions, `async fn` in trait impls, and the methods of
///   `#[async_trait]` impls and traits (recognised in the boxed future async-trait makes of
///   them; the check runs inside it). The function must return `Result<T, E>` with
///   `E: From<RateLimitError>`; a rejected call returns `Err(E::from(error))` without running
///   the body. The signature is unchanged.
/// * **HTTP handler** (an HTTP `by`, or `framework`): a hidden extractor parameter is added in
///   front of the handler's own, and the return type becomes a wrapper that answers 429 (with
///   the rate-limit headers) when the call is rejected. Needs the `axum` or `actix` feature of
///   `ratelimit-runtime`; handlers cannot take `self`.
///
/// * **gRPC method** (an HTTP-like `by` on a method of an `#[async_trait]` impl, such as a
///   tonic service's, that takes a `request: Request<T>`): the caller is read from that
///   request (peer address, metadata, extensions) before the body runs, and a refused call
///   returns `Err(E::from(tonic::Status))` (`RESOURCE_EXHAUSTED` with the retry metadata,
///   `UNAVAILABLE`, `PERMISSION_DENIED` for a denied network, `INVALID_ARGUMENT` naming a
///   missing metadata entry or refusing a cost, `UNAUTHENTICATED` without a user or quota); an
///   admitted call's `Ok` response carries the rate-limit metadata. `quota`, `cost =
///   <expression>` (over the request) and `count` work there. Needs the `tonic` feature of
///   `ratelimit-runtime`; `by = "url"` is not available there. The signature is unchanged.
///
/// # Limits that follow the caller
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::{rate_limit, Quota, RateLimitError};
///
/// const ATTEMPTS: u64 = 5;
/// const WINDOW: Duration = Duration::from_secs(15 * 60);
///
/// # #[derive(Debug)] enum LoginError { Wrong, Limited(RateLimitError) }
/// # impl From<RateLimitError> for LoginError { fn from(e: RateLimitError) -> Self { Self::Limited(e) } }
/// // Five failed attempts per user per 15 minutes; successes give their unit back.
/// #[rate_limit(num = ATTEMPTS, time = WINDOW, key = "{user}", count = "err")]
/// async fn login(user: &str, password: &str) -> Result<(), LoginError> {
///     if password == "open sesame" { Ok(()) } else { Err(LoginError::Wrong) }
/// }
///
/// // The caller's plan decides the quota; the batch's size, the cost.
/// #[rate_limit(algo = "token", quota = "{plan}", key = "{user}", cost = items.len())]
/// async fn upload(user: &str, plan: &Quota, items: &[u8]) -> Result<(), RateLimitError> {
///     Ok(())
/// }
/// ```
///
/// * A call with `count` takes its units before the body runs (calls in flight hold them, so
///   concurrent calls never pass the quota) and gives them back after an outcome that does
///   not count, by the store's receipt; when the refund cannot be made, the call stays
///   counted (it fails closed).
/// * A quota's numbers are part of the store key: a caller whose plan changes starts a fresh
///   window under the new quota, and finds the old window as it was if the plan changes back.
/// * `RateLimiter::set_quota` (in `ratelimit_runtime`) overrides a scope's quota at run time.
///
/// # Stacking
///
/// Several `#[rate_limit]` on one function all apply, checked in one call (one Redis round
/// trip): the call runs only if every limit admits it, and a rejected call takes nothing from
/// any limit.
///
/// # Exported limits
///
/// `export = "NAME"` emits, beside the function and with its visibility (and its `#[cfg]`s),
/// `const NAME: &'static [ratelimit_runtime::Limit]`: the very limits the function checks
/// (written once by the macro for both), with their scope (the default one included), policy
/// (`algo`, `num`, `time`, `burst`, `cost`), `by` and `shadow`. The admin calls
/// (`RateLimiter::peek`, `reset`, `block`) then name the function, not its numbers, and cannot
/// address another key by a forgotten `burst`:
///
/// ```
/// use ratelimit_runtime::{rate_limit, RateLimitError, RateLimiter, Target};
///
/// #[rate_limit(algo = "gcra", num = 3, time = 10, burst = 5, key = "{user}", export = "LOGIN")]
/// async fn login(user: &str) -> Result<(), RateLimitError> {
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = RateLimiter::builder().build().await?;
/// limiter.clone().scope(async { login("alice").await }).await?;
/// let alice = Target::global().key("alice");
/// assert_eq!(limiter.peek(LOGIN, &alice).await?.decisions()[0].remaining, 4);
/// limiter.reset(LOGIN, &alice).await?;
/// # Ok(()) }
/// ```
///
/// * On a method of an inherent impl it is an associated const: `Self::NAME` inside the impl,
///   `Type::NAME` outside. In a trait impl there is no room for it (rustc: "not a member of
///   trait", at the name), and on `#[async_trait]` methods `export` is refused.
/// * Stacked attributes: one `export`, on any one of them, names every limit of the function
///   in the order the attributes are written (`&NAME[1..]` for some of them); a second one is
///   an error.
/// * `cost = <expression>`: the exported limit holds cost 1 (the per-call cost is no part of
///   the key), so `peek` reads the units taken and `admitted` says whether one unit fits.
///   `count` changes nothing exported. `quota` is refused: its numbers, part of the key, come
///   per caller.
/// * Under Actix-web's routing macros (`#[get]` above `#[rate_limit]`) the handler and the
///   const are moved inside the service those macros generate, out of reach: register such a
///   handler with `web::resource(...).route(...)` instead to export its limits.
///
/// # When the store fails
///
/// A limit is exact while the store answers within the limiter's timeout (50 ms by default);
/// past it, or when the store is down, the failure policy answers instead. A limit that must
/// hold fails closed whatever the limiter's default:
///
/// ```
/// use ratelimit_runtime::{rate_limit, RateLimitError};
///
/// // Refused while the store fails (`RateLimitError::StoreUnavailable`).
/// #[rate_limit(num = 3, time = 60, key = "{user}", on_store_error = "deny")]
/// async fn login(user: &str) -> Result<(), RateLimitError> {
///     Ok(())
/// }
///
/// // Checked in this process while the store fails (under the default `local`).
/// #[rate_limit(num = 100, time = 60, key = "{user}")]
/// async fn search(user: &str) -> Result<(), RateLimitError> {
///     Ok(())
/// }
/// ```
///
/// A limit in shadow mode never refuses a call: its `on_store_error` applies once it is
/// enforced.
///
/// # Attribute order
///
/// Attributes expand from the top down, each seeing the function the ones above it left.
///
/// * Actix-web's routing macros (`#[get("/")]`, `#[post(...)]`…) go above `#[rate_limit]`.
/// * `#[axum::debug_handler]` goes below `#[rate_limit]`, so that it checks the handler with
///   its hidden parameter; above it, its own check calls the handler with one argument too few
///   and the build fails at `#[axum::debug_handler]` ("argument #1 of type `HttpCaller` is
///   missing").
/// * `#[tracing::instrument]` works in either order; above `#[rate_limit]` it records the
///   function's own parameters (below, on a handler, it would record the hidden ones).
/// * `#[async_trait]` goes on the `impl` (and the trait), `#[rate_limit]` on the method inside.
///
/// # Mistakes
///
/// Every mistake is a compile error at the offending token, saying what is accepted, and the
/// function is still emitted as written so the rest of the crate keeps compiling.
///
/// Methods of different types with the same name in one module share the default scope: give
/// them a `scope` when that is not what you want.
#[proc_macro_attribute]
pub fn rate_limit(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::rate_limit(args.into(), item.into()).into()
}
