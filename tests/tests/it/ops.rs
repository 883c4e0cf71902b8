//! Operating limits safely: shadow mode, exemptions and the deny list, the admin
//! calls (peek, reset, block) and the metrics, on the memory store and a private Redis (and a
//! Redis Cluster for the admin calls), over real HTTP where a handler is involved.
//!
//! The metrics are read through `metrics-util`'s `DebuggingRecorder`, installed once for the
//! process; the log events through a small subscriber, also process-wide. Every test uses
//! scopes of its own, so the counts of parallel tests never mix.

#![allow(
    clippy::duration_suboptimal_units,
    reason = "Duration::from_mins is newer than the workspace's rust-version"
)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use ratelimit_runtime::key::{self, Part, Source};
use ratelimit_runtime::store::StoreFuture;
use ratelimit_runtime::{
    Algorithm, By, FailurePolicy, Limit, Policy, RateLimitError, RateLimiter, RedisStore, Store,
    Target, UserId, net::IpNet, rate_limit, store::Check,
};
use ratelimit_tests::env::Env;
use ratelimit_tests::redis_cluster::RedisCluster;
use ratelimit_tests::redis_server::RedisServer;

use crate::http_support::{Answer, Backend, client_from, serve_axum};

// ---------------------------------------------------------------------------------------------
// What the tests read: metrics and log events.

fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this process");
        snapshotter
    })
}

/// Everything recorded so far, by metric name and sorted labels: counters summed, histograms
/// as their number of samples. The debugging recorder's snapshots drain what they read, and
/// tests run in parallel: every snapshot is added here, and tests read from here.
type Totals = HashMap<(String, Vec<String>), u64>;

/// Gauges by name and sorted labels: each snapshot gives what moved since the last one.
type Gauges = HashMap<(String, Vec<String>), f64>;

fn recorded() -> std::sync::MutexGuard<'static, Totals> {
    static TOTALS: OnceLock<Mutex<Totals>> = OnceLock::new();
    let mut totals = TOTALS.get_or_init(Mutex::default).lock().unwrap();
    let mut gauges = gauges();
    for (key, _, _, value) in snapshotter().snapshot().into_vec() {
        let key = key.key();
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let n = match value {
            DebugValue::Counter(n) => n,
            DebugValue::Histogram(samples) => samples.len() as u64,
            DebugValue::Gauge(moved) => {
                *gauges.entry((key.name().to_owned(), labels)).or_default() += moved.into_inner();
                continue;
            }
        };
        *totals.entry((key.name().to_owned(), labels)).or_default() += n;
    }
    totals
}

fn gauges() -> std::sync::MutexGuard<'static, Gauges> {
    static GAUGES: OnceLock<Mutex<Gauges>> = OnceLock::new();
    GAUGES.get_or_init(Mutex::default).lock().unwrap()
}

/// The gauge `name{scope}` now.
fn gauge(name: &str, scope: &str) -> f64 {
    drop(recorded());
    let scope = format!("scope={scope}");
    gauges()
        .iter()
        .filter(|((n, labels), _)| n == name && labels.contains(&scope))
        .map(|(_, v)| v)
        .sum()
}

/// The counter `name{scope}` so far.
fn counter(name: &str, scope: &str) -> u64 {
    let scope = format!("scope={scope}");
    recorded()
        .iter()
        .filter(|((n, labels), _)| n == name && labels.contains(&scope))
        .map(|(_, v)| v)
        .sum()
}

/// `ratelimit_calls_total{scope, outcome}`, summed over the algorithms.
fn calls(scope: &str, outcome: &str) -> u64 {
    let (scope, outcome) = (format!("scope={scope}"), format!("outcome={outcome}"));
    recorded()
        .iter()
        .filter(|((name, labels), _)| {
            name == "ratelimit_calls_total" && labels.contains(&scope) && labels.contains(&outcome)
        })
        .map(|(_, n)| n)
        .sum()
}

/// Every label of every metric recorded, to check that no caller value is one.
fn all_label_values() -> Vec<String> {
    recorded()
        .keys()
        .flat_map(|(_, labels)| labels.clone())
        .collect()
}

/// Samples of `ratelimit_store_seconds{store}` recorded so far.
fn store_samples(store: &str) -> u64 {
    let store = format!("store={store}");
    recorded()
        .iter()
        .filter(|((name, labels), _)| name == "ratelimit_store_seconds" && labels.contains(&store))
        .map(|(_, n)| n)
        .sum()
}

/// `ratelimit_store_errors_total{store, error}` recorded so far.
fn store_errors(store: &str, error: &str) -> u64 {
    let (store, error) = (format!("store={store}"), format!("error={error}"));
    recorded()
        .iter()
        .filter(|((name, labels), _)| {
            name == "ratelimit_store_errors_total"
                && labels.contains(&store)
                && labels.contains(&error)
        })
        .map(|(_, n)| n)
        .sum()
}

fn capture_logs() {
    ratelimit_tests::logs::capture();
}

/// The shadow-mode events of `scope` so far.
fn shadow_events(scope: &str) -> usize {
    ratelimit_tests::logs::events()
        .iter()
        .filter(|e| {
            e.message.contains("would reject (shadow mode)") && e.field("scope") == Some(scope)
        })
        .count()
}

// ---------------------------------------------------------------------------------------------
// Shadow mode.

#[rate_limit(num = 3, time = 60, key = "{id}", scope = "ops_shadow_all_memory")]
async fn shadow_all_memory(id: &str) -> Result<(), RateLimitError> {
    let _ = id;
    Ok(())
}

#[rate_limit(num = 3, time = 60, key = "{id}", scope = "ops_shadow_all_redis")]
async fn shadow_all_redis(id: &str) -> Result<(), RateLimitError> {
    let _ = id;
    Ok(())
}

