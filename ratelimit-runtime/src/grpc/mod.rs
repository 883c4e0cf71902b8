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
//! # Sources (`by`)
//!
//! * `ip` — the peer address of the connection (`Request::remote_addr`, set by tonic's
//!   transport server), with trusted proxies honoured exactly as for HTTP: a forwarding header
//!   in the request metadata (`x-forwarded-for` by default) is read only when the peer is one of
//!   [`crate::Builder::trusted_proxies`] ([`crate::http::client_ip`] has the rules). Without a
//!   peer address (a custom transport that records none): `FAILED_PRECONDITION`, saying so.
//! * `header:<name>` — the metadata entry `<name>`; missing or blank: `INVALID_ARGUMENT`
//!   naming it.
//! * `app_id` — the metadata entry `appid`; missing or blank: `INVALID_ARGUMENT`.
//! * `user` — the [`crate::UserId`] an interceptor put in the request extensions; missing:
//!   `UNAUTHENTICATED`.
//! * `url` is not available (a `tonic::Request` carries no path; every call of a method has
//!   the same one): the macro says so. `global` and `key` templates work as everywhere.
//!
//! # Refusals
//!
//! * quota spent: `RESOURCE_EXHAUSTED` with the limiter's message
//!   ([`crate::Builder::message`]), the metadata `retry-after` (whole seconds, rounded up),
//!   `ratelimit-policy` and `ratelimit` (or the legacy `x-ratelimit-*`, per
//!   [`crate::HeaderStyle`]) exactly as the HTTP integrations write them, and the standard
//!   `google.rpc.RetryInfo` detail (`grpc-status-details-bin`) with the exact delay;
//! * store failed under [`crate::FailurePolicy::Deny`]: `UNAVAILABLE`.
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

#[cfg(feature = "tonic")]
mod check;
#[cfg(feature = "tonic")]
mod details;
#[cfg(feature = "tonic")]
pub use check::{Admission, GrpcCall, GrpcReply, check, into_error, prepare};

#[cfg(not(feature = "tonic"))]
mod disabled;
#[cfg(not(feature = "tonic"))]
pub use disabled::{Admission, GrpcCall, check, into_error, prepare};

/// `RequireTonic::<()>::OK` compiles only with the `tonic` feature: the macro evaluates it,
/// spanned at the `by` that made a method a gRPC method, so that a missing feature is one
/// clear error.
#[doc(hidden)]
#[derive(Debug)]
pub struct RequireTonic<T>(T);

impl<T> RequireTonic<T> {
    /// `()`, or a compile error naming the feature to enable.
    pub const OK: () = assert!(
        cfg!(feature = "tonic"),
        "this `by` on a gRPC method (a `tonic::Request<T>` parameter inside #[async_trait]) needs the `tonic` feature of ratelimit-runtime"
    );
}
