//! The Lua the Redis stores send: the script and library texts assembled from
//! `src/scripts/*.lua`, each hashed once.

use std::sync::LazyLock;

use redis::Script;

use crate::algorithm::Algorithm;
use crate::store::Check;

const PRELUDE: &str = include_str!("../../scripts/prelude.lua");
const FIXED: &str = include_str!("../../scripts/fixed.lua");
const SLIDING: &str = include_str!("../../scripts/sliding.lua");
/// The token and the leaky bucket: one rule, registered under both codes.
const BUCKET: &str = include_str!("../../scripts/bucket.lua");
const GCRA: &str = include_str!("../../scripts/gcra.lua");
const SLIDING_COUNTER: &str = include_str!("../../scripts/sliding_counter.lua");
const CONCURRENCY: &str = include_str!("../../scripts/concurrency.lua");
const DRIVER: &str = include_str!("../../scripts/driver.lua");
const REFUND: &str = include_str!("../../scripts/refund.lua");
/// The check of a call of fixed-window limits only, on distinct keys (`fixed_only`), after the
/// driver it hands every other case to.
const FIXED_ONLY: &str = include_str!("../../scripts/fixed_only.lua");

/// The last line of an `EVAL` script: the driver's `check` (defined by `driver.lua`) on the
/// script's own KEYS and ARGV.
const EVAL_CHECK: &str = "return check(KEYS, ARGV)\n";
/// The last line of the companion `EVAL` script (`refund.lua`'s `compensate`).
const EVAL_COMPENSATE: &str = "return compensate(KEYS, ARGV)\n";
/// The last line of the fixed windows' `EVAL` script (`fixed_only.lua`).
const EVAL_FIXED_ONLY: &str = "return fixed_only(KEYS, ARGV)\n";

/// The prelude's builtins as the Functions library binds them (`bind_builtins`): each local's
/// name and the global it holds (`redis_call` and `redis.call`, `type` and `type`), read off
/// the prelude's `builtins()` and the `local` statement after it, in order.
fn bound_builtins() -> Vec<(&'static str, &'static str)> {
    let list =
        |text: &'static str| -> Vec<&'static str> { text.split(',').map(str::trim).collect() };
    let (_, after) = PRELUDE
        .split_once(BUILTINS_START)
        .unwrap_or_else(|| unreachable!("the prelude defines `builtins()`"));
    let (globals, after) = after
        .split_once("\nend\n\nlocal ")
        .unwrap_or_else(|| unreachable!("`builtins()` is followed by its locals"));
    let (locals, after) = after
        .split_once("\n\n")
        .unwrap_or_else(|| unreachable!("the locals end with a blank line"));
    let (assigned, _) = after
        .split_once("bind_builtins()\n")
        .and_then(|(_, body)| body.split_once(BUILTINS_END))
        .unwrap_or_else(|| unreachable!("`bind_builtins()` assigns `builtins()`"));
    let (globals, locals) = (list(globals), list(locals));
    // The three lists are one: a name bound to another builtin than its global would be a
    // library that reads one function where the `EVAL` scripts read another.
    assert!(
        globals.len() == locals.len() && list(assigned) == locals,
        "the prelude's builtins(), its locals and bind_builtins() must list the same names"
    );
    locals.into_iter().zip(globals).collect()
}

/// Where the prelude's builtins block starts (`builtins()`, its locals, `bind_builtins()`).
const BUILTINS_START: &str = "local function builtins()\n  return ";

/// What the block ends with: `bind_builtins()`'s last line.
const BUILTINS_END: &str = "= builtins()\nend\n";

