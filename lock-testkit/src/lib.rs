//! Test support for the lock kit: real `redis-server` processes on free loopback ports, and
//! an in-process proxy for network faults.
//!
//! Every process is a child started with `--daemonize no`, so it is owned by PID and killed
//! (and its temporary directory removed) when the fixture is dropped; [`running_servers`]
//! tells how many are still alive. Ports are chosen by binding port 0, are never handed out
//! twice in one process, and are kept below 55535 so that a cluster bus port
//! (`port + 10000`) is valid too.
//!
//! | fixture | what | start-up on 2 cores |
//! | --- | --- | --- |
//! | [`RedisServer`] | one server | ~10 ms |
//! | [`RedisServer::start_tls`] | one server with a TLS port, certificates from [`TestCa`] | ~10 ms plus key generation |
//! | [`RedisServers`] | `n` independent masters (RedLock) | ~40 ms for 5 |
//! | [`RedisSentinel`] | primary + replica + 3 sentinels | 2.1–3.2 s (sentinel discovery) |
//! | [`RedisSentinel::start_tls`] | the same, replication and monitoring over TLS, TLS ports for clients | ~2.2 s |
//! | [`RedisSentinel::start_with_passwords`] | the same with passwords: one for the data nodes, one for the sentinels (also over TLS) | ~2.2 s |
//! | [`RedisCluster`] | `n` primaries × `r` replicas | ~2.1 s for 3 × 1 or 2 × 1 (a cluster node waits 2 s before it reports `ok`) |
//! | [`RedisCluster::start_tls`] | the same with TLS ports, TLS cluster bus and replication | ~2.1 s |
//! | [`FaultProxy`] | TCP proxy with pass / delay / hole / drop / reset / refuse | < 1 ms |
//! | [`VersionProxy`] | TCP proxy whose `INFO` replies report another `redis_version` | < 1 ms |
//!
//! Failovers with these settings take about 2.3 s (sentinel) and 2.2–2.8 s (cluster).
//!
//! Processes are killed by `Drop`, so a test binary that is itself killed (SIGKILL, a CI
//! timeout) leaves its `redis-server` children running.
//!
//! ```no_run
//! # async fn demo() {
//! let server = lock_testkit::RedisServer::start().expect("redis-server on PATH");
//! let url = server.url(); // redis://127.0.0.1:<free port>/
//! # }
//! ```

mod cluster;
mod figures;
mod leftovers;
mod logs;
pub mod oracle;
mod probe;
mod proxy;
mod sentinel;
mod server;
mod servers;
mod snapshot;
#[cfg(feature = "test-ca")]
mod test_ca;
mod tls;
mod version_proxy;

pub use cluster::{key_slot, ClusterNodeInfo, RedisCluster, CLUSTER_SLOTS};
pub use figures::figure;
pub use leftovers::{assert_nothing_left, Leftovers};
pub use logs::{LogBuffer, LogCapture};
pub use proxy::{FaultProxy, ProxyMode};
pub use sentinel::{RedisSentinel, SentinelPasswords};
pub use server::{
    free_cluster_port, free_port, redis_available, running_servers, Persistence, RedisServer,
};
pub use servers::RedisServers;
#[cfg(feature = "test-ca")]
pub use test_ca::{TestCa, Validity};
pub use tls::{CertAndKey, TlsServerConfig};
pub use version_proxy::VersionProxy;
