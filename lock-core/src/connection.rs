//! Connections to one logical Redis deployment (a single server, a cluster, or the primary
//! that Sentinel names), behind one [`ConnectionLike`] so every script call is written once.

#[cfg(feature = "sentinel")]
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "sentinel")]
use parking_lot::RwLock;
#[cfg(feature = "sentinel")]
use tokio::time::Instant;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
#[cfg(feature = "cluster")]
use redis::cluster_async::ClusterConnection;
#[cfg(feature = "cluster")]
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
#[cfg(feature = "sentinel")]
use redis::sentinel::SentinelClient;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

use crate::backend_error::BackendError;

/// Timeouts shared by every connection of a locker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub(crate) connect: Duration,
    pub(crate) command: Duration,
    /// How long a release's latch lives: the window in which a retried release learns
    /// whether its first try ran.
    pub(crate) release_retry: Duration,
}

impl Timeouts {
    pub(crate) fn manager_config(self) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect))
            .set_response_timeout(Some(self.command))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_secs(1))
    }
}

/// A multiplexed command connection that reconnects by itself.
#[derive(Clone)]
pub(crate) enum Connection {
    /// One server (or a fixed primary).
    Server(ConnectionManager),
    /// A Redis Cluster: commands are routed by their first key; MOVED/ASK are followed.
    #[cfg(feature = "cluster")]
    Cluster(ClusterConnection),
    /// The primary that Sentinel names, re-resolved after connection errors and `READONLY`.
    #[cfg(feature = "sentinel")]
    Sentinel(Arc<SentinelPrimary>),
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Server(_) => "Connection::Server",
            #[cfg(feature = "cluster")]
            Self::Cluster(_) => "Connection::Cluster",
            #[cfg(feature = "sentinel")]
            Self::Sentinel(_) => "Connection::Sentinel",
        })
    }
}

impl Connection {
    pub(crate) async fn server(
        client: redis::Client,
        timeouts: Timeouts,
    ) -> Result<Self, BackendError> {
        let manager = ConnectionManager::new_with_config(client, timeouts.manager_config())
            .await
            .map_err(BackendError::redis)?;
        Ok(Self::Server(manager))
    }

    /// A connection that is established on first use (a RedLock node down at start-up, a
    /// lazy locker), and again after failures.
    pub(crate) fn lazy(client: redis::Client, timeouts: Timeouts) -> Result<Self, BackendError> {
        ConnectionManager::new_lazy_with_config(client, timeouts.manager_config())
            .map(Self::Server)
            .map_err(BackendError::redis)
    }

    /// `certificates`: the TLS settings (always `None` without the `tls` feature).
    #[cfg(feature = "cluster")]
    pub(crate) async fn cluster(
        urls: &[String],
        timeouts: Timeouts,
        certificates: Option<Certificates>,
    ) -> Result<Self, BackendError> {
        #[allow(unused_mut)] // without `tls` there is nothing to add
        let mut builder =
            redis::cluster::ClusterClientBuilder::new(urls.iter().map(String::as_str))
                .connection_timeout(timeouts.connect)
                .response_timeout(timeouts.command)
                .retries(3);
        if let Some(certificates) = certificates {
            #[cfg(feature = "tls")]
            {
                builder = builder.certs(certificates);
            }
            #[cfg(not(feature = "tls"))]
            match certificates {}
        }
        let client = builder.build().map_err(BackendError::redis)?;
        let connection = tokio::time::timeout(timeouts.connect, client.get_async_connection())
            .await
            .map_err(|_| BackendError::timed_out("connecting to the cluster"))?
            .map_err(BackendError::redis)?;
        Ok(Self::Cluster(connection))
    }

    /// Counts the switches to another server behind this connection: a Sentinel primary's
    /// failovers (what a node knows of its server is read again after one); 0 for the others.
    pub(crate) fn generation(&self) -> u64 {
        match self {
            #[cfg(feature = "sentinel")]
            Self::Sentinel(primary) => primary.generation(),
            _ => 0,
        }
    }

    /// The address of the Sentinel primary connected now, for messages.
    pub(crate) fn primary_address(&self) -> Option<String> {
        match self {
            #[cfg(feature = "sentinel")]
            Self::Sentinel(primary) => Some(primary.current.read().addr.clone()),
            _ => None,
        }
    }

    /// Whether multi-key scripts must stay within one hash slot.
    #[cfg(feature = "cluster")]
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// Whether multi-key scripts must stay within one hash slot: never without `cluster`.
    #[cfg(not(feature = "cluster"))]
    pub(crate) fn is_cluster(&self) -> bool {
        false
    }

