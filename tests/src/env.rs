//! Where an end-to-end scenario of `#[rate_limit]` runs: the memory store on a manual clock, or
//! a private Redis.
#![allow(
    clippy::missing_panics_doc,
    reason = "test support: a limiter that cannot be built fails the test"
)]

use std::time::Duration;

use ratelimit_runtime::store::ManualClock;
use ratelimit_runtime::{MemoryStore, RateLimiter};

use crate::redis_server::RedisServer;

/// The store a scenario's limiter uses; keeps the Redis server alive while the test holds it.
#[derive(Debug)]
pub enum Env {
    /// The memory store, on this clock.
    Memory(ManualClock),
    /// A private Redis (killed when dropped).
    Redis(RedisServer),
}

impl Env {
    /// A limiter on a memory store with a manual clock.
    pub async fn memory() -> (RateLimiter, Self) {
        let clock = ManualClock::new();
        let limiter = RateLimiter::builder()
            .store(MemoryStore::with_clock(clock.clone()))
            .build()
            .await
            .expect("memory limiter");
        (limiter, Self::Memory(clock))
    }

    /// A limiter on a private Redis, with a generous timeout (the machine is shared).
    pub async fn redis() -> (RateLimiter, Self) {
        let server = RedisServer::start();
        let limiter = RateLimiter::builder()
            .redis_url(server.url())
            .timeout(Duration::from_secs(2))
            .build()
            .await
            .expect("redis limiter");
        (limiter, Self::Redis(server))
    }

    /// Lets `d` pass: the manual clock moves, or the test sleeps (Redis answers `retry_after`
    /// from its own clock, rounded to the millisecond: 2 ms more).
    pub async fn wait(&self, d: Duration) {
        match self {
            Self::Memory(clock) => clock.advance(d),
            Self::Redis(_) => tokio::time::sleep(d + Duration::from_millis(2)).await,
        }
    }

    /// Whether time is exact here (the manual clock).
    pub fn exact(&self) -> bool {
        matches!(self, Self::Memory(_))
    }
}

/// The paths an exemption predicate saw, in order.
pub type SeenPaths = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// A memory limiter whose exemption predicate is written for an HTTP landing page
/// (`caller.path() == "/"`) and records every path it sees.
pub async fn root_path_exempt() -> (RateLimiter, SeenPaths) {
    let seen = SeenPaths::default();
    let paths = std::sync::Arc::clone(&seen);
    let limiter = RateLimiter::builder()
        .memory()
        .exempt_when(move |caller| {
            paths.lock().unwrap().push(caller.path().to_owned());
            caller.path() == "/"
        })
        .build()
        .await
        .expect("limiter");
    (limiter, seen)
}
