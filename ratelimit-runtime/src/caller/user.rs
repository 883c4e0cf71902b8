//! [`UserId`]: who the application's auth layer says the caller is.

use std::fmt;
use std::sync::Arc;

/// The identity of an authenticated caller, for `by = "user"`: the application's auth layer
/// puts one in the request extensions.
///
/// ```
/// use ratelimit_runtime::UserId;
/// # #[cfg(feature = "axum")] {
/// async fn auth(mut req: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
///     if let Some(user) = req.headers().get("x-user").and_then(|v| v.to_str().ok()) {
///         let user = UserId::new(user);
///         req.extensions_mut().insert(user);
///     }
///     next.run(req).await
/// }
/// # }
/// assert_eq!(UserId::new("alice").as_str(), "alice");
/// ```
///
/// An empty id counts as no user (401). A handler can take the `UserId` as a parameter (an
/// Axum and Actix-web extractor); without one it answers the same 401 as `by = "user"`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct UserId(Arc<str>);

impl UserId {
    /// A user id.
    pub fn new(id: impl Into<Arc<str>>) -> Self {
        Self(id.into())
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("UserId").field(&self.as_str()).finish()
    }
}

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<&str> for UserId {
    fn from(id: &str) -> Self {
        Self::new(id)
    }
}

impl From<String> for UserId {
    fn from(id: String) -> Self {
        Self::new(id)
    }
}
