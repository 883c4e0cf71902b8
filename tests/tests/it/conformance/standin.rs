//! A stand-in for the few Redis commands the scripts use, with a settable `TIME`, and an
//! embedded Lua 5.1 (the version Redis embeds) that runs scripts against it the way Redis 7.0
//! does.
//!
//! What it follows of Redis, because decisions depend on it:
//! * **Time.** `TIME` answers the set time (µs). Expiry is in whole milliseconds: a key given
//!   `PX p` at `t` µs expires at ms `⌊t / 1000⌋ + p`, exists while the current ms is at most
//!   that, and `PTTL` answers the difference (0 in its last millisecond). A key past its expiry
//!   reads as absent to every command. As in a Redis script, time does not move during a run
//!   for `TIME` and for whether a key exists. But Redis 7.0 counts a relative expiry (`PX`,
//!   `PEXPIRE`) and `PTTL` from its live clock, which runs on while a script runs: a server
//!   paused mid-script (descheduled on a loaded host) is modelled by a *lag*
//!   ([`LuaRedis::set_lag_us`], 0 unless a test sets it) added to the set time for those.
//! * **Lua → command arguments.** Strings as they are, numbers formatted `%.17g` (Redis 7.0);
//!   anything else is an error.
//! * **Replies → Lua.** Integer → number, bulk → string, nil → `false`, array → table, status →
//!   `{ok = …}`; an error reply raises a Lua error (`redis.call`).
//! * **Lua → reply.** Numbers truncated toward zero to integers, strings to bulk, `true` → 1,
//!   `false` → nil, a table with `err` (a string) → error, with `ok` → status, any other table →
//!   array of its elements 1, 2, … up to the first nil.
//! * **Sorted sets.** Scores are doubles, ordered by (score, member bytes); re-adding a member
//!   updates its score; `(` makes a bound exclusive; `-inf` / `+inf`; an emptied set is
//!   deleted; scores in replies are `%.17g`.
//! * **Globals.** Scripts run with Redis's global protection: creating or reading an undeclared
//!   global is an error.
//!
//! Anything the scripts do not use is an error here (an unknown command, option or flag), so a
//! script change that needs more of Redis fails loudly instead of being answered wrongly. The
//! conformance test checks these answers against a real `redis-server`.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use mlua::{Function, Lua, LuaOptions, MultiValue, StdLib, Table, Value, Variadic};

/// A Redis reply (RESP2).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Reply {
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Reply>),
    Status(String),
    Error(String),
}

impl Reply {
    fn error(msg: &str) -> Self {
        Reply::Error(msg.to_owned())
    }

    fn bulk(s: impl Into<Vec<u8>>) -> Self {
        Reply::Bulk(s.into())
    }

    /// A reply of the `redis` crate as a [`Reply`] (to compare with a real server).
    pub(crate) fn from_redis(v: &redis::Value) -> Self {
        match v {
            redis::Value::Nil => Reply::Nil,
            redis::Value::Int(n) => Reply::Int(*n),
            redis::Value::BulkString(b) => Reply::Bulk(b.clone()),
            redis::Value::Array(items) => {
                Reply::Array(items.iter().map(Reply::from_redis).collect())
            }
            redis::Value::SimpleString(s) => Reply::Status(s.clone()),
            redis::Value::Okay => Reply::Status("OK".to_owned()),
            redis::Value::ServerError(e) => {
                Reply::Error(format!("{} {}", e.code(), e.details().unwrap_or_default()))
            }
            other => Reply::Error(format!("unexpected reply {other:?}")),
        }
    }
}

