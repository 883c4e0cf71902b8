//! The integration tests, in one test binary (issue 23): each of these modules was a binary of
//! its own, each linking axum, actix-web, tonic, reqwest and mlua; one binary links them once.
//! Run one topic with a module filter, e.g.
//! `cargo test -p ratelimit-tests --all-features --test it -- redis_store::`.

mod algorithm_properties;
mod cluster;
mod cold_start;
mod conformance;
mod dynamic_http;
mod dynamic_plain;
mod engines;
mod failure;
mod grpc;
mod hostile_keys;
mod http_actix;
mod http_axum;
mod http_axum_only;
mod layer_axum;
mod layer_tonic;
mod macro_async_trait;
mod macro_attr_order;
mod macro_clippy;
mod macro_plain;
mod memory_store;
mod o1_algorithms;
mod ops;
mod redis_faults;
mod redis_store;
