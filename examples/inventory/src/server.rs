//! One instance: its settings (command line, `REDIS_URL`), and [`serve`] with its shutdown.

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use axum::Router;
use lock_core::{redact_url, LockError, Locker};

use crate::db::{Db, DbError};
use crate::service::{AppState, Inventory, ServiceConfig};

/// Where an instance finds Redis when neither `--redis-url` nor `REDIS_URL` names one.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379/";

/// The settings of one instance (`inventory --help`).
#[derive(Debug, Clone, clap::Parser)]
pub struct ServeArgs {
    /// Address and port to listen on; port 0 lets the system pick a free one.
    #[arg(long, default_value = "127.0.0.1:3000")]
    pub listen: SocketAddr,
    /// The SQLite database file, shared by all instances (created and seeded if missing).
    #[arg(long, default_value = "inventory.db")]
    pub db: PathBuf,
    /// The Redis server, shared by all instances (an empty value, as `REDIS_URL=` gives, is
    /// the default one).
    #[arg(long, env = "REDIS_URL", default_value = DEFAULT_REDIS_URL)]
    pub redis_url: String,
    /// Prefix of the lock keys in Redis (the same for all instances).
    #[arg(long, default_value = "lock:")]
    pub lock_prefix: String,
    /// How long requests in flight get to finish after SIGTERM or Ctrl-C.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub drain: Duration,
    /// The service's settings.
    #[command(flatten)]
    pub service: ServiceConfig,
}

impl ServeArgs {
    /// The Redis server to use: [`redis_url`](Self::redis_url), or [`DEFAULT_REDIS_URL`] when
    /// it is empty.
    pub fn redis_url(&self) -> &str {
        if self.redis_url.is_empty() {
            DEFAULT_REDIS_URL
        } else {
            &self.redis_url
        }
    }
}

/// Why an instance could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// Binding (the port is taken?) or serving failed.
    #[error("cannot serve on {0}: {1}")]
    Io(SocketAddr, #[source] std::io::Error),
    /// The database could not be opened.
    #[error("cannot open the database {0}: {1}")]
    Db(PathBuf, #[source] DbError),
    /// Redis could not be reached (the URL with its password redacted).
    #[error("cannot reach Redis at {0}: {1}")]
    Redis(String, #[source] LockError),
}

/// Serves the router `make_app` builds ([`app`](crate::app)) until `stop`; prints `listening on
/// http://<addr>` once it accepts connections. Then requests in flight get `--drain` to
/// finish, and [`Locker::shutdown`] gives back the locks still held, at once.
pub async fn serve(
    args: ServeArgs,
    make_app: impl FnOnce(AppState) -> Router,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let addr = args.listen;
    let listener = tokio::net::TcpListener::bind(addr).await;
    let listener = listener.map_err(|e| ServeError::Io(addr, e))?;
    let db = Db::open(&args.db).map_err(|e| ServeError::Db(args.db.clone(), e))?;
    let redis_url = args.redis_url();
    let locker = Locker::builder()
        .url(redis_url)
        .prefix(args.lock_prefix.as_str())
        .connect_timeout(Duration::from_secs(5))
        .build()
        .await
        .map_err(|e| ServeError::Redis(redact_url(redis_url), e))?;
    let local = listener.local_addr().map_err(|e| ServeError::Io(addr, e))?;
    let router = make_app(Inventory::new(locker.clone(), db, args.service));
    println!("listening on http://{local}");
    let (stopping, mut stop_asked) = tokio::sync::watch::channel(false);
    let served = axum::serve(listener, router).with_graceful_shutdown(async move {
        stop.await;
        let _ = stopping.send(true);
    });
    // Requests in flight get `drain` to finish; a hung one does not keep the instance up.
    let drain = args.drain;
    let drained = async {
        let _ = stop_asked.wait_for(|asked| *asked).await;
        tokio::time::sleep(drain).await;
        tracing::warn!(?drain, "requests still running; stopping anyway");
    };
    let result = tokio::select! {
        served = served.into_future() => served.map_err(|e| ServeError::Io(addr, e)),
        () = drained => Ok(()),
    };
    // The locks of requests cut short: the other instances take them now, not a lease later.
    if let Err(error) = locker.shutdown(Duration::from_secs(5)).await {
        tracing::warn!(%error, "not every lock was given back; those end with their lease");
    }
    result
}

/// Resolves on Ctrl-C or SIGTERM (what a rolling restart sends).
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let terminated = async {
        match signal(SignalKind::terminate()) {
            Ok(mut sigterm) => drop(sigterm.recv().await),
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminated => {}
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn an_empty_redis_url_is_the_default_one() {
        let parse = |args: &[&str]| {
            ServeArgs::try_parse_from([&["inventory"], args].concat())
                .expect("the instance's flags parse")
        };
        assert_eq!(parse(&["--redis-url", ""]).redis_url(), DEFAULT_REDIS_URL);
        assert_eq!(
            parse(&["--redis-url", "redis://127.0.0.1:7/"]).redis_url(),
            "redis://127.0.0.1:7/"
        );
    }
}
