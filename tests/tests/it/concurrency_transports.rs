//! Concurrency limits on every transport, over real loopback connections with real clients:
//! an Axum handler and the Tower layer in front of an Axum router (the tonic method's case is
//! `grpc_pipeline::*_two_calls_in_flight_*`, on this module's [`Gate`]). Two slots;
//! the bodies wait on a gate the test opens, so exactly which calls are in flight is known:
//! the third call is refused while two run, a cancelled request gives its slot back, and after
//! the bodies end two more run. Each on the memory store and on a private Redis.
#![allow(
    clippy::duration_suboptimal_units,
    reason = "Duration::from_mins is newer than the workspace's rust-version"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::http_support::{Backend, client};

/// Bodies wait here until the test lets them go; `now` and `most` count them.
#[derive(Debug)]
pub(crate) struct Gate {
    permits: Semaphore,
    now: AtomicUsize,
    most: AtomicUsize,
}

impl Gate {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            permits: Semaphore::new(0),
            now: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
        })
    }

    /// A body: counted in flight until the test opens the gate for it.
    pub(crate) async fn pass(&self) {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
        // Counted out however the body ends (a cancelled request drops it here).
        let _out = Out(&self.now);
        self.permits.acquire().await.expect("gate").forget();
    }

    /// Waits until `n` bodies are in flight (bounded: the test fails rather than hangs).
    pub(crate) async fn in_flight(&self, n: usize) {
        for _ in 0..2_000 {
            if self.now.load(Ordering::SeqCst) == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!(
            "{n} in flight never seen: {}",
            self.now.load(Ordering::SeqCst)
        );
    }

    pub(crate) fn open(&self, n: usize) {
        self.permits.add_permits(n);
    }
}

/// Counts a body out when it is dropped, finished or cancelled.
struct Out<'a>(&'a AtomicUsize);

impl Drop for Out<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

mod axum_app {
    use std::sync::Arc;
    use std::time::Duration;

    use axum::routing::get;
    use axum::{Extension, Router};
    use ratelimit_runtime::{Algorithm, RateLimitLayer, RateLimiter, rate_limit};

    use super::Gate;

    /// Two reports at a time per client address.
    #[rate_limit(
        algo = "concurrency",
        num = 2,
        time = 60,
        by = "ip",
        framework = "axum"
    )]
    async fn report(Extension(gate): Extension<Arc<Gate>>) -> &'static str {
        gate.pass().await;
        "report"
    }

    async fn export(Extension(gate): Extension<Arc<Gate>>) -> &'static str {
        gate.pass().await;
        "export"
    }

    pub(crate) async fn start(limiter: RateLimiter, gate: Arc<Gate>) -> String {
        let layer = RateLimitLayer::builder()
            .scope("conc_layer_export")
            .algorithm(Algorithm::Concurrency)
            .num(2)
            .period(Duration::from_secs(60))
            .by("ip")
            .limiter(limiter.clone())
            .build()
            .expect("layer");
        let app = Router::new()
            .route("/report", get(report))
            .route("/export", get(export).layer(layer))
            .layer(Extension(gate))
            .layer(Extension(limiter));
        let addr = crate::http_support::serve_axum(app, "127.0.0.1").await;
        format!("http://{addr}")
    }
}

/// A request in a task of its own: its status when it ends.
fn spawn_get(url: &str) -> tokio::task::JoinHandle<reqwest::StatusCode> {
    let (client, url) = (client(), url.to_owned());
    tokio::spawn(async move { client.get(url).send().await.expect("request").status() })
}