/// `code` (prelude first) as an `EVAL` script runs it: the builtins read as globals, where the
/// Functions library binds them to locals of its chunk once. An `EVAL` script's chunk runs on
/// every call and makes every one of its closures again, and each local a closure reads is
/// captured by a walk over the chunk's captured locals: on Redis 6.2 the bound builtins cost
/// more to capture per call than they save (BENCHMARKS.md, "The builtins bound once per
/// library"). So here `bind_builtins()` does nothing and each bound name is its global again.
/// Public for the conformance test, which mutates the scripts' sources.
#[doc(hidden)]
pub fn eval_form(code: &str) -> String {
    let start = code.find(BUILTINS_START);
    let end = code.find(BUILTINS_END);
    let mut text = match (start, end) {
        (Some(start), Some(end)) => format!(
            "{}local function bind_builtins()\nend\n{}",
            &code[..start],
            &code[end + BUILTINS_END.len()..]
        ),
        _ => code.to_owned(),
    };
    for (local, global) in bound_builtins() {
        if local != global {
            text = replace_name(&text, local, global);
        }
    }
    text
}

/// `text` with every occurrence of the Lua name `name` (not part of a longer name or a field)
/// replaced by `by`.
fn replace_name(text: &str, name: &str, by: &str) -> String {
    let is_name_byte = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    for (at, _) in text.match_indices(name) {
        let end = at + name.len();
        let byte_before = |n: usize| at.checked_sub(n).and_then(|i| bytes.get(i).copied());
        let before = byte_before(1);
        // A field (`x.name`) is not the name; a concatenation (`x ..name`) is.
        let field = before == Some(b'.') && byte_before(2) != Some(b'.');
        if before.is_some_and(is_name_byte)
            || field
            || bytes.get(end).is_some_and(|&b| is_name_byte(b))
        {
            continue;
        }
        out.push_str(&text[copied..at]);
        out.push_str(by);
        copied = end;
    }
    out.push_str(&text[copied..]);
    out
}

/// Whether a call of `checks` goes to the fixed windows' own function (`fixed_only.lua`)
/// instead of the driver: every limit a fixed window, no key named twice. That function hands
/// any case it does not decide itself to the driver, in the same call.
pub(super) fn fixed_only(checks: &[Check<'_>]) -> bool {
    !checks.is_empty()
        && checks
            .iter()
            .all(|c| c.policy.algorithm() == Algorithm::Fixed)
        && !super::wire::keys_repeat(checks)
}

/// The Lua file that holds `algorithm`'s rule (its evaluate, commit and refund).
/// Every algorithm file, once each.
const ALGORITHMS: [&str; 6] = [FIXED, SLIDING, BUCKET, GCRA, SLIDING_COUNTER, CONCURRENCY];

fn source(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::Fixed => FIXED,
        Algorithm::Sliding => SLIDING,
        Algorithm::Leaky | Algorithm::Token => BUCKET,
        Algorithm::Gcra => GCRA,
        Algorithm::SlidingCounter => SLIDING_COUNTER,
        Algorithm::Concurrency => CONCURRENCY,
    }
}

