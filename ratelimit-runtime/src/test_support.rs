//! Helpers shared by the crate's unit tests.

use crate::limiter::RateLimiter;
use crate::store::{MemoryStore, TokioClock};

/// A limiter on a memory store that reads Tokio's clock (so `start_paused` tests control it).
pub(crate) async fn limiter() -> RateLimiter {
    RateLimiter::builder()
        .store(MemoryStore::with_clock(TokioClock::default()))
        .build()
        .await
        .unwrap()
}
