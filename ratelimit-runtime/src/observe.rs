//! Metrics (cargo feature **`metrics`**): what the limiter answered, through the
//! [`metrics`](https://docs.rs/metrics) facade. The application installs the recorder (a
//! Prometheus exporter, `StatsD`, …); without one, or without the feature, recording costs
//! nothing.
//!
//! # What is recorded
//!
//! * **`ratelimit_calls_total`** (counter), labels `scope`, `algorithm`, `outcome`: one
//!   increment per limit of each limited call, with that limit's scope and algorithm:
//!   * `admitted` — the call went through and this limit counted it;
//!   * `rejected` — this limit rejected the call (429 or `RateLimitError::Limited`);
//!   * `shadow_rejected` — this limit, in shadow mode, would have rejected the call; it ran;
//!   * `exempted` — the caller is exempt (trusted network or predicate): nothing was checked;
//!   * `denied` — the caller's network is on the deny list: 403, nothing was checked;
//!   * `failure_allow`, `failure_deny`, `failure_local` — the store failed (or the breaker
//!     skipped it) and that failure policy answered: the call's, the strictest among its
//!     limits' own (`on_store_error`) and the limiter's for the limits that name none, so
//!     every limit of one call is counted with the same one. A call refused because the
//!     store cannot record it (`StoreError::cannot_record`) counts as `failure_deny` under
//!     every policy. Such a call is also counted as `admitted` or `rejected`, by what the
//!     policy answered.
//! * **`ratelimit_store_errors_total`** (counter), labels `store` and `error`: one increment
//!   per failed store call, by what failed — `timeout` (no answer within
//!   `Settings::timeout`: the call was answered by the failure policy, and the exactness of
//!   the limits held only for the calls the store answered), `connection`, `backend`,
//!   `bad_reply`, `full`, `out_of_memory`, `unsupported`. A call answered by the open breaker
//!   makes no store call and is not counted here (it is in `ratelimit_calls_total` as a
//!   `failure_*` outcome).
//! * **`ratelimit_store_seconds`** (histogram), label `store` (`memory`, `redis`,
//!   `redis-cluster`, or your store's name): how long each store call took, failed ones and
//!   timeouts included (a call answered from the blocked-caller cache or by the open breaker
//!   makes no store call and records nothing).
//! * **`ratelimit_lease_units_held`** (gauge), label `scope`: the units of the leases this
//!   process holds now ([`crate::lease`]), taken from the quota ahead of the calls they serve.
//!   It bounds what the other processes may be refused while these units sit here
//!   (under-admission, never over-admission); [`crate::RateLimiter::lease_units_held`] reads
//!   how many of them are still unused, without the feature.
//! * **`ratelimit_lease_units_returned_total`** (counter), label `scope`: units of ended
//!   leases given back to the store by receipt.
//!
//! **No label ever holds a caller value** — no IP address, user id, header value or key:
//! they are personal data, and unbounded (one time series per caller would exhaust the
//! metrics backend; a hostile client could mint them). Scopes and algorithms come from the
//! code, so their number is fixed at build time.
//!
//! ```
//! use ratelimit_runtime::observe;
//! // Names to query in the metrics backend, e.g. in Prometheus:
//! // sum by (scope) (rate(ratelimit_calls_total{outcome="shadow_rejected"}[5m]))
//! assert_eq!(observe::CALLS, "ratelimit_calls_total");
//! assert_eq!(observe::STORE_SECONDS, "ratelimit_store_seconds");
//! // sum by (store) (rate(ratelimit_store_errors_total{error="timeout"}[5m]))
//! assert_eq!(observe::STORE_ERRORS, "ratelimit_store_errors_total");
//! ```
//!
//! The example server (`examples/src/axum_server.rs`) exports them on `/metrics` in the
//! Prometheus text format.
//!
//! # What is logged
//!
//! Events go through [`tracing`](https://docs.rs/tracing), under the four targets of [`log`]
//! (each begins with `ratelimit_runtime`, so `RUST_LOG=ratelimit_runtime=info` selects them all
//! with `tracing-subscriber`'s `EnvFilter`). Like the metrics, **no event holds a caller
//! value**: they carry the scope, never the key, the address or the user.

use crate::algorithm::Algorithm;
use crate::decision::Verdict;
use crate::error::StoreError;

/// What happened to one limit of one call (the `outcome` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Admitted,
    Rejected,
    ShadowRejected,
    #[cfg_attr(not(any(feature = "axum", feature = "actix")), allow(dead_code))]
    Exempted,
    #[cfg_attr(not(any(feature = "axum", feature = "actix")), allow(dead_code))]
    Denied,
    FailureAllow,
    FailureDeny,
    FailureLocal,
}

