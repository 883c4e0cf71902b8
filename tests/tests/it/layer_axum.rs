//! `RateLimitLayer` on Axum routers, over real HTTP (a server on a loopback port, reqwest), on
//! the memory store and on a private Redis: the shared HTTP scenarios with every limit a layer
//! instead of an attribute, a whole router under one layer, the 429 compared byte for byte with
//! the attribute's, and a route under both.

#![allow(
    clippy::duration_suboptimal_units,
    reason = "Duration::from_mins is newer than the workspace's rust-version"
)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use axum::{Extension, Json, Router};
use ratelimit_runtime::{
    Algorithm, FailurePolicy, RateLimitLayer, RateLimiter, UserId, rate_limit,
};
use ratelimit_tests::env::Env;
use ratelimit_tests::redis_server::RedisServer;
use serde::Deserialize;

use crate::http_support::{Answer, Backend, client, client_from, scenarios, serve_axum, statuses};

#[derive(Debug, Clone, Default)]
struct AppState {
    logins: Arc<AtomicUsize>,
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    user: String,
}

async fn login(State(s): State<AppState>, Json(form): Json<LoginForm>) -> impl IntoResponse {
    s.logins.fetch_add(1, Ordering::SeqCst);
    Json(serde_json::json!({ "welcome": form.user }))
}

async fn stats(State(s): State<AppState>) -> String {
    s.logins.load(Ordering::SeqCst).to_string()
}

async fn auth(mut req: Request, next: Next) -> Response {
    if let Some(user) = req.headers().get("x-user").and_then(|v| v.to_str().ok()) {
        let user = UserId::new(user);
        req.extensions_mut().insert(user);
    }
    next.run(req).await
}

fn layer(
    limiter: &RateLimiter,
    scope: &str,
    algo: Algorithm,
    num: u64,
    secs: u64,
    by: &'static str,
) -> RateLimitLayer {
    RateLimitLayer::builder()
        .scope(scope)
        .algorithm(algo)
        .num(num)
        .period(Duration::from_secs(secs))
        .by(by)
        .limiter(limiter.clone())
        .build()
        .expect("layer")
}

/// The scenarios' routes (`http_support/scenarios.rs`), each limited by a layer of the
/// attribute's policy and a scope named like the attribute's handler.
fn app(limiter: &RateLimiter) -> Router {
    let fixed = |scope, by| layer(limiter, scope, Algorithm::Fixed, 2, 60, by);
    let under = |route: MethodRouter<AppState>, with: RateLimitLayer| route.layer(with);
    Router::new()
        .route(
            "/login",
            under(
                post(login),
                layer(limiter, "login", Algorithm::Sliding, 3, 10, "ip"),
            ),
        )
        .route("/stats", get(stats))
        .route(
            "/url/{*rest}",
            under(get(|| async { "url" }), fixed("by_url", "url")),
        )
        .route("/me", under(get(|| async { "me" }), fixed("me", "user")))
        .route(
            "/api",
            under(get(|| async { "api" }), fixed("api", "app_id")),
        )
        .route(
            "/keyed",
            under(
                get(|| async { "keyed" }),
                fixed("keyed", "header:X-Api-Key"),
            ),
        )
        .route("/ip", under(get(|| async { "ip" }), fixed("by_ip", "ip")))
        .layer(middleware::from_fn(auth))
        .with_state(AppState::default())
}

async fn start(backend: &Backend, proxies: &[&str]) -> String {
    let addr = serve_axum(app(&backend.limiter(proxies).await), "127.0.0.1").await;
    format!("http://{addr}")
}

#[tokio::test]
async fn layer_card_line_memory() {
    scenarios::card_line(&start(&Backend::memory(), &[]).await).await;
}

#[tokio::test]
async fn layer_card_line_redis() {
    let b = Backend::redis();
    scenarios::card_line(&start(&b, &[]).await).await;
}

