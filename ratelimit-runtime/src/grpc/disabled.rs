//! Stand-ins without the `tonic` feature: the same names, never constructed, so that
//! gRPC-mode code fails with the one clear error of `RequireTonic`.

use std::convert::Infallible;

use crate::call::plan::{Dynamic, Input};
use crate::limit::Limit;

/// Stand-in: enable the `tonic` feature of ratelimit-runtime.
#[derive(Debug)]
pub struct GrpcCall {
    never: Infallible,
}

/// Stand-in: enable the `tonic` feature of ratelimit-runtime.
#[derive(Debug)]
pub struct Admission {
    never: Infallible,
}

impl Admission {
    /// Stand-in.
    #[allow(clippy::unused_async)]
    pub async fn finish<R>(self, reply: R) -> R {
        let _ = reply;
        match self.never {}
    }
}

/// Stand-in: enable the `tonic` feature of ratelimit-runtime.
pub fn prepare<R: ?Sized>(
    limits: &'static [Limit],
    dynamics: Option<&'static [Dynamic]>,
    request: &R,
    templates: &[Option<&str>],
    inputs: &[Input],
) -> GrpcCall {
    let _ = (limits, dynamics, request, templates, inputs);
    unreachable!("RequireTonic fails the build first")
}

/// Stand-in: enable the `tonic` feature of ratelimit-runtime.
#[allow(clippy::unused_async)]
pub async fn check(call: GrpcCall) -> Result<Admission, Infallible> {
    match call.never {}
}

/// Stand-in: enable the `tonic` feature of ratelimit-runtime.
pub fn into_error<E>(never: Infallible) -> E {
    match never {}
}
