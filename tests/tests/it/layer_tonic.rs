//! `RateLimitLayer` on a tonic server (`Server::builder().layer(…)` around tonic-health's
//! service), called over loopback by tonic clients: gRPC status codes, not HTTP ones, with the
//! retry and rate-limit fields as metadata.

#![allow(
    clippy::duration_suboptimal_units,
    reason = "Duration::from_mins is newer than the workspace's rust-version"
)]

use std::net::SocketAddr;
use std::time::Duration;

use ratelimit_runtime::http::HttpSettings;
use ratelimit_runtime::{Algorithm, FailurePolicy, RateLimitLayer, RateLimiter};
use ratelimit_tests::redis_server::RedisServer;
use tonic::Code;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

/// A tonic server with tonic-health's service behind `layer`, on a loopback port.
async fn serve(layer: RateLimitLayer) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (_reporter, health) = tonic_health::server::health_reporter();
    tokio::spawn(async move {
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .expect("serve");
    });
    addr
}

/// A client whose connection leaves from `local` (any 127.0.0.x on Linux loopback).
async fn client_from(addr: SocketAddr, local: &str) -> HealthClient<Channel> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .local_address(Some(local.parse().expect("ip")))
        .connect()
        .await
        .expect("connect");
    HealthClient::new(channel)
}

async fn check(client: &HealthClient<Channel>) -> Result<tonic::Response<()>, tonic::Status> {
    client
        .clone()
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map(|r| {
            let (metadata, _, extensions) = r.into_parts();
            tonic::Response::from_parts(metadata, (), extensions)
        })
}

fn per_ip(limiter: &RateLimiter, num: u64) -> RateLimitLayer {
    RateLimitLayer::builder()
        .scope("grpc")
        .algorithm(Algorithm::Sliding)
        .num(num)
        .period(Duration::from_secs(60))
        .by("ip")
        .limiter(limiter.clone())
        .build()
        .expect("layer")
}

/// 40 concurrent calls from one client against 5 per minute by ip: exactly 5 OK (with the
/// fields as metadata), 35 `RESOURCE_EXHAUSTED` with `retry-after` and the fields; another
/// client address has its own quota (the peer comes from tonic's `TcpConnectInfo`).
async fn exact_under_40_concurrent_calls(limiter: RateLimiter) {
    let addr = serve(per_ip(&limiter, 5)).await;
    let client = client_from(addr, "127.0.0.1").await;
    let mut calls = Vec::new();
    for _ in 0..40 {
        let client = client.clone();
        calls.push(tokio::spawn(async move { check(&client).await }));
    }
    let (mut ok, mut exhausted) = (0, 0);
    for call in calls {
        match call.await.expect("join") {
            Ok(response) => {
                let metadata = response.metadata();
                assert_eq!(
                    metadata.get("ratelimit-policy").expect("policy"),
                    "\"grpc\";q=5;w=60"
                );
                assert!(metadata.get("ratelimit").is_some(), "{metadata:?}");
                ok += 1;
            }
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                assert_eq!(status.message(), HttpSettings::DEFAULT_MESSAGE);
                let metadata = status.metadata();
                let retry: u64 = metadata
                    .get("retry-after")
                    .expect("retry-after")
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                assert!((1..=60).contains(&retry), "{status:?}");
                assert_eq!(
                    metadata.get("ratelimit-policy").expect("policy"),
                    "\"grpc\";q=5;w=60"
                );
                let state = metadata.get("ratelimit").expect("ratelimit");
                assert!(
                    state.to_str().unwrap().starts_with("\"grpc\";r=0;t="),
                    "{state:?}"
                );
                exhausted += 1;
            }
        }
    }
    assert_eq!((ok, exhausted), (5, 35));
    let other = client_from(addr, "127.0.0.2").await;
    assert!(check(&other).await.is_ok());
}

async fn limiter(redis: Option<&RedisServer>) -> RateLimiter {
    let builder = RateLimiter::builder()
        .timeout(Duration::from_secs(5))
        .failure_policy(FailurePolicy::Deny);
    let builder = match redis {
        Some(server) => builder.redis_url(server.url()),
        None => builder.memory(),
    };
    builder.build().await.expect("limiter")
}

