//! The expansion's own names cannot clash with the user's: parameters and locals named like
//! the generated ones still mean the user's values.
#![deny(warnings)]

use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(num = 5, time = 60, key = "{__ratelimit_key0}:{__ratelimit_error}")]
async fn clash(
    __ratelimit_key0: &str,
    __ratelimit_error: u32,
) -> Result<String, RateLimitError> {
    #[allow(non_upper_case_globals)]
    static __RATELIMIT_LIMITS: &str = "mine";
    Ok(format!("{__ratelimit_key0}{__ratelimit_error}{__RATELIMIT_LIMITS}"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let limiter = ratelimit_runtime::RateLimiter::builder().build().await.unwrap();
    let out = limiter.scope(clash("a", 1)).await.unwrap();
    assert_eq!(out, "a1mine");
}