/// `x` as C's `printf("%.17g", x)`: what Redis 7.0 writes for a double.
pub(crate) fn g17(x: f64) -> String {
    if x.is_nan() {
        return "nan".to_owned();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0" } else { "0" }.to_owned();
    }
    // 17 significant digits, correctly rounded, as d.dddddddddddddddde<exp>.
    let sci = format!("{x:.16e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if negative { "-" } else { "" };
    if !(-4..17).contains(&exp) {
        let mut m = format!("{}.{}", &digits[..1], &digits[1..]);
        while m.ends_with('0') {
            m.pop();
        }
        if m.ends_with('.') {
            m.pop();
        }
        let e_sign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{m}e{e_sign}{:02}", exp.abs());
    }
    let point = exp + 1; // digits before the decimal point
    let mut s = if point <= 0 {
        let zeros = usize::try_from(-point).unwrap_or(0);
        format!("0.{}{digits}", "0".repeat(zeros))
    } else {
        let p = usize::try_from(point).unwrap_or(0);
        format!("{}.{}", &digits[..p], &digits[p..])
    };
    while s.ends_with('0') {
        s.pop();
    }
    if s.ends_with('.') {
        s.pop();
    }
    format!("{sign}{s}")
}

/// A score ordered as Redis orders sorted-set entries (never NaN here: such scores are
/// refused).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Score(f64);

impl Eq for Score {}

impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Score {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
struct Zset {
    scores: HashMap<Vec<u8>, f64>,
    ordered: BTreeSet<(Score, Vec<u8>)>,
}

impl Zset {
    /// Adds or updates; `true` when the member is new.
    fn add(&mut self, score: f64, member: Vec<u8>) -> bool {
        let new = match self.scores.insert(member.clone(), score) {
            Some(old) => {
                self.ordered.remove(&(Score(old), member.clone()));
                false
            }
            None => true,
        };
        self.ordered.insert((Score(score), member));
        new
    }

    fn remove(&mut self, member: &[u8]) {
        if let Some(score) = self.scores.remove(member) {
            self.ordered.remove(&(Score(score), member.to_vec()));
        }
    }

    fn in_range(&self, lo: Bound, hi: Bound) -> impl Iterator<Item = &(Score, Vec<u8>)> {
        self.ordered
            .iter()
            .filter(move |(s, _)| lo.below(s.0) && hi.above(s.0))
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Data {
    Str(Vec<u8>),
    Zset(Zset),
}

#[derive(Debug, Clone, PartialEq)]
struct Entry {
    data: Data,
    /// The last millisecond the key exists (`None`: no expiry).
    expires_ms: Option<u64>,
}

/// A score bound of `ZCOUNT` and friends.
#[derive(Debug, Clone, Copy)]
struct Bound {
    value: f64,
    exclusive: bool,
}

impl Bound {
    fn parse(arg: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(arg).ok()?;
        let (exclusive, rest) = match text.strip_prefix('(') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let value = parse_double(rest)?;
        Some(Self { value, exclusive })
    }

    /// `score` is not below this lower bound.
    fn below(self, score: f64) -> bool {
        if self.exclusive {
            score > self.value
        } else {
            score >= self.value
        }
    }

    /// `score` is not above this upper bound.
    fn above(self, score: f64) -> bool {
        if self.exclusive {
            score < self.value
        } else {
            score <= self.value
        }
    }
}

/// A double as Redis reads one (`strtod` on the whole argument, no spaces, no NaN).
fn parse_double(s: &str) -> Option<f64> {
    if s.is_empty() || s.starts_with(char::is_whitespace) || s.ends_with(char::is_whitespace) {
        return None;
    }
    let v = match s.to_ascii_lowercase().as_str() {
        "inf" | "+inf" | "infinity" | "+infinity" => f64::INFINITY,
        "-inf" | "-infinity" => f64::NEG_INFINITY,
        _ => s.parse::<f64>().ok()?,
    };
    (!v.is_nan()).then_some(v)
}

/// A 64-bit integer as Redis reads one (`string2ll`: optional `-`, digits, no leading zero, no
/// `+`, no spaces).
fn parse_int(arg: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(arg).ok()?;
    let digits = s.strip_prefix('-').unwrap_or(s);
    if digits.is_empty()
        || !digits.bytes().all(|b| b.is_ascii_digit())
        || (digits.len() > 1 && digits.starts_with('0'))
        || s == "-0"
    {
        return None;
    }
    s.parse().ok()
}

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const NOT_INT: &str = "ERR value is not an integer or out of range";
const SYNTAX: &str = "ERR syntax error";
const NOT_FLOAT: &str = "ERR min or max is not a float";

/// `redis.REDIS_VERSION_NUM` of the server the stand-in plays (Redis 7.0.15): a server before
/// 7.0 has none.
const REDIS_VERSION_NUM: i64 = 0x07_00_0f;

/// The keyspace and the clock.
#[derive(Debug, Default)]
pub(crate) struct Db {
    keys: HashMap<Vec<u8>, Entry>,
    now_us: u64,
    /// How far the server's live clock runs ahead of the script's `TIME`, µs.
    lag_us: u64,
    /// Whether the server knows `PEXPIRETIME` (Redis 7.0 and later), else it answers it as an
    /// unknown command, as Redis 6.2 does.
    without_expiretime: bool,
}

/// What a key holds, for comparing two keyspaces: its type, its TTL class, and for strings the
/// value, for sorted sets the number of entries.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Shape {
    Str { value: Vec<u8>, ttl: bool },
    Zset { len: usize, ttl: bool },
}

impl Db {
    fn now_ms(&self) -> u64 {
        self.now_us / 1000
    }

    /// The live clock's millisecond: what Redis 7.0 counts `PX`, `PEXPIRE` and `PTTL` from.
    fn live_ms(&self) -> u64 {
        (self.now_us + self.lag_us) / 1000
    }

    /// The live entry under `key`; an expired one is removed first (as Redis's lazy expiry).
    fn live(&mut self, key: &[u8]) -> Option<&mut Entry> {
        let now_ms = self.now_ms();
        if self
            .keys
            .get(key)
            .is_some_and(|e| e.expires_ms.is_some_and(|at| now_ms > at))
        {
            self.keys.remove(key);
        }
        self.keys.get_mut(key)
    }

    /// Every live key and its shape, sorted.
    pub(crate) fn shapes(&mut self) -> Vec<(Vec<u8>, Shape)> {
        let names: Vec<Vec<u8>> = self.keys.keys().cloned().collect();
        let mut out = Vec::new();
        for name in names {
            if let Some(e) = self.live(&name) {
                let ttl = e.expires_ms.is_some();
                let shape = match &e.data {
                    Data::Str(v) => Shape::Str {
                        value: v.clone(),
                        ttl,
                    },
                    Data::Zset(z) => Shape::Zset {
                        len: z.scores.len(),
                        ttl,
                    },
                };
                out.push((name, shape));
            }
        }
        out.sort();
        out
    }

    /// The live keys without an expiry (every key the scripts write must have one).
    pub(crate) fn immortal_keys(&mut self) -> Vec<String> {
        self.shapes()
            .into_iter()
            .filter(|(_, s)| {
                !matches!(
                    s,
                    Shape::Str { ttl: true, .. } | Shape::Zset { ttl: true, .. }
                )
            })
            .map(|(k, _)| String::from_utf8_lossy(&k).into_owned())
            .collect()
    }

    /// Runs one command (`args[0]` is its name).
    #[allow(clippy::too_many_lines, reason = "one arm per command, each short")]
    pub(crate) fn command(&mut self, args: &[Vec<u8>]) -> Reply {
        let Some((name, args)) = args.split_first() else {
            return Reply::error(
                "ERR Please specify at least one argument for this redis lib call",
            );
        };
        let name = String::from_utf8_lossy(name).to_ascii_uppercase();
        let arity = |n: usize| args.len() == n;
        match name.as_str() {
            "TIME" if arity(0) => Reply::Array(vec![
                Reply::bulk((self.now_us / 1_000_000).to_string()),
                Reply::bulk((self.now_us % 1_000_000).to_string()),
            ]),
            "GET" if arity(1) => match self.live(&args[0]) {
                None => Reply::Nil,
                Some(Entry {
                    data: Data::Str(v), ..
                }) => Reply::Bulk(v.clone()),
                Some(_) => Reply::error(WRONGTYPE),
            },
            "SET" if args.len() >= 2 => {
                let mut expires_ms = None;
                let mut only_new = false;
                let mut rest = &args[2..];
                while let Some((opt, tail)) = rest.split_first() {
                    if opt.eq_ignore_ascii_case(b"NX") && !only_new {
                        only_new = true;
                        rest = tail;
                        continue;
                    }
                    let absolute = opt.eq_ignore_ascii_case(b"PXAT");
                    if !(absolute || opt.eq_ignore_ascii_case(b"PX"))
                        || tail.is_empty()
                        || expires_ms.is_some()
                    {
                        return Reply::error(SYNTAX);
                    }
                    match parse_int(&tail[0]) {
                        Some(ms) if ms > 0 && absolute => expires_ms = Some(ms.unsigned_abs()),
                        Some(ms) if ms > 0 => {
                            expires_ms = Some(self.live_ms() + ms.unsigned_abs());
                        }
                        Some(_) => {
                            return Reply::error("ERR invalid expire time in 'set' command");
                        }
                        None => return Reply::error(NOT_INT),
                    }
                    rest = &tail[1..];
                }
                // NX: nothing written over a live key, answered nil.
                if only_new && self.live(&args[0]).is_some() {
                    return Reply::Nil;
                }
                // An absolute expiry not after now: Redis sets nothing (and drops the key).
                if expires_ms.is_some_and(|at| at <= self.now_ms()) {
                    self.keys.remove(&args[0]);
                    return Reply::Status("OK".to_owned());
                }
                self.keys.insert(
                    args[0].clone(),
                    Entry {
                        data: Data::Str(args[1].clone()),
                        expires_ms,
                    },
                );
                Reply::Status("OK".to_owned())
            }
            // The stored expiry, absolute (Redis 7.0): no clock involved.
            "PEXPIRETIME" if arity(1) && !self.without_expiretime => match self.live(&args[0]) {
                None => Reply::Int(-2),
                Some(Entry {
                    expires_ms: None, ..
                }) => Reply::Int(-1),
                Some(Entry {
                    expires_ms: Some(at),
                    ..
                }) => Reply::Int(i64::try_from(*at).unwrap_or(i64::MAX)),
            },
            "PTTL" if arity(1) => {
                let now_ms = self.live_ms();
                match self.live(&args[0]) {
                    None => Reply::Int(-2),
                    Some(Entry {
                        expires_ms: None, ..
                    }) => Reply::Int(-1),
                    Some(Entry {
                        expires_ms: Some(at),
                        ..
                    }) => Reply::Int(i64::try_from(at.saturating_sub(now_ms)).unwrap_or(i64::MAX)),
                }
            }
            "PEXPIRE" if arity(2) => {
                let Some(ms) = parse_int(&args[1]) else {
                    return Reply::error(NOT_INT);
                };
                let now_ms = self.live_ms();
                if self.live(&args[0]).is_none() {
                    return Reply::Int(0);
                }
                let at = i64::try_from(now_ms).unwrap_or(i64::MAX).saturating_add(ms);
                if at <= i64::try_from(now_ms).unwrap_or(i64::MAX) {
                    // An expiry in the past deletes the key.
                    self.keys.remove(&args[0]);
                } else if let Some(e) = self.live(&args[0]) {
                    e.expires_ms = Some(at.unsigned_abs());
                }
                Reply::Int(1)
            }
            // An absolute expiry (the fixed window's clamp): from the script's clock, as SET's PXAT.
            "PEXPIREAT" if arity(2) => {
                let Some(at) = parse_int(&args[1]) else {
                    return Reply::error(NOT_INT);
                };
                if self.live(&args[0]).is_none() {
                    return Reply::Int(0);
                }
                if at <= i64::try_from(self.now_ms()).unwrap_or(i64::MAX) {
                    // An expiry in the past deletes the key.
                    self.keys.remove(&args[0]);
                } else if let Some(e) = self.live(&args[0]) {
                    e.expires_ms = Some(at.unsigned_abs());
                }
                Reply::Int(1)
            }
            "INCRBY" | "DECRBY" if arity(2) => {
                let Some(by) = parse_int(&args[1]) else {
                    return Reply::error(NOT_INT);
                };
                let by = if name == "DECRBY" {
                    match by.checked_neg() {
                        Some(n) => n,
                        None => return Reply::error("ERR decrement would overflow"),
                    }
                } else {
                    by
                };
                let (old, expires_ms) = match self.live(&args[0]) {
                    None => (0, None),
                    Some(Entry {
                        data: Data::Str(v),
                        expires_ms,
                    }) => match parse_int(v) {
                        Some(n) => (n, *expires_ms),
                        None => return Reply::error(NOT_INT),
                    },
                    Some(_) => return Reply::error(WRONGTYPE),
                };
                let Some(new) = old.checked_add(by) else {
                    return Reply::error("ERR increment or decrement would overflow");
                };
                self.keys.insert(
                    args[0].clone(),
                    Entry {
                        data: Data::Str(new.to_string().into_bytes()),
                        expires_ms,
                    },
                );
                Reply::Int(new)
            }
            "DEL" | "EXISTS" if !args.is_empty() => {
                let mut n = 0;
                for key in args {
                    if self.live(key).is_some() {
                        n += 1;
                        if name == "DEL" {
                            self.keys.remove(key);
                        }
                    }
                }
                Reply::Int(n)
            }
            "ZADD" if args.len() >= 3 && args.len() % 2 == 1 => {
                let mut pairs = Vec::new();
                for pair in args[1..].chunks(2) {
                    let Some(score) = std::str::from_utf8(&pair[0]).ok().and_then(parse_double)
                    else {
                        return Reply::error("ERR value is not a valid float");
                    };
                    pairs.push((score, pair[1].clone()));
                }
                let zset = match self.live(&args[0]) {
                    None => {
                        self.keys.insert(
                            args[0].clone(),
                            Entry {
                                data: Data::Zset(Zset::default()),
                                expires_ms: None,
                            },
                        );
                        match self.keys.get_mut(&args[0]) {
                            Some(Entry {
                                data: Data::Zset(z),
                                ..
                            }) => z,
                            _ => return Reply::error("ERR stand-in: lost a key"),
                        }
                    }
                    Some(Entry {
                        data: Data::Zset(z),
                        ..
                    }) => z,
                    Some(_) => return Reply::error(WRONGTYPE),
                };
                let added = pairs
                    .into_iter()
                    .filter(|(score, member)| zset.add(*score, member.clone()))
                    .count();
                Reply::Int(i64::try_from(added).unwrap_or(i64::MAX))
            }
            "ZCOUNT" | "ZREMRANGEBYSCORE" if arity(3) => {
                let (Some(lo), Some(hi)) = (Bound::parse(&args[1]), Bound::parse(&args[2])) else {
                    return Reply::error(NOT_FLOAT);
                };
                let zset = match self.live(&args[0]) {
                    None => return Reply::Int(0),
                    Some(Entry {
                        data: Data::Zset(z),
                        ..
                    }) => z,
                    Some(_) => return Reply::error(WRONGTYPE),
                };
                let members: Vec<Vec<u8>> = zset.in_range(lo, hi).map(|(_, m)| m.clone()).collect();
                if name == "ZREMRANGEBYSCORE" {
                    for m in &members {
                        zset.remove(m);
                    }
                    if zset.scores.is_empty() {
                        self.keys.remove(&args[0]);
                    }
                }
                Reply::Int(i64::try_from(members.len()).unwrap_or(i64::MAX))
            }
            // The concurrency limit's release (concurrency.lua's refund).
            "ZREM" if args.len() >= 2 => {
                let zset = match self.keys.get_mut(&args[0]) {
                    None => return Reply::Int(0),
                    Some(Entry {
                        data: Data::Zset(z),
                        ..
                    }) => z,
                    Some(_) => return Reply::error(WRONGTYPE),
                };
                let mut removed = 0;
                for member in &args[1..] {
                    if zset.scores.contains_key(member) {
                        zset.remove(member);
                        removed += 1;
                    }
                }
                if zset.scores.is_empty() {
                    self.keys.remove(&args[0]);
                }
                Reply::Int(removed)
            }
            "ZRANGE" if arity(3) || arity(4) => {
                let with_scores = match args.get(3) {
                    None => false,
                    Some(opt) if opt.eq_ignore_ascii_case(b"WITHSCORES") => true,
                    Some(_) => return Reply::error(SYNTAX),
                };
                let (Some(start), Some(stop)) = (parse_int(&args[1]), parse_int(&args[2])) else {
                    return Reply::error(NOT_INT);
                };
                let zset = match self.live(&args[0]) {
                    None => return Reply::Array(Vec::new()),
                    Some(Entry {
                        data: Data::Zset(z),
                        ..
                    }) => z,
                    Some(_) => return Reply::error(WRONGTYPE),
                };
                let len = i64::try_from(zset.ordered.len()).unwrap_or(i64::MAX);
                let start = if start < 0 {
                    (start + len).max(0)
                } else {
                    start
                };
                let stop = if stop < 0 {
                    stop + len
                } else {
                    stop.min(len - 1)
                };
                if start > stop || start >= len {
                    return Reply::Array(Vec::new());
                }
                let skip = usize::try_from(start).unwrap_or(0);
                let take = usize::try_from(stop - start + 1).unwrap_or(0);
                let items = zset.ordered.iter().skip(skip).take(take);
                Reply::Array(flatten(items, with_scores))
            }
            "ZSCORE" if arity(2) => match self.live(&args[0]) {
                None => Reply::Nil,
                Some(Entry {
                    data: Data::Zset(z),
                    ..
                }) => z
                    .scores
                    .get(&args[1])
                    .map_or(Reply::Nil, |score| Reply::bulk(g17(*score))),
                Some(_) => Reply::error(WRONGTYPE),
            },
            "ZRANGEBYSCORE" if args.len() >= 3 => {
                let (Some(lo), Some(hi)) = (Bound::parse(&args[1]), Bound::parse(&args[2])) else {
                    return Reply::error(NOT_FLOAT);
                };
                let mut with_scores = false;
                let mut limit: Option<(i64, i64)> = None;
                let mut rest = &args[3..];
                while let Some((opt, tail)) = rest.split_first() {
                    if opt.eq_ignore_ascii_case(b"WITHSCORES") {
                        with_scores = true;
                        rest = tail;
                    } else if opt.eq_ignore_ascii_case(b"LIMIT") && tail.len() >= 2 {
                        let (Some(offset), Some(count)) =
                            (parse_int(&tail[0]), parse_int(&tail[1]))
                        else {
                            return Reply::error(NOT_INT);
                        };
                        limit = Some((offset, count));
                        rest = &tail[2..];
                    } else {
                        return Reply::error(SYNTAX);
                    }
                }
                let zset = match self.live(&args[0]) {
                    None => return Reply::Array(Vec::new()),
                    Some(Entry {
                        data: Data::Zset(z),
                        ..
                    }) => z,
                    Some(_) => return Reply::error(WRONGTYPE),
                };
                let (offset, count) = limit.unwrap_or((0, -1));
                if offset < 0 {
                    return Reply::Array(Vec::new());
                }
                let skip = usize::try_from(offset).unwrap_or(usize::MAX);
                let take = usize::try_from(count).unwrap_or(usize::MAX);
                let items = zset.in_range(lo, hi).skip(skip).take(take);
                Reply::Array(flatten(items, with_scores))
            }
            // COPY keeps the value and the expiry (an absolute millisecond) as they are.
            "COPY" if arity(2) || arity(3) => {
                let replace = match args.get(2) {
                    None => false,
                    Some(opt) if opt.eq_ignore_ascii_case(b"REPLACE") => true,
                    Some(_) => return Reply::error(SYNTAX),
                };
                let Some(entry) = self.live(&args[0]).cloned() else {
                    return Reply::Int(0);
                };
                if !replace && self.live(&args[1]).is_some() {
                    return Reply::Int(0);
                }
                self.keys.insert(args[1].clone(), entry);
                Reply::Int(1)
            }
            // RENAME moves the value and its expiry, replacing the destination.
            "RENAME" if arity(2) => {
                if self.live(&args[0]).is_none() {
                    return Reply::error("ERR no such key");
                }
                if let Some(entry) = self.keys.remove(&args[0]) {
                    self.keys.insert(args[1].clone(), entry);
                }
                Reply::Status("OK".to_owned())
            }
            "TIME" | "GET" | "SET" | "PTTL" | "PEXPIRE" | "PEXPIREAT" | "INCRBY" | "DECRBY"
            | "DEL" | "EXISTS" | "ZADD" | "ZCOUNT" | "ZREMRANGEBYSCORE" | "ZRANGE"
            | "ZRANGEBYSCORE" | "ZREM" | "ZSCORE" | "COPY" | "RENAME" => Reply::Error(format!(
                "ERR wrong number of arguments for '{}' command",
                name.to_ascii_lowercase()
            )),
            other => Reply::Error(format!("ERR stand-in: unknown command '{other}'")),
        }
    }
}

fn flatten<'a>(items: impl Iterator<Item = &'a (Score, Vec<u8>)>, with_scores: bool) -> Vec<Reply> {
    let mut out = Vec::new();
    for (score, member) in items {
        out.push(Reply::Bulk(member.clone()));
        if with_scores {
            out.push(Reply::bulk(g17(score.0)));
        }
    }
    out
}

/// Redis 7.0's global protection: no global may be created or read that was not there.
const GLOBALS_PROTECTION: &str = r#"
local mt = {}
setmetatable(_G, mt)
mt.__newindex = function (t, n, v)
  error("Script attempted to create global variable '" .. tostring(n) .. "'", 2)
end
mt.__index = function (t, n)
  error("Script attempted to access nonexistent global variable '" .. tostring(n) .. "'", 2)
end
"#;

/// A library's environment, as Redis 7.0 gives one to `FUNCTION LOAD`: while the chunk
/// loads, only `redis.register_function` is there (no other global, no library such as
/// `string`); once loaded, its functions see the globals of a script (`redis.call` and the
/// rest). Creating a global is an error at any time.
const LIBRARY_ENV: &str = r#"
local globals, api, loading = ...
local env = {}
setmetatable(env, {
  __index = function (t, n)
    if loading[1] then
      if n == 'redis' then return api end
      error("Script attempted to access nonexistent global variable '" .. tostring(n) .. "'", 2)
    end
    return globals[n]
  end,
  __newindex = function (t, n, v)
    error("Attempt to modify a readonly table", 2)
  end,
})
return env
"#;

/// The part of Redis's `struct` library the scripts use: `struct.pack` of little-endian
/// unsigned bytes and doubles (`'<Bdd…'`, the prelude's `taken_row`); any other format is an
/// error, so a script that starts using more of it fails here until the stand-in plays that
/// too. A byte out of 0..=255 is an error too (Redis's wraps it).
fn struct_library(lua: &Lua) -> Table {
    let pack = lua
        .create_function(|lua, (format, numbers): (mlua::String, Variadic<f64>)| {
            let format = format.to_str()?.to_owned();
            let refuse = || mlua::Error::runtime(format!("stand-in: struct.pack {format:?}"));
            let Some(items) = format.strip_prefix('<') else {
                return Err(refuse());
            };
            if items.len() != numbers.len() {
                return Err(refuse());
            }
            let mut bytes = Vec::new();
            for (item, &n) in items.bytes().zip(numbers.iter()) {
                match item {
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    b'B' if (0.0..=255.0).contains(&n) && n.fract() == 0.0 => bytes.push(n as u8),
                    b'd' => bytes.extend_from_slice(&n.to_le_bytes()),
                    _ => return Err(refuse()),
                }
            }
            lua.create_string(&bytes)
        })
        .expect("struct.pack");
    let table = lua.create_table().expect("struct");
    table.raw_set("pack", pack).expect("set");
    table
}

/// A Lua 5.1 running scripts against a [`Db`], as Redis runs `EVAL`, and Functions libraries
/// as Redis runs `FUNCTION LOAD` and `FCALL`.
pub(crate) struct LuaRedis {
    lua: Lua,
    db: Arc<Mutex<Db>>,
    compiled: HashMap<String, Function>,
    /// The functions the loaded libraries registered, by name.
    functions: Arc<Mutex<HashMap<String, Function>>>,
    /// The libraries loaded, by their text.
    libraries: Vec<String>,
    /// The KEYS of the call running, which every key a command names must be one of (see
    /// [`LuaRedis::allow_undeclared_keys`]).
    declared: Arc<Mutex<Declared>>,
}

/// The keys a script may touch: those of its call's KEYS, unless `any`.
#[derive(Debug, Default)]
struct Declared {
    any: bool,
    keys: Vec<Vec<u8>>,
}

impl Declared {
    /// `Err` naming the first key of the command `argv` that the call did not declare.
    fn check(&self, argv: &[Vec<u8>]) -> Result<(), String> {
        if self.any {
            return Ok(());
        }
        let Some((command, rest)) = argv.split_first() else {
            return Ok(());
        };
        let command = String::from_utf8_lossy(command);
        for i in super::declared::key_args(&command, rest.len()) {
            if !self.keys.contains(&rest[i]) {
                return Err(format!(
                    "stand-in: {command} names the key `{}`, which the call did not declare in KEYS",
                    String::from_utf8_lossy(&rest[i])
                ));
            }
        }
        Ok(())
    }
}

impl std::fmt::Debug for LuaRedis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LuaRedis").finish_non_exhaustive()
    }
}

