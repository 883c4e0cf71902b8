//! The service a [`RateLimitLayer`](crate::RateLimitLayer) wraps around another: each request checked, then the inner
//! service called or answered for.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::header::CONTENT_TYPE;
use http::{Request, Response};
use tower_service::Service;

use crate::call::plan::{Dynamic, Input, Outcome, cost_of};
use crate::call::{self, Admitted, Call};
use crate::caller::path::RouteForms;
use crate::caller::{Caller, Transport, UserId};
use crate::limit::Limit;
use crate::limiter::{Current, RateLimiter, Settings};
use crate::quota::Quota;

use super::answer::{add_admitted_fields, answer};
use super::grpc;
use super::{LayerBody, Routing, Shared};

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

/// The limits of a layer that apply to one request.
pub(super) enum Selected {
    /// Every limit (no allocation).
    All,
    /// None: the request passes through unlimited.
    None,
    /// These (their indices), fewer than all.
    Some(Vec<usize>),
}

impl Shared {
    /// Which limits apply to `request` (its method and every spelling of its path, read once).
    pub(super) fn select<B>(&self, request: &Request<B>) -> Selected {
        if self.routing == Routing::All {
            return Selected::All;
        }
        let forms = (self.routing == Routing::Paths).then(|| RouteForms::of(path_of(request)));
        let method = request.method();
        let mut chosen: Option<Vec<usize>> = None;
        for (i, rule) in self.rules.iter().enumerate() {
            let applies = rule.route.applies(method, forms.as_ref());
            match (&mut chosen, applies) {
                (None, true) | (Some(_), false) => {}
                // The first limit that does not apply: the ones before it do.
                (None, false) => chosen = Some((0..i).collect()),
                (Some(chosen), true) => chosen.push(i),
            }
        }
        match chosen {
            None => Selected::All,
            Some(chosen) if chosen.is_empty() => Selected::None,
            Some(chosen) => Selected::Some(chosen),
        }
    }

    async fn run<S, ReqB, ResB>(
        self: Arc<Self>,
        mut inner: S,
        request: Request<ReqB>,
    ) -> Result<Response<LayerBody<ResB>>, S::Error>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>>,
    {
        let selected = self.select(&request);
        let (limits, dynamics, indices): (Cow<'_, [Limit]>, Option<Cow<'_, [Dynamic]>>, _) =
            match &selected {
                Selected::None => {
                    return Ok(inner.call(request).await?.map(LayerBody::new));
                }
                Selected::All => (
                    Cow::Borrowed(&*self.limits),
                    self.dynamics.as_deref().map(Cow::Borrowed),
                    Indices::All(0..self.limits.len()),
                ),
                Selected::Some(chosen) => (
                    Cow::Owned(chosen.iter().map(|&i| self.limits[i]).collect()),
                    self.dynamics
                        .as_deref()
                        .map(|d| Cow::Owned(chosen.iter().map(|&i| d[i]).collect())),
                    Indices::Some(chosen.iter()),
                ),
            };
        // What each limit's cost is for this request (read before the body is handed on).
        let (request, inputs) = if self.inputs {
            let (parts, body) = request.into_parts();
            let inputs = self.inputs_of(&parts, indices);
            (Request::from_parts(parts, body), inputs)
        } else {
            (request, Vec::new())
        };
        // For gRPC, the request's content type (reference-counted), answered back: a
        // gRPC-Web client expects its own.
        let grpc = grpc::is_grpc(request.method(), request.headers())
            .then(|| request.headers().get(CONTENT_TYPE).cloned())
            .flatten();
        let limiter = self.limiter_for(&request);
        let settings = limiter.settings();
        // Steps 1–3 of the pipeline read the request; its borrow ends with them.
        let call = Call {
            limits: &limits,
            dynamics: dynamics.as_deref(),
            inputs: &inputs,
            templates: &[],
        };
        let prepared = call::prepare(
            &limiter,
            call,
            &self.caller(&request, settings, grpc.is_some()),
        );
        let admitted = match prepared {
            Ok(prepared) => prepared.run_soon(&limiter).await,
            Err(refused) => Err(refused),
        };
        match admitted {
            Ok(admitted) => {
                let fields = admitted
                    .fields(settings.http.header_style, None)
                    .into_fields();
                let mut response = inner.call(request).await?;
                if !fields.is_empty() {
                    add_admitted_fields(response.headers_mut(), fields, admitted.limits());
                }
                Ok(self.counted(admitted, response, grpc.is_some()).await)
            }
            Err(refused) => Ok(answer(refused.refusal(&settings.http), grpc.as_ref())),
        }
    }

    /// What each chosen limit's cost is for this request (read before the body is handed
    /// on).
    fn inputs_of(
        &self,
        parts: &http::request::Parts,
        indices: impl Iterator<Item = usize>,
    ) -> Vec<Input> {
        indices
            .map(|i| {
                let rule = &self.rules[i];
                let cost = match &rule.cost {
                    Some(cost) => Some((cost.0)(parts)),
                    None => rule.fixed_cost,
                };
                Input {
                    quota: None,
                    cost: cost.map(cost_of),
                }
            })
            .collect()
    }

    /// The limiter of this request: the layer's own, else one the request carries in its
    /// extensions, else the current one.
    fn limiter_for<B>(&self, request: &Request<B>) -> Current {
        match &self.limiter {
            Some(l) => Current::Held(l.clone()),
            None => match request.extensions().get::<RateLimiter>() {
                Some(l) => Current::Held(l.clone()),
                None => RateLimiter::current_for_call(),
            },
        }
    }

    /// The response of an admitted request under a count filter: its outcome gives back
    /// what an uncounted request took, now (a status, a trailers-only gRPC answer) or when
    /// its body ends (gRPC's trailers).
    async fn counted<ResB>(
        &self,
        admitted: Admitted<'_>,
        response: Response<ResB>,
        grpc: bool,
    ) -> Response<LayerBody<ResB>> {
        if !self.counts {
            return response.map(LayerBody::new);
        }
        let outcome = if grpc {
            // A trailers-only gRPC answer has its status in the headers; else it comes in
            // the trailers, after the body.
            response.headers().get(grpc::STATUS).map(grpc::outcome)
        } else {
            Some(Outcome::Status(response.status().as_u16()))
        };
        if let Some(outcome) = outcome {
            admitted.settle(outcome).await;
            return response.map(LayerBody::new);
        }
        let admitted = admitted.detach();
        response.map(|body| LayerBody::settling(body, admitted))
    }

    /// What `request` offers the limiter (`grpc`: it is a gRPC call). The peer address is
    /// looked up only when a limit or the deny and exempt lists read it.
    fn caller<'r, B>(
        &self,
        request: &'r Request<B>,
        settings: &Settings,
        grpc: bool,
    ) -> Caller<'r> {
        let extensions = request.extensions();
        let wants_peer = self.needs_peer || !settings.exemptions.is_empty();
        Caller {
            peer: if wants_peer {
                self.peer(extensions)
            } else {
                None
            },
            path: Some(path_of(request)),
            headers: request.headers(),
            user: extensions.get::<UserId>(),
            quota: extensions.get::<Quota>().copied(),
            transport: Transport::Layer { grpc },
        }
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

/// The indices of the selected limits.
enum Indices<'a> {
    All(std::ops::Range<usize>),
    Some(std::slice::Iter<'a, usize>),
}

impl Iterator for Indices<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        match self {
            Self::All(range) => range.next(),
            Self::Some(iter) => iter.next().copied(),
        }
    }
}
