//! The fixed windows' fast path (`scripts/fixed_only.lua`: a call of fixed-window limits only,
//! on distinct keys) held to the rule it is a second home of, and the test that they are: every mutant of the
//! fast path's text in [`MUTANTS`] is caught by the same checks that the real text passes.
//!
//! The checks: random traces of takes (with and without a call id), refunds, settles and peeks
//! on one or two fixed-window limits against the Rust rules ([`Model`]), the clock set back
//! now and then; blocks and resets against the memory store; a take replayed under its call
//! id; and, from planted states and arguments the rule does not decide itself (a counter
//! without a TTL, a negative count, a TTL longer than a period, a value that is not a counter,
//! another type, a cost above the limit, a wrong block marker or receipt), the fast path
//! against the driver on the same state: the same reply and the same keys after.

use std::collections::BTreeMap;
use std::time::Duration;

use ratelimit_runtime::algorithm::{Receipt, fixed};
use ratelimit_runtime::store::redis::{ReplyReceipt, eval_form};
use ratelimit_runtime::{Algorithm, Policy, Store, StoreError, Verdict, store::Check};

use super::lua_store::{LuaStore, Mode};
use super::model::Model;
use super::scripts::{Sources, sources};
use super::standin::Reply;
use super::trace::{self, Rng};
use super::{EPOCH_US, START_US, back_floor, describe, note_whole, retry_of};

/// The fast path's text, as the runtime embeds it.
const FIXED_ONLY: &str = include_str!("../../../../ratelimit-runtime/src/scripts/fixed_only.lua");

