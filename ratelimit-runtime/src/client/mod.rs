//! Calling someone else's API: reading a rate-limited partner's answers (the `client`
//! feature): `Retry-After`, the IETF `RateLimit` field and the `x-ratelimit-*` families, as
//! [`ReadAnswer`]s the client layer can be given.

pub mod answer;

pub use answer::{
    Advice, Answer, Budget, GitHubFields, IetfFields, OpenAiFields, ReadAnswer, Remaining,
    RetryAfter,
};
