//! Stand-ins without the `tonic` feature: the same names, never constructed, so that
//! gRPC-mode code fails with the one clear error of `RequireTonic`.

use std::convert::Infallible;

use crate::limit::Limit;

/// Stand-in: enable the `tonic` feature of ratelimit-runtime.
#[derive(Debug)]
pub struct GrpcCall {
    never: Infallible,
}

/// Stand-in: enable the `tonic` feature of ratelimit-runtime.
pub fn prepare<R: ?Sized>(
    limits: &'static [Limit],
    request: &R,
    templates: &[Option<&str>],
) -> Result<GrpcCall, Infallible> {
    let _ = (limits, request, templates);
    unreachable!("RequireTonic fails the build first")
}

/// Stand-in: enable the `tonic` feature of ratelimit-runtime.
#[allow(clippy::unused_async)]
pub async fn check(
    limits: &'static [Limit],
    call: Result<GrpcCall, Infallible>,
) -> Result<(), Infallible> {
    let _ = limits;
    match call {
        Ok(call) => match call.never {},
    }
}

/// Stand-in: enable the `tonic` feature of ratelimit-runtime.
pub fn into_error<E>(never: Infallible) -> E {
    match never {}
}
