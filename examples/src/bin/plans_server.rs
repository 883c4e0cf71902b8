//! An Axum API sold in plans, with limits that follow the caller:
//!
//! * `GET /search` — the caller's plan decides: free 60 calls a minute, pro 6,000, enterprise
//!   unlimited (`quota = "request"`: the auth layer puts the caller's `Quota` in the request);
//! * `POST /login` — 5 *failed* attempts per 15 minutes per IP and user name; successful logins
//!   do not count (`count = "errors"`: 4xx and 5xx responses count);
//! * `POST /batch` — charges one unit per item (`cost = batch.items.len()`), 100 per minute;
//! * `GET /reports` — 10 a minute per user, overridable from the configuration at start
//!   (`REPORTS_PER_MINUTE`) or at run time (`PUT /admin/quota/reports/{n}`);
//! * `PUT /admin/plan/{user}/{plan}` — changes a user's plan; it takes effect on their next
//!   call, without a restart.
//!
//! The auth layer is a stand-in: `Authorization: Bearer <user>` signs in as `<user>` (alice is
//! on the free plan, bob on pro, carol on enterprise, anyone else free). The admin endpoints
//! change what callers may do, so they are not on the public listener: they listen on
//! loopback, `127.0.0.1:3001` (`ADMIN_PORT`), behind a token (`ADMIN_TOKEN`, else a random one
//! printed at start).
//!
//! ```text
//! cargo run -p ratelimit-examples --bin plans_server
//! curl -i localhost:3000/search -H 'authorization: Bearer alice'
//! curl -i -X PUT localhost:3001/admin/plan/alice/pro -H "authorization: Bearer $TOKEN"
//! ```
//!
//! Listens on 127.0.0.1:3000 (`PORT` changes the port). Limits are kept in this process's
//! memory, unless `RATELIMIT_REDIS_URL` is set: then in that Redis.
#![allow(
    clippy::duration_suboptimal_units,
    reason = "Duration::from_mins is newer than the workspace's rust-version"
)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use ratelimit_examples::admin::{AdminToken, require_token};
use ratelimit_runtime::{Quota, RateLimiter, UserId, limiter::Builder, rate_limit};
use serde::Deserialize;

/// A plan, as the billing system knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    Free,
    Pro,
    Enterprise,
}

impl Plan {
    fn parse(name: &str) -> Option<Self> {
        match name {
            "free" => Some(Self::Free),
            "pro" => Some(Self::Pro),
            "enterprise" => Some(Self::Enterprise),
            _ => None,
        }
    }

    /// The quota the plan buys.
    fn quota(self) -> Quota {
        let quota = match self {
            Self::Free => Quota::per_minute(60),
            Self::Pro => Quota::per_minute(6_000),
            Self::Enterprise => return Quota::unlimited(),
        };
        quota.expect("a valid quota")
    }
}

#[derive(Clone)]
struct AppState {
    /// Each user's plan (a database in a real application).
    plans: Arc<RwLock<HashMap<String, Plan>>>,
    limiter: RateLimiter,
}

/// The caller's plan decides how many searches a minute they get.
#[rate_limit(quota = "request", by = "user")]
async fn search(user: UserId) -> impl IntoResponse {
    Json(serde_json::json!({ "user": user.as_str(), "results": [] }))
}

/// Failed logins allowed per user name and IP.
const LOGIN_ATTEMPTS: u64 = 5;
/// The window they are counted in.
const LOGIN_WINDOW: Duration = Duration::from_secs(15 * 60);

#[derive(Debug, Deserialize)]
struct LoginForm {
    user: String,
    password: String,
}

/// Only failures count: a 401 spends one of the five attempts, a 200 gives its unit back.
#[rate_limit(
    num = LOGIN_ATTEMPTS,
    time = LOGIN_WINDOW,
    by = "ip",
    key = "{form.user}",
    count = "errors",
    framework = "axum"
)]
async fn login(Json(form): Json<LoginForm>) -> (StatusCode, Json<serde_json::Value>) {
    if form.password == "open sesame" {
        (
            StatusCode::OK,
            Json(serde_json::json!({ "welcome": form.user })),
        )
    } else {
        (
            StatusCode::UNAUTHORIZED,
            Json(serde_json::json!({ "error": "wrong password" })),
        )
    }
}

#[derive(Debug, Deserialize)]
struct Batch {
    items: Vec<serde_json::Value>,
}

/// One unit per item; a batch larger than the bucket is refused with 400 at once.
#[rate_limit(algo = "token", num = 100, time = "1m", by = "ip", cost = batch.items.len())]
async fn batch(Json(batch): Json<Batch>) -> impl IntoResponse {
    Json(serde_json::json!({ "accepted": batch.items.len() }))
}

/// Ten a minute per user, unless the configuration says otherwise.
#[rate_limit(num = 10, time = "1m", by = "user", scope = "reports")]
async fn reports() -> impl IntoResponse {
    Json(serde_json::json!({ "reports": [] }))
}

