//! Calling a rate-limited partner through the client layer (`PartnerLayer`): a stand-in
//! partner on loopback (Axum, with a real limiter of its own: a sliding log of
//! `partner_per_second` requests a second, answering 429 with `Retry-After` and its
//! rate-limit fields), four clients standing for four processes (each its own limiter and its
//! own connection to one private Redis) configured at twice the partner's rate, each making
//! `calls` calls and retrying the 429s it gets. The run with learning and the run without go
//! at the same time against two partners, and their figures are printed side by side.
//!
//! One run is at the issue's scale (`ISSUE`: 10 a second, 800 calls, ~100 s): with learning,
//! every call completes, the partner receives at most its quota plus one round of in-flight
//! calls in every second, and no 429 arrives past the first pause (`FIRST_PAUSE` after the
//! first 429: the calls in flight when the partner's budget first ran out); without, the 429s
//! recur every second. The other runs (the `x-ratelimit-*` family, tokens, memory, Redis
//! Cluster) are `SCALED` (50 a second, 200 calls) so that each takes seconds, and assert the
//! looser shape: at most the quota plus two rounds a second, a quarter of the 429s.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use ratelimit_runtime::client::{GitHubFields, IetfFields, OpenAiFields, PartnerLayer, RetryAfter};
use ratelimit_runtime::{Algorithm, Policy, RateLimiter, Verdict, store::Check};
use ratelimit_tests::redis_cluster::RedisCluster;
use ratelimit_tests::redis_server::RedisServer;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

/// The rates and lengths of a run.
#[derive(Debug, Clone, Copy)]
struct Scale {
    /// What the partner admits: requests in any trailing second.
    partner_per_second: u64,
    /// What the fleet was told (deliberately wrong: twice the partner's).
    configured_per_second: u64,
    /// Calls each process makes (each retried until the partner admits it).
    calls: usize,
}

/// The issue's partner: 10 a second, the fleet told 20, 200 calls a process (~100 s a run).
const ISSUE: Scale = Scale {
    partner_per_second: 10,
    configured_per_second: 20,
    calls: 200,
};
/// Five times the rates, a quarter of the calls: the same shape in seconds.
const SCALED: Scale = Scale {
    partner_per_second: 50,
    configured_per_second: 100,
    calls: 50,
};
/// The partner's tokens a second (the tokens runs).
const PARTNER_TOKENS_PER_SECOND: u64 = 4_000;
/// The processes.
const CLIENTS: usize = 4;
/// The tokens estimate of every call: the most a call uses.
const ESTIMATE: u64 = 200;

/// How the partner speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dialect {
    /// `RateLimit: "requests";r=…;t=…` (and `"tokens"`).
    Ietf,
    /// `x-ratelimit-remaining-requests` / `x-ratelimit-reset-requests: 950ms` (and tokens).
    OpenAi,
    /// GitHub's: `x-ratelimit-limit`, `x-ratelimit-remaining`, `x-ratelimit-reset` (epoch
    /// seconds), for requests only.
    GitHub,
    /// Absurd values: 429s with `Retry-After` ten years away, negative and non-ASCII fields.
    Hostile,
}

/// The stand-in partner: its own limiter, and every request it received (when, what it said).
struct Partner {
    limiter: RateLimiter,
    requests: Policy,
    tokens: Option<Policy>,
    dialect: Dialect,
    start: Instant,
    received: Mutex<Vec<(Duration, StatusCode)>>,
}

