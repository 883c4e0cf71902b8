//! Test support: private Redis servers and clusters, captured log events.

pub mod env;
pub mod logs;
pub mod redis_cluster;
pub mod redis_server;
pub mod suite;