    /// Whether Sentinel names the server: a failover may move it.
    pub(crate) fn follows_sentinel(&self) -> bool {
        #[cfg(feature = "sentinel")]
        if let Self::Sentinel(_) = self {
            return true;
        }
        false
    }

    /// Whether the primary moved since the connection's generation `since`: if not yet, asks
    /// Sentinel now and then every tenth of a second for up to `within` (Sentinel names a
    /// promoted replica a moment after the promotion), and follows it. `false` at once for
    /// the other deployments (their nodes do not move under a name).
    pub(crate) async fn primary_moved(&self, since: u64, within: Duration) -> bool {
        #[cfg(feature = "sentinel")]
        if let Self::Sentinel(primary) = self {
            // Moved already: the primary switched while the call ran.
            if primary.generation() != since {
                return true;
            }
            let asked = Instant::now();
            loop {
                primary.switch(None).await;
                if primary.generation() != since {
                    return true;
                }
                if asked.elapsed() >= within {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let _ = (since, within);
        false
    }

    /// Sends `cmd` to the server that holds `key`: on a cluster, the primary of the key's
    /// slot whatever the command (one without a key would go to a random node, or to every
    /// primary); elsewhere the one server.
    pub(crate) async fn send_for_key(&mut self, cmd: &Cmd, key: &[u8]) -> RedisResult<Value> {
        #[cfg(feature = "cluster")]
        if let Self::Cluster(cluster) = self {
            let route = Route::with_key(key, SlotAddr::Master);
            let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
            return cluster.route_command(cmd.clone(), route).await;
        }
        let _ = key; // one server: nothing to route
        self.req_packed_command(cmd).await
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Server(c) => c.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Self::Cluster(c) => c.req_packed_command(cmd),
            #[cfg(feature = "sentinel")]
            Self::Sentinel(p) => {
                let primary = p.clone();
                Box::pin(async move {
                    let mut current = primary.current();
                    let result = current.req_packed_command(cmd).await;
                    primary.check(&result).await;
                    result
                })
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Server(c) => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "cluster")]
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "sentinel")]
            Self::Sentinel(p) => {
                let primary = p.clone();
                Box::pin(async move {
                    let mut current = primary.current();
                    let result = current.req_packed_commands(pipeline, offset, count).await;
                    primary.check(&result).await;
                    result
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Server(c) => c.get_db(),
            #[cfg(feature = "cluster")]
            Self::Cluster(c) => c.get_db(),
            #[cfg(feature = "sentinel")]
            Self::Sentinel(p) => p.current().get_db(),
        }
    }
}

/// The TLS settings of a cluster's connections; without the `tls` feature there are none (a
/// type without values).
#[cfg(all(feature = "cluster", feature = "tls"))]
pub(crate) type Certificates = redis::TlsCertificates;
/// The TLS settings of a cluster's connections; without the `tls` feature there are none (a
/// type without values).
#[cfg(all(feature = "cluster", not(feature = "tls")))]
pub(crate) enum Certificates {}

/// The current primary of a Sentinel-monitored deployment.
#[cfg(feature = "sentinel")]
pub(crate) struct SentinelPrimary {
    /// The Sentinel client, and when it was last asked for the primary.
    sentinel: tokio::sync::Mutex<(SentinelClient, Option<Instant>)>,
    current: RwLock<Primary>,
    timeouts: Timeouts,
}

/// The primary a [`SentinelPrimary`] is connected to now.
#[cfg(feature = "sentinel")]
struct Primary {
    conn: ConnectionManager,
    /// What `conn` was made from, for connections of their own (see `store::wait`).
    client: redis::Client,
    /// Counts the switches to a new primary.
    generation: u64,
    /// Where it is, to notice a move.
    addr: String,
}

/// How often Sentinel is asked whether the primary moved.
#[cfg(feature = "sentinel")]
const SENTINEL_POLL: Duration = Duration::from_secs(1);

/// After an error, Sentinel is asked again only if it was not asked this recently: every
/// command failing at once (a slow or unreachable primary) makes one question, not one each.
#[cfg(feature = "sentinel")]
const SENTINEL_RECHECK: Duration = Duration::from_millis(200);

#[cfg(feature = "sentinel")]
fn address(client: &redis::Client) -> String {
    client.get_connection_info().addr().to_string()
}

#[cfg(feature = "sentinel")]
impl SentinelPrimary {
    /// Connects to the primary that `sentinel` (a [`SentinelClient`] for a master) names, and
    /// follows it across failovers.
    pub(crate) async fn connect(
        mut sentinel: SentinelClient,
        timeouts: Timeouts,
    ) -> Result<Arc<Self>, BackendError> {
        let client = tokio::time::timeout(timeouts.connect, sentinel.async_get_client())
            .await
            .map_err(|_| BackendError::timed_out("asking Sentinel for the primary"))?
            .map_err(BackendError::redis)?;
        let addr = address(&client);
        let conn = ConnectionManager::new_with_config(client.clone(), timeouts.manager_config())
            .await
            .map_err(BackendError::redis)?;
        let primary = Arc::new(Self {
            sentinel: tokio::sync::Mutex::new((sentinel, Some(Instant::now()))),
            current: RwLock::new(Primary {
                conn,
                client,
                generation: 0,
                addr,
            }),
            timeouts,
        });
        // Errors are not the only sign of a failover: after a manual `SENTINEL FAILOVER` the old
        // primary keeps answering (and accepting renewals) for seconds, while the lock key on
        // the new primary runs out. So Sentinel is asked every second as well.
        tokio::spawn(Self::watch(Arc::downgrade(&primary)));
        Ok(primary)
    }

    fn current(&self) -> ConnectionManager {
        self.current.read().conn.clone()
    }

    /// Counts the switches to a new primary.
    pub(crate) fn generation(&self) -> u64 {
        self.current.read().generation
    }

    /// A client for the primary connected now, and its generation (for connections of
    /// their own, see `store::wait`).
    pub(crate) fn current_client(&self) -> (redis::Client, u64) {
        let current = self.current.read();
        (current.client.clone(), current.generation)
    }

    /// A call on a connection of its own to the primary failed: asks Sentinel whether the
    /// primary moved, unless it was asked within [`SENTINEL_RECHECK`].
    pub(crate) async fn after_error(&self) {
        self.switch(Some(SENTINEL_RECHECK)).await;
    }

    /// After an error that suggests a failover, asks Sentinel whether the primary moved
    /// (unless it was asked within [`SENTINEL_RECHECK`]).
    ///
    /// The connection is rebuilt only when Sentinel names another primary: a timeout or a
    /// dropped connection to a primary that did not move is the connection manager's to
    /// mend, and a rebuild would make the pub/sub connection resubscribe every channel and
    /// wake every waiter for nothing (each of them asking Redis at once).
    async fn check<T>(&self, result: &RedisResult<T>) {
        let Err(error) = result else { return };
        let failover_sign = error.is_io_error()
            || error.is_connection_dropped()
            || error.is_connection_refusal()
            || error.is_timeout()
            || matches!(error.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"));
        if failover_sign {
            self.switch(Some(SENTINEL_RECHECK)).await;
        }
    }

    /// A client for the current primary (for the pub/sub connection).
    pub(crate) async fn client(&self) -> Result<redis::Client, BackendError> {
        let mut sentinel = self.sentinel.lock().await;
        tokio::time::timeout(self.timeouts.connect, sentinel.0.async_get_client())
            .await
            .map_err(|_| BackendError::timed_out("asking Sentinel for the primary"))?
            .map_err(BackendError::redis)
    }

    /// Asks Sentinel for the primary, and connects to it if it moved. `unless_asked_within`:
    /// skip the question if Sentinel was asked that recently (after errors); `None` asks
    /// anyway (the periodic check).
    async fn switch(&self, unless_asked_within: Option<Duration>) {
        let seen = self.generation();
        let mut sentinel = self.sentinel.lock().await;
        if self.generation() != seen {
            return; // another caller already switched
        }
        let (sentinel, asked_at) = &mut *sentinel;
        if let (Some(within), Some(at)) = (unless_asked_within, *asked_at) {
            if at.elapsed() < within {
                return;
            }
        }
        *asked_at = Some(Instant::now());
        let client =
            match tokio::time::timeout(self.timeouts.connect, sentinel.async_get_client()).await {
                Ok(Ok(client)) => client,
                _ => return,
            };
        let addr = address(&client);
        if self.current.read().addr == addr {
            return;
        }
        let config = self.timeouts.manager_config();
        match ConnectionManager::new_with_config(client.clone(), config).await {
            Ok(conn) => {
                *self.current.write() = Primary {
                    conn,
                    client,
                    generation: seen + 1,
                    addr: addr.clone(),
                };
                tracing::info!(primary = %addr, "following the primary named by Sentinel");
            }
            Err(error) => tracing::debug!(%error, "primary named by Sentinel is not reachable yet"),
        }
    }

    /// Asks Sentinel every [`SENTINEL_POLL`] whether the primary moved, until the connection is
    /// dropped.
    async fn watch(primary: std::sync::Weak<Self>) {
        let mut ticks = tokio::time::interval(SENTINEL_POLL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let Some(primary) = primary.upgrade() else {
                return;
            };
            primary.switch(None).await;
        }
    }
}

#[cfg(feature = "sentinel")]
impl std::fmt::Debug for SentinelPrimary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelPrimary")
            .field("generation", &self.generation())
            .finish_non_exhaustive()
    }
}
