//! The Actix-web example server ([`ratelimit_examples::actix_server`]): on 127.0.0.1:8080
//! (`PORT`), until Ctrl-C or SIGTERM.
//!
//! ```text
//! cargo run -p ratelimit-examples --bin actix_server
//! ```

#[actix_web::main]
async fn main() -> std::io::Result<()> {
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(8080);
    let listener = std::net::TcpListener::bind(("127.0.0.1", port))?;
    ratelimit_examples::actix_server::serve(listener, stop_signal()).await
}

/// Ctrl-C (SIGINT), or SIGTERM where there is one.
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
