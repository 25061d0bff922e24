//! One instance of the inventory service, with Redis at `REDIS_URL` (`redis://127.0.0.1:6379/`):
//! ```sh
//! cargo run --release -p inventory -- --listen 127.0.0.1:3000   # --help: every option
//! curl -X POST localhost:3000/skus/42/purchase/fenced
//! curl localhost:3000/skus/42
//! curl localhost:3000/metrics     # the lock metrics (lock_*), Prometheus text
//! ```

use clap::Parser;
use inventory::{app, serve, shutdown_signal, ServeArgs};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    // For a `rediss://` REDIS_URL: the application picks rustls's crypto provider, not the kit.
    // An error only means another one was installed first.
    let _ = rustls::crypto::ring::default_provider().install_default();
    if let Err(error) = serve(ServeArgs::parse(), app, shutdown_signal()).await {
        eprintln!("inventory: {error}");
        return std::process::ExitCode::from(2);
    }
    std::process::ExitCode::SUCCESS
}