/// Changes a user's plan: their next call is under the new quota.
async fn set_plan(
    State(state): State<AppState>,
    Path((user, plan)): Path<(String, String)>,
) -> impl IntoResponse {
    let Some(plan) = Plan::parse(&plan) else {
        return (StatusCode::BAD_REQUEST, "plans: free, pro, enterprise").into_response();
    };
    state
        .plans
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(user, plan);
    StatusCode::NO_CONTENT.into_response()
}

/// Overrides the reports quota at run time.
async fn set_reports_quota(
    State(state): State<AppState>,
    Path(per_minute): Path<u64>,
) -> impl IntoResponse {
    match Quota::per_minute(per_minute) {
        Ok(quota) => match state.limiter.set_quota("reports", quota) {
            Ok(()) => StatusCode::NO_CONTENT.into_response(),
            Err(e) => (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
        },
        Err(e) => (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    }
}

/// The stand-in auth layer: the bearer token is the user name; the plan comes from the
/// application's own records, never from anything the client sends.
async fn auth(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let user = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .filter(|u| !u.is_empty())
        .map(str::to_owned);
    if let Some(user) = user {
        let plan = state
            .plans
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&user)
            .copied()
            .unwrap_or(Plan::Free);
        req.extensions_mut().insert(plan.quota());
        req.extensions_mut().insert(UserId::new(user));
    }
    next.run(req).await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let admin_port: u16 = std::env::var("ADMIN_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3001);
    let mut builder = Builder::from_env();
    // A quota from the configuration, at start.
    if let Some(n) = std::env::var("REPORTS_PER_MINUTE")
        .ok()
        .and_then(|n| n.parse().ok())
    {
        builder = builder.override_quota("reports", Quota::per_minute(n)?);
    }
    let limiter = builder.build().await?;
    let store = limiter.store().name();
    limiter.clone().install()?;

    let plans = HashMap::from([
        ("alice".to_owned(), Plan::Free),
        ("bob".to_owned(), Plan::Pro),
        ("carol".to_owned(), Plan::Enterprise),
    ]);
    let state = AppState {
        plans: Arc::new(RwLock::new(plans)),
        limiter,
    };
    let token = AdminToken::from_env();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    // The admin API listens on loopback only: never expose it where clients can reach it.
    let admin_listener = tokio::net::TcpListener::bind(("127.0.0.1", admin_port)).await?;
    println!(
        "plans_server listening on http://{} (store: {store}); admin API on http://{} (token {token})",
        listener.local_addr()?,
        admin_listener.local_addr()?,
    );
    let admin = admin_app(state.clone(), token);
    tokio::spawn(async move { axum::serve(admin_listener, admin).await });
    axum::serve(
        listener,
        public_app(state).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

/// What clients reach: the limited API.
fn public_app(state: AppState) -> Router {
    Router::new()
        .route("/search", get(search))
        .route("/login", post(login))
        .route("/batch", post(batch))
        .route("/reports", get(reports))
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .with_state(state)
}

/// What operators reach, on a loopback listener of its own, with the admin token.
fn admin_app(state: AppState, token: AdminToken) -> Router {
    Router::new()
        .route("/admin/plan/{user}/{plan}", put(set_plan))
        .route("/admin/quota/reports/{n}", put(set_reports_quota))
        .layer(middleware::from_fn_with_state(token, require_token))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// Serves `app` on a free loopback port; returns its address.
    async fn serve(app: Router) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await
        });
        addr
    }

    /// The status of one HTTP/1.1 request over a real connection.
    async fn status(addr: SocketAddr, method: &str, path: &str, auth: &str) -> u16 {
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!(
            "{method} {path} HTTP/1.1\r\nhost: x\r\nauthorization: {auth}\r\nconnection: close\r\n\r\n"
        );
        conn.write_all(request.as_bytes()).await.unwrap();
        let mut reply = String::new();
        conn.read_to_string(&mut reply).await.unwrap();
        reply
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap()
    }

    #[tokio::test]
    async fn a_user_cannot_upgrade_her_own_plan_from_the_public_listener() {
        let state = AppState {
            plans: Arc::default(),
            limiter: RateLimiter::builder().build().await.unwrap(),
        };
        let token = AdminToken("0123456789abcdef0123".into());
        let public = serve(public_app(state.clone())).await;
        let admin = serve(admin_app(state.clone(), token)).await;
        // The issue's attack: a signed-in user sends the admin call to the public listener.
        assert_eq!(
            status(
                public,
                "PUT",
                "/admin/plan/alice/enterprise",
                "Bearer alice"
            )
            .await,
            404
        );
        // On the admin listener, only with the token.
        assert_eq!(
            status(admin, "PUT", "/admin/plan/alice/enterprise", "Bearer alice").await,
            401
        );
        assert!(state.plans.read().unwrap().is_empty(), "no plan changed");
        let ok = status(
            admin,
            "PUT",
            "/admin/plan/alice/pro",
            "Bearer 0123456789abcdef0123",
        )
        .await;
        assert!((200..300).contains(&ok), "{ok}");
        assert_eq!(state.plans.read().unwrap().get("alice"), Some(&Plan::Pro));
    }
}
