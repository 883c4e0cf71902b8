//! The Rust side of the cluster's takes with receipts and refunds: the pure rules of
//! `ratelimit_runtime::algorithm` on a little state map, hosted the way the memory store hosts
//! them (idle state reads as none, state stamped in the future is normalized first), plus the
//! receipts the driver leaves, with Redis's millisecond expiry.

use std::collections::HashMap;

use ratelimit_runtime::algorithm::{self, Evaluation, Params, Receipt, State};
use ratelimit_runtime::store::redis::ReplyReceipt;
use ratelimit_runtime::{Algorithm, Decision, Verdict, store::Check};

/// The driver's longest receipt life, µs (`RECEIPT_TTL_US` in driver.lua).
const RECEIPT_TTL_US: u64 = 10_000_000;

#[derive(Debug, Clone)]
struct Entry {
    state: State,
    idle_at: u64,
}

impl Entry {
    fn new(state: State, p: &Params) -> Self {
        Self {
            idle_at: algorithm::idle_at(&state, p),
            state,
        }
    }

    fn live(&self, now: u64) -> bool {
        now < self.idle_at
    }
}

/// Keys and receipts, on a clock the caller sets (µs).
#[derive(Debug, Default)]
pub(crate) struct Model {
    keys: HashMap<String, Entry>,
    /// Receipt name → (receipt, the last ms it exists).
    receipts: HashMap<String, (Receipt, u64)>,
    /// Settled receipts' markers → the last ms they exist.
    settled: HashMap<String, u64>,
    pub(crate) now: u64,
}

/// `ttl_ms` of the prelude: µs rounded up to ms, at least 1.
fn ttl_ms(us: u64) -> u64 {
    us.div_ceil(1000).max(1)
}

impl Model {
    /// Drops what has expired by now: the stand-in's sweep of its keys (Redis's active expiry),
    /// so that a clock set back later does not bring back a key, a receipt or a settled marker
    /// the server no longer holds.
    pub(crate) fn sweep(&mut self) {
        let (now, now_ms) = (self.now, self.now / 1000);
        self.keys.retain(|_, e| e.live(now));
        self.receipts.retain(|_, (_, last_ms)| now_ms <= *last_ms);
        self.settled.retain(|_, last_ms| now_ms <= *last_ms);
    }

    /// Whether the settled marker `name` is there now. Read as Redis reads a key: an expired
    /// one is dropped (lazy expiry), so that a clock set back later does not bring it back.
    fn settled_marker(&mut self, name: &str) -> bool {
        let now_ms = self.now / 1000;
        match self.settled.get(name) {
            Some(&end) if now_ms > end => {
                self.settled.remove(name);
                false
            }
            Some(_) => true,
            None => false,
        }
    }

    fn live(&self, key: &str) -> Option<&State> {
        self.keys
            .get(key)
            .filter(|e| e.live(self.now))
            .map(|e| &e.state)
    }

    fn normalize(&mut self, key: &str, p: &Params) {
        let now = self.now;
        if let Some(e) = self.keys.get_mut(key)
            && e.live(now)
            && algorithm::normalize(&mut e.state, p, now)
        {
            e.idle_at = algorithm::idle_at(&e.state, p);
        }
    }

