//! `#[rate_limit]` on Axum 0.8 handlers, over real HTTP (a server on a loopback port, reqwest),
//! on the memory store and on a private Redis.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use ratelimit_runtime::{
    RateLimiter, UserId, http::ForwardedHeader, http::HeaderStyle, rate_limit,
};
use serde::Deserialize;

use crate::http_support::{Answer, Backend, client, client_from, scenarios, serve_axum, statuses};

#[derive(Debug, Clone, Default)]
pub struct AppState {
    logins: Arc<AtomicUsize>,
}

#[derive(Debug, Deserialize)]
pub struct LoginForm {
    user: String,
}

#[rate_limit(algo = "sliding", num = 3, time = 10, by = "ip")]
pub async fn login(State(s): State<AppState>, Json(form): Json<LoginForm>) -> impl IntoResponse {
    s.logins.fetch_add(1, Ordering::SeqCst);
    Json(serde_json::json!({ "welcome": form.user }))
}

async fn stats(State(s): State<AppState>) -> String {
    s.logins.load(Ordering::SeqCst).to_string()
}

#[rate_limit(num = 2, time = 60, by = "url")]
async fn by_url() -> &'static str {
    "url"
}

#[rate_limit(num = 2, time = 60, by = "user")]
async fn me(user: UserId) -> String {
    format!("hello {user}")
}

#[rate_limit(num = 2, time = 60, by = "app_id")]
async fn api() -> &'static str {
    "api"
}

#[rate_limit(num = 2, time = 60, by = "header:X-Api-Key")]
async fn keyed() -> &'static str {
    "keyed"
}

#[rate_limit(num = 2, time = 60, by = "ip")]
async fn by_ip() -> &'static str {
    "ip"
}

/// The application's auth layer: a header → `UserId`.
async fn auth(mut req: Request, next: Next) -> Response {
    if let Some(user) = req.headers().get("x-user").and_then(|v| v.to_str().ok()) {
        let user = UserId::new(user);
        req.extensions_mut().insert(user);
    }
    next.run(req).await
}

fn app(limiter: RateLimiter) -> Router {
    Router::new()
        .route("/login", post(login))
        .route("/stats", get(stats))
        .route("/url/{*rest}", get(by_url))
        .route("/me", get(me))
        .route("/api", get(api))
        .route("/keyed", get(keyed))
        .route("/ip", get(by_ip))
        .layer(middleware::from_fn(auth))
        .layer(Extension(limiter))
        .with_state(AppState::default())
}

async fn start(backend: &Backend, proxies: &[&str]) -> String {
    let addr = serve_axum(app(backend.limiter(proxies).await), "127.0.0.1").await;
    format!("http://{addr}")
}

async fn start_behind(backend: &Backend, header: Option<ForwardedHeader>) -> String {
    let limiter = scenarios::limiter_behind_proxy(backend, header).await;
    let addr = serve_axum(app(limiter), "127.0.0.1").await;
    format!("http://{addr}")
}

#[tokio::test]
async fn axum_a_spoofed_forwarded_header_behind_an_xff_proxy_changes_nothing_memory() {
    let b = Backend::memory();
    scenarios::a_spoofed_forwarded_header_behind_an_xff_proxy_changes_nothing(
        &start_behind(&b, None).await,
    )
    .await;
}

#[tokio::test]
async fn axum_a_spoofed_forwarded_header_behind_an_xff_proxy_changes_nothing_redis() {
    let b = Backend::redis();
    scenarios::a_spoofed_forwarded_header_behind_an_xff_proxy_changes_nothing(
        &start_behind(&b, None).await,
    )
    .await;
}

#[tokio::test]
async fn axum_a_spoofed_x_forwarded_for_behind_a_forwarded_proxy_changes_nothing_memory() {
    let b = Backend::memory();
    scenarios::a_spoofed_x_forwarded_for_behind_a_forwarded_proxy_changes_nothing(
        &start_behind(&b, Some(ForwardedHeader::Forwarded)).await,
    )
    .await;
}

#[tokio::test]
async fn axum_a_spoofed_x_forwarded_for_behind_a_forwarded_proxy_changes_nothing_redis() {
    let b = Backend::redis();
    scenarios::a_spoofed_x_forwarded_for_behind_a_forwarded_proxy_changes_nothing(
        &start_behind(&b, Some(ForwardedHeader::Forwarded)).await,
    )
    .await;
}

