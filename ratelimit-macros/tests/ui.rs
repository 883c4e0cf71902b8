//! Compile-pass and compile-fail cases of `#[rate_limit]`: every `.stderr` is written by
//! `TRYBUILD=overwrite cargo test -p ratelimit-macros --test ui`, never by hand.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
