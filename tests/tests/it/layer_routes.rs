//! `RateLimitLayer` through the one call pipeline, end to end on an Axum router over
//! real loopback HTTP and on a tonic server called by a tonic client, each on the memory store
//! and on a private Redis, with exact counts: per-route limits in one layer (`/login` 5, the
//! rest 100; hostile spellings of `/login`), the limiter's run-time overrides, a quota from the
//! request, a cost per request, count filters, exemptions, the deny list and the fields of
//! admitted responses.

#![allow(
    clippy::duration_suboptimal_units,
    reason = "Duration::from_mins is newer than the workspace's rust-version"
)]

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use ratelimit_runtime::{
    FailurePolicy, Quota, RateLimitLayer, RateLimiter, UserId, layer::RateLimitLayerBuilder,
    lease::Lease, limiter::Builder, settle::Count,
};
use ratelimit_tests::redis_server::RedisServer;
use tonic::Code;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::http_support::{Answer, client, client_from, serve_axum, statuses};

const MINUTE: Duration = Duration::from_secs(60);

/// Which store a scenario runs on; the Redis server lives as long as the value.
enum Store {
    Memory,
    Redis(RedisServer),
}

impl Store {
    fn both() -> [fn() -> Self; 2] {
        [|| Self::Memory, || Self::Redis(RedisServer::start())]
    }

    /// A limiter on this store, with what `setup` adds (exemptions, deny list).
    async fn limiter(&self, setup: impl FnOnce(Builder) -> Builder) -> RateLimiter {
        let builder = RateLimiter::builder()
            // Generous: the machine is shared with parallel builds; a timeout would fail open.
            .timeout(Duration::from_secs(5))
            .failure_policy(FailurePolicy::Deny);
        let builder = match self {
            Self::Memory => builder.memory(),
            Self::Redis(server) => builder.redis_url(server.url()),
        };
        setup(builder).build().await.expect("limiter")
    }
}

/// A limit of `num` a minute by ip, in `scope`.
fn per_ip(scope: &str, num: u64) -> RateLimitLayerBuilder {
    RateLimitLayer::builder()
        .scope(scope)
        .num(num)
        .period(MINUTE)
        .by("ip")
}

async fn send(request: reqwest::RequestBuilder) -> Answer {
    Answer::from(request.send().await.expect("send")).await
}

/// One request with `target` written as is on the request line (no client normalises it),
/// from 127.0.0.1: the status, or 0 when the server closed without answering.
async fn raw_status(addr: SocketAddr, method: &str, target: &str) -> u16 {
    let request = format!(
        "{method} {target} HTTP/1.1\r\nhost: {addr}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(addr).expect("connect");
        stream.write_all(request.as_bytes()).expect("write");
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        let answer = String::from_utf8_lossy(&answer);
        answer
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    })
    .await
    .expect("join")
}

// ---------------------------------------------------------------------------------------------
// Per-route limits (HTTP)

/// Spellings of `/login` a client can send; none may skip the login limit.
const HOSTILE_LOGINS: &[&str] = &[
    "/LOGIN",
    "/Login",
    "//login",
    "///login",
    "/login/",
    "/login//",
    "/log%69n",
    "/%6C%6F%67%69%6E",
    "/log%2569n",
    "/login?x=1",
    "/login?",
    "/login;x",
    "/login;jsessionid=0",
    "/x/../login",
    "/x/..;/login",
    "/./login",
    "/%2e/login",
    "/x/%2E%2E/login",
    "/x%2F..%2Flogin",
    "/login%2F",
    "/login%2f",
];

