//! The integration tests, in one test binary: each of these modules was a binary of
//! its own, each linking axum, actix-web, tonic, reqwest and mlua; one binary links them once.
//! Run one topic with a module filter, e.g.
//! `cargo test -p ratelimit-tests --all-features --test it -- redis_store::`.
//!
//! Each topic module is `pub`, as each file was a crate root: its `pub` items stay reachable,
//! so the lints see them as before (`macro_clippy` holds the expansion of `pub` items to
//! `clippy::pedantic`). `http_support` is the one copy of the HTTP tests' support, which each
//! of their binaries used to compile for itself.

pub mod algorithm_properties;
pub mod cluster;
pub mod cold_start;
pub mod concurrency;
pub mod concurrency_transports;
pub mod conformance;
pub mod dynamic_http;
pub mod dynamic_plain;
pub mod engines;
pub mod example_servers;
pub mod failover;
pub mod failure;
pub mod grpc;
pub mod grpc_pipeline;
pub mod hostile_keys;
pub mod http_actix;
pub mod http_axum;
pub mod http_axum_only;
mod http_support;
pub mod layer_axum;
pub mod layer_routes;
pub mod layer_tonic;
pub mod lease;
pub mod local_share;
pub mod macro_async_trait;
pub mod macro_attr_order;
pub mod macro_clippy;
pub mod macro_plain;
pub mod memory_store;
pub mod o1_algorithms;
pub mod ops;
pub mod oracle;
pub mod partner;
pub mod redis_faults;
pub mod redis_store;
pub mod settle;
pub mod wait;
