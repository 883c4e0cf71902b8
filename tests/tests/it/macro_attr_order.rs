//! Attribute order on Axum handlers, over real HTTP on the memory store and on a private Redis.
//!
//! * `#[rate_limit]` above `#[axum::debug_handler]`, the order that works: `#[rate_limit]`
//!   expands first and `debug_handler` checks the handler it generated (hidden `HttpCaller`
//!   included). The other order is a compile error at `#[axum::debug_handler]`
//!   (`ratelimit-macros/tests/ui/fail/debug_handler_above.rs`).
//! * `#[tracing::instrument]` in either order.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use ratelimit_runtime::rate_limit;
use serde::Deserialize;

use crate::http_support::{Backend, client, serve_axum, statuses};

#[derive(Debug, Clone, Default)]
struct Greeted(Arc<AtomicUsize>);

#[derive(Debug, Deserialize)]
struct Form {
    name: String,
}

#[rate_limit(num = 2, time = 60, by = "ip", key = "hello:{form.name}")]
#[axum::debug_handler]
async fn hello(State(greeted): State<Greeted>, Json(form): Json<Form>) -> String {
    greeted.0.fetch_add(1, Ordering::SeqCst);
    format!("hello {}", form.name)
}

#[tracing::instrument]
#[rate_limit(num = 2, time = 60, by = "ip")]
async fn instrument_above(Path(id): Path<u32>) -> String {
    format!("above {id}")
}

#[rate_limit(num = 2, time = 60, by = "ip")]
#[tracing::instrument]
async fn instrument_below(Path(id): Path<u32>) -> String {
    format!("below {id}")
}

async fn instrument_in_either_order_admits_num_then_429(backend: &Backend) {
    let app = Router::new()
        .route("/above/{id}", get(instrument_above))
        .route("/below/{id}", get(instrument_below))
        .layer(Extension(backend.limiter(&[]).await));
    let base = format!("http://{}", serve_axum(app, "127.0.0.1").await);
    let c = client();
    for side in ["above", "below"] {
        let url = format!("{base}/{side}/7");
        assert_eq!(statuses(3, || c.get(&url)).await, [200, 200, 429], "{side}");
    }
}

#[tokio::test]
async fn instrument_beside_rate_limit_in_either_order_limits_memory() {
    instrument_in_either_order_admits_num_then_429(&Backend::memory()).await;
}

#[tokio::test]
async fn instrument_beside_rate_limit_in_either_order_limits_redis() {
    instrument_in_either_order_admits_num_then_429(&Backend::redis()).await;
}

async fn rate_limit_above_debug_handler_admits_num_then_429(backend: &Backend) {
    let greeted = Greeted::default();
    let app = Router::new()
        .route("/hello", post(hello))
        .layer(Extension(backend.limiter(&[]).await))
        .with_state(greeted.clone());
    let url = format!("http://{}/hello", serve_axum(app, "127.0.0.1").await);
    let c = client();
    let ann = || c.post(&url).json(&serde_json::json!({ "name": "ann" }));
    assert_eq!(statuses(3, ann).await, [200, 200, 429]);
    // The rejected request's body did not run; another key has its own quota.
    assert_eq!(greeted.0.load(Ordering::SeqCst), 2);
    let bob = c
        .post(&url)
        .json(&serde_json::json!({ "name": "bob" }))
        .send()
        .await
        .expect("send");
    assert_eq!(bob.status().as_u16(), 200);
    assert_eq!(bob.text().await.expect("body"), "hello bob");
    assert_eq!(greeted.0.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn rate_limit_above_debug_handler_compiles_and_limits_memory() {
    rate_limit_above_debug_handler_admits_num_then_429(&Backend::memory()).await;
}

#[tokio::test]
async fn rate_limit_above_debug_handler_compiles_and_limits_redis() {
    rate_limit_above_debug_handler_admits_num_then_429(&Backend::redis()).await;
}
