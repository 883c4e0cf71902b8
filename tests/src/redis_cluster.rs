//! A private Redis Cluster for tests: 3 masters and 3 replicas on free loopback ports.
//!
//! ```no_run
//! # async fn demo() {
//! use ratelimit_tests::redis_cluster::RedisCluster;
//!
//! let mut cluster = RedisCluster::start().await;
//! let seeds = cluster.urls(); // hand these to RedisClusterStore::connect
//! let slot = cluster.keyslot("ratelimit:{app::login}:fixed:5:60000").await;
//! let master = cluster.master_of_slot(slot).await;
//! let promoted = cluster.kill_master_and_wait_failover(master.port).await;
//! # let _ = (seeds, promoted);
//! # }
//! ```
//!
//! Each node is a [`RedisServer`] (the runtime's test helper: no persistence,
//! log in the temp dir, killed on drop) started with `--cluster-enabled yes
//! --cluster-config-file <tmp>/nodes-<port>.conf --cluster-node-timeout 1000` on a free port
//! whose cluster-bus port (port + 10000) is free too. The nodes are joined with
//! `redis-cli --cluster create … --cluster-replicas 1 --cluster-yes`; [`RedisCluster::start`]
//! returns once every node reports `cluster_state:ok` with all 16384 slots served, knows all six
//! nodes and sees three serving masters, and every replica's link to its master is up (bounded
//! waits; a timeout is an error carrying the nodes' logs, and the start is tried three times).
//!
//! Test support panics on failure (with a message saying what failed): a cluster that cannot
//! start is a broken test environment, not a case to handle.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::net::{Ipv4Addr, TcpListener};
use std::ops::RangeInclusive;
use std::process::Stdio;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use tempfile::TempDir;

use ratelimit_runtime::testing::RedisServer;

use crate::redis_server::try_engine;

/// Masters in the cluster.
pub const MASTERS: usize = 3;
/// Nodes in the cluster: every master has one replica.
pub const NODES: usize = 2 * MASTERS;
/// `--cluster-node-timeout`, in milliseconds: a master unreachable this long is failed over.
pub const NODE_TIMEOUT_MS: u64 = 1000;

/// The longest wait for the cluster to form, or for a failover to complete.
const READY_WAIT: Duration = Duration::from_secs(45);

struct Node {
    process: RedisServer,
    alive: bool,
}

impl Node {
    fn port(&self) -> u16 {
        self.process.port()
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port())
    }

    fn log_tail(&self) -> String {
        self.process.log_tail(15)
    }

    fn kill(&mut self) {
        self.alive = false;
        self.process.kill();
    }
}

/// One master as `CLUSTER NODES` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Master {
    /// The node id.
    pub id: String,
    /// The loopback port it listens on.
    pub port: u16,
    /// The slot ranges it serves.
    pub slots: Vec<RangeInclusive<u16>>,
}

impl Master {
    /// Whether this master serves `slot`.
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|r| r.contains(&slot))
    }
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
struct NodeLine {
    id: String,
    port: u16,
    flags: Vec<String>,
    master_id: String,
    slots: Vec<RangeInclusive<u16>>,
}

impl NodeLine {
    fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    fn failed(&self) -> bool {
        self.has_flag("fail") || self.has_flag("fail?") || self.has_flag("noaddr")
    }
}

/// Parses `CLUSTER NODES`, one node a line:
/// `<id> <ip:port@cport[,host]> <flags> <master> <ping> <pong> <epoch> <link> <slot>...`.
fn parse_nodes(text: &str) -> Vec<NodeLine> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 {
            continue;
        }
        let port = f[1]
            .split('@')
            .next()
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        let slots = f[8..]
            .iter()
            .filter(|s| !s.starts_with('['))
            .filter_map(|s| match s.split_once('-') {
                Some((a, b)) => Some(a.parse().ok()?..=b.parse().ok()?),
                None => s.parse().ok().map(|n| n..=n),
            })
            .collect();
        out.push(NodeLine {
            id: f[0].to_owned(),
            port,
            flags: f[2].split(',').map(str::to_owned).collect(),
            master_id: f[3].to_owned(),
            slots,
        });
    }
    out
}

