use ratelimit_runtime::{RateLimitError, rate_limit};

// A bucket's level is an integer in units of 1 / (period_µs / gcd(num, period_µs)):
// burst × 60_000_000 / gcd(7, 60_000_000) = burst × 60_000_000 must stay at most 2^52, so a
// burst of 75_059_993 fits and one more does not.
#[rate_limit(algo = "token", num = 7, time = 60, burst = 75059993)]
async fn at_the_bound() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(algo = "leaky", num = 7, time = 60, burst = 75059994)]
async fn above_the_bound() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
