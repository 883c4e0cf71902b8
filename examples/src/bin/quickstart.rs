//! Quick start: an SMS sender that may text each phone number at most 3 times a minute and
//! 10 times a day.
//!
//! ```text
//! cargo run -p ratelimit-examples --bin quickstart
//! ```
//!
//! Limits are kept in this process's memory, unless `RATELIMIT_REDIS_URL` (or `REDIS_URL`) is
//! set, e.g. `RATELIMIT_REDIS_URL=redis://127.0.0.1:6379`: then they are kept in Redis and
//! shared by every process using it (run the demo twice within a minute to see).

use std::time::Duration;

use ratelimit_runtime::{RateLimitError, RateLimiter, rate_limit};

/// What sending can fail with. `From<RateLimitError>` is all `#[rate_limit]` needs.
#[derive(Debug)]
enum SmsError {
    TooManyCodes { retry_after: Duration, limit: u64 },
    LimiterUnavailable,
}

impl From<RateLimitError> for SmsError {
    fn from(e: RateLimitError) -> Self {
        match e {
            RateLimitError::Limited {
                retry_after, limit, ..
            } => Self::TooManyCodes { retry_after, limit },
            _ => Self::LimiterUnavailable,
        }
    }
}

struct SmsSender;

impl SmsSender {
    /// Texts a login code. Both limits apply; a call either limit rejects counts for neither.
    #[rate_limit(num = 3, time = "1m", key = "sms:{phone}")]
    #[rate_limit(num = 10, time = "1d", key = "sms:{phone}")]
    async fn send_code(&self, phone: &str) -> Result<(), SmsError> {
        println!("    (texting a code to {phone})");
        Ok(())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let store = RateLimiter::current().store().name();
    let from = ["RATELIMIT_REDIS_URL", "REDIS_URL"]
        .into_iter()
        .find(|var| std::env::var(var).is_ok_and(|v| !v.trim().is_empty()));
    match from {
        Some(var) => println!("store: {store} (from {var})"),
        None => println!("store: {store} (set RATELIMIT_REDIS_URL or REDIS_URL to use Redis)"),
    }
    println!("limits: 3 codes per phone per minute, 10 per phone per day\n");

    let sms = SmsSender;
    let calls = [
        "+15550100",
        "+15550100",
        "+15550100",
        "+15550100",
        "+15550199",
        "+15550100",
    ];
    for (i, phone) in calls.into_iter().enumerate() {
        match sms.send_code(phone).await {
            Ok(()) => println!("call {}: {phone} admitted", i + 1),
            Err(SmsError::TooManyCodes { retry_after, limit }) => println!(
                "call {}: {phone} LIMITED ({limit} allowed; retry in {:.1}s)",
                i + 1,
                retry_after.as_secs_f64()
            ),
            Err(SmsError::LimiterUnavailable) => {
                println!(
                    "call {}: {phone} refused: the rate-limit store is down",
                    i + 1
                );
            }
        }
    }
}
