//! The admin calls: read, reset and block one caller's limits, with keys built exactly as
//! the attribute builds them (`keys_for` in `limit.rs`, the one place keys are made).

use std::borrow::Cow;
use std::net::IpAddr;
use std::time::Duration;

use tokio::time::Instant;

use crate::decision::Verdict;
use crate::error::StoreError;
use crate::limit::{By, Limit, keys_for};
use crate::store::Check;

use super::RateLimiter;

/// Who an admin call ([`RateLimiter::peek`], [`RateLimiter::reset`], [`RateLimiter::block`])
/// is about: the value the function's limits key a caller by, and the rendered `key`
/// template when the limits have one.
///
/// The value is used for every limit that is `by` something other than `global`, as that
/// source reads it: [`Target::ip`] is grouped as `by = "ip"` groups it (IPv6 by
/// [`crate::limiter::Builder::ipv6_prefix`]), [`Target::path`] is normalized as `by = "url"`
/// normalizes it, and [`Target::value`] (a user id, an `appId`, a header value) is taken as
/// is (for a `by = "ip"` limit it must be an address, grouped like [`Target::ip`]). `global`
/// limits take no value.
///
/// ```
/// use ratelimit_runtime::Target;
/// let alice = Target::value("alice");              // by = "user" (or app_id, header:…)
/// let ip = Target::ip("203.0.113.7".parse()?);     // by = "ip"
/// let sms = Target::global().key("sms:+15550100"); // key = "sms:{phone}", no by
/// # let _ = (alice, ip, sms);
/// # Ok::<(), std::net::AddrParseError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    value: Value,
    key: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    None,
    Ip(IpAddr),
    Path(String),
    Raw(Vec<u8>),
}

impl Target {
    /// No caller value: for limits that are all `by = "global"` (with a `key`, add
    /// [`Target::key`]).
    pub fn global() -> Self {
        Self {
            value: Value::None,
            key: None,
        }
    }

    /// A client address, for `by = "ip"` limits (grouped as the attribute groups it).
    pub fn ip(ip: IpAddr) -> Self {
        Self {
            value: Value::Ip(ip),
            key: None,
        }
    }

    /// A request path, for `by = "url"` limits (normalized as the attribute normalizes it).
    pub fn path(path: impl Into<String>) -> Self {
        Self {
            value: Value::Path(path.into()),
            key: None,
        }
    }

    /// A value taken as is: a user id (`by = "user"`), an `appId` (`by = "app_id"`) or a
    /// header's value (`by = "header:<name>"`).
    pub fn value(value: impl Into<Vec<u8>>) -> Self {
        Self {
            value: Value::Raw(value.into()),
            key: None,
        }
    }

    /// The rendered `key` template (`key = "sms:{phone}"` with `phone = "+15550100"` renders
    /// `sms:+15550100`; with two or more arguments, see `render`'s framing in the docs of the
    /// attribute). Applied to every limit of the call: call once per limit when their
    /// templates differ.
    #[must_use]
    pub fn key(mut self, rendered: impl Into<String>) -> Self {
        self.key = Some(rendered.into());
        self
    }

    /// The keys of `limits` for this caller under `limiter`'s prefix.
    pub(super) fn keys(
        &self,
        limiter: &RateLimiter,
        limits: &[Limit],
    ) -> Result<Vec<String>, StoreError> {
        let settings = limiter.settings();
        let templates: Vec<Option<&str>> = vec![self.key.as_deref(); limits.len()];
        keys_for(&settings.prefix, limits, &templates, |by| {
            if by == By::Global {
                return Ok(None);
            }
            let value: Cow<'_, [u8]> = match (&self.value, by) {
                (Value::None, _) => {
                    return Err(StoreError::bad_reply(format!(
                        "a limit is by {by:?}: name the caller with Target::ip, Target::path or Target::value"
                    )));
                }
                (Value::Ip(ip), By::Ip) => Cow::Owned(ip_bucket(*ip, limiter).into_bytes()),
                (Value::Ip(ip), _) => Cow::Owned(ip.to_string().into_bytes()),
                (Value::Path(p), By::Url) => {
                    Cow::Owned(crate::caller::path::normalized_path(p.as_bytes()).into_owned())
                }
                (Value::Path(p), _) => Cow::Borrowed(p.as_bytes()),
                // An address written as text, for an ip limit: grouped as `by = "ip"` groups it.
                (Value::Raw(v), By::Ip) => match std::str::from_utf8(v)
                    .ok()
                    .and_then(|t| t.trim().parse::<IpAddr>().ok())
                {
                    Some(ip) => Cow::Owned(ip_bucket(ip, limiter).into_bytes()),
                    None => {
                        return Err(StoreError::bad_reply(
                            "a limit is by ip: name the caller with Target::ip (or an address as text)",
                        ));
                    }
                },
                (Value::Raw(v), _) => Cow::Borrowed(v.as_slice()),
            };
            Ok(Some(value))
        })
    }
}