#[tokio::test]
async fn layer_sources_memory() {
    scenarios::sources(&start(&Backend::memory(), &[]).await).await;
}

#[tokio::test]
async fn layer_sources_redis() {
    let b = Backend::redis();
    scenarios::sources(&start(&b, &[]).await).await;
}

#[tokio::test]
async fn layer_spoofing_changes_nothing() {
    scenarios::spoofing_changes_nothing(&start(&Backend::memory(), &[]).await).await;
}

#[tokio::test]
async fn layer_trusted_proxy_right_most_untrusted_hop_memory() {
    let b = Backend::memory();
    scenarios::trusted_proxy_right_most_untrusted_hop(&start(&b, &["127.0.0.1"]).await).await;
}

#[tokio::test]
async fn layer_trusted_proxy_right_most_untrusted_hop_redis() {
    let b = Backend::redis();
    scenarios::trusted_proxy_right_most_untrusted_hop(&start(&b, &["127.0.0.1"]).await).await;
}

#[tokio::test]
async fn layer_a_spoofed_forwarded_header_behind_an_xff_proxy_changes_nothing() {
    let b = Backend::memory();
    let limiter = scenarios::limiter_behind_proxy(&b, None).await;
    let base = format!("http://{}", serve_axum(app(&limiter), "127.0.0.1").await);
    scenarios::a_spoofed_forwarded_header_behind_an_xff_proxy_changes_nothing(&base).await;
}

#[tokio::test]
async fn layer_ipv6_grouped_by_64() {
    let b = Backend::memory();
    scenarios::ipv6_grouped_by_64(&start(&b, &["127.0.0.1/32"]).await).await;
}

#[tokio::test]
async fn layer_unusual_header_values() {
    scenarios::unusual_header_values(&start(&Backend::memory(), &[]).await).await;
}

/// A whole router under one layer (`Router::layer`), by ip, 7 per minute: of 40 concurrent
/// requests from one client over several routes, exactly 7 are admitted and 33 get the 429.
async fn whole_router_is_exact(backend: &Backend) {
    let limiter = backend.limiter(&[]).await;
    let app = Router::new()
        .route("/a", get(|| async { "a" }))
        .route("/b", post(|| async { "b" }))
        .layer(layer(&limiter, "api", Algorithm::Sliding, 7, 60, "ip"));
    let base = format!("http://{}", serve_axum(app, "127.0.0.1").await);
    let c = client();
    let mut handles = Vec::new();
    for i in 0..40 {
        let request = if i % 2 == 0 {
            c.get(format!("{base}/a"))
        } else {
            c.post(format!("{base}/b"))
        };
        handles.push(tokio::spawn(async move {
            Answer::from(request.send().await.expect("send")).await
        }));
    }
    let (mut ok, mut refused) = (0, 0);
    for h in handles {
        let a = h.await.expect("join");
        match a.status {
            200 => {
                assert_eq!(a.header("ratelimit-policy"), Some("\"api\";q=7;w=60"));
                ok += 1;
            }
            429 => {
                a.assert_too_many();
                refused += 1;
            }
            _ => panic!("unexpected {a:?}"),
        }
    }
    assert_eq!((ok, refused), (7, 33));
    // Another client has its own quota.
    let other = Answer::from(
        client_from("127.0.0.2")
            .get(format!("{base}/a"))
            .send()
            .await
            .expect("send"),
    )
    .await;
    assert_eq!(other.status, 200, "{other:?}");
    assert_eq!(other.remaining(), 6);
}

#[tokio::test]
async fn a_whole_router_is_exact_under_40_concurrent_requests_memory() {
    whole_router_is_exact(&Backend::memory()).await;
}

#[tokio::test]
async fn a_whole_router_is_exact_under_40_concurrent_requests_redis() {
    whole_router_is_exact(&Backend::redis()).await;
}

#[rate_limit(num = 2, time = 10, by = "ip", scope = "api")]
async fn attributed() -> &'static str {
    "ok"
}

