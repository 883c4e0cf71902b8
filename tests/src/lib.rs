//! Test support: private Redis servers and clusters, captured log events.

pub mod env;
pub mod logs;
pub mod redis_cluster;
pub mod redis_server;
pub mod suite;

/// Held by the tests that saturate both cores for a moment (several processes or many tasks
/// calling flat out: the lease tests) and by the tests that a stalled machine breaks: the
/// cluster client gives up on a reply after 1 s and sends the script again, so a take held up
/// that long runs twice and a cross-slot refund gives back one of the two units. They never
/// run at once.
pub static SATURATING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits until `settled` answers `true`, polling every 10 ms, for at most `within`; the test's
/// own assertions follow and say what is wrong if it never does. For background work whose end
/// a test cannot await (a lease's units given back): a fixed sleep alone bets on the machine's
/// speed.
pub async fn settle(within: std::time::Duration, mut settled: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !settled() && start.elapsed() < within {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
