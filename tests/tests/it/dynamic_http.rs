//! Limits that follow the caller on Axum and Actix-web handlers, over real HTTP (servers on
//! loopback ports, reqwest), on the memory store and on a private Redis: per-plan quotas from
//! the auth layer (an upgrade mid-window, an unlimited plan, a missing quota), a `const`
//! quota, a quota overridden at run time (shown in `RateLimit-Policy`), a cost from the body,
//! and a login that counts only failures (50 concurrent mixed calls).
#![allow(
    clippy::duration_suboptimal_units,
    reason = "Duration::from_mins is newer than the workspace's rust-version"
)]

use std::time::Duration;

use ratelimit_runtime::{Quota, RateLimiter, UserId};
use serde::Deserialize;

use crate::http_support::{Answer, Backend, client, param};

/// The auth layer's rule: `Authorization: Bearer <user>:<plan>` → the caller's `UserId` and
/// `Quota` (plan `none`: a user with no quota).
fn caller_of(authorization: Option<&str>) -> Option<(UserId, Option<Quota>)> {
    let token = authorization?.strip_prefix("Bearer ")?;
    let (user, plan) = token.split_once(':')?;
    let quota = match plan {
        "free" => Some(Quota::per_minute(3).unwrap()),
        "pro" => Some(Quota::per_minute(10).unwrap()),
        "enterprise" => Some(Quota::unlimited()),
        _ => None,
    };
    Some((UserId::new(user), quota))
}

const CONST_NUM: u64 = 3;
const CONST_WINDOW: Duration = Duration::from_secs(60);

#[derive(Debug, Deserialize)]
pub struct Batch {
    items: Vec<u32>,
}

#[derive(Debug, Deserialize)]
pub struct LoginForm {
    user: String,
    password: String,
}

mod axum_app {
    use axum::extract::Request;
    use axum::http::StatusCode;
    use axum::middleware::{self, Next};
    use axum::response::Response;
    use axum::routing::{get, post};
    use axum::{Extension, Json, Router};
    use ratelimit_runtime::{RateLimiter, rate_limit};

    use super::{Batch, CONST_NUM, CONST_WINDOW, LoginForm, caller_of};

    #[rate_limit(quota = "request", by = "user", framework = "axum")]
    async fn search() -> &'static str {
        "results"
    }

    #[rate_limit(num = CONST_NUM, time = CONST_WINDOW, by = "ip", framework = "axum")]
    async fn constant() -> &'static str {
        "const"
    }

    #[rate_limit(num = 2, time = 60, by = "ip", scope = "dyn_http::axum::overridden")]
    async fn overridden() -> &'static str {
        "overridden"
    }

    #[rate_limit(algo = "token", num = 10, time = 60, by = "ip", cost = batch.items.len(), framework = "axum")]
    async fn batch(Json(batch): Json<Batch>) -> String {
        format!("{} items", batch.items.len())
    }

    #[rate_limit(
        num = 5,
        time = "15m",
        by = "ip",
        key = "{form.user}",
        count = "errors",
        framework = "axum"
    )]
    async fn login(Json(form): Json<LoginForm>) -> (StatusCode, &'static str) {
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        if form.password == "right" {
            (StatusCode::OK, "welcome")
        } else {
            (StatusCode::UNAUTHORIZED, "wrong password")
        }
    }

    async fn auth(mut req: Request, next: Next) -> Response {
        let header = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        if let Some((user, quota)) = caller_of(header) {
            req.extensions_mut().insert(user);
            if let Some(quota) = quota {
                req.extensions_mut().insert(quota);
            }
        }
        next.run(req).await
    }

    pub(crate) async fn start(limiter: RateLimiter) -> String {
        let app = Router::new()
            .route("/search", get(search))
            .route("/const", get(constant))
            .route("/overridden", get(overridden))
            .route("/batch", post(batch))
            .route("/login", post(login))
            .layer(middleware::from_fn(auth))
            .layer(Extension(limiter));
        let addr = crate::http_support::serve_axum(app, "127.0.0.1").await;
        format!("http://{addr}")
    }
}

mod actix_app {
    use actix_web::dev::Service as _;
    use actix_web::{App, HttpMessage as _, HttpResponse, HttpServer, web};
    use ratelimit_runtime::{RateLimiter, rate_limit};

    use super::{Batch, CONST_NUM, CONST_WINDOW, LoginForm, caller_of};