/// The exact texts the Redis stores send (`FUNCTION LOAD` of the library and `FCALL` of its
/// functions, or `SCRIPT LOAD` and `EVALSHA` of the scripts' SHA1 on servers without Redis
/// Functions), for tests that run the very same bytes elsewhere (the conformance test's
/// embedded Lua).
///
/// Each script is the prelude, one or more algorithm files, a composer (the driver, or the
/// cluster's companion) and one line that calls the composer's function on the script's KEYS
/// and ARGV, with the builtins read as globals ([`eval_form`]). The library is the same files,
/// every one once, loaded as a Redis Functions library that registers the composers' functions
/// and binds the builtins to locals: the same code, built once at `FUNCTION LOAD` instead of on
/// every call.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ScriptSources {
    /// The script [`RedisStore`](super::RedisStore) sends for a call whose limits all use one
    /// algorithm, in the order of their codes (fixed, sliding, leaky, token, gcra,
    /// `sliding_counter`, concurrency: [`Algorithm::ALL`] and then [`Algorithm::Concurrency`]; a
    /// position plus one is the algorithm's code in the scripts' arguments): the prelude, that
    /// algorithm's file and the driver. Leaky and token are the same text (`bucket.lua` serves
    /// both codes).
    pub single: [&'static str; 7],
    /// The script for calls that stack different algorithms: the prelude, every algorithm file
    /// and the driver.
    pub combined: &'static str,
    /// The Redis Cluster store's companion script (peek and refund modes): the prelude, every
    /// algorithm file and `refund.lua`.
    pub companion: &'static str,
    /// The Functions library (`FUNCTION LOAD REPLACE` of this text): the prelude, every
    /// algorithm file, the driver and `refund.lua`, after a `#!lua name=<library>` line, ending
    /// with the registration of [`check_function`](Self::check_function) (the driver's `check`)
    /// and [`compensate_function`](Self::compensate_function) (`refund.lua`'s `compensate`).
    pub library: &'static str,
    /// The library's name: `ratelimit_` and 16 hex digits of the SHA1 of its code, so that two
    /// versions of the scripts (two versions of an application on one Redis) are two libraries
    /// and never replace each other's.
    pub library_name: &'static str,
    /// The function that checks a call (`FCALL <this> numkeys keys… args…`, the driver
    /// script's KEYS and ARGV): the library's name and `_check`.
    pub check_function: &'static str,
    /// The script sent for a call of fixed-window limits only, on distinct keys: the prelude,
    /// `fixed.lua`, the driver and `fixed_only.lua` (whose `fixed_only` hands what it does not
    /// decide to the driver's `check`), ending with a call of `fixed_only`.
    pub fixed_only: &'static str,
    /// The library's function for a call of fixed-window limits only (the driver's KEYS and
    /// ARGV): the library's name and `_check_fixed`.
    pub fixed_only_function: &'static str,
    /// The companion's function (peek and refund, the companion script's KEYS and ARGV): the
    /// library's name and `_compensate`.
    pub compensate_function: &'static str,
}

impl ScriptSources {
    /// The script sent for a call whose limits all use `algorithm`.
    pub fn for_algorithm(&self, algorithm: Algorithm) -> &'static str {
        self.single[usize::from(algorithm.code() - 1)]
    }

    /// The function (`FCALL`) and the script (`EVALSHA`, its text) a check of `checks` is
    /// sent to: the fixed windows' own (every limit a fixed window, no key twice), or the
    /// driver.
    pub fn for_checks(&self, checks: &[Check<'_>]) -> (&'static str, &'static str) {
        if fixed_only(checks) {
            return (self.fixed_only_function, self.fixed_only);
        }
        let mut algorithms = checks.iter().map(|c| c.policy.algorithm());
        let script = match algorithms.next() {
            Some(first) if algorithms.all(|a| a == first) => self.for_algorithm(first),
            _ => self.combined,
        };
        (self.check_function, script)
    }
}

/// The Functions library and the names of its functions: all that a server with Functions
/// is sent. Built at the first connect, without the `EVAL` scripts' texts and their SHA1s
/// ([`EVAL_TEXTS`], [`SCRIPTS`]), which only a server that refuses the library needs.
pub(super) struct Library {
    /// The library's text (`FUNCTION LOAD REPLACE`).
    pub(super) text: String,
    name: String,
    check_function: String,
    /// The companion's function (peek and refund).
    pub(super) compensate_function: String,
    fixed_only_function: String,
}

impl Library {
    /// The function a check of `checks` is sent to: the fixed windows' own, or the driver's.
    pub(super) fn function_for(&self, checks: &[Check<'_>]) -> &str {
        if fixed_only(checks) {
            &self.fixed_only_function
        } else {
            &self.check_function
        }
    }
}

pub(super) static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    let code = [PRELUDE, &ALGORITHMS.concat(), DRIVER, REFUND, FIXED_ONLY].concat();
    let hash = Script::new(&code).get_hash().to_owned();
    let name = format!("ratelimit_{}", &hash[..16]);
    let check_function = format!("{name}_check");
    let compensate_function = format!("{name}_compensate");
    let fixed_only_function = format!("{name}_check_fixed");
    let text = format!(
        "#!lua name={name}\n{code}\
         redis.register_function('{check_function}', check)\n\
         redis.register_function('{compensate_function}', compensate)\n\
         redis.register_function('{fixed_only_function}', fixed_only)\n"
    );
    Library {
        text,
        name,
        check_function,
        compensate_function,
        fixed_only_function,
    }
});

