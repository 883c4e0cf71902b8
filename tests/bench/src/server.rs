//! The benchmark's own `redis-server`: a free loopback port, no persistence, its files in a
//! temp dir, killed on drop. Never the server on 127.0.0.1:6379.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// A running `redis-server` owned by the benchmark.
pub struct RedisServer {
    child: Child,
    port: u16,
    _dir: TempDir,
}

impl RedisServer {
    /// Starts `redis-server` on a free port and waits until it answers `PING`.
    pub fn start() -> Result<Self, String> {
        Self::start_under(&[], Duration::from_secs(5))
    }

    /// Starts `redis-server` as the argument of `wrapper` (say `valgrind --tool=callgrind …`;
    /// empty: directly) and waits up to `patience` until it answers `PING`.
    pub fn start_under(wrapper: &[String], patience: Duration) -> Result<Self, String> {
        for _ in 0..5 {
            let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
            let port = free_port()?;
            let log = dir.path().join("redis.log");
            // `BENCH_REDIS_SERVER=<binary>`: another engine (Redis 6.2, Valkey) than the
            // `redis-server` on PATH.
            let binary =
                std::env::var("BENCH_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned());
            let mut command = match wrapper.split_first() {
                Some((program, args)) => {
                    let mut c = Command::new(program);
                    c.args(args).arg(&binary);
                    c
                }
                None => Command::new(&binary),
            };
            let child = command
                .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(dir.path())
                .arg("--logfile")
                .arg(&log)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot start redis-server (is it installed?): {e}"))?;
            let mut server = Self {
                child,
                port,
                _dir: dir,
            };
            let deadline = Instant::now() + patience;
            while Instant::now() < deadline {
                if server.cli(&["PING"]).is_ok_and(|r| r.trim() == "PONG") {
                    return Ok(server);
                }
                if let Ok(Some(_)) = server.child.try_wait() {
                    break; // the port was taken between our probe and its bind: try another
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Err("redis-server did not start".to_owned())
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Runs one command with `redis-cli` and returns its raw output.
    pub fn cli(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .map_err(|e| format!("redis-cli: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The process id, for profiling the server (under a wrapper: the wrapper's, which
    /// valgrind keeps: it runs the server in its own process).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    let port = listener
        .local_addr()
        .map_err(|e| format!("local_addr: {e}"))?
        .port();
    if port == 6379 {
        return free_port();
    }
    Ok(port)
}

/// One row of `INFO commandstats`: the command (a subcommand folded into its command), its
/// calls and the µs spent in it.
pub struct CommandStat {
    pub command: String,
    pub calls: u64,
    pub usec: f64,
}

impl RedisServer {
    /// `INFO commandstats`, a row per command, the bench's own (`INFO`, `CONFIG`, `COMMAND`)
    /// left out: what tables 7 and 8 count.
    pub fn command_stats(&self) -> Result<Vec<CommandStat>, String> {
        let info = self.cli(&["INFO", "commandstats"])?;
        Ok(info
            .lines()
            .filter_map(|line| {
                let (name, fields) = line.trim().split_once(':')?;
                let name = name.strip_prefix("cmdstat_")?;
                let command = name.split('|').next().unwrap_or(name).to_owned();
                if ["info", "config", "command"].contains(&command.as_str()) {
                    return None;
                }
                let field = |key: &str| {
                    fields
                        .split(',')
                        .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
                };
                Some(CommandStat {
                    calls: field("calls").and_then(|v| v.parse().ok()).unwrap_or(0),
                    usec: field("usec").and_then(|v| v.parse().ok()).unwrap_or(0.0),
                    command,
                })
            })
            .collect())
    }
}