/// Requests until one is admitted (`n` bodies in flight): a slot given back by a cancelled
/// call is released in the background, so the first tries may still be refused (429).
async fn until_admitted(
    gate: &Gate,
    url: &str,
    n: usize,
) -> tokio::task::JoinHandle<reqwest::StatusCode> {
    for _ in 0..200 {
        let attempt = spawn_get(url);
        loop {
            if gate.now.load(Ordering::SeqCst) == n {
                return attempt;
            }
            if attempt.is_finished() {
                assert_eq!(attempt.await.expect("attempt"), 429);
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    panic!("no slot came back for {url}");
}

/// Two in flight, the third refused with `qu="concurrent-requests"`; a cancelled request gives
/// its slot back; after the bodies end, two more run.
async fn http_scenario(base: &str, path: &str, gate: &Gate) {
    let url = format!("{base}{path}");
    let first = spawn_get(&url);
    let second = spawn_get(&url);
    gate.in_flight(2).await;
    let third = client().get(&url).send().await.expect("request");
    assert_eq!(third.status(), 429, "{path}: a third call in flight");
    let policy = third
        .headers()
        .get("ratelimit-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        policy.contains("q=2") && policy.contains("qu=\"concurrent-requests\""),
        "{path}: {policy}"
    );
    gate.open(2);
    assert_eq!(first.await.expect("first"), 200);
    assert_eq!(second.await.expect("second"), 200);
    gate.in_flight(0).await;

    // A request its client gives up on: the server drops the handler, and the slot comes back.
    let quitter = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .expect("client");
    let held = spawn_get(&url);
    gate.in_flight(1).await;
    assert!(quitter.get(&url).send().await.is_err(), "{path}: timed out");
    gate.in_flight(1).await; // the cancelled body is gone
    let again = until_admitted(gate, &url, 2).await;
    gate.open(2);
    assert_eq!(held.await.expect("held"), 200);
    assert_eq!(again.await.expect("again"), 200);
    assert_eq!(
        gate.most.load(Ordering::SeqCst),
        2,
        "{path}: never more than 2 in flight"
    );
}

async fn axum_and_layer(backend: Backend) {
    let limiter = backend.limiter(&[]).await;
    for path in ["/report", "/export"] {
        let gate = Gate::new();
        let base = axum_app::start(limiter.clone(), Arc::clone(&gate)).await;
        http_scenario(&base, path, &gate).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_axum_handler_and_the_layer_hold_two_slots_memory() {
    axum_and_layer(Backend::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_axum_handler_and_the_layer_hold_two_slots_redis() {
    axum_and_layer(Backend::redis()).await;
}

/// The Tower layer's side of `concurrency::a_call_cancelled_mid_take_leaves_no_slot_taken_redis`:
/// a request dropped at any point of its take (after one poll, or after a timeout of a few
/// microseconds) leaves no slot of the layer's one taken once `shutdown` has drained the
/// limiter's background calls: the next request is admitted (its body runs), never a 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_cancelled_mid_take_leaves_no_slot_taken_layer_redis() {
    use std::task::Poll;

    use axum::body::Body;
    use ratelimit_runtime::{Algorithm, RateLimitLayer};
    use tower::{Layer as _, ServiceExt as _};

    let backend = Backend::redis();
    let limiter = backend.limiter(&[]).await;
    let layer = RateLimitLayer::builder()
        .scope("conc_layer_cancelled")
        .algorithm(Algorithm::Concurrency)
        .num(1)
        .period(Duration::from_secs(60))
        .by("global")
        .limiter(limiter.clone())
        .build()
        .expect("layer");
    // A body that says it runs, then holds the slot until the request is dropped.
    let (ran, mut running) = tokio::sync::mpsc::unbounded_channel::<()>();
    let service = layer.layer(tower::service_fn(move |_: axum::http::Request<Body>| {
        let ran = ran.clone();
        async move {
            let _ = ran.send(());
            std::future::pending::<()>().await;
            Ok::<_, std::convert::Infallible>(axum::http::Response::new(Body::empty()))
        }
    }));
    let request = || axum::http::Request::new(Body::empty());
    for round in 0_u64..300 {
        let mut call = Box::pin(service.clone().oneshot(request()));
        if round % 2 == 0 {
            let polled = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
            assert!(polled.is_pending(), "round {round}");
            drop(call);
        } else {
            let within = Duration::from_micros(round * 37 % 1500);
            assert!(
                tokio::time::timeout(within, call).await.is_err(),
                "round {round}"
            );
        }
        limiter
            .shutdown(Duration::from_secs(10))
            .await
            .expect("the background calls finish within 10 s");
        while running.try_recv().is_ok() {} // the cancelled request's body, if it ran
        // The next request takes the slot and runs its body, or is refused (a 429).
        let next = service.clone().oneshot(request());
        tokio::select! {
            _ = running.recv() => {}
            answer = next => panic!(
                "round {round}: the cancelled request's slot is still taken: {}",
                answer.expect("infallible").status()
            ),
        }
        limiter
            .shutdown(Duration::from_secs(10))
            .await
            .expect("the next request's release finishes within 10 s");
    }
}