fn lock<T>(db: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    db.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A reply as the Lua value `redis.call` returns (an error reply is raised instead).
fn to_lua(lua: &Lua, reply: Reply) -> mlua::Result<Value> {
    Ok(match reply {
        #[allow(
            clippy::cast_precision_loss,
            reason = "as Redis: lua_pushnumber((lua_Number)n)"
        )]
        Reply::Int(n) => Value::Number(n as f64),
        Reply::Bulk(b) => Value::String(lua.create_string(&b)?),
        Reply::Nil => Value::Boolean(false),
        Reply::Array(items) => {
            let t = lua.create_table()?;
            for (i, item) in items.into_iter().enumerate() {
                t.raw_set(i + 1, to_lua(lua, item)?)?;
            }
            Value::Table(t)
        }
        Reply::Status(s) => {
            let t = lua.create_table()?;
            t.raw_set("ok", s)?;
            Value::Table(t)
        }
        Reply::Error(e) => return Err(mlua::Error::runtime(e)),
    })
}

/// A Lua value as the reply Redis makes of a script's return value.
fn from_lua(v: &Value) -> Reply {
    match v {
        Value::String(s) => Reply::Bulk(s.as_bytes().to_vec()),
        Value::Boolean(true) => Reply::Int(1),
        #[allow(
            clippy::cast_possible_truncation,
            reason = "as Redis: (long long)lua_tonumber"
        )]
        Value::Number(n) => Reply::Int(*n as i64),
        Value::Integer(n) => Reply::Int(*n),
        Value::Table(t) => {
            if let Ok(Value::String(e)) = t.raw_get::<Value>("err") {
                return Reply::Error(e.to_string_lossy());
            }
            if let Ok(Value::String(s)) = t.raw_get::<Value>("ok") {
                return Reply::Status(s.to_string_lossy());
            }
            let mut items = Vec::new();
            for i in 1.. {
                match t.raw_get::<Value>(i) {
                    Ok(Value::Nil) | Err(_) => break,
                    Ok(v) => items.push(from_lua(&v)),
                }
            }
            Reply::Array(items)
        }
        _ => Reply::Nil,
    }
}

