//! "The card's line compiles in a crate enabling only the Axum integration": this crate enables
//! both integrations (and Cargo unifies features across a workspace), so the proof is a tiny
//! crate outside the workspace, `tests/axum-only`, built and tested here with its own target
//! directory (as trybuild does), so that `cargo test --workspace` covers it.

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives in the workspace")
        .to_path_buf()
}

fn cargo(args: &[&str]) -> (bool, String) {
    let root = workspace_root();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args(args)
        .arg("--manifest-path")
        .arg(root.join("tests/axum-only/Cargo.toml"))
        .current_dir(&root)
        .output()
        .expect("run cargo");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

#[test]
fn the_card_line_compiles_and_limits_with_only_the_axum_integration() {
    // Only `axum` is on for ratelimit-runtime there.
    let (ok, tree) = cargo(&["tree", "-e", "features", "-i", "ratelimit-runtime"]);
    assert!(ok, "{tree}");
    assert!(
        tree.contains("ratelimit-runtime feature \"axum\""),
        "{tree}"
    );
    assert!(!tree.contains("feature \"actix\""), "{tree}");

    let target = workspace_root().join("target/axum-only");
    let target = target.to_str().expect("a UTF-8 path");
    let (ok, out) = cargo(&["test", "--target-dir", target]);
    assert!(ok, "cargo test of tests/axum-only failed:\n{out}");
    assert!(
        out.contains("the_card_line_limits_by_ip_with_only_axum_enabled ... ok"),
        "{out}"
    );
}

#[test]
fn a_grpc_method_without_the_tonic_feature_is_one_error_naming_the_feature() {
    let target = workspace_root().join("target/axum-only");
    let target = target.to_str().expect("a UTF-8 path");
    let (ok, out) = cargo(&[
        "check",
        "--features",
        "grpc-without-tonic",
        "--target-dir",
        target,
    ]);
    assert!(!ok, "a gRPC method built without the tonic feature:\n{out}");
    assert!(
        out.contains("needs the `tonic` feature of ratelimit-runtime"),
        "{out}"
    );
    // That one error, spanned at the `by`, and no type error from the generated code.
    assert_eq!(out.matches("error[").count(), 1, "{out}");
    assert!(out.contains("error[E0080]"), "{out}");
    assert!(out.contains("by = \"ip\""), "{out}");
}