/// `Builder::shadow(true)`: ten calls over a quota of three all run; the metric and the log
/// count exactly the seven a limiter enforcing the same limit rejects; then the same calls on
/// an enforcing limiter are rejected exactly as counted.
#[tokio::test]
async fn shadow_mode_admits_every_call_and_counts_exactly_the_would_be_rejections() {
    snapshotter();
    capture_logs();
    for (env, scope) in [
        (Env::memory().await.1, "ops_shadow_all_memory"),
        (Env::redis().await.1, "ops_shadow_all_redis"),
    ] {
        let builder = RateLimiter::builder().timeout(Duration::from_secs(2));
        let builder = match &env {
            Env::Memory(clock) => {
                builder.store(ratelimit_runtime::MemoryStore::with_clock(clock.clone()))
            }
            Env::Redis(server) => builder.redis_url(server.url()),
        };
        let shadow = builder.shadow(true).build().await.unwrap();
        let call = |id: &'static str| async move {
            if scope.ends_with("memory") {
                shadow_all_memory(id).await
            } else {
                shadow_all_redis(id).await
            }
        };
        let results = shadow
            .clone()
            .scope(async {
                let mut out = Vec::new();
                for _ in 0..10 {
                    out.push(call("alice").await);
                }
                // Another caller has a quota of its own, in shadow as well.
                out.push(call("bob").await);
                out
            })
            .await;
        assert!(results.iter().all(Result::is_ok), "{scope}: {results:?}");
        assert_eq!(calls(scope, "shadow_rejected"), 7, "{scope}");
        assert_eq!(calls(scope, "admitted"), 4, "{scope}");
        assert_eq!(calls(scope, "rejected"), 0, "{scope}");
        assert_eq!(shadow_events(scope), 7, "{scope}");

        // Turned on: alice's quota is spent (shadow counted as usual), bob has two left.
        let enforcing = match &env {
            Env::Redis(server) => RateLimiter::builder()
                .redis_url(server.url())
                .timeout(Duration::from_secs(2))
                .build()
                .await
                .unwrap(),
            Env::Memory(_) => shadow.clone(),
        };
        if let Env::Redis(_) = env {
            let (alice, bob) = enforcing
                .scope(async { (call("alice").await, call("bob").await) })
                .await;
            assert!(alice.unwrap_err().is_limited(), "{scope}");
            assert!(bob.is_ok(), "{scope}");
            assert_eq!(calls(scope, "rejected"), 1, "{scope}");
        }
    }
}

#[rate_limit(
    num = 2,
    time = 60,
    by = "ip",
    scope = "ops_shadow_http",
    shadow = true
)]
async fn shadow_handler() -> &'static str {
    "ran"
}

#[rate_limit(num = 3, time = 60, by = "ip", scope = "ops_mixed_enforced")]
#[rate_limit(
    num = 1,
    time = 60,
    by = "ip",
    scope = "ops_mixed_shadow",
    shadow = true
)]
async fn mixed_handler() -> &'static str {
    "ran"
}