/// A command argument as Redis makes one of a Lua value.
fn to_arg(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::String(s) => Some(s.as_bytes().to_vec()),
        #[allow(clippy::cast_precision_loss, reason = "a Lua 5.1 number is a double")]
        Value::Integer(n) => Some(g17(*n as f64).into_bytes()),
        Value::Number(n) => Some(g17(*n).into_bytes()),
        _ => None,
    }
}

impl LuaRedis {
    /// A fresh interpreter with an empty keyspace at time 0.
    pub(crate) fn new() -> Self {
        let lua = Lua::new_with(
            StdLib::TABLE | StdLib::STRING | StdLib::MATH,
            LuaOptions::default(),
        )
        .expect("a Lua 5.1 state");
        let db = Arc::new(Mutex::new(Db::default()));
        let declared = Arc::new(Mutex::new(Declared::default()));
        let redis = lua.create_table().expect("a table");
        let call_db = Arc::clone(&db);
        let call_declared = Arc::clone(&declared);
        let call = lua
            .create_function(move |lua, args: Variadic<Value>| {
                let mut argv = Vec::with_capacity(args.len());
                for a in args.iter() {
                    match to_arg(a) {
                        Some(bytes) => argv.push(bytes),
                        None => {
                            return Err(mlua::Error::runtime(
                                "Lua redis lib command arguments must be strings or integers",
                            ));
                        }
                    }
                }
                lock(&call_declared)
                    .check(&argv)
                    .map_err(mlua::Error::runtime)?;
                let reply = lock(&call_db).command(&argv);
                to_lua(lua, reply)
            })
            .expect("redis.call");
        redis.raw_set("call", call).expect("set");
        // `redis.pcall`: an error reply is returned as `{err = …}` instead of raised (the
        // scripts never use it; the command-level comparison with a real server does).
        let pcall_db = Arc::clone(&db);
        let pcall_declared = Arc::clone(&declared);
        let pcall = lua
            .create_function(move |lua, args: Variadic<Value>| {
                let argv: Option<Vec<Vec<u8>>> = args.iter().map(to_arg).collect();
                let Some(argv) = argv else {
                    return Err(mlua::Error::runtime(
                        "Lua redis lib command arguments must be strings or integers",
                    ));
                };
                lock(&pcall_declared)
                    .check(&argv)
                    .map_err(mlua::Error::runtime)?;
                match lock(&pcall_db).command(&argv) {
                    Reply::Error(e) => {
                        let t = lua.create_table()?;
                        t.raw_set("err", e)?;
                        Ok(Value::Table(t))
                    }
                    reply => to_lua(lua, reply),
                }
            })
            .expect("redis.pcall");
        redis.raw_set("pcall", pcall).expect("set");
        let error_reply = lua
            .create_function(|lua, msg: mlua::String| {
                let t = lua.create_table()?;
                t.raw_set("err", msg)?;
                Ok(t)
            })
            .expect("redis.error_reply");
        redis.raw_set("error_reply", error_reply).expect("set");
        let status_reply = lua
            .create_function(|lua, msg: mlua::String| {
                let t = lua.create_table()?;
                t.raw_set("ok", msg)?;
                Ok(t)
            })
            .expect("redis.status_reply");
        redis.raw_set("status_reply", status_reply).expect("set");
        let replicate = lua
            .create_function(|_, ()| Ok(true))
            .expect("redis.replicate_commands");
        redis.raw_set("replicate_commands", replicate).expect("set");
        redis
            .raw_set("REDIS_VERSION_NUM", REDIS_VERSION_NUM)
            .expect("set");
        lua.globals().raw_set("redis", redis).expect("set");
        lua.globals()
            .raw_set("struct", struct_library(&lua))
            .expect("set");
        lua.globals().raw_set("KEYS", Value::Nil).expect("set");
        lua.load(GLOBALS_PROTECTION)
            .exec()
            .expect("globals protection");
        Self {
            lua,
            db,
            compiled: HashMap::new(),
            functions: Arc::new(Mutex::new(HashMap::new())),
            libraries: Vec::new(),
            declared,
        }
    }