/// `/login` 5 a minute, every other path 100, in one layer on the whole router (what `tower_governor`
/// users ask for): exactly 5 logins, exactly 100 other requests; each admitted response names
/// only the limit that applied; every hostile spelling of `/login` meets the spent login limit;
/// a nested router matches the path the client sent.
async fn login_and_the_rest(store: Store) {
    let limiter = store.limiter(|b| b).await;
    let layer = per_ip(concat!(module_path!(), "::login"), 5)
        .path("/login")
        .and()
        .scope(concat!(module_path!(), "::api"))
        .num(100)
        .period(MINUTE)
        .by("ip")
        .except_path("/login")
        .limiter(limiter.clone())
        .build()
        .expect("layer");
    let v1 = Router::new()
        .route("/login", post(|| async { "v1 welcome" }))
        .layer(
            per_ip(concat!(module_path!(), "::v1_login"), 1)
                .path("/v1/login")
                .limiter(limiter.clone())
                .build()
                .expect("layer"),
        );
    let app = Router::new()
        .route("/login", post(|| async { "welcome" }))
        .route("/", get(|| async { "home" }))
        .route("/other", get(|| async { "other" }))
        .nest("/v1", v1)
        .layer(layer);
    let addr = serve_axum(app, "127.0.0.1").await;
    let base = format!("http://{addr}");
    let c = client();
    for remaining in (0..5).rev() {
        let a = send(c.post(format!("{base}/login"))).await;
        assert_eq!(a.status, 200, "{a:?}");
        assert_eq!(a.header("ratelimit-policy"), Some("\"login\";q=5;w=60"));
        assert_eq!(a.remaining(), remaining);
    }
    let refused = send(c.post(format!("{base}/login"))).await;
    refused.assert_too_many();
    assert_eq!(
        refused.header("ratelimit-policy"),
        Some("\"login\";q=5;w=60")
    );
    // Every other spelling of /login is refused by the spent login limit (all or nothing:
    // the catch-all, which may apply too, takes nothing from a refused request).
    for spelling in HOSTILE_LOGINS {
        for method in ["POST", "GET"] {
            let status = raw_status(addr, method, spelling).await;
            assert_eq!(status, 429, "{method} {spelling} was not limited as /login");
        }
    }
    // The rest: exactly 100, named "api" alone.
    let first = send(c.get(format!("{base}/"))).await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.header("ratelimit-policy"), Some("\"api\";q=100;w=60"));
    assert_eq!(first.remaining(), 99);
    let rest = statuses(100, || c.get(format!("{base}/other"))).await;
    assert_eq!(rest.iter().filter(|s| **s == 200).count(), 99, "{rest:?}");
    assert_eq!(rest[99], 429);
    // Another client has its own buckets; under a nested router the path matched is the one
    // the client sent (`/v1/login`), and the catch-all applies there too.
    let other = client_from("127.0.0.2");
    let a = send(other.post(format!("{base}/v1/login"))).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.body, "v1 welcome");
    assert_eq!(
        a.header("ratelimit-policy"),
        Some("\"v1_login\";q=1;w=60, \"api\";q=100;w=60")
    );
    send(other.post(format!("{base}/v1/login")))
        .await
        .assert_too_many();
    let a = send(other.post(format!("{base}/login"))).await;
    assert_eq!((a.status, a.remaining()), (200, 4), "{a:?}");
}

#[tokio::test]
async fn layer_routes_login_5_and_the_rest_100_in_one_layer_memory() {
    login_and_the_rest(Store::Memory).await;
}

#[tokio::test]
async fn layer_routes_login_5_and_the_rest_100_in_one_layer_redis() {
    login_and_the_rest(Store::Redis(RedisServer::start())).await;
}