/// `shadow = true` on one handler, over HTTP: no 429 and no rate-limit headers; a function that
/// stacks an enforced limit and a shadow one still enforces the first, which counts every call
/// that runs.
#[tokio::test]
async fn a_shadow_attribute_never_rejects_and_sends_no_headers_while_enforced_limits_hold() {
    snapshotter();
    capture_logs();
    let backend = Backend::redis();
    let limiter = backend.limiter(&[]).await;
    let app = Router::new()
        .route("/shadow", get(shadow_handler))
        .route("/mixed", get(mixed_handler))
        .layer(axum::Extension(limiter));
    let addr = serve_axum(app, "127.0.0.1").await;
    let client = client_from("127.0.0.1");
    for _ in 0..6 {
        let a = Answer::from(
            client
                .get(format!("http://{addr}/shadow"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!((a.status, a.body.as_str()), (200, "ran"));
        assert!(a.header("ratelimit").is_none(), "{a:?}");
        assert!(a.header("ratelimit-policy").is_none(), "{a:?}");
    }
    assert_eq!(calls("ops_shadow_http", "shadow_rejected"), 4);
    assert_eq!(shadow_events("ops_shadow_http"), 4);

    let mut statuses = Vec::new();
    for _ in 0..5 {
        let a = Answer::from(
            client
                .get(format!("http://{addr}/mixed"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        statuses.push(a.status);
        // No field names the shadow limit or its quota, 429 included (never
        // `"mixed_shadow";q=1;w=60`).
        for field in ["ratelimit-policy", "ratelimit"] {
            let value = a.header(field).unwrap_or_default();
            assert!(
                !value.contains("shadow") && !value.contains("q=1"),
                "{field}: {value}"
            );
        }
        if a.status == 429 {
            assert_eq!(
                a.header("ratelimit-policy"),
                Some("\"ops_mixed_enforced\";q=3;w=60")
            );
        }
    }
    // The enforced limit (3) counted the calls the shadow one (1) would have rejected.
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    // The shadow limit would have rejected every call after the first (also the two the
    // enforced limit rejected).
    assert_eq!(calls("ops_mixed_shadow", "shadow_rejected"), 4);
    // One event per would-be rejection, as the counter counts them (the calls the enforced
    // limit rejected too are logged, not only counted).
    assert_eq!(shadow_events("ops_mixed_shadow"), 4);
    assert_eq!(calls("ops_mixed_enforced", "admitted"), 3);
    assert_eq!(calls("ops_mixed_enforced", "rejected"), 2);
}

// ---------------------------------------------------------------------------------------------
// Exemptions and the deny list.

#[rate_limit(num = 1, time = 60, by = "ip", scope = "ops_exempt")]
async fn exempt_handler() -> &'static str {
    "ran"
}

#[rate_limit(num = 1, time = 60, by = "ip", scope = "ops_deny")]
async fn deny_handler() -> &'static str {
    "ran"
}

#[rate_limit(num = 1, time = 60, by = "ip", scope = "ops_exempt_memory")]
async fn exempt_handler_memory() -> &'static str {
    "ran"
}

#[rate_limit(num = 1, time = 60, by = "ip", scope = "ops_deny_memory")]
async fn deny_handler_memory() -> &'static str {
    "ran"
}

async fn fake_auth(mut req: Request, next: Next) -> Response {
    if let Some(user) = req.headers().get("x-user").and_then(|v| v.to_str().ok()) {
        let user = UserId::new(user);
        req.extensions_mut().insert(user);
    }
    next.run(req).await
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// Exempt networks and the predicate bypass every limit (no headers, no store call); the deny
/// list answers 403 with the JSON body before any store call (counted with `INFO
/// commandstats`); a client that names an exempt or denied address in `X-Forwarded-For` from
/// an untrusted peer changes nothing, while a trusted proxy's header is believed.
#[tokio::test]
async fn exemptions_bypass_and_the_deny_list_refuses_without_a_store_call() {
    let server = RedisServer::start();
    let handlers = (exempt_handler, deny_handler);
    exemptions_scenario(Some(&server), handlers, ("ops_exempt", "ops_deny")).await;
}

/// The same on the memory store (no store to count commands of: the answers and the metrics).
#[tokio::test]
async fn exemptions_bypass_and_the_deny_list_refuses_memory() {
    let handlers = (exempt_handler_memory, deny_handler_memory);
    let scopes = ("ops_exempt_memory", "ops_deny_memory");
    exemptions_scenario(None, handlers, scopes).await;
}

#[allow(clippy::too_many_lines)] // one scenario, told in order
async fn exemptions_scenario<E, D, TE, TD>(
    server: Option<&RedisServer>,
    (exempt_handler, deny_handler): (E, D),
    (exempt_scope, deny_scope): (&str, &str),
) where
    E: axum::handler::Handler<TE, ()>,
    D: axum::handler::Handler<TD, ()>,
    TE: 'static,
    TD: 'static,
{
    snapshotter();
    let builder = RateLimiter::builder();
    let builder = match server {
        Some(server) => builder.redis_url(server.url()),
        None => builder.memory(),
    };
    let limiter = builder
        .timeout(Duration::from_secs(5))
        .trusted_proxies(["127.0.0.9"])
        .exempt_networks([net("127.0.0.2/32")])
        .deny_networks([net("127.0.0.3/32"), net("127.0.0.66/32")])
        .exempt_when(|caller| {
            caller.path() == "/healthz" || caller.user().is_some_and(|u| u.as_str() == "svc")
        })
        .build()
        .await
        .unwrap();
    let app = Router::new()
        .route("/exempt", get(exempt_handler.clone()))
        .route("/healthz", get(exempt_handler))
        .route("/deny", get(deny_handler))
        .layer(middleware::from_fn(fake_auth))
        .layer(axum::Extension(limiter));
    let addr: SocketAddr = serve_axum(app, "127.0.0.1").await;
    let port = addr.port();
    let get = |from: &str, path: &str, headers: &[(&str, &str)]| {
        let mut req = client_from(from).get(format!("http://127.0.0.1:{port}{path}"));
        for (n, v) in headers {
            req = req.header(*n, *v);
        }
        async move { Answer::from(req.send().await.unwrap()).await }
    };

    // An exempt network: always through, no headers.
    for _ in 0..4 {
        let a = get("127.0.0.2", "/exempt", &[]).await;
        assert_eq!(a.status, 200, "{a:?}");
        assert!(a.header("ratelimit").is_none(), "{a:?}");
    }
    // The predicate: the health check path, and the internal user.
    for _ in 0..3 {
        assert_eq!(get("127.0.0.5", "/healthz", &[]).await.status, 200);
        assert_eq!(
            get("127.0.0.6", "/exempt", &[("x-user", "svc")])
                .await
                .status,
            200
        );
    }
    assert_eq!(calls(exempt_scope, "exempted"), 10);
    // Not exempt: limited as usual.
    assert_eq!(
        get("127.0.0.6", "/exempt", &[("x-user", "eve")])
            .await
            .status,
        200
    );
    get("127.0.0.6", "/exempt", &[("x-user", "eve")])
        .await
        .assert_too_many();
    // Hostile: an untrusted peer names the exempt network in X-Forwarded-For.
    assert_eq!(
        get("127.0.0.7", "/exempt", &[("x-forwarded-for", "127.0.0.2")])
            .await
            .status,
        200
    );
    get("127.0.0.7", "/exempt", &[("x-forwarded-for", "127.0.0.2")])
        .await
        .assert_too_many();
    // From the trusted proxy, its header is believed: the client is exempt.
    for _ in 0..3 {
        let a = get("127.0.0.9", "/exempt", &[("x-forwarded-for", "127.0.0.2")]).await;
        assert_eq!(a.status, 200, "{a:?}");
    }

    // The deny list: 403 with a JSON body, and not one command reaches Redis.
    let mut conn = match server {
        Some(server) => Some(server.connection().await),
        None => None,
    };
    let before = match conn.as_mut() {
        Some(conn) => commands(conn).await,
        None => 0,
    };
    for (from, headers) in [
        ("127.0.0.3", &[][..]),
        ("127.0.0.9", &[("x-forwarded-for", "127.0.0.66")][..]),
    ] {
        for _ in 0..3 {
            let a = get(from, "/deny", headers).await;
            assert_eq!(a.status, 403, "{a:?}");
            assert_eq!(a.header("content-type"), Some("application/json"));
            assert_eq!(a.json()["error"], "forbidden", "{a:?}");
        }
    }
    let after = match conn.as_mut() {
        Some(conn) => commands(conn).await,
        None => 0,
    };
    assert_eq!(before, after, "the deny list made store calls");
    assert_eq!(calls(deny_scope, "denied"), 6);
    // Hostile: an untrusted peer cannot get a denied answer for someone else either way (its
    // header is not read): it is limited as itself.
    let a = get("127.0.0.8", "/deny", &[("x-forwarded-for", "127.0.0.3")]).await;
    assert_eq!(a.status, 200, "{a:?}");
    if let Some(conn) = conn.as_mut() {
        assert!(
            commands(conn).await > after,
            "a normal check calls the store"
        );
    }
}

/// The commands Redis ran, `INFO commandstats` itself left out: `cmd -> calls`.
async fn commands(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:"))
        .filter_map(|l| {
            let calls = l.split("calls=").nth(1)?.split(',').next()?;
            calls.parse::<u64>().ok()
        })
        .sum()
}

// ---------------------------------------------------------------------------------------------
// Peek, reset, block.

#[rate_limit(num = 3, time = 60, key = "{user}", scope = "ops_admin_memory")]
async fn admin_memory(user: &str) -> Result<(), RateLimitError> {
    let _ = user;
    Ok(())
}

#[rate_limit(num = 3, time = 60, key = "{user}", scope = "ops_admin_redis")]
async fn admin_redis(user: &str) -> Result<(), RateLimitError> {
    let _ = user;
    Ok(())
}

fn fixed_3_per_minute() -> Policy {
    Policy::new(Algorithm::Fixed, 3, Duration::from_secs(60)).unwrap()
}

/// The limit of `admin_*`, named for the admin calls as the attribute wrote it.
fn admin_limit(scope: &'static str) -> [Limit; 1] {
    [Limit::new(fixed_3_per_minute(), scope, By::Global)]
}

/// Peek reads without taking (on Redis: `DUMP` of the key equal before and after), reset lets
/// a spent caller through at once (the blocked-caller cache cleared too), block rejects a
/// caller whose quota is whole until the block's end, then lets it through.
#[tokio::test]
async fn peek_changes_nothing_reset_lets_through_block_rejects_until_its_end() {
    for (limiter, env) in [Env::memory().await, Env::redis().await] {
        let scope = if env.exact() {
            "ops_admin_memory"
        } else {
            "ops_admin_redis"
        };
        let call = |user: &'static str| async move {
            if env_is_memory(scope) {
                admin_memory(user).await
            } else {
                admin_redis(user).await
            }
        };
        let limits = admin_limit(scope);
        let alice = Target::global().key("alice");
        let redis_key = key::build(
            "ratelimit",
            scope,
            &[Part::new(Source::Key, b"alice")],
            &fixed_3_per_minute(),
        );
        let mut conn = match &env {
            Env::Redis(server) => Some(server.connection().await),
            Env::Memory(_) => None,
        };
        limiter
            .clone()
            .scope(async {
                // A whole quota reads as whole, and peeking takes nothing.
                for _ in 0..3 {
                    let v = limiter.peek(&limits, &alice).await.unwrap();
                    assert!(v.is_admitted(), "{scope}");
                    assert_eq!(v.decisions()[0].remaining, 3, "{scope}");
                }
                call("alice").await.unwrap();
                let dump_before = dump(conn.as_mut(), &redis_key).await;
                let v = limiter.peek(&limits, &alice).await.unwrap();
                assert_eq!(v.decisions()[0].remaining, 2, "{scope}");
                assert_eq!(
                    dump(conn.as_mut(), &redis_key).await,
                    dump_before,
                    "{scope}"
                );
                call("alice").await.unwrap();
                call("alice").await.unwrap();
                let spent = call("alice").await.unwrap_err();
                assert!(spent.is_limited(), "{scope}");
                // Rejected again (from the blocked-caller cache on Redis).
                assert!(call("alice").await.unwrap_err().is_limited(), "{scope}");
                let v = limiter.peek(&limits, &alice).await.unwrap();
                assert!(!v.is_admitted(), "{scope}");
                assert_eq!(v.decisions()[0].remaining, 0, "{scope}");
                let dump_before = dump(conn.as_mut(), &redis_key).await;
                assert!(dump_before.is_some() == conn.is_some(), "{scope}");
                limiter.peek(&limits, &alice).await.unwrap();
                assert_eq!(
                    dump(conn.as_mut(), &redis_key).await,
                    dump_before,
                    "{scope}"
                );

                // Support resets alice: through at once, with a whole quota.
                limiter.reset(&limits, &alice).await.unwrap();
                assert_eq!(dump(conn.as_mut(), &redis_key).await, None, "{scope}");
                call("alice").await.unwrap();
                assert_eq!(
                    limiter.peek(&limits, &alice).await.unwrap().decisions()[0].remaining,
                    2
                );

                // Bob is blocked with a whole quota: rejected until the block's end.
                let bob = Target::global().key("bob");
                let block = Duration::from_secs(1);
                let blocked = Instant::now();
                limiter.block(&limits, &bob, block).await.unwrap();
                let err = call("bob").await.unwrap_err();
                assert!(err.is_limited(), "{scope}: {err}");
                let wait = err.retry_after().unwrap();
                // The block's end less the time measured since it was written (a manual clock
                // does not move: then the whole block).
                let least = block.saturating_sub(blocked.elapsed() + Duration::from_millis(1));
                assert!(
                    wait >= least && wait <= block + Duration::from_millis(1),
                    "{scope}: {wait:?}"
                );
                assert!(!limiter.peek(&limits, &bob).await.unwrap().is_admitted());
                // Alice is not blocked.
                call("alice").await.unwrap();
                if env.exact() {
                    env.wait(wait.saturating_sub(Duration::from_millis(1)))
                        .await;
                    assert!(call("bob").await.unwrap_err().is_limited(), "{scope}");
                    env.wait(Duration::from_millis(1)).await;
                } else {
                    env.wait(wait).await;
                }
                call("bob").await.unwrap();
                // A block that a reset lifts.
                limiter
                    .block(&limits, &bob, Duration::from_secs(3600))
                    .await
                    .unwrap();
                assert!(call("bob").await.unwrap_err().is_limited(), "{scope}");
                limiter.reset(&limits, &bob).await.unwrap();
                call("bob").await.unwrap();
            })
            .await;
    }
}

fn env_is_memory(scope: &str) -> bool {
    scope.ends_with("memory")
}

async fn dump(conn: Option<&mut redis::aio::MultiplexedConnection>, key: &str) -> Option<Vec<u8>> {
    let conn = conn?;
    redis::cmd("DUMP").arg(key).query_async(conn).await.unwrap()
}

#[rate_limit(num = 2, time = 60, by = "ip", scope = "ops_admin_ip")]
async fn admin_ip_handler() -> &'static str {
    "ran"
}

/// The admin calls key an IP as `by = "ip"` does: blocking 127.0.0.2 rejects its requests with
/// the block's `Retry-After` while 127.0.0.1 goes through; a reset lets it through again.
#[tokio::test]
async fn an_ip_blocked_by_the_admin_api_gets_429_until_reset() {
    let backend = Backend::redis();
    let limiter = backend.limiter(&[]).await;
    let app = Router::new()
        .route("/", get(admin_ip_handler))
        .layer(axum::Extension(limiter.clone()));
    let addr = serve_axum(app, "127.0.0.1").await;
    let url = format!("http://127.0.0.1:{}/", addr.port());
    let limits = [Limit::new(
        Policy::new(Algorithm::Fixed, 2, Duration::from_secs(60)).unwrap(),
        "ops_admin_ip",
        By::Ip,
    )];
    let target = Target::ip("127.0.0.2".parse().unwrap());
    limiter
        .block(&limits, &target, Duration::from_secs(600))
        .await
        .unwrap();
    let blocked = Answer::from(client_from("127.0.0.2").get(&url).send().await.unwrap()).await;
    blocked.assert_too_many();
    let retry: u64 = blocked.header("retry-after").unwrap().parse().unwrap();
    assert!((599..=601).contains(&retry), "{blocked:?}");
    let other = Answer::from(client_from("127.0.0.1").get(&url).send().await.unwrap()).await;
    assert_eq!(other.status, 200);
    limiter.reset(&limits, &target).await.unwrap();
    let again = Answer::from(client_from("127.0.0.2").get(&url).send().await.unwrap()).await;
    assert_eq!(again.status, 200, "{again:?}");
    assert_eq!(again.remaining(), 1);
}

#[rate_limit(num = 3, time = 60, key = "{user}", scope = "ops_cluster_a")]
#[rate_limit(
    algo = "token",
    num = 2,
    time = 60,
    key = "{user}",
    scope = "ops_cluster_b"
)]
async fn cluster_call(user: &str) -> Result<(), RateLimitError> {
    let _ = user;
    Ok(())
}

