//! A [`Store`] that runs the Redis stores' exact code in the embedded Lua against the
//! stand-in, as the library's functions (`FCALL`) or as the scripts (`EVALSHA`): KEYS and ARGV built as `eval_checks` (store/redis.rs) and `compensate`
//! (store/cluster.rs) build them, replies read with the rules of `parse_reply`.

use std::sync::{Mutex, MutexGuard, PoisonError};

use std::time::Duration;

use ratelimit_runtime::store::StoreFuture;
use ratelimit_runtime::store::redis::{ReplyReceipt, check_keys, compensate_keys};
use ratelimit_runtime::{Store, StoreError, Verdict, store::Check};

use super::scripts::{Sources, sources};

/// The script `RedisStore::extend_block` sends.
const EXTEND_BLOCK: &str =
    include_str!("../../../../ratelimit-runtime/src/scripts/extend_block.lua");
use super::standin::{LuaRedis, Reply};

/// How the stores run the code: the library's functions (`FCALL`, servers with Redis
/// Functions) or the scripts (`EVALSHA`, servers without).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Functions,
    Scripts,
}

/// The scripts in the embedded Lua on the stand-in.
#[derive(Debug)]
pub(crate) struct LuaStore {
    lua: Mutex<LuaRedis>,
    scripts: Sources,
    mode: Mode,
}

/// The argument of one limit, as `eval_checks` writes it: its five numbers joined by `:`
/// (algorithm code, limit, period µs, burst, cost).
pub(crate) fn limit_args(check: &Check<'_>) -> Vec<u8> {
    let p = check.policy;
    format!(
        "{}:{}:{}:{}:{}",
        super::scripts::code(p.algorithm()),
        p.limit(),
        p.period_ms().saturating_mul(1000),
        p.burst(),
        p.cost()
    )
    .into_bytes()
}

/// The driver's KEYS and ARGV for `checks` (and a call id), as `eval_checks` builds them.
pub(crate) fn driver_call(
    checks: &[Check<'_>],
    call_id: Option<&str>,
) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let keys = check_keys(checks, call_id)
        .into_iter()
        .map(String::into_bytes)
        .collect();
    let mut argv: Vec<Vec<u8>> = checks.iter().map(limit_args).collect();
    if let Some(id) = call_id {
        argv.push(id.as_bytes().to_vec());
    }
    (keys, argv)
}

/// The companion script's KEYS and ARGV (`refund` with a call id, else `peek`), as
/// `compensate` builds them.
pub(crate) fn compensate_call(
    checks: &[Check<'_>],
    refund: Option<&str>,
) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let keys = compensate_keys(checks, refund)
        .into_iter()
        .map(String::into_bytes)
        .collect();
    let mut argv = match refund {
        None => vec![b"peek".to_vec()],
        Some(id) => vec![b"refund".to_vec(), id.as_bytes().to_vec()],
    };
    argv.extend(checks.iter().map(limit_args));
    (keys, argv)
}