/// Mutants of `fixed_only.lua`: (what it breaks, the text, its replacement). Each must be
/// caught by [`differs`].
const MUTANTS: &[(&str, &str, &str)] = &[
    (
        "admits one unit over the limit",
        "if n > p.limit then",
        "if n > p.limit + 1 then",
    ),
    (
        "rejects a call that fits exactly",
        "if n > p.limit then",
        "if n >= p.limit then",
    ),
    (
        "a rejected call keeps its units",
        "    redis_call('DECRBY', key, p.cost_text)\n    return { 0,",
        "    return { 0,",
    ),
    (
        "skips a block",
        "    found = redis_call('EXISTS', KEYS[2])\n",
        "    found = 0\n",
    ),
    (
        "a stack's undo reads whether an earlier call created a key",
        "      fresh[i] = false\n",
        "",
    ),
    (
        "a stack's undo deletes a counter it found without a TTL",
        "      fresh[i] = count == 0\n",
        "      fresh[i] = true\n",
    ),
    (
        "a stacked call's reply holds a row past its limits",
        "  return packed_rows(rows)\nend",
        "  return packed_rows(rows + 2)\nend",
    ),
    (
        "a stacked call that opens no window answers a row past its limits",
        "    return packed_rows(rows)\n  end",
        "    return packed_rows(rows + 2)\n  end",
    ),
    (
        "a stacked call that opens a window gives it no TTL",
        "  if not (timed or opened) then",
        "  if not timed then",
    ),
    (
        "a stack of three without receipts answers one more remaining",
        "rows = add_taken(rows, limits[i].p.limit - counts[i], left[i] * 1000 + 1000)",
        "rows = add_taken(rows, limits[i].p.limit - counts[i] + 1, left[i] * 1000 + 1000)",
    ),
    (
        "a stack of three without receipts answers its waits a millisecond early",
        "rows = add_taken(rows, limits[i].p.limit - counts[i], left[i] * 1000 + 1000)",
        "rows = add_taken(rows, limits[i].p.limit - counts[i], left[i] * 1000)",
    ),
    (
        "a stack of two answers one more remaining on its first limit",
        "1, limits[1].p.limit - counts[1],",
        "1, limits[1].p.limit - counts[1] + 1,",
    ),
    (
        "a stack of two answers its second limit's wait a millisecond early",
        "left[2] * 1000 + 1000)",
        "left[2] * 1000)",
    ),
    (
        "a stack of two answers its first limit's row twice",
        "left[1] * 1000 + 1000, limits[2].p.limit - counts[2], left[2]",
        "left[1] * 1000 + 1000, limits[1].p.limit - counts[1], left[1]",
    ),
    (
        "a stack of three answered as a stack of two",
        "    if n == 2 then\n      return struct_pack('<Bdddd'",
        "    if n >= 2 then\n      return struct_pack('<Bdddd'",
    ),
    (
        "a stack without receipts that opens a window answers one more remaining",
        "      rows = add_taken(rows, l.p.limit - counts[i], wait)\n",
        "      rows = add_taken(rows, l.p.limit - counts[i] + 1, wait)\n",
    ),
    (
        "takes a replayed call again",
        "found = redis_call('EXISTS', KEYS[2], KEYS[3])",
        "found = redis_call('EXISTS', KEYS[2])",
    ),
    (
        "a new window (with a call id) ends a millisecond late",
        "int(floor_div(now, 1000) + period_ms))",
        "int(floor_div(now, 1000) + period_ms + 1))",
    ),
    (
        "a new window has no TTL",
        "      redis_call('PEXPIRE', key, l.period_ms_text)\n",
        "",
    ),
    (
        "a new window (with a call id) has no TTL",
        "      redis_call('PEXPIREAT', key, int(floor_div(now, 1000) + period_ms))\n",
        "",
    ),
    (
        "a wait a millisecond early",
        "local left = pttl * 1000 + 1000",
        "local left = pttl * 1000",
    ),
    (
        "a receipt's reset in whole milliseconds",
        "{ after_reset = left - math_fmod(now, 1000) }",
        "{ after_reset = left }",
    ),
    (
        "a blocked call handed to the driver answers its waits from the microsecond",
        "  if found > 0 then\n    return check(KEYS, ARGV, true)",
        "  if found > 0 then\n    return check(KEYS, ARGV)",
    ),
    (
        "keeps a TTL longer than a period",
        "count < 0 or pttl > period_ms",
        "count < 0",
    ),
    (
        "counts on from a negative count",
        "count < 0 or pttl > period_ms",
        "pttl > period_ms",
    ),
    (
        "reads the expiry as PTTL with a call id",
        "  local at = expiry_ms(key)\n  return at and at - floor_div(now, 1000)",
        "  local at = redis_call('PTTL', key)\n  return at >= 0 and at or nil",
    ),
    (
        "counts on from a counter without a TTL",
        "    if count ~= 0 then\n      -- A counter without a TTL",
        "    if false then\n      -- A counter without a TTL",
    ),
    (
        "one more remaining after a take",
        "return struct_pack(TAKEN_ROW, 1, p.limit - n, left)",
        "return struct_pack(TAKEN_ROW, 1, p.limit - n + 1, left)",
    ),
    (
        "a rejection reports the remaining after the call",
        "clamp(p.limit - count)",
        "clamp(p.limit - n)",
    ),
    (
        "leaves no receipt",
        "write_receipt(KEYS[3], l, { after_reset = left - math_fmod(now, 1000) })",
        "local _ = l",
    ),
    (
        "writes a receipt under a name not its own",
        " or KEYS[3] ~= receipt_key(key, call_id, 1)",
        "",
    ),
    (
        "an admitted call's reply waits a microsecond more",
        "return struct_pack(TAKEN_ROW, 1, p.limit - n, left)",
        "return struct_pack(TAKEN_ROW, 1, p.limit - n, left + 1)",
    ),
    (
        "an admitted call's reply with receipts counts one unit more left",
        "return taken_row(p.limit - n, left, receipt_at(key, pttl, timed), left, 0)",
        "return taken_row(p.limit - n + 1, left, receipt_at(key, pttl, timed), left, 0)",
    ),
    (
        "a receipt in the reply starts a millisecond late",
        "return (at - pttl) * 1000",
        "return (at - pttl + 1) * 1000",
    ),
    (
        "a receipt in the reply ends a millisecond early",
        "receipt_at(key, pttl, timed), left, 0)",
        "receipt_at(key, pttl, timed), left - 1000, 0)",
    ),
    (
        "a receipt in the reply, without PEXPIRETIME, at the take's microsecond",
        "  return now - math_fmod(now, 1000)\nend",
        "  return now\nend",
    ),
    (
        "a receipt in the reply (stacked) at the take's microsecond",
        "        now - math_fmod(now, 1000), wait, 0)",
        "        now, wait, 0)",
    ),
    (
        "a new window (receipts in the reply) ends at the live clock's",
        "    if timed or receipts_in_reply then\n",
        "    if timed then\n",
    ),
    (
        "takes with a wrong block marker",
        "if KEYS[2] ~= key .. ':b' then",
        "if false then",
    ),
    (
        "takes another algorithm's limit, or a cost above the limit, as a fixed window",
        "local period_ms = l and l.fixed_ms\n",
        "local period_ms = l and (l.fixed_ms or l.p.period / 1000)\n",
    ),
    (
        "a stack takes another algorithm's limit as a fixed window",
        "if l == nil or l.fixed_ms == nil then",
        "if l == nil then",
    ),
    (
        "a stack admits one unit over a limit",
        "got > p.limit then",
        "got > p.limit + 1 then",
    ),
    (
        "a rejected stack keeps its units",
        "        redis_call('DECRBY', KEYS[i], limits[i].p.cost_text)\n",
        "",
    ),
    (
        "a rejected stack keeps the keys it created",
        "        redis_call('DEL', KEYS[i])\n",
        "",
    ),
    (
        "a stack takes a replayed call again",
        "    asked = asked + 1\n",
        "",
    ),
    (
        "a stack skips a block",
        "if redis_call('EXISTS', unpack(KEYS, n + 1, asked)) > 0",
        "if false",
    ),
    (
        "a stack takes a key named twice twice",
        "      if KEYS[j] == key then",
        "      if false then",
    ),
    (
        "a stack's new window has no TTL",
        "        redis_call('PEXPIRE', KEYS[i], l.period_ms_text)\n",
        "",
    ),
    (
        "a stack leaves no receipts",
        "write_receipt(KEYS[2 * n + i], l, { after_reset = wait - math_fmod(now, 1000) })",
        "local _ = wait",
    ),
    (
        "a stack's waits a millisecond early",
        "local wait = pttl * 1000 + 1000",
        "local wait = pttl * 1000",
    ),
    (
        "reads a counter without a TTL as a live window",
        "    pttl = redis_call('PTTL', key)\n    if pttl < 0 then",
        "    pttl = redis_call('PTTL', key)\n    if pttl < -1 then",
    ),
    (
        "a stack reads a counter without a TTL as a live window",
        "      pttl = redis_call('PTTL', key)\n      if pttl < 0 then",
        "      pttl = redis_call('PTTL', key)\n      if pttl < -1 then",
    ),
    (
        "a stack keeps a TTL longer than a period",
        "count < 0 or pttl > l.fixed_ms or",
        "count < 0 or",
    ),
];

