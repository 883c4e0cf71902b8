//! The service a [`RateLimitLayer`](crate::RateLimitLayer) wraps around another: each request checked, then the inner
//! service called or answered for.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use http::header::CONTENT_TYPE;
use http::{HeaderValue, Request, Response};
use tower_service::Service;

use crate::http::UserId;
use crate::http::response::{Refusal, rate_fields};
use crate::http::source::{Missing, RequestParts};
use crate::limit::keys_for;
use crate::limiter::{RateLimiter, Settings};

use super::answer::{add_admitted_fields, answer};
use super::builder::{IGNORED_EXEMPTIONS_LOGGED, warn_ignored_exemptions};
use super::grpc;
use super::{LayerBody, Shared};

/// The future of a [`RateLimitService`] call.
pub type ResponseFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<LayerBody<B>>, E>> + Send + 'static>>;

/// The service of a [`RateLimitLayer`](crate::RateLimitLayer): checks each request, then calls the inner service or
/// answers in its place.
///
/// ```
/// use std::convert::Infallible;
/// use std::task::{Context, Poll};
/// use std::time::Duration;
/// use ratelimit_runtime::{RateLimitLayer, RateLimiter};
/// use tower_layer::Layer as _;
/// use tower_service::Service;
///
/// #[derive(Clone)]
/// struct Hello;
///
/// impl Service<http::Request<String>> for Hello {
///     type Response = http::Response<String>;
///     type Error = Infallible;
///     type Future = std::future::Ready<Result<Self::Response, Infallible>>;
///
///     fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
///         Poll::Ready(Ok(()))
///     }
///
///     fn call(&mut self, _: http::Request<String>) -> Self::Future {
///         std::future::ready(Ok(http::Response::new("hi".to_owned())))
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = RateLimitLayer::builder()
///     .num(1)
///     .period(Duration::from_secs(60))
///     .limiter(RateLimiter::builder().build().await?)
///     .build()?;
/// let mut service = layer.layer(Hello);
/// let ok = service.call(http::Request::new(String::new())).await?;
/// assert_eq!(ok.status(), 200);
/// assert!(ok.headers()["ratelimit"].to_str()?.starts_with("\"layer\";r=0;t="));
/// let limited = service.call(http::Request::new(String::new())).await?;
/// assert_eq!(limited.status(), 429);
/// assert!(limited.headers().contains_key("retry-after"));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RateLimitService<S> {
    pub(super) inner: S,
    pub(super) shared: Arc<Shared>,
}

impl<S: fmt::Debug> fmt::Debug for RateLimitService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitService")
            .field("inner", &self.inner)
            .field("limits", &self.shared.limits)
            .finish_non_exhaustive()
    }
}

impl<S> RateLimitService<S> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The wrapped service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for RateLimitService<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: 'static,
    ReqB: Send + 'static,
    ResB: Send + 'static,
{
    type Response = Response<LayerBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        // The service that was polled ready is the one to call; the clone waits for the next
        // `poll_ready`.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(Arc::clone(&self.shared).run(inner, request))
    }
}

pub(super) static MISSING_PEER_LOGGED: AtomicBool = AtomicBool::new(false);

pub(super) const MISSING_PEER: &str = "rate limiting by IP needs the client address, which this request does not carry: \
     serve an Axum router with `into_make_service_with_connect_info::<SocketAddr>()`, a tonic server with \
     `Server::serve` or `serve_with_incoming` (ratelimit-runtime's `tonic` feature), or give the layer a `peer_addr` hook";

pub(super) const STORE_DOWN: &str = "The rate-limit store is unavailable; please try again later.";