/// On a Redis Cluster, with the two limits in different slots: peek reads both without
/// changing either key (`DUMP` on the node that holds it), reset lets a spent caller through,
/// block rejects until reset.
#[tokio::test]
async fn cluster_peek_reset_and_block() {
    let cluster = RedisCluster::start().await;
    let limiter = RateLimiter::builder()
        .redis_cluster(cluster.urls())
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let a = Policy::new(Algorithm::Fixed, 3, Duration::from_secs(60)).unwrap();
    let b = Policy::new(Algorithm::Token, 2, Duration::from_secs(60)).unwrap();
    let limits = [
        Limit::new(a, "ops_cluster_a", By::Global),
        Limit::new(b, "ops_cluster_b", By::Global),
    ];
    let keys = [
        key::build(
            "ratelimit",
            "ops_cluster_a",
            &[Part::new(Source::Key, b"carol")],
            &a,
        ),
        key::build(
            "ratelimit",
            "ops_cluster_b",
            &[Part::new(Source::Key, b"carol")],
            &b,
        ),
    ];
    let slots = [
        cluster.keyslot(&keys[0]).await,
        cluster.keyslot(&keys[1]).await,
    ];
    assert_ne!(slots[0], slots[1], "the test needs two slots");
    let carol = Target::global().key("carol");
    limiter
        .clone()
        .scope(async {
            cluster_call("carol").await.unwrap();
            cluster_call("carol").await.unwrap();
            assert!(cluster_call("carol").await.unwrap_err().is_limited());
            let mut dumps = Vec::new();
            for (k, slot) in keys.iter().zip(slots) {
                let mut node = cluster.node(cluster.master_of_slot(slot).await.port).await;
                let d: Option<Vec<u8>> = redis::cmd("DUMP")
                    .arg(k)
                    .query_async(&mut node)
                    .await
                    .unwrap();
                dumps.push((node, d));
            }
            let v = limiter.peek(&limits, &carol).await.unwrap();
            assert_eq!(v.decisions()[0].remaining, 1);
            assert_eq!(v.decisions()[1].remaining, 0);
            assert!(!v.is_admitted());
            for ((node, before), k) in dumps.iter_mut().zip(&keys) {
                let after: Option<Vec<u8>> =
                    redis::cmd("DUMP").arg(k).query_async(node).await.unwrap();
                assert!(before.is_some());
                assert_eq!(&after, before, "peek changed {k}");
            }
            limiter.reset(&limits, &carol).await.unwrap();
            cluster_call("carol").await.unwrap();
            limiter
                .block(&limits, &carol, Duration::from_secs(600))
                .await
                .unwrap();
            let err = cluster_call("carol").await.unwrap_err();
            assert!(
                err.retry_after().unwrap() > Duration::from_secs(599),
                "{err}"
            );
            limiter.reset(&limits, &carol).await.unwrap();
            cluster_call("carol").await.unwrap();
        })
        .await;
}