/// The `EVAL` scripts' texts ([`eval_form`]), built when first needed: by a server without
/// Functions, or by a test.
struct EvalTexts {
    single: [String; 7],
    combined: String,
    companion: String,
    fixed_only: String,
}

static EVAL_TEXTS: LazyLock<EvalTexts> = LazyLock::new(|| {
    // Each file in its `EVAL` form once, each script the concatenation of its files' forms:
    // the form of the concatenation, since every file ends a line and no name spans two
    // (`eval_texts_are_the_form_of_each_whole_script` holds the two equal), for a tenth of
    // the work at a cold start.
    let prelude = eval_form(PRELUDE);
    let driver = eval_form(DRIVER);
    let forms = ALGORITHMS.map(eval_form);
    let form = |a: Algorithm| {
        let at = ALGORITHMS.iter().position(|text| *text == source(a));
        let at = at.unwrap_or_else(|| unreachable!("every algorithm's file is in ALGORITHMS"));
        forms[at].as_str()
    };
    let algorithms = forms.concat();
    let script = |parts: &[&str]| parts.concat();
    EvalTexts {
        single: Algorithm::BY_CODE.map(|a| script(&[&prelude, form(a), &driver, EVAL_CHECK])),
        combined: script(&[&prelude, &algorithms, &driver, EVAL_CHECK]),
        companion: script(&[&prelude, &algorithms, &eval_form(REFUND), EVAL_COMPENSATE]),
        fixed_only: script(&[
            &prelude,
            form(Algorithm::Fixed),
            &driver,
            &eval_form(FIXED_ONLY),
            EVAL_FIXED_ONLY,
        ]),
    }
});

/// The exact script texts the Redis and Redis Cluster stores send (see [`ScriptSources`]).
#[doc(hidden)]
pub fn script_sources() -> ScriptSources {
    let (library, eval) = (&*LIBRARY, &*EVAL_TEXTS);
    ScriptSources {
        single: eval.single.each_ref().map(String::as_str),
        combined: &eval.combined,
        companion: &eval.companion,
        library: &library.text,
        library_name: &library.name,
        check_function: &library.check_function,
        compensate_function: &library.compensate_function,
        fixed_only: &eval.fixed_only,
        fixed_only_function: &library.fixed_only_function,
    }
}

/// The checks' scripts, each hashed once: one per algorithm code (leaky and token share one
/// text, so one script) and one with every algorithm, for calls that stack different ones.
pub(super) struct Scripts {
    /// The script of each algorithm code, by `code() - 1`: an index into `distinct`.
    single: [usize; 7],
    combined: Script,
    /// The fixed windows' script ([`fixed_only`]).
    fixed_only: Script,
    /// The per-algorithm scripts, each text once.
    distinct: Vec<Script>,
    /// The source of each script of [`Scripts::all`], in its order, for `SCRIPT LOAD`.
    pub(super) sources: Vec<&'static str>,
}

pub(super) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| {
    let texts = &*EVAL_TEXTS;
    let mut sources: Vec<&'static str> = Vec::new();
    let single = texts.single.each_ref().map(|text| {
        let text = text.as_str();
        sources.iter().position(|s| *s == text).unwrap_or_else(|| {
            sources.push(text);
            sources.len() - 1
        })
    });
    let distinct = sources.iter().map(|s| Script::new(s)).collect();
    sources.push(&texts.combined);
    sources.push(&texts.fixed_only);
    Scripts {
        single,
        combined: Script::new(&texts.combined),
        fixed_only: Script::new(&texts.fixed_only),
        distinct,
        sources,
    }
});

