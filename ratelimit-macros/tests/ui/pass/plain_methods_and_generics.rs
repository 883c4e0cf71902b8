//! Methods (`&self`, `&mut self`, `self`), generics, impl blocks and `async fn` in trait impls.
#![deny(warnings)]

use std::fmt::Display;

use ratelimit_runtime::{RateLimitError, rate_limit};

pub struct Sms {
    tenant: String,
    sent: u32,
}

impl Sms {
    #[rate_limit(num = 5, time = 60, key = "sms:{self.tenant}:{phone}")]
    pub async fn send(&self, phone: &str) -> Result<(), RateLimitError> {
        let _ = phone;
        Ok(())
    }

    #[rate_limit(algo = "token", num = 5, time = 1, key = "{to}")]
    pub async fn send_mut(&mut self, to: &str) -> Result<u32, RateLimitError> {
        self.sent += 1;
        let _ = to;
        Ok(self.sent)
    }

    #[rate_limit(num = 1, time = 1)]
    pub async fn consume(self) -> Result<String, RateLimitError> {
        Ok(self.tenant)
    }
}

pub struct Wrapper<T>(T);

impl<T: Display + Sync> Wrapper<T> {
    #[rate_limit(algo = "sliding", num = 2, time = 1, key = "{self.0}")]
    pub async fn show(&self) -> Result<String, RateLimitError> {
        Ok(self.0.to_string())
    }
}

#[rate_limit(num = 2, time = 1, key = "item:{item}")]
async fn generic<T, U>(item: T, extra: U) -> Result<T, RateLimitError>
where
    T: Display + Send,
    U: Send,
{
    drop(extra);
    Ok(item)
}

pub trait Notifier {
    fn notify(&self, to: &str) -> impl Future<Output = Result<(), RateLimitError>> + Send;
}

impl Notifier for Sms {
    #[rate_limit(num = 3, time = 10, key = "{to}")]
    async fn notify(&self, to: &str) -> Result<(), RateLimitError> {
        let _ = (to, &self.tenant);
        Ok(())
    }
}

fn main() {
    let mut sms = Sms { tenant: "t".into(), sent: 0 };
    drop(sms.send("1"));
    drop(sms.send_mut("1"));
    drop(sms.notify("1"));
    drop(Wrapper(3).show());
    drop(generic(1, ()));
    drop(sms.consume());
}
