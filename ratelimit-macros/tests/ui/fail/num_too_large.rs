use ratelimit_runtime::{RateLimitError, rate_limit};

// 2^50 is the largest `num`, `burst` or `cost`: every number the Redis scripts return stays
// exact. One more is refused.
#[rate_limit(num = 1125899906842624, time = 60)]
async fn at_the_bound() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(num = 1125899906842625, time = 60)]
async fn above_the_bound() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(algo = "token", num = 10, time = 60, burst = 1152921504606846976)]
async fn burst_near_2_pow_60() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
