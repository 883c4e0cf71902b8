//! The gRPC integration (feature `tonic`, tonic 0.14): `#[rate_limit]` on the methods of a
//! tonic service, and [`RateLimitError`](crate::RateLimitError) into `tonic::Status`.
//!
//! A method of a `#[tonic::async_trait]` impl that takes a `tonic::Request<T>` and has an
//! HTTP-like `by` is a **gRPC method**: the check reads the request (before the body runs) and a
//! refused call returns `Err(Status)` (converted with `From`, so `Result<Response<T>, Status>`
//! works as tonic writes it):
//!
//! ```
//! # #[cfg(feature = "tonic")] mod demo {
//! use ratelimit_runtime::rate_limit;
//! use tonic::{Request, Response, Status};
//!
//! #[tonic::async_trait]
//! pub trait Greeter: Send + Sync + 'static {
//!     async fn say_hello(&self, request: Request<String>) -> Result<Response<String>, Status>;
//! }
//!
//! pub struct MyGreeter;
//!
//! #[tonic::async_trait]
//! impl Greeter for MyGreeter {
//!     #[rate_limit(algo = "sliding", num = 3, time = 10, by = "ip")]
//!     async fn say_hello(&self, request: Request<String>) -> Result<Response<String>, Status> {
//!         Ok(Response::new(format!("hello {}", request.into_inner())))
//!     }
//! }
//! # }
//! ```
//!
//! A gRPC method goes through the same call pipeline as a handler: what follows works there as
//! on Axum and Actix-web (the guide's integrations chapter has an example).
//!
//! # Sources (`by`)
//!
//! * `ip` — the peer address of the connection (`Request::remote_addr`, set by tonic's
//!   transport server), with trusted proxies honoured exactly as for HTTP: a forwarding header
//!   in the request metadata (`x-forwarded-for` by default) is read only when the peer is one of
//!   [`crate::limiter::Builder::trusted_proxies`] ([`crate::http::client_ip`] has the rules). Without a
//!   peer address (a custom transport that records none, a method called directly): `INTERNAL`,
//!   saying so (logged once), never an admission.
//! * `header:<name>` — the metadata entry `<name>`; missing or blank: `INVALID_ARGUMENT`
//!   naming it.
//! * `app_id` — the metadata entry `appid`; missing or blank: `INVALID_ARGUMENT`.
//! * `user` — the [`crate::UserId`] an interceptor put in the request extensions; missing:
//!   `UNAUTHENTICATED`.
//! * `url` is not available (a `tonic::Request` carries no path; every call of a method has
//!   the same one): the macro says so. `global` and `key` templates work as everywhere.
//!
//! # Limits that follow the caller
//!
//! * `quota = "request"` — the [`crate::Quota`] an interceptor (or a tower layer) put in the
//!   request extensions, per caller; none: `UNAUTHENTICATED`.
//! * `cost = <expression>` over the request, e.g. `cost = request.get_ref().items.len()`,
//!   evaluated before the body; beyond the capacity (or negative): `INVALID_ARGUMENT`.
//! * `count = "errors"` (or `"err"`: every `Err` the method returns) or `count = "ok"`: a call
//!   takes its units before the body, and gives them back when its result does not count.
//! * The limiter's run-time overrides ([`crate::RateLimiter::set_quota`]), exemptions
//!   ([`crate::limiter::Builder::exempt_networks`], [`crate::limiter::Builder::exempt_when`]: the predicate sees
//!   the metadata as headers, the extensions' `UserId`, and the method's path,
//!   `/package.Service/Method`, when the request carries it, else an empty one) and deny list
//!   ([`crate::limiter::Builder::deny_networks`]) apply as to handlers.
//!
//! # Answers
//!
//! An admitted call's `Ok` response carries the rate-limit metadata as an HTTP response carries
//! the fields: `ratelimit-policy` and `ratelimit` (or the legacy `x-ratelimit-limit`,
//! `x-ratelimit-remaining`, `x-ratelimit-reset`, or both, per [`crate::http::HeaderStyle`]); none for
//! a method with a limit in shadow mode, an exempt caller or an unlimited quota. A client's own
//! entries of those names in its request change nothing.
//!
//! A refused call returns `Err(Status)` without running the body. The codes are the HTTP
//! integrations' answers, in one table:
//!
//! | refusal | HTTP | gRPC |
//! | --- | --- | --- |
//! | quota spent | 429 | `RESOURCE_EXHAUSTED` (8) |
//! | store failed under [`crate::FailurePolicy::Deny`] | 503 | `UNAVAILABLE` (14) |
//! | the client's network denied | 403 | `PERMISSION_DENIED` (7) |
//! | a header missing or blank, a cost refused | 400 | `INVALID_ARGUMENT` (3) |
//! | no user, no quota | 401 | `UNAUTHENTICATED` (16) |
//! | no peer address, an invalid quota | 500 | `INTERNAL` (13) |
//!
//! A spent quota's status has the limiter's message ([`crate::limiter::Builder::message`]), the metadata
//! `retry-after` (whole seconds, rounded up), `ratelimit-policy` and `ratelimit` (or the legacy
//! ones) exactly as the HTTP integrations write them, and the standard `google.rpc.RetryInfo`
//! detail (`grpc-status-details-bin`) with the exact delay.
//!
//! # Which limiter
//!
//! A [`crate::RateLimiter`] in the request extensions (put there by an interceptor), else
//! [`crate::RateLimiter::current`].
//!
//! # Plain methods
//!
//! `Status: From<RateLimitError>`, so a plain-mode `#[rate_limit]` (`by = "global"`, a `key`
//! template) works on a tonic method too: `RESOURCE_EXHAUSTED` with `retry-after`, the legacy
//! `x-ratelimit-limit` / `x-ratelimit-remaining` / `x-ratelimit-reset` of the binding limit
//! and the `RetryInfo` detail, or `UNAVAILABLE`.

// The methods' plumbing (`prepare`, `check`, `Admission`…): `__private::grpc` re-exports it.
#[cfg(feature = "tonic")]
pub(crate) mod check;
#[cfg(feature = "tonic")]
mod details;

#[cfg(not(feature = "tonic"))]
pub(crate) mod disabled;
// The macro's compile-time check of the `tonic` feature: `__private::grpc` re-exports it.
pub(crate) mod require;
