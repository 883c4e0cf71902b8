//! Regression tests over real HTTP on memory and a private Redis: a caller-supplied value equal
//! to another source's value names another bucket, never the same one;
//! another spelling of the same path is the same bucket (found by the security review); and
//! nothing a client sends turns a limit off for other callers.

#![allow(
    clippy::duration_suboptimal_units,
    reason = "Duration::from_mins is newer than the workspace's rust-version"
)]

use axum::Router;
use axum::extract::Path;
use axum::routing::get;
use ratelimit_runtime::{RateLimiter, rate_limit};

use crate::http_support::{Backend, client, serve_axum, statuses};

/// A per-IP and a per-device limit of the same size on one handler: without the source in each key part a client
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

// ---------------------------------------------------------------------------------------------
// `by = "url"` under `Router::nest` and Actix-web's `scope`.

#[rate_limit(
    num = 2,
    time = 60,
    by = "url",
    framework = "axum",
    scope = "nested_report"
)]
async fn nested_report() -> &'static str {
    "report"
}

async fn plain_report() -> &'static str {
    "report"
}

/// Two tenants' reports, each twice, then the first again: one bucket per full path.
async fn tenants(url: &str) -> Vec<u16> {
    let c = client();
    let mut out = Vec::new();
    for tenant in ["a", "a", "b", "b", "a"] {
        let r = c
            .get(format!("{url}/t/{tenant}/report"))
            .send()
            .await
            .expect("send");
        out.push(r.status().as_u16());
    }
    out
}

/// `nest` strips its prefix from the URI the handler and a nested router's layer see: every
/// tenant was one bucket (`/t/b/report` got 429 on its first call). Keyed on the URI the
/// client sent, each tenant has its own.
#[tokio::test]
async fn by_url_under_router_nest_keys_the_full_path() {
    use ratelimit_runtime::RateLimitLayer;
    let limiter = Backend::memory().limiter(&[]).await;
    let layer = RateLimitLayer::builder()
        .scope("nested_layer")
        .num(2)
        .period(std::time::Duration::from_secs(60))
        .by("url")
        .limiter(limiter.clone())
        .build()
        .expect("layer");
    let attribute = Router::new()
        .nest(
            "/t/{tenant}",
            Router::new().route("/report", get(nested_report)),
        )
        .layer(axum::Extension(limiter));
    let layered = Router::new().nest(
        "/t/{tenant}",
        Router::new()
            .route("/report", get(plain_report))
            .layer(layer),
    );
    let attribute = serve_axum(attribute, "127.0.0.1").await;
    let layered = serve_axum(layered, "127.0.0.1").await;
    assert_eq!(
        tenants(&format!("http://{attribute}")).await,
        [200, 200, 200, 200, 429],
        "#[rate_limit]"
    );
    assert_eq!(
        tenants(&format!("http://{layered}")).await,
        [200, 200, 200, 200, 429],
        "RateLimitLayer"
    );
}

#[rate_limit(
    num = 2,
    time = 60,
    by = "url",
    framework = "actix",
    scope = "scoped_report"
)]
async fn scoped_report() -> &'static str {
    "report"
}

/// Actix-web's `scope` leaves `uri()` whole (it routes on an offset): each tenant is its own
/// bucket there too.
#[actix_web::test]
async fn by_url_under_an_actix_scope_keys_the_full_path() {
    use actix_web::{App, web};
    let limiter = Backend::memory().limiter(&[]).await;
    let url = crate::http_support::serve_actix!(move || {
        App::new()
            .app_data(limiter.clone())
            .service(web::scope("/t/{tenant}").route("/report", web::get().to(scoped_report)))
    });
    assert_eq!(tenants(&url).await, [200, 200, 200, 200, 429]);
}

// ---------------------------------------------------------------------------------------------
// Path parameters with reserved characters.

#[rate_limit(
    num = 2,
    time = 60,
    by = "url",
    framework = "axum",
    scope = "user_axum"
)]
async fn user_axum(Path(name): Path<String>) -> String {
    name
}

#[rate_limit(
    num = 2,
    time = 60,
    by = "url",
    framework = "actix",
    scope = "user_actix"
)]
async fn user_actix(name: actix_web::web::Path<String>) -> String {
    name.into_inner()
}

/// Spellings of one parameter: `@`, `!`, `+` written plain or escaped reach the handler as the
/// same `alice@x!+`; before, each escape doubled the buckets (4 of 4 served against 2).
const ALICE: [&str; 4] = [
    "/users/alice@x!+",
    "/users/alice%40x!+",
    "/users/alice@x%21%2B",
    "/users/alice%40x%21%2b",
];

async fn alice(url: &str) -> Vec<(u16, String)> {
    let c = client();
    let mut out = Vec::new();
    for path in ALICE {
        let r = c.get(format!("{url}{path}")).send().await.expect("send");
        let status = r.status().as_u16();
        let body = if status == 200 {
            r.text().await.expect("body")
        } else {
            String::new()
        };
        out.push((status, body));
    }
    out
}

fn served_alice() -> Vec<(u16, String)> {
    let ok = (200, "alice@x!+".to_owned());
    vec![ok.clone(), ok, (429, String::new()), (429, String::new())]
}

