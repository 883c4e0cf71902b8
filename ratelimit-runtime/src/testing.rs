//! Test support (feature `testing`, for `[dev-dependencies]`): [`RedisServer`], a private
//! `redis-server` for an integration test of your limits against a real Redis. The guide's
//! chapter "Testing your limits" (`guide::testing`) shows it with the rest.

use std::io::{self, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The environment variable naming the server binary to start (default `redis-server`, found
/// on `PATH`): another engine (`valkey-server`) or version.
pub const SERVER_ENV: &str = "RATELIMIT_TEST_SERVER";

/// How long [`RedisServer::start`] waits for the server to answer `PING`.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Why [`RedisServer::start`] could not start a server.
#[derive(Debug)]
#[non_exhaustive]
pub enum StartError {
    /// The server binary is not installed (or not on `PATH`).
    NotInstalled {
        /// The binary it looked for.
        binary: String,
    },
    /// The binary, a free port or the server's directory could not be had.
    Io(io::Error),
    /// The server exited, or did not answer `PING` within [`START_TIMEOUT`].
    NotReady {
        /// What happened, with the tail of the server's log.
        detail: String,
    },
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotInstalled { binary } => write!(
                f,
                "`{binary}` was not found: install Redis (Debian/Ubuntu: `apt-get install \
                 redis-server`; macOS: `brew install redis`) or set {SERVER_ENV} to a server binary"
            ),
            Self::Io(e) => write!(f, "cannot start a Redis server: {e}"),
            Self::NotReady { detail } => write!(f, "the Redis server did not start: {detail}"),
        }
    }
}

impl std::error::Error for StartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// A private `redis-server` for one test: started on a free loopback port, without
/// persistence (`--save ""`, `--appendonly no`), its files in a fresh temporary directory;
/// killed (and the directory removed) when dropped.
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use ratelimit_runtime::RateLimiter;
/// use ratelimit_runtime::testing::RedisServer;
///
/// let mut server = RedisServer::start()?; // a clear error when redis-server is not installed
/// let limiter = RateLimiter::builder().redis_url(server.url()).build().await?;
/// // An outage, for a test of the failure policy: the server goes away and comes back
/// // (empty) on the same port.
/// server.kill();
/// server.restart()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    /// Whether `dir` was made for this server (removed on drop) or given by the caller.
    own_dir: bool,
    args: Vec<String>,
}

impl RedisServer {
    /// Starts a server (the binary [`SERVER_ENV`] names, else `redis-server`) and waits until
    /// it answers `PING`. A port another process took between picking and binding it is
    /// retried with another one.
    ///
    /// # Errors
    ///
    /// [`StartError::NotInstalled`] without the binary, [`StartError::NotReady`] (with the
    /// log's tail) when the server did not come up.
    pub fn start() -> Result<Self, StartError> {
        Self::start_with(&[])
    }

