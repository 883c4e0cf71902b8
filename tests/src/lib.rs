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
