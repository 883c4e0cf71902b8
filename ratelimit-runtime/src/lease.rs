//! Leases for hot keys: a process takes several units of a limit in one store call and serves
//! the next calls from them in memory.
//!
//! Every check is one round trip to the shard that holds its key, so one hot key (a global
//! limit, a large tenant) is bounded by one redis-server thread however many instances share
//! it. With `lease = "100ms"` on `#[rate_limit]` (or [`Limit::with_lease`](crate::Limit::with_lease)),
//! a process that sees a key called often takes a **lease** of `k` units in one atomic take (the
//! same script as a call of cost `k`, leaving a receipt), serves the next calls from it without
//! a round trip, and gives back what it did not use by that receipt when the lease ends.
//!
//! * **Never over the quota.** The units are taken from the quota when the lease is taken, by
//!   the store's own rule; a call served from a lease uses a unit that was already counted.
//!   That is safe for the algorithms whose rule lets a call use units taken earlier: `fixed`
//!   and `sliding_counter` (a lease never outlives the window its units were counted in),
//!   `token`, `leaky` and `gcra` (serving later what a bucket admitted earlier never breaks
//!   it). The sliding log stamps each call with its own time and a concurrency limit counts
//!   calls in flight: `#[rate_limit]` refuses `lease` on them at compile time.
//! * **A quiet key behaves as without leases.** `k` follows the rate the process sees on the
//!   key: the units one lease's life would serve at the rate since the last take, at most
//!   twice the last lease, at most [`Lease::max_units`] and a tenth of the capacity, and never
//!   more than the store said was left. At `k = 1` a call is an ordinary check (no lease, no
//!   receipt), so a key called once a second is decided exactly as before.
//! * **The price is under-admission**, never over-admission: units sitting in one process's
//!   lease are unavailable to the others until it uses or returns them, at most `k_max` per
//!   process (`k_max × instances` in all), for at most the lease's life. A process that exits
//!   calls [`RateLimiter::shutdown`](crate::RateLimiter::shutdown) to give its leases' unused
//!   units back (the store then counts exactly what it admitted); one that dies holding a lease
//!   loses its units until the take's receipt expires (the store counts them).
//!   The gauge `ratelimit_lease_units_held` reports the units held in leases now
//!   ([`crate::observe`]).
//! * **Admin calls reach the leases**: [`RateLimiter::block`](crate::RateLimiter::block) and
//!   [`RateLimiter::reset`](crate::RateLimiter::reset) end the leases of the process that makes
//!   them at once (a block gives their unused units back, a reset gives nothing back: they were
//!   counted in the state it deletes), and a leased call consults blocks before it is served.
//!   Another process's leases are reached within one lease's life: until then it serves at
//!   most the units it held.
//! * **Failures are answered as today**: a lease that cannot be taken (the store fails, does
//!   not answer in time, or rejects the take because fewer than `k` units are left) becomes an
//!   ordinary check of the call, answered by the store or by the failure policy. A lease is
//!   never built from the failure policy's answer.
//!
//! Leases apply to a function's one limit (a stacked limit, `count = …`, `settle = …` and
//! shadow mode check every call at the store) and to remote stores: the memory store answers
//! in memory already.

use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::policy::rules::{self, DEFAULT_LEASE_UNITS, MAX_LEASE_MS};
use crate::policy::{Policy, PolicyError};

/// How a limit leases units ([`Limit::with_lease`](crate::Limit::with_lease); `lease = "100ms"`
/// and `lease_max = N` on `#[rate_limit]`): the longest a lease lives, and the most units one
/// lease takes. See the [module docs](self) for the rules.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::{Algorithm, By, lease::Lease, Limit, Policy};
///
/// let lease = Lease::new(Duration::from_millis(100))?.with_max_units(500)?;
/// let policy = Policy::new(Algorithm::Fixed, 100_000, Duration::from_secs(60))?;
/// let global = Limit::new(policy, "search", By::Global).with_lease(lease)?;
/// assert_eq!(global.lease, Some(lease));
/// // At most 500 units and a tenth of the capacity per lease:
/// assert_eq!(lease.units_for(&policy), 500);
///
/// // The sliding log stamps each call: it cannot take units early.
/// let log = Policy::new(Algorithm::Sliding, 100, Duration::from_secs(60))?;
/// assert!(Limit::new(log, "log", By::Global).with_lease(lease).is_err());
/// # Ok::<(), ratelimit_runtime::PolicyError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    ttl_ms: u64,
    max_units: u64,
}