/// The store's sources with `fixed_only.lua`'s `from` replaced by `to` (once; it must occur
/// exactly once), in the library and, in its `EVAL` form, in the script.
fn mutated(from: &str, to: &str) -> Sources {
    assert_eq!(FIXED_ONLY.matches(from).count(), 1, "mutant text {from:?}");
    let text = FIXED_ONLY.replacen(from, to, 1);
    let mut s = sources();
    let (eval_file, eval_text) = (eval_form(FIXED_ONLY), eval_form(&text));
    for (t, file, text) in [
        (&mut s.library, FIXED_ONLY, text.as_str()),
        (&mut s.fixed_only, eval_file.as_str(), eval_text.as_str()),
    ] {
        assert_eq!(t.matches(file).count(), 1);
        *t = t.replacen(file, text, 1);
    }
    s
}

/// Whether the code in `sources` differs from the rules anywhere in the checks (the first
/// difference, described).
fn differs(sources: &Sources) -> Result<(), String> {
    for t in 0..24 {
        model_trace(sources, 0xFA57_0000 + t)?;
    }
    for t in 0..8 {
        block_trace(sources, 0xB10C_FA57 + t)?;
    }
    replayed_take(sources)?;
    for paused in [0, 1] {
        paused_take(sources, paused, false)?;
        paused_take(sources, paused, true)?;
    }
    receipts_in_reply_are_the_keys_receipts(sources, false)?;
    // On a server without PEXPIRETIME (Redis 6.2), which the scripts read expiries from the
    // clock and PTTL on.
    for t in 0..4 {
        model_trace_on(sources, 0xFA57_6200 + t, true)?;
    }
    receipts_in_reply_are_the_keys_receipts(sources, true)?;
    planted_states(sources)
}

/// The real fast path passes every check, and each mutant fails one.
#[test]
fn the_fixed_window_fast_path_decides_as_the_rule_and_its_mutants_do_not() {
    differs(&sources()).unwrap_or_else(|e| panic!("the fast path differs from the rule: {e}"));
    let mut survivors = Vec::new();
    for (what, from, to) in MUTANTS {
        if differs(&mutated(from, to)).is_ok() {
            survivors.push(*what);
        }
    }
    assert!(survivors.is_empty(), "mutants not caught: {survivors:?}");
}

fn lua_store(sources: &Sources) -> LuaStore {
    LuaStore::with_sources(EPOCH_US + START_US, Mode::Functions, sources.clone())
}

/// A fixed-window limit of the traces.
fn fixed_limit(rng: &mut Rng, i: usize) -> (String, Policy) {
    (
        format!("f{i}:{{tag}}"),
        trace::policy(rng, Algorithm::Fixed),
    )
}

/// Takes (with and without a call id), refunds, settles and peeks on fixed-window limits, one
/// or a stack of two or three (so that a call of fewer limits follows one of more), against
/// [`Model`].
fn model_trace(sources: &Sources, seed: u64) -> Result<(), String> {
    model_trace_on(sources, seed, false)
}

