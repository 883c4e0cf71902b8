//! Compile-time checks the macro evaluates, spanned at the argument that needs a feature, so
//! that a missing feature is one clear error. Reachable through `__private` only.

/// `RequireOneFramework::<()>::OK` compiles unless both HTTP integrations are enabled: a
/// `count = …` handler turns its output into its framework's response, so with both it
/// names its framework.
#[doc(hidden)]
#[derive(Debug)]
pub struct RequireOneFramework<T>(T);

impl<T> RequireOneFramework<T> {
    /// `()`, or a compile error asking for `framework = …`.
    pub const OK: () = assert!(
        !(cfg!(feature = "axum") && cfg!(feature = "actix")),
        "`count` on a handler turns its output into a response of its framework, and both the `axum` and `actix` features of ratelimit-runtime are enabled: name the framework, framework = \"axum\" or framework = \"actix\""
    );
}

const INTEGRATION_ENABLED: bool = cfg!(any(feature = "axum", feature = "actix"));

/// `RequireHttp::<()>::OK` compiles only when an HTTP integration is enabled: the macro
/// evaluates it, spanned at `by = "ip"` (or another HTTP source), so that a missing feature is
/// one clear error.
#[doc(hidden)]
#[derive(Debug)]
pub struct RequireHttp<T>(T);

impl<T> RequireHttp<T> {
    /// `()`, or a compile error naming the features to enable.
    pub const OK: () = assert!(
        INTEGRATION_ENABLED,
        "an HTTP source (`by = \"ip\" | \"url\" | \"user\" | \"app_id\" | \"header:…\"`) needs an HTTP integration: enable the `axum` or `actix` feature of ratelimit-runtime"
    );
}

/// `RequireAxum::<()>::OK` compiles only with the `axum` feature (for `framework = "axum"`).
#[doc(hidden)]
#[derive(Debug)]
pub struct RequireAxum<T>(T);

impl<T> RequireAxum<T> {
    /// `()`, or a compile error naming the feature to enable.
    pub const OK: () = assert!(
        cfg!(feature = "axum"),
        "`framework = \"axum\"` needs the `axum` feature of ratelimit-runtime"
    );
}

/// `RequireActix::<()>::OK` compiles only with the `actix` feature (for
/// `framework = "actix"`).
#[doc(hidden)]
#[derive(Debug)]
pub struct RequireActix<T>(T);

impl<T> RequireActix<T> {
    /// `()`, or a compile error naming the feature to enable.
    pub const OK: () = assert!(
        cfg!(feature = "actix"),
        "`framework = \"actix\"` needs the `actix` feature of ratelimit-runtime"
    );
}
