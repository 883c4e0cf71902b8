//! The expansion runs: the third call of a 2-per-minute limit is rejected, and the body of a
//! rejected call does not run.
#![deny(warnings)]

use std::sync::atomic::{AtomicU32, Ordering};

use ratelimit_runtime::{RateLimitError, RateLimiter, rate_limit};

static RUNS: AtomicU32 = AtomicU32::new(0);

#[rate_limit(num = 2, time = "1m", key = "{who}")]
async fn hello(who: &str) -> Result<String, RateLimitError> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(format!("hello {who}"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let limiter = RateLimiter::builder().build().await.unwrap();
    limiter
        .scope(async {
            assert_eq!(hello("ann").await.unwrap(), "hello ann");
            assert!(hello("ann").await.is_ok());
            let err = hello("ann").await.unwrap_err();
            assert!(err.is_limited(), "{err}");
            assert!(hello("bob").await.is_ok());
        })
        .await;
    assert_eq!(RUNS.load(Ordering::SeqCst), 3);
}
