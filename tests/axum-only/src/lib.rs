//! The card's line on an Axum handler that takes `State` and `Json`, in a crate where only the
//! `axum` integration of ratelimit-runtime is enabled.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Extension, Json, Router};
use ratelimit_runtime::{RateLimiter, rate_limit};
use serde::Deserialize;

/// The application's state.
#[derive(Debug, Clone, Default)]
pub struct AppState {
    /// How many times the login handler ran.
    pub logins: Arc<AtomicUsize>,
}

/// The login form.
#[derive(Debug, Deserialize)]
pub struct LoginForm {
    /// Who logs in.
    pub user: String,
}

/// The card's line, verbatim.
#[rate_limit(algo = "sliding", num = 3, time = 10, by = "ip")]
pub async fn login(State(s): State<AppState>, Json(form): Json<LoginForm>) -> impl IntoResponse {
    s.logins.fetch_add(1, Ordering::SeqCst);
    format!("welcome {}", form.user)
}

/// The router, with its own limiter.
pub fn app(state: AppState, limiter: RateLimiter) -> Router {
    Router::new()
        .route("/login", post(login))
        .layer(Extension(limiter))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpSocket;

    use super::*;

    /// One `POST /login` from `local`, over a raw HTTP/1.1 connection: (status, head, body).
    async fn login_from(addr: SocketAddr, local: &str) -> (u16, String, String) {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind(format!("{local}:0").parse().unwrap()).unwrap();
        let mut stream = socket.connect(addr).await.unwrap();
        let body = r#"{"user":"alice"}"#;
        let request = format!(
            "POST /login HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        let status = head[9..12].parse().unwrap();
        (status, head.to_ascii_lowercase(), body.to_owned())
    }

    #[tokio::test]
    async fn the_card_line_limits_by_ip_with_only_axum_enabled() {
        let state = AppState::default();
        let limiter = RateLimiter::builder().memory().build().await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = app(state.clone(), limiter);
        tokio::spawn(async move {
            axum::serve(
                listener,
                router.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await
            .unwrap();
        });
        for left in [2, 1, 0] {
            let (status, head, body) = login_from(addr, "127.0.0.1").await;
            assert_eq!(status, 200, "{head}");
            assert_eq!(body, "welcome alice");
            assert!(
                head.contains("ratelimit-policy: \"login\";q=3;w=10"),
                "{head}"
            );
            assert!(
                head.contains(&format!("ratelimit: \"login\";r={left};t=")),
                "{head}"
            );
        }
        let (status, head, body) = login_from(addr, "127.0.0.1").await;
        assert_eq!(status, 429, "{head}");
        let retry: u64 = head
            .lines()
            .find_map(|l| l.strip_prefix("retry-after: "))
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=10).contains(&retry), "{head}");
        assert!(
            body.starts_with("{\"error\":\"too_many_requests\",\"message\":"),
            "{body}"
        );
        assert!(
            body.ends_with(&format!(",\"retry_after\":{retry}}}")),
            "{body}"
        );
        assert_eq!(state.logins.load(Ordering::SeqCst), 3);
        let (status, head, _) = login_from(addr, "127.0.0.2").await;
        assert_eq!(status, 200, "another IP: {head}");
    }
}

/// A method shaped like a tonic service's, in a build without the `tonic` feature: must not
/// compile, and say which feature it needs.
#[cfg(feature = "grpc-without-tonic")]
pub mod grpc_without_tonic {
    use ratelimit_runtime::rate_limit;

    /// Stands for `tonic::Request` (the macro knows the parameter by its type's name).
    pub struct Request<T>(pub T);

    /// A service trait.
    #[async_trait::async_trait]
    pub trait Greeter {
        /// A method.
        async fn say_hello(&self, request: Request<String>) -> Result<String, String>;
    }

    /// A service.
    pub struct MyGreeter;

    #[async_trait::async_trait]
    impl Greeter for MyGreeter {
        #[rate_limit(num = 3, time = 10, by = "ip")]
        async fn say_hello(&self, request: Request<String>) -> Result<String, String> {
            Ok(request.0)
        }
    }
}
