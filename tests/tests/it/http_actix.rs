//! `#[rate_limit]` on Actix-web 4 handlers, over real HTTP (a server on a loopback port,
//! reqwest), on the memory store and on a private Redis.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use actix_web::dev::Service as _;
use actix_web::{App, HttpMessage as _, HttpResponse, HttpServer, Responder, web};
use ratelimit_runtime::{RateLimiter, UserId, http::ForwardedHeader, rate_limit};
use serde::Deserialize;

use crate::http_support::{Answer, Backend, client, scenarios, statuses};

#[derive(Debug, Clone, Default)]
pub struct AppState {
    logins: Arc<AtomicUsize>,
}

#[derive(Debug, Deserialize)]
pub struct LoginForm {
    user: String,
}

#[rate_limit(algo = "sliding", num = 3, time = 10, by = "ip")]
pub async fn login(
    s: web::Data<AppState>,
    web::Json(form): web::Json<LoginForm>,
) -> impl Responder {
    s.logins.fetch_add(1, Ordering::SeqCst);
    HttpResponse::Ok().json(serde_json::json!({ "welcome": form.user }))
}

async fn stats(s: web::Data<AppState>) -> String {
    s.logins.load(Ordering::SeqCst).to_string()
}

#[rate_limit(num = 2, time = 60, by = "url", framework = "actix")]
async fn by_url() -> &'static str {
    "url"
}

/// Does not take the `UserId`: the limiter itself answers 401 when it is missing.
#[rate_limit(num = 2, time = 60, by = "user")]
async fn me() -> &'static str {
    "me"
}

#[rate_limit(num = 2, time = 60, by = "app_id")]
async fn api(path: web::Path<()>) -> &'static str {
    let () = path.into_inner();
    "api"
}

#[rate_limit(num = 2, time = 60, by = "header:x-api-key")]
async fn keyed() -> &'static str {
    "keyed"
}

#[rate_limit(num = 2, time = 60, by = "ip")]
async fn by_ip() -> &'static str {
    "ip"
}

/// Under Actix's routing macro (which must come first).
#[actix_web::get("/routed")]
#[rate_limit(num = 2, time = 60, by = "ip")]
async fn routed() -> &'static str {
    "routed"
}