impl Lease {
    /// The most units one lease takes unless [`Lease::with_max_units`] says otherwise.
    pub const DEFAULT_MAX_UNITS: u64 = DEFAULT_LEASE_UNITS;

    /// The longest lease: 1 second.
    pub const MAX_TTL: Duration = Duration::from_millis(MAX_LEASE_MS);

    /// A lease living at most `ttl` (whole milliseconds, from 1 ms to [`Lease::MAX_TTL`]),
    /// taking at most [`Lease::DEFAULT_MAX_UNITS`].
    ///
    /// # Errors
    ///
    /// [`PolicyError::LeaseTime`] for a `ttl` below 1 ms or above 1 s.
    pub const fn new(ttl: Duration) -> Result<Self, PolicyError> {
        let ms = ttl.as_millis();
        if ms == 0 || ms > MAX_LEASE_MS as u128 {
            return Err(PolicyError::LeaseTime);
        }
        #[allow(clippy::cast_possible_truncation)] // at most MAX_LEASE_MS, checked above
        let ttl_ms = ms as u64;
        Ok(Self {
            ttl_ms,
            max_units: Self::DEFAULT_MAX_UNITS,
        })
    }

    /// The same lease taking at most `max_units` at once (the attribute's `lease_max`).
    ///
    /// # Errors
    ///
    /// [`PolicyError::LeaseUnits`] for 0 or more than 2^50.
    pub const fn with_max_units(self, max_units: u64) -> Result<Self, PolicyError> {
        match rules::check_lease(rules::Kind::Window, self.ttl_ms, max_units) {
            Ok(()) => Ok(Self { max_units, ..self }),
            Err(v) => Err(PolicyError::from_violation(v)),
        }
    }

    /// The macro's lease, from arguments it checked (`rules::check_lease`); evaluated at
    /// compile time, where invalid ones fail the build.
    ///
    /// # Panics
    ///
    /// When the arguments break the rule, with its message: in the macro's `static`, a compile
    /// error.
    #[doc(hidden)]
    pub const fn checked(algorithm: Algorithm, ttl_ms: u64, max_units: u64) -> Self {
        match rules::check_lease(algorithm.kind(), ttl_ms, max_units) {
            Ok(()) => Self { ttl_ms, max_units },
            Err(v) => panic!("{}", v.message()),
        }
    }

    /// The longest a lease lives.
    pub const fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms)
    }

    /// The most units one lease takes.
    pub const fn max_units(&self) -> u64 {
        self.max_units
    }

    /// Whether `algorithm` can lease: every one but the sliding log and a concurrency limit.
    pub const fn supports(algorithm: Algorithm) -> bool {
        !matches!(algorithm.kind(), rules::Kind::Log | rules::Kind::Slots)
    }

    /// The most units one lease of `policy` takes: [`Lease::max_units`], and a tenth of the
    /// policy's capacity (at least 1), so that a few processes' leases never hold most of the
    /// quota between them.
    pub const fn units_for(&self, policy: &Policy) -> u64 {
        let tenth = policy.capacity() / 10;
        let tenth = if tenth == 0 { 1 } else { tenth };
        if self.max_units < tenth {
            self.max_units
        } else {
            tenth
        }
    }
}

/// `lease` on a limit of `policy`'s algorithm, or why not.
pub(crate) const fn check(policy: &Policy, lease: &Lease) -> Result<(), PolicyError> {
    match rules::check_lease(policy.algorithm().kind(), lease.ttl_ms, lease.max_units) {
        Ok(()) => Ok(()),
        Err(v) => Err(PolicyError::from_violation(v)),
    }
}
