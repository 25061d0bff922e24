//! Running one instance of the service: `inventory serve`.

use std::future::IntoFuture;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use lock_core::Locker;

use crate::db::{Db, DbError};
use crate::service::{app, Inventory, ServiceConfig};

/// The options of `inventory serve`.
#[derive(Debug, Clone, clap::Args)]
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
    /// The Redis server, shared by all instances [default: start a redis-server on a free
    /// port for this instance, stopped when it exits].
    #[arg(long, env = "REDIS_URL")]
    pub redis_url: Option<String>,
    /// Prefix of the lock keys in Redis (the same for all instances).
    #[arg(long, default_value = "lock:")]
    pub lock_prefix: String,
    /// Name stored with the orders this instance takes [default: the listening address].
    #[arg(long)]
    pub instance: Option<String>,
    /// Milliseconds between reading the stock and writing it back.
    #[arg(long, default_value_t = 5)]
    pub think_ms: u64,
    /// Fixed lease, in milliseconds, of the `fenced` and `locked-no-fence` variants.
    #[arg(long, default_value_t = 200)]
    pub lease_ms: u64,
    /// Milliseconds the `layer`, `fenced` and `locked-no-fence` variants wait for the lock.
    #[arg(long, default_value_t = 10_000)]
    pub wait_ms: u64,
    /// Milliseconds that requests in flight get to finish after SIGTERM or Ctrl-C; then the
    /// instance gives its locks back and exits anyway.
    #[arg(long, default_value_t = 10_000)]
    pub drain_ms: u64,
    /// Exit when standard input closes (the demo uses it, so instances die with it).
    #[arg(long, hide = true)]
    pub watch_stdin: bool,
}

impl Default for ServeArgs {
    fn default() -> Self {
        let config = ServiceConfig::default();
        Self {
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 3000,
            db: "inventory.db".into(),
            redis_url: None,
            lock_prefix: "lock:".to_owned(),
            instance: None,
            think_ms: millis(config.think),
            lease_ms: millis(config.lease),
            wait_ms: millis(config.wait),
            drain_ms: 10_000,
            watch_stdin: false,
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl ServeArgs {
    /// The command-line arguments after `serve` that reproduce these options, but for the
    /// Redis URL, which may carry a password and so goes in the environment
    /// ([`redis_url_env`](Self::redis_url_env)): a command line is visible to every user of
    /// the machine (`ps`).
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            "--host".to_owned(),
            self.host.to_string(),
            "--port".to_owned(),
            self.port.to_string(),
            "--db".to_owned(),
            self.db.display().to_string(),
            "--lock-prefix".to_owned(),
            self.lock_prefix.clone(),
            "--think-ms".to_owned(),
            self.think_ms.to_string(),
            "--lease-ms".to_owned(),
            self.lease_ms.to_string(),
            "--wait-ms".to_owned(),
            self.wait_ms.to_string(),
            "--drain-ms".to_owned(),
            self.drain_ms.to_string(),
        ];
        if let Some(instance) = &self.instance {
            args.extend(["--instance".to_owned(), instance.clone()]);
        }
        if self.watch_stdin {
            args.push("--watch-stdin".to_owned());
        }
        args
    }

    /// The `REDIS_URL` a `serve` child process gets (`None`: it starts its own redis-server).
    pub fn redis_url_env(&self) -> Option<(&'static str, &str)> {
        self.redis_url.as_deref().map(|url| ("REDIS_URL", url))
    }
}

/// Why an instance could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The port is taken.
    #[error(
        "{addr} is in use: pass another --port, or --port 0 to let the system pick a free one"
    )]
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
    /// No Redis URL was given and no `redis-server` could be started.
    #[error(transparent)]
    StartRedis(#[from] crate::demo::DemoError),
    /// Redis could not be reached.
    #[error("cannot reach Redis at {url}: {reason}")]
    Redis {
        /// The URL.
        url: String,
        /// What the Redis client reported.
        reason: String,
    },
}

