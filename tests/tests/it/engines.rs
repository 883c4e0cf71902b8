//! The engines the stores run on: each store logs, once at connect, which server it
//! reached (name and version, as `INFO server` says) and which path its checks take (`FCALL` of
//! the library, or `EVALSHA` of the scripts where the server has no Functions). Run on whichever
//! engine `RATELIMIT_TEST_SERVER` names (see `ratelimit_tests::redis_server`).

#![allow(
    clippy::duration_suboptimal_units,
    reason = "Duration::from_mins is newer than the workspace's rust-version"
)]

use std::sync::{Arc, Mutex};

use ratelimit_runtime::store::Store;
use ratelimit_runtime::{Algorithm, Policy, RedisClusterStore, RedisStore, store::Check};
use ratelimit_tests::redis_cluster::RedisCluster;
use ratelimit_tests::redis_server::{self, RedisServer};

/// Set in the child process that runs one of the connect-log tests alone.
const CHILD_ENV: &str = "RATELIMIT_TEST_ENGINES_CHILD";

/// Runs this module's test `name` alone in a child process of the test binary and asserts it
/// passed; `false` in that child, which then runs the test's body. The connect log is read
/// through a subscriber scoped to the test's thread, and in the one test binary other tests
/// log connects on other threads at the same time (with subscribers of their own, whose
/// registration races with tracing's per-callsite cache): alone in a process, the test sees
/// exactly its store's events. (One Valkey run in CI missed the cluster's connect event.)
fn run_alone(name: &str) -> bool {
    if std::env::var_os(CHILD_ENV).is_some() {
        return false;
    }
    let module = module_path!();
    let module = module.split_once("::").map_or(module, |(_, m)| m);
    let test = format!("{module}::{name}");
    let out = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args([test.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{test} in a child process:\n{stdout}\n{stderr}"
    );
    true
}

/// One `connected` event's fields: store, server, version, path.
type Connect = [String; 4];

/// Collects the stores' `connected` events on the thread it is the default of.
#[derive(Clone, Default)]
struct Connects(Arc<Mutex<Vec<Connect>>>);

#[derive(Default)]
struct Fields {
    message: String,
    store: String,
    server: String,
    version: String,
    path: String,
}

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let value = format!("{value:?}").trim_matches('"').to_owned();
        self.record_str(field, &value);
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        let slot = match field.name() {
            "message" => &mut self.message,
            "store" => &mut self.store,
            "server" => &mut self.server,
            "version" => &mut self.version,
            "path" => &mut self.path,
            _ => return,
        };
        value.clone_into(slot);
    }
}