#[tokio::test]
async fn axum_a_spoofed_forwarded_header_behind_an_x_real_ip_proxy_changes_nothing_memory() {
    let b = Backend::memory();
    scenarios::a_spoofed_forwarded_header_behind_an_x_real_ip_proxy_changes_nothing(
        &start_behind(&b, Some(ForwardedHeader::XRealIp)).await,
    )
    .await;
}

#[tokio::test]
async fn axum_a_spoofed_forwarded_header_behind_an_x_real_ip_proxy_changes_nothing_redis() {
    let b = Backend::redis();
    scenarios::a_spoofed_forwarded_header_behind_an_x_real_ip_proxy_changes_nothing(
        &start_behind(&b, Some(ForwardedHeader::XRealIp)).await,
    )
    .await;
}

#[tokio::test]
async fn axum_card_line_memory() {
    let b = Backend::memory();
    scenarios::card_line(&start(&b, &[]).await).await;
}

#[tokio::test]
async fn axum_card_line_redis() {
    let b = Backend::redis();
    scenarios::card_line(&start(&b, &[]).await).await;
}

#[tokio::test]
async fn axum_sources_memory() {
    let b = Backend::memory();
    scenarios::sources(&start(&b, &[]).await).await;
}

#[tokio::test]
async fn axum_sources_redis() {
    let b = Backend::redis();
    scenarios::sources(&start(&b, &[]).await).await;
}

#[tokio::test]
async fn axum_spoofed_forwarding_headers_change_nothing() {
    let b = Backend::memory();
    scenarios::spoofing_changes_nothing(&start(&b, &[]).await).await;
}

#[tokio::test]
async fn axum_trusted_proxy_right_most_untrusted_hop_memory() {
    let b = Backend::memory();
    scenarios::trusted_proxy_right_most_untrusted_hop(&start(&b, &["127.0.0.1"]).await).await;
}

#[tokio::test]
async fn axum_trusted_proxy_right_most_untrusted_hop_redis() {
    let b = Backend::redis();
    scenarios::trusted_proxy_right_most_untrusted_hop(&start(&b, &["127.0.0.1"]).await).await;
}

#[tokio::test]
async fn axum_ipv6_grouped_by_64() {
    let b = Backend::memory();
    scenarios::ipv6_grouped_by_64(&start(&b, &["127.0.0.1/32"]).await).await;
}

#[tokio::test]
async fn axum_unusual_header_values_memory() {
    let b = Backend::memory();
    scenarios::unusual_header_values(&start(&b, &[]).await).await;
}