/// The driver's KEYS and ARGV for a take whose receipts come back in its reply (`~`), as
/// `take_in_reply` builds them.
pub(crate) fn in_reply_call(checks: &[Check<'_>]) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let (keys, mut argv) = driver_call(checks, None);
    argv.push(b"~".to_vec());
    (keys, argv)
}

/// The companion script's KEYS and ARGV for `mode` (`settle` or `return`) under `call_id`,
/// with one more argument per limit after the limits' own, as `compensate` builds them.
fn companion_call_per_limit(
    checks: &[Check<'_>],
    mode: &str,
    call_id: &str,
    per_limit: impl Iterator<Item = Vec<u8>>,
) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let keys = compensate_keys(checks, Some(call_id))
        .into_iter()
        .map(String::into_bytes)
        .collect();
    let mut argv = vec![mode.as_bytes().to_vec(), call_id.as_bytes().to_vec()];
    argv.extend(checks.iter().map(limit_args));
    argv.extend(per_limit);
    (keys, argv)
}

/// The companion script's KEYS and ARGV for the return, under `call_id`, of a take by the
/// receipts its reply carried.
pub(crate) fn return_call(
    checks: &[Check<'_>],
    call_id: &str,
    receipts: &[ReplyReceipt],
) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let values = receipts
        .iter()
        .zip(checks)
        .map(|(r, c)| r.value(c.policy.cost()).into_bytes());
    companion_call_per_limit(checks, "return", call_id, values)
}

/// The companion script's KEYS and ARGV for a settle under `call_id` to `actual` units per
/// limit.
pub(crate) fn settle_call(
    checks: &[Check<'_>],
    call_id: &str,
    actual: &[u64],
) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let units = actual.iter().map(|a| a.to_string().into_bytes());
    companion_call_per_limit(checks, "settle", call_id, units)
}

/// The reply as the Redis client hands it over (`redis::Value`).
fn value(reply: &Reply) -> redis::Value {
    match reply {
        Reply::Int(n) => redis::Value::Int(*n),
        Reply::Bulk(b) => redis::Value::BulkString(b.clone()),
        Reply::Nil => redis::Value::Nil,
        Reply::Array(items) => redis::Value::Array(items.iter().map(value).collect()),
        Reply::Status(s) => redis::Value::SimpleString(s.clone()),
        Reply::Error(e) => redis::Value::SimpleString(format!("-{e}")),
    }
}

/// The script's reply read by the store's own `parse_reply`.
pub(crate) fn parse(reply: &Reply, checks: &[Check<'_>]) -> Result<Verdict, StoreError> {
    if let Reply::Error(e) = reply {
        return Err(StoreError::backend(e.clone()));
    }
    ratelimit_runtime::store::redis::parse_reply(&value(reply), checks)
}

impl LuaStore {
    /// A store on an empty stand-in whose `TIME` reads `now_us`, running the library's
    /// functions as the stores do on a server with Redis Functions.
    pub(crate) fn new(now_us: u64) -> Self {
        Self::with_mode(now_us, Mode::Functions)
    }

    /// A store on an empty stand-in whose `TIME` reads `now_us`, in `mode`.
    pub(crate) fn with_mode(now_us: u64, mode: Mode) -> Self {
        Self::with_sources(now_us, mode, sources())
    }

    /// The same, running `scripts` (the stores' texts, or mutants of them).
    pub(crate) fn with_sources(now_us: u64, mode: Mode, scripts: Sources) -> Self {
        let mut lua = LuaRedis::new();
        lua.set_time_us(now_us);
        lua.load_library(&scripts.library)
            .unwrap_or_else(|e| panic!("the library does not load: {e}"));
        Self {
            lua: Mutex::new(lua),
            scripts,
            mode,
        }
    }

    /// Runs the check of `checks` on `keys` and `argv`, as the store would in this mode: the
    /// function or script the store picks for them (the driver, or the fixed windows' own).
    pub(crate) fn run_driver(
        &self,
        checks: &[Check<'_>],
        keys: &[Vec<u8>],
        argv: &[Vec<u8>],
    ) -> Reply {
        let (function, script) = self.scripts.for_checks(checks);
        match self.mode {
            Mode::Functions => self.lua().fcall(function, keys, argv),
            Mode::Scripts => self.lua().eval(script, keys, argv),
        }
    }

    /// Runs the companion's code on `keys` and `argv`, as the store would in this mode.
    pub(crate) fn run_companion(&self, keys: &[Vec<u8>], argv: &[Vec<u8>]) -> Reply {
        match self.mode {
            Mode::Functions => self
                .lua()
                .fcall(&self.scripts.compensate_function, keys, argv),
            Mode::Scripts => self.lua().eval(&self.scripts.compensate, keys, argv),
        }
    }

    /// The stand-in (to set its time or inspect its keys).
    pub(crate) fn lua(&self) -> MutexGuard<'_, LuaRedis> {
        self.lua.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The scripts it runs.
    pub(crate) fn scripts(&self) -> &Sources {
        &self.scripts
    }

    /// The driver on `checks`, with a call id when given (a cross-slot take with receipts).
    pub(crate) fn take(
        &self,
        checks: &[Check<'_>],
        call_id: Option<&str>,
    ) -> Result<Verdict, StoreError> {
        let (keys, argv) = driver_call(checks, call_id);
        let reply = self.run_driver(checks, &keys, &argv);
        parse(&reply, checks)
    }

    /// The driver on `checks`, its receipts in the reply (`RedisStore::take_briefly`).
    pub(crate) fn take_in_reply(
        &self,
        checks: &[Check<'_>],
    ) -> Result<(Verdict, Vec<ReplyReceipt>), StoreError> {
        let (keys, argv) = in_reply_call(checks);
        let reply = self.run_driver(checks, &keys, &argv);
        if let Reply::Error(e) = &reply {
            return Err(StoreError::backend(e.clone()));
        }
        ratelimit_runtime::store::redis::parse_reply_with_receipts(&value(&reply), checks)
    }

    /// The companion script's return, under `call_id`, of a take by its reply's receipts.
    pub(crate) fn give_back(
        &self,
        checks: &[Check<'_>],
        call_id: &str,
        receipts: &[ReplyReceipt],
    ) -> Result<Verdict, StoreError> {
        let (keys, argv) = return_call(checks, call_id, receipts);
        let reply = self.run_companion(&keys, &argv);
        parse(&reply, checks)
    }

    /// The companion script: a refund under `call_id`, or a peek.
    pub(crate) fn compensate(
        &self,
        checks: &[Check<'_>],
        refund: Option<&str>,
    ) -> Result<Verdict, StoreError> {
        let (keys, argv) = compensate_call(checks, refund);
        let reply = self.run_companion(&keys, &argv);
        parse(&reply, checks)
    }
}

impl LuaStore {
    /// The companion script's settle under `call_id` to `actual` units per limit.
    pub(crate) fn settle(
        &self,
        checks: &[Check<'_>],
        call_id: &str,
        actual: &[u64],
    ) -> Result<Verdict, StoreError> {
        let (keys, argv) = settle_call(checks, call_id, actual);
        let reply = self.run_companion(&keys, &argv);
        parse(&reply, checks)
    }
}

impl Store for LuaStore {
    fn check<'a>(&'a self, checks: &'a [Check<'a>]) -> StoreFuture<'a> {
        Box::pin(async move { self.take(checks, None) })
    }

    fn name(&self) -> &'static str {
        "lua-standin"
    }

    /// The companion's `peek`, as `RedisStore::peek` sends it.
    fn peek<'a>(&'a self, checks: &'a [Check<'a>]) -> StoreFuture<'a> {
        Box::pin(async move { self.compensate(checks, None) })
    }

    /// `DEL key key:b`, as `RedisStore::reset` sends it.
    fn reset<'a>(&'a self, keys: &'a [&'a str]) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let lua = self.lua();
            for key in keys {
                let reply = lua.db().command(&[
                    b"DEL".to_vec(),
                    key.as_bytes().to_vec(),
                    format!("{key}:b").into_bytes(),
                ]);
                if let Reply::Error(e) = reply {
                    return Err(StoreError::backend(e));
                }
            }
            Ok(())
        })
    }

    /// `scripts/extend_block.lua` on each `key:b`, as `RedisStore::extend_block` sends it.
    fn extend_block<'a>(&'a self, keys: &'a [&'a str], duration: Duration) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let ms = u64::try_from(duration.as_millis())
                .unwrap_or(u64::MAX)
                .max(1);
            let mut lua = self.lua();
            for key in keys {
                let marker = format!("{key}:b").into_bytes();
                let reply = lua.eval(EXTEND_BLOCK, &[marker], &[ms.to_string().into_bytes()]);
                if let Reply::Error(e) = reply {
                    return Err(StoreError::backend(e));
                }
            }
            Ok(())
        })
    }

    /// `SET key:b 1 PX ms`, as `RedisStore::block` sends it.
    fn block<'a>(&'a self, keys: &'a [&'a str], duration: Duration) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let ms = u64::try_from(duration.as_millis())
                .unwrap_or(u64::MAX)
                .max(1);
            let lua = self.lua();
            for key in keys {
                let reply = lua.db().command(&[
                    b"SET".to_vec(),
                    format!("{key}:b").into_bytes(),
                    b"1".to_vec(),
                    b"PX".to_vec(),
                    ms.to_string().into_bytes(),
                ]);
                if let Reply::Error(e) = reply {
                    return Err(StoreError::backend(e));
                }
            }
            Ok(())
        })
    }
}
