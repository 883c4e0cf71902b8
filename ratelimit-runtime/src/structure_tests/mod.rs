//! The crate's structure, checked from its sources: the macro crate is pinned exactly,
//! and the top-level modules import one another downward only, without a cycle and without the
//! crate root's re-exports.
//!
//! Run them with `cargo test -p ratelimit-runtime --lib structure`.

use std::path::{Path, PathBuf};

mod scan;

use self::scan::*;

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
        "lease",
        "observe",
    ],
    // Where counts live.
    &["store"],
    // What a request offers the limiter (peer, forwarding headers, path, user), and the
    // exemptions that read it.
    &["caller", "exempt"],
    // The limiter: stores, failure policy, overrides, exemptions, shadow mode, admin calls.
    &["limiter"],
    // The one pipeline every transport calls, and today's copies of it.
    &["call", "dynamic"],
    // The transports.
    &["http", "grpc", "layer", "client"],
    // Support for users' own tests (feature `testing`).
    &["testing"],
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

// ---------------------------------------------------------------------------------------------
// Short functions, and no history in the code.

/// The longest a function of the runtime or the macro crate may run, `fn` line to closing
/// brace.
const MAX_FUNCTION_LINES: usize = 80;

/// The sources of both crates, each with its path as a reader finds it.
fn both_crates_sources() -> Vec<(String, String)> {
    sources_in(&["src", "../ratelimit-macros/src"])
}

/// The Rust sources under `dirs` (relative to this crate), each with its path as a reader
/// finds it.
fn sources_in(dirs: &[&str]) -> Vec<(String, String)> {
    let root = manifest_dir();
    let mut files = Vec::new();
    for dir in dirs {
        rust_files(&root.join(dir), &mut files);
    }
    files
        .into_iter()
        .map(|path| {
            let shown = path
                .strip_prefix(&root)
                .unwrap_or(&path)
                .display()
                .to_string();
            (shown, read(&path))
        })
        .collect()
}

/// No function of either crate runs past [`MAX_FUNCTION_LINES`]: each one found is named
/// with its file, line and length.
#[test]
fn structure_no_function_runs_past_eighty_lines() {
    let mut long = Vec::new();
    for (file, src) in both_crates_sources() {
        for (name, line, lines) in function_lengths(&code_only(&src)) {
            if lines > MAX_FUNCTION_LINES {
                long.push(format!("{file}:{line} fn {name}: {lines} lines"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions past {MAX_FUNCTION_LINES} lines:\n{}",
        long.join("\n")
    );
}

/// No comment or string of the workspace's sources (both crates, the tests, the examples,
/// the benchmarks) names an issue by its number: history lives in git.
#[test]
fn structure_no_source_names_an_issue_by_number() {
    let dirs = [
        "src",
        "../ratelimit-macros/src",
        "../tests/src",
        "../tests/tests",
        "../tests/bench/src",
        "../examples/src",
    ];
    let found: Vec<String> = sources_in(&dirs)
        .into_iter()
        .flat_map(|(file, src)| {
            issue_references(&src)
                .into_iter()
                .map(move |line| format!("{file}:{line}"))
        })
        .collect();
    assert!(
        found.is_empty(),
        "issue numbers in the sources:\n{}",
        found.join("\n")
    );
}

/// The two scanners above count what they claim: a function's lines from `fn` to its
/// brace (braces in strings, comments and characters not counted; declarations and pointer
/// types left out), and an issue number in any case, with or without `#`.
#[test]
fn structure_function_and_issue_scanners_count_what_they_claim() {
    let src = concat!(
        "trait T { fn declared(&self); }\n",
        "fn short(f: fn(u8) -> u8, a: [u8; 2]) -> u8 {\n",
        "    let _ = \"}}}\"; // }\n",
        "    let _ = '}';\n",
        "    f(a[0])\n",
        "}\n",
        "pub(crate) async fn nested() {\n",
        "    fn inner() {}\n",
        "}\n",
    );
    let found = function_lengths(&code_only(src));
    let expected = [("short", 2, 5), ("nested", 7, 3), ("inner", 8, 1)];
    let found: Vec<(&str, usize, usize)> =
        found.iter().map(|(n, l, c)| (n.as_str(), *l, *c)).collect();
    assert_eq!(found, expected);
    let word = "issue";
    let text =
        format!("a\n// {word} 12\n/// Fixes {word} #3.\nmisissue 4\n{word}s 5\n// {word} tracker");
    assert_eq!(issue_references(&text), [2, 3]);
    let upper = format!("// {} 9", word.to_uppercase());
    assert_eq!(issue_references(&upper), [1]);
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
