//! Stand-ins when no HTTP integration is enabled: the same names and signatures, never
//! constructed, so that HTTP-mode code fails with the one clear error of `RequireHttp`.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;

use crate::caller::answer::PolicyField;
use crate::limit::Limit;

/// Stand-in: enable the `axum` or `actix` feature of ratelimit-runtime.
pub struct HttpCaller<const HEADERS: bool = true> {
    never: Infallible,
}

impl<const H: bool> fmt::Debug for HttpCaller<H> {
    fn fmt(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.never {}
    }
}

/// Stand-in: enable the `axum` or `actix` feature of ratelimit-runtime.
pub struct Limited<T> {
    never: Infallible,
    output: PhantomData<T>,
}

impl<T> fmt::Debug for Limited<T> {
    fn fmt(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        let _ = &self.output;
        match self.never {}
    }
}

/// Stand-in: enable the `axum` or `actix` feature of ratelimit-runtime.
#[allow(clippy::needless_pass_by_value)] // never called: `HttpCaller` has no value
pub fn check_http<F, Fut, const H: bool>(
    limits: &'static [Limit],
    policy: &'static PolicyField,
    caller: HttpCaller<H>,
    templates: &[Option<&str>],
    handler: F,
) -> impl Future<Output = Limited<Fut::Output>> + use<F, Fut, H>
where
    F: FnOnce() -> Fut,
    Fut: Future,
{
    let _ = (limits, policy, templates, handler);
    async move { match caller.never {} }
}

/// Stand-in: enable the `axum` or `actix` feature of ratelimit-runtime.
#[allow(clippy::unused_async)]
pub async fn check_http_dyn<F, Fut>(
    limits: &'static [Limit],
    dynamics: Option<&'static [crate::call::plan::Dynamic]>,
    caller: HttpCaller,
    templates: &[Option<&str>],
    inputs: &[crate::call::plan::Input],
    handler: F,
) -> Limited<Fut::Output>
where
    F: FnOnce() -> Fut,
    Fut: Future,
{
    let _ = (limits, dynamics, templates, inputs, handler);
    match caller.never {}
}

/// Stand-in: enable the `axum` or `actix` feature of ratelimit-runtime.
#[allow(clippy::unused_async, clippy::too_many_arguments)]
pub async fn check_http_settle<F, Fut, T>(
    limits: &'static [Limit],
    dynamics: Option<&'static [crate::call::plan::Dynamic]>,
    caller: HttpCaller,
    templates: &[Option<&str>],
    inputs: &[crate::call::plan::Input],
    later: bool,
    handler: F,
) -> Limited<T>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = (T, Option<crate::cost::Units>)>,
{
    let _ = (limits, dynamics, templates, inputs, later, handler);
    match caller.never {}
}

/// Stand-ins of the `count = …` handlers' items.
pub mod counted {
    pub use super::{HttpCaller as Caller, check_http_dyn as check_http_counted};
    /// Stand-in.
    pub type Response = ();
}
