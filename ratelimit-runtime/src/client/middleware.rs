//! The client layer as a `reqwest-middleware` middleware (feature `reqwest`): the same
//! budget, waiting, reading and learning as [`PartnerLayer`] over a Tower service, for code
//! that holds a `reqwest_middleware::ClientWithMiddleware`.

use std::sync::Arc;

use reqwest_middleware::{Middleware, Next};

use super::learn::Partner;
use super::service::PartnerLayer;
use crate::limiter::RateLimiter;

/// [`PartnerLayer`] as a `reqwest-middleware` middleware: add it to a
/// `reqwest_middleware::ClientBuilder` with `.with(…)`. A request the budget refuses fails
/// with `reqwest_middleware::Error::Middleware` holding the [`crate::RateLimitError`].
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::client::{PartnerLayer, PartnerMiddleware};
/// use ratelimit_runtime::{Algorithm, Policy};
///
/// let layer = PartnerLayer::builder("github")
///     .requests(Policy::new(Algorithm::Fixed, 5_000, Duration::from_secs(3_600))?)
///     .build()?;
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(PartnerMiddleware::from(layer))
///     .build();
/// # let _ = client;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct PartnerMiddleware {
    partner: Arc<Partner>,
}

impl std::fmt::Debug for PartnerMiddleware {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartnerMiddleware").finish_non_exhaustive()
    }
}

impl From<PartnerLayer> for PartnerMiddleware {
    fn from(layer: PartnerLayer) -> Self {
        Self {
            partner: layer.partner,
        }
    }
}

#[async_trait::async_trait]
impl Middleware for PartnerMiddleware {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut http::Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let partner = &self.partner;
        let limiter = partner.limiter.clone().unwrap_or_else(RateLimiter::current);
        let sent = partner
            .admit(&limiter, &request_head(&request))
            .await
            .map_err(reqwest_middleware::Error::middleware)?;
        let response = next.run(request, extensions).await?;
        partner
            .answered(&limiter, sent, &response_head(&response))
            .await;
        Ok(response)
    }
}

/// What the estimate reads of a request: its method, URI and headers.
fn request_head(request: &reqwest::Request) -> http::request::Parts {
    let (mut head, ()) = http::Request::new(()).into_parts();
    head.method = request.method().clone();
    head.uri = request.url().as_str().parse().unwrap_or_default();
    head.headers = request.headers().clone();
    head
}

/// What the readers and the settle read of a response: its status and headers.
fn response_head(response: &reqwest::Response) -> http::response::Parts {
    let (mut head, ()) = http::Response::new(()).into_parts();
    head.status = response.status();
    head.version = response.version();
    head.headers = response.headers().clone();
    head
}
