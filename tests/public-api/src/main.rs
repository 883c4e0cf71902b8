//! The public API of `ratelimit-runtime` with every feature, checked against the snapshot
//! `ratelimit-runtime.txt` beside this crate's manifest, so that any change to the surface shows
//! in review as a diff of that file, and fails `.ci/run` until the snapshot says it.
//!
//! `cargo run -p ratelimit-public-api` checks; `cargo run -p ratelimit-public-api -- --bless`
//! rewrites the snapshot.
//!
//! The list comes from rustdoc's JSON output, which stable rustdoc writes only with
//! `RUSTC_BOOTSTRAP=1`. This binary is the `RUSTDOC` of that one `cargo rustdoc` call and sets
//! the variable for rustdoc alone: set for the whole build, it would change what the build
//! scripts that read it (anyhow's, thiserror's) print, so the next ordinary build would rebuild
//! those crates and everything above them.

use std::collections::HashMap;
use std::env;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use public_api::PublicItem;
use public_api::tokens::Token;

/// The snapshot, beside this crate's manifest.
const SNAPSHOT: &str = "ratelimit-runtime.txt";
/// Set (to the real rustdoc) when this binary runs as cargo's `RUSTDOC`.
const AS_RUSTDOC: &str = "RATELIMIT_PUBLIC_API_RUSTDOC";
/// What a developer runs to accept a change of the surface.
const BLESS: &str = "cargo run -p ratelimit-public-api -- --bless";

