//! An Axum server with three rate-limited endpoints:
//!
//! * `POST /login` — the card's line: 3 logins per 10 s per client IP (sliding window);
//! * `GET /api/orders` — 5 calls per minute per application, identified by the `appId` header;
//! * `GET /me` — 2 calls per 10 s per user (token bucket), behind a tiny auth layer that turns
//!   `Authorization: Bearer alice-token` (or `bob-token`) into a `UserId`.
//!
//! ```text
//! cargo run -p ratelimit-examples --bin axum_server
//! curl -i -X POST localhost:3000/login -H 'content-type: application/json' -d '{"user":"alice"}'
//! ```
//!
//! Listens on 127.0.0.1:3000 (`PORT` changes the port). Limits are kept in this process's
//! memory, unless `RATELIMIT_REDIS_URL` (or `REDIS_URL`) is set: then in that Redis.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ratelimit_runtime::{RateLimiter, UserId, rate_limit};
use serde::Deserialize;

#[derive(Debug, Clone, Default)]
struct AppState {
    logins: Arc<AtomicU64>,
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    user: String,
}

/// The card's line: three logins per 10 seconds per client IP.
#[rate_limit(algo = "sliding", num = 3, time = 10, by = "ip")]
async fn login(State(s): State<AppState>, Json(form): Json<LoginForm>) -> impl IntoResponse {
    let n = s.logins.fetch_add(1, Ordering::Relaxed) + 1;
    Json(serde_json::json!({ "welcome": form.user, "logins_so_far": n }))
}

/// Five calls per minute per application (`appId` header).
#[rate_limit(num = 5, time = "1m", by = "app_id")]
async fn orders() -> impl IntoResponse {
    Json(serde_json::json!({ "orders": [] }))
}

/// Two calls per 10 seconds per signed-in user, refilled continuously.
#[rate_limit(algo = "token", num = 2, time = 10, by = "user")]
async fn me(user: UserId) -> impl IntoResponse {
    Json(serde_json::json!({ "user": user.as_str() }))
}

/// The tiny auth layer: a known bearer token becomes a `UserId` in the request extensions.
async fn auth(mut req: Request, next: Next) -> Response {
    let user = match req
        .headers()
        .get("authorization")
        .map(axum::http::HeaderValue::as_bytes)
    {
        Some(b"Bearer alice-token") => Some("alice"),
        Some(b"Bearer bob-token") => Some("bob"),
        _ => None,
    };
    if let Some(user) = user {
        req.extensions_mut().insert(UserId::new(user));
    }
    next.run(req).await
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let app = Router::new()
        .route("/login", post(login))
        .route("/api/orders", get(orders))
        .route("/me", get(me))
        .layer(middleware::from_fn(auth))
        .with_state(AppState::default());
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "axum_server listening on http://{} (store: {})",
        listener.local_addr()?,
        RateLimiter::global().store().name()
    );
    // `by = "ip"` reads the peer address from `ConnectInfo`.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}