/// A leased global limit on a whole router (`.lease(…)`) over loopback on Redis: 8
/// clients send 2,000 requests against 1,000 a minute. Admitted: at most 1,000, and at least
/// 1,000 less one lease's most units (a tenth of the quota: 100); every refusal is a 429 with
/// `Retry-After`; once the leases end, Redis counts exactly the admitted requests (the unused
/// units came back); and the requests cost far fewer script calls than requests.
#[tokio::test]
async fn layer_routes_a_leased_global_limit_admits_at_most_its_quota_redis() {
    const QUOTA: u64 = 1_000;
    let store = Store::Redis(RedisServer::start());
    let limiter = store.limiter(|b| b).await;
    let scope = "layer-lease";
    let layer = RateLimitLayer::builder()
        .scope(scope)
        .num(QUOTA)
        .period(MINUTE)
        .by("global")
        .lease(Lease::new(Duration::from_millis(100)).expect("a lease"))
        .limiter(limiter.clone())
        .build()
        .expect("layer");
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let addr = serve_axum(app, "127.0.0.1").await;
    let Store::Redis(server) = &store else {
        unreachable!("a Redis store")
    };
    let mut conn = server.connection().await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .expect("CONFIG RESETSTAT");

    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..8 {
        clients.spawn(async move {
            let (c, url) = (client(), format!("http://{addr}/"));
            let (mut admitted, mut refused) = (0_u64, 0_u64);
            for _ in 0..250 {
                let a = send(c.get(&url)).await;
                if a.status == 200 {
                    admitted += 1;
                } else {
                    a.assert_too_many();
                    refused += 1;
                }
            }
            (admitted, refused)
        });
    }
    let (mut admitted, mut refused) = (0, 0);
    while let Some(done) = clients.join_next().await {
        let (a, r) = done.expect("a client");
        admitted += a;
        refused += r;
    }
    assert_eq!(admitted + refused, 2_000);
    assert!(admitted <= QUOTA, "over the quota: {admitted}");
    assert!(
        admitted >= QUOTA - QUOTA / 10,
        "under-admitted past one lease: {admitted}"
    );

    // Every lease has ended (100 ms) and given back what it did not use: the window's counter
    // (a fixed window: the one key under the scope that is not a receipt or a block marker)
    // reads exactly the admitted requests.
    tokio::time::sleep(Duration::from_millis(400)).await;
    ratelimit_tests::settle(Duration::from_secs(5), || limiter.lease_units_held() == 0).await;
    assert_eq!(limiter.lease_units_held(), 0, "a lease outlived its life");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{scope}*"))
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    let counters: Vec<&String> = keys
        .iter()
        .filter(|k| !k.contains(":r:") && !k.ends_with(":b"))
        .collect();
    assert_eq!(counters.len(), 1, "{keys:?}");
    let counted: u64 = redis::cmd("GET")
        .arg(counters[0])
        .query_async(&mut conn)
        .await
        .expect("GET the counter");
    assert_eq!(counted, admitted, "Redis counts the admitted requests");
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("INFO commandstats");
    let script_calls = crate::lease::script_calls(&stats);
    eprintln!(
        "leased layer: admitted {admitted}, refused {refused}, {script_calls} script calls for 2,000 requests"
    );
    assert!(
        script_calls * 10 < 2_000,
        "leases saved few round trips: {script_calls} script calls"
    );
}

/// `.method(POST)`: only POSTs are limited (a GET passes through with no fields), and a
/// request no limit applies to is not checked at all, not even against the deny list.
async fn methods_and_unlimited_requests(store: Store) {
    let limiter = store.limiter(|b| b.deny_networks(["127.0.0.3"])).await;
    let layer = per_ip(concat!(module_path!(), "::posts"), 2)
        .method(axum::http::Method::POST)
        .path("/items")
        .limiter(limiter)
        .build()
        .expect("layer");
    let ok = || async { "ok" };
    let app = Router::new()
        .route("/items", get(ok).post(ok))
        .route("/free", get(ok))
        .layer(layer);
    let base = format!("http://{}", serve_axum(app, "127.0.0.1").await);
    let c = client();
    let free = send(c.get(format!("{base}/items"))).await;
    assert_eq!(free.status, 200);
    assert!(free.header("ratelimit").is_none(), "{free:?}");
    assert_eq!(
        statuses(3, || c.post(format!("{base}/items"))).await,
        [200, 200, 429]
    );
    assert_eq!(
        statuses(3, || c.get(format!("{base}/items"))).await,
        [200; 3]
    );
    let denied = client_from("127.0.0.3");
    assert_eq!(send(denied.post(format!("{base}/items"))).await.status, 403);
    let passes = send(denied.get(format!("{base}/free"))).await;
    assert_eq!(passes.status, 200, "{passes:?}");
}

