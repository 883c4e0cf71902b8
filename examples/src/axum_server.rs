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
//!
//! Running it in production (the guide's operations chapter, `ratelimit_runtime::guide::operations`):
//!
//! * `GET /search` — a new limit rolled out in **shadow mode** (`shadow = true`): it never
//!   rejects, and `ratelimit_calls_total{outcome="shadow_rejected"}` shows what it would reject;
//! * **exemptions**: the internal service user (`Authorization: Bearer svc-token`) bypasses
//!   every limit; clients from 192.0.2.0/24 (a documentation network, standing in for an abuse
//!   list) get 403 before any store call;
//! * **`GET /metrics`** — the limiter's counters and store latency in the Prometheus text format;
//! * **the admin API** on a second listener, `127.0.0.1:3001` (`ADMIN_PORT`), loopback only and
//!   behind a token (`ADMIN_TOKEN`, else a random one printed at start, sent as
//!   `Authorization: Bearer <token>`):
//!
//! ```text
//! curl -H "authorization: Bearer $TOKEN" localhost:3001/admin/users/alice            # peek
//! curl -H "authorization: Bearer $TOKEN" -X POST localhost:3001/admin/users/alice/reset
//! curl -H "authorization: Bearer $TOKEN" -X POST 'localhost:3001/admin/ips/203.0.113.7/block?seconds=600'
//! ```

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::admin::{AdminToken, require_token};
use axum::extract::{Path, Query, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use ratelimit_runtime::{
    Limit, RateLimiter, Target, UserId, Verdict, limiter::Builder, rate_limit,
};
use serde::Deserialize;

#[derive(Debug, Clone, Default)]
struct AppState {
    logins: Arc<AtomicU64>,
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    user: String,
}

/// The card's line: three logins per 10 seconds per client IP (`LOGIN`: its limits, for the
/// admin API).
#[rate_limit(
    algo = "sliding",
    num = 3,
    time = 10,
    by = "ip",
    scope = "login",
    export = "LOGIN"
)]
async fn login(State(s): State<AppState>, Json(form): Json<LoginForm>) -> impl IntoResponse {
    let n = s.logins.fetch_add(1, Ordering::Relaxed) + 1;
    Json(serde_json::json!({ "welcome": form.user, "logins_so_far": n }))
}

/// Five calls per minute per application (`appId` header).
#[rate_limit(num = 5, time = "1m", by = "app_id")]
async fn orders() -> impl IntoResponse {
    Json(serde_json::json!({ "orders": [] }))
}

/// Two calls per 10 seconds per signed-in user, refilled continuously (`ME`: its limits, for
/// the admin API).
#[rate_limit(
    algo = "token",
    num = 2,
    time = 10,
    by = "user",
    scope = "me",
    export = "ME"
)]
async fn me(user: UserId) -> impl IntoResponse {
    Json(serde_json::json!({ "user": user.as_str() }))
}

/// A new limit being rolled out: in shadow mode it never rejects, its would-be rejections are
/// counted (`outcome="shadow_rejected"`) and logged; drop `shadow = true` to enforce it.
#[rate_limit(num = 10, time = "1m", by = "ip", scope = "search", shadow = true)]
async fn search() -> impl IntoResponse {
    Json(serde_json::json!({ "results": [] }))
}

/// `GET /metrics`: everything recorded, in the Prometheus text format.
async fn metrics(State(handle): State<PrometheusHandle>) -> String {
    handle.render()
}

// ---- The admin API: the limits of `login` and `me`, as their attributes export them.

#[derive(Clone)]
struct Admin {
    limiter: RateLimiter,
    token: AdminToken,
}

/// `?seconds=N` of a block.
#[derive(Debug, Deserialize)]
struct BlockFor {
    seconds: Option<u64>,
}

/// What a caller's limits read now.
fn state(verdict: &Verdict) -> serde_json::Value {
    let limits: Vec<serde_json::Value> = verdict
        .decisions()
        .iter()
        .map(|d| {
            serde_json::json!({
                "admitted": d.admitted,
                "limit": d.limit,
                "remaining": d.remaining,
                "reset_after_ms": d.reset_after.as_millis(),
                "retry_after_ms": d.retry_after.map(|r| r.as_millis()),
            })
        })
        .collect();
    serde_json::json!({ "limits": limits })
}

