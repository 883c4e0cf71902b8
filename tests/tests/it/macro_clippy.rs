//! Every form of `#[rate_limit]` in a crate that denies `clippy::all` and `clippy::pedantic`:
//! `cargo clippy --workspace --all-targets -- -D warnings` (CI) compiles this file, so a lint
//! the expansion triggers in a user's crate fails the build. The test itself runs the plain
//! forms and mounts the handlers on an Axum router and an Actix-web app.
#![deny(clippy::all, clippy::pedantic)]

use std::fmt::Display;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::response::IntoResponse;
use ratelimit_runtime::{RateLimitError, RateLimiter, UserId, rate_limit};
use serde::Deserialize;

#[derive(Debug)]
pub enum AppError {
    Limited(Duration),
    Unavailable,
}

impl From<RateLimitError> for AppError {
    fn from(e: RateLimitError) -> Self {
        e.retry_after().map_or(Self::Unavailable, Self::Limited)
    }
}

pub type AppResult<T> = Result<T, AppError>;

// ---------------------------------------------------------------- plain mode

#[rate_limit(num = 2, time = 60)]
async fn bare() -> Result<(), RateLimitError> {
    Ok(())
}

/// An owned argument read only by the template, and one with a leading underscore.
#[rate_limit(algo = "sliding", num = 2, time = "10s", key = "sms:{phone}:{_tenant}")]
async fn owned(phone: String, _tenant: u32) -> AppResult<()> {
    Ok(())
}

#[rate_limit(
    algo = "leaky",
    num = 1,
    time = "1m",
    burst = 4,
    cost = 2,
    scope = "leaky.form"
)]
async fn leaky(form: &Form) -> AppResult<usize> {
    Ok(form.user.len())
}

/// Stacked, with a fixed key, braces, nested fields and a tuple index.
#[rate_limit(algo = "token", num = 5, time = 1, key = "{{x}}:{pair.0}")]
#[rate_limit(algo = "fixed", num = 20, time = "1m", key = "fixed")]
#[ratelimit_runtime::rate_limit(num = 100, time = "1d", key = "{form.user}")]
async fn stacked(pair: (u32, u8), form: Form) -> AppResult<u8> {
    Ok(pair.1)
}

#[rate_limit(num = 3, time = "500ms", key = "{item}")]
async fn generic<T>(item: T) -> Result<T, RateLimitError>
where
    T: Display + Send,
{
    Ok(item)
}

#[derive(Debug, Default)]
pub struct Service {
    tenant: String,
    calls: u32,
}

impl Service {
    #[rate_limit(num = 2, time = 60, key = "{self.tenant}:{to}")]
    async fn by_ref(&self, to: &str) -> AppResult<usize> {
        Ok(to.len())
    }

    #[rate_limit(num = 2, time = 60, key = "{self.tenant}")]
    async fn by_mut(&mut self) -> AppResult<u32> {
        self.calls += 1;
        Ok(self.calls)
    }

    #[rate_limit(num = 2, time = 60)]
    async fn by_value(self) -> AppResult<String> {
        Ok(self.tenant)
    }
}

pub trait Notify {
    fn notify(&self, to: &str) -> impl Future<Output = AppResult<()>> + Send;
}

impl Notify for Service {
    #[rate_limit(num = 1, time = 60, key = "{to}")]
    async fn notify(&self, to: &str) -> AppResult<()> {
        let _ = (to, &self.tenant);
        Ok(())
    }
}

// ---------------------------------------------------------------- HTTP mode

#[derive(Debug, Clone, Default)]
pub struct AppState;

#[derive(Debug, Deserialize)]
pub struct Form {
    user: String,
}

#[rate_limit(algo = "sliding", num = 3, time = 10, by = "ip")]
async fn login(State(_s): State<AppState>, Json(form): Json<Form>) -> impl IntoResponse {
    form.user
}

#[rate_limit(num = 2, time = 60, by = "header:X-Api-Key", key = "login:{form.user}")]
#[rate_limit(num = 10, time = "1h", by = "url", framework = "axum")]
async fn keyed(Json(mut form): Json<Form>) -> String {
    form.user.push('!');
    form.user
}

#[rate_limit(num = 2, time = 60, by = "user")]
async fn me(user: UserId) {
    let _ = user;
}

#[rate_limit(num = 2, time = 60, by = "app_id", framework = "actix")]
async fn actix_handler(body: actix_web::web::Json<Form>) -> impl actix_web::Responder {
    body.into_inner().user
}

#[tokio::test]
async fn every_form_compiles_lint_free_and_runs() {
    // The handlers are handlers: Axum and Actix-web accept them.
    let _router: axum::Router = axum::Router::new()
        .route("/login", axum::routing::post(login))
        .route("/keyed", axum::routing::post(keyed))
        .route("/me", axum::routing::get(me))
        .with_state(AppState);
    let _app = actix_web::App::new().route("/a", actix_web::web::post().to(actix_handler));

    let limiter = RateLimiter::builder().build().await.expect("limiter");
    limiter
        .scope(async {
            bare().await.expect("first");
            bare().await.expect("second");
            assert!(bare().await.unwrap_err().is_limited());
            owned("+1".to_owned(), 1).await.expect("admitted");
            let form = Form { user: "ann".into() };
            assert_eq!(leaky(&form).await.expect("admitted"), 3);
            assert_eq!(stacked((1, 2), form).await.expect("admitted"), 2);
            assert_eq!(generic("x").await.expect("admitted"), "x");
            let mut service = Service::default();
            assert_eq!(service.by_ref("abc").await.expect("admitted"), 3);
            assert_eq!(service.by_mut().await.expect("admitted"), 1);
            service.notify("a").await.expect("admitted");
            assert!(matches!(
                service.notify("a").await,
                Err(AppError::Limited(_))
            ));
            assert_eq!(service.by_value().await.expect("admitted"), "");
        })
        .await;
}
