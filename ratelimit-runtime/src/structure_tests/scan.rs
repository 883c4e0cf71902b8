//! The source scanner of the structure tests: code without comments and strings, the
//! `crate::` paths it names, and the graph of top-level modules with its cycles and violations.

#![allow(clippy::wildcard_imports)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::*;

/// `src` with comments, string and character literals blanked out (newlines kept, so lines
/// still count), ready to search for paths.
pub(super) fn code_only(src: &str) -> Vec<char> {
    let c: Vec<char> = src.chars().collect();
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut out = Vec::with_capacity(c.len());
    let mut i = 0;
    while i < c.len() {
        let prev_ident = i > 0 && ident(c[i - 1]);
        match c[i] {
            '/' if c.get(i + 1) == Some(&'/') => {
                while i < c.len() && c[i] != '\n' {
                    out.push(' ');
                    i += 1;
                }
            }
            '/' if c.get(i + 1) == Some(&'*') => i = blank_block_comment(&c, i, &mut out),
            // Raw strings: r"…", r#"…"#, br"…" (the prefix is not the end of an identifier).
            'r' | 'b' if !prev_ident && raw_string_len(&c[i..]).is_some() => {
                let len = raw_string_len(&c[i..]).unwrap_or(1);
                out.extend(c[i..i + len].iter().map(|&ch| blank(ch)));
                i += len;
            }
            '"' => i = blank_string(&c, i, &mut out),
            // A character literal ('x', '\n', '\''), not a lifetime or a label ('a, 'outer:).
            '\'' => {
                let end = if c.get(i + 1) == Some(&'\\') {
                    (i + 3..c.len()).find(|&j| c[j] == '\'')
                } else if c.get(i + 2) == Some(&'\'') {
                    Some(i + 2)
                } else {
                    None
                };
                if let Some(end) = end {
                    out.extend(c[i..=end].iter().map(|&ch| blank(ch)));
                    i = end + 1;
                } else {
                    out.push('\'');
                    i += 1;
                }
            }
            ch => {
                out.push(ch);
                i += 1;
            }
        }
    }
    out
}

/// A blank in place of `ch` (a newline stays one).
fn blank(ch: char) -> char {
    if ch == '\n' { '\n' } else { ' ' }
}

/// Blanks the (nested) block comment starting at `c[i]` into `out`: the index after it.
fn blank_block_comment(c: &[char], mut i: usize, out: &mut Vec<char>) -> usize {
    let mut depth = 0;
    while i < c.len() {
        if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            depth += 1;
            out.extend([' ', ' ']);
            i += 2;
        } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
            depth -= 1;
            out.extend([' ', ' ']);
            i += 2;
            if depth == 0 {
                break;
            }
        } else {
            out.push(blank(c[i]));
            i += 1;
        }
    }
    i
}

/// Blanks the string literal starting at `c[i]` (its quote) into `out`: the index after it.
fn blank_string(c: &[char], mut i: usize, out: &mut Vec<char>) -> usize {
    out.push(' ');
    i += 1;
    while i < c.len() && c[i] != '"' {
        let step = if c[i] == '\\' { 2 } else { 1 };
        for _ in 0..step.min(c.len() - i) {
            out.push(blank(c[i]));
            i += 1;
        }
    }
    if i < c.len() {
        out.push(' ');
        i += 1;
    }
    i
}

/// The length of the raw string literal at the start of `c`, if one starts there.
pub(super) fn raw_string_len(c: &[char]) -> Option<usize> {
    let mut i = usize::from(c.first() == Some(&'b'));
    if c.get(i) != Some(&'r') {
        return None;
    }
    i += 1;
    let hashes = c[i..].iter().take_while(|&&ch| ch == '#').count();
    i += hashes;
    if c.get(i) != Some(&'"') {
        return None;
    }
    let close: Vec<char> = std::iter::once('"')
        .chain(std::iter::repeat_n('#', hashes))
        .collect();
    (i + 1..=c.len().saturating_sub(close.len()))
        .find(|&j| c[j..j + close.len()] == close[..])
        .map(|j| j + close.len())
}

