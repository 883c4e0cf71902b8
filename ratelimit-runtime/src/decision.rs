//! What a check answers: one limit's [`Decision`], and the [`Verdict`] of a call checked against
//! one or more limits at once.

use std::fmt;
use std::time::Duration;

/// What one limit answered for one call.
///
/// `remaining` is what is left *after* this call: when the call as a whole was rejected (by
/// this limit or by another limit checked with it), nothing was taken and `remaining` is what
/// is left now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// Whether this limit, on its own, admits the call.
    pub admitted: bool,
    /// The policy's capacity ([`Policy::capacity`](crate::policy::Policy::capacity)).
    pub limit: u64,
    /// Units left after this call.
    pub remaining: u64,
    /// Time until the quota is whole again.
    pub reset_after: Duration,
    /// When not admitted: the earliest time the same call would be admitted by this limit.
    pub retry_after: Option<Duration>,
}

impl Decision {
    /// Builds a decision; `retry_after` is kept only for a rejection.
    pub fn new(
        admitted: bool,
        limit: u64,
        remaining: u64,
        reset_after: Duration,
        retry_after: Duration,
    ) -> Self {
        Self {
            admitted,
            limit,
            remaining,
            reset_after,
            retry_after: (!admitted).then_some(retry_after),
        }
    }
}

/// The answer for one call checked against one or more limits at once.
///
/// The call is admitted only when every limit admits it; when any limit rejects it, no limit
/// took anything.
#[derive(Clone)]
pub struct Verdict {
    decisions: Decisions,
}

/// A verdict's decisions: one limit's inline (the common call, answered without a heap
/// allocation), several in a `Vec`.
#[derive(Clone)]
enum Decisions {
    One(Decision),
    Many(Vec<Decision>),
}

impl Verdict {
    /// Wraps the decisions, one per limit, in the order the limits were given.
    pub fn new(decisions: Vec<Decision>) -> Self {
        Self {
            decisions: Decisions::Many(decisions),
        }
    }

    /// The verdict of a call checked against one limit: the same as
    /// `Verdict::new(vec![decision])`, without the allocation.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Decision, Verdict};
    ///
    /// let d = Decision::new(true, 10, 9, Duration::from_secs(1), Duration::ZERO);
    /// assert_eq!(Verdict::one(d), Verdict::new(vec![d]));
    /// assert_eq!(Verdict::one(d).decisions(), [d]);
    /// ```
    pub const fn one(decision: Decision) -> Self {
        Self {
            decisions: Decisions::One(decision),
        }
    }

    /// Whether every limit admitted the call.
    pub fn is_admitted(&self) -> bool {
        match &self.decisions {
            Decisions::One(d) => d.admitted,
            Decisions::Many(v) => v.iter().all(|d| d.admitted),
        }
    }

    /// One decision per limit, in the order the limits were given.
    pub fn decisions(&self) -> &[Decision] {
        match &self.decisions {
            Decisions::One(d) => std::slice::from_ref(d),
            Decisions::Many(v) => v,
        }
    }

    /// The decision that binds: when rejected, the rejecting limit with the longest
    /// `retry_after`; when admitted, the limit with the fewest units left. This is the one HTTP
    /// headers report.
    pub fn binding(&self) -> Option<&Decision> {
        if self.is_admitted() {
            self.decisions().iter().min_by_key(|d| d.remaining)
        } else {
            self.decisions()
                .iter()
                .filter(|d| !d.admitted)
                .max_by_key(|d| d.retry_after)
        }
    }

    /// When rejected: the earliest time the whole call could be admitted (the longest
    /// `retry_after` among the rejecting limits).
    pub fn retry_after(&self) -> Option<Duration> {
        self.decisions().iter().filter_map(|d| d.retry_after).max()
    }
}

// By their decisions, however they are held.
impl PartialEq for Verdict {
    fn eq(&self, other: &Self) -> bool {
        self.decisions() == other.decisions()
    }
}

impl Eq for Verdict {}

impl fmt::Debug for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verdict")
            .field("decisions", &self.decisions())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_binding_picks_the_longest_wait_or_the_fewest_left() {
        let ms = Duration::from_millis;
        let roomy = Decision::new(true, 10, 3, ms(5), ms(0));
        let short_wait = Decision::new(false, 5, 0, ms(50), ms(40));
        let long_wait = Decision::new(false, 5, 0, ms(90), ms(80));
        let rejected = Verdict::new(vec![roomy, short_wait, long_wait]);
        assert!(!rejected.is_admitted());
        assert_eq!(rejected.binding(), Some(&long_wait));
        assert_eq!(rejected.retry_after(), Some(ms(80)));
        let tight = Decision::new(true, 10, 1, ms(5), ms(0));
        let v = Verdict::new(vec![roomy, tight]);
        assert!(v.is_admitted());
        assert_eq!(v.binding(), Some(&tight));
        assert_eq!(v.retry_after(), None);
    }
}
