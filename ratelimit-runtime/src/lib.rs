//! Rate limits on async functions with one attribute, kept in Redis, Redis Cluster or memory.
//!
//! ```
//! use ratelimit_runtime::{rate_limit, RateLimitError};
//!
//! #[rate_limit(algo = "sliding", num = 3, time = 10, key = "sms:{phone}")]
//! async fn send_sms(phone: &str) -> Result<(), RateLimitError> {
//!     Ok(())
//! }
//! ```
//!
//! See the README for the attribute's arguments, the algorithms, the stores and the HTTP
//! integrations.

pub mod algorithm;
pub mod error;
pub mod http;
pub mod key;
mod limit;
pub mod limiter;
pub mod net;
pub mod policy;
pub mod store;

#[doc(hidden)]
pub mod __private;

pub use error::{ConfigError, RateLimitError, StoreError};
pub use http::UserId;
pub use limiter::{Builder, FailurePolicy, ForwardedHeader, HeaderStyle, RateLimiter, Settings};
pub use net::IpNet;
pub use policy::{Algorithm, Decision, Policy, PolicyError, Verdict};
pub use ratelimit_macros::rate_limit;
#[cfg(feature = "cluster")]
pub use store::RedisClusterStore;
pub use store::{Check, MemoryStore, RedisStore, Store};
