//! Helpers shared by the crate's unit tests.

use std::time::Duration;

use super::RateLimiter;
use crate::store::{Check, MemoryStore, Store, StoreFuture, TokioClock};

/// A limiter on a memory store that reads Tokio's clock (so `start_paused` tests control it).
pub(crate) async fn limiter() -> RateLimiter {
    RateLimiter::builder()
        .store(MemoryStore::with_clock(TokioClock::default()))
        .build()
        .await
        .unwrap()
}

/// A memory store on Tokio's clock that says it is not in this process
/// ([`Store::is_local`]): the limiter treats it as a remote store (leases, the blocked-caller
/// cache), while the tests read its exact state.
#[derive(Debug)]
pub(crate) struct RemoteMemory(pub(crate) MemoryStore);

impl RemoteMemory {
    pub(crate) fn new() -> Self {
        Self(MemoryStore::with_clock(TokioClock::default()))
    }
}

impl Store for RemoteMemory {
    fn check<'a>(&'a self, checks: &'a [Check<'a>]) -> StoreFuture<'a> {
        self.0.check(checks)
    }

    fn name(&self) -> &'static str {
        "remote-memory"
    }

    fn take<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> StoreFuture<'a> {
        self.0.take(checks, call_id)
    }

    fn refund<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> StoreFuture<'a, ()> {
        self.0.refund(checks, call_id)
    }

    fn forget<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> StoreFuture<'a, ()> {
        self.0.forget(checks, call_id)
    }

    fn settle<'a>(
        &'a self,
        checks: &'a [Check<'a>],
        call_id: &'a str,
        actual: &'a [u64],
    ) -> StoreFuture<'a, ()> {
        self.0.settle(checks, call_id, actual)
    }

    fn peek<'a>(&'a self, checks: &'a [Check<'a>]) -> StoreFuture<'a> {
        self.0.peek(checks)
    }

    fn reset<'a>(&'a self, keys: &'a [&'a str]) -> StoreFuture<'a, ()> {
        self.0.reset(keys)
    }

    fn block<'a>(&'a self, keys: &'a [&'a str], duration: Duration) -> StoreFuture<'a, ()> {
        self.0.block(keys, duration)
    }
}

/// A limiter on a [`RemoteMemory`] store, without the blocked-caller cache (every call
/// reaches the store's state).
pub(crate) async fn remote_limiter() -> RateLimiter {
    RateLimiter::builder()
        .store(RemoteMemory::new())
        .blocked_cache(0)
        .build()
        .await
        .unwrap()
}