// ---------------------------------------------------------------------------------------------
// `export`: the attribute names its own limits for the admin calls.

#[rate_limit(
    algo = "sliding",
    num = 3,
    time = 60,
    key = "{user}",
    export = "EXPORTED_LOGIN"
)]
async fn exported_login(user: &str) -> Result<(), RateLimitError> {
    let _ = user;
    Ok(())
}

#[derive(Debug)]
struct Accounts;

impl Accounts {
    // No `scope`: the default one (module path and name) is exported too.
    #[rate_limit(num = 2, time = 60, key = "{user}", export = "SIGN_IN")]
    async fn sign_in(&self, user: &str) -> Result<(), RateLimitError> {
        let _ = user;
        Ok(())
    }

    /// Inside the impl the const is `Self::SIGN_IN`.
    async fn sign_ins_left(&self, limiter: &RateLimiter, user: &str) -> u64 {
        let target = Target::global().key(user);
        limiter
            .peek(Self::SIGN_IN, &target)
            .await
            .unwrap()
            .decisions()[0]
            .remaining
    }
}

/// The exported limits are the ones checked: after k calls `peek` reads `num - k`, a reset
/// gives the whole quota back, a block rejects the next call; for a free function and for a
/// method (`Type::NAME`, `Self::NAME`), on memory and on Redis.
#[tokio::test]
async fn exported_limits_peek_reset_and_block_what_the_function_checks() {
    assert_eq!(EXPORTED_LOGIN.len(), 1);
    assert_eq!(
        EXPORTED_LOGIN[0].scope,
        concat!(module_path!(), "::exported_login")
    );
    assert_eq!(
        Accounts::SIGN_IN[0].scope,
        concat!(module_path!(), "::sign_in")
    );
    for (limiter, env) in [Env::memory().await, Env::redis().await] {
        let name = if env.exact() { "memory" } else { "redis" };
        limiter
            .clone()
            .scope(async {
                let alice = Target::global().key("alice");
                for k in 1..=3 {
                    exported_login("alice").await.unwrap();
                    let v = limiter.peek(EXPORTED_LOGIN, &alice).await.unwrap();
                    assert_eq!(v.decisions()[0].remaining, 3 - k, "{name}");
                    assert_eq!(v.decisions()[0].limit, 3, "{name}");
                }
                assert!(exported_login("alice").await.unwrap_err().is_limited());
                assert!(
                    !limiter
                        .peek(EXPORTED_LOGIN, &alice)
                        .await
                        .unwrap()
                        .is_admitted()
                );
                limiter.reset(EXPORTED_LOGIN, &alice).await.unwrap();
                let v = limiter.peek(EXPORTED_LOGIN, &alice).await.unwrap();
                assert_eq!(v.decisions()[0].remaining, 3, "{name}");
                exported_login("alice").await.unwrap();

                let bob = Target::global().key("bob");
                limiter
                    .block(EXPORTED_LOGIN, &bob, Duration::from_secs(600))
                    .await
                    .unwrap();
                let err = exported_login("bob").await.unwrap_err();
                assert!(err.is_limited(), "{name}: {err}");
                assert!(
                    err.retry_after().unwrap() > Duration::from_secs(599),
                    "{name}"
                );

                let accounts = Accounts;
                accounts.sign_in("carol").await.unwrap();
                assert_eq!(accounts.sign_ins_left(&limiter, "carol").await, 1, "{name}");
                let carol = Target::global().key("carol");
                limiter
                    .block(Accounts::SIGN_IN, &carol, Duration::from_secs(600))
                    .await
                    .unwrap();
                assert!(accounts.sign_in("carol").await.unwrap_err().is_limited());
                limiter.reset(Accounts::SIGN_IN, &carol).await.unwrap();
                assert_eq!(accounts.sign_ins_left(&limiter, "carol").await, 2, "{name}");
            })
            .await;
    }
}