/// The address as `by = "ip"` keys it (handlers, the layer, gRPC methods: grouped alike).
fn ip_bucket(ip: IpAddr, limiter: &RateLimiter) -> String {
    crate::caller::ip::bucket(ip, &limiter.settings().http)
}

impl RateLimiter {
    /// `limits` as checks apply them now: a scope's quota override ([`RateLimiter::set_quota`])
    /// replaces the attribute's numbers, which are part of the key, so the admin calls find
    /// the caller's live state. An override that makes a limit unlimited, or that the limit's
    /// cost cannot fit, leaves the attribute's numbers.
    pub(crate) fn in_force(&self, limits: &[Limit]) -> Vec<Limit> {
        limits
            .iter()
            .map(|l| {
                let overridden = self.has_overrides().then(|| self.quota_override(l.scope));
                match overridden
                    .flatten()
                    .map(|q| q.apply(l.policy.algorithm(), l.policy.cost()))
                {
                    Some(Ok(Some(policy))) => Limit { policy, ..*l },
                    _ => *l,
                }
            })
            .collect()
    }

    /// Reads the state of each of `limits` for `target` now, taking nothing: one
    /// [`crate::Decision`] per limit, in order (`admitted` tells whether a call of that
    /// limit's cost would be admitted now; a blocked caller reads as rejected until the
    /// block's end). Goes to the store directly: no failure policy, no breaker, no
    /// blocked-caller cache.
    ///
    /// `limits` name the function's limits as the attribute wrote them (see [`Limit`]); for a
    /// function with stacked attributes, its `export` const lists them in the order written,
    /// top to bottom, and the decisions follow that order.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, By, Limit, Policy, RateLimiter, Target};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RateLimiter::builder().build().await?;
    /// let login = [Limit::new(Policy::new(Algorithm::Fixed, 3, Duration::from_secs(60))?, "login", By::User)];
    /// let alice = Target::value("alice");
    /// let now = limiter.peek(&login, &alice).await?;
    /// assert_eq!(now.decisions()[0].remaining, 3);
    /// # Ok(()) }
    /// ```
    pub async fn peek(&self, limits: &[Limit], target: &Target) -> Result<Verdict, StoreError> {
        let limits = &self.in_force(limits);
        let keys = target.keys(self, limits)?;
        let checks: Vec<Check<'_>> = limits
            .iter()
            .zip(&keys)
            .map(|(l, k)| Check::new(k, &l.policy).with_scope(l.scope))
            .collect();
        self.admin(self.inner.store.peek(&checks)).await
    }

