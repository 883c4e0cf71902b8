//! Test support: private Redis servers and clusters.

pub mod env;
pub mod redis_cluster;
pub mod redis_server;
pub mod suite;
