//! A compile-time check the macro evaluates, spanned at the `by` that needs the feature, so that
//! a missing feature is one clear error. Reachable through `__private` only.

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
