//! Test support (feature `testing`, for `[dev-dependencies]`): [`RedisServer`], a private
//! `redis-server` for an integration test of your limits against a real Redis. The guide's
//! chapter "Testing your limits" (`guide::testing`) shows it with the rest.

use std::io::{self, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
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
/// let server = RedisServer::start()?; // a clear error when redis-server is not installed
/// let limiter = RateLimiter::builder().redis_url(server.url()).build().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    port: u16,
    dir: PathBuf,
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
        let binary = std::env::var(SERVER_ENV).unwrap_or_else(|_| "redis-server".to_owned());
        let mut last = None;
        for _ in 0..5 {
            match Self::start_once(&binary) {
                Ok(server) => return Ok(server),
                Err(e @ (StartError::NotInstalled { .. } | StartError::Io(_))) => return Err(e),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(StartError::NotReady {
            detail: "no attempt".to_owned(),
        }))
    }

    fn start_once(binary: &str) -> Result<Self, StartError> {
        static STARTED: AtomicU64 = AtomicU64::new(0);
        let port = TcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.local_addr())
            .map_err(StartError::Io)?
            .port();
        let dir = std::env::temp_dir().join(format!(
            "ratelimit-redis-{}-{}",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(StartError::Io)?;
        let child = Command::new(binary)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--logfile", "redis.log"])
            .arg("--dir")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(if e.kind() == io::ErrorKind::NotFound {
                    StartError::NotInstalled {
                        binary: binary.to_owned(),
                    }
                } else {
                    StartError::Io(e)
                });
            }
        };
        let mut server = Self { child, port, dir };
        server.wait_ready()?;
        Ok(server)
    }

    /// Waits until the server answers `PING`, or says why it did not.
    fn wait_ready(&mut self) -> Result<(), StartError> {
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(self.not_ready(&format!("it exited with {status}")));
            }
            if self.ping().is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(self.not_ready(&format!("no answer to PING within {START_TIMEOUT:?}")))
    }

    fn ping(&self) -> io::Result<()> {
        let mut conn = TcpStream::connect(("127.0.0.1", self.port))?;
        conn.set_read_timeout(Some(Duration::from_millis(500)))?;
        conn.write_all(b"PING\r\n")?;
        let mut reply = [0; 7];
        conn.read_exact(&mut reply)?;
        if &reply == b"+PONG\r\n" {
            Ok(())
        } else {
            Err(io::Error::other("not PONG"))
        }
    }

    fn not_ready(&self, what: &str) -> StartError {
        let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(10)..].join("\n");
        StartError::NotReady {
            detail: format!("port {}: {what}; log tail:\n{tail}", self.port),
        }
    }

    /// `redis://127.0.0.1:<port>`, for [`Builder::redis_url`](crate::Builder::redis_url).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A missing binary is a typed error naming it and how to install Redis, never a panic.
    #[test]
    fn a_missing_binary_says_how_to_install_redis() {
        let Err(e) = RedisServer::start_once("ratelimit-no-such-redis-server") else {
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