/// [`model_trace`] on a server with or without `PEXPIRETIME` (Redis 7.0 and later, 6.2).
#[allow(
    clippy::too_many_lines,
    reason = "one trace loop: the operations side by side"
)]
fn model_trace_on(sources: &Sources, seed: u64, without_expiretime: bool) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let limits = [
        fixed_limit(&mut rng, 0),
        fixed_limit(&mut rng, 1),
        fixed_limit(&mut rng, 2),
    ];
    let lua = lua_store(sources);
    lua.lua().set_without_expiretime(without_expiretime);
    let mut model = Model::default();
    model.now = START_US;
    let period = limits
        .iter()
        .map(|(_, p)| p.period_ms() * 1000)
        .max()
        .unwrap_or(1000);
    let mut taken: Vec<(String, Vec<(usize, Policy)>)> = Vec::new();
    // The receipts of the takes that had them in their reply, by call id.
    let mut in_reply: BTreeMap<String, Vec<ReplyReceipt>> = BTreeMap::new();
    let mut whole_at = BTreeMap::new();
    let mut retry = 0;
    for step in 0..150_u64 {
        let mut now = model.now + trace::step(&mut rng, model.now, period, 1, retry);
        if rng.chance(4) {
            now = now
                .saturating_sub(rng.between(1, 2 * period))
                .max(back_floor(&whole_at, now));
        }
        model.now = now;
        lua.lua().set_time_us(EPOCH_US + now);
        let op = rng.below(100);
        let mut mismatch: Option<String> = None;
        let fresh = |rng: &mut Rng| -> Vec<(usize, Policy)> {
            let which: Vec<usize> = if rng.chance(30) {
                if rng.chance(50) {
                    vec![0, 1, 2]
                } else {
                    vec![0, 1]
                }
            } else {
                vec![usize::try_from(rng.below(3)).unwrap_or(0)]
            };
            which
                .into_iter()
                .map(|i| {
                    let p = &limits[i].1;
                    (i, p.with_cost(trace::cost(rng, p)).expect("cost"))
                })
                .collect()
        };
        let chosen: Vec<(usize, Policy)> = if op < 80 || taken.is_empty() {
            fresh(&mut rng)
        } else {
            taken[usize::try_from(rng.below(taken.len() as u64)).unwrap_or(0)]
                .1
                .clone()
        };
        let checks: Vec<Check<'_>> = chosen
            .iter()
            .map(|(i, p)| Check::new(&limits[*i].0, p))
            .collect();
        let (what, rust, script): (String, Verdict, Result<Verdict, StoreError>) = if op < 45 {
            (
                "take".into(),
                model.take(&checks, None),
                lua.take(&checks, None),
            )
        } else if (op < 80 || taken.is_empty()) && rng.chance(40) {
            // The receipts in the reply: the model takes under the id as with receipt keys.
            let id = format!("{seed:x}{step:x}");
            taken.push((id.clone(), chosen.clone()));
            let r = model.take_in_reply(&checks, &id);
            let expected = if r.is_admitted() {
                model.replied(&checks, &id, EPOCH_US)
            } else {
                Vec::new()
            };
            let l = lua.take_in_reply(&checks).map(|(verdict, receipts)| {
                if receipts != expected {
                    mismatch = Some(format!("receipts {receipts:?}, the rule's {expected:?}"));
                }
                in_reply.insert(id.clone(), receipts);
                verdict
            });
            (format!("take~ {id}"), r, l)
        } else if op < 80 || taken.is_empty() {
            let id = format!("{seed:x}{step:x}");
            taken.push((id.clone(), chosen.clone()));
            let (r, l) = (model.take(&checks, Some(&id)), lua.take(&checks, Some(&id)));
            (format!("take {id}"), r, l)
        } else {
            let id = taken
                .iter()
                .rfind(|(_, c)| *c == chosen)
                .map(|(id, _)| id.clone())
                .unwrap_or_default();
            match (op, in_reply.get(&id)) {
                // A take whose receipts came in its reply is only ever returned by them (a
                // rejected one, which has none, is peeked at instead: the last arm).
                (80..=96, Some(receipts)) if !receipts.is_empty() => {
                    let (r, l) = (
                        model.compensate(&checks, Some(&id)),
                        lua.give_back(&checks, &id, receipts),
                    );
                    (format!("return {id}"), r, l)
                }
                (80..=91, None) => {
                    let (r, l) = (
                        model.compensate(&checks, Some(&id)),
                        lua.compensate(&checks, Some(&id)),
                    );
                    (format!("refund {id}"), r, l)
                }
                (92..=96, None) => {
                    let actual: Vec<u64> = checks
                        .iter()
                        .map(|c| rng.between(0, 2 * c.policy.cost()))
                        .collect();
                    let (r, l) = (
                        model.settle(&checks, &id, &actual),
                        lua.settle(&checks, &id, &actual),
                    );
                    (format!("settle {id} {actual:?}"), r, l)
                }
                _ => (
                    "peek".into(),
                    model.compensate(&checks, None),
                    lua.compensate(&checks, None),
                ),
            }
        };
        match &script {
            Ok(v) if *v == rust && mismatch.is_none() => {}
            _ => {
                return Err(format!(
                    "seed {seed:#x} step {step} at {now} µs: {what} {}\n  rust: {rust:?}\n  lua:  {script:?}{}",
                    describe(&checks),
                    mismatch.map(|m| format!("\n  {m}")).unwrap_or_default()
                ));
            }
        }
        // Reading every key drops the expired ones, as Redis's active expiry does: the model
        // drops its own alike.
        let immortal = lua.lua().db().immortal_keys();
        model.sweep();
        if !immortal.is_empty() {
            return Err(format!(
                "seed {seed:#x} step {step}: keys without a TTL: {immortal:?}"
            ));
        }
        // A take's waits count from the start of now's millisecond (the others' from now).
        let from = if what.starts_with("take") {
            now - now % 1000
        } else {
            now
        };
        note_whole(&mut whole_at, &checks, &rust, from);
        retry = retry_of(&rust);
    }
    Ok(())
}

