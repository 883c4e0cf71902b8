//! `#[rate_limit]` on the methods of `#[async_trait]` impls, end to end: async-trait rewrites
//! each method into a boxed future before `#[rate_limit]` runs, and the check lands inside that
//! future, so the quota holds exactly as on a plain `async fn`: `num` calls admitted, the
//! body skipped on a rejected call, and the error converted with `From<RateLimitError>`. Each
//! scenario runs on the memory store (manual clock) and on a private `redis-server`, calling
//! through `dyn Trait` as async-trait users do.

use std::sync::atomic::{AtomicU32, Ordering};

use async_trait::async_trait;
use ratelimit_runtime::{RateLimitError, rate_limit};
use ratelimit_tests::env::Env;

#[derive(Debug)]
enum AppError {
    Limited(RateLimitError),
}

impl From<RateLimitError> for AppError {
    fn from(e: RateLimitError) -> Self {
        Self::Limited(e)
    }
}

#[async_trait]
trait Notifier: Send + Sync {
    async fn notify(&self, to: &str) -> Result<String, RateLimitError>;
    async fn record(&mut self, entry: (u32, String)) -> Result<u32, AppError>;
}

struct Sms {
    tenant: &'static str,
    /// Bodies of `notify` that ran.
    notified: AtomicU32,
    /// Bodies of `record` that ran.
    recorded: u32,
}

impl Sms {
    fn new(tenant: &'static str) -> Self {
        Self {
            tenant,
            notified: AtomicU32::new(0),
            recorded: 0,
        }
    }
}

#[async_trait]
impl Notifier for Sms {
    // 3 per tenant and recipient per 10 s, and 5 per recipient per minute across tenants.
    #[rate_limit(num = 3, time = 10, key = "notify:{self.tenant}:{to}")]
    #[rate_limit(algo = "sliding", num = 5, time = "1m", key = "notify:{to}")]
    async fn notify(&self, to: &str) -> Result<String, RateLimitError> {
        self.notified.fetch_add(1, Ordering::SeqCst);
        Ok(format!("{}->{to}", self.tenant))
    }

    // A pattern argument (async-trait renames it in the signature and binds it inside the
    // future) read by the template, `&mut self`, and an error type of the user's own.
    #[rate_limit(num = 2, time = 1, key = "record:{id}")]
    async fn record(&mut self, (id, note): (u32, String)) -> Result<u32, AppError> {
        let _ = (id, note);
        self.recorded += 1;
        Ok(self.recorded)
    }
}

fn limit_of(result: Result<impl std::fmt::Debug, RateLimitError>) -> u64 {
    match result {
        Err(RateLimitError::Limited { limit, .. }) => limit,
        other => panic!("expected a Limited error, got {other:?}"),
    }
}

async fn stacked_limits_hold_scenario() {
    let acme = Sms::new("acme");
    let zeta = Sms::new("zeta");
    let (acme_dyn, zeta_dyn): (&dyn Notifier, &dyn Notifier) = (&acme, &zeta);

    for _ in 0..3 {
        assert_eq!(acme_dyn.notify("ann").await.unwrap(), "acme->ann");
    }
    // The fourth is rejected by the per-tenant limit (3) and its body does not run.
    assert_eq!(limit_of(acme_dyn.notify("ann").await), 3);
    assert_eq!(acme.notified.load(Ordering::SeqCst), 3);
    // Another recipient is another key.
    assert_eq!(acme_dyn.notify("bob").await.unwrap(), "acme->bob");

    // Another tenant has its own per-tenant bucket but shares "ann"'s 5 per minute, of which
    // acme used 3 (its rejected call took nothing): two more fit, the third is the 5's.
    zeta_dyn.notify("ann").await.unwrap();
    zeta_dyn.notify("ann").await.unwrap();
    assert_eq!(limit_of(zeta_dyn.notify("ann").await), 5);
    assert_eq!(zeta.notified.load(Ordering::SeqCst), 2);
    assert_eq!(acme.notified.load(Ordering::SeqCst), 4);
}

async fn mut_self_and_pattern_argument_scenario(env: &Env) {
    let mut sms = Sms::new("acme");
    let boxed: &mut dyn Notifier = &mut sms;
    assert_eq!(boxed.record((7, "a".to_owned())).await.unwrap(), 1);
    assert_eq!(boxed.record((7, "b".to_owned())).await.unwrap(), 2);
    let Err(AppError::Limited(err)) = boxed.record((7, "c".to_owned())).await else {
        panic!("the third record of id 7 in a second is rejected");
    };
    let RateLimitError::Limited {
        retry_after, limit, ..
    } = err
    else {
        panic!("expected a Limited error, got {err:?}");
    };
    assert_eq!(limit, 2);
    // The key is the pattern-bound `id`: another id has its own quota.
    assert_eq!(boxed.record((8, "d".to_owned())).await.unwrap(), 3);
    // Once the window has passed, id 7 is admitted again.
    env.wait(retry_after).await;
    assert_eq!(boxed.record((7, "e".to_owned())).await.unwrap(), 4);
    assert_eq!(sms.recorded, 4);
}

#[tokio::test]
async fn async_trait_stacked_limits_admit_exactly_num_and_skip_rejected_bodies_memory() {
    let (limiter, _env) = Env::memory().await;
    limiter.scope(stacked_limits_hold_scenario()).await;
}

#[tokio::test]
async fn async_trait_stacked_limits_admit_exactly_num_and_skip_rejected_bodies_redis() {
    let (limiter, _env) = Env::redis().await;
    limiter.scope(stacked_limits_hold_scenario()).await;
}

#[tokio::test]
async fn async_trait_mut_self_method_keys_on_a_pattern_argument_memory() {
    let (limiter, env) = Env::memory().await;
    limiter
        .scope(mut_self_and_pattern_argument_scenario(&env))
        .await;
}

#[tokio::test]
async fn async_trait_mut_self_method_keys_on_a_pattern_argument_redis() {
    let (limiter, env) = Env::redis().await;
    limiter
        .scope(mut_self_and_pattern_argument_scenario(&env))
        .await;
}
