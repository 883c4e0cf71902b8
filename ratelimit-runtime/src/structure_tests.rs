//! The crate's structure, checked from its sources (issue 22): the macro crate is pinned exactly,
//! and the top-level modules import one another downward only, without a cycle and without the
//! crate root's re-exports.
//!
//! Run them with `cargo test -p ratelimit-runtime --lib structure` (add `-- --include-ignored`
//! while the import check is ignored).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The top-level modules by floor, lowest first. A module may import a module on its own floor
/// or below, never one above; names of modules that do not exist (yet) are fine here, a module
/// that exists and is missing here is not.
const FLOORS: &[&[&str]] = &[
    // Vocabulary: data and pure functions, no I/O, no limiter.
    &[
        "error",
        "net",
        "cost",
        "decision",
        "algorithm",
        "policy",
        "quota",
        "key",
        "limit",
        "observe",
    ],
    // Where counts live.
    &["store"],
    // What a request offers the limiter (peer, forwarding headers, path, user; issue 22).
    &["caller"],
    // The limiter: stores, failure policy, overrides, exemptions, shadow mode, admin calls.
    &["limiter"],
    // The one pipeline every transport calls (issue 22), and today's copies of it.
    &["call", "dynamic"],
    // The transports.
    &["http", "grpc", "layer"],
    // What the macro's generated code names; the tests of the whole crate.
    &["__private", "structure_tests"],
];

// ---------------------------------------------------------------------------------------------
// The macro crate, pinned.

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The lines of `[name]` in a manifest (up to the next table header), trimmed.
fn table<'a>(manifest: &'a str, name: &str) -> Vec<&'a str> {
    let header = format!("[{name}]");
    let mut lines = manifest.lines().map(str::trim);
    let _ = lines.by_ref().find(|l| *l == header);
    lines
        .take_while(|l| !l.starts_with('['))
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

/// The value of `key` in `key = value` (a bare line, or an entry of an inline table), unquoted.
fn value_of(entries: &str, key: &str) -> Option<String> {
    let entries = entries.trim().trim_start_matches('{').trim_end_matches('}');
    entries.split(',').find_map(|entry| {
        let (k, v) = entry.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"').to_owned())
    })
}

/// What `table` says of `dep`: the inline value of `dep = …`, `dep.workspace = true` as
/// `{ workspace = true }`, or the lines of a `[<table>.dep]` table joined as one inline table.
fn dependency(manifest: &str, table_name: &str, dep: &str) -> Option<String> {
    for line in table(manifest, table_name) {
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let k = k.trim();
        if k == dep {
            return Some(v.trim().to_owned());
        }
        if let Some(field) = k.strip_prefix(dep).and_then(|r| r.strip_prefix('.')) {
            return Some(format!("{{ {field} = {} }}", v.trim()));
        }
    }
    let own = table(manifest, &format!("{table_name}.{dep}"));
    (!own.is_empty()).then(|| format!("{{ {} }}", own.join(", ")))
}

/// The version requirement of the runtime's dependency on the macro crate, and the macro
/// crate's own version, following `workspace = true` to the workspace manifest.
fn macro_versions() -> (String, String) {
    let dir = manifest_dir();
    let workspace = read(&dir.join("../Cargo.toml"));
    let runtime = read(&dir.join("Cargo.toml"));
    let macros = read(&dir.join("../ratelimit-macros/Cargo.toml"));

    let spec = dependency(&runtime, "dependencies", "ratelimit-macros")
        .expect("ratelimit-runtime depends on ratelimit-macros");
    let spec = if value_of(&spec, "workspace").as_deref() == Some("true") {
        dependency(&workspace, "workspace.dependencies", "ratelimit-macros")
            .expect("[workspace.dependencies] declares ratelimit-macros")
    } else {
        spec
    };
    let required = if spec.starts_with('"') {
        spec.trim_matches('"').to_owned()
    } else {
        value_of(&spec, "version").unwrap_or_else(|| panic!("no version in {spec}"))
    };

    let package = table(&macros, "package");
    let version = package
        .iter()
        .find_map(|l| value_of(l, "version"))
        .or_else(|| {
            package
                .iter()
                .any(|l| value_of(l, "version.workspace").as_deref() == Some("true"))
                .then(|| {
                    table(&workspace, "workspace.package")
                        .iter()
                        .find_map(|l| value_of(l, "version"))
                })?
        })
        .expect("ratelimit-macros has a version");
    (required, version)
}

/// The generated code calls `__private`, which has no semver promise: the runtime takes exactly
/// the macro crate of its own release (as thiserror and serde pin their derive crates).
#[test]
fn structure_the_runtime_pins_the_macro_crate_exactly() {
    let (required, version) = macro_versions();
    let pinned = required
        .strip_prefix('=')
        .unwrap_or_else(|| panic!("ratelimit-macros = {required:?}: expected \"={version}\""));
    assert_eq!(pinned.trim(), version, "ratelimit-macros = {required:?}");
}

// ---------------------------------------------------------------------------------------------
// The import graph.

