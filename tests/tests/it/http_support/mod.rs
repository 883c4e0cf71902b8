//! Support for the HTTP tests: real servers on loopback ports, real clients, and the limiters
//! (memory or a private Redis) each test gives its server.

#![allow(dead_code, unreachable_pub)]

pub mod scenarios;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ratelimit_runtime::{FailurePolicy, RateLimiter, http::HeaderStyle};
use ratelimit_tests::redis_server::RedisServer;

/// Which store a test runs on. Keeps the Redis server alive for as long as the test holds it.
#[derive(Debug)]
pub enum Backend {
    Memory,
    Redis(RedisServer),
}

impl Backend {
    pub fn memory() -> Self {
        Self::Memory
    }

    pub fn redis() -> Self {
        Self::Redis(RedisServer::start())
    }

    /// A limiter on this backend; `proxies` are its trusted proxies.
    pub async fn limiter(&self, proxies: &[&str]) -> RateLimiter {
        self.limiter_with(proxies, HeaderStyle::default()).await
    }

    pub async fn limiter_with(&self, proxies: &[&str], style: HeaderStyle) -> RateLimiter {
        let builder = RateLimiter::builder()
            .trusted_proxies(proxies.iter().copied())
            .header_style(style)
            // Generous: the machine is shared with parallel builds; a timeout would fail open.
            .timeout(Duration::from_secs(5))
            .failure_policy(FailurePolicy::Deny);
        let builder = match self {
            Self::Memory => builder.memory(),
            Self::Redis(server) => builder.redis_url(server.url()),
        };
        builder.build().await.expect("limiter")
    }
}

/// A client whose connections leave from `local` (any 127.0.0.x works on Linux loopback).
pub fn client_from(local: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(local.parse::<IpAddr>().expect("address"))
        .build()
        .expect("client")
}

pub fn client() -> reqwest::Client {
    client_from("127.0.0.1")
}

/// Serves an Axum router on `bind`:0 with `ConnectInfo<SocketAddr>`, on the test's runtime.
pub async fn serve_axum(app: axum::Router, bind: &str) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind((bind, 0))
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("serve");
    });
    addr
}

/// Serves an Actix-web app (`$factory`, as `HttpServer::new` takes it) on 127.0.0.1:0 with one
/// worker, on the test's Actix runtime; evaluates to its `http://addr`.
#[allow(unused_macros)]
macro_rules! serve_actix {
    ($factory:expr) => {{
        let server = actix_web::HttpServer::new($factory)
            .workers(1)
            .disable_signals()
            .shutdown_timeout(0)
            .bind(("127.0.0.1", 0))
            .expect("bind");
        let url = format!("http://{}", server.addrs()[0]);
        actix_web::rt::spawn(server.run());
        url
    }};
}
#[allow(unused_imports)]
pub(crate) use serve_actix;

/// A response, read whole.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: String,
}

impl Answer {
    pub async fn from(response: reqwest::Response) -> Self {
        Self {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body: response.text().await.expect("body"),
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().expect("ascii"))
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {:?}", self.body))
    }

    /// `r=` of the `RateLimit` field's first member.
    pub fn remaining(&self) -> u64 {
        let field = self
            .header("ratelimit")
            .unwrap_or_else(|| panic!("no RateLimit field: {self:?}"));
        param(field, "r")
    }

    /// Asserts a 429 as SPEC §7 has it: `Retry-After` ≥ 1, the IETF fields, the JSON body.
    pub fn assert_too_many(&self) {
        assert_eq!(self.status, 429, "{self:?}");
        let retry: u64 = self
            .header("retry-after")
            .expect("Retry-After")
            .parse()
            .expect("whole seconds");
        assert!(retry >= 1, "{self:?}");
        assert!(self.header("ratelimit-policy").is_some(), "{self:?}");
        assert_eq!(self.remaining(), 0, "{self:?}");
        assert_eq!(
            self.header("content-type"),
            Some("application/json"),
            "{self:?}"
        );
        let body = self.json();
        assert_eq!(body["error"], "too_many_requests");
        assert_eq!(
            body["message"],
            ratelimit_runtime::http::HttpSettings::DEFAULT_MESSAGE
        );
        assert_eq!(body["retry_after"].as_u64(), Some(retry));
    }
}

/// The integer parameter `name` of the first member of a structured-field list
/// (`"login";r=2;t=10`).
pub fn param(field: &str, name: &str) -> u64 {
    let first = field.split(',').next().expect("a member");
    first
        .split(';')
        .skip(1)
        .find_map(|p| p.trim().strip_prefix(name)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {name}= in {field:?}"))
        .parse()
        .unwrap_or_else(|e| panic!("{e}: {field:?}"))
}

/// Sends `n` requests built by `req` and returns their statuses.
pub async fn statuses(n: usize, mut req: impl FnMut() -> reqwest::RequestBuilder) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(req().send().await.expect("send").status().as_u16());
    }
    out
}