/// The layer's answers are the attribute's, byte for byte: same policy, same scope name, two
/// servers each on a memory store whose clock stands still.
#[tokio::test]
async fn the_layer_answers_exactly_what_the_attribute_answers() {
    let (with_layer, _clock1) = Env::memory().await;
    let (with_attribute, _clock2) = Env::memory().await;
    let layered = Router::new()
        .route("/x", get(|| async { "ok" }))
        .layer(layer(&with_layer, "api", Algorithm::Fixed, 2, 10, "ip"));
    let attributed = Router::new()
        .route("/x", get(attributed))
        .layer(Extension(with_attribute));
    let layered = format!("http://{}/x", serve_axum(layered, "127.0.0.1").await);
    let attributed = format!("http://{}/x", serve_axum(attributed, "127.0.0.1").await);
    let c = client();
    for _ in 0..3 {
        let x = Answer::from(c.get(&layered).send().await.expect("send")).await;
        let y = Answer::from(c.get(&attributed).send().await.expect("send")).await;
        assert_eq!(x.status, y.status, "{x:?} {y:?}");
        assert_eq!(x.body, y.body);
        for name in [
            "content-type",
            "content-length",
            "retry-after",
            "ratelimit-policy",
            "ratelimit",
        ] {
            assert_eq!(
                x.headers.get_all(name).iter().collect::<Vec<_>>(),
                y.headers.get_all(name).iter().collect::<Vec<_>>(),
                "{name}: {x:?} {y:?}"
            );
        }
        if x.status == 429 {
            x.assert_too_many();
        }
    }
}

#[rate_limit(num = 2, time = 60, by = "ip")]
async fn tight() -> &'static str {
    "tight"
}

/// A route under the router's layer (5 per minute) that carries `#[rate_limit]` (2 per
/// minute) as well: the tighter binds, both count, and the response names both.
async fn both_limits(backend: &Backend) {
    let limiter = backend.limiter(&[]).await;
    let app = Router::new()
        .route("/tight", get(tight))
        .route("/free", get(|| async { "free" }))
        .layer(Extension(limiter.clone()))
        .layer(layer(&limiter, "api", Algorithm::Fixed, 5, 60, "ip"));
    let base = format!("http://{}", serve_axum(app, "127.0.0.1").await);
    let c = client();
    let get = |path: &str| {
        let request = c.get(format!("{base}{path}"));
        async move { Answer::from(request.send().await.expect("send")).await }
    };
    let first = get("/tight").await;
    assert_eq!(first.status, 200, "{first:?}");
    // The members of a field, without `t=` (Redis counts whole seconds from its own clock):
    // one field (one line), the route's members first.
    let lists = |a: &Answer, name: &str| -> Vec<String> {
        let lines: Vec<_> = a.headers.get_all(name).iter().collect();
        assert_eq!(lines.len(), 1, "{name}: one field, {a:?}");
        lines[0]
            .to_str()
            .unwrap()
            .split(", ")
            .map(|v| v.split_once(";t=").map_or(v, |(head, _)| head).to_owned())
            .collect()
    };
    assert_eq!(
        lists(&first, "ratelimit-policy"),
        ["\"tight\";q=2;w=60", "\"api\";q=5;w=60"]
    );
    assert_eq!(lists(&first, "ratelimit"), ["\"tight\";r=1", "\"api\";r=4"]);
    assert_eq!(get("/tight").await.status, 200);
    // The attribute refuses the third; the layer counted it.
    let third = get("/tight").await;
    third.assert_too_many();
    assert_eq!(lists(&third, "ratelimit"), ["\"tight\";r=0", "\"api\";r=2"]);
    // Two left on the layer: /free gets them, then the layer's own 429.
    assert_eq!(get("/free").await.remaining(), 1);
    assert_eq!(get("/free").await.remaining(), 0);
    let refused = get("/free").await;
    refused.assert_too_many();
    assert_eq!(refused.header("ratelimit-policy"), Some("\"api\";q=5;w=60"));
    // A refusal by the layer takes nothing from the attribute's limit: it was never checked.
    let c2 = client_from("127.0.0.2");
    let tight2 = Answer::from(c2.get(format!("{base}/tight")).send().await.expect("send")).await;
    assert_eq!(lists(&tight2, "ratelimit")[0], "\"tight\";r=1");
}

