//! `wait` on an HTTP handler: refused at `wait` (a handler answers 429 with `Retry-After`).
use ratelimit_runtime::rate_limit;

#[rate_limit(num = 5, time = 1, by = "ip", framework = "axum", wait = "5s")]
async fn handler() -> &'static str {
    "ok"
}

fn main() {}
