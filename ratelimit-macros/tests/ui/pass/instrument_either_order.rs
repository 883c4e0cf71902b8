//! `#[tracing::instrument]` beside `#[rate_limit]` on a plain function compiles and limits in
//! either order (below, the check runs inside the span; above, before it is entered).
#![deny(warnings)]

use ratelimit_runtime::{RateLimitError, RateLimiter, rate_limit};

#[tracing::instrument]
#[rate_limit(num = 1, time = "1m", key = "{who}")]
async fn above(who: &str) -> Result<String, RateLimitError> {
    Ok(format!("hello {who}"))
}

#[rate_limit(num = 1, time = "1m", key = "{who}")]
#[tracing::instrument(err)]
async fn below(who: &str) -> Result<String, RateLimitError> {
    Ok(format!("hello {who}"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let limiter = RateLimiter::builder().build().await.unwrap();
    limiter
        .scope(async {
            assert_eq!(above("ann").await.unwrap(), "hello ann");
            assert!(above("ann").await.unwrap_err().is_limited());
            assert_eq!(below("ann").await.unwrap(), "hello ann");
            assert!(below("ann").await.unwrap_err().is_limited());
        })
        .await;
}