pub(super) fn is_ident(ch: char) -> bool {
    ch.is_alphanumeric() || ch == '_'
}

pub(super) fn skip_ws(c: &[char], mut i: usize) -> usize {
    while i < c.len() && c[i].is_whitespace() {
        i += 1;
    }
    i
}

pub(super) fn ident_at(c: &[char], i: usize) -> (String, usize) {
    let end = (i..c.len()).find(|&j| !is_ident(c[j])).unwrap_or(c.len());
    (c[i..end].iter().collect(), end)
}

/// Every `crate::<first segment>` in `code` (`$crate::` too), with its line: `use` statements,
/// expressions, types, and each item of a grouped `crate::{a::X, b::{Y, Z}}`. Visibilities
/// (`pub(in crate::m)`) are not imports and are left out.
pub(super) fn crate_paths(code: &[char]) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    let line_of = |i: usize| 1 + code[..i].iter().filter(|&&ch| ch == '\n').count();
    let mut i = 0;
    while let Some(at) = (i..code.len().saturating_sub(4)).find(|&j| {
        code[j..j + 5] == ['c', 'r', 'a', 't', 'e']
            && (j == 0 || !is_ident(code[j - 1]))
            && code.get(j + 5).is_none_or(|&ch| !is_ident(ch))
    }) {
        i = at + 5;
        if visibility_path(code, at) {
            continue; // pub(in crate::…)
        }
        let j = skip_ws(code, i);
        if code.get(j..j + 2) != Some(&[':', ':'][..]) {
            continue;
        }
        let j = skip_ws(code, j + 2);
        if code.get(j) == Some(&'{') {
            i = group_paths(code, j, &line_of, &mut found);
        } else if code.get(j).is_some_and(|&ch| is_ident(ch)) {
            let (name, end) = ident_at(code, j);
            found.push((name, line_of(j)));
            i = end;
        }
    }
    found
}

/// The first segment of each item at depth 1 of the group `{…}` at `code[j]`, with its line,
/// into `found`: the index after the group.
fn group_paths(
    code: &[char],
    j: usize,
    line_of: &impl Fn(usize) -> usize,
    found: &mut Vec<(String, usize)>,
) -> usize {
    let mut depth = 1;
    let mut k = j + 1;
    let mut item_start = true;
    while k < code.len() && depth > 0 {
        match code[k] {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 1 => item_start = true,
            ch if item_start && is_ident(ch) && depth == 1 => {
                let (name, end) = ident_at(code, k);
                found.push((name, line_of(k)));
                item_start = false;
                k = end;
                continue;
            }
            _ => {}
        }
        k += 1;
    }
    k
}

/// Whether the `crate` at `at` follows `(in`: a visibility, `pub(in crate::m)`.
pub(super) fn visibility_path(code: &[char], at: usize) -> bool {
    let before: String = code[..at].iter().collect();
    let before = before.trim_end();
    before
        .strip_suffix("in")
        .is_some_and(|rest| rest.trim_end().ends_with('('))
}

/// The names the crate root re-exports (`pub use a::{B, c as d};` → `B`, `d`).
pub(super) fn root_reexports(lib: &[char]) -> BTreeSet<String> {
    let text: String = lib.iter().collect();
    let mut names = BTreeSet::new();
    for stmt in text.split(';') {
        let Some(at) = stmt.find("pub use ") else {
            continue;
        };
        let body = &stmt[at + "pub use ".len()..];
        // A leaf is an identifier followed by `,`, `}`, the end, or named by `as`.
        let chars: Vec<char> = body.chars().collect();
        let mut k = 0;
        while k < chars.len() {
            if is_ident(chars[k]) {
                let (name, end) = ident_at(&chars, k);
                let next = skip_ws(&chars, end);
                let leaf = next >= chars.len() || matches!(chars[next], ',' | '}');
                let renamed =
                    next + 1 < chars.len() && chars[next] == 'a' && chars[next + 1] == 's';
                if leaf && name != "self" {
                    names.insert(name);
                }
                k = if renamed { next + 2 } else { end };
            } else {
                k += 1;
            }
        }
    }
    names
}

