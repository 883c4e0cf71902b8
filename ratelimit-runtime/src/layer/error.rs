//! Why a [`RateLimitLayer`](super::RateLimitLayer) could not be built.

use std::fmt;

use crate::policy::PolicyError;

/// Why a [`RateLimitLayer`](super::RateLimitLayer) could not be built. `limit` is the 0-based index of the limit
/// (the first, then one per [`RateLimitLayerBuilder::and`](super::RateLimitLayerBuilder::and)).
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::layer::{LayerError, RateLimitLayer};
///
/// let err = RateLimitLayer::builder().period(Duration::from_secs(1)).build().unwrap_err();
/// assert_eq!(err, LayerError::MissingNum { limit: 0 });
/// let err = RateLimitLayer::builder().num(1).period(Duration::from_secs(1)).by("cookie").build().unwrap_err();
/// assert!(err.to_string().contains("unknown by \"cookie\""));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LayerError {
    /// The limit has no `num`.
    MissingNum {
        /// Which limit.
        limit: usize,
    },
    /// The limit has no `period`.
    MissingPeriod {
        /// Which limit.
        limit: usize,
    },
    /// The limit breaks a rule of [`Policy`](crate::Policy) (the attribute's rules: the same bounds).
    Policy {
        /// Which limit.
        limit: usize,
        /// The rule.
        error: PolicyError,
    },
    /// A scope that cannot name a bucket ([`key::valid_scope`](crate::key::valid_scope)).
    InvalidScope {
        /// The scope given.
        scope: String,
    },
    /// A `by` that is not one of the sources.
    InvalidBy {
        /// The value given.
        by: String,
    },
    /// A [`RateLimitLayerBuilder::path`](super::RateLimitLayerBuilder::path) or [`RateLimitLayerBuilder::except_path`](super::RateLimitLayerBuilder::except_path) pattern
    /// that is not a path pattern (`/login`, `/api/*`).
    InvalidPath {
        /// Which limit.
        limit: usize,
        /// The pattern given.
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Two limits count different outcomes ([`RateLimitLayerBuilder::count`](super::RateLimitLayerBuilder::count)): the limits of
    /// one layer that count only some outcomes must count the same ones.
    MixedCounts {
        /// The limit whose `count` differs from an earlier one's.
        limit: usize,
    },
    /// A limit with a [`RateLimitLayerBuilder::lease`](super::RateLimitLayerBuilder::lease) beside other limits, or counting only
    /// some outcomes: a lease serves the one limit of a request from units taken before it.
    LeaseAlone {
        /// The leased limit.
        limit: usize,
    },
    /// A limit `by("ip")` in a build that has nowhere to read the client's address from: no
    /// [`RateLimitLayerBuilder::peer_addr`](super::RateLimitLayerBuilder::peer_addr) hook, and
    /// neither the `axum` feature (Axum's `ConnectInfo`) nor `tonic` (its `TcpConnectInfo`).
    /// Every request would be answered 500.
    NoPeerAddress {
        /// The first limit by IP.
        limit: usize,
    },
}

pub(super) const BYS: &str =
    "\"global\" (the default), \"ip\", \"url\", \"user\", \"app_id\" or \"header:<name>\"";

impl fmt::Display for LayerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MissingNum { limit } => write!(f, "limit #{}: `num` is required", limit + 1),
            Self::MissingPeriod { limit } => {
                write!(f, "limit #{}: `period` is required", limit + 1)
            }
            Self::Policy { limit, error } => write!(f, "limit #{}: {error}", limit + 1),
            Self::InvalidScope { scope } => write!(
                f,
                "invalid scope {scope:?}: use 1 to 200 of A-Z a-z 0-9 _ : . - /"
            ),
            Self::InvalidPath {
                limit,
                path,
                reason,
            } => write!(f, "limit #{}: invalid path {path:?}: {reason}", limit + 1),
            Self::LeaseAlone { limit } => write!(
                f,
                "limit #{}: a leased limit must be the layer's only one and count every outcome: a \
                 lease serves a request's one limit from units taken before it",
                limit + 1
            ),
            Self::NoPeerAddress { limit } => write!(
                f,
                "limit #{}: by = \"ip\" needs the client's address, and this build reads it from \
                 nowhere: enable the `axum` feature (Axum's ConnectInfo) or `tonic` (tonic's \
                 TcpConnectInfo), or give the layer a `peer_addr` hook",
                limit + 1
            ),
            Self::MixedCounts { limit } => write!(
                f,
                "limit #{}: counts other outcomes than an earlier limit of the layer; the limits \
                 of one layer that count only some outcomes must count the same ones",
                limit + 1
            ),
            Self::InvalidBy { by } => {
                if let Some(name) = by.strip_prefix("header:") {
                    write!(
                        f,
                        "invalid header name {:?} in by = {by:?}: use letters, digits and !#$%&'*+-.^_`|~, as in \"header:x-api-key\"",
                        name.trim()
                    )
                } else {
                    write!(f, "unknown by {by:?}: expected {BYS}")
                }
            }
        }
    }
}

impl std::error::Error for LayerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Policy { error, .. } => Some(error),
            _ => None,
        }
    }
}