    /// Lets scripts touch keys their call did not declare (a test script of commands, not one
    /// of the stores' scripts, which may touch only their KEYS: a command naming another key
    /// raises an error, as a server that checks declared keys does).
    pub(crate) fn allow_undeclared_keys(&mut self) {
        lock(&self.declared).any = true;
    }

    /// The keys the next call may touch.
    fn declare(&self, keys: &[Vec<u8>]) {
        keys.clone_into(&mut lock(&self.declared).keys);
    }

    /// `FUNCTION LOAD REPLACE text`, as Redis 7.0 does it: the first line is the shebang
    /// (`#!lua name=<library>`), the rest a chunk run once, in an environment where only
    /// `redis.register_function(name, function)` exists; the functions it registers are
    /// then called by [`LuaRedis::fcall`]. A text loaded before is not run again.
    pub(crate) fn load_library(&mut self, text: &str) -> Result<(), String> {
        if self.libraries.iter().any(|l| l == text) {
            return Ok(());
        }
        let (shebang, code) = text.split_once('\n').unwrap_or((text, ""));
        if !shebang.starts_with("#!lua name=") {
            return Err(format!("ERR Missing library metadata: {shebang}"));
        }
        let lua = &self.lua;
        let run = || -> mlua::Result<()> {
            let loading = lua.create_table()?;
            loading.raw_set(1, true)?;
            let api = lua.create_table()?;
            let registry = Arc::clone(&self.functions);
            let register = lua.create_function(move |_, (name, f): (String, Function)| {
                let mut functions = registry.lock().unwrap_or_else(PoisonError::into_inner);
                functions.insert(name, f);
                Ok(())
            })?;
            api.raw_set("register_function", register)?;
            let env: Table = lua
                .load(LIBRARY_ENV)
                .call((lua.globals(), api, loading.clone()))?;
            lua.load(code)
                .set_name("@user_function")
                .set_environment(env)
                .exec()?;
            loading.raw_set(1, false)?;
            Ok(())
        };
        run().map_err(|e| format!("ERR Error registering functions: {e}"))?;
        self.libraries.push(text.to_owned());
        Ok(())
    }

