//! A call whose limits fall in several cluster slots: its groups by slot, and the takes,
//! refunds and peeks that stand in for one script.

use std::collections::HashMap;
use std::time::Duration;

use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;

use super::acknowledge::eval_checks_replicated;
use crate::decision::{Decision, Verdict};
use crate::error::StoreError;
use crate::store::redis::invoke::{Calls, Mode, compensate, eval_checks};
use crate::store::redis::wire::forget_cmd;
use crate::store::{Check, new_call_id};

/// Checks limits whose keys fall in several slots: each slot's group in turn under one
/// call id (a take's, else a fresh one), refunding the earlier groups and peeking at the later
/// ones when a group rejects. A group with a concurrency limit is sent the id even when last,
/// so that its lease is named by it.
///
/// With `replica_wait`, each group's take is followed by `WAIT` on its connection
/// ([`eval_checks_replicated`]): the verdict comes with whether a replica acknowledged every
/// admitted group's writes (always `true` without a wait).
pub(super) async fn check_across_slots(
    conn: &mut ClusterConnection,
    calls: &Calls,
    checks: &[Check<'_>],
    groups: &[Vec<usize>],
    call_id: Option<&str>,
    replica_wait: Option<Duration>,
) -> Result<(Verdict, bool), StoreError> {
    let mut replicated = true;
    let mut decisions: Vec<Option<Decision>> = vec![None; checks.len()];
    let id = call_id.map_or_else(new_call_id, str::to_owned);
    let holds = |sub: &[Check<'_>]| {
        sub.iter()
            .any(|c| c.policy.algorithm() == crate::algorithm::Algorithm::Concurrency)
    };
    // The admitted groups: each left receipts under `id`.
    let mut taken: Vec<(usize, Verdict)> = Vec::new();
    for (g, group) in groups.iter().enumerate() {
        let sub: Vec<Check<'_>> = group.iter().map(|&i| checks[i]).collect();
        // The last group is never refunded (when it admits, so did the call): no receipts.
        let receipts = (g + 1 < groups.len() || holds(&sub)).then_some(id.as_str());
        let (verdict, acknowledged) = match replica_wait {
            Some(wait) => eval_checks_replicated(conn, calls, &sub, receipts, wait).await?,
            None => (eval_checks(conn, calls, &sub, receipts, None).await?, true),
        };
        if verdict.is_admitted() {
            replicated &= acknowledged;
            taken.push((g, verdict));
            continue;
        }
        fill(&mut decisions, group, verdict.decisions());
        for (earlier, admitted) in &taken {
            let group = &groups[*earlier];
            let sub: Vec<Check<'_>> = group.iter().map(|&i| checks[i]).collect();
            match compensate(conn, calls, Mode::Refund(&id), &sub).await {
                Ok(now) => fill(&mut decisions, group, now.decisions()),
                Err(error) => {
                    tracing::warn!(target: crate::observe::log::STORE, %error, "redis cluster: a refund failed; the limits of another slot keep what this rejected call took");
                    fill(&mut decisions, group, admitted.decisions());
                }
            }
        }
        for group in &groups[g + 1..] {
            let sub: Vec<Check<'_>> = group.iter().map(|&i| checks[i]).collect();
            match compensate(conn, calls, Mode::Peek, &sub).await {
                Ok(now) => fill(&mut decisions, group, now.decisions()),
                Err(error) => {
                    // The call is rejected either way; these limits' numbers are unknown
                    // and reported as untouched.
                    tracing::warn!(target: crate::observe::log::STORE, %error, "redis cluster: could not read the limits of another slot of a rejected call");
                    for &i in group {
                        let cap = checks[i].policy.capacity();
                        decisions[i] = Some(Decision::new(
                            true,
                            cap,
                            cap,
                            Duration::ZERO,
                            Duration::ZERO,
                        ));
                    }
                }
            }
        }
        return Ok((collect(decisions)?, replicated));
    }
    // Admitted: the earlier groups' receipts are no longer needed (nothing will be
    // refunded); dropped now rather than left to their TTL.
    for (g, verdict) in &taken {
        fill(&mut decisions, &groups[*g], verdict.decisions());
        let sub: Vec<Check<'_>> = groups[*g].iter().map(|&i| checks[i]).collect();
        if *g + 1 == groups.len() && !holds(&sub) {
            continue; // taken without receipts
        }
        if let Err(error) = forget_cmd(&sub, &id).query_async::<()>(conn).await {
            tracing::debug!(target: crate::observe::log::STORE, %error, "redis cluster: could not drop the receipts of an admitted call; they expire by themselves");
        }
    }
    Ok((collect(decisions)?, replicated))
}

/// The test hooks' guard: every key in one slot (one script can only touch one).
pub(super) fn one_slot(checks: &[Check<'_>]) -> Result<(), StoreError> {
    if group_by_slot(checks).len() > 1 {
        return Err(StoreError::BadReply(
            "the keys of one take or refund must share a cluster slot".to_owned(),
        ));
    }
    Ok(())
}

pub(super) fn fill(decisions: &mut [Option<Decision>], group: &[usize], found: &[Decision]) {
    for (&i, d) in group.iter().zip(found) {
        decisions[i] = Some(*d);
    }
}

pub(super) fn collect(decisions: Vec<Option<Decision>>) -> Result<Verdict, StoreError> {
    decisions
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .map(Verdict::new)
        .ok_or_else(|| StoreError::BadReply("a limit of the call got no decision".to_owned()))
}

/// The indices of `checks` grouped by the cluster slot of their key, groups in the order of
/// their first limit.
pub(super) fn group_by_slot(checks: &[Check<'_>]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut index: HashMap<Slot, usize> = HashMap::new();
    for (i, check) in checks.iter().enumerate() {
        let g = *index
            .entry(Slot::for_key(check.key.as_bytes()))
            .or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
        groups[g].push(i);
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::policy::Policy;

    #[test]
    fn limits_of_one_scope_share_a_group_and_other_scopes_split() {
        let p = Policy::new(Algorithm::Fixed, 5, Duration::from_secs(1)).unwrap();
        let q = Policy::new(Algorithm::Token, 9, Duration::from_secs(1)).unwrap();
        let a1 = crate::key::build(
            "rl",
            "login",
            &[crate::key::Part::new(crate::key::Source::Key, b"10.0.0.1")],
            &p,
        );
        let a2 = crate::key::build(
            "rl",
            "login",
            &[crate::key::Part::new(crate::key::Source::Key, b"10.0.0.1")],
            &q,
        );
        let global = crate::key::build("rl", "login", &[], &p);
        let checks = [
            Check::new(&a1, &p),
            Check::new(&global, &p),
            Check::new(&a2, &q),
        ];
        assert_ne!(
            Slot::for_key(a1.as_bytes()),
            Slot::for_key(global.as_bytes())
        );
        assert_eq!(group_by_slot(&checks), vec![vec![0, 2], vec![1]]);
        assert_eq!(group_by_slot(&checks[..1]), vec![vec![0]]);
    }
}