    /// Forgets `target`'s state in each of `limits` (and lifts a block): its next call starts
    /// from a full quota. Clears this limiter's blocked-caller cache for those keys too.
    ///
    /// **Other instances** of the application keep their own blocked-caller cache: one that
    /// rejected this caller shortly before keeps rejecting it until the wait the store gave
    /// it ends (at most the limit's `retry_after`, under a period). Run with
    /// [`crate::limiter::Builder::blocked_cache`]`(0)` where a reset must take effect everywhere at
    /// once. This limiter's leases ([`crate::lease`]) of those keys end at once, giving nothing
    /// back (their units were counted in the state the reset deletes); another instance serves
    /// at most the one lease it holds, for at most the lease's life.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, By, store::Check, Limit, Policy, RateLimiter, Target};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RateLimiter::builder().build().await?;
    /// let login = [Limit::new(Policy::new(Algorithm::Fixed, 1, Duration::from_secs(60))?, "login", By::User)];
    /// let alice = Target::value("alice");
    /// limiter.block(&login, &alice, Duration::from_secs(3600)).await?;
    /// assert!(!limiter.peek(&login, &alice).await?.is_admitted());
    /// limiter.reset(&login, &alice).await?; // support unblocks alice
    /// assert!(limiter.peek(&login, &alice).await?.is_admitted());
    /// # Ok(()) }
    /// ```
    pub async fn reset(&self, limits: &[Limit], target: &Target) -> Result<(), StoreError> {
        let limits = &self.in_force(limits);
        let keys = target.keys(self, limits)?;
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let resetting = self.resetting_leases(limits, &refs).await;
        let reset = self.admin(self.inner.store.reset(&refs)).await;
        drop(resetting);
        reset?;
        if let Some(blocked) = &self.inner.blocked {
            blocked.remove(&refs);
        }
        tracing::info!(target: crate::observe::log::ADMIN,
            scope = limits.first().map_or("", |l| l.scope),
            "rate limit reset for one caller (admin)"
        );
        Ok(())
    }

    /// Rejects every call of `target` on each of `limits` for `duration`, whatever their
    /// state (shared by every instance on Redis and Redis Cluster; per process on memory). A
    /// later block replaces an earlier one; [`RateLimiter::reset`] lifts it. A blocked call
    /// gets the usual rejection (429 with `Retry-After` until the block's end, or
    /// [`crate::RateLimitError::Limited`]) and takes nothing. A `duration` past a hundred
    /// years (`Duration::MAX`: until reset) is cut to a hundred years.
    ///
    /// On Redis, each check reads whether a block exists for its keys (one `EXISTS` in the
    /// check's script, for all of the call's limits at once). This limiter's leases
    /// ([`crate::lease`]) of those keys end at once and give their unused units back; another
    /// instance serves at most the units its lease holds, for at most the lease's life.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, By, Limit, Policy, RateLimiter, Target};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RateLimiter::builder().build().await?;
    /// let api = [Limit::new(Policy::new(Algorithm::Token, 100, Duration::from_secs(1))?, "api", By::Ip)];
    /// let abuser = Target::ip("203.0.113.7".parse()?);
    /// limiter.block(&api, &abuser, Duration::from_secs(600)).await?;
    /// let now = limiter.peek(&api, &abuser).await?;
    /// assert!(now.retry_after().unwrap() > Duration::from_secs(599));
    /// # Ok(()) }
    /// ```
    pub async fn block(
        &self,
        limits: &[Limit],
        target: &Target,
        duration: Duration,
    ) -> Result<(), StoreError> {
        let limits = &self.in_force(limits);
        self.write_block(limits, target, duration, false).await?;
        tracing::info!(target: crate::observe::log::ADMIN,
            scope = limits.first().map_or("", |l| l.scope),
            duration_ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
            "caller blocked (admin)"
        );
        Ok(())
    }

    /// A block of `limits` (in force) for `target`: in the store ([`crate::Store::block`],
    /// or with `keep_later` [`crate::Store::extend_block`], which never shortens a block),
    /// in this process's cache of refusals, and on its leases of the keys.
    pub(super) async fn write_block(
        &self,
        limits: &[Limit],
        target: &Target,
        duration: Duration,
        keep_later: bool,
    ) -> Result<(), StoreError> {
        let keys = target.keys(self, limits)?;
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let duration = duration.min(crate::store::LONGEST_BLOCK);
        let sent_at = Instant::now();
        let store = &self.inner.store;
        if keep_later {
            self.admin(store.extend_block(&refs, duration)).await?;
        } else {
            self.admin(store.block(&refs, duration)).await?;
        }
        // The store holds this block or, with `keep_later`, one that ends later.
        if let Some(blocked) = &self.inner.blocked {
            let checks: Vec<Check<'_>> = limits
                .iter()
                .zip(&keys)
                .map(|(l, k)| Check::new(k, &l.policy))
                .collect();
            if let Some(until) = sent_at.checked_add(duration) {
                blocked.block(&checks, until);
            }
        }
        self.block_leases(limits, &refs);
        Ok(())
    }