impl Scripts {
    /// The script a check of `checks` is sent to: the fixed windows' ([`fixed_only`]), else the smallest driver that knows every algorithm in `checks`.
    pub(super) fn for_checks(&self, checks: &[Check<'_>]) -> &Script {
        if fixed_only(checks) {
            return &self.fixed_only;
        }
        let Some(first) = checks.first() else {
            return &self.combined;
        };
        let algorithm = first.policy.algorithm();
        if checks.iter().all(|c| c.policy.algorithm() == algorithm) {
            self.for_algorithm(algorithm)
        } else {
            &self.combined
        }
    }

    /// The script of calls whose limits all use `algorithm`.
    fn for_algorithm(&self, algorithm: Algorithm) -> &Script {
        &self.distinct[self.single[usize::from(algorithm.code() - 1)]]
    }

    /// Every script, each text once: the per-algorithm ones, the combined one, the fixed
    /// windows'.
    pub(super) fn all(&self) -> impl Iterator<Item = &Script> {
        self.distinct
            .iter()
            .chain([&self.combined, &self.fixed_only])
    }
}

/// The text of `script` when it is one of [`SCRIPTS`] or [`COMPANION`]: what its
/// `SCRIPT LOAD` sends.
pub(super) fn source_of(script: &Script) -> Option<&'static str> {
    let hash = script.get_hash();
    if hash == COMPANION.get_hash() {
        return Some(&EVAL_TEXTS.companion);
    }
    SCRIPTS
        .all()
        .zip(&SCRIPTS.sources)
        .find_map(|(s, source)| (s.get_hash() == hash).then_some(*source))
}

