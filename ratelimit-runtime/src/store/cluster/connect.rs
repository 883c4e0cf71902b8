//! How the cluster store reaches the cluster: its seed nodes (URLs, the environment), the
//! client's retries and timeouts, and what it loads and reads at connect.

use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{IntoConnectionInfo, Value};

use crate::error::ConfigError;
use crate::store::redis::invoke::Calls;
use crate::store::redis::load::load_scripts;
use crate::store::redis::server::{
    MemoryPolicy, info_memory_cmd, log_engine, parse_maxmemory_policy,
};

/// The environment variable that lists the seed nodes of a cluster, comma-separated:
/// `RATELIMIT_REDIS_CLUSTER_NODES=redis://10.0.0.1:6379,redis://10.0.0.2:6379`.
pub const NODES_ENV: &str = "RATELIMIT_REDIS_CLUSTER_NODES";

/// Splits a comma-separated list of seed nodes (the format of [`NODES_ENV`]), dropping blanks.
///
/// ```
/// use ratelimit_runtime::store::cluster::split_nodes;
/// assert_eq!(
///     split_nodes(" redis://a:7000, redis://b:7001 ,,"),
///     ["redis://a:7000", "redis://b:7001"]
/// );
/// ```
pub fn split_nodes(list: &str) -> Vec<&str> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

/// Checks one seed URL; errors never repeat the URL (it may hold a password).
fn node_info(url: &str) -> Result<redis::ConnectionInfo, ConfigError> {
    let url = url.trim();
    let Some((scheme, _)) = url.split_once("://") else {
        return Err(ConfigError::InvalidUrl(
            "expected cluster seed nodes as redis://[user][:password@]host:port (rediss://… for TLS)"
                .to_owned(),
        ));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "redis" | "valkey" => {}
        "rediss" | "valkeys" if cfg!(feature = "tls") => {}
        "rediss" | "valkeys" => {
            return Err(ConfigError::InvalidUrl(
                "rediss:// (TLS) needs the `tls` feature: ratelimit-runtime = { version = \"…\", features = [\"cluster\", \"tls\"] }"
                    .to_owned(),
            ));
        }
        other => {
            let shown: String = other.chars().take(16).collect();
            return Err(ConfigError::InvalidUrl(format!(
                "unsupported scheme `{shown}` for a cluster seed node: expected redis:// or rediss://"
            )));
        }
    }
    url.into_connection_info().map_err(|e| {
        let mut message = e.to_string();
        if let Some(detail) = e.detail().filter(|d| !d.is_empty() && url.contains(d)) {
            message = message.replace(detail, "…");
        }
        ConfigError::InvalidUrl(message)
    })
}

/// The cluster client: the seed nodes, short retries and timeouts (see the module docs).
pub(super) fn cluster_client<I, S>(nodes: I) -> Result<ClusterClient, ConfigError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let infos = nodes
        .into_iter()
        .map(|n| node_info(n.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    if infos.is_empty() {
        return Err(ConfigError::InvalidUrl(
            "no cluster seed node given: name at least one redis://host:port".to_owned(),
        ));
    }
    ClusterClientBuilder::new(infos)
        // A redirection or a refreshed slot map costs one retry; a failover takes the cluster
        // about its node timeout plus an election. Waits of 10 ms doubling up to 500 ms, 6
        // times, span about a second: enough for redirections and short outages, while the
        // limiter's own timeout bounds every check anyway.
        .retries(6)
        .min_retry_wait(10)
        .max_retry_wait(500)
        .retry_wait_formula(10, 2)
        .connection_timeout(Duration::from_secs(1))
        .response_timeout(Duration::from_secs(1))
        .overall_response_timeout(Some(Duration::from_secs(3)))
        .build()
        .map_err(|e| ConfigError::InvalidUrl(e.to_string()))
}

pub(super) async fn connect_cluster(
    client: &ClusterClient,
    calls: &Calls,
    memory: &MemoryPolicy,
) -> Result<ClusterConnection, redis::RedisError> {
    let mut conn = client.get_async_connection().await?;
    load_scripts(&mut conn, calls).await?;
    // For the log: which server one node is (a cluster runs one engine).
    let info = conn
        .route_command(
            redis::cmd("INFO").arg("server").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await
        .ok()
        .and_then(|v| redis::from_redis_value::<String>(v).ok());
    log_engine("redis-cluster", info.as_deref(), calls.functions());
    read_memory_policy(&mut conn, memory).await;
    Ok(conn)
}

/// Reads every master's `maxmemory-policy` (`INFO memory` on each) into `memory`: the first
/// evicting one if any master evicts, else theirs. A master that does not answer `INFO` is
/// skipped; none answering leaves the policy unknown. Read at connect only: the cluster
/// client reconnects node by node, with no hook to read it again.
async fn read_memory_policy(conn: &mut ClusterConnection, memory: &MemoryPolicy) {
    use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
    let reply = conn
        .route_command(
            info_memory_cmd(),
            RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
        )
        .await;
    let Ok(Value::Map(nodes)) = reply else {
        tracing::debug!(target: crate::observe::log::STORE,
            ?reply,
            "redis-cluster: INFO memory refused; maxmemory-policy unknown"
        );
        return;
    };
    let policies: Vec<String> = nodes
        .iter()
        .filter_map(|(_, info)| redis::from_redis_value_ref::<String>(info).ok())
        .filter_map(|info| parse_maxmemory_policy(&info).map(str::to_owned))
        .collect();
    let chosen = policies
        .iter()
        .find(|p| MemoryPolicy::evicts(p))
        .or(policies.first());
    if let Some(policy) = chosen {
        memory.record("redis-cluster", policy.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_list_is_split_on_commas() {
        assert_eq!(split_nodes(""), Vec::<&str>::new());
        assert_eq!(split_nodes(" , "), Vec::<&str>::new());
        assert_eq!(split_nodes("redis://a:1"), ["redis://a:1"]);
    }
}
