//! An Actix-web server with three rate-limited endpoints:
//!
//! * `POST /login` — the card's line: 3 logins per 10 s per client IP (sliding window);
//! * `GET /api/orders` — 5 calls per minute per application, identified by the `appId` header;
//! * `GET /me` — 2 calls per 10 s per user (token bucket), behind a tiny auth layer that turns
//!   `Authorization: Bearer alice-token` (or `bob-token`) into a `UserId`.
//!
//! ```text
//! cargo run -p ratelimit-examples --bin actix_server
//! curl -i -X POST localhost:8080/login -H 'content-type: application/json' -d '{"user":"alice"}'
//! ```
//!
//! Listens on 127.0.0.1:8080 (`PORT` changes the port). Limits are kept in this process's
//! memory, unless `RATELIMIT_REDIS_URL` (or `REDIS_URL`) is set: then in that Redis.

use std::sync::atomic::{AtomicU64, Ordering};

use actix_web::dev::Service as _;
use actix_web::{App, HttpMessage as _, HttpResponse, HttpServer, Responder, web};
use ratelimit_runtime::{RateLimiter, UserId, rate_limit};
use serde::Deserialize;

#[derive(Debug, Default)]
struct AppState {
    logins: AtomicU64,
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    user: String,
}

/// The card's line: three logins per 10 seconds per client IP.
#[rate_limit(algo = "sliding", num = 3, time = 10, by = "ip")]
async fn login(s: web::Data<AppState>, web::Json(form): web::Json<LoginForm>) -> impl Responder {
    let n = s.logins.fetch_add(1, Ordering::Relaxed) + 1;
    HttpResponse::Ok().json(serde_json::json!({ "welcome": form.user, "logins_so_far": n }))
}

/// Five calls per minute per application (`appId` header).
#[rate_limit(num = 5, time = "1m", by = "app_id")]
async fn orders() -> impl Responder {
    HttpResponse::Ok().json(serde_json::json!({ "orders": [] }))
}

/// Two calls per 10 seconds per signed-in user, refilled continuously.
#[rate_limit(algo = "token", num = 2, time = 10, by = "user")]
async fn me(user: UserId) -> impl Responder {
    HttpResponse::Ok().json(serde_json::json!({ "user": user.as_str() }))
}

/// Serves the example on `listener` until `stop` resolves (the binary passes Ctrl-C or
/// SIGTERM); then lets the requests in flight finish and shuts the limiter down, so that the
/// store counts exactly what this process admitted. Runs on Actix's runtime
/// (`#[actix_web::main]`).
///
/// ```no_run
/// # #[actix_web::main]
/// # async fn main() -> std::io::Result<()> {
/// let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
/// ratelimit_examples::actix_server::serve(listener, async {
///     let _ = tokio::signal::ctrl_c().await;
/// })
/// .await
/// # }
/// ```
pub async fn serve(
    listener: std::net::TcpListener,
    stop: impl std::future::Future<Output = ()> + 'static,
) -> std::io::Result<()> {
    let state = web::Data::new(AppState::default());
    let server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            // The tiny auth layer: a known bearer token becomes a `UserId` in the extensions.
            .wrap_fn(|req, srv| {
                let user = match req
                    .headers()
                    .get("authorization")
                    .map(actix_web::http::header::HeaderValue::as_bytes)
                {
                    Some(b"Bearer alice-token") => Some("alice"),
                    Some(b"Bearer bob-token") => Some("bob"),
                    _ => None,
                };
                if let Some(user) = user {
                    req.extensions_mut().insert(UserId::new(user));
                }
                srv.call(req)
            })
            .route("/login", web::post().to(login))
            .route("/api/orders", web::get().to(orders))
            .route("/me", web::get().to(me))
    })
    .workers(2)
    // `stop` is the signal: Actix's own handlers would stop it on Ctrl-C regardless.
    .disable_signals()
    .listen(listener)?;
    for addr in server.addrs() {
        println!(
            "actix_server listening on http://{addr} (store: {})",
            RateLimiter::current().store().name()
        );
    }
    let server = server.run();
    let handle = server.handle();
    actix_web::rt::spawn(async move {
        stop.await;
        // Stop accepting and wait for the requests in flight.
        handle.stop(true).await;
    });
    server.await?;
    // Drained: the limiter gives back what it holds in leases and finishes its background
    // store calls.
    RateLimiter::current()
        .shutdown(std::time::Duration::from_secs(5))
        .await
        .map_err(std::io::Error::other)?;
    println!("actix_server stopped");
    Ok(())
}
