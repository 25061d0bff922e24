//! One instance: its settings from the command line and the environment, and [`serve`], which
//! runs it until SIGTERM or Ctrl-C and then gives its locks back.

use std::future::{Future, IntoFuture};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use axum::Router;
use lock_core::{redact_url, LockError, Locker};

use crate::db::{Db, DbError};
use crate::service::{AppState, Inventory, ServiceConfig};

/// The settings of one instance (`inventory --help`).
#[derive(Debug, Clone, clap::Parser)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    pub host: IpAddr,
    /// Port to listen on; 0 lets the system pick a free one.
    #[arg(long, default_value_t = 3000)]
    pub port: u16,
    /// The SQLite database file, shared by all instances (created and seeded if missing).
    #[arg(long, default_value = "inventory.db")]
    pub db: PathBuf,
    /// The Redis server, shared by all instances.
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379/")]
    pub redis_url: String,
    /// Prefix of the lock keys in Redis (the same for all instances).
    #[arg(long, default_value = "lock:")]
    pub lock_prefix: String,
    /// Name stored with the orders this instance takes [default: the listening address].
    #[arg(long)]
    pub instance: Option<String>,
    /// Milliseconds between reading the stock and writing it back.
    #[arg(long, default_value_t = 5)]
    pub think_ms: u64,
    /// Fixed lease, in milliseconds, of the `fenced` purchase.
    #[arg(long, default_value_t = 200)]
    pub lease_ms: u64,
    /// Milliseconds the `layer` and `fenced` purchases wait for the lock.
    #[arg(long, default_value_t = 10_000)]
    pub wait_ms: u64,
    /// Milliseconds that requests in flight get to finish after SIGTERM or Ctrl-C.
    #[arg(long, default_value_t = 10_000)]
    pub drain_ms: u64,
}

/// Why an instance could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The port is taken.
    #[error("{addr} is in use: pass another --port, or --port 0 to let the system pick one")]
    PortInUse {
        /// The address asked for.
        addr: SocketAddr,
    },
    /// Binding or serving failed otherwise.
    #[error("cannot serve on {addr}: {source}")]
    Io {
        /// The address asked for.
        addr: SocketAddr,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The database could not be opened.
    #[error("cannot open the database {path}: {source}")]
    Db {
        /// The database file.
        path: PathBuf,
        /// The error.
        #[source]
        source: DbError,
    },
    /// Redis could not be reached.
    #[error("cannot reach Redis at {url}: {source}")]
    Redis {
        /// The URL, its password redacted.
        url: String,
        /// What the locker reported.
        #[source]
        source: LockError,
    },
}

/// Serves the router `make_app` builds (the example's is [`app`](crate::app)) until `stop`
/// resolves; prints `listening on http://<addr>` once it accepts connections. Stopping, it lets
/// the requests in flight finish (for at most `--drain-ms`), then gives back every lock it
/// still holds ([`Locker::shutdown`]), so that the other instances get them at once.
///
/// # Errors
///
/// [`ServeError`] when the port, the database or Redis is not usable.
pub async fn serve(
    args: ServeArgs,
    make_app: impl FnOnce(AppState) -> Router,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let addr = SocketAddr::new(args.host, args.port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| match source.kind() {
            std::io::ErrorKind::AddrInUse => ServeError::PortInUse { addr },
            _ => ServeError::Io { addr, source },
        })?;
    let db = Db::open(&args.db).map_err(|source| ServeError::Db {
        path: args.db.clone(),
        source,
    })?;
    let locker = Locker::builder()
        .url(args.redis_url.as_str())
        .prefix(args.lock_prefix.as_str())
        .connect_timeout(Duration::from_secs(5))
        .build()
        .await
        .map_err(|source| ServeError::Redis {
            url: redact_url(&args.redis_url),
            source,
        })?;
    let local = listener
        .local_addr()
        .map_err(|source| ServeError::Io { addr, source })?;
    let config = ServiceConfig {
        instance: args.instance.unwrap_or_else(|| local.to_string()),
        think: Duration::from_millis(args.think_ms),
        wait: Duration::from_millis(args.wait_ms),
        lease: Duration::from_millis(args.lease_ms),
    };
    let router = make_app(Inventory::new(locker.clone(), db, config));
    println!("listening on http://{local}");
    let (stopping, mut stop_asked) = tokio::sync::watch::channel(false);
    let signal = async move {
        stop.await;
        let _ = stopping.send(true);
    };
    let served = axum::serve(listener, router).with_graceful_shutdown(signal);
    // Requests in flight get `drain` to finish; a hung one does not keep the instance up.
    let drain = Duration::from_millis(args.drain_ms);
    let drained = async {
        let _ = stop_asked.wait_for(|asked| *asked).await;
        tokio::time::sleep(drain).await;
    };
    let result = tokio::select! {
        served = served.into_future() => served.map_err(|source| ServeError::Io { addr, source }),
        () = drained => {
            tracing::warn!(?drain, "requests still running; stopping without them");
            Ok(())
        }
    };
    // Gives back the locks of requests cut short, so the other instances take them now
    // rather than a lease later.
    if let Err(error) = locker.shutdown(Duration::from_secs(5)).await {
        tracing::warn!(%error, "not every lock was given back; those end with their lease");
    }
    result
}

/// Resolves on Ctrl-C or SIGTERM (what a rolling restart sends).
pub async fn shutdown_signal() {
    let terminated = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut sigterm) => drop(sigterm.recv().await),
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminated => {}
    }
}