    #[rate_limit(quota = "request", by = "user", framework = "actix")]
    async fn search() -> &'static str {
        "results"
    }

    #[rate_limit(num = CONST_NUM, time = CONST_WINDOW, by = "ip", framework = "actix")]
    async fn constant() -> &'static str {
        "const"
    }

    #[rate_limit(num = 2, time = 60, by = "ip", scope = "dyn_http::actix::overridden")]
    async fn overridden() -> &'static str {
        "overridden"
    }

    #[rate_limit(algo = "token", num = 10, time = 60, by = "ip", cost = batch.items.len(), framework = "actix")]
    async fn batch(web::Json(batch): web::Json<Batch>) -> String {
        format!("{} items", batch.items.len())
    }

    #[rate_limit(
        num = 5,
        time = "15m",
        by = "ip",
        key = "{form.user}",
        count = "errors",
        framework = "actix"
    )]
    async fn login(web::Json(form): web::Json<LoginForm>) -> HttpResponse {
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        if form.password == "right" {
            HttpResponse::Ok().body("welcome")
        } else {
            HttpResponse::Unauthorized().body("wrong password")
        }
    }

    pub(crate) fn start(limiter: RateLimiter) -> String {
        let server = HttpServer::new(move || {
            App::new()
                .app_data(limiter.clone())
                .wrap_fn(|req, srv| {
                    let header = req
                        .headers()
                        .get("authorization")
                        .and_then(|v| v.to_str().ok());
                    if let Some((user, quota)) = caller_of(header) {
                        req.extensions_mut().insert(user);
                        if let Some(quota) = quota {
                            req.extensions_mut().insert(quota);
                        }
                    }
                    srv.call(req)
                })
                .route("/search", web::get().to(search))
                .route("/const", web::get().to(constant))
                .route("/overridden", web::get().to(overridden))
                .route("/batch", web::post().to(batch))
                .route("/login", web::post().to(login))
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(0)
        .bind(("127.0.0.1", 0))
        .expect("bind");
        let addr = server.addrs()[0];
        actix_web::rt::spawn(server.run());
        format!("http://{addr}")
    }
}

async fn search(base: &str, token: Option<&str>) -> Answer {
    let mut req = client().get(format!("{base}/search"));
    if let Some(token) = token {
        req = req.header("authorization", format!("Bearer {token}"));
    }
    Answer::from(req.send().await.expect("send")).await
}

async fn statuses_of(base: &str, token: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(search(base, Some(token)).await.status);
    }
    out
}

fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|s| **s == status).count()
}

async fn plans_scenario(base: &str) {
    let first = search(base, Some("alice:free")).await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(
        first.header("ratelimit-policy"),
        Some("\"search\";q=3;w=60"),
        "{first:?}"
    );
    let rest = statuses_of(base, "alice:free", 4).await;
    assert_eq!(rest, [200, 200, 429, 429]);
    let pro = statuses_of(base, "bob:pro", 12).await;
    assert_eq!(count(&pro, 200), 10, "{pro:?}");
    // Carol's calls are hers: alice's spent quota is not.
    assert_eq!(count(&statuses_of(base, "carol:free", 4).await, 200), 3);
    // Alice upgrades: her next call is under the pro quota, in a fresh window.
    let upgraded = search(base, Some("alice:pro")).await;
    assert_eq!(upgraded.status, 200, "{upgraded:?}");
    assert_eq!(
        upgraded.header("ratelimit-policy"),
        Some("\"search\";q=10;w=60")
    );
    assert_eq!(count(&statuses_of(base, "alice:pro", 11).await, 200), 9);
    // Back on free: her free window is where she left it.
    assert_eq!(statuses_of(base, "alice:free", 1).await, [429]);
    // Enterprise: unlimited, no store call, no rate-limit fields.
    for _ in 0..30 {
        let a = search(base, Some("dave:enterprise")).await;
        assert_eq!(a.status, 200);
        assert!(a.header("ratelimit-policy").is_none(), "{a:?}");
    }
    // No user: 401 (by = "user"); a user without a quota: 401 saying so.
    assert_eq!(search(base, None).await.status, 401);
    let none = search(base, Some("erin:none")).await;
    assert_eq!(none.status, 401, "{none:?}");
    assert!(none.body.contains("quota"), "{none:?}");
}