    /// An admin store call, bounded by ten times the check timeout (they are rare, and may
    /// touch several slots).
    pub(super) async fn admin<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let timeout = self.inner.settings.timeout.saturating_mul(10);
        match tokio::time::timeout(timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout(timeout)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::policy::Policy;

    fn limits(by: By) -> [Limit; 1] {
        [Limit::new(
            Policy::new(Algorithm::Fixed, 3, Duration::from_secs(60)).unwrap(),
            "s",
            by,
        )]
    }

    /// The memory store's take (`count = …`) honours a block, and under a scope's quota
    /// override the admin calls reach the keys the checks use (the review's M1 and M2).
    #[tokio::test]
    async fn blocks_stop_takes_and_admin_calls_follow_a_quota_override() {
        let limiter = RateLimiter::builder().build().await.unwrap();
        let login = [Limit::new(
            Policy::new(Algorithm::Fixed, 5, Duration::from_secs(60)).unwrap(),
            "login",
            By::User,
        )];
        let alice = Target::value("alice");
        limiter
            .block(&login, &alice, Duration::from_secs(3600))
            .await
            .unwrap();
        let keys = alice.keys(&limiter, &login).unwrap();
        let checks = [Check::new(&keys[0], &login[0].policy)];
        let (taken, _) = limiter.take(&checks).await.unwrap();
        assert!(!taken.is_admitted(), "a blocked caller's take is rejected");
        limiter.reset(&login, &alice).await.unwrap();
        assert!(limiter.take(&checks).await.unwrap().0.is_admitted());

        limiter
            .set_quota("login", crate::quota::Quota::per_minute(3).unwrap())
            .unwrap();
        let in_force = limiter.in_force(&login);
        assert_eq!(in_force[0].policy.limit(), 3);
        let keys = alice.keys(&limiter, &in_force).unwrap();
        assert_ne!(keys, alice.keys(&limiter, &login).unwrap());
        let checks = [Check::new(&keys[0], &in_force[0].policy)];
        limiter
            .block(&login, &alice, Duration::from_secs(3600))
            .await
            .unwrap();
        assert!(!limiter.check(&checks).await.unwrap().is_admitted());
        assert!(!limiter.peek(&login, &alice).await.unwrap().is_admitted());
        limiter.reset(&login, &alice).await.unwrap();
        assert!(limiter.check(&checks).await.unwrap().is_admitted());
    }

    #[test]
    fn targets_key_callers_as_the_attribute_does() {
        let limiter = RateLimiter::builder().build_lazy().unwrap();
        let ip = |t: &Target| t.keys(&limiter, &limits(By::Ip)).unwrap().remove(0);
        // IPv6 grouped by /64, as by = "ip" groups it; an address as text is the same caller.
        let low = ip(&Target::ip("2001:db8::1".parse().unwrap()));
        let high = ip(&Target::ip("2001:db8::ffff".parse().unwrap()));
        let text = ip(&Target::value("2001:db8::2"));
        assert_eq!(low, high);
        assert_eq!(low, text);
        assert!(low.contains("ip=2001:db8::/64"), "{low}");
        assert!(
            Target::value("not an ip")
                .keys(&limiter, &limits(By::Ip))
                .is_err()
        );
        // A global limit takes no value; others need one.
        let global = Target::global().key("sms:+1555");
        let sms = global
            .keys(&limiter, &limits(By::Global))
            .unwrap()
            .remove(0);
        assert!(sms.contains("k=sms:+1555"), "{sms}");
        assert!(Target::global().keys(&limiter, &limits(By::User)).is_err());
        let user = Target::value("alice")
            .keys(&limiter, &limits(By::User))
            .unwrap()
            .remove(0);
        assert!(user.contains("user=alice"), "{user}");
        // A path is normalized as by = "url" normalizes it.
        let path = |s: &str| {
            Target::path(s)
                .keys(&limiter, &limits(By::Url))
                .unwrap()
                .remove(0)
        };
        assert_eq!(path("/%73earch"), path("/search"));
    }
}