async fn answer(State(partner): State<Arc<Partner>>, headers: HeaderMap) -> Response {
    let used: u64 = headers
        .get("x-use-tokens")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1);
    let tokens = partner.tokens.map(|t| t.with_cost(used).unwrap());
    let mut checks = vec![Check::new("partner:{requests}", &partner.requests)];
    if let Some(tokens) = &tokens {
        checks.push(Check::new("partner:{tokens}", tokens));
    }
    let verdict = partner.limiter.check(&checks).await.unwrap();
    let status = if verdict.is_admitted() {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    let at = partner.start.elapsed();
    partner.received.lock().unwrap().push((at, status));
    let mut fields = fields(partner.dialect, &verdict);
    if partner.dialect == Dialect::Hostile {
        // Ten years, in seconds, whatever the partner's limiter said.
        fields.push(("retry-after".into(), "315360000".into()));
    } else if verdict.is_admitted() {
        fields.push(("x-usage-tokens".into(), used.to_string()));
    } else {
        let wait = verdict.retry_after().unwrap_or_default();
        fields.push(("retry-after".into(), whole_seconds(wait).to_string()));
    }
    let mut response = status.into_response();
    for (name, value) in fields {
        let name = axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap();
        response.headers_mut().insert(name, value.parse().unwrap());
    }
    response
}

fn whole_seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The partner's rate-limit fields for its decisions (requests first, then tokens).
fn fields(dialect: Dialect, verdict: &Verdict) -> Vec<(String, String)> {
    let names = ["requests", "tokens"];
    let decisions = names.iter().zip(verdict.decisions());
    match dialect {
        Dialect::Ietf => {
            let members: Vec<String> = decisions
                .map(|(name, d)| {
                    let t = whole_seconds(d.reset_after);
                    format!("\"{name}\";r={};t={t}", d.remaining)
                })
                .collect();
            let policies: Vec<String> = names
                .iter()
                .zip(verdict.decisions())
                .map(|(name, d)| format!("\"{name}\";q={};w=1", d.limit))
                .collect();
            vec![
                ("ratelimit".into(), members.join(", ")),
                ("ratelimit-policy".into(), policies.join(", ")),
            ]
        }
        Dialect::OpenAi => decisions
            .flat_map(|(name, d)| {
                let reset = format!("{}ms", d.reset_after.as_millis());
                [
                    (format!("x-ratelimit-limit-{name}"), d.limit.to_string()),
                    (
                        format!("x-ratelimit-remaining-{name}"),
                        d.remaining.to_string(),
                    ),
                    (format!("x-ratelimit-reset-{name}"), reset),
                ]
            })
            .collect(),
        Dialect::GitHub => {
            let d = &verdict.decisions()[0];
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            let reset = whole_seconds(now + d.reset_after);
            vec![
                ("x-ratelimit-limit".into(), d.limit.to_string()),
                ("x-ratelimit-remaining".into(), d.remaining.to_string()),
                ("x-ratelimit-reset".into(), reset.to_string()),
            ]
        }
        Dialect::Hostile => vec![
            ("ratelimit".into(), "\"requests\";r=-1;t=-5".into()),
            (
                "ratelimit-policy".into(),
                "\"requests\";q=0;w=1, \"requests\";q=5;w=0, \"requests\";q=5;w=-1, \
                 \"requests\";q=99999999999999999999;w=1"
                    .into(),
            ),
            ("x-ratelimit-limit-requests".into(), "0".into()),
            ("x-ratelimit-remaining-requests".into(), "１２".into()),
            (
                "x-ratelimit-reset-requests".into(),
                "99999999999999999999h".into(),
            ),
        ],
    }
}

async fn serve(partner: Arc<Partner>) -> SocketAddr {
    let app = axum::Router::new()
        .route("/v1/call", axum::routing::post(answer))
        .with_state(partner);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    addr
}

/// A `tower::Service` over `axum::http::Request` that sends with reqwest (a real HTTP client over
/// TCP), as an SDK's transport would.
#[derive(Clone)]
struct Transport(reqwest::Client);

type HttpFuture =
    Pin<Box<dyn Future<Output = Result<axum::http::Response<String>, reqwest::Error>> + Send>>;

