//! Methods of `#[async_trait]` impls (which rewrite each method to a boxed future before
//! `#[rate_limit]` runs): `&self`, `&mut self` and `self`, stacked limits, key templates over
//! the receiver, a plain argument and a pattern argument, a trait's default method, `?Send`,
//! and an error type that converts.
#![deny(warnings)]

use async_trait::async_trait;
use ratelimit_runtime::{Quota, RateLimitError, rate_limit};

#[derive(Debug)]
pub enum AppError {
    Limited(RateLimitError),
}

impl From<RateLimitError> for AppError {
    fn from(e: RateLimitError) -> Self {
        AppError::Limited(e)
    }
}

#[async_trait]
pub trait Sender {
    async fn send(&self, phone: &str) -> Result<u32, RateLimitError>;
    async fn send_mut(&mut self, to: String) -> Result<u32, AppError>;
    async fn pair(&self, pair: (u32, String)) -> Result<String, RateLimitError>;
    async fn consume(self) -> Result<String, RateLimitError>
    where
        Self: Sized;

    #[rate_limit(num = 3, time = 1, key = "default:{n}")]
    async fn default_method(&self, n: u32) -> Result<u32, RateLimitError> {
        Ok(n)
    }
}

pub struct Sms {
    tenant: String,
    sent: u32,
    quota: Quota,
}

#[async_trait]
impl Sender for Sms {
    #[rate_limit(algo = "token", num = 5, time = 1, key = "sms:{self.tenant}:{phone}")]
    #[rate_limit(num = 20, time = "1m", key = "sms:{phone}")]
    async fn send(&self, phone: &str) -> Result<u32, RateLimitError> {
        Ok(u32::try_from(phone.len()).unwrap_or(0) + self.sent)
    }

    #[rate_limit(algo = "sliding", num = 3, time = 10, key = "{self.tenant}:{to}")]
    async fn send_mut(&mut self, mut to: String) -> Result<u32, AppError> {
        to.push('!');
        self.sent += 1;
        Ok(self.sent)
    }

    #[rate_limit(num = 2, time = 1, key = "{id}:{name}")]
    async fn pair(&self, (id, name): (u32, String)) -> Result<String, RateLimitError> {
        Ok(format!("{}:{id}:{name}", self.tenant))
    }

    #[rate_limit(num = 1, time = 1, key = "{self.tenant}")]
    async fn consume(self) -> Result<String, RateLimitError> {
        Ok(self.tenant)
    }
}

#[async_trait(?Send)]
pub trait Local {
    async fn local(&self, n: u64) -> Result<u64, RateLimitError>;
    async fn weighted(&self, items: Vec<u8>) -> Result<usize, RateLimitError>;
}

#[async_trait(?Send)]
impl Local for Sms {
    #[rate_limit(num = 2, time = 1, key = "{n}")]
    async fn local(&self, n: u64) -> Result<u64, RateLimitError> {
        Ok(n + u64::from(self.sent))
    }

    /// A cost over the arguments and the receiver, and a quota from the receiver.
    #[rate_limit(algo = "token", num = 4, time = 60, cost = items.len() + usize::from(self.sent > 100))]
    #[rate_limit(quota = "{self.quota}")]
    async fn weighted(&self, items: Vec<u8>) -> Result<usize, RateLimitError> {
        Ok(items.len())
    }
}

fn assert_send<T: Send>(_: &T) {}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut sms = Sms {
        tenant: "acme".to_owned(),
        sent: 0,
        quota: Quota::per_minute(100).unwrap(),
    };
    let fut = sms.send("+100");
    assert_send(&fut);
    assert_eq!(fut.await.unwrap(), 4);
    assert_eq!(sms.send_mut("+1".to_owned()).await.unwrap(), 1);
    assert_eq!(sms.pair((7, "x".to_owned())).await.unwrap(), "acme:7:x");
    assert_eq!(sms.local(1).await.unwrap(), 2);
    assert_eq!(sms.default_method(4).await.unwrap(), 4);
    assert_eq!(sms.weighted(vec![1, 2, 3]).await.unwrap(), 3);
    assert!(sms.weighted(vec![1, 2]).await.unwrap_err().is_limited());
    assert_eq!(sms.weighted(vec![1]).await.unwrap(), 1);
    assert!(matches!(
        sms.weighted(vec![1; 5]).await,
        Err(RateLimitError::CostExceedsCapacity { cost: 5, capacity: 4 })
    ));
    assert_eq!(sms.consume().await.unwrap(), "acme");
}
