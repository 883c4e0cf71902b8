#![warn(missing_docs)] // every public item is documented; keep it so
//! Rate limits on async functions with one attribute, kept in memory, Redis or Redis Cluster.
//!
//! ```
//! use ratelimit_runtime::{rate_limit, RateLimitError};
//!
//! // At most 3 codes per phone number in any 10 seconds.
//! #[rate_limit(algo = "sliding", num = 3, time = 10, key = "sms:{phone}")]
//! async fn send_sms(phone: &str) -> Result<(), RateLimitError> {
//!     Ok(())
//! }
//! ```
//!
//! The attribute works on plain async functions and methods, on Axum handlers (feature `axum`)
//! and on Actix-web handlers (feature `actix`). Its arguments are listed on [`rate_limit`];
//! mistakes in them are compile errors at the offending token.
//!
//! # A plain function
//!
//! A limited function returns `Result<T, E>` with `E: From<RateLimitError>`. A rejected call
//! returns the error without running the body; the error tells "limited" (with the wait) from
//! "store unavailable".
//!
//! ```
//! use ratelimit_runtime::{rate_limit, RateLimitError};
//!
//! struct Sms;
//!
//! impl Sms {
//!     // Two limits on one method, checked together: 5 per second and 20 per minute.
//!     #[rate_limit(algo = "token", num = 5, time = 1, key = "{phone}")]
//!     #[rate_limit(num = 20, time = "1m", key = "{phone}")]
//!     async fn send(&self, phone: &str) -> Result<(), RateLimitError> {
//!         Ok(()) // text the code
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let sms = Sms;
//! for _ in 0..5 {
//!     assert!(sms.send("+15550100").await.is_ok());
//! }
//! let err = sms.send("+15550100").await.unwrap_err();
//! assert!(err.is_limited());
//! assert!(err.retry_after().is_some());
//! // Another caller has a bucket of its own.
//! assert!(sms.send("+15550199").await.is_ok());
//! # }
//! ```
//!
//! # An Axum handler
//!
//! With an HTTP `by` (`"ip"`, `"url"`, `"user"`, `"app_id"`, `"header:<name>"`) the function
//! becomes a handler: a hidden extractor goes in front of its own parameters (so `State`,
//! `Path`, `Json` keep working) and a rejected request gets a 429 with `Retry-After` and the
//! `RateLimit` headers. `by = "ip"` needs the peer address, so serve the router with
//! `into_make_service_with_connect_info`:
//!
//! ```no_run
//! # #[cfg(feature = "axum")]
//! # mod demo {
//! use std::net::SocketAddr;
//!
//! use axum::{Router, extract::State, routing::post};
//! use ratelimit_runtime::{RateLimiter, rate_limit};
//!
//! #[derive(Clone, Default)]
//! struct App;
//!
//! #[rate_limit(algo = "sliding", num = 3, time = 10, by = "ip")]
//! async fn login(State(_app): State<App>, user: String) -> String {
//!     format!("welcome {user}")
//! }
//!
//! pub async fn serve() -> Result<(), Box<dyn std::error::Error>> {
//!     RateLimiter::builder().build().await?.install()?;
//!     let app = Router::new().route("/login", post(login)).with_state(App);
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//!     axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//!     Ok(())
//! }
//! # }
//! # fn main() {}
//! ```
//!
//! Actix-web handlers take the same attribute, below the routing macro (`#[post("/login")]`
//! first, then `#[rate_limit(...)]`). The [`http`] module lists what each `by` reads and what
//! the responses carry.
//!
//! The methods of a tonic 0.14 gRPC service (feature `tonic`) take the same attribute: with
//! `by = "ip"`, `"header:<name>"`, `"app_id"` or `"user"` on a method of a
//! `#[tonic::async_trait]` impl that takes a `tonic::Request<T>`, the caller is read from that
//! request and a refused call returns `RESOURCE_EXHAUSTED` with `retry-after` and the
//! `RateLimit` fields in its metadata. The [`grpc`] module has the details.
//!
//! **Behind a reverse proxy**, `by = "ip"` sees the proxy's address until you name the proxies
//! with [`Builder::trusted_proxies`]. No forwarding header is believed from any other peer,
//! and only the one header your proxies set ([`Builder::forwarded_header`]) is read: a header
//! that a client can send through your proxy untouched would let it pick its own bucket.
//!
//! # Redis
//!
//! Without setup, limits live in this process's memory ([`MemoryStore`]): several instances of
//! an application then each have their own. To share them, install a limiter on Redis once, at
//! start; a malformed URL or an unreachable server is an `Err` there, not a panic:
//!
//! ```no_run
//! use std::time::Duration;
//! use ratelimit_runtime::{FailurePolicy, RateLimiter};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), ratelimit_runtime::ConfigError> {
//! RateLimiter::builder()
//!     .redis_url("redis://:secret@127.0.0.1:6379/0")
//!     .prefix("myapp")                        // keys: myapp:{<scope>:<caller>}:<limit>
//!     .timeout(Duration::from_millis(50))     // the longest wait for Redis on one check
//!     .failure_policy(FailurePolicy::Allow)   // what a call gets while Redis fails
//!     .build()
//!     .await?
//!     .install()?;
//! # Ok(()) }
//! ```
//!
//! When no limiter was installed, the first check reads `RATELIMIT_REDIS_URL`, then
//! `REDIS_URL` (and, with the `cluster` feature, `RATELIMIT_REDIS_CLUSTER_NODES` before them),
//! and keeps limits in memory when none is set, saying so in one warning. A Redis Cluster is a
//! `Builder::redis_cluster` away (feature `cluster`); `rediss://` URLs need the feature `tls`.
//! Each check is one script in one round trip, whatever the number of stacked limits.
//!
//! # Algorithms
//!
//! | `algo` | rule |
//! | --- | --- |
//! | `fixed` (default) | at most `num` calls per window; the window starts at the first call and lasts `time` |
//! | `sliding` | at most `num` calls in any trailing interval of length `time` (`num` ≤ 10,000) |
//! | `sliding_counter` | two aligned windows' counts, the previous weighted by its share of the trailing interval: O(1), approximate (at most `num` per window, up to `2·num` in a trailing interval at worst) |
//! | `leaky` | a bucket of `burst` (default `num`), empty at start, draining at `num / time` |
//! | `token` | a bucket of `burst`, full at start, refilled at `num / time` |
//! | `gcra` | the token bucket as one integer (the theoretical arrival time), one unit per `time / num` |
//! | `concurrency` | not a rate: at most `num` calls in flight, each slot released when its call ends in any way; `time` is a slot's lease, after which a slot nobody released (a killed process) comes back |
//!
//! Every store is exact under any concurrency, reads time from its own clock (never the
//! caller's), and answers each limit with a [`Decision`]: admitted or not, `remaining`,
//! `reset_after` and, when rejected, `retry_after`. A call that any stacked limit rejects takes
//! nothing from any of them.
//!
//! # When the store fails
//!
//! A check never hangs: each is bounded by [`Builder::timeout`], and a store that failed is
//! skipped for a short backoff. The [`FailurePolicy`] answers meanwhile: check the same limits
//! in this process ([`FailurePolicy::Local`], the default: a store that is away, for an outage
//! or the seconds of a Cluster failover, never switches a limit off), refuse
//! ([`FailurePolicy::Deny`]: a 503, or [`RateLimitError::StoreUnavailable`]), or admit
//! ([`FailurePolicy::Allow`], fail open, by name). One limit can choose its own (`on_store_error = "deny"` on the
//! attribute, [`Limit::failure_policy`]); a call stacking limits gets the strictest. The limits
//! are exact while checks answer within the timeout; past it, the policy answers. Checks go
//! back to the store as soon as it answers. A store error
//! that concerns one call only ([`StoreError::is_transport`] is `false`) never changes another
//! call's answer.
//!
//! # Operations
//!
//! * **Shadow mode** — `shadow = true` on one attribute, or [`Builder::shadow`] for all: checked
//!   and counted as usual, a rejection is only logged and counted, never enforced (a handler
//!   then sends no rate-limit headers).
//! * **Exemptions** — [`Builder::exempt_networks`], [`Builder::exempt_when`] and
//!   [`Builder::deny_networks`] (403 before any store call), for HTTP handlers; see
//!   [`Exemptions`].
//! * **Admin calls** — [`RateLimiter::peek`], [`RateLimiter::reset`] and [`RateLimiter::block`]
//!   for one caller ([`Target`]) of a function's limits ([`Limit`]), on every store.
//! * **Metrics** — feature `metrics`: counters per scope, algorithm and outcome, and the store's
//!   latency, never a caller value in a label ([`observe`]).
//!
//! # Tests
//!
//! [`RateLimiter::scope`] runs a future with a limiter of its own, and a [`MemoryStore`] on a
//! [`store::ManualClock`] lets a test move time instead of sleeping:
//!
//! ```
//! use std::time::Duration;
//! use ratelimit_runtime::store::ManualClock;
//! use ratelimit_runtime::{MemoryStore, RateLimitError, RateLimiter, rate_limit};
//!
//! #[rate_limit(num = 1, time = 60)]
//! async fn once_a_minute() -> Result<(), RateLimitError> {
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), ratelimit_runtime::ConfigError> {
//! let clock = ManualClock::new();
//! let limiter = RateLimiter::builder().store(MemoryStore::with_clock(clock.clone())).build().await?;
//! limiter
//!     .scope(async {
//!         assert!(once_a_minute().await.is_ok());
//!         let wait = once_a_minute().await.unwrap_err().retry_after().unwrap();
//!         assert!(wait > Duration::from_secs(59));
//!         clock.advance(wait); // no sleeping: the store's time moves
//!         assert!(once_a_minute().await.is_ok());
//!     })
//!     .await;
//! # Ok(()) }
//! ```
//!
//! # Features
//!
//! * `axum` — Axum 0.8 handlers; `actix` — Actix-web 4 handlers (both can be on at once);
//! * `cluster` — `RedisClusterStore`, a Redis Cluster store;
//! * `tls` — `rediss://` URLs (rustls);
//! * `tower` — [`RateLimitLayer`], a Tower layer that limits a whole Axum router, tonic server
//!   or any `tower::Service` over `http::Request` ([`layer`]); for `by("ip")` it reads the peer
//!   address Axum's server records with `axum`, tonic's with `tonic` (with neither, give it a
//!   `peer_addr` hook: a limit by IP without one is refused at build);
//! * `tonic` — gRPC methods of tonic 0.14 services (`by = "ip"`, `"header:<name>"`, `"app_id"`,
//!   `"user"` read from their `tonic::Request`), and `tonic::Status: From<RateLimitError>`
//!   (see [`grpc`]);
//! * `metrics` — counters and a store-latency histogram through the `metrics` facade
//!   ([`observe`]);
//! * `client` — [`client::PartnerLayer`], a Tower layer for outgoing requests to a
//!   rate-limited partner: one budget for the fleet, paced by the partner's answers;
//! * `reqwest` — the same as a `reqwest-middleware` middleware ([`client::PartnerMiddleware`]);
//! * `testing` — [`testing::RedisServer`], a private `redis-server` on a free port for
//!   integration tests of your own limits (see [the testing chapter](guide::testing)).
//!
//! # The guide
//!
//! The chapters of [`guide`] are the reference the README points to; their examples are doc
//! tests: [the attribute](guide::attribute) (arguments, keys, stacking, attribute order,
//! callers and proxies, responses), [the integrations](guide::integrations) (plain functions,
//! Axum, Actix-web, tonic), [the Tower layer](guide::layer), [limits that follow the
//! caller](guide::quotas) (plans, overrides, costs, counting failures),
//! [algorithms](guide::algorithms), [stores](guide::stores) (Redis, Cluster, engines, failures,
//! a Redis for limits), [operations](guide::operations) (shadow mode, exemptions, admin
//! calls, metrics and logs, the example servers), [testing your limits](guide::testing)
//! (handlers answered in process on paused time, a real Redis) and [calling rate-limited
//! APIs](guide::partners) (a partner's budget for the fleet, paced by its answers).
//!
//! # Where things are
//!
//! The everyday types are at the crate root: the attribute [`rate_limit`]; the limiter
//! [`RateLimiter`]; what a limit is ([`Limit`], [`By`], [`Policy`], [`Algorithm`], [`Quota`],
//! [`FailurePolicy`]); what a check answers ([`Verdict`], [`Decision`]); the errors
//! ([`RateLimitError`], [`StoreError`], [`ConfigError`], [`PolicyError`]); who is calling
//! ([`UserId`], and [`Target`] for the operator's calls); the stores ([`Store`],
//! [`MemoryStore`], [`RedisStore`], [`RedisClusterStore`]) and the layer ([`RateLimitLayer`]).
//!
//! The rest is in modules named for what they hold, in the order of a call:
//!
//! | module | holds |
//! | --- | --- |
//! | [`limiter`] | the limiter's [`Builder`], its [`Settings`](limiter::Settings), [`ShutdownTimedOut`](limiter::ShutdownTimedOut) |
//! | [`quota`] | [`AsQuota`](quota::AsQuota): a caller's plan as a [`Quota`] |
//! | [`exempt`] | callers let through: [`Exemptions`], [`CallerView`] |
//! | [`net`] | IP networks for proxies and exemptions: [`IpNet`](net::IpNet) |
//! | [`http`] | what the HTTP integrations read and answer: client addresses, forwarding and response headers |
//! | [`grpc`] | the same for tonic |
//! | [`layer`] | the Tower layer's builder, service and errors |
//! | [`lease`] | hot keys served from a local lease: [`Lease`](lease::Lease) |
//! | [`settle`] | after the body: [`Count`], [`Reservation`] |
//! | [`algorithm`] | each algorithm's rule, as the stores run it |
//! | [`store`] | the [`Store`] trait for stores of your own, [`Check`](store::Check), the memory store's clocks |
//! | [`key`] | the layout of store keys |
//! | [`observe`] | logs and metrics |
//! | [`client`] | calling rate-limited APIs (feature `client`) |
//! | [`testing`] | a private Redis for your tests (feature `testing`) |

#![cfg_attr(docsrs, feature(doc_cfg))] // docs.rs: each item shows the features it needs
pub mod algorithm;
#[cfg(feature = "client")]
pub mod client;
mod error;
pub mod exempt;
pub mod grpc;
pub mod http;
pub mod key;
#[cfg(feature = "tower")]
pub mod layer;
pub mod lease;
mod limit;
pub mod limiter;
pub mod net;
pub mod observe;
mod policy;
pub mod quota;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;
// Who is calling: what a request offers the limiter, read alike on every transport.
mod caller;
// The one call pipeline every transport goes through.
mod call;
// The arithmetic of `cost = <expression>`: checked, never wrapping.
mod cost;
// What a check answers: one decision per limit, the verdict of a call.
mod decision;

#[doc(hidden)]
pub mod __private;

/// The guide: the chapters the README points to. Their examples are doc tests, built with
/// every feature (as docs.rs builds them).
#[cfg(all(
    feature = "axum",
    feature = "actix",
    feature = "tower",
    feature = "tonic",
    feature = "metrics",
    feature = "cluster",
    feature = "testing",
    feature = "client",
    feature = "reqwest"
))]
pub mod guide {
    #[doc = include_str!("../docs/attribute.md")]
    pub mod attribute {}
    #[doc = include_str!("../docs/integrations.md")]
    pub mod integrations {}
    #[doc = include_str!("../docs/layer.md")]
    pub mod layer {}
    #[doc = include_str!("../docs/quotas.md")]
    pub mod quotas {}
    #[doc = include_str!("../docs/algorithms.md")]
    pub mod algorithms {}
    #[doc = include_str!("../docs/stores.md")]
    pub mod stores {}
    #[doc = include_str!("../docs/operations.md")]
    pub mod operations {}
    #[doc = include_str!("../docs/testing.md")]
    pub mod testing {}
    #[doc = include_str!("../docs/partners.md")]
    pub mod partners {}
}