#[tokio::test]
async fn a_tonic_server_is_exact_under_40_concurrent_calls_memory() {
    exact_under_40_concurrent_calls(limiter(None).await).await;
}

#[tokio::test]
async fn a_tonic_server_is_exact_under_40_concurrent_calls_redis() {
    let server = RedisServer::start();
    exact_under_40_concurrent_calls(limiter(Some(&server)).await).await;
}

/// A call lacking the metadata entry a limit is by: `INVALID_ARGUMENT` naming it as metadata. The store down under
/// the deny policy: `UNAVAILABLE`.
#[tokio::test]
async fn missing_header_is_invalid_argument_and_a_store_down_is_unavailable() {
    let mut server = RedisServer::start();
    let limiter = limiter(Some(&server)).await;
    let layer = RateLimitLayer::builder()
        .num(100)
        .period(Duration::from_secs(60))
        .by("header:x-tenant")
        .limiter(limiter)
        .build()
        .expect("layer");
    let addr = serve(layer).await;
    let client = client_from(addr, "127.0.0.1").await;
    let status = check(&client).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(status.message(), "metadata x-tenant must not be empty");
    let with_tenant = || {
        let mut request = tonic::Request::new(HealthCheckRequest {
            service: String::new(),
        });
        request
            .metadata_mut()
            .insert("x-tenant", "t1".parse().unwrap());
        let mut client = client.clone();
        async move { client.check(request).await }
    };
    assert!(with_tenant().await.is_ok());
    server.kill();
    let status = with_tenant().await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
}

/// Without trusted proxies, forwarding headers a client sends as metadata change nothing: a
/// fresh `x-forwarded-for` (and `forwarded`, `x-real-ip`) on every call is still one caller.
#[tokio::test]
async fn spoofed_forwarding_metadata_changes_nothing() {
    let limiter = limiter(None).await;
    let addr = serve(per_ip(&limiter, 2)).await;
    let client = client_from(addr, "127.0.0.1").await;
    let mut codes = Vec::new();
    for i in 0..4 {
        let fake = format!("198.51.100.{i}");
        let mut request = tonic::Request::new(HealthCheckRequest {
            service: String::new(),
        });
        let metadata = request.metadata_mut();
        metadata.insert("x-forwarded-for", fake.parse().unwrap());
        metadata.insert("forwarded", format!("for={fake}").parse().unwrap());
        metadata.insert("x-real-ip", fake.parse().unwrap());
        let code = match client.clone().check(request).await {
            Ok(_) => Code::Ok,
            Err(status) => status.code(),
        };
        codes.push(code);
    }
    assert_eq!(
        codes,
        [
            Code::Ok,
            Code::Ok,
            Code::ResourceExhausted,
            Code::ResourceExhausted
        ]
    );
}

/// Through the layer, an exemption written for an HTTP route (`/`) does not exempt a gRPC
/// call: the predicate sees the method's path, as the `#[rate_limit]` methods do.
#[tokio::test]
async fn an_exemption_for_the_root_path_does_not_exempt_a_grpc_call() {
    let (limiter, seen) = ratelimit_tests::env::root_path_exempt().await;
    let addr = serve(per_ip(&limiter, 3)).await;
    let client = client_from(addr, "127.0.0.1").await;
    let mut codes = Vec::new();
    for _ in 0..10 {
        codes.push(check(&client).await.map(drop).map_err(|s| s.code()));
    }
    let admitted = codes.iter().filter(|c| c.is_ok()).count();
    assert_eq!(admitted, 3, "{codes:?}");
    assert!(
        codes[3..]
            .iter()
            .all(|c| *c == Err(Code::ResourceExhausted))
    );
    let seen = seen.lock().unwrap();
    assert!(
        seen.len() == 10 && seen.iter().all(|p| p == "/grpc.health.v1.Health/Check"),
        "{seen:?}"
    );
}