/// Checks, blocks and resets of one fixed-window limit against the memory store.
fn block_trace(sources: &Sources, seed: u64) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let (key, policy) = fixed_limit(&mut rng, 0);
    let mut pair = super::Pair::with_sources(sources);
    let period = policy.period_ms() * 1000;
    let mut retry = 0;
    for step in 0..120 {
        let now = pair.now + trace::step(&mut rng, pair.now, period, 1, retry);
        pair.set(now);
        let p = policy
            .with_cost(trace::cost(&mut rng, &policy))
            .expect("cost");
        let roll = rng.below(100);
        let keys = [key.as_str()];
        let memory: &dyn Store = &pair.memory;
        let lua: &dyn Store = &pair.lua;
        if roll < 10 {
            let ms = rng.between(1, (2 * period / 1000).max(2));
            pair.runtime.block_on(async {
                memory
                    .block(&keys, Duration::from_millis(ms))
                    .await
                    .unwrap();
                lua.block(&keys, Duration::from_millis(ms)).await.unwrap();
            });
            continue;
        }
        if roll < 14 {
            pair.runtime.block_on(async {
                memory.reset(&keys).await.unwrap();
                lua.reset(&keys).await.unwrap();
            });
            continue;
        }
        let checks = [Check::new(&key, &p)];
        let (m, l, _) = pair.check(&checks);
        if m.as_ref().ok() != l.as_ref().ok() {
            return Err(format!(
                "seed {seed:#x} step {step} at {now} µs: {}\n  memory: {m:?}\n  lua:    {l:?}",
                describe(&checks)
            ));
        }
        retry = m.map_or(0, |v| retry_of(&v));
    }
    Ok(())
}

/// A take sent again under the same call id (a retry after a timeout) is not taken twice: it
/// reads the limit as the first take left it.
fn replayed_take(sources: &Sources) -> Result<(), String> {
    let lua = lua_store(sources);
    let p = Policy::new(Algorithm::Fixed, 5, Duration::from_secs(10)).expect("valid");
    let checks = [Check::new("replayed", &p)];
    let first = lua.take(&checks, Some("abc")).map_err(|e| e.to_string())?;
    let again = lua.take(&checks, Some("abc")).map_err(|e| e.to_string())?;
    let after = lua.compensate(&checks, None).map_err(|e| e.to_string())?;
    let left = |v: &Verdict| v.decisions()[0].remaining;
    if left(&first) != 4 || left(&again) != 4 || left(&after) != 4 {
        return Err(format!(
            "a replayed take: {first:?}, then {again:?}, then {after:?}"
        ));
    }
    Ok(())
}