#[rate_limit(
    algo = "gcra",
    num = 2,
    time = 60,
    burst = 4,
    key = "{user}",
    export = "GCRA_LOGIN"
)]
async fn gcra_login(user: &str) -> Result<(), RateLimitError> {
    let _ = user;
    Ok(())
}

/// The failure the export removes: a `Limit` written by hand without the attribute's `burst`
/// addresses another key (`peek` reads a fresh bucket, `block` blocks nobody), while the
/// exported one reads the spent bucket and blocks the caller.
#[tokio::test]
async fn the_export_keeps_the_burst_a_hand_written_limit_forgets() {
    let forgotten = [Limit::new(
        Policy::new(Algorithm::Gcra, 2, Duration::from_secs(60)).unwrap(),
        concat!(module_path!(), "::gcra_login"),
        By::Global,
    )];
    assert_eq!(GCRA_LOGIN[0].scope, forgotten[0].scope);
    assert_eq!(GCRA_LOGIN[0].policy.burst(), 4);
    for (limiter, env) in [Env::memory().await, Env::redis().await] {
        let name = if env.exact() { "memory" } else { "redis" };
        limiter
            .clone()
            .scope(async {
                let dave = Target::global().key("dave");
                for _ in 0..3 {
                    gcra_login("dave").await.unwrap();
                }
                let exported = limiter.peek(GCRA_LOGIN, &dave).await.unwrap();
                assert_eq!(exported.decisions()[0].limit, 4, "{name}");
                assert_eq!(exported.decisions()[0].remaining, 1, "{name}");
                let wrong = limiter.peek(&forgotten, &dave).await.unwrap();
                assert_eq!(wrong.decisions()[0].limit, 2, "{name}");
                assert_eq!(wrong.decisions()[0].remaining, 2, "{name}: a fresh bucket");
                // Blocking through the wrong key blocks nobody; through the export, dave.
                limiter
                    .block(&forgotten, &dave, Duration::from_secs(600))
                    .await
                    .unwrap();
                gcra_login("dave").await.unwrap();
                let erin = Target::global().key("erin");
                limiter
                    .block(GCRA_LOGIN, &erin, Duration::from_secs(600))
                    .await
                    .unwrap();
                assert!(gcra_login("erin").await.unwrap_err().is_limited(), "{name}");
            })
            .await;
    }
}

#[rate_limit(num = 10, time = 60, key = "{user}", cost = units)]
#[rate_limit(
    algo = "token",
    num = 100,
    time = "1h",
    key = "{user}",
    export = "UPLOAD"
)]
async fn upload(user: &str, units: u64) -> Result<(), RateLimitError> {
    let _ = (user, units);
    Ok(())
}

/// One `export` names every stacked limit of the function, in the order written, whichever
/// attribute carries it; a limit with `cost = <expression>` is exported with its key (the
/// per-call cost is no part of it), so `peek` reads the units the calls took.
#[tokio::test]
async fn one_export_names_every_stacked_limit() {
    assert_eq!(UPLOAD.len(), 2);
    let (limiter, _env) = Env::memory().await;
    limiter
        .clone()
        .scope(async {
            upload("frank", 3).await.unwrap();
            upload("frank", 4).await.unwrap();
            let frank = Target::global().key("frank");
            let v = limiter.peek(UPLOAD, &frank).await.unwrap();
            let remaining: Vec<u64> = v.decisions().iter().map(|d| d.remaining).collect();
            assert_eq!(remaining, [3, 98]);
            assert!(upload("frank", 4).await.unwrap_err().is_limited());
            limiter.reset(UPLOAD, &frank).await.unwrap();
            upload("frank", 10).await.unwrap();
            let v = limiter.peek(UPLOAD, &frank).await.unwrap();
            let remaining: Vec<u64> = v.decisions().iter().map(|d| d.remaining).collect();
            assert_eq!(remaining, [0, 99]);
        })
        .await;
}

// ---------------------------------------------------------------------------------------------
// Metrics.

#[rate_limit(num = 2, time = 60, key = "{id}", scope = "ops_metrics_plain")]
async fn metrics_plain(id: &str) -> Result<(), RateLimitError> {
    let _ = id;
    Ok(())
}

#[rate_limit(num = 100000, time = 60, scope = "ops_metrics_lease", lease = "100ms")]
async fn metrics_leased() -> Result<(), RateLimitError> {
    Ok(())
}

/// The gauge `ratelimit_lease_units_held` reports the units of the leases a process
/// holds (the bound of what the other processes may be refused), back to 0 once they end; the
/// counter of units given back counts what the last one did not use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_report_the_units_held_in_leases() {
    use ratelimit_runtime::observe::{LEASE_UNITS_HELD, LEASE_UNITS_RETURNED};
    snapshotter();
    let (limiter, _env) = Env::redis().await;
    limiter
        .clone()
        .scope(async {
            let mut calls = 0;
            while RateLimiter::current().lease_units_held() == 0 {
                metrics_leased().await.unwrap();
                calls += 1;
                assert!(calls < 2000, "no lease was taken");
            }
            let unused = RateLimiter::current().lease_units_held();
            let held = gauge(LEASE_UNITS_HELD, "ops_metrics_lease");
            // Units of a lease are at most 1,000 here: exact in an f64.
            let unused_units = f64::from(u32::try_from(unused).expect("at most a lease"));
            assert!(held >= unused_units, "gauge {held}, unused {unused}");
            tokio::time::sleep(Duration::from_millis(400)).await;
            ratelimit_tests::settle(Duration::from_secs(5), || {
                RateLimiter::current().lease_units_held() == 0
            })
            .await;
            assert_eq!(RateLimiter::current().lease_units_held(), 0);
            assert!(gauge(LEASE_UNITS_HELD, "ops_metrics_lease").abs() < f64::EPSILON);
            assert!(counter(LEASE_UNITS_RETURNED, "ops_metrics_lease") >= unused);
        })
        .await;
}

