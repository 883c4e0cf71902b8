//! Private `redis-server` processes for tests: a free loopback port, no persistence, the log in
//! a temporary directory, killed on drop. Never the Redis on 6379.
//!
//! [`RedisProcess`] is the building block (spawn one server with extra arguments, wait until it
//! answers `PING`, kill it); [`RedisServer`] is a standalone server for store tests. A cluster
//! harness spawns six [`RedisProcess`]es with `--cluster-enabled yes` and joins them with
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

use std::fmt::Write as _;
use std::io::{self, Write as _};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ratelimit_runtime::RedisStore;
use redis::aio::{ConnectionManager, MultiplexedConnection};

/// How long a server may take to answer its first `PING`.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);

const INSTALL_HINT: &str = "`redis-server` was not found on PATH: install it (Debian/Ubuntu: \
     `apt-get install redis-server`; macOS: `brew install redis`) to run the Redis tests, or \
     name a server binary in RATELIMIT_TEST_SERVER";

/// The environment variable naming the server binary the tests start.
pub const SERVER_VAR: &str = "RATELIMIT_TEST_SERVER";

/// The server binary the tests start: `$RATELIMIT_TEST_SERVER`, or `redis-server` (on `PATH`).
pub fn server_binary() -> String {
    std::env::var(SERVER_VAR)
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "redis-server".to_owned())
}

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

/// [`engine`], or why it is not known: [`INSTALL_HINT`] when the binary is missing.
fn try_engine() -> Result<&'static Engine, String> {
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
                        INSTALL_HINT.to_owned()
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

/// A port on 127.0.0.1 that nothing listened on a moment ago.
pub fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port())
}

/// The last `lines` lines of a file (for error messages), or why it could not be read.
pub fn tail(path: &Path, lines: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// One `redis-server` process listening on `127.0.0.1:<port>`, with its working directory and
/// log file in `dir`. Killed on drop.
#[derive(Debug)]
pub struct RedisProcess {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
}

impl RedisProcess {
    /// Starts `redis-server --port <port> --bind 127.0.0.1 --save "" --appendonly no --dir <dir>
    /// --logfile <dir>/redis-<port>.log <extra…>` and waits (at most [`START_TIMEOUT`]) until it
    /// answers `PING`. The error says how to install Redis when it is missing, and holds the
    /// log's tail when the server did not come up.
    pub fn spawn(port: u16, dir: &Path, extra: &[&str]) -> Result<Self, String> {
        let mut process = Self {
            child: None,
            port,
            dir: dir.to_path_buf(),
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
        };
        process.start()?;
        Ok(process)
    }

    /// The log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join(format!("redis-{}.log", self.port))
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Whether the process is running (as far as this handle knows).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(None)))
    }

    /// Starts the process again (same port, directory and arguments) after [`Self::kill`].
    pub fn start(&mut self) -> Result<(), String> {
        if self.is_running() {
            return Ok(());
        }
        let port = self.port.to_string();
        let log = self.log_path();
        let binary = try_engine()?.binary.clone();
        let mut cmd = Command::new(&binary);
        cmd.args([
            "--port",
            &port,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(&self.dir)
        .arg("--logfile")
        .arg(&log)
        .args(&self.extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
        let child = cmd.spawn().map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                INSTALL_HINT.to_owned()
            } else {
                format!("cannot start {binary}: {e}")
            }
        })?;
        self.child = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        let client = redis::Client::open(self.url()).map_err(|e| e.to_string())?;
        let mut last_error = String::new();
        while Instant::now() < deadline {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                let mut stderr = String::new();
                if let Some(mut err) = self.child.take().and_then(|mut c| c.stderr.take()) {
                    let _ = io::Read::read_to_string(&mut err, &mut stderr);
                }
                return Err(format!(
                    "the server on port {} exited with {status}.\nstderr: {stderr}\nlog tail:\n{}",
                    self.port,
                    tail(&self.log_path(), 20)
                ));
            }
            match client
                .get_connection_with_timeout(Duration::from_millis(500))
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
            {
                Ok(_) => return Ok(()),
                // The server answered (e.g. NOAUTH with --requirepass): it is up, unless it is
                // still loading its data.
                Err(e)
                    if !(e.is_io_error() || e.is_connection_refusal() || e.is_timeout())
                        && e.code() != Some("LOADING") =>
                {
                    return Ok(());
                }
                Err(e) => last_error = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        Err(format!(
            "the server on port {} did not answer PING within {START_TIMEOUT:?} (last error: {last_error}).\nlog tail:\n{}",
            self.port,
            tail(&self.log_path(), 20)
        ))
    }

    /// Kills the process (SIGKILL) and waits for it. Idempotent.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A private standalone Redis server for one test (or a few sharing it).
///
/// Behaviour: started on a free loopback port with persistence off and its files in a fresh
/// temporary directory; killed when dropped. [`RedisServer::kill`] and
/// [`RedisServer::restart`] (same port) let failure tests take it away and bring it back.
#[derive(Debug)]
pub struct RedisServer {
    process: RedisProcess,
    // Dropped after the process (fields drop in order), so the log stays until the end.
    _dir: tempfile::TempDir,
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

    /// Starts a server with extra arguments; `Err` says why not. A port taken between picking
    /// it and binding it (by a test running in parallel) is retried with another one.
    pub fn try_start_with(extra: &[&str]) -> Result<Self, String> {
        let dir = tempfile::Builder::new()
            .prefix("ratelimit-redis-")
            .tempdir()
            .map_err(|e| format!("cannot create a temporary directory: {e}"))?;
        let mut errors = String::new();
        for _ in 0..5 {
            let port = free_port().map_err(|e| format!("no free port: {e}"))?;
            match RedisProcess::spawn(port, dir.path(), extra) {
                Ok(process) => return Ok(Self { process, _dir: dir }),
                Err(e) if e == INSTALL_HINT => return Err(e),
                Err(e) => {
                    let _ = writeln!(errors, "{e}");
                }
            }
        }
        Err(errors)
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        self.process.url()
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.process.port()
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
        self.process.kill();
    }

    /// Starts the server again on the same port (empty, and with an empty script cache).
    pub fn restart(&mut self) {
        self.process.kill();
        self.process.start().unwrap_or_else(|e| panic!("{e}"));
    }

    /// Makes the server hold every client command for `d` (`CLIENT PAUSE <ms> ALL`), to test
    /// timeouts; returns at once.
    pub async fn pause(&self, d: Duration) {
        let mut conn = self.connection().await;
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(ms)
            .arg("ALL")
            .query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("CLIENT PAUSE: {e}"));
    }

    /// The server's log so far (its last `lines` lines).
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.process.log_path(), lines)
    }
}
