//! The connection a command ran on ([`Seat`]), which replica acknowledgement compares: Redis's
//! `WAIT` counts the writes of the connection it runs on.

use std::sync::atomic::{AtomicBool, Ordering};

use redis::Value;

/// The connection a command ran on: its server's cluster node id (`CLUSTER MYID`) and the
/// connection's client id there (`CLIENT ID`, never reused while the server runs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seat {
    node: String,
    client: i64,
}

impl Seat {
    /// The cluster node id of the server.
    #[cfg(feature = "cluster")]
    pub(crate) fn node(&self) -> &str {
        &self.node
    }

    /// The two commands that name the seat, to follow another in one request.
    pub(crate) fn commands(pipe: &mut redis::Pipeline) {
        pipe.cmd("CLUSTER").arg("MYID").cmd("CLIENT").arg("ID");
    }

    /// The seat from the replies of [`Seat::commands`]; `None` for an error or anything else.
    pub(crate) fn read(node: Option<&Value>, client: Option<&Value>) -> Option<Self> {
        Some(Self {
            node: redis::from_redis_value_ref(node?).ok()?,
            client: redis::from_redis_value_ref(client?).ok()?,
        })
    }
}

/// Says once per process that a server refused a command replica acknowledgement needs
/// (`WAIT`, `CLUSTER MYID`, `CLIENT ID`, `ROLE`: an ACL that does not allow them): it acknowledges
/// nothing, so every call asking for it is answered by the failure policy.
pub(crate) fn refused_acknowledgement(error: &redis::RedisError) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if error.code() == Some("NOPERM") && !SAID.swap(true, Ordering::Relaxed) {
        tracing::warn!(target: crate::observe::log::STORE, %error, "redis cluster: a command replica acknowledgement needs was refused (allow WAIT, CLUSTER MYID, CLIENT ID and ROLE); no write is acknowledged");
    }
}

/// The masters found without a replica, by node id, each for [`ORPHAN_BACKOFF`] since: a take
/// there waits for no acknowledgement (it has none). `WAIT 1` on such a master lasts its whole
/// timeout and holds the commands sent after it on the same connection, the process's one
/// connection to that master, shared by every limit: unbounded, since every admission it
/// does not acknowledge is given back, it would stall every check on that master.
#[cfg(feature = "cluster")]
#[derive(Debug, Default)]
pub(crate) struct Orphans(std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>);

/// How long a master found without a replica is taken as having none.
#[cfg(feature = "cluster")]
pub(crate) const ORPHAN_BACKOFF: std::time::Duration = std::time::Duration::from_secs(1);

/// The most masters [`Orphans`] remembers (a cluster has far fewer).
#[cfg(feature = "cluster")]
const ORPHANS_MAX: usize = 1024;

#[cfg(feature = "cluster")]
impl Orphans {
    /// Whether the master `node` was found without a replica less than [`ORPHAN_BACKOFF`] ago.
    pub(crate) fn holds(&self, node: &str) -> bool {
        let orphans = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        orphans
            .get(node)
            .is_some_and(|since| since.elapsed() < ORPHAN_BACKOFF)
    }

    /// Notes that the master `node` has no replica, now.
    pub(crate) fn add(&self, node: &str) {
        let mut orphans = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if orphans.len() >= ORPHANS_MAX {
            orphans.retain(|_, since| since.elapsed() < ORPHAN_BACKOFF);
        }
        if orphans.len() < ORPHANS_MAX {
            orphans.insert(node.to_owned(), std::time::Instant::now());
        }
    }
}