/// A take under a call id (or with its receipts in the reply, `in_reply`), the `paused`th of
/// three, on a server paused mid-script (its live clock 5 ms past the script's), opening a
/// window (0) or in one an earlier call opened (1), then refunded: the replies, the receipt and
/// the refund are the rule's, read from the window's stored end, not from the live clock.
fn paused_take(sources: &Sources, paused: usize, in_reply: bool) -> Result<(), String> {
    let lua = lua_store(sources);
    let mut model = Model::default();
    let p = Policy::new(Algorithm::Fixed, 5, Duration::from_secs(10)).expect("valid");
    let checks = [Check::new("paused", &p)];
    let mut answers = Vec::new();
    let mut paused_receipts = Vec::new();
    let ids = ["a1", "a2", "a3"];
    for (step, id) in ids.into_iter().enumerate() {
        let lag = if step == paused { 5000 } else { 0 };
        let now = START_US + 1_000_250 * step as u64;
        model.now = now;
        lua.lua().set_time_us(EPOCH_US + now);
        lua.lua().set_lag_us(lag);
        let (rust, script) = if in_reply {
            let rust = model.take_in_reply(&checks, id);
            let (verdict, receipts) = lua.take_in_reply(&checks).map_err(|e| e.to_string())?;
            let rule = model.replied(&checks, id, EPOCH_US);
            // In a window an earlier call opened, the receipts in the reply are read off the
            // window's stored end less its PTTL, which a paused server counts from its live
            // clock, as it does a check's: the reported times are `lag` short, the receipt's
            // time `lag` late, and it ends where the rule's does, so it gives back alike.
            let ends = |r: &[ReplyReceipt]| -> Vec<u64> {
                r.iter().map(|r| r.at_us + r.reset_us).collect()
            };
            let exact = step != paused || paused == 0;
            let late =
                |r: &[ReplyReceipt]| -> Vec<u64> { r.iter().map(|r| r.at_us + lag).collect() };
            let starts: Vec<u64> = receipts.iter().map(|r| r.at_us).collect();
            if (exact && receipts != rule)
                || (!exact && starts != late(&rule))
                || ends(&receipts) != ends(&rule)
            {
                return Err(format!(
                    "step {step}: the receipts in the reply {receipts:?}, the rule's {rule:?}"
                ));
            }
            if step == paused {
                paused_receipts = receipts;
            }
            let rust = if exact {
                rust
            } else {
                Verdict::new(
                    rust.decisions()
                        .iter()
                        .map(|d| {
                            let mut d = *d;
                            d.reset_after -= Duration::from_micros(lag);
                            d
                        })
                        .collect(),
                )
            };
            (rust, verdict)
        } else {
            let rust = model.take(&checks, Some(id));
            (
                rust,
                lua.take(&checks, Some(id)).map_err(|e| e.to_string())?,
            )
        };
        answers.push(format!("{id}: {rust:?} / {script:?}"));
        if rust != script {
            return Err(format!("a paused take differs: {answers:?}"));
        }
    }
    lua.lua().set_lag_us(0);
    let rust = model.compensate(&checks, Some(ids[paused]));
    let script = if in_reply {
        lua.give_back(&checks, ids[paused], &paused_receipts)
    } else {
        lua.compensate(&checks, Some(ids[paused]))
    }
    .map_err(|e| e.to_string())?;
    if rust != script {
        return Err(format!(
            "the refund of a paused take differs: {rust:?} / {script:?}"
        ));
    }
    Ok(())
}

/// A take's receipts in its reply are the receipts a take under a call id writes, as the
/// reply carries them (`algorithm::fixed::receipt_in_reply`: from the start of the take's
/// millisecond, ending where the written one ends), for one limit and a stack of two, in a new
/// window and in an open one, at an instant inside a millisecond.
fn receipts_in_reply_are_the_keys_receipts(
    sources: &Sources,
    without_expiretime: bool,
) -> Result<(), String> {
    let lua = lua_store(sources);
    lua.lua().set_without_expiretime(without_expiretime);
    let p = Policy::new(Algorithm::Fixed, 5, Duration::from_secs(10)).expect("valid");
    let q = Policy::new(Algorithm::Fixed, 7, Duration::from_secs(3)).expect("valid");
    for (step, stacked) in [false, false, true, true].into_iter().enumerate() {
        let now = START_US + 250_377 * step as u64;
        lua.lua().set_time_us(EPOCH_US + now);
        let pick = |a: &'static str, b: &'static str| {
            let mut checks = vec![Check::new(a, &p)];
            if stacked {
                checks.push(Check::new(b, &q));
            }
            checks
        };
        let (written, replied) = (pick("kw", "kw2"), pick("kr", "kr2"));
        let id = format!("{step}a");
        lua.take(&written, Some(&id)).map_err(|e| e.to_string())?;
        let (_, receipts) = lua.take_in_reply(&replied).map_err(|e| e.to_string())?;
        for (i, c) in written.iter().enumerate() {
            let name = format!("{}:r:{id}:{}", c.key, i + 1);
            let stored = lua
                .lua()
                .db()
                .command(&[b"GET".to_vec(), name.into_bytes()]);
            let key_receipt = read_receipt(stored_bytes(&stored))
                .ok_or_else(|| format!("step {step}, limit {i}: no receipt in {stored:?}"))?;
            let rule = fixed::receipt_in_reply(&key_receipt);
            let expected = ReplyReceipt {
                at_us: rule.at_us,
                reset_us: rule.reset_us,
                first_us: rule.first,
            };
            if receipts.get(i) != Some(&expected) || rule.cost != c.policy.cost() {
                return Err(format!(
                    "step {step}, limit {i}: the receipt in the reply {:?}, the key's {key_receipt:?} as replied {expected:?}",
                    receipts.get(i)
                ));
            }
        }
    }
    Ok(())
}

