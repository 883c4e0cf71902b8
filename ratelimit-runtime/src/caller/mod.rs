//! Who is calling: what a request offers the limiter ([`Caller`], the one seam every
//! transport implements), read the same way on every transport — the client address behind
//! trusted proxies (`ip`), the normalised path (`path`), the user (`user`) — and what the
//! caller is answered (`answer`: the rate-limit fields and the refusals). Below the limiter:
//! nothing here does I/O.

// Each transport uses its part of this room; the full build (every integration) is the one
// that proves nothing here is dead.
#![cfg_attr(
    not(all(
        feature = "axum",
        feature = "actix",
        feature = "tower",
        feature = "tonic"
    )),
    allow(dead_code)
)]

pub(crate) mod answer;
pub(crate) mod ip;
pub(crate) mod path;
mod request;
pub(crate) mod settings;
mod user;

#[cfg_attr(not(any(feature = "axum", feature = "actix")), allow(unused_imports))]
pub(crate) use self::request::{ByValue, Caller, Headers, Missing, Transport};
pub use self::user::UserId;