fn main() -> ExitCode {
    if let Some(rustdoc) = env::var_os(AS_RUSTDOC) {
        return run_rustdoc(rustdoc);
    }
    let bless = match env::args().nth(1).as_deref() {
        None => false,
        Some("--bless") => true,
        Some(other) => {
            eprintln!(
                "unknown argument `{other}`; usage: cargo run -p ratelimit-public-api [-- --bless]"
            );
            return ExitCode::FAILURE;
        }
    };
    match check(bless) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the real rustdoc with the arguments cargo gave, allowed to write JSON.
fn run_rustdoc(rustdoc: OsString) -> ExitCode {
    let status = Command::new(rustdoc)
        .args(env::args_os().skip(1))
        .env("RUSTC_BOOTSTRAP", "1")
        .env_remove(AS_RUSTDOC)
        .status();
    match status {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(status) => ExitCode::from(u8::try_from(status.code().unwrap_or(1)).unwrap_or(1)),
        Err(error) => {
            eprintln!("error: cannot run rustdoc: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Lists the API, then compares it with the snapshot (or rewrites the snapshot).
fn check(bless: bool) -> Result<ExitCode, String> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let json = rustdoc_json(here)?;
    let listed = list(&json)?;
    let snapshot_path = here.join(SNAPSHOT);
    if bless {
        fs::write(&snapshot_path, &listed)
            .map_err(|e| format!("cannot write {}: {e}", snapshot_path.display()))?;
        println!("wrote {}", snapshot_path.display());
        return Ok(ExitCode::SUCCESS);
    }
    let recorded = fs::read_to_string(&snapshot_path).unwrap_or_default();
    if recorded == listed {
        println!("public API of ratelimit-runtime: as in {SNAPSHOT}");
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "The public API of ratelimit-runtime (every feature) differs from {}\n\
         (- only in the snapshot, + only in the crate):\n",
        snapshot_path.display()
    );
    eprint!("{}", line_diff(&recorded, &listed));
    eprintln!(
        "\nIf the change is meant: run `{BLESS}`, commit the snapshot with the change, and \
         describe the change in CHANGELOG.md (for an item removed or renamed, what replaces \
         it). If it is not meant, the lines above are the items that changed."
    );
    Ok(ExitCode::FAILURE)
}

/// Writes the crate's rustdoc JSON (the workspace's target directory, so that the dependencies
/// checked for `cargo doc` are reused) and returns its path.
fn rustdoc_json(here: &Path) -> Result<PathBuf, String> {
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let rustdoc = env::var_os("RUSTDOC").unwrap_or_else(|| "rustdoc".into());
    let this = env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let status = Command::new(&cargo)
        .current_dir(here)
        .args([
            "rustdoc",
            "--quiet",
            "-p",
            "ratelimit-runtime",
            "--all-features",
            "--lib",
        ])
        .args(["--", "-Z", "unstable-options", "--output-format", "json"])
        .env("RUSTDOC", this)
        .env(AS_RUSTDOC, rustdoc)
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err(format!("cargo rustdoc failed ({status})"));
    }
    let metadata = Command::new(&cargo)
        .current_dir(here)
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    let metadata: serde_json::Value = serde_json::from_slice(&metadata.stdout)
        .map_err(|e| format!("cannot read cargo metadata: {e}"))?;
    let target = metadata["target_directory"]
        .as_str()
        .ok_or("cargo metadata names no target directory")?;
    Ok(Path::new(target).join("doc/ratelimit_runtime.json"))
}

/// The snapshot's text: a summary (root items, public modules, items in all), then one line per
/// public item.
fn list(json: &Path) -> Result<String, String> {
    let text =
        fs::read_to_string(json).map_err(|e| format!("cannot read {}: {e}", json.display()))?;
    let format: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", json.display()))?;
    let format = format["format_version"].as_u64().unwrap_or(0);
    if format != u64::from(rustdoc_types::FORMAT_VERSION) {
        return Err(format!(
            "rustdoc wrote JSON format {format}, and public-api reads format {}: pin the \
             public-api release that reads {format} in tests/public-api/Cargo.toml (its \
             rustdoc-types dependency is numbered by format), with rustdoc-types alike",
            rustdoc_types::FORMAT_VERSION
        ));
    }
    let api = public_api::Builder::from_rustdoc_json(json)
        .omit_blanket_impls(true)
        .build()
        .map_err(|e| format!("cannot list the API: {e}"))?;
    let items: Vec<&PublicItem> = api.items().collect();
    let mut root = Vec::new();
    let mut modules = Vec::new();
    for item in &items {
        match declared(item) {
            Some((kind, path)) if kind == "mod" && path.len() > 1 => {
                modules.push(path[1..].join("::"));
            }
            Some((_, path)) if path.len() == 2 => root.push(path[1].clone()),
            _ => {}
        }
    }
    root.sort_unstable();
    root.dedup();
    modules.sort_unstable();
    let mut out = String::new();
    out.push_str(HEADER);
    let _ = writeln!(out, "# root items ({}): {}", root.len(), root.join(", "));
    let _ = writeln!(
        out,
        "# public modules ({}): {}",
        modules.len(),
        modules.join(", ")
    );
    let _ = writeln!(out, "# public items in all: {}", items.len());
    out.push('\n');
    for item in &items {
        let _ = writeln!(out, "{item}");
    }
    Ok(out)
}

const HEADER: &str = "\
# The public API of ratelimit-runtime with every feature, one line per item, as rustdoc's JSON
# lists it (items under #[doc(hidden)], such as `__private`, are not in it; blanket impls are left
# out). Checked by .ci/run (`cargo run -p ratelimit-public-api`); after a change of the surface,
# update it with `cargo run -p ratelimit-public-api -- --bless` and describe the change in
# CHANGELOG.md.
";

/// The kind and path of an item a line declares (`pub struct ratelimit_runtime::Limit` gives
/// `struct` and `[ratelimit_runtime, Limit]`); `None` for impls and for lines without a kind.
fn declared(item: &PublicItem) -> Option<(String, Vec<String>)> {
    let mut tokens = item.tokens();
    let kind = loop {
        match tokens.next()? {
            Token::Kind(kind) => break kind.clone(),
            Token::Keyword(keyword) if keyword == "impl" => return None,
            _ => {}
        }
    };
    let mut path = Vec::new();
    // Generic parameters inside the path (`CallerView<'a>::ip`) are skipped.
    let mut depth = 0_usize;
    for token in tokens.skip_while(|token| **token == Token::Whitespace) {
        match token {
            Token::Symbol(symbol)
                if symbol.contains('<') || (depth > 0 && symbol.contains('>')) =>
            {
                depth = depth + symbol.matches('<').count() - symbol.matches('>').count();
            }
            _ if depth > 0 => {}
            Token::Identifier(name) | Token::Type(name) | Token::Function(name) => {
                path.push(name.clone());
            }
            Token::Symbol(symbol) if symbol == "::" => {}
            _ => break,
        }
    }
    Some((kind, path))
}

/// The lines only in `old` (`-`) and only in `new` (`+`), each side in its own order.
fn line_diff(old: &str, new: &str) -> String {
    let mut counts: HashMap<&str, i64> = HashMap::new();
    for line in old.lines() {
        *counts.entry(line).or_default() += 1;
    }
    for line in new.lines() {
        *counts.entry(line).or_default() -= 1;
    }
    let mut out = String::new();
    let mut removed = counts.clone();
    for line in old.lines() {
        if let Some(n) = removed.get_mut(line).filter(|n| **n > 0) {
            *n -= 1;
            let _ = writeln!(out, "- {line}");
        }
    }
    for line in new.lines() {
        if let Some(n) = counts.get_mut(line).filter(|n| **n < 0) {
            *n += 1;
            let _ = writeln!(out, "+ {line}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::line_diff;

    #[test]
    fn a_diff_names_each_line_only_on_one_side_once_per_copy() {
        let old = "a\nb\nb\nc\n";
        let new = "a\nb\nd\n";
        assert_eq!(line_diff(old, new), "- b\n- c\n+ d\n");
        assert_eq!(line_diff(new, new), "");
    }
}