/// Runs one admin call: `op` is "peek", "reset" or "block".
async fn admin_call(
    admin: &Admin,
    limits: &[Limit],
    target: &Target,
    op: &str,
    block: Option<Duration>,
) -> Response {
    let limiter = &admin.limiter;
    let result = match (op, block) {
        ("peek", _) => limiter.peek(limits, target).await.map(|v| state(&v)),
        ("reset", _) => limiter
            .reset(limits, target)
            .await
            .map(|()| serde_json::json!({ "reset": true })),
        ("block", Some(d)) => limiter
            .block(limits, target, d)
            .await
            .map(|()| serde_json::json!({ "blocked_for_s": d.as_secs() })),
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    match result {
        Ok(body) => Json(body).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

async fn admin_user(
    State(admin): State<Admin>,
    Path((user, op)): Path<(String, String)>,
    Query(block): Query<BlockFor>,
) -> Response {
    let block = block.seconds.map(Duration::from_secs);
    admin_call(&admin, ME, &Target::value(user), &op, block).await
}

async fn admin_user_peek(State(admin): State<Admin>, Path(user): Path<String>) -> Response {
    admin_call(&admin, ME, &Target::value(user), "peek", None).await
}

async fn admin_ip(
    State(admin): State<Admin>,
    Path((ip, op)): Path<(IpAddr, String)>,
    Query(block): Query<BlockFor>,
) -> Response {
    let block = block.seconds.map(Duration::from_secs);
    admin_call(&admin, LOGIN, &Target::ip(ip), &op, block).await
}

async fn admin_ip_peek(State(admin): State<Admin>, Path(ip): Path<IpAddr>) -> Response {
    admin_call(&admin, LOGIN, &Target::ip(ip), "peek", None).await
}

/// The limiter: Redis when `RATELIMIT_REDIS_URL` or `REDIS_URL` is set, else memory; the
/// internal service user exempt, a documentation network denied.
async fn limiter() -> Result<RateLimiter, Box<dyn std::error::Error>> {
    Ok(Builder::from_env()
        .exempt_when(|caller| caller.user().is_some_and(|u| u.as_str() == "svc"))
        .deny_networks(["192.0.2.0/24"])
        .build()
        .await?)
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
        Some(b"Bearer svc-token") => Some("svc"),
        _ => None,
    };
    if let Some(user) = user {
        req.extensions_mut().insert(UserId::new(user));
    }
    next.run(req).await
}

/// Serves the example's API on `listener` and its admin API on `admin_listener` until `stop`
/// resolves (the binary passes Ctrl-C); then lets the requests in flight finish and shuts the
/// limiter down, so that the store counts exactly what this process admitted.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// ratelimit_examples::axum_server::serve(listener, admin, async {
///     let _ = tokio::signal::ctrl_c().await;
/// })
/// .await?;
/// # Ok(()) }
/// ```
pub async fn serve(
    listener: tokio::net::TcpListener,
    admin_listener: tokio::net::TcpListener,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error>> {
    // The recorder first: the limiter's counters go to it (feature `metrics`).
    let prometheus = PrometheusBuilder::new().install_recorder()?;
    let limiter = limiter().await?;
    limiter.clone().install()?;

    let app = Router::new()
        .route("/login", post(login))
        .route("/api/orders", get(orders))
        .route("/me", get(me))
        .route("/search", get(search))
        .layer(middleware::from_fn(auth))
        .with_state(AppState::default())
        .merge(
            Router::new()
                .route("/metrics", get(metrics))
                .with_state(prometheus),
        );
    let admin = Admin {
        limiter: limiter.clone(),
        token: AdminToken::from_env(),
    };
    let admin_app = Router::new()
        .route("/admin/users/{user}", get(admin_user_peek))
        .route("/admin/users/{user}/{op}", post(admin_user))
        .route("/admin/ips/{ip}", get(admin_ip_peek))
        .route("/admin/ips/{ip}/{op}", post(admin_ip))
        .layer(middleware::from_fn_with_state(
            admin.token.clone(),
            require_token,
        ))
        .with_state(admin.clone());

    println!(
        "axum_server listening on http://{} (store: {}); admin API on http://{} (token {})",
        listener.local_addr()?,
        limiter.store().name(),
        admin_listener.local_addr()?,
        admin.token,
    );
    tokio::spawn(async move { axum::serve(admin_listener, admin_app).await });
    // `by = "ip"` reads the peer address from `ConnectInfo`.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    // On `stop`: stop accepting, let the requests in flight finish.
    .with_graceful_shutdown(stop)
    .await?;
    // The requests are drained: give back the units the limiter holds in leases and let its
    // background store calls finish, so that the store counts exactly what this process admitted.
    limiter.shutdown(Duration::from_secs(5)).await?;
    println!("axum_server stopped");
    Ok(())
}