async fn const_and_override_scenario(base: &str, limiter: &RateLimiter, scope: &str) {
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(
            client()
                .get(format!("{base}/const"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16(),
        );
    }
    assert_eq!(got, [200, 200, 200, 429], "num = CONST_NUM");

    let get = || async {
        Answer::from(
            client()
                .get(format!("{base}/overridden"))
                .send()
                .await
                .unwrap(),
        )
        .await
    };
    let a = get().await;
    assert_eq!(
        a.header("ratelimit-policy"),
        Some("\"overridden\";q=2;w=60")
    );
    assert_eq!(get().await.status, 200);
    assert_eq!(get().await.status, 429);
    // From configuration, at run time, without a restart.
    limiter
        .set_quota(scope, Quota::per_minute(5).unwrap())
        .unwrap();
    let a = get().await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(
        a.header("ratelimit-policy"),
        Some("\"overridden\";q=5;w=60")
    );
    assert_eq!(param(a.header("ratelimit").unwrap(), "r"), 4);
    for _ in 0..4 {
        assert_eq!(get().await.status, 200);
    }
    let spent = get().await;
    spent.assert_too_many();
    assert_eq!(
        spent.header("ratelimit-policy"),
        Some("\"overridden\";q=5;w=60")
    );
    limiter.clear_quota(scope);
    assert_eq!(get().await.status, 429, "the attribute's bucket, as it was");
}

async fn batch_scenario(base: &str) {
    let send = |n: u32| async move {
        let items: Vec<u32> = (0..n).collect();
        Answer::from(
            client()
                .post(format!("{base}/batch"))
                .json(&serde_json::json!({ "items": items }))
                .send()
                .await
                .unwrap(),
        )
        .await
    };
    assert_eq!(send(4).await.body, "4 items");
    let a = send(4).await;
    assert_eq!(a.status, 200);
    assert_eq!(param(a.header("ratelimit").unwrap(), "r"), 2);
    // Two units left: a batch of four waits (429, two left), a batch of two fits.
    let wait = send(4).await;
    assert_eq!(wait.status, 429, "{wait:?}");
    assert_eq!(param(wait.header("ratelimit").unwrap(), "r"), 2);
    assert_eq!(send(2).await.status, 200);
    let never = send(11).await;
    assert_eq!(never.status, 400, "{never:?}");
    assert!(never.body.contains("can never be admitted"), "{never:?}");
}

async fn login(base: &str, user: &str, password: &str) -> u16 {
    client()
        .post(format!("{base}/login"))
        .json(&serde_json::json!({ "user": user, "password": password }))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn failures_scenario(base: &str) {
    for _ in 0..10 {
        assert_eq!(
            login(base, "ann", "right").await,
            200,
            "successes never count"
        );
    }
    let mut tasks = Vec::new();
    for i in 0..50 {
        let base = base.to_owned();
        tasks.push(tokio::spawn(async move {
            let password = if i % 2 == 0 { "wrong" } else { "right" };
            login(&base, "bob", password).await
        }));
    }
    let mut got = Vec::new();
    for t in tasks {
        got.push(t.await.unwrap());
    }
    let failures = count(&got, 401);
    assert!(failures <= 5, "{failures} failures admitted: {got:?}");
    assert_eq!(
        failures + count(&got, 200) + count(&got, 429),
        50,
        "{got:?}"
    );
    let mut later = 0;
    loop {
        match login(base, "bob", "wrong").await {
            401 => later += 1,
            429 => break,
            other => panic!("{other}"),
        }
        assert!(later <= 5);
    }
    assert_eq!(failures + later, 5, "exactly the quota of counted failures");
    assert_eq!(login(base, "bob", "right").await, 429);
    assert_eq!(login(base, "cid", "wrong").await, 401, "another user");
}

async fn limiter(backend: &Backend) -> RateLimiter {
    backend.limiter(&[]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_limits_that_follow_the_caller_memory() {
    let b = Backend::memory();
    let l = limiter(&b).await;
    let base = axum_app::start(l.clone()).await;
    plans_scenario(&base).await;
    const_and_override_scenario(&base, &l, "dyn_http::axum::overridden").await;
    batch_scenario(&base).await;
    failures_scenario(&base).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_limits_that_follow_the_caller_redis() {
    let b = Backend::redis();
    let l = limiter(&b).await;
    let base = axum_app::start(l.clone()).await;
    plans_scenario(&base).await;
    const_and_override_scenario(&base, &l, "dyn_http::axum::overridden").await;
    batch_scenario(&base).await;
    failures_scenario(&base).await;
}

#[actix_web::test]
async fn actix_limits_that_follow_the_caller_memory() {
    let b = Backend::memory();
    let l = limiter(&b).await;
    let base = actix_app::start(l.clone());
    plans_scenario(&base).await;
    const_and_override_scenario(&base, &l, "dyn_http::actix::overridden").await;
    batch_scenario(&base).await;
    failures_scenario(&base).await;
}

#[actix_web::test]
async fn actix_limits_that_follow_the_caller_redis() {
    let b = Backend::redis();
    let l = limiter(&b).await;
    let base = actix_app::start(l.clone());
    plans_scenario(&base).await;
    const_and_override_scenario(&base, &l, "dyn_http::actix::overridden").await;
    batch_scenario(&base).await;
    failures_scenario(&base).await;
}