impl Service<axum::http::Request<String>> for Transport {
    type Response = axum::http::Response<String>;
    type Error = reqwest::Error;
    type Future = HttpFuture;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), reqwest::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: axum::http::Request<String>) -> HttpFuture {
        let client = self.0.clone();
        Box::pin(async move {
            let response = client.execute(reqwest::Request::try_from(request)?).await?;
            let mut answer = axum::http::Response::builder().status(response.status());
            for (name, value) in response.headers() {
                answer = answer.header(name, value);
            }
            Ok(answer.body(response.text().await?).unwrap())
        })
    }
}

/// Where the clients keep the partner's budget.
#[derive(Clone)]
enum Fleet {
    /// Four processes, each its own connection to this Redis.
    Redis(String),
    /// Four processes, each its own connection to this Redis Cluster.
    Cluster(Vec<String>),
    /// One process: four clients on one memory limiter.
    Memory(RateLimiter),
}

impl Fleet {
    async fn limiter(&self) -> RateLimiter {
        match self {
            Self::Redis(url) => RateLimiter::builder()
                .redis_url(url)
                .timeout(Duration::from_secs(2))
                .build()
                .await
                .unwrap(),
            Self::Cluster(nodes) => RateLimiter::builder()
                .redis_cluster(nodes.clone())
                .timeout(Duration::from_secs(2))
                .build()
                .await
                .unwrap(),
            Self::Memory(limiter) => limiter.clone(),
        }
    }
}

/// One run.
#[derive(Clone)]
struct Run {
    scope: &'static str,
    dialect: Dialect,
    tokens: bool,
    learn: bool,
    fleet: Fleet,
    scale: Scale,
}

/// What the partner saw in one run.
#[derive(Debug)]
struct Figures {
    admitted: usize,
    refused: usize,
    /// Requests received in each second of the run, and how many were refused.
    seconds: Vec<(usize, usize)>,
    /// 429s received past the first pause: later than `FIRST_PAUSE` after the first 429.
    recurring: usize,
    elapsed: Duration,
}

/// How long after the partner's first 429 the 429s of that first pause may still arrive: the
/// calls in flight when the partner's budget ran out, each at most one round trip away (on a
/// loopback, milliseconds; this is the slack of a loaded machine). The pause itself is the
/// partner's `Retry-After`, a whole second.
const FIRST_PAUSE: Duration = Duration::from_millis(500);

impl Figures {
    /// The seconds in which the partner refused anything.
    fn seconds_with_429s(&self) -> usize {
        self.seconds.iter().filter(|(_, r)| *r > 0).count()
    }

    fn most_in_a_second(&self) -> usize {
        self.seconds.iter().map(|(n, _)| *n).max().unwrap_or(0)
    }

    fn print(&self, label: &str) {
        println!(
            "{label:<34} {:>4} calls in {:>5.1} s; 429s: {:>4} ({:>4} past the first pause, in {:>2} of {:>2} seconds); most received in a second: {:>3}; per second (received/429): {:?}",
            self.admitted,
            self.elapsed.as_secs_f64(),
            self.refused,
            self.recurring,
            self.seconds_with_429s(),
            self.seconds.len(),
            self.most_in_a_second(),
            self.seconds,
        );
    }
}