/// `src` with comments, string and character literals blanked out (newlines kept, so lines
/// still count), ready to search for paths.
fn code_only(src: &str) -> Vec<char> {
    let c: Vec<char> = src.chars().collect();
    let blank = |ch: char| if ch == '\n' { '\n' } else { ' ' };
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
            '/' if c.get(i + 1) == Some(&'*') => {
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
            }
            // Raw strings: r"…", r#"…"#, br"…" (the prefix is not the end of an identifier).
            'r' | 'b' if !prev_ident && raw_string_len(&c[i..]).is_some() => {
                let len = raw_string_len(&c[i..]).unwrap_or(1);
                out.extend(c[i..i + len].iter().map(|&ch| blank(ch)));
                i += len;
            }
            '"' => {
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
            }
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

/// The length of the raw string literal at the start of `c`, if one starts there.
fn raw_string_len(c: &[char]) -> Option<usize> {
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

fn is_ident(ch: char) -> bool {
    ch.is_alphanumeric() || ch == '_'
}

fn skip_ws(c: &[char], mut i: usize) -> usize {
    while i < c.len() && c[i].is_whitespace() {
        i += 1;
    }
    i
}

fn ident_at(c: &[char], i: usize) -> (String, usize) {
    let end = (i..c.len()).find(|&j| !is_ident(c[j])).unwrap_or(c.len());
    (c[i..end].iter().collect(), end)
}

/// Every `crate::<first segment>` in `code` (`$crate::` too), with its line: `use` statements,
/// expressions, types, and each item of a grouped `crate::{a::X, b::{Y, Z}}`. Visibilities
/// (`pub(in crate::m)`) are not imports and are left out.
fn crate_paths(code: &[char]) -> Vec<(String, usize)> {
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
            // The first segment of each item at depth 1.
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
            i = k;
        } else if code.get(j).is_some_and(|&ch| is_ident(ch)) {
            let (name, end) = ident_at(code, j);
            found.push((name, line_of(j)));
            i = end;
        }
    }
    found
}

/// Whether the `crate` at `at` follows `(in`: a visibility, `pub(in crate::m)`.
fn visibility_path(code: &[char], at: usize) -> bool {
    let before: String = code[..at].iter().collect();
    let before = before.trim_end();
    before
        .strip_suffix("in")
        .is_some_and(|rest| rest.trim_end().ends_with('('))
}

/// The names the crate root re-exports (`pub use a::{B, c as d};` → `B`, `d`).
fn root_reexports(lib: &[char]) -> BTreeSet<String> {
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

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
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
struct Site {
    file: String,
    line: usize,
    path: String,
}

impl std::fmt::Display for Site {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{} (crate::{})", self.file, self.line, self.path)
    }
}

/// The import graph of the top-level modules: each edge with its first site, and the uses of
/// the crate root's items (re-exports or not) inside the crate.
struct Graph {
    modules: BTreeSet<String>,
    edges: BTreeMap<(String, String), Vec<Site>>,
    root_uses: Vec<Site>,
}

fn graph() -> Graph {
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
fn cycles(g: &Graph) -> Vec<Vec<String>> {
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
fn violations(g: &Graph) -> Vec<String> {
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

/// No import cycle between top-level modules, no use of the crate root's items inside the
/// crate, no import of a module on a higher floor (`FLOORS`). Every violation is listed.
#[test]
fn structure_modules_import_downward_without_cycles() {
    let g = graph();
    let found = violations(&g);
    assert!(
        found.is_empty(),
        "{} structure violation(s):\n{}",
        found.len(),
        found.join("\n")
    );
}

/// The scanner finds paths in `use` and in expressions, reads grouped imports, and skips
/// comments, strings and visibilities.
#[test]
fn structure_scanner_reads_paths_and_skips_comments_and_strings() {
    let src = concat!(
        r#"
use crate::{a::X, b::{Y, Z}, c};
use crate::d::E; // crate::commented
/* crate::block /* nested crate::deeper */ still */
pub(in crate::vis) fn f<'a>(s: &'a str) -> char {
    let _ = "crate::in_string";
"#,
        // A raw string with a quote inside: `r#"crate::"raw""#`.
        "    let _ = r#\"crate::\"raw\"\"#;\n",
        r#"    let _ = crate::e::call();
    let _ = $crate::f::g;
    let _ = ratelimit_crate::no;
    '"'
}
fn h() { let _ = crate::G; }
"#
    );
    let names: Vec<String> = crate_paths(&code_only(src))
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["a", "b", "c", "d", "e", "f", "G"]);
    let lines: Vec<usize> = crate_paths(&code_only(src))
        .into_iter()
        .map(|(_, l)| l)
        .collect();
    assert_eq!(lines, [2, 2, 2, 3, 8, 9, 13]);

    let lib = code_only("pub use a::{B, c as d};\npub use e::F;\nmod g;\n");
    let names: Vec<String> = root_reexports(&lib).into_iter().collect();
    assert_eq!(names, ["B", "F", "d"]);
}

/// The crate's graph as it is, for a reader (`--nocapture`): every edge and its first site.
#[test]
#[ignore = "prints the import graph; run with --ignored --nocapture"]
fn structure_print_the_import_graph() {
    let g = graph();
    for ((a, b), sites) in &g.edges {
        println!("{a} -> {b}  ({} sites, first {})", sites.len(), sites[0]);
    }
    for v in violations(&g) {
        println!("! {v}");
    }
}
