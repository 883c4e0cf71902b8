//! Regression tests over real HTTP on memory and a private Redis: a caller-supplied value equal
//! to another source's value names another bucket, never the same one (issue 10, point 1);
//! another spelling of the same path is the same bucket (found by the security review); and
//! nothing a client sends turns a limit off for other callers.

mod http_support;

use axum::Router;
use axum::extract::Path;
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

#[rate_limit(num = 2, time = 60, by = "url", framework = "axum")]
async fn file(Path(name): Path<String>) -> String {
    name
}

#[rate_limit(num = 2, time = 60, by = "url", framework = "axum")]
async fn search() -> &'static str {
    "search"
}

fn app(limiter: RateLimiter) -> Router {
    Router::new()
        .route("/device", get(device))
        .route("/other", get(other))
        .route("/files/{name}", get(file))
        .route("/search", get(search))
        .layer(axum::Extension(limiter))
}

/// Axum decodes path parameters: `/files/%72eport` is `/files/report` to the handler, and so to
/// the limit. Before, every spelling was a fresh bucket (6 of 7 served against 2).
async fn every_spelling_of_a_path_is_one_bucket(backend: Backend) {
    let limiter = backend.limiter(&[]).await;
    let addr = serve_axum(app(limiter), "127.0.0.1").await;
    let c = client();
    let spellings = [
        "/files/report",
        "/files/%72eport",
        "/files/r%65port",
        "/files/re%70ort",
        "/files/%72%65port",
        "/%66iles/report",
    ];
    let mut served = 0;
    for path in spellings {
        let r = c
            .get(format!("http://{addr}{path}"))
            .send()
            .await
            .expect("send");
        let ok = r.status() == 200;
        if ok {
            assert_eq!(r.text().await.expect("body"), "report");
            served += 1;
        }
    }
    assert!(served <= 2, "{backend:?}: num = 2 served {served}");
    // Escapes other than unreserved characters keep their meaning; their hex case does not.
    let got = statuses(3, || c.get(format!("http://{addr}/files/a%2fb"))).await;
    let upper = statuses(1, || c.get(format!("http://{addr}/files/a%2Fb"))).await;
    assert_eq!(
        (got, upper),
        (vec![200, 200, 429], vec![429]),
        "{backend:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_a_path_is_one_bucket_memory() {
    every_spelling_of_a_path_is_one_bucket(Backend::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_a_path_is_one_bucket_redis() {
    every_spelling_of_a_path_is_one_bucket(Backend::redis()).await;
}

#[rate_limit(num = 2, time = 60, by = "url", framework = "actix")]
async fn actix_search() -> &'static str {
    "search"
}

/// Actix-web routes on the decoded path: `/%73earch` reaches `/search`'s handler. Before, each
/// spelling was a fresh bucket (9 of 11 served against 2).
#[actix_web::test]
async fn every_spelling_of_a_path_is_one_bucket_on_actix() {
    use actix_web::{App, HttpServer, web};
    let limiter = Backend::memory().limiter(&[]).await;
    let server = HttpServer::new(move || {
        App::new()
            .app_data(limiter.clone())
            .route("/search", web::get().to(actix_search))
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(0)
    .bind(("127.0.0.1", 0))
    .expect("bind");
    let addr = server.addrs()[0];
    actix_web::rt::spawn(server.run());
    let c = client();
    let mut served = 0;
    for path in [
        "/search",
        "/%73earch",
        "/s%65arch",
        "/se%61rch",
        "/sea%72ch",
        "/sear%63h",
        "/searc%68",
        "/%73%65arch",
        "/%73%65%61%72%63%68",
    ] {
        let status = c
            .get(format!("http://{addr}{path}"))
            .send()
            .await
            .expect("send")
            .status();
        served += usize::from(status == 200);
    }
    assert_eq!(served, 2, "num = 2 served {served} spellings of /search");
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
    for spoof in ["ip=127.0.0.1", "=127.0.0.1", "127.0.0.1}:10fm", "k=x|ip=1"] {
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
