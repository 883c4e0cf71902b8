//! A take on a Redis Cluster whose writes a replica acknowledges: `WAIT` on the connection the
//! take ran on.

use std::time::Duration;

use redis::Value;
use redis::cluster_async::ClusterConnection;

use crate::decision::Verdict;
use crate::error::StoreError;
use crate::store::Check;
use crate::store::redis::invoke::{Calls, Receipts, ScriptConnection, run_checks};
use crate::store::redis::seat::{Seat, refused_acknowledgement};
use crate::store::redis::wire::parse_reply;

/// [`eval_checks`] (receipts kept their longest) on a cluster, then, for an admitted call,
/// `WAIT 1 <replica_wait ms>` on the connection the take ran on: the verdict, and whether a
/// replica acknowledged the call's writes (`true` for a rejected call, which waits for
/// nothing).
///
/// `WAIT` counts the writes of the connection it is sent on, so it must reach the one that
/// wrote: a cluster client whose connection to the master dropped meanwhile sends a command
/// routed by slot to another node, or on a new connection that wrote nothing, either of which
/// a replica acknowledges at once. So the take and the `WAIT` each name the connection they
/// ran on ([`Seat`]), and a `WAIT` that ran elsewhere acknowledges nothing. (A take the client
/// sent again on a new connection after its first ran is answered as that first ran, and
/// writes its receipt's TTL again, so that the new connection's `WAIT` waits for the first
/// take's writes too: `scripts/driver.lua`.)
pub(crate) async fn eval_checks_replicated(
    conn: &mut ClusterConnection,
    calls: &Calls,
    checks: &[Check<'_>],
    call_id: Option<&str>,
    replica_wait: Duration,
) -> Result<(Verdict, bool), StoreError> {
    let Some(first) = checks.first() else {
        return Ok((Verdict::new(Vec::new()), true));
    };
    let receipts = call_id.map_or(Receipts::None, |id| Receipts::Keys(id, None));
    let (reply, seat) = run_checks(conn, calls, checks, receipts, true).await?;
    let verdict = parse_reply(&reply, checks)?;
    if !verdict.is_admitted() {
        return Ok((verdict, true));
    }
    let Some(seat) = seat else {
        return Ok((verdict, false));
    };
    if calls.orphans.holds(seat.node()) {
        return Ok((verdict, false));
    }
    let ms = u64::try_from(replica_wait.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    let mut pipe = redis::pipe();
    pipe.ignore_errors().cmd("WAIT").arg(1).arg(ms);
    Seat::commands(&mut pipe);
    pipe.cmd("ROLE");
    let waited = match conn.pipeline_for(&pipe, first.key).await {
        Ok(replies) => judge(&replies, &seat),
        Err(_) => Waited::Unacknowledged,
    };
    if waited == Waited::Orphaned {
        calls.orphans.add(seat.node());
    }
    Ok((verdict, waited == Waited::Acknowledged))
}

/// What a `WAIT` after a take came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waited {
    /// A replica acknowledged, on the take's connection.
    Acknowledged,
    /// None did (in time, or on that connection), or the server did not say.
    Unacknowledged,
    /// None did, on the take's connection, of a master that has no replica (`ROLE`).
    Orphaned,
}

/// The replies of `WAIT`, [`Seat::commands`] and `ROLE`, for a take that ran on `seat`.
fn judge(replies: &[redis::RedisResult<Value>], seat: &Seat) -> Waited {
    replies
        .iter()
        .filter_map(|reply| reply.as_ref().err())
        .for_each(refused_acknowledgement);
    let [Ok(Value::Int(n)), Ok(node), Ok(client), role] = replies else {
        return Waited::Unacknowledged;
    };
    if Seat::read(Some(node), Some(client)).as_ref() != Some(seat) {
        return Waited::Unacknowledged;
    }
    if *n >= 1 {
        return Waited::Acknowledged;
    }
    // `ROLE` of a master: "master", its offset, and its connected replicas.
    match role {
        Ok(Value::Array(role)) if matches!(role.get(2), Some(Value::Array(r)) if r.is_empty()) => {
            let master: Option<String> = role
                .first()
                .and_then(|v| redis::from_redis_value_ref(v).ok());
            if master.as_deref() == Some("master") {
                Waited::Orphaned
            } else {
                Waited::Unacknowledged
            }
        }
        _ => Waited::Unacknowledged,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seat(node: &str, client: i64) -> Seat {
        Seat::read(
            Some(&Value::BulkString(node.as_bytes().to_vec())),
            Some(&Value::Int(client)),
        )
        .unwrap()
    }

    fn replies(
        acks: i64,
        node: &str,
        client: i64,
        replicas: usize,
    ) -> Vec<redis::RedisResult<Value>> {
        let replica = Value::Array(vec![
            Value::BulkString(b"127.0.0.1".to_vec()),
            Value::BulkString(b"7001".to_vec()),
            Value::BulkString(b"42".to_vec()),
        ]);
        vec![
            Ok(Value::Int(acks)),
            Ok(Value::BulkString(node.as_bytes().to_vec())),
            Ok(Value::Int(client)),
            Ok(Value::Array(vec![
                Value::BulkString(b"master".to_vec()),
                Value::Int(42),
                Value::Array(vec![replica; replicas]),
            ])),
        ]
    }

    /// Acknowledged only by a `WAIT` that counted a replica on the take's own connection
    /// (its node and its client id); a master whose `ROLE` lists no replica is an orphan.
    #[test]
    fn a_wait_counts_only_on_the_takes_connection() {
        let took = seat("a1b2", 7);
        assert_eq!(
            judge(&replies(1, "a1b2", 7, 1), &took),
            Waited::Acknowledged
        );
        assert_eq!(
            judge(&replies(2, "a1b2", 7, 2), &took),
            Waited::Acknowledged
        );
        assert_eq!(
            judge(&replies(0, "a1b2", 7, 1), &took),
            Waited::Unacknowledged
        );
        assert_eq!(judge(&replies(0, "a1b2", 7, 0), &took), Waited::Orphaned);
        // Another node, or another connection of the same node: nothing, however many acks.
        assert_eq!(
            judge(&replies(1, "c3d4", 7, 1), &took),
            Waited::Unacknowledged
        );
        assert_eq!(
            judge(&replies(1, "a1b2", 8, 1), &took),
            Waited::Unacknowledged
        );
        assert_eq!(
            judge(&replies(0, "c3d4", 7, 0), &took),
            Waited::Unacknowledged
        );
        // A refused or missing reply: nothing.
        let mut refused = replies(1, "a1b2", 7, 1);
        refused[0] = Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "WAIT refused",
        )));
        assert_eq!(judge(&refused, &took), Waited::Unacknowledged);
        let mut short = replies(1, "a1b2", 7, 1);
        short.truncate(3);
        assert_eq!(judge(&short, &took), Waited::Unacknowledged);
        // A replica's ROLE (the WAIT ran where it cannot count) is no orphan.
        let mut replica = replies(0, "a1b2", 7, 0);
        replica[3] = Ok(Value::Array(vec![
            Value::BulkString(b"slave".to_vec()),
            Value::Int(0),
            Value::Array(vec![]),
        ]));
        assert_eq!(judge(&replica, &took), Waited::Unacknowledged);
    }
}