    /// [`RedisServer::start`] with extra `redis-server` arguments, e.g. a password
    /// (`["--requirepass", "pw"]`) or a memory cap (`["--maxmemory", "1mb"]`).
    ///
    /// # Errors
    ///
    /// As [`RedisServer::start`].
    ///
    /// ```no_run
    /// use ratelimit_runtime::testing::RedisServer;
    ///
    /// let server = RedisServer::start_with(&["--requirepass", "s3cret"])?;
    /// let url = format!("redis://:s3cret@127.0.0.1:{}", server.port());
    /// # Ok::<(), ratelimit_runtime::testing::StartError>(())
    /// ```
    pub fn start_with(args: &[&str]) -> Result<Self, StartError> {
        let mut last = None;
        for _ in 0..5 {
            let port = free_port().map_err(StartError::Io)?;
            let dir = fresh_dir().map_err(StartError::Io)?;
            let mut server = Self::new(port, dir, true, args);
            match server.run() {
                Ok(()) => return Ok(server),
                Err(e @ (StartError::NotInstalled { .. } | StartError::Io(_))) => return Err(e),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(StartError::NotReady {
            detail: "no attempt".to_owned(),
        }))
    }

    /// Starts a server on `port`, its files (`redis-<port>.log`) in `dir`, which stays when
    /// the server is dropped: a server that comes up after the store under test connected,
    /// or the nodes of a cluster sharing one directory.
    ///
    /// # Errors
    ///
    /// As [`RedisServer::start`] (a port in use is [`StartError::NotReady`]).
    ///
    /// ```no_run
    /// use ratelimit_runtime::testing::RedisServer;
    ///
    /// let dir = std::env::temp_dir();
    /// let node = RedisServer::start_on(7000, &dir, &["--cluster-enabled", "yes"])?;
    /// # Ok::<(), ratelimit_runtime::testing::StartError>(())
    /// ```
    pub fn start_on(port: u16, dir: &Path, args: &[&str]) -> Result<Self, StartError> {
        let mut server = Self::new(port, dir.to_path_buf(), false, args);
        server.run()?;
        Ok(server)
    }

    fn new(port: u16, dir: PathBuf, own_dir: bool, args: &[&str]) -> Self {
        Self {
            child: None,
            port,
            dir,
            own_dir,
            args: args.iter().map(|&a| a.to_owned()).collect(),
        }
    }

    /// Spawns the process (when it is not running) and waits until it answers.
    fn run(&mut self) -> Result<(), StartError> {
        if self.is_running() {
            return Ok(());
        }
        self.spawn_binary(&server_binary())
    }

    /// Spawns `binary` as this server and waits until it answers.
    fn spawn_binary(&mut self, binary: &str) -> Result<(), StartError> {
        let child = Command::new(binary)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.log_path())
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // A configuration the server refuses is reported on stderr, before the log file
            // is opened: kept for the error (nothing else is written there once it runs).
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                if e.kind() == io::ErrorKind::NotFound {
                    StartError::NotInstalled {
                        binary: binary.to_owned(),
                    }
                } else {
                    StartError::Io(e)
                }
            })?;
        self.child = Some(child);
        let ready = self.wait_ready();
        if ready.is_err() {
            self.kill();
        }
        ready
    }

    /// Waits until the server answers `PING`, or says why it did not.
    fn wait_ready(&mut self) -> Result<(), StartError> {
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                let mut stderr = String::new();
                if let Some(mut err) = self.child.as_mut().and_then(|c| c.stderr.take()) {
                    let _ = err.read_to_string(&mut stderr);
                }
                return Err(self.not_ready(&format!(
                    "it exited with {status}; stderr: {}",
                    stderr.trim()
                )));
            }
            if self.ping().is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(self.not_ready(&format!("no answer to PING within {START_TIMEOUT:?}")))
    }

    /// `Ok` once the server answers: `+PONG`, or an error other than `-LOADING` (a server with
    /// `--requirepass` answers `-NOAUTH`: it is up).
    fn ping(&self) -> io::Result<()> {
        let mut conn = TcpStream::connect(("127.0.0.1", self.port))?;
        conn.set_read_timeout(Some(Duration::from_millis(500)))?;
        conn.write_all(b"PING\r\n")?;
        let mut reply = [0; 8];
        let n = conn.read(&mut reply)?;
        let reply = &reply[..n];
        if reply.starts_with(b"+") || (reply.starts_with(b"-") && !reply.starts_with(b"-LOADING")) {
            Ok(())
        } else {
            Err(io::Error::other("not ready"))
        }
    }

    fn not_ready(&self, what: &str) -> StartError {
        StartError::NotReady {
            detail: format!(
                "port {}: {what}; log tail:\n{}",
                self.port,
                self.log_tail(10)
            ),
        }
    }

    /// `redis://127.0.0.1:<port>`, for [`Builder::redis_url`](crate::limiter::Builder::redis_url).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join(format!("redis-{}.log", self.port))
    }

    /// The last `lines` lines of the server's log (for a test's failure message).
    pub fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Whether the process is running (as far as this handle knows).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(None)))
    }

    /// Kills the server (SIGKILL) and waits for it: its connections drop, its data is gone.
    /// Idempotent.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, with the same arguments, empty (after
    /// [`RedisServer::kill`]; a running server is left as it is).
    ///
    /// # Errors
    ///
    /// As [`RedisServer::start`].
    pub fn restart(&mut self) -> Result<(), StartError> {
        self.run()
    }
}

/// The server binary [`RedisServer`] starts: [`SERVER_ENV`] when set and not empty, else
/// `redis-server` (found on `PATH`).
///
/// ```
/// let binary = ratelimit_runtime::testing::server_binary();
/// assert!(!binary.is_empty());
/// ```
pub fn server_binary() -> String {
    std::env::var(SERVER_ENV)
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "redis-server".to_owned())
}

/// A port on 127.0.0.1 that nothing listened on a moment ago: for
/// [`RedisServer::start_on`], e.g. a server started after the store under test connected.
///
/// # Errors
///
/// When no loopback port can be bound.
///
/// ```
/// let port = ratelimit_runtime::testing::free_port()?;
/// assert_ne!(port, 0);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port())
}

/// A new empty directory under the system's temporary directory.
fn fresh_dir() -> io::Result<PathBuf> {
    static STARTED: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "ratelimit-redis-{}-{}",
        std::process::id(),
        STARTED.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        if self.own_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A missing binary is a typed error naming it and how to install Redis, never a panic.
    #[test]
    fn a_missing_binary_says_how_to_install_redis() {
        let mut server = RedisServer::new(0, std::env::temp_dir(), false, &[]);
        let Err(e) = server.spawn_binary("ratelimit-no-such-redis-server") else {
            panic!("a server started from a binary that does not exist");
        };
        assert!(matches!(e, StartError::NotInstalled { .. }), "{e:?}");
        let message = e.to_string();
        assert!(
            message.contains("ratelimit-no-such-redis-server") && message.contains("install"),
            "{message}"
        );
    }

    /// A started server answers on its port and is gone after drop, its directory removed.
    #[test]
    fn a_server_answers_and_is_killed_on_drop() {
        let server = RedisServer::start().expect("redis-server is installed where tests run");
        server.ping().expect("PONG");
        let dir = server.dir.clone();
        assert!(dir.exists());
        drop(server); // kills the process, waits for it, then removes its directory
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
}
