use ratelimit_runtime::{RateLimitError, rate_limit};

// GCRA's emission interval is whole microseconds: at most one call per µs.
#[rate_limit(algo = "gcra", num = 2000000, time = 1)]
async fn faster_than_a_microsecond() -> Result<(), RateLimitError> {
    Ok(())
}

// burst × ⌈period_µs / num⌉ at most 2^52: 7 a minute (T = 8571429 µs) bounds burst at 525419930.
#[rate_limit(algo = "gcra", num = 7, time = 60, burst = 525419930)]
async fn gcra_at_the_bound() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(algo = "gcra", num = 7, time = 60, burst = 525419931)]
async fn gcra_above_the_bound() -> Result<(), RateLimitError> {
    Ok(())
}

// num × period_ms at most 2^52: a day (86400000 ms) bounds num at 52124995.
#[rate_limit(algo = "sliding_counter", num = 52124995, time = "1d")]
async fn counter_at_the_bound() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(algo = "sliding_counter", num = 52124996, time = "1d")]
async fn counter_above_the_bound() -> Result<(), RateLimitError> {
    Ok(())
}

// `burst` is a bucket's capacity: fine on gcra, not on the sliding counter.
#[rate_limit(algo = "sliding_counter", num = 5, time = 60, burst = 9)]
async fn burst_on_a_counter() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