/// Starts a server with `limiter` (as plain app data, or wrapped in `web::Data` when
/// `as_data`) on 127.0.0.1:0; returns its base URL.
fn start_with(limiter: RateLimiter, as_data: bool) -> String {
    let state = web::Data::new(AppState::default());
    let server = HttpServer::new(move || {
        let app = App::new()
            .app_data(state.clone())
            // The application's auth layer: a header → `UserId`.
            .wrap_fn(|req, srv| {
                if let Some(user) = req
                    .headers()
                    .get("x-user")
                    .and_then(|v| v.to_str().ok())
                    .map(UserId::new)
                {
                    req.extensions_mut().insert(user);
                }
                srv.call(req)
            })
            .route("/login", web::post().to(login))
            .route("/stats", web::get().to(stats))
            .route("/url/{tail:.*}", web::get().to(by_url))
            .route("/me", web::get().to(me))
            .route("/api", web::get().to(api))
            .route("/keyed", web::get().to(keyed))
            .route("/ip", web::get().to(by_ip))
            .service(routed);
        if as_data {
            app.app_data(web::Data::new(limiter.clone()))
        } else {
            app.app_data(limiter.clone())
        }
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

async fn start(backend: &Backend, proxies: &[&str]) -> String {
    start_with(backend.limiter(proxies).await, false)
}

async fn start_behind(backend: &Backend, header: Option<ForwardedHeader>) -> String {
    start_with(
        scenarios::limiter_behind_proxy(backend, header).await,
        false,
    )
}

#[actix_web::test]
async fn actix_a_spoofed_forwarded_header_behind_an_xff_proxy_changes_nothing_memory() {
    let b = Backend::memory();
    scenarios::a_spoofed_forwarded_header_behind_an_xff_proxy_changes_nothing(
        &start_behind(&b, None).await,
    )
    .await;
}

#[actix_web::test]
async fn actix_a_spoofed_forwarded_header_behind_an_xff_proxy_changes_nothing_redis() {
    let b = Backend::redis();
    scenarios::a_spoofed_forwarded_header_behind_an_xff_proxy_changes_nothing(
        &start_behind(&b, None).await,
    )
    .await;
}

#[actix_web::test]
async fn actix_a_spoofed_x_forwarded_for_behind_a_forwarded_proxy_changes_nothing_memory() {
    let b = Backend::memory();
    scenarios::a_spoofed_x_forwarded_for_behind_a_forwarded_proxy_changes_nothing(
        &start_behind(&b, Some(ForwardedHeader::Forwarded)).await,
    )
    .await;
}

#[actix_web::test]
async fn actix_a_spoofed_x_forwarded_for_behind_a_forwarded_proxy_changes_nothing_redis() {
    let b = Backend::redis();
    scenarios::a_spoofed_x_forwarded_for_behind_a_forwarded_proxy_changes_nothing(
        &start_behind(&b, Some(ForwardedHeader::Forwarded)).await,
    )
    .await;
}

#[actix_web::test]
async fn actix_a_spoofed_forwarded_header_behind_an_x_real_ip_proxy_changes_nothing_memory() {
    let b = Backend::memory();
    scenarios::a_spoofed_forwarded_header_behind_an_x_real_ip_proxy_changes_nothing(
        &start_behind(&b, Some(ForwardedHeader::XRealIp)).await,
    )
    .await;
}

#[actix_web::test]
async fn actix_a_spoofed_forwarded_header_behind_an_x_real_ip_proxy_changes_nothing_redis() {
    let b = Backend::redis();
    scenarios::a_spoofed_forwarded_header_behind_an_x_real_ip_proxy_changes_nothing(
        &start_behind(&b, Some(ForwardedHeader::XRealIp)).await,
    )
    .await;
}

#[actix_web::test]
async fn actix_card_line_memory() {
    let b = Backend::memory();
    scenarios::card_line(&start(&b, &[]).await).await;
}

#[actix_web::test]
async fn actix_card_line_redis() {
    let b = Backend::redis();
    scenarios::card_line(&start(&b, &[]).await).await;
}

#[actix_web::test]
async fn actix_sources_memory() {
    let b = Backend::memory();
    scenarios::sources(&start(&b, &[]).await).await;
}

#[actix_web::test]
async fn actix_sources_redis() {
    let b = Backend::redis();
    scenarios::sources(&start(&b, &[]).await).await;
}

#[actix_web::test]
async fn actix_sources_with_web_data_limiter() {
    let b = Backend::memory();
    scenarios::sources(&start_with(b.limiter(&[]).await, true)).await;
}

#[actix_web::test]
async fn actix_spoofed_forwarding_headers_change_nothing() {
    let b = Backend::memory();
    scenarios::spoofing_changes_nothing(&start(&b, &[]).await).await;
}

#[actix_web::test]
async fn actix_trusted_proxy_right_most_untrusted_hop_memory() {
    let b = Backend::memory();
    scenarios::trusted_proxy_right_most_untrusted_hop(&start(&b, &["127.0.0.1"]).await).await;
}

#[actix_web::test]
async fn actix_trusted_proxy_right_most_untrusted_hop_redis() {
    let b = Backend::redis();
    scenarios::trusted_proxy_right_most_untrusted_hop(&start(&b, &["127.0.0.1"]).await).await;
}

#[actix_web::test]
async fn actix_ipv6_grouped_by_64() {
    let b = Backend::memory();
    scenarios::ipv6_grouped_by_64(&start(&b, &["127.0.0.0/8"]).await).await;
}

#[actix_web::test]
async fn actix_unusual_header_values_memory() {
    let b = Backend::memory();
    scenarios::unusual_header_values(&start(&b, &[]).await).await;
}

#[actix_web::test]
async fn actix_unusual_header_values_redis() {
    let b = Backend::redis();
    scenarios::unusual_header_values(&start(&b, &[]).await).await;
}

/// The legacy fields and the policy name on Actix too.
#[actix_web::test]
async fn actix_rate_limit_fields_name_the_handler() {
    let b = Backend::memory();
    let base = start(&b, &[]).await;
    let c = client();
    let a = Answer::from(c.get(format!("{base}/ip")).send().await.unwrap()).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.header("ratelimit-policy"), Some("\"by_ip\";q=2;w=60"));
    assert_eq!(a.remaining(), 1);
    assert_eq!(
        statuses(2, || c.get(format!("{base}/ip"))).await,
        [200, 429]
    );
}

#[actix_web::test]
async fn actix_routing_macro_above_the_attribute() {
    let b = Backend::memory();
    let base = start(&b, &[]).await;
    let c = client();
    let first = Answer::from(c.get(format!("{base}/routed")).send().await.unwrap()).await;
    assert_eq!((first.status, first.body.as_str()), (200, "routed"));
    assert_eq!(
        first.header("ratelimit-policy"),
        Some("\"routed\";q=2;w=60")
    );
    assert_eq!(
        statuses(2, || c.get(format!("{base}/routed"))).await,
        [200, 429]
    );
}

#[actix_web::test]
async fn actix_concurrent_requests_are_exact_redis() {
    let b = Backend::redis();
    scenarios::concurrent_requests_are_exact(&start(&b, &[]).await).await;
}
