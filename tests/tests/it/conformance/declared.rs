//! Every key a script touches is declared in its KEYS: a static check of the script texts.
//!
//! A server or a proxy that routes or locks by the declared keys (Redis Cluster's slot checks,
//! a proxy in front of several servers, a future Redis that enforces it) must see every key a
//! script reads or writes. [`undeclared_keys`] reads a script's text and reports every
//! `redis.call` / `redis.pcall` whose key argument (the positions [`key_args`] names) is not
//! a declared key, where declared means, by the text alone:
//!
//! * `KEYS[<index>]`, or `unpack(KEYS, …)` for a command that takes many keys;
//! * a name every binding of which in the text is declared: `local name = <declared>`,
//!   `name = <declared>`, `name[…] = <declared>` (a table of declared keys, indexed as
//!   `name[…]`; `{}` starts one), `for _, name in ipairs(<declared table>)`, or a function
//!   parameter that every call of that function (by its name: `f(…)`, `x.f(…)`, a table
//!   field `f = function(…)`) passes a declared argument.
//!
//! So `redis.call('GET', KEYS[1] .. ':b')`, a key from a helper (`receipt_key(KEYS[1], …)`),
//! a local built by concatenation, and `algo.evaluate(KEYS[1] .. ':w', p)` are all reported.
//! The check is conservative: a name bound once to anything else anywhere in the text counts
//! as undeclared everywhere. The stand-in checks the same at run time (each `redis.call`'s keys
//! against the call's KEYS, [`super::standin::LuaRedis`]).

use std::collections::HashSet;

/// The positions (0-based, among the arguments after the command) of the keys of `command`
/// with `nargs` arguments, as Redis's command table has them for the commands the scripts
/// use: none for `TIME`, every argument for `EXISTS` and `DEL`, the first two for `COPY` and
/// `RENAME`, the first one otherwise.
pub(crate) fn key_args(command: &str, nargs: usize) -> std::ops::Range<usize> {
    match command.to_ascii_uppercase().as_str() {
        "TIME" => 0..0,
        "EXISTS" | "DEL" => 0..nargs,
        "COPY" | "RENAME" => 0..nargs.min(2),
        _ => 0..nargs.min(1),
    }
}

/// The text without `--` comments (strings kept: a `--` inside quotes is no comment).
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut quote: Option<char> = None;
        let mut prev = '\0';
        let mut cut = line.len();
        for (i, c) in line.char_indices() {
            match quote {
                Some(q) if c == q && prev != '\\' => quote = None,
                None if c == '\'' || c == '"' => quote = Some(c),
                None if c == '-' && prev == '-' => {
                    cut = i - 1;
                    break;
                }
                // Inside a string, or nothing to note.
                _ => {}
            }
            prev = c;
        }
        out.push_str(&line[..cut]);
        out.push('\n');
    }
    out
}

/// The characters of `text` outside strings, each with its byte offset and the bracket depth
/// after it (an opening bracket counts in, a closing one out).
fn code_chars(text: &str) -> impl Iterator<Item = (usize, char, i32)> + '_ {
    let mut depth = 0i32;
    let mut quote: Option<char> = None;
    let mut prev = '\0';
    text.char_indices().filter_map(move |(i, c)| {
        let was = prev;
        prev = c;
        match quote {
            Some(q) if c == q && was != '\\' => {
                quote = None;
                None
            }
            Some(_) => None,
            None => {
                match c {
                    '\'' | '"' => quote = Some(c),
                    '(' | '[' | '{' => depth += 1,
                    ')' | ']' | '}' => depth -= 1,
                    _ => {}
                }
                Some((i, c, depth))
            }
        }
    })
}

/// The text between the bracket opening at byte `open` and its match, and where the match is
/// (strings and nested brackets skipped).
fn parenthesized(text: &str, open: usize) -> Option<(&str, usize)> {
    code_chars(&text[open..])
        .find(|&(_, c, depth)| depth == 0 && matches!(c, ')' | ']' | '}'))
        .map(|(i, _, _)| (&text[open + 1..open + i], open + i))
}

/// `args` split at its top-level commas, each part trimmed.
fn split_args(args: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut start = 0;
    for (i, _, _) in code_chars(args).filter(|&(_, c, depth)| c == ',' && depth == 0) {
        parts.push(args[start..i].trim());
        start = i + 1;
    }
    let last = args[start..].trim();
    if !last.is_empty() || !parts.is_empty() {
        parts.push(last);
    }
    parts
}

fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `name[…]` with nothing after the closing bracket: `Some(name)`.
fn indexed(expr: &str) -> Option<&str> {
    let open = expr.find('[')?;
    let (_, close) = parenthesized(expr, open)?;
    (close == expr.len() - 1 && is_name(&expr[..open])).then(|| &expr[..open])
}

/// Every call `<callee>(<args>)` in the text: the callee's last name (`f` of `a.b.f(`) and
/// its arguments.
fn calls(text: &str) -> Vec<(String, Vec<&str>)> {
    let mut out = Vec::new();
    for (open, _) in text.match_indices('(') {
        let before = &text[..open];
        let name_start = before
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |i| i + 1);
        let name = &before[name_start..];
        if !is_name(name) {
            continue;
        }
        // `function f(` and `function(` define, not call.
        let head = before[..name_start].trim_end();
        if name == "function" || head.ends_with("function") {
            continue;
        }
        if let Some((args, _)) = parenthesized(text, open) {
            out.push((name.to_owned(), split_args(args)));
        }
    }
    out
}

/// A script's text, comment-free, with what the check needs of it.
struct Script<'a> {
    text: &'a str,
    calls: Vec<(String, Vec<&'a str>)>,
}

impl Script<'_> {
    /// Whether `expr` is a declared key.
    fn declared(&self, expr: &str, seen: &mut HashSet<String>) -> bool {
        let expr = expr.trim();
        if indexed(expr) == Some("KEYS") {
            return true;
        }
        if let Some(table) = indexed(expr) {
            return self.bound(table, true, seen);
        }
        is_name(expr) && self.bound(expr, false, seen)
    }

    /// Whether every binding of `name` in the text is declared (`table`: `name` holds
    /// declared keys, bound by `name[…] = …` and started by `{}`).
    fn bound(&self, name: &str, table: bool, seen: &mut HashSet<String>) -> bool {
        if name == "KEYS" {
            return true;
        }
        // A cycle (a = b … b = a) adds no binding of its own.
        if !seen.insert(format!("{name}/{table}")) {
            return true;
        }
        let mut bindings = 0;
        for line in self.text.lines() {
            let line = line.trim();
            let words: Vec<&str> = line
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .collect();
            if !words.contains(&name) {
                continue;
            }
            let rest = line.strip_prefix("local ").unwrap_or(line).trim();
            // `a, name = …`: bound to one of several values, which the text does not tell.
            if let Some((lhs, _)) = rest
                .split_once('=')
                .filter(|(l, r)| !r.starts_with('=') && !l.ends_with(['~', '<', '>', '=']))
            {
                let names: Vec<&str> = lhs.split(',').map(str::trim).collect();
                if names.len() > 1 && names.contains(&name) {
                    return false;
                }
            }
            // `name = rhs`, `name[…] = rhs`
            if let Some(after) = rest.strip_prefix(name) {
                let after = after.trim_start();
                let (element, rhs) = match after.starts_with('[').then(|| parenthesized(after, 0)) {
                    Some(Some((_, close))) => (true, after[close + 1..].trim_start()),
                    _ => (false, after),
                };
                if let Some(rhs) = rhs.strip_prefix('=').filter(|r| !r.starts_with('=')) {
                    let rhs = rhs.trim();
                    bindings += 1;
                    let ok = match (table, element) {
                        // A table of keys: started empty, each element a declared key.
                        (true, false) => rhs == "{}",
                        // An element of a table of keys, or a key: one declared key.
                        (true, true) | (false, false) => self.declared(rhs, seen),
                        // An element stored into a name used as a key: not a key.
                        (false, true) => false,
                    };
                    if !ok {
                        return false;
                    }
                    continue;
                }
            }
            // `for _, name in ipairs(t)`: t is a table of declared keys.
            if let Some(t) = rest
                .strip_prefix("for ")
                .and_then(|r| r.split_once(" in ipairs("))
                .filter(|(vars, _)| vars.split(',').nth(1).map(str::trim) == Some(name))
                .and_then(|(_, t)| t.split_once(')'))
                .map(|(t, _)| t.trim())
            {
                bindings += 1;
                if table || !self.bound(t, true, seen) {
                    return false;
                }
                continue;
            }
            // A parameter: `function f(…, name, …)` or `f = function(…, name, …)`.
            if let Some(at) = line.find("function") {
                let header = &line[at..];
                if let Some(open) = header.find('(') {
                    let function = header["function".len()..open].trim();
                    let function = if function.is_empty() {
                        line[..at]
                            .trim_end()
                            .trim_end_matches('=')
                            .trim_end()
                            .rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                            .next()
                            .unwrap_or("")
                    } else {
                        function
                    };
                    if let Some((params, _)) = parenthesized(header, open)
                        && let Some(position) = split_args(params).iter().position(|p| *p == name)
                    {
                        bindings += 1;
                        if table || !self.passed(function, position, seen) {
                            return false;
                        }
                    }
                }
            }
        }
        // A name never bound here (a global) is nothing declared.
        bindings > 0
    }

    /// Whether every call of `function` passes a declared key at `position`.
    fn passed(&self, function: &str, position: usize, seen: &mut HashSet<String>) -> bool {
        if function == "check" || function == "compensate" {
            // The entry points: their KEYS are the call's.
            return true;
        }
        self.calls
            .iter()
            .filter(|(name, _)| name == function)
            .all(|(_, args)| args.get(position).is_some_and(|a| self.declared(a, seen)))
    }
}