#[rate_limit(num = 1, time = 60, scope = "ops_metrics_failing")]
async fn metrics_failing() -> Result<(), RateLimitError> {
    Ok(())
}

/// Each counter through the test recorder: admitted, rejected, shadow-rejected, failure-policy
/// answers (allow and deny, on a Redis that refuses connections), and the store-latency
/// histogram; no label holds a caller value.
#[tokio::test]
async fn metrics_count_each_outcome_without_caller_values() {
    snapshotter();
    let (limiter, _env) = Env::memory().await;
    limiter
        .clone()
        .scope(async {
            for _ in 0..5 {
                let _ = metrics_plain("secret-user-42").await;
            }
        })
        .await;
    assert_eq!(calls("ops_metrics_plain", "admitted"), 2);
    assert_eq!(calls("ops_metrics_plain", "rejected"), 3);
    assert_eq!(calls("ops_metrics_plain", "shadow_rejected"), 0);
    assert!(store_samples("memory") >= 5);

    // A store that refuses connections: the failure policy answers, and is counted.
    let port = ratelimit_tests::redis_server::free_port().unwrap();
    for (policy, outcome, ok) in [
        (FailurePolicy::Allow, "failure_allow", true),
        (FailurePolicy::Deny, "failure_deny", false),
    ] {
        let failing = RateLimiter::builder()
            .redis_url(format!("redis://127.0.0.1:{port}"))
            .failure_policy(policy)
            .build_lazy()
            .unwrap();
        let results = failing
            .scope(async {
                let mut out = Vec::new();
                for _ in 0..3 {
                    out.push(metrics_failing().await.is_ok());
                }
                out
            })
            .await;
        assert_eq!(results, [ok; 3], "{policy:?}");
        assert_eq!(calls("ops_metrics_failing", outcome), 3, "{policy:?}");
    }
    assert_eq!(calls("ops_metrics_failing", "admitted"), 3);
    // In shadow mode, even the deny policy never refuses the call.
    let shadow_deny = RateLimiter::builder()
        .redis_url(format!("redis://127.0.0.1:{port}"))
        .failure_policy(FailurePolicy::Deny)
        .shadow(true)
        .build_lazy()
        .unwrap();
    let ran = shadow_deny
        .scope(async { metrics_failing().await.is_ok() })
        .await;
    assert!(ran, "a shadow limit refused a call");
    assert_eq!(calls("ops_metrics_failing", "failure_local"), 0);
    for label in all_label_values() {
        assert!(!label.contains("secret-user-42"), "{label}");
        assert!(!label.contains("127.0.0."), "{label}");
    }
}

/// A Redis store under a name of its own, so that its store metrics are this test's alone
/// (the other tests of this binary use Redis too).
#[derive(Debug)]
struct Renamed(RedisStore);

impl Store for Renamed {
    fn check<'a>(&'a self, checks: &'a [Check<'a>]) -> StoreFuture<'a> {
        self.0.check(checks)
    }

    fn take<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> StoreFuture<'a> {
        self.0.take(checks, call_id)
    }

    fn refund<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> StoreFuture<'a, ()> {
        self.0.refund(checks, call_id)
    }

    fn forget<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> StoreFuture<'a, ()> {
        self.0.forget(checks, call_id)
    }

    fn name(&self) -> &'static str {
        "ops-stalled-redis"
    }
}

#[rate_limit(
    num = 3,
    time = 60,
    scope = "ops_metrics_timeout",
    on_store_error = "deny"
)]
async fn metrics_timeout() -> Result<(), RateLimitError> {
    Ok(())
}

/// A Redis that stalls past the timeout (`CLIENT PAUSE`): the store call is counted as a
/// `timeout` in `ratelimit_store_errors_total`, and the call's failure outcome is the policy
/// that answered it — the limit's own `deny`, not the limiter's `allow`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_timeout_is_counted_and_the_failure_outcome_names_the_policy_that_answered() {
    snapshotter();
    let server = RedisServer::start();
    let limiter = RateLimiter::builder()
        .store(Renamed(server.store().await))
        .failure_policy(FailurePolicy::Allow)
        .build()
        .await
        .unwrap();
    limiter.clone().scope(metrics_timeout()).await.unwrap();
    assert_eq!(store_errors("ops-stalled-redis", "timeout"), 0);
    server.pause(Duration::from_secs(2)).await;
    let err = limiter.clone().scope(metrics_timeout()).await.unwrap_err();
    let RateLimitError::StoreUnavailable(cause) = &err else {
        panic!("{err:?}")
    };
    assert!(cause.is_timeout(), "{cause:?}");
    assert_eq!(store_errors("ops-stalled-redis", "timeout"), 1);
    assert_eq!(store_errors("ops-stalled-redis", "connection"), 0);
    assert_eq!(calls("ops_metrics_timeout", "failure_deny"), 1);
    assert_eq!(calls("ops_metrics_timeout", "failure_allow"), 0);
    assert_eq!(calls("ops_metrics_timeout", "admitted"), 1);
}

#[rate_limit(num = 1, time = 60, by = "ip", scope = "ops_actix")]
async fn actix_handler() -> &'static str {
    "ran"
}

#[rate_limit(num = 1, time = 60, by = "ip", scope = "ops_actix_redis")]
async fn actix_handler_redis() -> &'static str {
    "ran"
}

