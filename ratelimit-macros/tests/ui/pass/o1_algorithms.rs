//! GCRA (with a `burst`) and the sliding counter, alone and stacked with the others; a sliding
//! log at its bound.
#![deny(warnings)]

use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(algo = "gcra", num = 10, time = 1, burst = 20, key = "{user}")]
#[rate_limit(algo = "sliding_counter", num = 100000, time = "1d", key = "{user}")]
#[rate_limit(algo = "sliding", num = 10000, time = "1h", key = "{user}")]
pub async fn api(user: &str) -> Result<(), RateLimitError> {
    let _ = user;
    Ok(())
}

fn main() {
    drop(api("alice"));
}
