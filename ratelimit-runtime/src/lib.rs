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
#[doc(hidden)] // its items are re-exported at the root
pub mod error;
pub mod http;
pub mod key;
mod limit;
#[doc(hidden)] // its items are re-exported at the root
pub mod limiter;
#[doc(hidden)] // its items are re-exported at the root
pub mod net;
#[doc(hidden)] // its items are re-exported at the root
pub mod policy;
pub mod store;

#[doc(hidden)]
pub mod __private;

pub use error::{ConfigError, RateLimitError, StoreError};
pub use http::settings::{ForwardedHeader, HeaderStyle};
pub use http::user::UserId;
pub use limiter::{Builder, FailurePolicy, RateLimiter, Settings};
pub use net::{IpNet, IpNetParseError};
pub use policy::{
    Algorithm, Decision, MAX_BUCKET_SCALE, MAX_UNITS, Policy, PolicyError, Verdict,
};
pub use ratelimit_macros::rate_limit;
#[cfg(feature = "cluster")]
pub use store::RedisClusterStore;
pub use store::{Check, MemoryStore, RedisStore, Store};