#[tokio::test]
async fn layer_routes_methods_and_unlimited_requests() {
    for store in Store::both() {
        methods_and_unlimited_requests(store()).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Overrides, quotas, costs, counts (HTTP)

/// `set_quota` on the layer's scope changes its admissions from the next request on;
/// `clear_quota` gives back the layer's own numbers.
async fn overrides(store: Store) {
    const SCOPE: &str = concat!(module_path!(), "::overrides");
    let limiter = store.limiter(|b| b).await;
    let layer = per_ip(SCOPE, 5)
        .limiter(limiter.clone())
        .build()
        .expect("layer");
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let base = format!("http://{}/", serve_axum(app, "127.0.0.1").await);
    let c = client();
    limiter
        .set_quota(SCOPE, Quota::per_minute(2).unwrap())
        .unwrap();
    let a = send(c.get(&base)).await;
    assert_eq!(a.header("ratelimit-policy"), Some("\"overrides\";q=2;w=60"));
    assert_eq!(statuses(2, || c.get(&base)).await, [200, 429]);
    // Another scope's override changes nothing here.
    limiter
        .set_quota("elsewhere", Quota::per_minute(1).unwrap())
        .unwrap();
    limiter.clear_quota(SCOPE);
    assert_eq!(
        statuses(6, || c.get(&base)).await,
        [200, 200, 200, 200, 200, 429]
    );
}

#[tokio::test]
async fn layer_routes_set_quota_changes_admissions() {
    for store in Store::both() {
        overrides(store()).await;
    }
}

/// The auth layer in front: `x-user: ann` gets 2 a minute, `bob` 4, no user no quota.
async fn auth(mut req: Request, next: Next) -> Response {
    let user = req
        .headers()
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(user) = user {
        let quota = if user == "bob" { 4 } else { 2 };
        req.extensions_mut().insert(UserId::new(user));
        req.extensions_mut()
            .insert(Quota::per_minute(quota).expect("quota"));
    }
    next.run(req).await
}

/// Two users, two quotas from the request, exact; no quota: 401.
async fn quota_from_request(store: Store) {
    let limiter = store.limiter(|b| b).await;
    let layer = RateLimitLayer::builder()
        .scope(concat!(module_path!(), "::plans"))
        .by("user")
        .quota_from_request()
        .limiter(limiter)
        .build()
        .expect("layer");
    let app = Router::new()
        .route("/search", get(|| async { "results" }))
        .layer(layer)
        .layer(middleware::from_fn(auth));
    let base = format!("http://{}/search", serve_axum(app, "127.0.0.1").await);
    let c = client();
    let as_user = |u: &'static str| c.get(&base).header("x-user", u);
    let ann = send(as_user("ann")).await;
    assert_eq!(ann.header("ratelimit-policy"), Some("\"plans\";q=2;w=60"));
    assert_eq!(statuses(2, || as_user("ann")).await, [200, 429]);
    assert_eq!(
        statuses(5, || as_user("bob")).await,
        [200, 200, 200, 200, 429]
    );
    let nobody = send(c.get(&base)).await;
    assert_eq!(nobody.status, 401, "{nobody:?}");
    assert_eq!(nobody.json()["error"], "unauthorized");
}

#[tokio::test]
async fn layer_routes_quota_from_the_request() {
    for store in Store::both() {
        quota_from_request(store()).await;
    }
}

/// 10 units a minute, a request costs its `x-cost`: exact units; beyond the capacity, 400.
async fn costs(store: Store) {
    let limiter = store.limiter(|b| b).await;
    let layer = per_ip(concat!(module_path!(), "::units"), 10)
        .cost_fn(|parts| {
            parts
                .headers
                .get("x-cost")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        })
        .limiter(limiter)
        .build()
        .expect("layer");
    let app = Router::new()
        .route("/", post(|| async { "ok" }))
        .layer(layer);
    let base = format!("http://{}/", serve_axum(app, "127.0.0.1").await);
    let c = client();
    let costing = |n: u64| send(c.post(&base).header("x-cost", n.to_string()));
    let too_big = costing(11).await;
    assert_eq!(too_big.status, 400, "{too_big:?}");
    assert_eq!(too_big.json()["error"], "cost_exceeds_capacity");
    for left in [7, 4, 1] {
        let a = costing(3).await;
        assert_eq!((a.status, a.remaining()), (200, left), "{a:?}");
    }
    // 2 units do not fit in the 1 left: refused, the 1 kept.
    let refused = costing(2).await;
    assert_eq!(
        (refused.status, refused.remaining()),
        (429, 1),
        "{refused:?}"
    );
    // 0 counts as 1.
    let a = costing(0).await;
    assert_eq!((a.status, a.remaining()), (200, 0), "{a:?}");
    assert_eq!(costing(1).await.status, 429);
}

#[tokio::test]
async fn layer_routes_cost_per_request_in_exact_units() {
    for store in Store::both() {
        costs(store()).await;
    }
}

/// `count(Count::ERRORS)`, 3 a minute: successes never count (each sees 2 remaining: its unit
/// came back), 4xx and 5xx do; once spent, every request is refused.
async fn count_errors(store: Store) {
    let limiter = store.limiter(|b| b).await;
    let layer = per_ip(concat!(module_path!(), "::failures"), 3)
        .count(Count::ERRORS)
        .limiter(limiter)
        .build()
        .expect("layer");
    let app = Router::new()
        .route(
            "/",
            post(|headers: axum::http::HeaderMap| async move {
                let status = headers
                    .get("x-status")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(200);
                StatusCode::from_u16(status).unwrap()
            }),
        )
        .layer(layer);
    let base = format!("http://{}/", serve_axum(app, "127.0.0.1").await);
    let c = client();
    let answering = |status: u16| c.post(&base).header("x-status", status.to_string());
    for _ in 0..5 {
        let a = send(answering(200)).await;
        assert_eq!((a.status, a.remaining()), (200, 2), "{a:?}");
    }
    assert_eq!(statuses(2, || answering(302)).await, [302, 302]);
    assert_eq!(statuses(4, || answering(401)).await, [401, 401, 401, 429]);
    assert_eq!(statuses(1, || answering(200)).await, [429]);
    let other = client_from("127.0.0.2");
    let other_answering = |status: u16| other.post(&base).header("x-status", status.to_string());
    assert_eq!(
        statuses(4, || other_answering(503)).await,
        [503, 503, 503, 429]
    );
}

#[tokio::test]
async fn layer_routes_count_only_errors() {
    for store in Store::both() {
        count_errors(store()).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Exemptions and the deny list (HTTP)

/// Loopback 127.0.0.1 exempt by network, `/healthz` by predicate: unlimited and without
/// fields; another client is limited; a denied one gets the 403.
async fn exemptions_and_deny_list(store: Store) {
    let limiter = store
        .limiter(|b| {
            b.exempt_networks(["127.0.0.1"])
                .exempt_when(|caller| caller.path() == "/healthz")
                .deny_networks(["127.0.0.3/32"])
        })
        .await;
    let layer = per_ip(concat!(module_path!(), "::exempt"), 1)
        .limiter(limiter)
        .build()
        .expect("layer");
    let ok = || async { "ok" };
    let app = Router::new()
        .route("/", get(ok))
        .route("/healthz", get(ok))
        .layer(layer);
    let base = format!("http://{}", serve_axum(app, "127.0.0.1").await);
    let exempt = client();
    for _ in 0..3 {
        let a = send(exempt.get(format!("{base}/"))).await;
        assert_eq!(a.status, 200, "{a:?}");
        assert!(a.header("ratelimit").is_none(), "{a:?}");
        assert!(a.header("ratelimit-policy").is_none(), "{a:?}");
    }
    let other = client_from("127.0.0.2");
    for _ in 0..3 {
        let a = send(other.get(format!("{base}/healthz"))).await;
        assert_eq!(a.status, 200, "{a:?}");
        assert!(a.header("ratelimit").is_none(), "{a:?}");
    }
    let a = send(other.get(format!("{base}/"))).await;
    assert_eq!((a.status, a.remaining()), (200, 0), "{a:?}");
    send(other.get(format!("{base}/"))).await.assert_too_many();
    let denied = client_from("127.0.0.3");
    for path in ["/", "/healthz"] {
        let a = send(denied.get(format!("{base}{path}"))).await;
        assert_eq!(a.status, 403, "{path}: {a:?}");
        assert_eq!(a.json()["error"], "forbidden");
    }
}

#[tokio::test]
async fn layer_routes_exemptions_and_deny_list() {
    for store in Store::both() {
        exemptions_and_deny_list(store()).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The same through a tonic server

const CHECK: &str = "/grpc.health.v1.Health/Check";

/// Serves tonic-health's service behind `$layer` (`Server::builder().layer(…)`) on a loopback
/// port; evaluates to its address.
macro_rules! serve_grpc {
    ($layer:expr) => {{
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (_reporter, health) = tonic_health::server::health_reporter();
        let layer = $layer;
        tokio::spawn(async move {
            Server::builder()
                .layer(layer)
                .add_service(health)
                .serve_with_incoming(TcpIncoming::from(listener))
                .await
                .expect("serve");
        });
        addr
    }};
}

async fn grpc_client(addr: SocketAddr, local: &str) -> HealthClient<Channel> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .local_address(Some(local.parse().expect("ip")))
        .connect()
        .await
        .expect("connect");
    HealthClient::new(channel)
}

/// A health check of `service` (`""` is served; any other is `NOT_FOUND`) with `metadata`:
/// its code and the `ratelimit-policy` it carried.
async fn grpc_check(
    client: &HealthClient<Channel>,
    service: &str,
    metadata: &[(&'static str, String)],
) -> (Code, Option<String>) {
    let mut request = tonic::Request::new(HealthCheckRequest {
        service: service.to_owned(),
    });
    for (name, value) in metadata {
        request
            .metadata_mut()
            .insert(*name, value.parse().expect("value"));
    }
    let policy = |m: &tonic::metadata::MetadataMap| {
        m.get("ratelimit-policy")
            .map(|v| v.to_str().unwrap().to_owned())
    };
    match client.clone().check(request).await {
        Ok(response) => (Code::Ok, policy(response.metadata())),
        Err(status) => (status.code(), policy(status.metadata())),
    }
}

async fn codes(
    n: usize,
    client: &HealthClient<Channel>,
    service: &str,
    metadata: &[(&'static str, String)],
) -> Vec<Code> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(grpc_check(client, service, metadata).await.0);
    }
    out
}

/// Per-route limits by gRPC method path; overrides on the layer's scope; the admitted
/// response's metadata names only the limits that applied.
async fn grpc_routes_and_overrides(store: Store) {
    const SCOPE: &str = concat!(module_path!(), "::check");
    let limiter = store.limiter(|b| b).await;
    let layer = per_ip(SCOPE, 2)
        .path(CHECK)
        .and()
        .scope(concat!(module_path!(), "::watch"))
        .num(1)
        .period(MINUTE)
        .by("ip")
        .path("/grpc.health.v1.Health/Watch")
        .limiter(limiter.clone())
        .build()
        .expect("layer");
    let addr = serve_grpc!(layer);
    let client = grpc_client(addr, "127.0.0.1").await;
    let first = grpc_check(&client, "", &[]).await;
    assert_eq!(first, (Code::Ok, Some("\"check\";q=2;w=60".to_owned())));
    assert_eq!(
        codes(2, &client, "", &[]).await,
        [Code::Ok, Code::ResourceExhausted]
    );
    // An override of the scope: another bucket, 1 a minute, from the next call on.
    limiter
        .set_quota(SCOPE, Quota::per_minute(1).unwrap())
        .unwrap();
    let other = grpc_client(addr, "127.0.0.2").await;
    let first = grpc_check(&other, "", &[]).await;
    assert_eq!(first, (Code::Ok, Some("\"check\";q=1;w=60".to_owned())));
    assert_eq!(codes(1, &other, "", &[]).await, [Code::ResourceExhausted]);
}

#[tokio::test]
async fn layer_routes_grpc_routes_and_overrides() {
    for store in Store::both() {
        grpc_routes_and_overrides(store()).await;
    }
}

/// `count(Count::ERRORS)` on gRPC: a served check (status `0` in the trailers, after a body)
/// gives its unit back before the client sees the end of the call; a `NOT_FOUND` (a
/// trailers-only answer) counts. Costs per call from metadata, exact.
async fn grpc_counts_and_costs(store: Store) {
    let limiter = store.limiter(|b| b).await;
    let counted = per_ip(concat!(module_path!(), "::grpc_failures"), 2)
        .count(Count::ERRORS)
        .limiter(limiter.clone())
        .build()
        .expect("layer");
    let addr = serve_grpc!(counted);
    let client = grpc_client(addr, "127.0.0.1").await;
    assert_eq!(codes(5, &client, "", &[]).await, [Code::Ok; 5]);
    assert_eq!(
        codes(3, &client, "unknown", &[]).await,
        [Code::NotFound, Code::NotFound, Code::ResourceExhausted]
    );
    assert_eq!(codes(1, &client, "", &[]).await, [Code::ResourceExhausted]);

    let costed = per_ip(concat!(module_path!(), "::grpc_units"), 10)
        .cost_fn(|parts| {
            parts
                .headers
                .get("x-cost")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        })
        .limiter(limiter)
        .build()
        .expect("layer");
    let addr = serve_grpc!(costed);
    let client = grpc_client(addr, "127.0.0.1").await;
    let cost = |n: u64| [("x-cost", n.to_string())];
    assert_eq!(
        codes(1, &client, "", &cost(11)).await,
        [Code::InvalidArgument]
    );
    assert_eq!(
        codes(4, &client, "", &cost(3)).await,
        [Code::Ok, Code::Ok, Code::Ok, Code::ResourceExhausted]
    );
    assert_eq!(
        codes(2, &client, "", &cost(1)).await,
        [Code::Ok, Code::ResourceExhausted]
    );
}

#[tokio::test]
async fn layer_routes_grpc_count_errors_and_costs() {
    for store in Store::both() {
        grpc_counts_and_costs(store()).await;
    }
}

/// Exempt clients pass unlimited with no metadata; denied ones get `PERMISSION_DENIED` in a
/// trailers-only answer (HTTP 200, `grpc-status: 7` in the headers, no body); a quota from
/// the request (an auth layer in front of the limits), none: `UNAUTHENTICATED`.
async fn grpc_exemptions_deny_list_and_quotas(store: Store) {
    let limiter = store
        .limiter(|b| {
            b.exempt_networks(["127.0.0.2"])
                .deny_networks(["127.0.0.3"])
        })
        .await;
    let layer = per_ip(concat!(module_path!(), "::grpc_exempt"), 1)
        .and()
        .scope(concat!(module_path!(), "::grpc_plans"))
        .by("header:x-user")
        .quota_from_request()
        .limiter(limiter)
        .build()
        .expect("layer");
    // The auth layer: `x-user: bob` gets 3 a minute, anyone else named 1.
    let auth = tower::ServiceBuilder::new()
        .map_request(|mut req: axum::http::Request<tonic::body::Body>| {
            let quota = match req
                .headers()
                .get("x-user")
                .map(axum::http::HeaderValue::as_bytes)
            {
                Some(b"bob") => Some(3),
                Some(_) => Some(1),
                None => None,
            };
            if let Some(n) = quota {
                req.extensions_mut()
                    .insert(Quota::per_minute(n).expect("quota"));
            }
            req
        })
        .layer(layer);
    let addr = serve_grpc!(auth);
    let user = |u: &str| [("x-user", u.to_owned())];
    let exempt = grpc_client(addr, "127.0.0.2").await;
    for _ in 0..3 {
        assert_eq!(
            grpc_check(&exempt, "", &user("bob")).await,
            (Code::Ok, None)
        );
    }
    // Exempt from every limit of the layer, the quota's too: no quota needed.
    assert_eq!(grpc_check(&exempt, "", &[]).await, (Code::Ok, None));
    let counted = grpc_client(addr, "127.0.0.1").await;
    let (code, policy) = grpc_check(&counted, "", &user("bob")).await;
    assert_eq!(code, Code::Ok);
    let policy = policy.expect("policy");
    assert!(policy.ends_with("\"grpc_plans\";q=3;w=60"), "{policy}");
    assert_eq!(
        codes(1, &counted, "", &user("bob")).await,
        [Code::ResourceExhausted]
    );
    assert_eq!(codes(1, &counted, "", &[]).await, [Code::Unauthenticated]);
    let denied = grpc_client(addr, "127.0.0.3").await;
    assert_eq!(
        codes(1, &denied, "", &user("bob")).await,
        [Code::PermissionDenied]
    );
    // The raw answer: trailers-only.
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .local_address(Some("127.0.0.3".parse().expect("ip")))
        .connect()
        .await
        .expect("connect");
    let request = axum::http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}{CHECK}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::empty())
        .expect("request");
    let response = tower::ServiceExt::oneshot(channel, request)
        .await
        .expect("response");
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["grpc-status"], "7");
    assert_eq!(response.headers()["content-type"], "application/grpc");
    assert!(response.headers().contains_key("grpc-message"));
}

#[tokio::test]
async fn layer_routes_grpc_exemptions_deny_list_and_quotas() {
    for store in Store::both() {
        grpc_exemptions_deny_list_and_quotas(store()).await;
    }
}
