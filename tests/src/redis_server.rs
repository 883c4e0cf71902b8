//! Private `redis-server` processes for tests: a free loopback port, no persistence, the log in
//! a temporary directory, killed on drop. Never the Redis on 6379.
//!
//! The servers are the runtime's own test helper, [`ratelimit_runtime::testing::RedisServer`];
//! [`RedisServer`] here adds what the tests do with one (connections, a store, a pause, a
//! panic instead of an error). A cluster harness starts six of them with
//! `--cluster-enabled yes` and joins them with
//! `redis-cli --cluster create … --cluster-replicas 1 --cluster-yes`.
//!
//! ```no_run
//! use ratelimit_tests::redis_server::RedisServer;
//! # async fn demo() {
//! let server = RedisServer::start();
//! let mut conn = server.connection().await;
//! let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
//! assert_eq!(pong, "PONG");
//! # }
//! ```
//!
//! **Which server.** `RATELIMIT_TEST_SERVER` names the binary every test starts, clusters
//! included (e.g. `RATELIMIT_TEST_SERVER=target/engines/…/valkey-server`); unset, it is
//! `redis-server` on `PATH`. [`engine`] tells what it is (name and version, from
//! `<binary> --version`), printed once per test binary when the first server starts; tests of
//! what an engine lacks (Redis Functions before Redis 7) skip with a printed reason
//! ([`skip_without_functions`]).
//!
//! Helpers that return a value (not a `Result`) are test steps: they panic with a clear message
//! (how to install Redis, the log's tail, the failing command) when the server misbehaves.
#![allow(
    clippy::missing_panics_doc,
    reason = "the non-Result helpers are test steps that fail by panicking (see the module docs)"
)]

use std::io::{self, Write as _};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use ratelimit_runtime::RedisStore;
use ratelimit_runtime::testing::StartError;
use redis::aio::{ConnectionManager, MultiplexedConnection};

pub use ratelimit_runtime::testing::{
    SERVER_ENV as SERVER_VAR, START_TIMEOUT, free_port, server_binary,
};

/// The engine the tests run on: what `<binary> --version` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Engine {
    /// The binary ([`server_binary`]).
    pub binary: String,
    /// `redis` or `valkey`.
    pub name: &'static str,
    /// Major, minor, patch.
    pub version: (u32, u32, u32),
}

impl Engine {
    /// Parses the first line of `<binary> --version` (`Redis server v=7.0.15 sha=…`,
    /// `Valkey server v=9.1.2 …`); `None` when it is not one.
    pub fn parse(binary: &str, version_line: &str) -> Option<Self> {
        let name = if version_line.starts_with("Valkey server") {
            "valkey"
        } else if version_line.starts_with("Redis server") {
            "redis"
        } else {
            return None;
        };
        let v = version_line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("v="))?;
        let mut parts = v.split('.').map(str::parse::<u32>);
        let (Some(Ok(major)), Some(Ok(minor)), Some(Ok(patch))) =
            (parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        Some(Self {
            binary: binary.to_owned(),
            name,
            version: (major, minor, patch),
        })
    }

    /// Whether the engine has Redis Functions (`FUNCTION LOAD`, `FCALL`): Redis 7 on, and
    /// every Valkey (forked from 7.2).
    pub fn has_functions(&self) -> bool {
        self.name == "valkey" || self.version.0 >= 7
    }

    /// Whether the engine has `PEXPIRETIME` (the same releases as Functions).
    pub fn has_pexpiretime(&self) -> bool {
        self.has_functions()
    }
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (major, minor, patch) = self.version;
        write!(f, "{} {major}.{minor}.{patch} ({})", self.name, self.binary)
    }
}

/// The engine of [`server_binary`], found once per test binary (and printed then, to stderr:
/// `ratelimit-tests: server redis 7.0.15 (redis-server): Redis server v=7.0.15 …`).
///
/// # Panics
/// When the binary cannot be run or its `--version` is not a Redis or Valkey server's.
pub fn engine() -> &'static Engine {
    try_engine().unwrap_or_else(|e| panic!("{e}"))
}

/// [`engine`], or why it is not known: how to install Redis when the binary is missing.
pub(crate) fn try_engine() -> Result<&'static Engine, String> {
    static ENGINE: OnceLock<Result<Engine, String>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let binary = server_binary();
            let out = Command::new(&binary)
                .arg("--version")
                .stdin(Stdio::null())
                .output()
                .map_err(|e| {
                    if e.kind() == io::ErrorKind::NotFound {
                        StartError::NotInstalled {
                            binary: binary.clone(),
                        }
                        .to_string()
                    } else {
                        format!("cannot run `{binary} --version`: {e}")
                    }
                })?;
            let text = String::from_utf8_lossy(&out.stdout);
            let line = text.lines().next().unwrap_or("");
            let engine = Engine::parse(&binary, line).ok_or_else(|| {
                format!("`{binary} --version` does not name a Redis or Valkey server: {line:?}")
            })?;
            say(&format!("ratelimit-tests: server {engine}: {line}"));
            Ok(engine)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// For a test of what needs Redis Functions: `true` (and a printed reason) when the engine