    /// `FCALL function numkeys keys… args…`: the function gets the keys and arguments as its
    /// two tables (KEYS and ARGV are no globals there); the reply as `eval` makes it.
    pub(crate) fn fcall(&mut self, function: &str, keys: &[Vec<u8>], argv: &[Vec<u8>]) -> Reply {
        let f = self
            .functions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(function)
            .cloned();
        let Some(f) = f else {
            return Reply::Error("ERR Function not found".to_owned());
        };
        self.declare(keys);
        let array = |items: &[Vec<u8>]| -> mlua::Result<Table> {
            let t = self.lua.create_table()?;
            for (i, item) in items.iter().enumerate() {
                t.raw_set(i + 1, self.lua.create_string(item)?)?;
            }
            Ok(t)
        };
        let tables = match array(keys).and_then(|k| Ok((k, array(argv)?))) {
            Ok(tables) => tables,
            Err(e) => return Reply::Error(format!("ERR stand-in: {e}")),
        };
        match f.call::<MultiValue>(tables) {
            Ok(values) => values.iter().next().map_or(Reply::Nil, from_lua),
            Err(e) => Reply::Error(format!("ERR Error running function: {e}")),
        }
    }

    /// Sets `TIME`, in µs.
    pub(crate) fn set_time_us(&self, now_us: u64) {
        lock(&self.db).now_us = now_us;
    }

