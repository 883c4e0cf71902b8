//! What the example servers share (the guard of their admin APIs), and the bodies of the Axum
//! and Actix-web servers: their binaries pass Ctrl-C to [`axum_server::serve`] and
//! [`actix_server::serve`]; a test may pass a signal of its own.

pub mod actix_server;
pub mod axum_server;

pub mod admin {
    //! An admin API's guard: a bearer token compared in constant time, on a listener of its
    //! own bound to loopback. Admin calls change limits (a plan, a quota, a block): never serve
    //! them where clients can reach them.

    use std::sync::Arc;

    use axum::extract::{Request, State};
    use axum::http::StatusCode;
    use axum::middleware::Next;
    use axum::response::{IntoResponse, Response};

    /// The token an admin request must carry as `Authorization: Bearer <token>`.
    #[derive(Debug, Clone)]
    pub struct AdminToken(pub Arc<str>);

    impl AdminToken {
        /// `ADMIN_TOKEN` (16 characters or more), or a random one (128 bits from the OS's
        /// randomness, through `RandomState`), to print at start.
        pub fn from_env() -> Self {
            let token = std::env::var("ADMIN_TOKEN")
                .ok()
                .filter(|t| t.len() >= 16)
                .unwrap_or_else(|| {
                    use std::fmt::Write as _;
                    use std::hash::{BuildHasher, Hasher};
                    let mut token = String::new();
                    for _ in 0..2 {
                        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                        h.write_u32(std::process::id());
                        let _ = write!(token, "{:016x}", h.finish());
                    }
                    token
                });
            Self(token.into())
        }

        /// Whether `sent` (the `Authorization` header's bytes) carries this token, compared
        /// in constant time.
        pub fn accepts(&self, sent: Option<&[u8]>) -> bool {
            let sent = sent
                .and_then(|v| v.strip_prefix(b"Bearer "))
                .unwrap_or_default();
            let expected = self.0.as_bytes();
            sent.len() == expected.len()
                && sent
                    .iter()
                    .zip(expected)
                    .fold(0, |acc, (a, b)| acc | (a ^ b))
                    == 0
        }
    }

    impl std::fmt::Display for AdminToken {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0)
        }
    }

    /// The middleware (`axum::middleware::from_fn_with_state(token, require_token)`): a request
    /// without the token gets 401 and never reaches the admin handler.
    pub async fn require_token(
        State(token): State<AdminToken>,
        req: Request,
        next: Next,
    ) -> Response {
        let sent = req
            .headers()
            .get("authorization")
            .map(axum::http::HeaderValue::as_bytes);
        if !token.accepts(sent) {
            return (StatusCode::UNAUTHORIZED, "admin token required").into_response();
        }
        next.run(req).await
    }
}