impl Outcome {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn label(self) -> &'static str {
        match self {
            Self::Admitted => "admitted",
            Self::Rejected => "rejected",
            Self::ShadowRejected => "shadow_rejected",
            Self::Exempted => "exempted",
            Self::Denied => "denied",
            Self::FailureAllow => "failure_allow",
            Self::FailureDeny => "failure_deny",
            Self::FailureLocal => "failure_local",
        }
    }
}

/// The counter's name (see the module docs for its labels).
///
/// ```
/// assert_eq!(ratelimit_runtime::observe::CALLS, "ratelimit_calls_total");
/// ```
pub const CALLS: &str = "ratelimit_calls_total";
/// The histogram's name, in seconds.
///
/// ```
/// assert_eq!(ratelimit_runtime::observe::STORE_SECONDS, "ratelimit_store_seconds");
/// ```
pub const STORE_SECONDS: &str = "ratelimit_store_seconds";

/// The store-error counter's name (see the module docs for its labels).
///
/// ```
/// assert_eq!(ratelimit_runtime::observe::STORE_ERRORS, "ratelimit_store_errors_total");
/// ```
pub const STORE_ERRORS: &str = "ratelimit_store_errors_total";

/// The lease gauge's name (see the module docs).
///
/// ```
/// assert_eq!(ratelimit_runtime::observe::LEASE_UNITS_HELD, "ratelimit_lease_units_held");
/// ```
pub const LEASE_UNITS_HELD: &str = "ratelimit_lease_units_held";

/// The counter of lease units given back (see the module docs).
///
/// ```
/// assert_eq!(ratelimit_runtime::observe::LEASE_UNITS_RETURNED, "ratelimit_lease_units_returned_total");
/// ```
pub const LEASE_UNITS_RETURNED: &str = "ratelimit_lease_units_returned_total";

/// Moves the lease gauge of `scope` by `delta` units.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
#[inline]
pub(crate) fn lease_units_held(scope: &str, delta: i64) {
    #[cfg(feature = "metrics")]
    {
        #[allow(clippy::cast_precision_loss)] // a lease holds at most 2^50 units
        let delta = delta as f64;
        metrics::gauge!(LEASE_UNITS_HELD, "scope" => scope.to_owned()).increment(delta);
    }
}

/// Counts `units` of an ended lease given back.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
#[inline]
pub(crate) fn lease_units_returned(scope: &str, units: u64) {
    #[cfg(feature = "metrics")]
    metrics::counter!(LEASE_UNITS_RETURNED, "scope" => scope.to_owned()).increment(units);
}

/// The `error` label of a store error.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
fn error_label(error: &StoreError) -> &'static str {
    match error {
        StoreError::Timeout(_) => "timeout",
        StoreError::Connection { .. } => "connection",
        StoreError::Backend { .. } => "backend",
        StoreError::BadReply(_) => "bad_reply",
        StoreError::Full { .. } => "full",
        StoreError::OutOfMemory { .. } => "out_of_memory",
        StoreError::Unsupported(_) => "unsupported",
        StoreError::Unreplicated(_) => "unreplicated",
    }
}

/// Counts one failed store call.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
#[inline]
pub(crate) fn store_error(store: &'static str, error: &StoreError) {
    #[cfg(feature = "metrics")]
    metrics::counter!(STORE_ERRORS, "store" => store, "error" => error_label(error)).increment(1);
}

/// Counts one limit's outcome.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
#[inline]
pub(crate) fn count(scope: &str, algorithm: Algorithm, outcome: Outcome) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        CALLS,
        "scope" => scope.to_owned(),
        "algorithm" => algorithm.as_str(),
        "outcome" => outcome.label(),
    )
    .increment(1);
}

/// Counts `outcome` for every limit of a call: `(scope, algorithm)` each.
#[inline]
pub(crate) fn count_all<'a>(
    limits: impl IntoIterator<Item = (&'a str, Algorithm)>,
    outcome: Outcome,
) {
    if cfg!(feature = "metrics") {
        for (scope, algorithm) in limits {
            count(scope, algorithm, outcome);
        }
    }
}

/// Counts a verdict: every limit `admitted` when it was, else each rejecting limit `rejected`
/// (or `shadow_rejected`: `shadow(i)` says whether limit `i` was in shadow mode).
pub(crate) fn count_verdict<'a>(
    limits: impl IntoIterator<Item = (&'a str, Algorithm)>,
    verdict: &Verdict,
    shadow: impl Fn(usize) -> bool,
) {
    if !cfg!(feature = "metrics") {
        return;
    }
    let admitted = verdict.is_admitted();
    for (i, ((scope, algorithm), d)) in limits.into_iter().zip(verdict.decisions()).enumerate() {
        if admitted {
            count(scope, algorithm, Outcome::Admitted);
        } else if !d.admitted {
            let outcome = if shadow(i) {
                Outcome::ShadowRejected
            } else {
                Outcome::Rejected
            };
            count(scope, algorithm, outcome);
        }
    }
}

