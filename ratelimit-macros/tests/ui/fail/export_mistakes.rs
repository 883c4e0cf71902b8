use ratelimit_runtime::{rate_limit, Quota, RateLimitError};

#[rate_limit(num = 5, time = 60, export = "login-limits")]
async fn not_an_identifier() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(num = 5, time = 60, export = "FIRST")]
#[rate_limit(num = 50, time = "1h", export = "SECOND")]
async fn exported_twice() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(quota = "{plan}", export = "PLAN")]
async fn per_caller_quota(plan: Quota) -> Result<(), RateLimitError> {
    let _ = plan;
    Ok(())
}

trait Login {
    async fn login(&self) -> Result<(), RateLimitError>;
}

struct Service;

impl Login for Service {
    #[rate_limit(num = 5, time = 60, export = "LOGIN")]
    async fn login(&self) -> Result<(), RateLimitError> {
        Ok(())
    }
}

fn main() {}
