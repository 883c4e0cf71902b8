//! Calling a rate-limited partner (feature `client`): a stand-in partner on loopback admits 5
//! requests a second (its own `RateLimitLayer`, answering 429 with `Retry-After` and the IETF
//! `RateLimit` fields past that); three clients, configured for 10 a second (deliberately
//! wrong), make 20 calls each through `PartnerLayer` and retry the 429s they get. The partner's
//! answers pace them: the run prints how many calls the partner refused, with learning and
//! without.
//!
//! ```text
//! cargo run -p ratelimit-examples --bin partner_client
//! ```
//!
//! The clients share the budget in this process's memory, unless `RATELIMIT_REDIS_URL` (or
//! `REDIS_URL`) is set: then in that Redis, as processes of a fleet would.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::http::{Request, Response, StatusCode};
use ratelimit_runtime::client::{IetfFields, PartnerLayer, RetryAfter};
use ratelimit_runtime::{Algorithm, Policy, RateLimitLayer, RateLimiter};
use tower_layer::Layer as _;
use tower_service::Service;

const CLIENTS: usize = 3;
const CALLS: usize = 20;

/// The partner: 5 requests in any second, answering with its fields.
async fn partner(refused: Arc<AtomicUsize>) -> Result<String, Box<dyn std::error::Error>> {
    let limit = RateLimitLayer::builder()
        .scope("partner")
        .algorithm(Algorithm::Sliding)
        .num(5)
        .period(Duration::from_secs(1))
        .limiter(RateLimiter::builder().memory().build().await?)
        .build()?;
    let count = axum::middleware::map_response(move |response: axum::response::Response| {
        let refused = Arc::clone(&refused);
        async move {
            if response.status() == StatusCode::TOO_MANY_REQUESTS {
                refused.fetch_add(1, Ordering::Relaxed);
            }
            response
        }
    });
    let app = axum::Router::new()
        .route("/v1/call", axum::routing::post(|| async { "done\n" }))
        .layer(limit)
        .layer(count);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/v1/call", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}

/// An HTTP client as a `tower::Service` over `http::Request` (what `PartnerLayer` wraps).
#[derive(Clone)]
struct Client(reqwest::Client);

type Answer = Pin<Box<dyn Future<Output = Result<Response<String>, reqwest::Error>> + Send>>;

impl Service<Request<String>> for Client {
    type Response = Response<String>;
    type Error = reqwest::Error;
    type Future = Answer;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), reqwest::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<String>) -> Answer {
        let client = self.0.clone();
        Box::pin(async move {
            let response = client.execute(reqwest::Request::try_from(request)?).await?;
            let mut answer = Response::builder().status(response.status());
            for (name, value) in response.headers() {
                answer = answer.header(name, value);
            }
            Ok(answer
                .body(response.text().await?)
                .expect("a copied response"))
        })
    }
}

/// One client: `CALLS` calls, each retried after a 429 (the retry waits for the pause).
async fn calls(
    layer: PartnerLayer,
    url: String,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut service = layer.layer(Client(reqwest::Client::new()));
    for _ in 0..CALLS {
        loop {
            let request = Request::post(&url).body(String::new())?;
            let response = service.call(request).await?;
            if response.status() != StatusCode::TOO_MANY_REQUESTS {
                break;
            }
        }
    }
    Ok(())
}

/// The clients' run against a fresh partner: how many 429s it sent, how long it took.
async fn run(
    scope: &'static str,
    learn: bool,
    limiter: &RateLimiter,
) -> Result<(usize, Duration), Box<dyn std::error::Error>> {
    let refused = Arc::new(AtomicUsize::new(0));
    let url = partner(Arc::clone(&refused)).await?;
    let layer = PartnerLayer::builder(scope)
        .requests(Policy::new(Algorithm::Gcra, 10, Duration::from_secs(1))?)
        .read(RetryAfter)
        .read(IetfFields::new())
        .learn(learn)
        .limiter(limiter.clone())
        .build()?;
    let start = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| tokio::spawn(calls(layer.clone(), url.clone())))
        .collect();
    for client in clients {
        client.await?.map_err(|e| e.to_string())?;
    }
    Ok((refused.load(Ordering::Relaxed), start.elapsed()))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Redis when the environment names one (a fleet), else this process's memory.
    let limiter = ratelimit_runtime::limiter::Builder::from_env()
        .build()
        .await?;
    println!(
        "{CLIENTS} clients x {CALLS} calls; the partner admits 5 a second, the clients were told 10"
    );
    let (learnt, took) = run("partner_learning", true, &limiter).await?;
    println!(
        "learning from the partner: {learnt:>3} refused (429), {:.1} s",
        took.as_secs_f64()
    );
    let (blind, took) = run("partner_blind", false, &limiter).await?;
    println!(
        "without learning:          {blind:>3} refused (429), {:.1} s",
        took.as_secs_f64()
    );
    Ok(())
}