/// The README's code blocks, compiled and run as doc tests: a snippet that stops compiling
/// fails `cargo test`.
#[cfg(all(
    doctest,
    feature = "axum",
    feature = "actix",
    feature = "tower",
    feature = "tonic"
))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// What is settled after a call's body: which of its outcomes count against its limits
/// ([`Count`], the attribute's `count = …`) and a cost the body settles itself when it knows
/// it ([`Reservation`], `settle = "later"`).
pub mod settle {
    pub use crate::call::plan::Count;
    pub use crate::call::settle::Reservation;
}

// The names the crate docs above link to by their short names.
#[cfg(doc)]
use crate::{
    call::{plan::Count, settle::Reservation},
    exempt::{CallerView, Exemptions},
    limiter::Builder,
};

pub use algorithm::Algorithm;
pub use caller::UserId;
pub use decision::{Decision, Verdict};
pub use error::{ConfigError, RateLimitError, StoreError};
#[cfg(feature = "tower")]
pub use layer::RateLimitLayer;
pub use limit::FailurePolicy;
pub use limit::{By, Limit};
pub use limiter::RateLimiter;
pub use limiter::admin::Target;
pub use policy::{Policy, PolicyError};
pub use quota::Quota;
pub use ratelimit_macros::rate_limit;
#[cfg(feature = "cluster")]
pub use store::RedisClusterStore;
pub use store::{MemoryStore, RedisStore, Store};

#[cfg(test)]
mod docs_tests {
    fn read(path: &str) -> String {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// The gRPC chapter shows `examples/build.rs` (a doc test too, compiled, not run); it must
    /// stay the file the examples build with.
    #[test]
    fn the_grpc_chapter_shows_the_build_script_the_examples_use() {
        let chapter = read("docs/integrations.md");
        let build = read("../examples/build.rs");
        assert!(chapter.contains(&format!("```rust,no_run\n{build}```")));
    }

    /// The algorithm tables of the README and of the algorithms chapter list exactly the
    /// algorithms there are (`Algorithm::BY_CODE`: the rates and `concurrency`), each once.
    #[test]
    fn the_algorithm_tables_list_every_algorithm() {
        for path in ["../README.md", "docs/algorithms.md"] {
            let text = read(path);
            let mut listed: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
                .filter(|name| *name != "algo")
                .collect();
            let mut all: Vec<&str> = crate::algorithm::Algorithm::BY_CODE
                .iter()
                .map(|a| a.as_str())
                .collect();
            listed.sort_unstable();
            all.sort_unstable();
            assert_eq!(listed, all, "{path}");
        }
    }
}

#[cfg(test)]
mod structure_tests;