/// Every function with a body in `code` (as [`code_only`] leaves it): its name, the line of
/// its `fn` and its length in lines, to the line of its closing brace. A declaration without
/// a body (`fn f();`) and a function pointer type (`fn(u8)`) are left out.
pub(super) fn function_lengths(code: &[char]) -> Vec<(String, usize, usize)> {
    let line_of = |i: usize| 1 + code[..i].iter().filter(|&&ch| ch == '\n').count();
    let mut found = Vec::new();
    let mut i = 0;
    while let Some(at) = (i..code.len().saturating_sub(2)).find(|&j| {
        code[j..j + 2] == ['f', 'n']
            && (j == 0 || !is_ident(code[j - 1]))
            && code[j + 2].is_whitespace()
    }) {
        i = at + 2;
        let name_at = skip_ws(code, i);
        let (name, _) = ident_at(code, name_at);
        if name.is_empty() {
            continue;
        }
        if let Some(close) = body_end(code, name_at) {
            found.push((name, line_of(at), line_of(close) - line_of(at) + 1));
        }
    }
    found
}

/// The index of the closing brace of the body of the function whose signature starts at
/// `code[i]`; `None` when a `;` ends the signature first.
fn body_end(code: &[char], i: usize) -> Option<usize> {
    let mut nesting = 0_i32; // () and []
    let mut k = i;
    while k < code.len() {
        match code[k] {
            '(' | '[' => nesting += 1,
            ')' | ']' => nesting -= 1,
            ';' if nesting == 0 => return None,
            '{' if nesting == 0 => break,
            _ => {}
        }
        k += 1;
    }
    let mut depth = 0_i32;
    for (j, &ch) in code.iter().enumerate().skip(k) {
        match ch {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(j);
                }
            }
            _ => {}
        }
    }
    None
}

/// The lines of `src` that name an issue by its number (the word, then a number, with or
/// without `#`, in any case): history, which a reader of the code cannot follow.
pub(super) fn issue_references(src: &str) -> Vec<usize> {
    let lower = src.to_lowercase();
    let mut lines = Vec::new();
    for (n, line) in lower.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("issue") {
            let after = rest[at + 5..].trim_start_matches([' ', '#']);
            let word_start = at == 0 || !rest[..at].ends_with(|c: char| c.is_alphanumeric());
            if word_start && after.starts_with(|c: char| c.is_ascii_digit()) {
                lines.push(n + 1);
                break;
            }
            rest = &rest[at + 5..];
        }
    }
    lines
}

pub(super) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// An import of one top-level module by another: where it is written.
#[derive(Debug, Clone)]
pub(super) struct Site {
    pub(super) file: String,
    pub(super) line: usize,
    pub(super) path: String,
}

impl std::fmt::Display for Site {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{} (crate::{})", self.file, self.line, self.path)
    }
}

/// The import graph of the top-level modules: each edge with its first site, and the uses of
/// the crate root's items (re-exports or not) inside the crate.
pub(super) struct Graph {
    pub(super) modules: BTreeSet<String>,
    pub(super) edges: BTreeMap<(String, String), Vec<Site>>,
    pub(super) root_uses: Vec<Site>,
}

