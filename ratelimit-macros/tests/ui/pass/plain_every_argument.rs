//! Every argument in plain mode, every algorithm, every `time` form, fixed keys and templates.
#![deny(warnings)]

use ratelimit_runtime::{RateLimitError, rate_limit};

#[derive(Debug)]
pub enum AppError {
    RateLimited(RateLimitError),
}

impl From<RateLimitError> for AppError {
    fn from(e: RateLimitError) -> Self {
        Self::RateLimited(e)
    }
}

pub type AppResult<T> = Result<T, AppError>;

pub struct Form {
    pub phone: String,
    pub pair: (u32, &'static str),
}

#[rate_limit(num = 10, time = 60)]
async fn defaults() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(algo = "fixed", num = 3, time = "500ms", key = "login")]
async fn fixed(user: &str) -> Result<usize, AppError> {
    Ok(user.len())
}

#[rate_limit(algo = "sliding", num = 3, time = "10s", key = "sms:{phone}", scope = "sms/v1.send-code")]
async fn sliding(phone: String) -> AppResult<String> {
    Ok(phone)
}

#[rate_limit(algo = "leaky", num = 2, time = "1m", burst = 10, cost = 5, key = "{{literal}}:{form.phone}:{form.pair.0}")]
async fn leaky(form: &Form) -> AppResult<()> {
    let _ = form.pair.1;
    Ok(())
}

#[rate_limit(algo = "token", num = 5, time = "1h", burst = 20, cost = 2, by = "global")]
async fn token() -> Result<(), AppError> {
    Ok(())
}

#[rate_limit(num = 1000, time = "1d", key = "{n}-{flag}")]
async fn day(n: u64, flag: bool) -> Result<bool, RateLimitError> {
    Ok(flag && n > 0)
}

fn main() {
    let form = Form { phone: "1".into(), pair: (1, "a") };
    drop(defaults());
    drop(fixed("a"));
    drop(sliding("+1555".to_owned()));
    drop(leaky(&form));
    drop(token());
    drop(day(1, true));
}
