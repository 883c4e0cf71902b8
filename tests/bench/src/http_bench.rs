//! Table 4: the macro's overhead. One Axum server (a child process of this binary, with the
//! limiter installed as an application would) serves the same handler twice: `/plain` without
//! the attribute and `/limited` with a limit no run reaches. `wrk` loads each in turn. On Redis
//! it also serves `/incr`: the bare handler making one `INCR` on the same Redis per request
//! (its own multiplexed connection, as the store has), the floor of any Redis-backed limiter.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use ratelimit_runtime::{RateLimiter, RedisStore, rate_limit};
use redis::aio::ConnectionManager;

use crate::Config;
use crate::report::{Table, median, paired_ratio, rate, ratio, verdict};
use crate::server::RedisServer;

/// The handler without the attribute.
async fn plain() -> &'static str {
    "ok"
}

/// The same handler with a per-IP limit that no run reaches.
#[rate_limit(algo = "fixed", num = 1_000_000_000, time = 60, by = "ip")]
async fn limited() -> &'static str {
    "ok"
}

/// The floor: the bare handler plus one `INCR` on the limiter's Redis (a 500 if it fails, so
/// that wrk counts it as non-2xx).
async fn incr(State(mut redis): State<ConnectionManager>) -> Result<&'static str, StatusCode> {
    redis::cmd("INCR")
        .arg(INCR_KEY)
        .query_async::<i64>(&mut redis)
        .await
        .map(|_| "ok")
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)
}

/// The floor's counter.
const INCR_KEY: &str = "bench:incr-floor";

/// The child process: installs the limiter on `store` (`memory` or a Redis URL), serves on a
/// free loopback port, prints `PORT <n>` and serves until killed.
pub fn serve(store: &str) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let builder = RateLimiter::builder();
        let builder = if store == "memory" {
            builder.memory()
        } else {
            builder.store(
                RedisStore::connect(store)
                    .await
                    .map_err(|e| e.to_string())?,
            )
        };
        builder
            .build()
            .await
            .map_err(|e| e.to_string())?
            .install()
            .map_err(|e| e.to_string())?;
        let app = Router::new()
            .route("/plain", get(plain))
            .route("/limited", get(limited));
        let app = if store == "memory" {
            app
        } else {
            let client = redis::Client::open(store).map_err(|e| e.to_string())?;
            let conn = ConnectionManager::new(client)
                .await
                .map_err(|e| e.to_string())?;
            app.merge(Router::new().route("/incr", get(incr)).with_state(conn))
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        println!("PORT {port}");
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .map_err(|e| e.to_string())
    })
}

struct ServerChild {
    child: Child,
    port: u16,
}

impl Drop for ServerChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_server(store: &str) -> Result<ServerChild, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .args(["serve", store])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| e.to_string())?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let port = line
        .trim()
        .strip_prefix("PORT ")
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("the server did not start: {line:?}"))?;
    Ok(ServerChild { child, port })
}

/// What one `wrk` run reported.
struct Wrk {
    per_sec: f64,
    requests: u64,
    non_2xx: u64,
}

