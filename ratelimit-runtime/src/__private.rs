//! The contract between `#[rate_limit]`'s generated code and the runtime. Not a public API:
//! anything here may change in any release.
//!
//! For each function, the macro emits one `static` array of [`Limit`]s (one per attribute, in
//! the order written) and, before the body, one call:
//!
//! * plain mode: `check(&LIMITS, &[key0, key1, …]).await` → `Result<(), RateLimitError>`
//!   (with `wait = "…"`: `check_wait(&LIMITS, &[…], Duration::from_millis(ms)).await`; a
//!   dynamic limit: `check_dyn(&LIMITS, dynamics, &[…], &inputs, wait).await` → a `Hold`);
//! * HTTP mode: a hidden first parameter of type `HttpCaller`, the user's function moved into
//!   an inner `async fn`, and `check_http(&LIMITS, &POLICY, caller, &[keys…], || inner(args…))
//!   .await`, whose `Limited<T>` return type is both an Axum `IntoResponse` and an Actix
//!   `Responder`; `POLICY` is one more `static` of the function, a `PolicyField::new()` (its
//!   `RateLimit-Policy` value, formatted on first use).
//!
//! `keys[i]` is the rendered `key` template of limit `i` (`None` when it has none): a fixed
//! key is a string literal, a template is rendered once per call by [`render`].
//!
//! A leaf: it only re-exports, and nothing in the crate imports from it. The items live where
//! they belong (`call`, the pipeline; `limit`, `http`, `grpc`, `policy`).

pub use crate::algorithm::Algorithm;
pub use crate::call::settle::measure;
pub use crate::call::{Hold, check, check_dyn, check_wait};
pub use crate::caller::answer::PolicyField;
#[cfg(any(feature = "axum", feature = "actix"))]
pub use crate::http::adapter::{
    HttpCaller, Limited, check_http, check_http_dyn, check_http_settle,
};
#[cfg(not(any(feature = "axum", feature = "actix")))]
pub use crate::http::disabled::{
    HttpCaller, Limited, check_http, check_http_dyn, check_http_settle,
};
pub use crate::http::require::{RequireActix, RequireAxum, RequireHttp, RequireOneFramework};
pub use crate::lease::Lease;
pub use crate::limit::FailurePolicy;
pub use crate::limit::{By, Limit, Piece, period_ms, policy, render};
pub use crate::policy::Policy;

/// The items of `count = …` handlers, per framework (`#[rate_limit]` picks the module).
pub mod counted {
    /// Axum.
    #[cfg(feature = "axum")]
    pub mod axum {
        pub use crate::http::adapter::HttpCaller as Caller;
        pub use crate::http::axum::check_http_counted;
        /// What a counted handler answers.
        pub type Response = ::axum::response::Response;
    }
    /// Actix-web.
    #[cfg(feature = "actix")]
    pub mod actix {
        pub use crate::http::actix::{CountingCaller as Caller, check_http_counted};
        /// What a counted handler answers.
        pub type Response = ::actix_web::HttpResponse;
    }
    #[cfg(all(feature = "actix", not(feature = "axum")))]
    pub use self::actix as default;
    /// The one framework enabled (with both, the attribute names one: `RequireOneFramework`).
    #[cfg(feature = "axum")]
    pub use self::axum as default;
    #[cfg(not(any(feature = "axum", feature = "actix")))]
    pub use crate::http::disabled::counted as default;
}

/// gRPC mode (a method of an `#[async_trait]` impl taking a `tonic::Request<T>`, with an
/// HTTP-like `by`): `RequireTonic::<()>::OK`, then
/// `let call = prepare(&LIMITS, dynamics, &request, &[keys…], &inputs);`,
/// `let admission = match check(call).await { Ok(a) => a, Err(s) => return Err(into_error(s)) };`
/// before the body, which runs in an inner `async` block, and `admission.finish(result).await`
/// after it (the `count` settlement and the admitted response's metadata).
pub mod grpc {
    #[cfg(feature = "tonic")]
    pub use crate::grpc::check::{Admission, GrpcCall, check, into_error, prepare};
    #[cfg(not(feature = "tonic"))]
    pub use crate::grpc::disabled::{Admission, GrpcCall, check, into_error, prepare};
    pub use crate::grpc::require::RequireTonic;
}

/// `cost = <expression>`: its arithmetic, checked (see `crate::cost`).
pub mod cost {
    pub use crate::cost::{Units, add, div, mul, sub};
}

// Limits that follow the caller (`quota`, `cost = <expression>`, `count`, overrides).
pub use crate::call::plan::{Count, Dynamic, Input, Outcome, QuotaFrom, cost_of, quota_of};
