//! Table 9: a cold start. A fresh process (this binary again: `connect <url>`) connects a
//! `RedisStore` three times, one after another. The first connection of a process builds what
//! the store sends (the library's text and name, and where a server needs them the scripts'
//! texts and SHA1s) and loads it; the later ones load it again with all that built. The
//! parent starts the processes one at a time and reports the medians, and what the server ran
//! per connection (`INFO commandstats`, the `INFO` reads left out).

use std::fmt::Write as _;
use std::process::Command;
use std::time::Instant;

use ratelimit_runtime::RedisStore;

use crate::Config;
use crate::report::median;
use crate::server::{CommandStat, RedisServer};

/// Connections per process.
const CONNECTIONS: usize = 3;

/// `connect <url>`: connects [`CONNECTIONS`] times and prints each connection's milliseconds on
/// one line.
pub fn child(args: &[String]) -> Result<(), String> {
    let url = args.first().ok_or("connect: no url")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    for _ in 0..CONNECTIONS {
        let started = Instant::now();
        let store = rt
            .block_on(RedisStore::connect(url))
            .map_err(|e| e.to_string())?;
        let _ = write!(line, "{} ", started.elapsed().as_secs_f64() * 1000.0);
        drop(store);
    }
    println!("{}", line.trim_end());
    Ok(())
}

/// Table 9: `cfg.rounds × 5` fresh processes against `server`.
pub fn table(server: &RedisServer, cfg: &Config) -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let processes = cfg.rounds * 5;
    let before = server.command_stats()?;
    let (mut first, mut later) = (Vec::new(), Vec::new());
    for _ in 0..processes {
        let out = Command::new(&exe)
            .args(["connect", &server.url()])
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        let times: Vec<f64> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|t| t.parse().ok())
            .collect();
        let (head, tail) = times.split_first().ok_or("connect printed no time")?;
        first.push(*head);
        later.extend_from_slice(tail);
    }
    let after = server.command_stats()?;
    #[allow(clippy::cast_precision_loss)]
    let connections = (processes * CONNECTIONS) as f64;
    let spread = |v: &[f64]| {
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(0.0, f64::max);
        format!("{:.1} | {min:.1}–{max:.1}", median(v))
    };
    let mut body = format!(
        "{processes} fresh processes, one at a time, each connecting {CONNECTIONS} times \
         (`RedisStore::connect`, loopback).\n\n\
         | connection | median ms | range ms |\n| --- | --- | --- |\n\
         | the first of a process | {} |\n| a later one | {} |\n\n\
         | command the server ran | per connection | server µs per connection |\n| --- | --- | --- |\n",
        spread(&first),
        spread(&later),
    );
    for (command, calls, usec) in ran_between(&before, &after) {
        #[allow(clippy::cast_precision_loss)]
        let per = calls as f64 / connections;
        let _ = writeln!(
            body,
            "| `{command}` | {per:.1} | {:.0} |",
            usec / connections
        );
    }
    body.push('\n');
    Ok(body)
}

/// The commands whose calls grew between two `INFO commandstats` reads, by name: (name,
/// calls, µs).
fn ran_between(before: &[CommandStat], after: &[CommandStat]) -> Vec<(String, u64, f64)> {
    let mut ran: Vec<_> = after
        .iter()
        .filter_map(|a| {
            let b = before.iter().find(|b| b.command == a.command);
            let calls = a.calls - b.map_or(0, |b| b.calls);
            let usec = a.usec - b.map_or(0.0, |b| b.usec);
            (calls > 0).then(|| (a.command.clone(), calls, usec))
        })
        .collect();
    ran.sort_by(|a, b| a.0.cmp(&b.0));
    ran
}