/// Runs one instance until Ctrl-C or SIGTERM (or, with `--watch-stdin`, until standard input
/// closes). Prints `listening on http://<addr>` on standard output once it accepts
/// connections. Stopping, it lets the requests in flight finish (for at most `--drain-ms`),
/// then gives back every lock it still holds ([`Locker::shutdown`]), so that the other
/// instances get them at once.
///
/// # Errors
///
/// [`ServeError`] when the database, Redis or the port is not usable.
pub async fn serve(args: ServeArgs) -> Result<(), ServeError> {
    // The port first: it is the likeliest to be taken, and the cheapest to check.
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
    // Without a URL, a redis-server of our own (as the demo does), so the single-instance
    // command works on a machine whose packaged Redis service is disabled. It lives as long as
    // this function: leaving it stops the server.
    let (redis_url, _redis_server) = match &args.redis_url {
        Some(url) => (url.clone(), None),
        None => {
            let server = crate::demo::start_redis().await?;
            eprintln!(
                "started redis-server on :{} for this instance (set REDIS_URL or --redis-url to use another)",
                server.port()
            );
            (server.url(), Some(server))
        }
    };
    let locker = Locker::builder()
        .url(redis_url.as_str())
        .prefix(args.lock_prefix.as_str())
        .connect_timeout(Duration::from_secs(5))
        .build()
        .await
        .map_err(|error| ServeError::Redis {
            url: redis_url.clone(),
            reason: crate::demo::redis_reason(&error),
        })?;
    let local = listener
        .local_addr()
        .map_err(|source| ServeError::Io { addr, source })?;
    let config = ServiceConfig {
        instance: args.instance.clone().unwrap_or_else(|| local.to_string()),
        think: Duration::from_millis(args.think_ms),
        wait: Duration::from_millis(args.wait_ms),
        lease: Duration::from_millis(args.lease_ms),
    };
    let state = Inventory::new(locker.clone(), db, config);
    println!("listening on http://{local}");
    tracing::info!(%local, db = %args.db.display(), "serving");
    let (stopping, mut stop_asked) = tokio::sync::watch::channel(false);
    let signal = async move {
        stop_signal(args.watch_stdin).await;
        let _ = stopping.send(true);
    };
    let served = axum::serve(listener, app(state))
        .with_graceful_shutdown(signal)
        .into_future();
    // Requests in flight get `drain` to finish; a hung one does not keep the instance up.
    let drain = Duration::from_millis(args.drain_ms);
    let drained = async {
        let _ = stop_asked.wait_for(|asked| *asked).await;
        tokio::time::sleep(drain).await;
    };
    let result = tokio::select! {
        served = served => served.map_err(|source| ServeError::Io { addr, source }),
        () = drained => {
            tracing::warn!(?drain, "requests still running; stopping without them");
            Ok(())
        }
    };
    // Gives back every lock this instance holds (those of requests cut short, releases still
    // in the background), so the other instances take them now rather than a lease later.
    if let Err(error) = locker.shutdown(LOCKS_GIVEN_BACK_WITHIN).await {
        tracing::warn!(%error, "not every lock was given back; those end with their lease");
    }
    result
}

/// How long the locker's shutdown may take (one release round trip, normally).
const LOCKS_GIVEN_BACK_WITHIN: Duration = Duration::from_secs(5);

/// Resolves on Ctrl-C or SIGTERM (what a rolling restart sends), or when standard input
/// reaches its end if `watch_stdin`.
async fn stop_signal(watch_stdin: bool) {
    let stdin_closed = async {
        if watch_stdin {
            let _ = tokio::io::copy(&mut tokio::io::stdin(), &mut tokio::io::sink()).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminated() => {}
        () = stdin_closed => {}
    }
}

/// Resolves on SIGTERM (never where there is no such signal).
async fn terminated() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut sigterm) = signal(SignalKind::terminate()) {
            sigterm.recv().await;
            return;
        }
    }
    std::future::pending::<()>().await;
}