/// Every `redis.call` / `redis.pcall` (or `redis_call` / `redis_pcall`, the library's locals) of
/// `text` whose key argument is not a declared key (see
/// the module docs), as `"<the call>: <the argument>"`; empty when every key is declared.
pub(crate) fn undeclared_keys(text: &str) -> Vec<String> {
    let stripped = strip_comments(text);
    let script = Script {
        text: &stripped,
        calls: calls(&stripped),
    };
    let mut found = Vec::new();
    for (name, args) in &script.calls {
        // `redis.call` / `redis.pcall`, or the locals the Functions library binds them to.
        let is_redis = matches!(
            name.as_str(),
            "call" | "pcall" | "redis_call" | "redis_pcall"
        ) && args
            .first()
            .is_some_and(|a| a.starts_with('\'') || a.starts_with('"'));
        if !is_redis {
            continue;
        }
        let command = args[0].trim_matches(|c| c == '\'' || c == '"');
        let keys = &args[1..];
        for i in key_args(command, keys.len()) {
            let arg = keys[i];
            let variadic = arg.starts_with("unpack(") && matches!(command, "EXISTS" | "DEL");
            let ok = if variadic {
                let inner = &arg["unpack(".len()..arg.len() - 1];
                let table = split_args(inner)[0];
                script.bound(table, true, &mut HashSet::new())
            } else {
                script.declared(arg, &mut HashSet::new())
            };
            if !ok {
                found.push(format!("redis.call('{command}', …): {arg}"));
            }
        }
    }
    found
}

#[test]
fn keys_built_in_lua_are_found() {
    let declared = "
local function read(key) return redis.call('GET', key) end
local function check(KEYS, ARGV)
  local copy = KEYS[3]
  local work = {}
  work[KEYS[1]] = copy
  redis.call('EXISTS', unpack(KEYS, 2, 3))
  redis.call('RENAME', work[KEYS[1]], KEYS[1])
  return read(KEYS[1]), read(copy)
end";
    assert_eq!(undeclared_keys(declared), Vec::<String>::new());
    for (built, what) in [
        ("redis.call('GET', KEYS[1] .. ':b')", "KEYS[1] .. ':b'"),
        ("local m = KEYS[1] .. ':b'\nredis.call('PTTL', m)", "m"),
        (
            "redis.call('SET', receipt_key(KEYS[1], id, 1), 1)",
            "receipt_key",
        ),
        ("return read(KEYS[1] .. ':w')", "'GET', …): key"),
        (
            "local ms = {}\nms[1] = KEYS[1] .. ':b'\nredis.call('EXISTS', unpack(ms))",
            "ms",
        ),
        ("redis.call('COPY', KEYS[1], 'other')", "'other'"),
    ] {
        let text = declared.replace("return read(KEYS[1]), read(copy)", built);
        let found = undeclared_keys(&text);
        assert!(
            found.iter().any(|f| f.contains(what)),
            "{built}: not found ({found:?})"
        );
    }
}