/// Records how long one store call took, from when it was sent (`Some` with `metrics`).
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
#[inline]
pub(crate) fn store_latency(store: &'static str, sent_at: Option<tokio::time::Instant>) {
    #[cfg(feature = "metrics")]
    if let Some(sent_at) = sent_at {
        metrics::histogram!(STORE_SECONDS, "store" => store)
            .record(sent_at.elapsed().as_secs_f64());
    }
}

/// The `tracing` targets of the limiter's events, one per concern. They are part of the API:
/// they stay when the code moves between modules.
///
/// | target | level | events |
/// | --- | --- | --- |
/// | [`LIMITER`](log::LIMITER) | `WARN` | the store failed and the failure policy answered, or a refund failed (at most one per limiter every 5 s, with `held_back`, the failures not logged since); the store answers again; no limiter installed and no Redis in the environment |
/// | | `INFO` | a limit in shadow mode would reject (one per would-be rejection) |
/// | | `DEBUG` | a rejection: the scope, the limit, `retry_after_ms` and its `source` (`redis`, `redis-cluster`, `memory`, `blocked-cache`, `local`) |
/// | | `INFO`, `ERROR` | the store the default limiter chose from the environment, or why it could not use it |
/// | | `ERROR` | a limit that could not be applied to a request (a 500: e.g. a quota its algorithm cannot keep) |
/// | [`STORE`](log::STORE) | `INFO` | the engine, its version and the path checks take (`FCALL` or `EVALSHA`), at connect; a server without Functions |
/// | | `WARN` | an evicting `maxmemory-policy` (once); a Cluster refund or read of another slot that failed |
/// | | `DEBUG` | `INFO memory` refused or unanswered; receipts that could not be dropped (they expire) |
/// | [`CALLER`](log::CALLER) | `WARN` | a forwarding header from a proxy nobody configured, or a hop that cannot be read (once per process each) |
/// | | `ERROR` | a handler, gRPC method or layer without the peer address (`ConnectInfo`) (once) |
/// | [`ADMIN`](log::ADMIN) | `INFO` | a caller reset or blocked by [`RateLimiter::reset`](crate::RateLimiter::reset) or [`RateLimiter::block`](crate::RateLimiter::block) |
/// | [`CLIENT`](log::CLIENT) | `WARN` | a partner's rate-limit field ignored or cut to the layer's maximum pause (at most one line every 10 s); a partner's answer the store could not record |
///
/// ```
/// use ratelimit_runtime::observe::log;
/// // e.g. EnvFilter::new("warn,ratelimit_runtime::limiter=info"): shadow-mode reports too.
/// assert_eq!(log::LIMITER, "ratelimit_runtime::limiter");
/// assert!([log::STORE, log::CALLER, log::ADMIN].iter().all(|t| t.starts_with("ratelimit_runtime::")));
/// ```
pub mod log {
    /// Decisions: store failures and the failure policy, recovery, rejections, shadow mode,
    /// the default limiter's choice of store.
    pub const LIMITER: &str = "ratelimit_runtime::limiter";
    /// The stores: connecting, engines, scripts, memory policy, Cluster fan-out.
    pub const STORE: &str = "ratelimit_runtime::store";
    /// Identifying callers: peer addresses, proxies and forwarding headers.
    pub const CALLER: &str = "ratelimit_runtime::caller";
    /// Admin calls that change a caller's state (reset, block).
    pub const ADMIN: &str = "ratelimit_runtime::admin";
    /// The client layer: a partner's rate-limit field ignored or cut, a lesson the store
    /// did not take.
    pub const CLIENT: &str = "ratelimit_runtime::client";
}

#[cfg(test)]
mod log_tests {
    /// Every event of the crate names one of [`super::log`]'s targets, so the documented
    /// targets are the ones events use wherever their code lives.
    #[test]
    fn every_event_names_a_documented_target() {
        fn walk(dir: &std::path::Path, files: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk(&path, files);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    files.push(path);
                }
            }
        }
        let mut files = Vec::new();
        walk(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut files,
        );
        let mut events = 0;
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            for level in [
                "error", "warn", "info", "debug", "trace", "enabled", "event",
            ] {
                let call = format!("tracing::{level}!(");
                for (at, _) in text.match_indices(&call) {
                    let rest = text[at + call.len()..].trim_start();
                    let named = ["LIMITER", "STORE", "CALLER", "ADMIN", "CLIENT"]
                        .iter()
                        .any(|t| rest.starts_with(&format!("target: crate::observe::log::{t},")));
                    assert!(
                        named,
                        "{}: `{call}` without a target of observe::log",
                        file.display()
                    );
                    events += 1;
                }
            }
        }
        assert!(
            events >= 30,
            "found only {events} events: the walk is broken"
        );
    }
}