/// One client (a process): `scale.calls` calls through the layer, each retried after a 429.
async fn client(run: Run, url: String) {
    let limiter = run.fleet.limiter().await;
    let requests = Policy::new(
        Algorithm::Gcra,
        run.scale.configured_per_second,
        Duration::from_secs(1),
    );
    let mut builder = PartnerLayer::builder(run.scope)
        .requests(requests.unwrap())
        .read(RetryAfter)
        .wait(Duration::from_secs(30))
        .max_pause(Duration::from_secs(5))
        .learn(run.learn)
        .limiter(limiter);
    builder = match run.dialect {
        Dialect::Ietf => builder.read(IetfFields::new().tokens("tokens")),
        Dialect::OpenAi => builder.read(OpenAiFields),
        Dialect::GitHub => builder.read(GitHubFields),
        Dialect::Hostile => builder
            .read(IetfFields::new())
            .read(OpenAiFields)
            .max_pause(Duration::from_millis(300)),
    };
    if run.tokens {
        let configured = 2 * PARTNER_TOKENS_PER_SECOND;
        let tokens = Policy::new(Algorithm::Token, configured, Duration::from_secs(1)).unwrap();
        builder = builder.tokens(tokens, |_| ESTIMATE).settle_tokens(|head| {
            head.headers
                .get("x-usage-tokens")?
                .to_str()
                .ok()?
                .parse()
                .ok()
        });
    }
    let mut service = builder
        .build()
        .unwrap()
        .layer(Transport(reqwest::Client::new()));
    for call in 0..run.scale.calls {
        // What the call uses: 20 to 200 tokens.
        let used = 20 + (call * 37) % 181;
        loop {
            let request = axum::http::Request::post(&url)
                .header("x-use-tokens", used)
                .body(String::new())
                .unwrap();
            let response = service.ready().await.unwrap().call(request).await;
            let response = response.unwrap_or_else(|e| panic!("{}: {e}", run.scope));
            match response.status() {
                StatusCode::OK => break,
                StatusCode::TOO_MANY_REQUESTS => {}
                other => panic!("{other}"),
            }
        }
    }
}

/// Runs `run` against a fresh partner: four clients, every call completed.
async fn fleet_run(run: Run) -> Figures {
    let partner_limiter = RateLimiter::builder().build().await.unwrap();
    let requests = Policy::new(
        Algorithm::Sliding,
        run.scale.partner_per_second,
        Duration::from_secs(1),
    );
    let tokens = Policy::new(
        Algorithm::Token,
        PARTNER_TOKENS_PER_SECOND,
        Duration::from_secs(1),
    );
    let partner = Arc::new(Partner {
        limiter: partner_limiter,
        requests: requests.unwrap(),
        tokens: run.tokens.then(|| tokens.unwrap()),
        dialect: run.dialect,
        start: Instant::now(),
        received: Mutex::new(Vec::new()),
    });
    let url = format!("http://{}/v1/call", serve(Arc::clone(&partner)).await);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| tokio::spawn(client(run.clone(), url.clone())))
        .collect();
    for c in clients {
        c.await.unwrap();
    }
    let received = partner.received.lock().unwrap().clone();
    let first = received.first().map_or(Duration::ZERO, |(at, _)| *at);
    let last = received.last().map_or(Duration::ZERO, |(at, _)| *at);
    let mut seconds =
        vec![(0, 0); usize::try_from(last.saturating_sub(first).as_secs()).unwrap() + 1];
    for (at, status) in &received {
        let second = &mut seconds[usize::try_from(at.saturating_sub(first).as_secs()).unwrap()];
        second.0 += 1;
        second.1 += usize::from(*status == StatusCode::TOO_MANY_REQUESTS);
    }
    let refused = received
        .iter()
        .filter(|(_, s)| *s != StatusCode::OK)
        .count();
    let refusals = received.iter().filter(|(_, s)| *s != StatusCode::OK);
    let first_429 = refusals.clone().next().map(|(at, _)| *at);
    let recurring = first_429.map_or(0, |first| {
        refusals
            .filter(|(at, _)| at.saturating_sub(first) > FIRST_PAUSE)
            .count()
    });
    Figures {
        admitted: received.len() - refused,
        refused,
        seconds,
        recurring,
        elapsed: last.saturating_sub(first),
    }
}