/// The companion script (the prelude, every algorithm and `refund.lua`): its `peek` mode reads
/// limits without taking anything ([`Store::peek`](crate::store::Store::peek)), its `refund`
/// mode gives back by receipt (the refunds of outcome-filtered calls, `count = …`, and of the
/// cluster's cross-slot calls).
/// Run as the library's `compensate` function where the server has Functions.
pub(super) static COMPANION: LazyLock<Script> =
    LazyLock::new(|| Script::new(&EVAL_TEXTS.companion));

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::policy::Policy;

    fn policy(a: Algorithm) -> Policy {
        Policy::new(a, 5, Duration::from_secs(1)).unwrap()
    }

    /// Each `EVAL` script, built file by file, is the `EVAL` form of its whole text.
    #[test]
    fn eval_texts_are_the_form_of_each_whole_script() {
        let texts = &*EVAL_TEXTS;
        let algorithms = ALGORITHMS.concat();
        for (a, text) in Algorithm::BY_CODE.iter().zip(&texts.single) {
            let whole = [PRELUDE, source(*a), DRIVER, EVAL_CHECK].concat();
            assert_eq!(*text, eval_form(&whole), "{a:?}");
        }
        let whole = [PRELUDE, algorithms.as_str(), DRIVER, EVAL_CHECK].concat();
        assert_eq!(texts.combined, eval_form(&whole));
        let whole = [PRELUDE, algorithms.as_str(), REFUND, EVAL_COMPENSATE].concat();
        assert_eq!(texts.companion, eval_form(&whole));
        let whole = [PRELUDE, FIXED, DRIVER, FIXED_ONLY, EVAL_FIXED_ONLY].concat();
        assert_eq!(texts.fixed_only, eval_form(&whole));
    }

    /// What a `NOSCRIPT` reloads on one node is the text of the script that failed: each
    /// script's source hashes to that script's SHA1.
    #[test]
    fn each_script_has_its_own_source_to_reload() {
        let scripts: Vec<&Script> = SCRIPTS.all().chain([&*COMPANION]).collect();
        assert_eq!(scripts.len(), SCRIPTS.sources.len() + 1);
        for script in scripts {
            let source = source_of(script).expect("a script of the store's");
            assert_eq!(Script::new(source).get_hash(), script.get_hash());
        }
        assert_eq!(source_of(&Script::new("return 1")), None);
    }

    #[test]
    #[allow(clippy::many_single_char_names)] // one policy per algorithm, by its initial
    fn one_script_per_algorithm_the_buckets_share_one_and_one_for_mixed_calls() {
        let [f, s, l, t, g, c, n] = Algorithm::BY_CODE.map(policy);
        let hash = |checks: &[Check<'_>]| SCRIPTS.for_checks(checks).get_hash().to_owned();
        // A key named twice: the driver (the fixed windows' own function takes distinct keys).
        let fixed = hash(&[Check::new("a", &f), Check::new("a", &f)]);
        let sliding = hash(&[Check::new("a", &s)]);
        let leaky = hash(&[Check::new("a", &l), Check::new("b", &l)]);
        let token = hash(&[Check::new("a", &t), Check::new("b", &t)]);
        let gcra = hash(&[Check::new("a", &g)]);
        let counter = hash(&[Check::new("a", &c)]);
        let slots = hash(&[Check::new("a", &n)]);
        let mixed = hash(&[Check::new("a", &t), Check::new("b", &l)]);
        // The token and the leaky bucket are one rule (bucket.lua): one script serves both.
        assert_eq!(leaky, token);
        assert_eq!(mixed, SCRIPTS.combined.get_hash());
        let distinct: std::collections::HashSet<_> =
            [&fixed, &sliding, &token, &gcra, &counter, &slots, &mixed]
                .into_iter()
                .collect();
        assert_eq!(distinct.len(), 7, "{distinct:?}");
        // Fixed-window limits on distinct keys: their own script.
        let fixed_only = hash(&[Check::new("a", &f)]);
        assert_ne!(fixed_only, fixed);
        assert_eq!(
            hash(&[Check::new("a", &f), Check::new("b", &f)]),
            fixed_only
        );
        // What is loaded is every script once, and each is the text `script_sources` gives.
        let loaded: Vec<&str> = SCRIPTS.all().map(Script::get_hash).collect();
        assert_eq!(
            loaded,
            [
                &fixed,
                &sliding,
                &token,
                &gcra,
                &counter,
                &slots,
                &mixed,
                &fixed_only
            ]
        );
        let sources: Vec<String> = SCRIPTS
            .sources
            .iter()
            .map(|s| Script::new(s).get_hash().to_owned())
            .collect();
        assert_eq!(sources, loaded);
    }

    /// The Functions library binds the prelude's builtins to locals once; every `EVAL` script
    /// reads them as globals, with nothing of the binding left but a `bind_builtins()` that
    /// does nothing.
    #[test]
    fn the_library_binds_the_builtins_and_the_scripts_read_the_globals() {
        let bound = bound_builtins();
        assert!(bound.len() >= 10, "{bound:?}");
        assert!(bound.contains(&("redis_call", "redis.call")), "{bound:?}");
        assert!(bound.contains(&("type", "type")), "{bound:?}");
        for (local, global) in &bound {
            let is_name = |s: &str| {
                !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            };
            assert!(is_name(local), "{local:?}");
            assert!(global.split('.').all(is_name), "{global:?}");
        }
        let texts = script_sources();
        assert!(texts.library.contains(BUILTINS_START));
        assert!(texts.library.contains("redis_call("));
        let scripts =
            texts
                .single
                .into_iter()
                .chain([texts.combined, texts.companion, texts.fixed_only]);
        for script in scripts {
            assert!(!script.contains(BUILTINS_START));
            assert!(script.contains("local function bind_builtins()\nend\n"));
            for (local, global) in &bound {
                if local != global {
                    assert_eq!(
                        replace_name(script, local, "@"),
                        script,
                        "{local} left in a script"
                    );
                }
            }
            assert!(script.contains("redis.call("));
        }
        // Only whole names, never a field or a longer name.
        assert_eq!(
            replace_name(
                "redis_call(x) a.redis_call redis_call_x xredis_call s..redis_call",
                "redis_call",
                "redis.call"
            ),
            "redis.call(x) a.redis_call redis_call_x xredis_call s..redis.call"
        );
    }

    /// Each call's script is the text `script_sources` gives for its checks: the driver for
    /// a key named twice, each algorithm's own for one check (the fixed windows' fast path).
    #[test]
    #[allow(clippy::many_single_char_names)] // one policy per algorithm, by its initial
    fn each_call_runs_the_text_script_sources_gives_for_its_checks() {
        let [f, s, l, t, g, c, n] = Algorithm::BY_CODE.map(policy);
        let hash = |checks: &[Check<'_>]| SCRIPTS.for_checks(checks).get_hash().to_owned();
        let texts = script_sources();
        for (a, p) in Algorithm::BY_CODE
            .into_iter()
            .zip([&f, &s, &l, &t, &g, &c, &n])
        {
            // The same key twice: the driver, for every algorithm.
            let two = [Check::new("a", p), Check::new("a", p)];
            assert_eq!(
                Script::new(texts.for_algorithm(a)).get_hash(),
                hash(&two),
                "{a}"
            );
            assert_eq!(
                texts.for_checks(&two),
                (texts.check_function, texts.for_algorithm(a))
            );
            let one = [Check::new("a", p)];
            let (function, script) = texts.for_checks(&one);
            assert_eq!(Script::new(script).get_hash(), hash(&one), "{a}");
            if a == Algorithm::Fixed {
                assert_eq!(
                    (function, script),
                    (texts.fixed_only_function, texts.fixed_only)
                );
            } else {
                assert_eq!(
                    (function, script),
                    (texts.check_function, texts.for_algorithm(a))
                );
            }
        }
        let fixed_only = hash(&[Check::new("a", &f)]);
        assert_eq!(Script::new(texts.fixed_only).get_hash(), fixed_only);
        let mixed = hash(&[Check::new("a", &t), Check::new("b", &l)]);
        assert_eq!(Script::new(texts.combined).get_hash(), mixed);
    }

    #[test]
    fn each_script_is_the_prelude_its_algorithm_files_and_one_composer() {
        let texts = script_sources();
        for (a, text) in Algorithm::ALL.into_iter().zip(texts.single) {
            assert_eq!(
                text,
                eval_form(&[PRELUDE, source(a), DRIVER, EVAL_CHECK].concat()),
                "{a}"
            );
        }
        assert_eq!(texts.single[2], texts.single[3]);
        let algorithms = ALGORITHMS.concat();
        assert_eq!(
            texts.combined,
            eval_form(&[PRELUDE, &algorithms, DRIVER, EVAL_CHECK].concat())
        );
        assert_eq!(
            texts.companion,
            eval_form(&[PRELUDE, &algorithms, REFUND, EVAL_COMPENSATE].concat())
        );
        assert_eq!(
            texts.fixed_only,
            eval_form(&[PRELUDE, FIXED, DRIVER, FIXED_ONLY, EVAL_FIXED_ONLY].concat())
        );
        // The library: the same files once each, named by the hash of that code, registering
        // the two composers' functions under names of its own.
        let code = [PRELUDE, &algorithms, DRIVER, REFUND, FIXED_ONLY].concat();
        let name = format!("ratelimit_{}", &Script::new(&code).get_hash()[..16]);
        assert_eq!(texts.library_name, name);
        assert_eq!(texts.check_function, format!("{name}_check"));
        assert_eq!(texts.compensate_function, format!("{name}_compensate"));
        let (shebang, rest) = texts.library.split_once('\n').unwrap();
        assert_eq!(shebang, format!("#!lua name={name}"));
        assert_eq!(
            rest,
            format!(
                "{code}redis.register_function('{name}_check', check)\n\
                 redis.register_function('{name}_compensate', compensate)\n\
                 redis.register_function('{name}_check_fixed', fixed_only)\n"
            )
        );
        // Every rule file registers its codes; the composers register none.
        for (file, codes) in [
            (FIXED, &["ALGOS[1]"][..]),
            (SLIDING, &["ALGOS[2]"]),
            (BUCKET, &["ALGOS[3]", "ALGOS[4]"]),
            (GCRA, &["ALGOS[5]"]),
            (SLIDING_COUNTER, &["ALGOS[6]"]),
        ] {
            for code in codes {
                assert!(file.contains(code), "{code}");
            }
        }
        for composer in [PRELUDE, DRIVER, REFUND, FIXED_ONLY] {
            for code in [
                "ALGOS[1]", "ALGOS[2]", "ALGOS[3]", "ALGOS[4]", "ALGOS[5]", "ALGOS[6]",
            ] {
                assert!(!composer.contains(code), "a composer registers {code}");
            }
        }
    }
}
