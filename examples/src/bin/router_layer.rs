//! A whole Axum router under one Tower layer, `RateLimitLayer` (feature `tower`): every route
//! shares 10 requests per minute per client IP (sliding window), and `POST /login` carries its
//! own `#[rate_limit]` as well (3 per 10 s per IP), so it answers to both limits.
//!
//! ```text
//! cargo run -p ratelimit-examples --bin router_layer
//! curl -i localhost:3000/
//! curl -i -X POST localhost:3000/login
//! ```
//!
//! Listens on 127.0.0.1:3000 (`PORT` changes the port). Limits are kept in this process's
//! memory, unless `RATELIMIT_REDIS_URL` (or `REDIS_URL`) is set: then in that Redis.

#![allow(
    clippy::duration_suboptimal_units,
    reason = "Duration::from_mins is newer than the workspace's rust-version"
)]

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use ratelimit_runtime::{Algorithm, RateLimitLayer, RateLimiter, rate_limit};

/// Three logins per 10 seconds per client IP, within the router's 10 per minute.
#[rate_limit(algo = "sliding", num = 3, time = 10, by = "ip")]
async fn login() -> &'static str {
    "welcome\n"
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    // A bad policy is an `Err` here, at start (`num(0)`: "limit #1: `num` must be a positive integer").
    let per_ip = RateLimitLayer::builder()
        .scope("api")
        .algorithm(Algorithm::Sliding)
        .num(10)
        .period(Duration::from_secs(60))
        .by("ip")
        .build()?;
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/orders", get(|| async { "[]\n" }))
        .route("/login", post(login))
        .layer(per_ip);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "router_layer listening on http://{} (store: {})",
        listener.local_addr()?,
        RateLimiter::current().store().name()
    );
    // `by("ip")` reads the peer address from `ConnectInfo`, as the attribute does.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