/// A receipt key's value (`<at>:<reset>:<first>:<cost>`, the prelude's `read_receipt`).
fn read_receipt(value: &[u8]) -> Option<Receipt> {
    let text = std::str::from_utf8(value).ok()?;
    let mut figures = text.split(':').map(|f| f.parse::<u64>().ok());
    let receipt = Receipt {
        at_us: figures.next()??,
        reset_us: figures.next()??,
        first: figures.next()??,
        cost: figures.next()??,
    };
    figures.next().is_none().then_some(receipt)
}

/// The bytes of a bulk reply (none for anything else).
fn stored_bytes(reply: &Reply) -> &[u8] {
    match reply {
        Reply::Bulk(b) => b,
        _ => &[],
    }
}

/// A reply of a call of `limits` limits with its rows as the arrays of integers they stand
/// for, so that two replies compare by their numbers whichever form each row took: an
/// admitted call's rows packed in one string (the byte 1, then two or five little-endian
/// doubles a limit, read by wire.rs's `Row::packed`) as one array of four or seven integers
/// each (one array for a call of one limit, an array of them for a stack); any other reply as
/// it is.
fn as_arrays(reply: Reply, limits: usize) -> Reply {
    let Reply::Bulk(bytes) = &reply else {
        return reply;
    };
    let Some((1, packed)) = bytes.split_first() else {
        return reply;
    };
    let size = packed.len() / limits.max(1);
    if !matches!(size, 16 | 40) || size * limits != packed.len() {
        return reply;
    }
    let mut rows: Vec<Reply> = packed
        .chunks_exact(size)
        .map(|packed| {
            #[allow(clippy::cast_possible_truncation)] // whole numbers below 2^53
            let numbers: Vec<i64> = packed
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap_or_default()) as i64)
                .collect();
            let mut row = vec![1, numbers[0], numbers[1], 0];
            row.extend_from_slice(&numbers[2..]);
            Reply::Array(row.into_iter().map(Reply::Int).collect())
        })
        .collect();
    if limits == 1 {
        rows.remove(0)
    } else {
        Reply::Array(rows)
    }
}

