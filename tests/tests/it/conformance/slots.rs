//! Concurrency limits decide alike in Rust and Lua: seeded traces of takes under call ids,
//! releases of held calls (what `Store::forget` sends: the receipts dropped, `ZREM key id`),
//! anonymous checks, peeks, leases that end, and a clock set back.

use ratelimit_runtime::{Algorithm, Policy, Store, Verdict, store::Check};

use super::trace::{self, Rng};
use super::{EPOCH_US, Pair};

/// The Lua side of `Store::forget` for one concurrency limit (`forget_pipe`): the call's
/// receipt and its lease.
fn forget_lua(pair: &Pair, key: &str, id: &str) {
    for lua in [&pair.lua, &pair.lua_scripts] {
        let db = lua.lua();
        let mut db = db.db();
        db.command(&[b"DEL".to_vec(), format!("{key}:r:{id}:1").into_bytes()]);
        db.command(&[
            b"ZREM".to_vec(),
            key.as_bytes().to_vec(),
            id.as_bytes().to_vec(),
        ]);
    }
}

fn same(step: &str, memory: &Verdict, lua: &Verdict, scripts: &Verdict) {
    assert!(
        memory == lua && memory == scripts,
        "Rust and Lua differ at {step}\n  memory: {memory:?}\n  lua:    {lua:?}\n  script: {scripts:?}"
    );
}

#[test]
fn concurrency_limits_decide_alike_in_rust_and_lua() {
    let mut steps = 0;
    for t in 0..60_u64 {
        let seed = 0x5107_0000 + t;
        let mut rng = Rng::new(seed);
        let num = rng.between(1, 5);
        let lease_ms = *rng.pick(&[1, 3, 250, 1000, 10_000]);
        let policy = Policy::new(
            Algorithm::Concurrency,
            num,
            std::time::Duration::from_millis(lease_ms),
        )
        .unwrap();
        let period = lease_ms * 1000;
        let key = format!("c{t}");
        let checks = [Check::new(&key, &policy)];
        let mut pair = Pair::new();
        let mut held: Vec<String> = Vec::new();
        let mut next_id = 0_u64;
        let mut retry = 0;
        for step in 0..250 {
            let mut now = pair.now + trace::step(&mut rng, pair.now, period, period, retry);
            // A fifth of the traces set the clock back now and then (and peek never: the
            // companion's peek writes the restamp that the memory store's peek leaves alone,
            // as for every algorithm).
            let back = t % 5 == 0;
            if back && rng.chance(3) {
                now = now.saturating_sub(rng.between(1, 2 * period));
            }
            pair.set(now);
            let at = format!("seed {seed:#x} step {step} at {} µs", EPOCH_US + now);
            match rng.below(10) {
                // A take under a fresh call id (a call of the pipeline).
                0..=4 => {
                    next_id += 1;
                    let id = format!("{next_id:017x}");
                    let memory = pair.memory.take_now(&checks, &id).unwrap();
                    let lua = pair.lua.take(&checks, Some(&id)).unwrap();
                    let scripts = pair.lua_scripts.take(&checks, Some(&id)).unwrap();
                    same(&format!("{at}: take {id}"), &memory, &lua, &scripts);
                    retry = memory
                        .retry_after()
                        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
                    if memory.is_admitted() {
                        held.push(id);
                    }
                }
                // A held call ends: its release.
                5..=7 if !held.is_empty() => {
                    let i = usize::try_from(rng.below(held.len() as u64)).unwrap();
                    let id = held.swap_remove(i);
                    pair.runtime
                        .block_on(pair.memory.forget(&checks, &id))
                        .unwrap();
                    forget_lua(&pair, &key, &id);
                }
                // An anonymous check (no call id): a lease only its end gives back.
                8 => {
                    let (memory, lua, scripts) = pair.check(&checks);
                    same(
                        &format!("{at}: check"),
                        &memory.unwrap(),
                        &lua.unwrap(),
                        &scripts.unwrap(),
                    );
                }
                _ if !back => {
                    let memory = pair.memory.peek_now(&checks);
                    let lua = pair.runtime.block_on(pair.lua.peek(&checks)).unwrap();
                    same(&format!("{at}: peek"), &memory, &lua, &lua);
                }
                _ => {}
            }
            steps += 1;
        }
    }
    println!("concurrency steps compared: {steps}");
    assert!(steps >= 10_000);
}