#[tokio::test]
async fn reserved_characters_in_a_path_parameter_are_one_bucket_on_axum() {
    let limiter = Backend::memory().limiter(&[]).await;
    let app = Router::new()
        .route("/users/{name}", get(user_axum))
        .layer(axum::Extension(limiter));
    let addr = serve_axum(app, "127.0.0.1").await;
    assert_eq!(alice(&format!("http://{addr}")).await, served_alice());
}

#[actix_web::test]
async fn reserved_characters_in_a_path_parameter_are_one_bucket_on_actix() {
    use actix_web::{App, web};
    let limiter = Backend::memory().limiter(&[]).await;
    let url = crate::http_support::serve_actix!(move || {
        App::new()
            .app_data(limiter.clone())
            .route("/users/{name}", web::get().to(user_actix))
    });
    assert_eq!(alice(&url).await, served_alice());
}

mod against_the_extractors {
    use actix_web::test as actix_test;
    use actix_web::{App, web};
    use axum::body::Body;
    use axum::extract::Path;
    use axum::routing::get;
    use proptest::prelude::*;
    use ratelimit_runtime::http::normalized_path;
    use std::fmt::Write as _;
    use tower::ServiceExt as _;

    /// One character of a segment: written as itself when a URI allows it raw, else always
    /// escaped (space, `%`, `/`, `?`, `#`, `"`, non-ASCII).
    fn spell(c: char, escape: bool, upper: bool, out: &mut String) {
        let raw_ok = c.is_ascii_alphanumeric() || "-._~!$&'()*+,;=:@".contains(c);
        if raw_ok && !escape {
            out.push(c);
            return;
        }
        let mut buf = [0; 4];
        for b in c.encode_utf8(&mut buf).bytes() {
            let _ = if upper {
                write!(out, "%{b:02X}")
            } else {
                write!(out, "%{b:02x}")
            };
        }
    }

    fn segment() -> impl Strategy<Value = String> {
        "[a-cA!+@:;=,~%/ ?#\"é._-]{1,6}"
    }

    fn spelling(plain: &str) -> impl Strategy<Value = String> + use<> {
        let plain = plain.to_owned();
        proptest::collection::vec(any::<(bool, bool)>(), plain.chars().count()).prop_map(
            move |flags| {
                let mut out = String::new();
                for (c, (escape, upper)) in plain.chars().zip(flags) {
                    spell(c, escape, upper, &mut out);
                }
                out
            },
        )
    }

    /// Two spellings, of one segment or of two (so that both answers of the property occur).
    fn two_spellings() -> impl Strategy<Value = (String, String)> {
        (segment(), segment(), any::<bool>()).prop_flat_map(|(a, b, same)| {
            let b = if same { a.clone() } else { b };
            (spelling(&a), spelling(&b))
        })
    }

    /// What each framework's `Path<String>` yields for `/u/<segment>` (`None`: not served).
    fn parameters(a: &str, b: &str) -> [(Option<String>, Option<String>); 2] {
        actix_web::rt::System::new().block_on(async {
            let axum_app = axum::Router::new()
                .route("/u/{id}", get(|Path(id): Path<String>| async move { id }));
            let actix_app = actix_test::init_service(App::new().route(
                "/u/{id}",
                web::get().to(|id: web::Path<String>| async move { id.into_inner() }),
            ))
            .await;
            let mut out: [(Option<String>, Option<String>); 2] = Default::default();
            for (i, segment) in [a, b].into_iter().enumerate() {
                let uri = format!("/u/{segment}");
                let request = axum::http::Request::builder()
                    .uri(&uri)
                    .body(Body::empty())
                    .expect("request");
                let response = axum_app.clone().oneshot(request).await.expect("axum");
                let axum_param = if response.status() == 200 {
                    let body = axum::body::to_bytes(response.into_body(), 1 << 16)
                        .await
                        .expect("body");
                    Some(String::from_utf8(body.to_vec()).expect("utf-8"))
                } else {
                    None
                };
                let response = actix_test::call_service(
                    &actix_app,
                    actix_test::TestRequest::get().uri(&uri).to_request(),
                )
                .await;
                let actix_param = if response.status() == 200 {
                    Some(
                        String::from_utf8(actix_test::read_body(response).await.to_vec())
                            .expect("utf-8"),
                    )
                } else {
                    None
                };
                if i == 0 {
                    out[0].0 = axum_param;
                    out[1].0 = actix_param;
                } else {
                    out[0].1 = axum_param;
                    out[1].1 = actix_param;
                }
            }
            out
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Two spellings of a parameter are one `by = "url"` key exactly when the framework's
        /// `Path` extractor yields one parameter for them, on Axum and on Actix-web (a segment's
        /// `%2F` is no exception here: a raw `/` is another route).
        #[test]
        fn one_key_exactly_when_the_extractor_yields_one_parameter((a, b) in two_spellings()) {
            let key = |s: &str| normalized_path(format!("/u/{s}").as_bytes()).into_owned();
            let same_key = key(&a) == key(&b);
            for (framework, (pa, pb)) in ["axum", "actix"].into_iter().zip(parameters(&a, &b)) {
                if let (Some(pa), Some(pb)) = (pa, pb) {
                    prop_assert_eq!(
                        same_key,
                        pa == pb,
                        "{}: {:?} → {:?}, {:?} → {:?}",
                        framework, a, pa, b, pb
                    );
                }
            }
        }
    }
}