/// Every wait (`reset_after`, `retry_after`) above 0 of a driver's reply (one row, or an array of
/// rows), `us` later.
fn later(reply: &mut Reply, us: i64) {
    let rows: Vec<&mut Vec<Reply>> = match reply {
        Reply::Array(row) if matches!(row.first(), Some(Reply::Int(_))) => vec![row],
        Reply::Array(rows) => rows
            .iter_mut()
            .filter_map(|r| match r {
                Reply::Array(row) => Some(row),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    for row in rows {
        // reset_after and retry_after; a receipt's figures after them are not waits.
        for wait in row.iter_mut().skip(2).take(2) {
            if let Reply::Int(w) = wait
                && *w > 0
            {
                *w += us;
            }
        }
    }
}

/// The calls [`planted_states`] makes, (what, KEYS, ARGV) with a period of 10 s and a limit of
/// 5: one argument per limit (code:limit:period µs:burst:cost), then the call id, then how long
/// its receipts are kept.
const CALLS: [(&str, &str, &str); 25] = [
    ("cost 1", "k k:b", "1:5:10000000:5:1"),
    ("cost 2", "k k:b", "1:5:10000000:5:2"),
    ("the whole limit", "k k:b", "1:5:10000000:5:5"),
    ("a cost above the limit", "k k:b", "1:5:10000000:5:6"),
    ("another algorithm", "k k:b", "5:5:10000000:5:1"),
    ("a malformed limit", "k k:b", "1:5:10000000:5"),
    ("a wrong marker", "k j:b", "1:5:10000000:5:1"),
    ("a call id", "k k:b k:r:ab:1", "1:5:10000000:5:1 ab"),
    ("a wrong receipt", "k k:b k:r:ac:1", "1:5:10000000:5:1 ab"),
    ("a bad call id", "k k:b k:r:AB:1", "1:5:10000000:5:1 AB"),
    ("a call id alone", "k k:b", "ab"),
    (
        "receipts kept 1.5 s",
        "k k:b k:r:ab:1",
        "1:5:10000000:5:1 ab 1500",
    ),
    (
        "receipts kept 10 s",
        "k k:b k:r:ab:1",
        "1:5:10000000:5:1 ab 10000",
    ),
    (
        "receipts kept 0 ms",
        "k k:b k:r:ab:1",
        "1:5:10000000:5:1 ab 0",
    ),
    (
        "receipts kept too long",
        "k k:b k:r:ab:1",
        "1:5:10000000:5:1 ab 10001",
    ),
    (
        "receipts kept from a leading zero",
        "k k:b k:r:ab:1",
        "1:5:10000000:5:1 ab 01500",
    ),
    ("a period of 1.5 ms", "k k:b", "1:5:1500:5:1"),
    // Two limits, the second on `j` (2 taken of its window, planted in every state).
    (
        "two limits",
        "k j k:b j:b",
        "1:5:10000000:5:1 1:5:10000000:5:1",
    ),
    (
        "two limits, the second full",
        "k j k:b j:b",
        "1:5:10000000:5:1 1:3:10000000:3:2",
    ),
    (
        "two limits, the second another algorithm",
        "k j k:b j:b",
        "1:5:10000000:5:1 2:5:10000000:5:1",
    ),
    (
        "a key twice",
        "k k k:b k:b",
        "1:5:10000000:5:1 1:5:10000000:5:1",
    ),
    (
        "two limits with a call id",
        "k j k:b j:b k:r:ab:1 j:r:ab:2",
        "1:5:10000000:5:1 1:5:10000000:5:1 ab",
    ),
    (
        "two limits with receipts kept 1.5 s",
        "k j k:b j:b k:r:ab:1 j:r:ab:2",
        "1:5:10000000:5:1 1:5:10000000:5:1 ab 1500",
    ),
    // Receipts in the reply (`RedisStore::take_briefly`): from a state the fast path hands to
    // the driver, its reply's waits as the fast path answers them, the receipts' figures not.
    ("receipts in the reply", "k k:b", "1:5:10000000:5:1 ~"),
    (
        "two limits with receipts in the reply",
        "k j k:b j:b",
        "1:5:10000000:5:1 1:5:10000000:5:1 ~",
    ),
];

/// From each planted state, with the usual arguments and with ones the rule does not decide
/// itself: the fast path's reply and the keys after it are the driver's.
fn planted_states(sources: &Sources) -> Result<(), String> {
    let words = |text: &str| -> Vec<Vec<u8>> {
        text.split_whitespace()
            .map(|w| w.as_bytes().to_vec())
            .collect()
    };
    let over_a_period = format!("SET k 2 PXAT {}", (EPOCH_US + START_US) / 1000 + 30_000);
    let states: [(&str, &[&str]); 14] = [
        ("absent", &[]),
        ("a window", &["SET k 3 PX 4000"]),
        ("a full window", &["SET k 5 PX 4000"]),
        ("an immortal 0", &["SET k 0"]),
        ("an immortal counter", &["SET k 3"]),
        ("a negative count", &["SET k -3 PX 4000"]),
        ("leading zeros", &["SET k 003 PX 4000"]),
        ("not a number", &["SET k abc PX 4000"]),
        ("a huge count", &["SET k 9223372036854775807 PX 4000"]),
        ("a TTL over a period", &[over_a_period.as_str()]),
        ("a sorted set", &["ZADD k 1 m", "PEXPIRE k 4000"]),
        ("blocked", &["SET k:b 1 PX 4000"]),
        ("a marker without a TTL", &["SET k:b 1"]),
        ("a receipt already", &["SET k:r:ab:1 1:2:0:1 PX 4000"]),
    ];
    for (state, commands) in states {
        for (call, keys, argv) in CALLS {
            // The one difference, by design: a rejected stack deletes a key it created, and a
            // 0 without a TTL (which is no window) reads as created.
            if state == "an immortal 0" && call == "two limits, the second full" {
                continue;
            }
            let (keys, argv) = (words(keys), words(argv));
            let run = |function: &str| {
                let lua = lua_store(sources);
                for c in commands.iter().chain(&["SET j 2 PX 4000"]) {
                    lua.lua().db().command(&words(c));
                }
                lua.lua().set_time_us(EPOCH_US + START_US + 250);
                // An error is compared by its message (the stack traces differ by a frame).
                let reply = match lua.lua().fcall(function, &keys, &argv) {
                    Reply::Error(e) => {
                        Reply::Error(e.split("\nstack traceback").next().unwrap_or("").to_owned())
                    }
                    other => other,
                };
                let shapes = lua.lua().db().shapes();
                (reply, shapes)
            };
            let limits = argv.iter().filter(|a| a.contains(&b':')).count();
            let mut fast = run(&sources.fixed_only_function);
            fast.0 = as_arrays(fast.0, limits);
            let mut driver = run(&sources.check_function);
            driver.0 = as_arrays(driver.0, limits);
            // The fast path's waits count from the start of the millisecond (250 µs in).
            later(&mut driver.0, 250);
            if fast != driver {
                return Err(format!(
                    "from {state}, {call}:\n  fast:   {fast:?}\n  driver: {driver:?}"
                ));
            }
        }
    }
    Ok(())
}