#[tokio::test]
async fn a_route_with_its_own_attribute_gets_both_limits_memory() {
    both_limits(&Backend::memory()).await;
}

#[tokio::test]
async fn a_route_with_its_own_attribute_gets_both_limits_redis() {
    both_limits(&Backend::redis()).await;
}

/// Stacked limits on one layer are all or nothing: a request the second refuses takes nothing
/// from the first.
#[tokio::test]
async fn stacked_limits_are_all_or_nothing() {
    let limiter = Backend::memory().limiter(&[]).await;
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::builder()
            .scope("api")
            .num(3)
            .period(Duration::from_secs(60))
            .by("ip")
            .and()
            .num(1)
            .period(Duration::from_secs(60))
            .by("header:x-tenant")
            .limiter(limiter)
            .build()
            .expect("layer"),
    );
    let base = format!("http://{}/", serve_axum(app, "127.0.0.1").await);
    let c = client();
    let tenant = |t: &str| c.get(&base).header("x-tenant", t);
    assert_eq!(statuses(1, || tenant("a")).await, [200]);
    // Tenant a is spent: refused, and the per-ip limit keeps its 2.
    assert_eq!(statuses(3, || tenant("a")).await, [429, 429, 429]);
    assert_eq!(statuses(3, || tenant("b")).await, [200, 429, 429]);
    assert_eq!(statuses(1, || tenant("c")).await, [200]);
    assert_eq!(statuses(1, || tenant("d")).await, [429]);
    // No tenant header: 400 naming it, before any limit is touched.
    let a = Answer::from(c.get(&base).send().await.expect("send")).await;
    assert_eq!(a.status, 400, "{a:?}");
    assert_eq!(a.json()["message"], "header x-tenant must not be empty");
}

/// A router served without `ConnectInfo`: by ip cannot work, and says why (500), never
/// admitting everyone into one bucket.
#[tokio::test]
async fn by_ip_without_connect_info_is_a_500_that_says_why() {
    let limiter = Backend::memory().limiter(&[]).await;
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer(&limiter, "api", Algorithm::Fixed, 5, 60, "ip"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr: SocketAddr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    let a = Answer::from(
        client()
            .get(format!("http://{addr}/"))
            .send()
            .await
            .expect("send"),
    )
    .await;
    assert_eq!(a.status, 500, "{a:?}");
    assert!(
        a.json()["message"]
            .as_str()
            .unwrap()
            .contains("into_make_service_with_connect_info")
    );
}

/// A client that sends a gRPC content type to an HTTP route on a `GET` still gets the HTTP
/// 429, not a (cacheable) gRPC `200`; the store down under deny is a 503.
#[tokio::test]
async fn grpc_content_type_on_get_is_http_and_a_store_down_is_503() {
    let mut backend = Backend::redis();
    let limiter = backend.limiter(&[]).await;
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer(&limiter, "api", Algorithm::Fixed, 1, 60, "ip"));
    let base = format!("http://{}/", serve_axum(app, "127.0.0.1").await);
    let c = client();
    let grpc = || c.get(&base).header("content-type", "application/grpc");
    assert_eq!(statuses(1, grpc).await, [200]);
    Answer::from(grpc().send().await.expect("send"))
        .await
        .assert_too_many();
    let Backend::Redis(server) = &mut backend else {
        unreachable!()
    };
    server.kill();
    assert_eq!(limiter.settings().failure_policy, FailurePolicy::Deny);
    // Another client (the refused one is answered from the blocked-caller cache meanwhile).
    let other = client_from("127.0.0.2");
    let down = Answer::from(other.get(&base).send().await.expect("send")).await;
    assert_eq!(down.status, 503, "{down:?}");
    assert_eq!(down.json()["error"], "rate_limit_unavailable");
}