impl Shared {
    async fn run<S, ReqB, ResB>(
        self: Arc<Self>,
        mut inner: S,
        request: Request<ReqB>,
    ) -> Result<Response<LayerBody<ResB>>, S::Error>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>>,
    {
        // For gRPC, the request's content type (reference-counted), answered back: a
        // gRPC-Web client expects its own.
        let grpc = grpc::is_grpc(request.method(), request.headers())
            .then(|| request.headers().get(CONTENT_TYPE).cloned())
            .flatten();
        let limiter = match &self.limiter {
            Some(l) => l.clone(),
            None => match request.extensions().get::<RateLimiter>() {
                Some(l) => l.clone(),
                None => RateLimiter::current(),
            },
        };
        let settings = limiter.settings();
        // A limiter found at call time (extensions, `current`) is warned about as one given.
        if self.limiter.is_none() {
            warn_ignored_exemptions(&IGNORED_EXEMPTIONS_LOGGED, &settings.exemptions);
        }
        let keys = match self.keys(&request, settings) {
            Ok(keys) => keys,
            Err(missing) => return Ok(Self::missing(missing, grpc.as_ref())),
        };
        // Shadow mode and the metrics apply as for handlers (`RateLimiter::decide`); with a
        // limit in shadow mode, responses carry no rate-limit headers.
        let verdict = limiter.decide(&self.limits, &keys).await;
        match verdict {
            Ok(v) if v.is_admitted() && limiter.any_shadow(&self.limits) => {
                let response = inner.call(request).await?;
                Ok(response.map(LayerBody::new))
            }
            Ok(v) if v.is_admitted() => {
                let fields = rate_fields(&self.limits, &v, settings.http.header_style);
                let mut response = inner.call(request).await?;
                add_admitted_fields(response.headers_mut(), fields, &self.limits);
                Ok(response.map(LayerBody::new))
            }
            Ok(v) => Ok(answer(
                Refusal::too_many_requests(&self.limits, &v, &settings.http),
                grpc.as_ref(),
                &settings.http.message,
            )),
            Err(_) => Ok(answer(
                Refusal::store_unavailable(),
                grpc.as_ref(),
                STORE_DOWN,
            )),
        }
    }

    /// The store keys of the limits for `request`.
    fn keys<B>(&self, request: &Request<B>, settings: &Settings) -> Result<Vec<String>, Missing> {
        let extensions = request.extensions();
        let parts = RequestParts {
            peer: if self.needs_peer {
                self.peer(extensions)
            } else {
                None
            },
            path: path_of(request),
            headers: request.headers(),
            user: extensions.get::<UserId>(),
        };
        keys_for(&settings.prefix, &self.limits, &[], |by| {
            parts.by_value(by, &settings.http)
        })
    }

    /// The peer address the server recorded in the request extensions.
    fn peer(&self, extensions: &http::Extensions) -> Option<IpAddr> {
        if let Some(ip) = self.peer_addr.and_then(|hook| hook(extensions)) {
            return Some(ip);
        }
        #[cfg(feature = "axum")]
        if let Some(axum::extract::ConnectInfo(addr)) =
            extensions.get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        {
            return Some(addr.ip());
        }
        #[cfg(feature = "tonic")]
        if let Some(addr) = extensions
            .get::<tonic::transport::server::TcpConnectInfo>()
            .and_then(tonic::transport::server::TcpConnectInfo::remote_addr)
        {
            return Some(addr.ip());
        }
        None
    }

    /// The answer to a request that lacks what a limit is `by`.
    fn missing<B>(missing: Missing, grpc: Option<&HeaderValue>) -> Response<LayerBody<B>> {
        let refusal = missing.refusal(|| {
            if !MISSING_PEER_LOGGED.swap(true, Ordering::Relaxed) {
                tracing::error!(target: crate::observe::log::CALLER, "{MISSING_PEER}");
            }
            Refusal::new(500, "internal_error", MISSING_PEER)
        });
        let message = missing.message().unwrap_or(Cow::Borrowed(MISSING_PEER));
        answer(refusal, grpc, &message)
    }
}

/// The path the client sent, as `by = "url"` keys it: with the `axum` feature, the one Axum's
/// router recorded (`OriginalUri`) before `Router::nest` stripped its prefix (a layer on a
/// nested router sees the stripped one in `uri()`), else the request's.
pub(super) fn path_of<B>(request: &Request<B>) -> &str {
    #[cfg(feature = "axum")]
    if let Some(axum::extract::OriginalUri(uri)) = request.extensions().get() {
        return uri.path();
    }
    request.uri().path()
}
