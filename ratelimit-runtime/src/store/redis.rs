//! The Redis store. (Skeleton: filled in by the Redis-store work.)

use super::{Check, Store, StoreFuture};
use crate::error::ConfigError;

/// One Redis server, one `EVALSHA` per check.
#[derive(Debug)]
pub struct RedisStore {}

impl RedisStore {
    /// Parses `url` and connects; loads the scripts.
    pub async fn connect(url: &str) -> Result<Self, ConfigError> {
        let _ = url;
        todo!()
    }

    /// Parses `url`; connects at the first check.
    pub fn lazy(url: &str) -> Result<Self, ConfigError> {
        let _ = url;
        todo!()
    }
}

impl Store for RedisStore {
    fn check<'a>(&'a self, _checks: &'a [Check<'a>]) -> StoreFuture<'a> {
        todo!()
    }

    fn name(&self) -> &'static str {
        "redis"
    }
}