/// The learning run and the one without (at the same time, against two partners), printed
/// side by side, and what both must show.
async fn compare(learning: Run, label: &str) -> (Figures, Figures) {
    let blind = Run {
        learn: false,
        scope: match learning.scope {
            "ietf" => "ietf_blind",
            "openai" => "openai_blind",
            "github" => "github_blind",
            "tokens" => "tokens_blind",
            "cluster" => "cluster_blind",
            other => panic!("{other}"),
        },
        ..learning.clone()
    };
    let scale = learning.scale;
    let (learnt, unlearnt) = tokio::join!(fleet_run(learning), fleet_run(blind));
    learnt.print(&format!("{label}, learning:"));
    unlearnt.print(&format!("{label}, without learning:"));
    let all = CLIENTS * scale.calls;
    assert_eq!(
        (learnt.admitted, unlearnt.admitted),
        (all, all),
        "every call completes"
    );
    // The partner's quota in every second, plus one round of in-flight calls (one a client),
    // with slack for a second that straddles two of the partner's windows.
    let bound = usize::try_from(scale.partner_per_second).unwrap() + 2 * CLIENTS;
    assert!(learnt.most_in_a_second() <= bound, "{learnt:?}");
    assert!(
        learnt.refused * 4 <= unlearnt.refused,
        "learning refused {} vs {} without",
        learnt.refused,
        unlearnt.refused
    );
    assert!(
        unlearnt.seconds_with_429s() >= unlearnt.seconds.len() / 2,
        "without learning, 429s recur: {unlearnt:?}"
    );
    (learnt, unlearnt)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_on_redis_learn_the_ietf_fields() {
    let server = RedisServer::start();
    let run = Run {
        scope: "ietf",
        dialect: Dialect::Ietf,
        tokens: false,
        learn: true,
        fleet: Fleet::Redis(server.url()),
        scale: ISSUE,
    };
    let (learnt, unlearnt) = compare(run, "IETF RateLimit, Redis (the issue's scale)").await;
    // The partner's quota in every second plus one round of in-flight calls (one a client):
    // the partner admits no more than its quota in any second, so what it receives past that
    // is the round in flight when its budget ran out.
    let bound = usize::try_from(ISSUE.partner_per_second).unwrap() + CLIENTS;
    assert!(learnt.most_in_a_second() <= bound, "{learnt:?}");
    assert_eq!(
        learnt.recurring, 0,
        "the 429s stop after the first pause: {learnt:?}"
    );
    assert!(
        unlearnt.recurring > 0,
        "without learning they recur: {unlearnt:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_on_redis_learn_the_openai_fields() {
    let server = RedisServer::start();
    let run = Run {
        scope: "openai",
        dialect: Dialect::OpenAi,
        tokens: false,
        learn: true,
        fleet: Fleet::Redis(server.url()),
        scale: SCALED,
    };
    let (learnt, _) = compare(run, "x-ratelimit-*, Redis").await;
    assert_eq!(
        learnt.recurring, 0,
        "the 429s stop after the first pause: {learnt:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_on_redis_learn_the_github_fields() {
    let server = RedisServer::start();
    let run = Run {
        scope: "github",
        dialect: Dialect::GitHub,
        tokens: false,
        learn: true,
        fleet: Fleet::Redis(server.url()),
        scale: SCALED,
    };
    let (learnt, _) = compare(run, "GitHub x-ratelimit-*, Redis").await;
    assert_eq!(
        learnt.recurring, 0,
        "the 429s stop after the first pause: {learnt:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_on_redis_pace_requests_and_settled_tokens() {
    let server = RedisServer::start();
    let run = Run {
        scope: "tokens",
        dialect: Dialect::OpenAi,
        tokens: true,
        learn: true,
        fleet: Fleet::Redis(server.url()),
        scale: SCALED,
    };
    let (learnt, _) = compare(run, "x-ratelimit-* + tokens, Redis").await;
    assert_eq!(
        learnt.recurring, 0,
        "the 429s stop after the first pause: {learnt:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_on_memory_learns_the_ietf_fields() {
    let limiter = RateLimiter::builder().build().await.unwrap();
    let run = Run {
        scope: "ietf",
        dialect: Dialect::Ietf,
        tokens: false,
        learn: true,
        fleet: Fleet::Memory(limiter),
        scale: SCALED,
    };
    compare(run, "IETF RateLimit, memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_on_redis_cluster_learn_the_ietf_fields() {
    let cluster = RedisCluster::start().await;
    let run = Run {
        scope: "cluster",
        dialect: Dialect::Ietf,
        tokens: false,
        learn: true,
        fleet: Fleet::Cluster(cluster.urls()),
        scale: SCALED,
    };
    compare(run, "IETF RateLimit, Redis Cluster").await;
}

/// A partner whose every answer is absurd (a 429's `Retry-After` ten years away, negative and
/// non-ASCII fields, a reset of 10^20 hours) pauses the fleet no longer than `max_pause` (300
/// ms) at a time: every call still completes, and the budget never reads a wait past the
/// bound. Each 429 pauses for the bound, so the partner is not flooded either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_partner_pauses_the_fleet_no_longer_than_the_maximum() {
    let server = RedisServer::start();
    let run = Run {
        scope: "hostile",
        dialect: Dialect::Hostile,
        tokens: false,
        learn: true,
        fleet: Fleet::Redis(server.url()),
        scale: SCALED,
    };
    let figures = fleet_run(run.clone()).await;
    figures.print("hostile partner (max_pause 300 ms):");
    assert_eq!(
        figures.admitted,
        CLIENTS * SCALED.calls,
        "every call completes"
    );
    // At most one round of in-flight calls refused per pause: the 429s do not recur at the
    // configured rate.
    let pauses = figures.elapsed.as_millis() / 300 + 1;
    let bound = usize::try_from(pauses).unwrap() * CLIENTS;
    assert!(figures.refused <= bound, "{figures:?}");
    let limiter = run.fleet.limiter().await;
    let limits = [ratelimit_runtime::Limit::new(
        Policy::new(
            Algorithm::Gcra,
            SCALED.configured_per_second,
            Duration::from_secs(1),
        )
        .unwrap(),
        "hostile",
        ratelimit_runtime::By::Global,
    )];
    let target = ratelimit_runtime::Target::global().key("requests");
    let now = limiter.peek(&limits, &target).await.unwrap();
    assert!(
        now.retry_after().unwrap_or_default() <= Duration::from_millis(300),
        "{now:?}"
    );
}

/// A partner that answers its first request 429 with `Retry-After: 2`, then 200: its URL, and
/// when it received each request.
async fn one_429_then_200() -> (String, Arc<Mutex<Vec<Duration>>>) {
    let received = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&received);
    let start = Instant::now();
    let app = axum::Router::new().route(
        "/v1/call",
        axum::routing::post(move || {
            let log = Arc::clone(&log);
            async move {
                let mut log = log.lock().unwrap();
                log.push(start.elapsed());
                if log.len() == 1 {
                    (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "2")]).into_response()
                } else {
                    StatusCode::OK.into_response()
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1/call", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    (url, received)
}

/// A process's layer: 100 requests a second, waiting up to `wait`.
async fn hundred_a_second(scope: &'static str, fleet: &Fleet, wait: Duration) -> PartnerLayer {
    let requests = Policy::new(Algorithm::Gcra, 100, Duration::from_secs(1)).unwrap();
    PartnerLayer::builder(scope)
        .requests(requests)
        .wait(wait)
        .limiter(fleet.limiter().await)
        .build()
        .unwrap()
}

/// Nothing reached the partner during its pause: two requests, 2 s apart at least.
fn paused_between(received: &Mutex<Vec<Duration>>) {
    let received = received.lock().unwrap().clone();
    assert_eq!(received.len(), 2, "nothing sent during the pause");
    let gap = received[1].saturating_sub(received[0]);
    assert!(gap >= Duration::from_millis(1900), "{gap:?}");
}

/// One 429 with `Retry-After: 2`, seen by one process, pauses the budget for the others: a
/// second process that may not wait is refused before sending, with the partner's time; one
/// that may wait sends once the pause is over (and the partner sees no request in between).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_429_pauses_every_process_waiting_ones_wait_the_rest_are_refused_with_its_time() {
    use ratelimit_runtime::RateLimitError;
    use ratelimit_runtime::client::PartnerError;

    let server = RedisServer::start();
    let fleet = Fleet::Redis(server.url());
    let (url, received) = one_429_then_200().await;
    let process = |wait: Duration| {
        let fleet = fleet.clone();
        async move {
            let layer = hundred_a_second("paused", &fleet, wait).await;
            layer.layer(Transport(reqwest::Client::new()))
        }
    };
    let request = || axum::http::Request::post(&url).body(String::new()).unwrap();
    let mut first = process(Duration::ZERO).await;
    let refused = first.call(request()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    // Another process, not waiting: refused before sending, with the partner's time.
    let mut impatient = process(Duration::ZERO).await;
    match impatient.call(request()).await {
        Err(PartnerError::RateLimited(RateLimitError::Limited { retry_after, .. })) => {
            // What is left of the partner's 2 s (however slow the machine was since).
            assert!(retry_after > Duration::ZERO, "{retry_after:?}");
            assert!(
                retry_after <= Duration::from_millis(2_050),
                "{retry_after:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    // A third, waiting up to 10 s: sent after the pause.
    let mut patient = process(Duration::from_secs(10)).await;
    let sent = patient.call(request()).await.unwrap();
    assert_eq!(sent.status(), StatusCode::OK);
    paused_between(&received);
}

/// The same through `reqwest-middleware`: the middleware learns as the layer does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reqwest_middleware_pauses_every_process_as_the_layer_does() {
    use ratelimit_runtime::RateLimitError;
    use ratelimit_runtime::client::PartnerMiddleware;

    let server = RedisServer::start();
    let fleet = Fleet::Redis(server.url());
    let (url, received) = one_429_then_200().await;
    let process = |wait: Duration| {
        let fleet = fleet.clone();
        async move {
            let layer = hundred_a_second("paused_reqwest", &fleet, wait).await;
            reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
                .with(PartnerMiddleware::from(layer))
                .build()
        }
    };
    let first = process(Duration::ZERO).await;
    let refused = first.post(&url).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let impatient = process(Duration::ZERO).await;
    match impatient.post(&url).send().await {
        Err(reqwest_middleware::Error::Middleware(error)) => {
            let limited = error.downcast_ref::<RateLimitError>();
            assert!(
                matches!(limited, Some(RateLimitError::Limited { retry_after, .. }) if *retry_after > Duration::ZERO),
                "{error:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    let patient = process(Duration::from_secs(10)).await;
    let sent = patient.post(&url).send().await.unwrap();
    assert_eq!(sent.status(), StatusCode::OK);
    paused_between(&received);
}

/// An operator's block of an hour, then a partner's pause of 2 s, on Redis: the block still
/// ends in an hour, through `defer` and through the store's `extend_block` itself (which
/// decides in one script, so a block written between a read and a write is never cut short);
/// a key without a block is blocked for the pause, and an admin `block` still replaces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_never_shortens_an_operator_s_block_on_redis() {
    use ratelimit_runtime::{By, Limit, RedisStore, Store, Target};
    let server = RedisServer::start();
    let limiter = Fleet::Redis(server.url()).limiter().await;
    let policy = Policy::new(Algorithm::Gcra, 20, Duration::from_secs(1)).unwrap();
    let (a, b) = (
        Limit::new(policy, "defer_a", By::Global),
        Limit::new(policy, "defer_b", By::Global),
    );
    let everyone = Target::global();
    let wait = |v: &Verdict| v.retry_after().unwrap_or_default();
    limiter
        .block(&[a], &everyone, Duration::from_hours(1))
        .await
        .unwrap();
    limiter
        .defer(&[a, b], &everyone, Duration::from_secs(2))
        .await
        .unwrap();
    let peek_a = limiter.peek(&[a], &everyone).await.unwrap();
    assert!(wait(&peek_a) > Duration::from_secs(3500), "{peek_a:?}");
    let peek_b = limiter.peek(&[b], &everyone).await.unwrap();
    assert!(wait(&peek_b) > Duration::ZERO, "{peek_b:?}");
    assert!(wait(&peek_b) <= Duration::from_secs(3), "{peek_b:?}");

    // The store's own write, key by key.
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let checks = [Check::new("op", &policy), Check::new("free", &policy)];
    store.block(&["op"], Duration::from_hours(1)).await.unwrap();
    store
        .extend_block(&["op", "free"], Duration::from_secs(2))
        .await
        .unwrap();
    let now = store.peek(&checks).await.unwrap();
    let waits: Vec<Duration> = now
        .decisions()
        .iter()
        .map(|d| d.retry_after.unwrap_or_default())
        .collect();
    assert!(waits[0] > Duration::from_secs(3500), "{waits:?}");
    assert!(
        waits[1] > Duration::ZERO && waits[1] <= Duration::from_secs(3),
        "{waits:?}"
    );
    // A longer pause extends; the admin block keeps its meaning (a later block replaces).
    store
        .extend_block(&["free"], Duration::from_mins(10))
        .await
        .unwrap();
    store.block(&["op"], Duration::from_secs(5)).await.unwrap();
    let now = store.peek(&checks).await.unwrap();
    let waits: Vec<Duration> = now
        .decisions()
        .iter()
        .map(|d| d.retry_after.unwrap_or_default())
        .collect();
    assert!(waits[0] <= Duration::from_secs(6), "{waits:?}");
    assert!(waits[1] > Duration::from_secs(500), "{waits:?}");
}

/// A block or a pause of any length (`Duration::MAX`: until reset) is written on every
/// store, cut to a hundred years: never a panic (the blocked-caller cache names its end),
/// never an expiry Redis refuses (which would leave the budget unpaused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_or_a_pause_of_any_length_holds_on_every_store() {
    use ratelimit_runtime::{By, Limit, RedisStore, Store, Target};
    let server = RedisServer::start();
    let policy = Policy::new(Algorithm::Gcra, 20, Duration::from_secs(1)).unwrap();
    let (blocked, paused) = (
        Limit::new(policy, "for_ever_block", By::Global),
        Limit::new(policy, "for_ever_pause", By::Global),
    );
    let everyone = Target::global();
    let ninety_nine_years = Duration::from_hours(99 * 365 * 24);
    let memory = RateLimiter::builder().build().await.unwrap();
    for fleet in [Fleet::Memory(memory), Fleet::Redis(server.url())] {
        let limiter = fleet.limiter().await;
        limiter
            .block(&[blocked], &everyone, Duration::MAX)
            .await
            .unwrap();
        limiter
            .defer(&[paused], &everyone, Duration::MAX)
            .await
            .unwrap();
        for limit in [blocked, paused] {
            let now = limiter.peek(&[limit], &everyone).await.unwrap();
            assert!(now.retry_after().unwrap() > ninety_nine_years, "{now:?}");
        }
        limiter.reset(&[blocked, paused], &everyone).await.unwrap();
        let now = limiter.peek(&[blocked, paused], &everyone).await.unwrap();
        assert!(now.is_admitted(), "{now:?}");
    }
    // The store's own writes, key by key.
    let store = RedisStore::connect(&server.url()).await.unwrap();
    store.block(&["a"], Duration::MAX).await.unwrap();
    store.extend_block(&["b"], Duration::MAX).await.unwrap();
    let checks = [Check::new("a", &policy), Check::new("b", &policy)];
    let now = store.peek(&checks).await.unwrap();
    for decision in now.decisions() {
        assert!(decision.retry_after.unwrap() > ninety_nine_years, "{now:?}");
    }
}
