//! Regression tests of issue 10, point 1, over real HTTP on memory and a private Redis: a
//! caller-supplied value equal to another source's value names another bucket, never the same
//! one, and nothing a client sends turns a limit off for other callers.

mod http_support;

use axum::Router;
use axum::routing::get;
use ratelimit_runtime::{RateLimiter, rate_limit};

use http_support::{Backend, client, serve_axum, statuses};

/// A per-IP and a per-device limit of the same size on one handler: before issue 10 a client
/// whose `x-device` equals its own IP named one key twice.
#[rate_limit(num = 10, time = 60, by = "ip")]
#[rate_limit(num = 10, time = 60, by = "header:x-device")]
async fn device() -> &'static str {
    "device"
}

/// Another handler, another caller's limit: it must keep limiting meanwhile.
#[rate_limit(num = 3, time = 60, by = "ip")]
async fn other() -> &'static str {
    "other"
}

fn app(limiter: RateLimiter) -> Router {
    Router::new()
        .route("/device", get(device))
        .route("/other", get(other))
        .layer(axum::Extension(limiter))
}

async fn a_header_equal_to_the_callers_ip_is_its_own_bucket(backend: Backend) {
    let limiter = backend.limiter(&[]).await;
    let addr = serve_axum(app(limiter), "127.0.0.1").await;
    let c = client();
    let url = format!("http://{addr}/device");
    let got = statuses(30, || c.get(&url).header("x-device", "127.0.0.1")).await;
    let admitted = got.iter().filter(|&&s| s == 200).count();
    assert_eq!(admitted, 10, "{backend:?}: {got:?}");
    assert!(got[10..].iter().all(|&s| s == 429), "{backend:?}: {got:?}");
    // A device value that looks like any source's key part changes nothing either.
    for spoof in [
        "ip=127.0.0.1",
        "=127.0.0.1",
        "127.0.0.1}:fixed:10:60000",
        "k=x|ip=1",
    ] {
        let got = statuses(1, || c.get(&url).header("x-device", spoof)).await;
        assert_eq!(
            got,
            [429],
            "{backend:?}: {spoof}: the per-IP limit is spent"
        );
    }
    let other = format!("http://{addr}/other");
    let got = statuses(10, || c.get(&other)).await;
    assert_eq!(
        got.iter().filter(|&&s| s == 200).count(),
        3,
        "{backend:?}: another limit keeps limiting: {got:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_equal_to_the_callers_ip_is_its_own_bucket_memory() {
    a_header_equal_to_the_callers_ip_is_its_own_bucket(Backend::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_equal_to_the_callers_ip_is_its_own_bucket_redis() {
    a_header_equal_to_the_callers_ip_is_its_own_bucket(Backend::redis()).await;
}