    /// Sets how far the live clock runs ahead of `TIME` for relative expiries and `PTTL`, µs
    /// (a server paused mid-script; see the module's docs).
    pub(crate) fn set_lag_us(&self, lag_us: u64) {
        lock(&self.db).lag_us = lag_us;
    }

    /// Makes the server a Redis 6.2: `PEXPIRETIME` an unknown command (the scripts then read
    /// an expiry from `PTTL` and the clock), and no `redis.REDIS_VERSION_NUM`.
    pub(crate) fn set_without_expiretime(&self, without: bool) {
        lock(&self.db).without_expiretime = without;
        let redis: Table = self
            .lua
            .globals()
            .raw_get("redis")
            .expect("the redis table");
        let version = if without {
            Value::Nil
        } else {
            Value::Integer(REDIS_VERSION_NUM)
        };
        redis.raw_set("REDIS_VERSION_NUM", version).expect("set");
    }

    /// The keyspace (to inspect or run commands directly).
    pub(crate) fn db(&self) -> std::sync::MutexGuard<'_, Db> {
        lock(&self.db)
    }

    /// `EVAL script numkeys keys… args…`: the reply, or the script's error as an error reply.
    pub(crate) fn eval(&mut self, script: &str, keys: &[Vec<u8>], argv: &[Vec<u8>]) -> Reply {
        let function = match self.compiled.get(script) {
            Some(f) => f.clone(),
            None => match self
                .lua
                .load(script)
                .set_name("@user_script")
                .into_function()
            {
                Ok(f) => {
                    self.compiled.insert(script.to_owned(), f.clone());
                    f
                }
                Err(e) => return Reply::Error(format!("ERR Error compiling script: {e}")),
            },
        };
        let array = |items: &[Vec<u8>]| -> mlua::Result<Table> {
            let t = self.lua.create_table()?;
            for (i, item) in items.iter().enumerate() {
                t.raw_set(i + 1, self.lua.create_string(item)?)?;
            }
            Ok(t)
        };
        self.declare(keys);
        let globals = self.lua.globals();
        let set = array(keys)
            .and_then(|k| globals.raw_set("KEYS", k))
            .and_then(|()| array(argv))
            .and_then(|a| globals.raw_set("ARGV", a));
        if let Err(e) = set {
            return Reply::Error(format!("ERR stand-in: {e}"));
        }
        match function.call::<MultiValue>(()) {
            Ok(values) => values.iter().next().map_or(Reply::Nil, from_lua),
            Err(e) => Reply::Error(format!("ERR Error running script: {e}")),
        }
    }
}

#[test]
fn g17_formats_as_printf() {
    for (x, s) in [
        (0.1, "0.10000000000000001"),
        (1_700_000_000_000_001.0, "1700000000000001"),
        (1e20, "1e+20"),
        (123_456_789_012_345_680.0, "1.2345678901234568e+17"),
        (0.5, "0.5"),
        (-2.0, "-2"),
        (1e-5, "1.0000000000000001e-05"),
        (0.000_123, "0.00012300000000000001"),
        (0.25, "0.25"),
    ] {
        assert_eq!(g17(x), s, "{x}");
    }
}
