//! The example servers stop cleanly on their signal: each example's own binary (Axum,
//! Actix-web), started on a private Redis, answers a few logins, gets SIGINT, drains, shuts its
//! limiter down and exits with success; Redis counts exactly the logins it admitted.

use std::net::{IpAddr, Ipv4Addr};
use std::process::Stdio;
use std::time::{Duration, Instant};

use ratelimit_runtime::{Algorithm, By, Limit, Policy, RateLimiter, Target};
use ratelimit_tests::redis_server::RedisServer;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// An example's `POST /login` limit under `scope` (the same scope and policy: the same key).
fn login_limit(scope: &'static str) -> Limit {
    let policy = Policy::new(Algorithm::Sliding, 3, Duration::from_secs(10)).expect("a policy");
    Limit::new(policy, scope, By::Ip)
}

/// The first line of `lines` that contains `what`, within 90 s.
async fn line_with(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    what: &str,
) -> String {
    let wait = async {
        while let Some(line) = lines.next_line().await.expect("the server's stdout") {
            if line.contains(what) {
                return line;
            }
        }
        panic!("the server's stdout ended before {what:?}");
    };
    tokio::time::timeout(Duration::from_secs(90), wait)
        .await
        .unwrap_or_else(|_| panic!("no {what:?} within 90 s"))
}

/// Starts the example server `binary` (its `name`, its login limit's `scope`) on a private
/// Redis, makes 5 logins (3 admitted), sends SIGINT, and checks its clean exit and what Redis
/// counts.
async fn stops_cleanly_on_sigint(binary: &str, name: &str, scope: &'static str) {
    let server = RedisServer::start();
    let mut child = Command::new(binary)
        .env("RATELIMIT_REDIS_URL", server.url())
        // A check answered late on a loaded machine would be answered by the failure policy
        // (the local quota), not counted by Redis: wide enough that Redis always answers.
        .env("RATELIMIT_TIMEOUT_MS", "2000")
        .env("PORT", "0")
        .env("ADMIN_PORT", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the example's binary starts");
    let mut lines = BufReader::new(child.stdout.take().expect("its stdout")).lines();
    let banner = line_with(&mut lines, "listening on http://").await;
    let addr = banner
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {banner:?}"))
        .to_owned();

    let started = Instant::now();
    let client = reqwest::Client::new();
    let mut admitted = 0_u64;
    for _ in 0..5 {
        let answer = client
            .post(format!("http://{addr}/login"))
            .json(&serde_json::json!({ "user": "alice" }))
            .send()
            .await
            .expect("an answer");
        match answer.status().as_u16() {
            200 => admitted += 1,
            429 => {}
            other => panic!("status {other}"),
        }
    }
    assert_eq!(admitted, 3, "three logins per 10 s per IP");

    let pid = child.id().expect("running").to_string();
    let sent = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("kill runs");
    assert!(sent.success(), "SIGINT sent");
    line_with(&mut lines, &format!("{name} stopped")).await;
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("it exits within 30 s")
        .expect("its status");
    assert!(status.success(), "a clean exit: {status}");

    let limiter = RateLimiter::builder()
        .redis_url(server.url())
        .build()
        .await
        .expect("a limiter on the same Redis");
    let peeked = limiter
        .peek(
            &[login_limit(scope)],
            &Target::ip(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        )
        .await
        .expect("peek");
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_secs(10),
        "the window (10 s) ended before the count was read ({elapsed:?})"
    );
    assert_eq!(3 - peeked.decisions()[0].remaining, admitted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_axum_example_stopped_by_sigint_leaves_exactly_what_it_admitted_counted() {
    stops_cleanly_on_sigint(env!("CARGO_BIN_EXE_axum_server"), "axum_server", "login").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_actix_example_stopped_by_sigint_leaves_exactly_what_it_admitted_counted() {
    stops_cleanly_on_sigint(
        env!("CARGO_BIN_EXE_actix_server"),
        "actix_server",
        "ratelimit_examples::actix_server::login",
    )
    .await;
}