pub(super) fn graph() -> Graph {
    let src = manifest_dir().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let module_of = |path: &Path| -> String {
        let rel = path.strip_prefix(&src).expect("under src");
        let first = rel.components().next().expect("a file name");
        let first = first.as_os_str().to_string_lossy();
        first.strip_suffix(".rs").unwrap_or(&first).to_owned()
    };
    let modules: BTreeSet<String> = files
        .iter()
        .map(|p| module_of(p))
        .filter(|m| m != "lib")
        .collect();
    let lib = code_only(&read(&src.join("lib.rs")));
    let reexports = root_reexports(&lib);

    let mut edges: BTreeMap<(String, String), Vec<Site>> = BTreeMap::new();
    let mut root_uses = Vec::new();
    for path in &files {
        let from = module_of(path);
        let file = path
            .strip_prefix(manifest_dir())
            .unwrap_or(path)
            .display()
            .to_string();
        for (name, line) in crate_paths(&code_only(&read(path))) {
            let site = Site {
                file: file.clone(),
                line,
                path: name.clone(),
            };
            if !modules.contains(&name) || reexports.contains(&name) {
                root_uses.push(site);
            } else if from != "lib" && name != from {
                edges.entry((from.clone(), name)).or_default().push(site);
            }
        }
    }
    Graph {
        modules,
        edges,
        root_uses,
    }
}

/// The cycles of the graph: one per strongly connected component of more than one module, as
/// a path that comes back to its start.
pub(super) fn cycles(g: &Graph) -> Vec<Vec<String>> {
    let next = |m: &str| -> Vec<String> {
        g.edges
            .keys()
            .filter(|(a, _)| a == m)
            .map(|(_, b)| b.clone())
            .collect()
    };
    // Reachability by depth-first search from every module (the graph is small).
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_owned()];
        while let Some(m) = stack.pop() {
            for n in next(&m) {
                if seen.insert(n.clone()) {
                    stack.push(n);
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<String, BTreeSet<String>> =
        g.modules.iter().map(|m| (m.clone(), reach(m))).collect();
    let mut done = BTreeSet::new();
    let mut found = Vec::new();
    for m in &g.modules {
        if done.contains(m) || !reaches[m].contains(m) {
            continue;
        }
        let component: BTreeSet<String> = reaches[m]
            .iter()
            .filter(|n| reaches[*n].contains(m))
            .cloned()
            .collect();
        done.extend(component.iter().cloned());
        // The shortest way back to `m` inside the component (breadth first).
        let mut parent: BTreeMap<String, String> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([m.clone()]);
        'search: while let Some(at) = queue.pop_front() {
            for n in next(&at) {
                if !component.contains(&n) || parent.contains_key(&n) {
                    continue;
                }
                parent.insert(n.clone(), at.clone());
                if n == *m {
                    break 'search;
                }
                queue.push_back(n);
            }
        }
        let mut path = vec![m.clone()];
        let mut at = parent[m].clone();
        while at != *m {
            path.push(at.clone());
            at = parent[&at].clone();
        }
        path.push(m.clone());
        path.reverse();
        found.push(path);
    }
    found
}

/// Every way the import graph breaks the rules, one line each (empty: none).
pub(super) fn violations(g: &Graph) -> Vec<String> {
    let mut out = Vec::new();
    let site = |a: &str, b: &str| g.edges[&(a.to_owned(), b.to_owned())][0].to_string();
    for cycle in cycles(g) {
        let mut line = format!("cycle {}:", cycle.join(" -> "));
        for pair in cycle.windows(2) {
            let _ = write!(line, " {}", site(&pair[0], &pair[1]));
        }
        out.push(line);
    }
    for s in &g.root_uses {
        out.push(format!(
            "root item: {s} names the crate root, not the module the item lives in"
        ));
    }
    let floor = |m: &str| FLOORS.iter().position(|f| f.contains(&m));
    for m in &g.modules {
        if floor(m).is_none() {
            out.push(format!("module `{m}` has no floor in FLOORS"));
        }
    }
    for ((a, b), sites) in &g.edges {
        if let (Some(fa), Some(fb)) = (floor(a), floor(b))
            && fa < fb
        {
            for s in sites {
                out.push(format!(
                    "upward: `{a}` (floor {fa}) imports `{b}` (floor {fb}) at {s}"
                ));
            }
        }
    }
    out
}