/// has none, so the test returns early instead of failing. Use as
/// `if skip_without_functions("test name") { return; }`.
pub fn skip_without_functions(test: &str) -> bool {
    let engine = engine();
    if engine.has_functions() {
        return false;
    }
    say(&format!(
        "SKIPPED {test}: {engine} has no Redis Functions (FUNCTION, FCALL; Redis 7 on)"
    ));
    true
}

/// Writes a line to the process's stderr, past the test harness's output capture (which takes
/// `eprintln!` of passing tests away): what the harness and skipped tests say shows in every
/// run's output.
pub fn say(line: &str) {
    let _ = writeln!(io::stderr(), "{line}");
}

/// How long the tests' own connections wait for a reply: the store under test sets none (the
/// limiter's timeout bounds each check), and the redis crate's default, 500 ms, is shorter
/// than a reply can take on a loaded 2-core machine running the whole suite (a run with one
/// core kept busy failed on it: "cannot reach the store: timed out" in the exactness
/// scenario's 200 concurrent calls). Long enough never to fire on a live server, short enough
/// that a dead one fails the test.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Closes every client connection of the server `conn` is connected to but `conn` itself
/// (`CLIENT KILL TYPE normal SKIPME yes`), as a network fault would: how many it closed.
///
/// # Errors
/// The server's refusal or a transport error.
pub async fn kill_other_clients(conn: &mut MultiplexedConnection) -> redis::RedisResult<u64> {
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query_async(conn)
        .await
}

/// A private standalone Redis server for one test (or a few sharing it).
///
/// Behaviour: started on a free loopback port with persistence off and its files in a fresh
/// temporary directory; killed when dropped. [`RedisServer::kill`] and
/// [`RedisServer::restart`] (same port) let failure tests take it away and bring it back.
#[derive(Debug)]
pub struct RedisServer {
    server: ratelimit_runtime::testing::RedisServer,
}

impl RedisServer {
    /// Starts a server, panicking with a clear message (how to install Redis, or the log's
    /// tail) when it cannot.
    pub fn start() -> Self {
        Self::try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts a server with extra `redis-server` arguments (e.g. `["--requirepass", "pw"]`).
    pub fn start_with(extra: &[&str]) -> Self {
        Self::try_start_with(extra).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts a server; `Err` says why not.
    pub fn try_start() -> Result<Self, String> {
        Self::try_start_with(&[])
    }

    /// Starts a server with extra arguments (the engine printed first, once); `Err` says why
    /// not.
    pub fn try_start_with(extra: &[&str]) -> Result<Self, String> {
        try_engine()?;
        let server = ratelimit_runtime::testing::RedisServer::start_with(extra)
            .map_err(|e| e.to_string())?;
        Ok(Self { server })
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// A client for this server.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).unwrap_or_else(|e| panic!("client for {}: {e}", self.url()))
    }

    /// A new multiplexed connection (for inspecting keys in tests), with [`RESPONSE_TIMEOUT`].
    pub async fn connection(&self) -> MultiplexedConnection {
        let config =
            redis::AsyncConnectionConfig::new().set_response_timeout(Some(RESPONSE_TIMEOUT));
        self.client()
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url()))
    }

    /// A new connection manager (each one is a separate TCP connection), with
    /// [`RESPONSE_TIMEOUT`].
    pub async fn connection_manager(&self) -> ConnectionManager {
        let config =
            redis::aio::ConnectionManagerConfig::new().set_response_timeout(Some(RESPONSE_TIMEOUT));
        ConnectionManager::new_with_config(self.client(), config)
            .await
            .unwrap_or_else(|e| panic!("connection manager for {}: {e}", self.url()))
    }

    /// A new [`RedisStore`] on its own connection.
    pub async fn store(&self) -> RedisStore {
        RedisStore::connect(&self.url())
            .await
            .unwrap_or_else(|e| panic!("RedisStore::connect({}): {e}", self.url()))
    }

    /// Kills the server (SIGKILL): connections drop, all data is lost.
    pub fn kill(&mut self) {
        self.server.kill();
    }

    /// Starts the server again on the same port (empty, and with an empty script cache).
    pub fn restart(&mut self) {
        self.server.kill();
        self.server.restart().unwrap_or_else(|e| panic!("{e}"));
    }

    /// Makes the server hold every client command for `d` (`CLIENT PAUSE <ms> ALL`), to test
    /// timeouts; returns at once.
    pub async fn pause(&self, d: Duration) {
        self.client_pause(d, "ALL").await;
    }

    /// Makes the server hold the commands that may write for `d` (`CLIENT PAUSE <ms> WRITE`:
    /// scripts, functions and their loading too), while connections and reads go on; returns
    /// at once.
    pub async fn pause_writes(&self, d: Duration) {
        self.client_pause(d, "WRITE").await;
    }

    async fn client_pause(&self, d: Duration, mode: &str) {
        let mut conn = self.connection().await;
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(ms)
            .arg(mode)
            .query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("CLIENT PAUSE {mode}: {e}"));
    }

    /// The server's log so far (its last `lines` lines).
    pub fn log_tail(&self, lines: usize) -> String {
        self.server.log_tail(lines)
    }
}