/// The same exemptions and deny list on Actix-web: the exempt network through, the denied one
/// 403 with the JSON body, an untrusted peer naming the exempt network in `X-Forwarded-For`
/// limited as itself. On the memory store and on Redis (`scope` is the handler's).
async fn actix_exemptions_scenario<H, Args>(redis: Option<&RedisServer>, handler: H, scope: &str)
where
    H: actix_web::Handler<Args> + Clone + Send + 'static,
    Args: actix_web::FromRequest + 'static,
    H::Output: actix_web::Responder + 'static,
{
    use actix_web::{App, HttpServer, web};
    snapshotter();
    let builder = RateLimiter::builder()
        .exempt_networks([net("127.0.0.2/32")])
        .deny_networks([net("127.0.0.3/32")]);
    let builder = match redis {
        Some(server) => builder
            .redis_url(server.url())
            .timeout(Duration::from_secs(5)),
        None => builder,
    };
    let limiter = builder.build().await.unwrap();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(limiter.clone())
            .route("/", web::get().to(handler.clone()))
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(0)
    .bind(("127.0.0.1", 0))
    .expect("bind");
    let url = format!("http://{}/", server.addrs()[0]);
    actix_web::rt::spawn(server.run());
    let get = |from: &str, xff: Option<&str>| {
        let mut req = client_from(from).get(&url);
        if let Some(v) = xff {
            req = req.header("x-forwarded-for", v);
        }
        async move { Answer::from(req.send().await.unwrap()).await }
    };
    for _ in 0..3 {
        let a = get("127.0.0.2", None).await;
        assert_eq!(a.status, 200, "{a:?}");
        assert!(a.header("ratelimit").is_none(), "{a:?}");
    }
    let denied = get("127.0.0.3", None).await;
    assert_eq!(denied.status, 403, "{denied:?}");
    assert_eq!(denied.json()["error"], "forbidden");
    assert_eq!(get("127.0.0.4", Some("127.0.0.2")).await.status, 200);
    get("127.0.0.4", Some("127.0.0.2")).await.assert_too_many();
    assert_eq!(calls(scope, "exempted"), 3);
    assert_eq!(calls(scope, "denied"), 1);
}

#[actix_web::test]
async fn actix_exemptions_and_deny_list() {
    actix_exemptions_scenario(None, actix_handler, "ops_actix").await;
}

#[actix_web::test]
async fn actix_exemptions_and_deny_list_redis() {
    let server = RedisServer::start();
    actix_exemptions_scenario(Some(&server), actix_handler_redis, "ops_actix_redis").await;
}

#[rate_limit(num = 100, time = 60, by = "user", scope = "ops_deny_no_peer")]
async fn by_user_handler() -> &'static str {
    "ran"
}

/// A deny list needs the client's address: an Axum app served without connect info refuses
/// with the reason (500) instead of serving every network as if the list were empty.
#[tokio::test]
async fn a_deny_list_without_the_peer_address_refuses_instead_of_serving() {
    let limiter = RateLimiter::builder()
        .deny_networks([net("127.0.0.0/8")])
        .build()
        .await
        .unwrap();
    let app = Router::new()
        .route("/", get(by_user_handler))
        .layer(middleware::from_fn(fake_auth))
        .layer(axum::Extension(limiter));
    // Served without `into_make_service_with_connect_info`: no peer address.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let response = reqwest::Client::new()
        .get(format!("http://{addr}/"))
        .header("x-user", "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 500);
    let body = response.text().await.unwrap();
    assert!(
        body.contains("into_make_service_with_connect_info"),
        "{body}"
    );
}

// ---------------------------------------------------------------------------------------------
// A `Forwarded` element that cannot be read.

#[rate_limit(num = 2, time = 60, by = "ip", scope = "ops_fwd_axum")]
async fn forwarded_axum() -> &'static str {
    "ran"
}

#[rate_limit(num = 2, time = 60, by = "ip", scope = "ops_fwd_actix")]
async fn forwarded_actix() -> &'static str {
    "ran"
}

/// Behind an RFC 7239 proxy (127.0.0.9, trusted, its network exempt and named by the
/// predicate too), deny-listing 198.51.100.0/24.
async fn forwarded_limiter() -> RateLimiter {
    RateLimiter::builder()
        .memory()
        .timeout(Duration::from_secs(5))
        .trusted_proxies(["127.0.0.9"])
        .forwarded_header(ratelimit_runtime::http::ForwardedHeader::Forwarded)
        .exempt_networks([net("127.0.0.9/32")])
        .exempt_when(|caller| caller.ip() == Some("127.0.0.9".parse().unwrap()))
        .deny_networks([net("198.51.100.0/24")])
        .build()
        .await
        .unwrap()
}

/// What the proxy at 127.0.0.9 forwards: the client's own `Forwarded` line with the proxy's
/// `for=` appended. Before the fix the client's `for="x` made the whole line one unreadable
/// element: the client was taken for the proxy, so the deny-listed client got 200 and every
/// client was exempt (6 of 6 through num = 2).
async fn a_client_quote_cannot_make_it_the_trusted_proxy(url: &str) {
    let proxy = client_from("127.0.0.9");
    let get = |forwarded: &'static str| {
        let req = proxy.get(url).header("forwarded", forwarded);
        async move { Answer::from(req.send().await.unwrap()).await.status }
    };
    let denied = get("for=\"x, for=198.51.100.9").await;
    assert_eq!(denied, 403, "a deny-listed client behind the proxy");
    let mut through = Vec::new();
    for _ in 0..3 {
        through.push(get("for=\"x, for=203.0.113.5").await);
    }
    assert_eq!(through, [200, 200, 429], "a client behind an exempt proxy");
    // A right-most hop that cannot be read: unknown, its own bucket, never exempt.
    let mut unknown = Vec::new();
    for forwarded in ["for=unknown", "for=_hidden", "for=\"x"] {
        unknown.push(get(forwarded).await);
    }
    assert_eq!(unknown, [200, 200, 429], "unknown clients behind the proxy");
    // …and the deny list still reads what it can.
    assert_eq!(get("for=198.51.100.9, for=unknown").await, 403);
    // The proxy's own requests (no header) are still exempt, and 203.0.113.5 has its own bucket.
    for _ in 0..3 {
        assert_eq!(
            Answer::from(proxy.get(url).send().await.unwrap())
                .await
                .status,
            200
        );
    }
    assert_eq!(get("for=203.0.113.6").await, 200);
}

#[tokio::test]
async fn axum_a_client_quote_in_forwarded_cannot_make_it_the_trusted_proxy() {
    let app = Router::new()
        .route("/", get(forwarded_axum))
        .layer(axum::Extension(forwarded_limiter().await));
    let addr: SocketAddr = serve_axum(app, "127.0.0.1").await;
    a_client_quote_cannot_make_it_the_trusted_proxy(&format!("http://{addr}/")).await;
}

#[actix_web::test]
async fn actix_a_client_quote_in_forwarded_cannot_make_it_the_trusted_proxy() {
    use actix_web::{App, web};
    let limiter = forwarded_limiter().await;
    let url = crate::http_support::serve_actix!(move || {
        App::new()
            .app_data(limiter.clone())
            .route("/", web::get().to(forwarded_actix))
    });
    a_client_quote_cannot_make_it_the_trusted_proxy(&url).await;
}