/// A field of an `INFO`-style reply (`name:value` lines).
fn info_field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        l.trim()
            .strip_prefix(name)
            .and_then(|r| r.strip_prefix(':'))
            .map(str::trim)
    })
}

/// A free loopback port whose cluster-bus port (+10000) is free as well.
fn free_cluster_port(taken: &HashSet<u16>) -> u16 {
    for _ in 0..1000 {
        let Ok(listener) = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)) else {
            continue;
        };
        let Ok(addr) = listener.local_addr() else {
            continue;
        };
        let port = addr.port();
        if port > 55_000 || taken.contains(&port) {
            continue;
        }
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free port pair (port, port + 10000) on 127.0.0.1");
}

/// One connection to one node, retried while the node is starting.
async fn connect_node(port: u16, within: Duration) -> Option<MultiplexedConnection> {
    let deadline = Instant::now() + within;
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    loop {
        let attempt = tokio::time::timeout(
            Duration::from_secs(1),
            client.get_multiplexed_async_connection(),
        )
        .await;
        if let Ok(Ok(mut conn)) = attempt {
            let pong: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut conn).await;
            if pong.is_ok() {
                return Some(conn);
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Sends one command to the node on `port` (a fresh connection: nodes come and go).
async fn node_query(port: u16, cmd: &redis::Cmd) -> Option<String> {
    let mut conn = connect_node(port, Duration::ZERO).await?;
    tokio::time::timeout(Duration::from_secs(2), cmd.query_async(&mut conn))
        .await
        .ok()?
        .ok()
}

/// A running Redis Cluster of [`MASTERS`] masters, each with one replica. Dropping it kills
/// every node.
pub struct RedisCluster {
    nodes: Vec<Node>,
    // Dropped after the nodes (fields drop in order), so no node writes into a removed dir.
    dir: TempDir,
}

impl std::fmt::Debug for RedisCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisCluster")
            .field(
                "ports",
                &self.nodes.iter().map(Node::port).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
    }
}

impl RedisCluster {
    /// Starts six nodes, joins them into a cluster and waits until it serves every slot.
    ///
    /// # Panics
    /// When `redis-server`/`redis-cli` are missing or the cluster does not form in time (the
    /// message carries the nodes' logs). A port taken between picking and binding is retried.
    pub async fn start() -> Self {
        let mut last = String::new();
        for _ in 0..3 {
            match Self::try_start().await {
                Ok(cluster) => return cluster,
                Err(e) => last = e,
            }
        }
        panic!("the test Redis Cluster did not start: {last}");
    }

    async fn try_start() -> Result<Self, String> {
        let dir = tempfile::Builder::new()
            .prefix("ratelimit-cluster-")
            .tempdir()
            .map_err(|e| format!("temp dir: {e}"))?;
        try_engine()?; // printed once, and the install hint when it is missing
        let mut taken = HashSet::new();
        let mut cluster = Self {
            nodes: Vec::new(),
            dir,
        };
        let dir = cluster.dir.path().to_path_buf();
        for _ in 0..NODES {
            let port = free_cluster_port(&taken);
            taken.insert(port);
            let conf = dir.join(format!("nodes-{port}.conf"));
            let conf = conf.to_string_lossy();
            let node_timeout = NODE_TIMEOUT_MS.to_string();
            let process = RedisServer::start_on(
                port,
                &dir,
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &conf,
                    "--cluster-node-timeout",
                    &node_timeout,
                ],
            )
            .map_err(|e| e.to_string())?;
            cluster.nodes.push(Node {
                process,
                alive: true,
            });
        }
        let addrs: Vec<String> = cluster.nodes.iter().map(Node::addr).collect();
        let out = tokio::process::Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|e| format!("cannot run redis-cli (is it installed?): {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed ({}):\n{}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        cluster.wait_healthy(None).await?;
        Ok(cluster)
    }

    /// Waits until every live node reports `cluster_state:ok`, agrees on [`MASTERS`] healthy
    /// masters covering all 16384 slots (none of them `skip`), and every live replica's link to
    /// its master is up.
    async fn wait_healthy(&self, dead: Option<u16>) -> Result<(), String> {
        let deadline = Instant::now() + READY_WAIT;
        let live: Vec<u16> = self
            .nodes
            .iter()
            .filter(|n| n.alive)
            .map(Node::port)
            .collect();
        let mut why = String::new();
        while Instant::now() < deadline {
            why.clear();
            for &port in &live {
                let info = node_query(port, &redis::cmd("CLUSTER").arg("INFO").clone()).await;
                let info = info.unwrap_or_default();
                if info_field(&info, "cluster_state") != Some("ok")
                    || info_field(&info, "cluster_slots_ok") != Some("16384")
                {
                    let _ = write!(why, "node {port}: not ok; ");
                    continue;
                }
                let nodes = node_query(port, &redis::cmd("CLUSTER").arg("NODES").clone()).await;
                let nodes = parse_nodes(&nodes.unwrap_or_default());
                let known: HashSet<u16> = nodes.iter().map(|n| n.port).collect();
                let masters = nodes
                    .iter()
                    .filter(|n| n.has_flag("master") && !n.failed() && !n.slots.is_empty())
                    .count();
                if known.len() < NODES || masters != MASTERS {
                    let _ = write!(
                        why,
                        "node {port}: knows {} nodes, {masters} serving masters; ",
                        known.len()
                    );
                    continue;
                }
                if dead.is_some_and(|d| {
                    nodes
                        .iter()
                        .any(|n| n.port == d && n.has_flag("master") && !n.slots.is_empty())
                }) {
                    let _ = write!(why, "node {port}: the killed master still serves slots; ");
                    continue;
                }
                let me = nodes.iter().find(|n| n.has_flag("myself"));
                if me.is_some_and(|m| m.has_flag("slave")) {
                    let repl = node_query(port, &redis::cmd("INFO").arg("replication").clone())
                        .await
                        .unwrap_or_default();
                    let master_port = me
                        .and_then(|m| nodes.iter().find(|n| n.id == m.master_id))
                        .map(|n| n.port);
                    if info_field(&repl, "master_link_status") != Some("up") && master_port != dead
                    {
                        let _ = write!(why, "replica {port}: link to its master is down; ");
                    }
                }
            }
            if why.is_empty() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut logs = String::new();
        for node in &self.nodes {
            let _ = write!(logs, "\n--- node {} ---\n{}", node.port(), node.log_tail());
        }
        Err(format!("not healthy within {READY_WAIT:?}: {why}{logs}"))
    }

    /// `redis://` URLs of every node still running: the seed nodes for a cluster client.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.alive)
            .map(|n| n.process.url())
            .collect()
    }

    /// Ports of every node still running.
    pub fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.alive)
            .map(Node::port)
            .collect()
    }

    async fn nodes_view(&self) -> Vec<NodeLine> {
        for port in self.live_ports() {
            if let Some(text) = node_query(port, &redis::cmd("CLUSTER").arg("NODES").clone()).await
            {
                return parse_nodes(&text);
            }
        }
        panic!("no live cluster node answered CLUSTER NODES");
    }

    /// The masters that serve slots, as the first live node answering `CLUSTER NODES` sees
    /// them, ordered by their first slot.
    ///
    /// # Panics
    /// When no node answers.
    pub async fn masters(&self) -> Vec<Master> {
        let mut masters: Vec<Master> = self
            .nodes_view()
            .await
            .into_iter()
            .filter(|n| n.has_flag("master") && !n.failed() && !n.slots.is_empty())
            .map(|n| Master {
                id: n.id,
                port: n.port,
                slots: n.slots,
            })
            .collect();
        masters.sort_by_key(|m| m.slots.iter().map(|r| *r.start()).min());
        masters
    }

    /// The slot of `key`, as the cluster computes it (`CLUSTER KEYSLOT`).
    ///
    /// # Panics
    /// When no node answers.
    pub async fn keyslot(&self, key: &str) -> u16 {
        for port in self.live_ports() {
            let cmd = redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).clone();
            let Some(mut conn) = connect_node(port, Duration::ZERO).await else {
                continue;
            };
            if let Ok(Ok(slot)) =
                tokio::time::timeout(Duration::from_secs(2), cmd.query_async::<u16>(&mut conn))
                    .await
            {
                return slot;
            }
        }
        panic!("no live cluster node answered CLUSTER KEYSLOT");
    }

    /// The master serving `slot`.
    ///
    /// # Panics
    /// When no node answers or no master serves the slot.
    pub async fn master_of_slot(&self, slot: u16) -> Master {
        self.masters()
            .await
            .into_iter()
            .find(|m| m.serves(slot))
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
    }

    /// The port of the replica of the master on `port`.
    ///
    /// # Panics
    /// When the node is not a master with a replica.
    pub async fn replica_of(&self, port: u16) -> u16 {
        self.try_replica_of(port)
            .await
            .unwrap_or_else(|| panic!("master {port} has no replica"))
    }

    /// The port of a working replica of the master on `port`, as the first live node sees it
    /// now; `None` when it sees none (yet: a replica just joined may still be handshaking).
    ///
    /// # Panics
    /// When the node is not a master.
    pub async fn try_replica_of(&self, port: u16) -> Option<u16> {
        let view = self.nodes_view().await;
        let master = view
            .iter()
            .find(|n| n.port == port && n.has_flag("master"))
            .unwrap_or_else(|| panic!("node {port} is not a master"));
        view.iter()
            .find(|n| n.master_id == master.id && n.has_flag("slave") && !n.failed())
            .map(|n| n.port)
    }

    /// Kills the master on `port` (`SIGKILL`, no goodbye to the cluster) and waits until its
    /// replica has taken over its slots and the cluster is `ok` again. Returns the new master's
    /// port.
    ///
    /// # Panics
    /// When `port` is not a master with a replica, or the failover does not complete in time
    /// (the message carries the nodes' logs).
    pub async fn kill_master_and_wait_failover(&mut self, port: u16) -> u16 {
        let replica = self.replica_of(port).await;
        self.kill(port);
        if let Err(e) = self.wait_healthy(Some(port)).await {
            panic!("no failover after killing master {port}: {e}");
        }
        let promoted = self.masters().await.into_iter().find(|m| m.port == replica);
        assert!(
            promoted.is_some(),
            "replica {replica} of killed master {port} was not promoted"
        );
        replica
    }

    /// Kills the node on `port` without waiting for anything.
    ///
    /// # Panics
    /// When no node of this cluster listens there.
    pub fn kill(&mut self, port: u16) {
        self.nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
            .kill();
    }

    /// A plain connection to the node on `port` (for `CLUSTER …` and inspection commands).
    ///
    /// # Panics
    /// When the node does not answer within 5 s.
    pub async fn node(&self, port: u16) -> MultiplexedConnection {
        connect_node(port, Duration::from_secs(5))
            .await
            .unwrap_or_else(|| panic!("node {port} does not answer"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cluster_nodes() {
        let text = "\
07c3 127.0.0.1:30004@40004 slave e7d1 0 1426238317239 4 connected
67ed 127.0.0.1:30002@40002 master - 0 1426238316232 2 connected 5461-10922
e7d1 127.0.0.1:30001@40001,host myself,master - 0 0 1 connected 0-5460 7000 [5461->-67ed]
9fd2 127.0.0.1:30005@40005 master,fail - 0 1426238316232 5 disconnected
";
        let nodes = parse_nodes(text);
        assert_eq!(nodes.len(), 4);
        assert_eq!(nodes[0].port, 30004);
        assert!(nodes[0].has_flag("slave"));
        assert_eq!(nodes[0].master_id, "e7d1");
        assert_eq!(nodes[1].slots, vec![5461..=10922]);
        assert_eq!(nodes[2].slots, vec![0..=5460, 7000..=7000]);
        assert!(nodes[2].has_flag("myself"));
        assert!(nodes[3].failed());
        assert_eq!(
            info_field(
                "cluster_state:ok\r\ncluster_slots_ok:16384\r\n",
                "cluster_state"
            ),
            Some("ok")
        );
    }
}