impl tracing::Subscriber for Connects {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut f = Fields::default();
        event.record(&mut f);
        if *event.metadata().level() == tracing::Level::INFO && f.message.contains("connected to") {
            self.0
                .lock()
                .unwrap()
                .push([f.store, f.server, f.version, f.path]);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

impl Connects {
    fn take(&self) -> Vec<Connect> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// What the log must say for `store` on the engine under test.
fn expected(store: &str) -> Connect {
    let engine = redis_server::engine();
    let (major, minor, fix) = engine.version;
    let path = if engine.has_functions() {
        "FCALL"
    } else {
        "EVALSHA"
    };
    [
        store.to_owned(),
        engine.name.to_owned(),
        format!("{major}.{minor}.{fix}"),
        path.to_owned(),
    ]
}

/// Runs `f` on a current-thread runtime with `connects` as this thread's subscriber: every
/// event of the stores' futures is seen here, none of a parallel test's.
fn logged<F: Future<Output = ()>>(connects: &Connects, f: F) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(connects.clone(), || rt.block_on(f));
}

fn quota() -> Policy {
    Policy::new(Algorithm::Fixed, 100, std::time::Duration::from_secs(60)).unwrap()
}

/// `RedisStore::connect` logs the server's name and version and the path once; checks after
/// it log nothing more. A lazy store logs the same at its first check, once.
#[test]
fn a_redis_store_logs_the_engine_and_its_path_once_at_connect() {
    if run_alone("a_redis_store_logs_the_engine_and_its_path_once_at_connect") {
        return;
    }
    let server = RedisServer::start();
    let connects = Connects::default();
    let policy = quota();
    logged(&connects, async {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        assert_eq!(connects.take(), vec![expected("redis")]);
        for _ in 0..3 {
            store
                .check(&[Check::new("ratelimit:{engines}:a", &policy)])
                .await
                .unwrap();
        }
        assert_eq!(connects.take(), Vec::<Connect>::new(), "once per store");

        let lazy = RedisStore::lazy(&server.url()).unwrap();
        assert_eq!(
            connects.take(),
            Vec::<Connect>::new(),
            "not before it connects"
        );
        for _ in 0..3 {
            lazy.check(&[Check::new("ratelimit:{engines}:b", &policy)])
                .await
                .unwrap();
        }
        assert_eq!(connects.take(), vec![expected("redis")]);
    });
}

/// `RedisClusterStore::connect` logs the same, once, for the cluster.
#[test]
fn a_cluster_store_logs_the_engine_and_its_path_once_at_connect() {
    if run_alone("a_cluster_store_logs_the_engine_and_its_path_once_at_connect") {
        return;
    }
    let connects = Connects::default();
    let policy = quota();
    logged(&connects, async {
        let cluster = RedisCluster::start().await;
        connects.take();
        let store = RedisClusterStore::connect(cluster.urls()).await.unwrap();
        store
            .check(&[Check::new("ratelimit:{engines}:c", &policy)])
            .await
            .unwrap();
        assert_eq!(connects.take(), vec![expected("redis-cluster")]);
    });
}

/// A number from `INFO commandstats`: field `field` of `cmdstat_<command>`, or 0.
fn commandstat(info: &str, command: &str, field: &str) -> f64 {
    let prefix = format!("cmdstat_{command}:");
    info.lines()
        .find_map(|l| l.trim().strip_prefix(&prefix))
        .and_then(|rest| {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix(field)?.strip_prefix('='))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// The figures of BENCHMARKS.md's table per engine: for each algorithm, the bytes one active
/// caller holds (`MEMORY USAGE` of its key after one check, averaged over `CALLERS`) and the
/// server's CPU per check (`INFO commandstats`: µs per `FCALL` or `EVALSHA` over `CHECKS`
/// checks on those callers, as the server counts it, whatever the client's speed). Prints a
/// Markdown row per algorithm. Re-run per engine:
///
/// ```sh
/// RATELIMIT_TEST_SERVER=<binary> cargo test -p ratelimit-tests --all-features --test it \
///   -- --ignored --nocapture engines::engine_figures
/// ```
#[test]
#[ignore = "prints figures for BENCHMARKS.md; run by hand, per engine"]
fn engine_figures() {
    const CALLERS: usize = 1000;
    const CHECKS: usize = 3000;
    let server = RedisServer::start();
    let engine = redis_server::engine();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = server.store().await;
        let mut conn = server.connection().await;
        let path = if engine.has_functions() {
            "fcall"
        } else {
            "evalsha"
        };
        println!("| engine | algorithm | bytes per active caller | server µs per check |");
        println!("| --- | --- | ---: | ---: |");
        for algorithm in Algorithm::ALL {
            let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
            // 100 a day, as BENCHMARKS.md's table 6: no caller runs out here (4 checks each),
            // so every check is an admitted one, which writes.
            let policy =
                Policy::new(algorithm, 100, std::time::Duration::from_secs(86_400)).unwrap();
            let keys: Vec<String> = (0..CALLERS)
                .map(|i| {
                    let id = format!("caller-{i}");
                    let part = [ratelimit_runtime::key::Part::new(
                        ratelimit_runtime::key::Source::Key,
                        id.as_bytes(),
                    )];
                    ratelimit_runtime::key::build("ratelimit", "app::figures", &part, &policy)
                })
                .collect();
            for key in &keys {
                store.check(&[Check::new(key, &policy)]).await.unwrap();
            }
            let mut bytes = 0u64;
            for key in &keys {
                let n: u64 = redis::cmd("MEMORY")
                    .arg("USAGE")
                    .arg(key)
                    .arg("SAMPLES")
                    .arg(0)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                bytes += n;
            }
            let _: () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(&mut conn)
                .await
                .unwrap();
            for i in 0..CHECKS {
                let key = &keys[i % CALLERS];
                store.check(&[Check::new(key, &policy)]).await.unwrap();
            }
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut conn)
                .await
                .unwrap();
            let calls = commandstat(&info, path, "calls");
            let usec = commandstat(&info, path, "usec");
            let (major, minor, fix) = engine.version;
            #[allow(clippy::cast_precision_loss, reason = "a few thousand")]
            let per_caller = bytes as f64 / CALLERS as f64;
            println!(
                "| {} {major}.{minor}.{fix} ({}) | {} | {per_caller:.0} | {:.2} |",
                engine.name,
                path.to_ascii_uppercase(),
                algorithm.as_str(),
                usec / calls.max(1.0),
            );
        }
    });
}
