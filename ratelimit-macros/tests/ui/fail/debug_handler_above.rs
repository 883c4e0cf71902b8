//! `#[axum::debug_handler]` ABOVE `#[rate_limit]` expands first and checks the handler as
//! written, before `#[rate_limit]` adds its hidden `HttpCaller` parameter, so its own check
//! calls the handler with one argument too few: the error points at `#[axum::debug_handler]`.
//! The right order is `#[rate_limit]` first, then `#[axum::debug_handler]`.
//! (These ui tests build the runtime without an HTTP integration, hence the second error.)
use ratelimit_runtime::rate_limit;

#[axum::debug_handler]
#[rate_limit(num = 5, time = 1, by = "ip")]
async fn hello() -> &'static str {
    "hello"
}

fn main() {}