#[tokio::test]
async fn axum_unusual_header_values_redis() {
    let b = Backend::redis();
    scenarios::unusual_header_values(&start(&b, &[]).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_concurrent_requests_are_exact_memory() {
    let b = Backend::memory();
    scenarios::concurrent_requests_are_exact(&start(&b, &[]).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_concurrent_requests_are_exact_redis() {
    let b = Backend::redis();
    scenarios::concurrent_requests_are_exact(&start(&b, &[]).await).await;
}

/// One real request over IPv6 loopback: the peer `[::1]` is the key (grouped by /64).
#[tokio::test]
async fn axum_real_ipv6_peer() {
    let b = Backend::memory();
    let Ok(listener) = std::net::TcpListener::bind("[::1]:0") else {
        eprintln!("no IPv6 loopback on this machine: skipped");
        return;
    };
    drop(listener);
    let addr = serve_axum(app(b.limiter(&[]).await), "::1").await;
    let c = client_from("::1");
    let first = Answer::from(c.get(format!("http://{addr}/ip")).send().await.unwrap()).await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.remaining(), 1);
    let got = statuses(2, || c.get(format!("http://{addr}/ip"))).await;
    assert_eq!(got, [200, 429]);
}

/// Served without `into_make_service_with_connect_info`: a 500 that says what to do.
#[tokio::test]
async fn axum_without_connect_info_is_a_500_naming_the_fix() {
    let b = Backend::memory();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = app(b.limiter(&[]).await);
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let c = client();
    for _ in 0..2 {
        let a = Answer::from(c.get(format!("http://{addr}/ip")).send().await.unwrap()).await;
        assert_eq!(a.status, 500, "{a:?}");
        let message = a.json()["message"].as_str().unwrap().to_owned();
        assert!(
            message.contains("into_make_service_with_connect_info::<SocketAddr>()"),
            "{message}"
        );
    }
    // Sources that do not need the peer still work.
    let a = Answer::from(c.get(format!("http://{addr}/url/x")).send().await.unwrap()).await;
    assert_eq!(a.status, 200, "{a:?}");
}

/// `HeaderStyle::Both`: the legacy `X-RateLimit-*` fields next to the IETF ones.
#[tokio::test]
async fn axum_legacy_header_style() {
    let b = Backend::memory();
    let limiter = b
        .limiter_with(
            &[],
            HeaderStyle::Both(ratelimit_runtime::http::IetfDraft::Draft11),
        )
        .await;
    let addr = serve_axum(app(limiter), "127.0.0.1").await;
    let c = client();
    let a = Answer::from(c.get(format!("http://{addr}/ip")).send().await.unwrap()).await;
    assert_eq!(a.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(a.header("x-ratelimit-remaining"), Some("1"));
    let reset: u64 = a.header("x-ratelimit-reset").unwrap().parse().unwrap();
    // A 60 s window's key lives through its expiry millisecond: whole again within 61 s.
    assert!((1..=61).contains(&reset), "{a:?}");
    assert_eq!(a.header("ratelimit-policy"), Some("\"by_ip\";q=2;w=60"));
    let only_legacy = b.limiter_with(&[], HeaderStyle::Legacy).await;
    let addr = serve_axum(app(only_legacy), "127.0.0.1").await;
    let a = Answer::from(c.get(format!("http://{addr}/ip")).send().await.unwrap()).await;
    assert_eq!(a.header("x-ratelimit-remaining"), Some("1"));
    assert_eq!(a.header("ratelimit"), None);
}

/// A dead store under the deny failure policy: 503 with a JSON message; the handler does not
/// run.
#[tokio::test]
async fn axum_store_down_under_deny_is_a_503() {
    let port = ratelimit_tests::redis_server::free_port().unwrap();
    let limiter = RateLimiter::builder()
        .redis_url(format!("redis://127.0.0.1:{port}"))
        .failure_policy(ratelimit_runtime::FailurePolicy::Deny)
        .build_lazy()
        .unwrap();
    let addr = serve_axum(app(limiter), "127.0.0.1").await;
    let c = client();
    let a = Answer::from(
        c.post(format!("http://{addr}/login"))
            .json(&serde_json::json!({"user": "x"}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(a.status, 503, "{a:?}");
    assert_eq!(a.json()["error"], "rate_limit_unavailable");
    let runs = c.get(format!("http://{addr}/stats")).send().await.unwrap();
    assert_eq!(runs.text().await.unwrap(), "0");
}

/// Without an `Extension(RateLimiter)`, handlers use `RateLimiter::current()`: here the
/// process's limiter, which every test of the binary may reach; its counter of this handler's
/// scope and 127.0.0.9 is this test's alone.
#[tokio::test]
async fn axum_without_extension_uses_the_process_limiter() {
    let router = Router::new().route("/ip", get(by_ip));
    let addr = serve_axum(router, "127.0.0.1").await;
    let c = client_from("127.0.0.9");
    let got = statuses(3, || c.get(format!("http://{addr}/ip"))).await;
    assert_eq!(got, [200, 200, 429]);
}

#[rate_limit(
    num = 3,
    time = 60,
    by = "ip",
    scope = "axum_login_closed",
    on_store_error = "deny"
)]
async fn login_closed() -> &'static str {
    "login"
}

#[rate_limit(num = 3, time = 60, by = "ip", scope = "axum_search_open")]
async fn search_open() -> &'static str {
    "search"
}

/// `on_store_error = "deny"` on a handler, while Redis stalls past the timeout under an
/// `allow` limiter: that handler answers 503 with the JSON body, one without the argument is
/// admitted, past its quota of 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_a_handler_s_on_store_error_deny_answers_503_while_redis_stalls() {
    let server = ratelimit_tests::redis_server::RedisServer::start();
    let limiter = RateLimiter::builder()
        .store(server.store().await)
        .failure_policy(ratelimit_runtime::FailurePolicy::Allow)
        .build()
        .await
        .expect("limiter");
    let app = Router::new()
        .route("/login", get(login_closed))
        .route("/search", get(search_open))
        .layer(Extension(limiter));
    let base = format!("http://{}", serve_axum(app, "127.0.0.1").await);
    let c = client();
    assert_eq!(statuses(1, || c.get(format!("{base}/login"))).await, [200]);
    server.pause(std::time::Duration::from_secs(2)).await;
    let login = Answer::from(c.get(format!("{base}/login")).send().await.expect("send")).await;
    assert_eq!(login.status, 503, "{login:?}");
    assert_eq!(login.json()["error"], "rate_limit_unavailable");
    assert_eq!(
        statuses(5, || c.get(format!("{base}/search"))).await,
        [200; 5]
    );
}