/// With the legacy fields, a route under both limits reports the tighter one (the lower
/// remaining), once.
#[tokio::test]
async fn legacy_fields_describe_the_tighter_limit() {
    let limiter = Backend::memory()
        .limiter_with(&[], ratelimit_runtime::http::HeaderStyle::Legacy)
        .await;
    let app = Router::new()
        .route("/tight", get(tight))
        .route("/free", get(|| async { "free" }))
        .layer(Extension(limiter.clone()))
        .layer(layer(&limiter, "api", Algorithm::Fixed, 5, 60, "ip"));
    let base = format!("http://{}", serve_axum(app, "127.0.0.1").await);
    let c = client();
    let get = |path: &str| {
        let request = c.get(format!("{base}{path}"));
        async move { Answer::from(request.send().await.expect("send")).await }
    };
    let legacy = |a: &Answer| {
        ["x-ratelimit-limit", "x-ratelimit-remaining"].map(|name| {
            let all: Vec<_> = a.headers.get_all(name).iter().collect();
            assert_eq!(all.len(), 1, "{name}: {a:?}");
            all[0].to_str().unwrap().to_owned()
        })
    };
    let tight = get("/tight").await;
    assert_eq!(tight.status, 200, "{tight:?}");
    assert!(tight.header("ratelimit").is_none(), "{tight:?}");
    assert_eq!(legacy(&tight), ["2", "1"]);
    assert_eq!(legacy(&get("/free").await), ["5", "3"]);
}

/// A layer limit's own failure policy ([`RateLimitLayerBuilder::failure_policy`]) on a Redis
/// that stalls past the timeout, under an `allow` limiter: the limit that says deny answers
/// 503, the one that names none admits, and a layer stacking both answers 503.
///
/// [`RateLimitLayerBuilder::failure_policy`]: ratelimit_runtime::layer::RateLimitLayerBuilder::failure_policy
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_limit_s_own_failure_policy_answers_while_redis_stalls() {
    let server = RedisServer::start();
    let limiter = RateLimiter::builder()
        .store(server.store().await)
        .failure_policy(FailurePolicy::Allow)
        .build()
        .await
        .expect("limiter");
    let limit = || {
        RateLimitLayer::builder()
            .num(100)
            .period(Duration::from_secs(60))
            .by("ip")
            .limiter(limiter.clone())
    };
    let closed = limit()
        .scope("layer_policy_closed")
        .failure_policy(FailurePolicy::Deny)
        .build()
        .expect("layer");
    let open = limit().scope("layer_policy_open").build().expect("layer");
    let both = limit()
        .scope("layer_policy_both_open")
        .and()
        .num(100)
        .period(Duration::from_secs(60))
        .by("ip")
        .scope("layer_policy_both_closed")
        .failure_policy(FailurePolicy::Deny)
        .build()
        .expect("layer");
    let ok = || async { "ok" };
    let app = Router::new()
        .route("/login", get(ok).layer(closed))
        .route("/search", get(ok).layer(open))
        .route("/both", get(ok).layer(both));
    let base = format!("http://{}", serve_axum(app, "127.0.0.1").await);
    let c = client();
    let status = |path: &str| {
        let req = c.get(format!("{base}{path}"));
        async move { Answer::from(req.send().await.expect("send")).await }
    };
    for path in ["/login", "/search", "/both"] {
        assert_eq!(status(path).await.status, 200, "{path} while Redis answers");
    }
    server.pause(Duration::from_secs(2)).await;
    let login = status("/login").await;
    assert_eq!(login.status, 503, "{login:?}");
    assert_eq!(login.json()["error"], "rate_limit_unavailable");
    assert_eq!(status("/search").await.status, 200);
    assert_eq!(status("/both").await.status, 503);
}