/// `wrk -t1 -c50 -d<dur>`.
fn wrk(port: u16, path: &str, dur: Duration) -> Result<Wrk, String> {
    let out = Command::new("wrk")
        .args(["-t1", "-c50", &format!("-d{}s", dur.as_secs().max(1))])
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .map_err(|e| format!("wrk (apt-get install wrk): {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let rps = text
        .lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("cannot read wrk's output: {text}"))?;
    let non_2xx = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Non-2xx or 3xx responses:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let requests = text
        .lines()
        .find_map(|l| l.trim().split_once(" requests in "))
        .and_then(|(n, _)| n.trim().parse().ok())
        .ok_or_else(|| format!("cannot read wrk's request count: {text}"))?;
    Ok(Wrk {
        per_sec: rps,
        requests,
        non_2xx,
    })
}

/// The count the Redis store holds for the `/limited` handler's one caller (127.0.0.1).
fn counted_in_redis(server: &RedisServer) -> Result<u64, String> {
    let keys = server.cli(&[
        "--scan",
        "--pattern",
        "ratelimit:{*limited:ip=127.0.0.1}:1000000000fm",
    ])?;
    let key = keys
        .lines()
        .next()
        .ok_or("the limited handler wrote no key")?;
    server
        .cli(&["GET", key])?
        .trim()
        .parse()
        .map_err(|e| format!("the handler's counter: {e}"))
}

/// The floor's count in Redis (every `/incr` request made one `INCR`).
fn incremented(server: &RedisServer) -> Result<u64, String> {
    server
        .cli(&["GET", INCR_KEY])?
        .trim()
        .parse()
        .map_err(|e| format!("the floor's counter: {e}"))
}

/// Table 4.
pub fn table(redis: &RedisServer, cfg: &Config) -> Result<String, String> {
    let mut table = Table::new(&[
        "store",
        "handler without the attribute (req/s)",
        "with `#[rate_limit(… by = \"ip\")]` (req/s)",
        "÷ without (median of rounds)",
        "target ≥ 0.9",
        "floor: without the attribute, one `INCR` per request (req/s)",
        "÷ floor (median of rounds)",
        "target ≥ 0.8",
        "non-2xx",
        "requests counted in Redis (limited; floor)",
    ]);
    let url = redis.url();
    for (name, store) in [("memory", "memory"), ("Redis", url.as_str())] {
        let on_redis = store != "memory";
        let server = spawn_server(store)?;
        let (mut sent, mut sent_floor) = (0, 0);
        wrk(server.port, "/plain", cfg.warmup)?;
        sent += wrk(server.port, "/limited", cfg.warmup)?.requests;
        if on_redis {
            sent_floor += wrk(server.port, "/incr", cfg.warmup)?.requests;
        }
        let (mut plain, mut limited, mut floor_rates, mut bad) =
            (Vec::new(), Vec::new(), Vec::new(), 0);
        for _ in 0..cfg.rounds {
            let plain_run = wrk(server.port, "/plain", cfg.http_run)?;
            let limited_run = wrk(server.port, "/limited", cfg.http_run)?;
            plain.push(plain_run.per_sec);
            limited.push(limited_run.per_sec);
            bad += plain_run.non_2xx + limited_run.non_2xx;
            sent += limited_run.requests;
            if on_redis {
                let floor_run = wrk(server.port, "/incr", cfg.http_run)?;
                floor_rates.push(floor_run.per_sec);
                bad += floor_run.non_2xx;
                sent_floor += floor_run.requests;
            }
        }
        // With Redis, every limited request must have been counted there: a check answered
        // by the failure policy (timeout, breaker) would make the figure meaningless. Both
        // counts are slightly higher than wrk's: requests still in flight when wrk stops.
        let counted = if on_redis {
            format!(
                "{} of {}; {} of {}",
                rate(counted_in_redis(redis)? as f64),
                rate(sent as f64),
                rate(incremented(redis)? as f64),
                rate(sent_floor as f64),
            )
        } else {
            "— (in the server process)".to_owned()
        };
        let to_plain = paired_ratio(&limited, &plain);
        let (floor, to_floor, floor_verdict) = if on_redis {
            let to_floor_ratio = paired_ratio(&limited, &floor_rates);
            (
                rate(median(&floor_rates)),
                ratio(to_floor_ratio),
                verdict(to_floor_ratio >= 0.8).to_owned(),
            )
        } else {
            ("—".to_owned(), "—".to_owned(), "—".to_owned())
        };
        table.row(vec![
            name.to_owned(),
            rate(median(&plain)),
            rate(median(&limited)),
            ratio(to_plain),
            if on_redis {
                "— (see the floor)".to_owned()
            } else {
                verdict(to_plain >= 0.9).to_owned()
            },
            floor,
            to_floor,
            floor_verdict,
            bad.to_string(),
            counted,
        ]);
        eprintln!("  table 4: {name} done");
    }
    Ok(table.markdown())
}
