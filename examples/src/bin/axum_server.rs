//! The Axum example server ([`ratelimit_examples::axum_server`]): on 127.0.0.1:3000 (`PORT`)
//! and its admin API on 127.0.0.1:3001 (`ADMIN_PORT`), until Ctrl-C.
//!
//! ```text
//! cargo run -p ratelimit-examples --bin axum_server
//! ```

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port = |var: &str, default: u16| {
        std::env::var(var)
            .ok()
            .and_then(|p| p.parse().ok())
            .unwrap_or(default)
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port("PORT", 3000))).await?;
    // The admin API listens on loopback only: never expose it where clients can reach it.
    let admin_listener =
        tokio::net::TcpListener::bind(("127.0.0.1", port("ADMIN_PORT", 3001))).await?;
    ratelimit_examples::axum_server::serve(listener, admin_listener, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
}