    /// One call's limits, in order, each on what the ones before it left (the driver and the
    /// memory store); written only when all admit, with a receipt per limit under `call_id`.
    pub(crate) fn take(&mut self, checks: &[Check<'_>], call_id: Option<&str>) -> Verdict {
        let now = self.now;
        let params: Vec<Params> = checks.iter().map(|c| Params::of(c.policy)).collect();
        for (c, p) in checks.iter().zip(&params) {
            self.normalize(c.key, p);
        }
        let mut pending: HashMap<&str, State> = HashMap::new();
        let mut evaluations: Vec<(Evaluation, u64)> = Vec::new();
        for (c, p) in checks.iter().zip(&params) {
            let base = pending.get(c.key).or_else(|| self.live(c.key));
            let (e, next) = algorithm::evaluate(c.policy.algorithm(), base, p, now);
            let mut first = 0;
            if let Some(next) = next {
                if let State::Sliding(log) = &next
                    && let Some((start, len)) = log.runs().next_back()
                {
                    first = u64::try_from(start).unwrap_or(0) + len - p.cost;
                }
                pending.insert(c.key, next);
            }
            evaluations.push((e, first));
        }
        if evaluations.iter().all(|(e, _)| e.admitted) {
            for (c, p) in checks.iter().zip(&params) {
                if let Some(state) = pending.remove(c.key) {
                    self.keys.insert(c.key.to_owned(), Entry::new(state, p));
                }
            }
            if let Some(id) = call_id {
                for (i, (c, (e, first))) in checks.iter().zip(&evaluations).enumerate() {
                    let receipt = Receipt {
                        at_us: now,
                        reset_us: e.after_reset_us,
                        first: *first,
                        cost: c.policy.cost(),
                    };
                    let expires = now / 1000 + ttl_ms(e.after_reset_us.min(RECEIPT_TTL_US));
                    self.receipts
                        .insert(format!("{}:r:{id}:{}", c.key, i + 1), (receipt, expires));
                }
            }
            let verdict = Verdict::new(
                checks
                    .iter()
                    .zip(&evaluations)
                    .map(|(c, (e, _))| e.taken(c.policy.capacity()))
                    .collect(),
            );
            return super::as_sent(checks, verdict, now);
        }
        let decisions = checks
            .iter()
            .zip(&params)
            .zip(&evaluations)
            .map(|((c, p), (mine, _))| {
                let (e, _) = algorithm::evaluate(c.policy.algorithm(), self.live(c.key), p, now);
                e.untaken(c.policy.capacity(), mine.admitted, mine.retry_us)
            })
            .collect();
        super::as_sent(checks, Verdict::new(decisions), now)
    }

    /// A take whose receipts come back in its reply (`RedisStore::take_briefly`): [`Model::take`]
    /// under `id`, each fixed window's receipt as the reply carries it
    /// (`algorithm::fixed::receipt_in_reply`), so that a return by the reply's receipts is a
    /// refund by these.
    pub(crate) fn take_in_reply(&mut self, checks: &[Check<'_>], id: &str) -> Verdict {
        let verdict = self.take(checks, Some(id));
        for (i, c) in checks.iter().enumerate() {
            if c.policy.algorithm() == Algorithm::Fixed
                && let Some((r, _)) = self
                    .receipts
                    .get_mut(&format!("{}:r:{id}:{}", c.key, i + 1))
            {
                *r = algorithm::fixed::receipt_in_reply(r);
            }
        }
        verdict
    }

    /// The receipts the reply of [`Model::take_in_reply`] under `id` carries: one per limit
    /// while they last (none once a refund, a return or their life took them), on a server
    /// whose clock reads `epoch_us` more than the model's.
    pub(crate) fn replied(
        &self,
        checks: &[Check<'_>],
        id: &str,
        epoch_us: u64,
    ) -> Vec<ReplyReceipt> {
        checks
            .iter()
            .enumerate()
            .filter_map(|(i, c)| self.receipts.get(&format!("{}:r:{id}:{}", c.key, i + 1)))
            .map(|(r, _)| ReplyReceipt {
                at_us: r.at_us + epoch_us,
                reset_us: r.reset_us,
                first_us: if r.first == 0 { 0 } else { r.first + epoch_us },
            })
            .collect()
    }

    /// The companion script's settle (`settle` in refund.lua): each limit settled to
    /// `actual[i]` by `algorithm::settle` with its receipt (none once expired), the receipt
    /// then marked settled (a second settle of the call does nothing); then the state of each
    /// limit as it is.
    pub(crate) fn settle(&mut self, checks: &[Check<'_>], id: &str, actual: &[u64]) -> Verdict {
        let now = self.now;
        for (i, (c, &actual)) in checks.iter().zip(actual).enumerate() {
            let name = format!("{}:r:{id}:{}", c.key, i + 1);
            if self.settled_marker(&name) {
                continue;
            }
            let receipt = self
                .receipts
                .remove(&name)
                .filter(|(_, expires)| now / 1000 <= *expires)
                .map(|(r, _)| r);
            let p = Params::of(c.policy);
            let state = self.live(c.key).cloned();
            let had = state.is_some();
            match algorithm::settle(
                c.policy.algorithm(),
                state,
                receipt.as_ref(),
                &p,
                actual,
                now,
            ) {
                Some(state) => {
                    self.keys.insert(c.key.to_owned(), Entry::new(state, &p));
                }
                None if had => {
                    self.keys.remove(c.key);
                }
                None => {}
            }
            self.settled
                .insert(name, now / 1000 + ttl_ms(RECEIPT_TTL_US));
        }
        self.compensate(checks, None)
    }

    /// The companion script: every refund under `call_id` first (each receipt read once and
    /// deleted), then the state of each limit as it is.
    pub(crate) fn compensate(&mut self, checks: &[Check<'_>], refund: Option<&str>) -> Verdict {
        let now = self.now;
        if let Some(id) = refund {
            for (i, c) in checks.iter().enumerate() {
                let name = format!("{}:r:{id}:{}", c.key, i + 1);
                // Read as the script reads it (`GET`), which drops an expired marker.
                self.settled_marker(&name);
                let Some((receipt, expires)) = self.receipts.remove(&name) else {
                    continue;
                };
                if now / 1000 > expires {
                    continue;
                }
                let p = Params::of(c.policy);
                let state = self.live(c.key).cloned();
                match algorithm::refund(state, &receipt, &p, now) {
                    Some(state) => {
                        self.keys.insert(c.key.to_owned(), Entry::new(state, &p));
                    }
                    None => {
                        self.keys.remove(c.key);
                    }
                }
            }
        }
        let decisions: Vec<Decision> = checks
            .iter()
            .map(|c| {
                let p = Params::of(c.policy);
                self.normalize(c.key, &p);
                let (e, _) = algorithm::evaluate(c.policy.algorithm(), self.live(c.key), &p, now);
                e.untaken(c.policy.capacity(), e.admitted, e.retry_us)
            })
            .collect();
        Verdict::new(decisions)
    }
}
