//! [`RedisCluster`]: a Redis Cluster of real processes, and the key-to-slot function.

use std::io;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::probe::{self, info_field, query, POLL_TIMEOUT, QUERY_TIMEOUT};
use crate::server::{
    free_cluster_port, write_tls_files, Kind, Persistence, RedisServer, TlsListener, BUS_OFFSET,
};
use crate::tls::TlsServerConfig;

/// Number of hash slots in a Redis Cluster.
pub const CLUSTER_SLOTS: u16 = 16384;

/// How long [`RedisCluster::start`] waits for the cluster to be fully up.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// The hash slot of `key`, as `CLUSTER KEYSLOT` computes it: CRC16 (XMODEM) of the key, or of
/// the non-empty part between the first `{` and the next `}` (a hash tag), modulo 16384.
///
/// # Examples
///
/// ```
/// use lock_testkit::key_slot;
/// assert_eq!(key_slot(b"foo"), 12182);
/// assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
/// ```
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&len| len > 0)
                .map(|len| &rest[..len])
        })
        .unwrap_or(key);
    crc16(hashed) % CLUSTER_SLOTS
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc = 0u16;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// One node as described by a line of `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClusterNodeInfo {
    /// The node id (40 hex characters).
    pub id: String,
    /// The node's client port.
    pub port: u16,
    /// Whether the node is a primary (`master` flag).
    pub primary: bool,
    /// For a replica, the id of its primary.
    pub primary_id: Option<String>,
    /// Whether the node is flagged `fail` (failure agreed by the majority; `fail?` is not enough).
    pub failed: bool,
    /// Whether the asking node's cluster-bus link to this node is `connected`.
    pub connected: bool,
    /// Slot ranges served by this node, inclusive (`(0, 5460)`, ...). Empty for replicas.
    pub slots: Vec<(u16, u16)>,
}

impl ClusterNodeInfo {
    /// Whether this node serves `slot`.
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(lo, hi)| lo <= slot && slot <= hi)
    }
}

/// `CLUSTER SETSLOT <args>` on `port`.
fn setslot(port: u16, args: &[&str]) -> io::Result<()> {
    let mut command = vec!["CLUSTER", "SETSLOT"];
    command.extend_from_slice(args);
    query::<redis::Value>(port, &command, QUERY_TIMEOUT)
        .map(drop)
        .map_err(|e| probe::io_err(format!("port {port}: {command:?}"), e))
}

/// Parses the text of `CLUSTER NODES`.
fn parse_cluster_nodes(text: &str) -> Vec<ClusterNodeInfo> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                return None;
            }
            // `127.0.0.1:30001@40001` or `127.0.0.1:30001@40001,hostname`
            let addr = fields[1].split(['@', ',']).next()?;
            let port = addr.rsplit(':').next()?.parse().ok()?;
            let flags: Vec<&str> = fields[2].split(',').collect();
            let slots = fields[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((lo, hi)) => Some((lo.parse().ok()?, hi.parse().ok()?)),
                    None => {
                        let slot = s.parse().ok()?;
                        Some((slot, slot))
                    }
                })
                .collect();
            Some(ClusterNodeInfo {
                id: fields[0].to_string(),
                port,
                primary: flags.contains(&"master"),
                primary_id: (fields[3] != "-").then(|| fields[3].to_string()),
                failed: flags.contains(&"fail"),
                connected: fields[7] == "connected",
                slots,
            })
        })
        .collect()
}

/// A Redis Cluster of `primaries × (1 + replicas_per_primary)` real `redis-server` processes on
/// loopback, all killed (and their directories removed) on drop.
///
/// Nodes run with `--cluster-enabled yes --cluster-node-timeout 1000`, so a killed primary is
/// replaced by its replica in about 2.6 s (see RELIABILITY.md). Their ports are below 55535 and
/// their bus ports (`port + 10000`) were free when the cluster was started.
///
/// # Examples
///
/// ```no_run
/// let mut cluster = lock_testkit::RedisCluster::start(3, 1).expect("redis-server on PATH");
/// let seeds = cluster.urls();
/// let owner = cluster.primary_for_key("lock:{order-1}").unwrap().port();
/// let index = cluster.index_of_port(owner).unwrap();
/// cluster.node_mut(index).kill9(); // its replica takes over after about 2.6 s
/// # drop(seeds);
/// ```
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    primaries: Vec<u16>,
    replicas_per_primary: usize,
}

impl RedisCluster {
    /// Starts `primaries` primaries with `replicas_per_primary` replicas each, creates the
    /// cluster and waits (at most 20 s) until every node reports `cluster_state:ok`, knows all
    /// the others, and every replica's link to its primary is up.
    ///
    /// With three or more primaries the cluster is created by `redis-cli --cluster create
    /// ... --cluster-replicas R --cluster-yes`; with one or two (which `redis-cli` refuses) the
    /// same layout is made by hand with `CLUSTER ADDSLOTSRANGE`, `MEET` and `REPLICATE`.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for zero primaries; otherwise when a process cannot be started, the
    /// creation fails, or the cluster is not up in time. Nodes already started are killed.
    pub fn start(primaries: usize, replicas_per_primary: usize) -> io::Result<Self> {
        Self::start_inner(primaries, replicas_per_primary, None)
    }

    /// Like [`start`](Self::start), but every node also listens on a TLS port (presenting
    /// `config.server`, give it an IP SAN `127.0.0.1`) and runs with `--tls-cluster yes` (the
    /// cluster bus is TLS) and `--tls-replication yes` (replicas replicate over TLS).
    ///
    /// With `tls-cluster yes` a node describes the cluster (`CLUSTER SLOTS`, `CLUSTER NODES`,
    /// `MOVED`/`ASK` redirects) with TLS ports to clients connected over TLS, and with
    /// plaintext ports to plaintext clients. The fixture itself, its probes and
    /// [`topology`](Self::topology) use the plaintext ports, so every helper works unchanged and
    /// speaks of plaintext ports; code under test is given [`tls_urls`](Self::tls_urls). Each
    /// node's bus port is set to its plaintext port + 10000 (`--cluster-port`).
    ///
    /// The TLS cluster bus requires a client certificate from every node, whatever
    /// `auth_clients` says, and refuses the server certificate (issued for server
    /// authentication only): `config` needs a client identity
    /// ([`TlsServerConfig::with_client_identity`]), which the nodes also present to their
    /// primaries when replicating.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when `config` has no client identity; otherwise as for
    /// [`start`](Self::start).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use lock_testkit::{RedisCluster, TestCa, TlsServerConfig, Validity};
    ///
    /// let ca = TestCa::new("test CA");
    /// let cert = ca.server_cert(&["127.0.0.1"], Validity::Current);
    /// let config = TlsServerConfig::new(cert, &ca).with_client_identity(ca.client_cert("node"));
    /// let cluster = RedisCluster::start_tls(3, 0, &config).unwrap();
    /// let seeds = cluster.tls_urls(); // rediss://127.0.0.1:<tls port>/ of the primaries
    /// # drop(seeds);
    /// ```
    pub fn start_tls(
        primaries: usize,
        replicas_per_primary: usize,
        config: &TlsServerConfig,
    ) -> io::Result<Self> {
        if config.client.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a TLS cluster bus needs a client certificate: TlsServerConfig::with_client_identity",
            ));
        }
        Self::start_inner(primaries, replicas_per_primary, Some(config))
    }

    fn start_inner(
        primaries: usize,
        replicas_per_primary: usize,
        tls: Option<&TlsServerConfig>,
    ) -> io::Result<Self> {
        if primaries == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a cluster needs at least one primary",
            ));
        }
        let total = primaries * (1 + replicas_per_primary);
        let mut nodes = Vec::with_capacity(total);
        for _ in 0..total {
            let port = free_cluster_port();
            let conf = format!("nodes-{port}.conf");
            let bus = (port + BUS_OFFSET).to_string();
            let mut args = vec![
                "--cluster-enabled",
                "yes",
                "--cluster-node-timeout",
                "1000",
                "--cluster-config-file",
                conf.as_str(),
            ];
            if tls.is_some() {
                // With `tls-cluster yes` the bus port would follow the TLS port.
                args.extend([
                    "--cluster-port",
                    bus.as_str(),
                    "--tls-cluster",
                    "yes",
                    "--tls-replication",
                    "yes",
                ]);
            }
            let listener = tls.map(TlsListener::for_config);
            nodes.push(RedisServer::launch_inner(
                port,
                &args,
                Persistence::None,
                listener,
                |dir| {
                    if let Some(config) = tls {
                        write_tls_files(dir, config)?;
                    }
                    Ok(Kind::Server)
                },
            )?);
        }
        for node in &mut nodes {
            node.wait_ready(probe::READY_TIMEOUT)?;
        }
        let mut cluster = Self {
            nodes,
            primaries: Vec::new(),
            replicas_per_primary,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        if primaries >= 3 {
            cluster.create_with_redis_cli(replicas_per_primary, deadline)?;
        } else {
            cluster.create_by_hand(primaries, replicas_per_primary, deadline)?;
        }
        cluster.wait_fully_up(primaries, deadline)?;
        Ok(cluster)
    }

    fn create_with_redis_cli(&self, replicas: usize, deadline: Instant) -> io::Result<()> {
        let log_path = self.nodes[0].dir().join("cluster-create.log");
        let log = std::fs::File::create(&log_path)?;
        let mut cmd = Command::new("redis-cli");
        cmd.arg("--cluster").arg("create");
        for node in &self.nodes {
            cmd.arg(format!("127.0.0.1:{}", node.port()));
        }
        cmd.args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log));
        let mut child = cmd.spawn().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot run redis-cli --cluster create: {e}"),
            )
        })?;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "redis-cli --cluster create did not finish in time:\n{}",
                        std::fs::read_to_string(&log_path).unwrap_or_default()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if !status.success() {
            return Err(io::Error::other(format!(
                "redis-cli --cluster create failed ({status}):\n{}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            )));
        }
        Ok(())
    }

    fn create_by_hand(
        &self,
        primaries: usize,
        replicas: usize,
        deadline: Instant,
    ) -> io::Result<()> {
        let total = self.nodes.len();
        let per = usize::from(CLUSTER_SLOTS) / primaries;
        for (i, node) in self.nodes[..primaries].iter().enumerate() {
            let lo = i * per;
            let hi = if i + 1 == primaries {
                usize::from(CLUSTER_SLOTS) - 1
            } else {
                lo + per - 1
            };
            let (lo, hi) = (lo.to_string(), hi.to_string());
            let _: () = query(
                node.port(),
                &["CLUSTER", "ADDSLOTSRANGE", &lo, &hi],
                QUERY_TIMEOUT,
            )
            .map_err(|e| probe::io_err("CLUSTER ADDSLOTSRANGE", e))?;
        }
        let first = self.nodes[0].port().to_string();
        for node in &self.nodes[1..] {
            let _: () = query(
                node.port(),
                &["CLUSTER", "MEET", "127.0.0.1", &first],
                QUERY_TIMEOUT,
            )
            .map_err(|e| probe::io_err("CLUSTER MEET", e))?;
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        probe::wait_until(remaining, "every node to know every other node", || {
            for node in &self.nodes {
                let info: String = query(node.port(), &["CLUSTER", "INFO"], POLL_TIMEOUT)
                    .map_err(|e| format!("port {}: {e}", node.port()))?;
                let known = info_field(&info, "cluster_known_nodes").unwrap_or("?");
                if known != total.to_string() {
                    return Err(format!(
                        "port {} knows {known} of {total} nodes",
                        node.port()
                    ));
                }
            }
            Ok(())
        })?;
        for (j, replica) in self.nodes[primaries..].iter().enumerate() {
            let primary = &self.nodes[j / replicas];
            let id: String = query(primary.port(), &["CLUSTER", "MYID"], QUERY_TIMEOUT)
                .map_err(|e| probe::io_err("CLUSTER MYID", e))?;
            let remaining = deadline.saturating_duration_since(Instant::now());
            probe::wait_until(remaining, "CLUSTER REPLICATE to be accepted", || {
                query::<()>(replica.port(), &["CLUSTER", "REPLICATE", &id], POLL_TIMEOUT)
                    .map_err(|e| format!("port {}: {e}", replica.port()))
            })?;
        }
        Ok(())
    }

    fn wait_fully_up(&mut self, primaries: usize, deadline: Instant) -> io::Result<()> {
        let total = self.nodes.len();
        let replicas = self.replicas_per_primary;
        let remaining = deadline.saturating_duration_since(Instant::now());
        let mut primary_ports = Vec::new();
        probe::wait_until(remaining, "the cluster to be up", || {
            for node in &self.nodes {
                let info: String = query(node.port(), &["CLUSTER", "INFO"], POLL_TIMEOUT)
                    .map_err(|e| format!("port {}: {e}", node.port()))?;
                let state = info_field(&info, "cluster_state").unwrap_or("?");
                let known = info_field(&info, "cluster_known_nodes").unwrap_or("?");
                if state != "ok" || known != total.to_string() {
                    return Err(format!(
                        "port {}: cluster_state:{state}, cluster_known_nodes:{known}",
                        node.port()
                    ));
                }
            }
            let topology = self.topology().map_err(|e| e.to_string())?;
            let mut masters: Vec<&ClusterNodeInfo> = topology
                .iter()
                .filter(|n| n.primary && !n.slots.is_empty())
                .collect();
            if masters.len() != primaries {
                return Err(format!("{} primaries serve slots", masters.len()));
            }
            masters.sort_by_key(|n| n.slots[0].0);
            for master in &masters {
                let count = topology
                    .iter()
                    .filter(|n| n.primary_id.as_deref() == Some(master.id.as_str()))
                    .count();
                if count != replicas {
                    return Err(format!("primary {} has {count} replicas", master.port));
                }
            }
            for node in topology.iter().filter(|n| !n.primary) {
                let info: String = query(node.port, &["INFO", "replication"], POLL_TIMEOUT)
                    .map_err(|e| format!("port {}: {e}", node.port))?;
                let link = info_field(&info, "master_link_status").unwrap_or("?");
                if link != "up" {
                    return Err(format!("replica {}: master_link_status:{link}", node.port));
                }
            }
            // Each primary's replicas online and acknowledging all it has written: a replica
            // just through its first sync can take a moment more to answer a `WAIT`, and
            // tests with `min_replicas` would meet `NotReplicated` on a loaded machine.
            for master in &masters {
                let info: String = query(master.port, &["INFO", "replication"], POLL_TIMEOUT)
                    .map_err(|e| format!("port {}: {e}", master.port))?;
                let own = info_field(&info, "master_repl_offset").unwrap_or("?");
                let caught_up = info
                    .lines()
                    .filter(|line| line.starts_with("slave"))
                    .filter(|line| {
                        line.contains("state=online")
                            && line.split(',').any(|f| f == format!("offset={own}"))
                    })
                    .count();
                if caught_up != replicas {
                    return Err(format!(
                        "primary {}: {caught_up} of {replicas} replicas acknowledged offset {own}",
                        master.port
                    ));
                }
            }
            primary_ports = masters.iter().map(|n| n.port).collect();
            Ok(())
        })?;
        self.primaries = primary_ports;
        Ok(())
    }

    /// Waits until every running, unpaused node reports `cluster_state:ok` (e.g. after a
    /// failover). Killed, stopped and paused nodes are not asked.
    ///
    /// # Errors
    ///
    /// `TimedOut` when some node still reports another state after `timeout`.
    pub fn wait_until_ok(&self, timeout: Duration) -> io::Result<()> {
        probe::wait_until(timeout, "cluster_state:ok on every live node", || {
            for node in self.live_nodes() {
                let info: String = query(node.port(), &["CLUSTER", "INFO"], POLL_TIMEOUT)
                    .map_err(|e| format!("port {}: {e}", node.port()))?;
                let state = info_field(&info, "cluster_state").unwrap_or("?");
                if state != "ok" {
                    return Err(format!("port {}: cluster_state:{state}", node.port()));
                }
            }
            Ok(())
        })
    }

    /// Waits until the slots that the primary on `failed_port` served (it was killed or
    /// stopped) are served by another primary, and every live node reports `cluster_state:ok`.
    /// Returns the port of the new primary of the first of those slots.
    ///
    /// Right after a kill the other nodes still report `ok` for about a node timeout, so
    /// [`wait_until_ok`](Self::wait_until_ok) alone does not wait for the failover.
    ///
    /// # Errors
    ///
    /// `TimedOut` when no other primary took the slots within `timeout`.
    pub fn wait_for_failover(&self, failed_port: u16, timeout: Duration) -> io::Result<u16> {
        let start = Instant::now();
        let slot = self
            .topology()?
            .iter()
            .find(|n| n.port == failed_port)
            .and_then(|n| n.slots.first().map(|&(lo, _)| lo))
            .ok_or_else(|| io::Error::other(format!("port {failed_port} served no slots")))?;
        let mut promoted = 0;
        probe::wait_until(
            timeout,
            "another primary for the failed node's slots",
            || {
                let topology = self.topology().map_err(|e| e.to_string())?;
                match topology
                    .iter()
                    .find(|n| n.primary && n.port != failed_port && n.serves(slot))
                {
                    Some(node) => {
                        promoted = node.port;
                        Ok(())
                    }
                    None => Err(format!("slot {slot} still on port {failed_port}")),
                }
            },
        )?;
        self.wait_until_ok(timeout.saturating_sub(start.elapsed()))?;
        Ok(promoted)
    }

    fn live_nodes(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes
            .iter()
            .filter(|n| n.is_running() && !n.is_paused())
    }

    /// `redis://127.0.0.1:<port>/` of the primaries as created (ordered by their first slot):
    /// seed URLs for a cluster client. They do not follow later failovers.
    pub fn urls(&self) -> Vec<String> {
        self.primaries.iter().map(|&p| probe::url(p)).collect()
    }

    /// `rediss://127.0.0.1:<tls port>/` of the primaries as created (ordered by their first
    /// slot), for a cluster started with [`start_tls`](Self::start_tls).
    ///
    /// # Panics
    ///
    /// If the cluster was started without TLS.
    pub fn tls_urls(&self) -> Vec<String> {
        self.primaries
            .iter()
            .filter_map(|&p| self.nodes.iter().find(|n| n.port() == p))
            .map(RedisServer::tls_url)
            .collect()
    }

    /// `redis://127.0.0.1:<port>/` of every node, primaries and replicas, in start order.
    pub fn all_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Every node (primaries and replicas), in start order.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Every node, mutably (to `kill9`, `stop` or `restart` one).
    pub fn nodes_mut(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }

    /// The node at `index` (start order).
    ///
    /// # Panics
    ///
    /// If `index` is out of range.
    pub fn node(&self, index: usize) -> &RedisServer {
        &self.nodes[index]
    }

    /// The node at `index`, mutably.
    ///
    /// # Panics
    ///
    /// If `index` is out of range.
    pub fn node_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.nodes[index]
    }

    /// The index (for [`node_mut`](Self::node_mut)) of the node listening on `port`.
    pub fn index_of_port(&self, port: u16) -> Option<usize> {
        self.nodes.iter().position(|n| n.port() == port)
    }

    /// The current topology, from `CLUSTER NODES` of the first running, unpaused node that
    /// answers within 500 ms. Right after a failover, nodes may briefly disagree.
    ///
    /// # Errors
    ///
    /// When no node answers.
    pub fn topology(&self) -> io::Result<Vec<ClusterNodeInfo>> {
        let mut last = None;
        for node in self.live_nodes() {
            match query::<String>(node.port(), &["CLUSTER", "NODES"], POLL_TIMEOUT) {
                Ok(text) => return Ok(parse_cluster_nodes(&text)),
                Err(e) => last = Some(e),
            }
        }
        Err(io::Error::other(match last {
            Some(e) => format!("no cluster node answered CLUSTER NODES: {e}"),
            None => "no cluster node is running".to_string(),
        }))
    }

    /// The primaries currently serving slots (per [`topology`](Self::topology)), ordered by
    /// their first slot.
    ///
    /// # Errors
    ///
    /// When no node answers.
    pub fn current_primaries(&self) -> io::Result<Vec<&RedisServer>> {
        let mut masters: Vec<ClusterNodeInfo> = self
            .topology()?
            .into_iter()
            .filter(|n| n.primary && !n.slots.is_empty())
            .collect();
        masters.sort_by_key(|n| n.slots[0].0);
        Ok(masters
            .iter()
            .filter_map(|m| self.nodes.iter().find(|n| n.port() == m.port))
            .collect())
    }

    /// The node that currently serves `slot` as primary (per [`topology`](Self::topology)).
    ///
    /// # Errors
    ///
    /// When no node answers, or no primary serves the slot.
    pub fn primary_for_slot(&self, slot: u16) -> io::Result<&RedisServer> {
        let topology = self.topology()?;
        let owner = topology
            .iter()
            .filter(|n| n.primary && n.serves(slot))
            .min_by_key(|n| n.failed)
            .ok_or_else(|| io::Error::other(format!("no primary serves slot {slot}")))?;
        self.nodes
            .iter()
            .find(|n| n.port() == owner.port)
            .ok_or_else(|| {
                io::Error::other(format!(
                    "slot {slot} is served by unknown port {}",
                    owner.port
                ))
            })
    }

    /// The node that currently serves `key`'s slot as primary.
    ///
    /// # Errors
    ///
    /// As for [`primary_for_slot`](Self::primary_for_slot).
    pub fn primary_for_key(&self, key: &str) -> io::Result<&RedisServer> {
        self.primary_for_slot(self.keyslot(key))
    }

    /// The lock-loss recipe: breaks the replication link of `primary_port`'s replica
    /// (`CONFIG SET masterauth bogus`, then `CLIENT KILL TYPE master` on the replica) and waits
    /// until it reports `master_link_status:down`. The link stays down (AUTH fails against a
    /// primary without a password) while the replica stays healthy and can be promoted: writes
    /// to the primary from now on never reach it. Returns the replica's port.
    ///
    /// # Errors
    ///
    /// When the primary has no replica, or a node does not answer, or the link is not down
    /// within 10 s.
    pub fn break_replication(&self, primary_port: u16) -> io::Result<u16> {
        let topology = self.topology()?;
        let primary = topology
            .iter()
            .find(|n| n.port == primary_port)
            .ok_or_else(|| io::Error::other(format!("no node on port {primary_port}")))?;
        let replica = topology
            .iter()
            .find(|n| n.primary_id.as_deref() == Some(primary.id.as_str()))
            .ok_or_else(|| io::Error::other(format!("port {primary_port} has no replica")))?
            .port;
        let run = |args: &[&str]| {
            query::<redis::Value>(replica, args, QUERY_TIMEOUT)
                .map_err(|e| probe::io_err(format!("replica {replica}: {args:?}"), e))
        };
        run(&["CONFIG", "SET", "masterauth", "bogus"])?;
        run(&["CLIENT", "KILL", "TYPE", "master"])?;
        probe::wait_until(Duration::from_secs(10), "a broken replication link", || {
            let info: String = query(replica, &["INFO", "replication"], POLL_TIMEOUT)
                .map_err(|e| e.to_string())?;
            match info_field(&info, "master_link_status") {
                Some("down") => Ok(()),
                other => Err(format!("master_link_status:{other:?}")),
            }
        })?;
        Ok(replica)
    }

    /// Starts moving `slot` from the primary serving it to the primary on `to_port`:
    /// `CLUSTER SETSLOT slot IMPORTING <source id>` on the target, then `MIGRATING <target id>`
    /// on the source (the order `redis-cli --cluster reshard` uses). Keys stay where they are
    /// until [`move_keys`](Self::move_keys) or [`migrate_keys`](Self::migrate_keys) moves them;
    /// meanwhile the source answers `ASK` for a command whose keys it does not have, and a
    /// command naming several keys of the slot of which only some are on one node is refused
    /// with `TRYAGAIN`. Returns the source's port.
    ///
    /// A migration is three steps, each a helper: begin, move keys (all at once or a few at a
    /// time, to hold the slot in its "some keys moved" state), and
    /// [`finish_slot_migration`](Self::finish_slot_migration).
    ///
    /// # Errors
    ///
    /// When a node does not answer or refuses.
    pub fn begin_slot_migration(&self, slot: u16, to_port: u16) -> io::Result<u16> {
        let from_port = self.primary_for_slot(slot)?.port();
        let (from_id, to_id) = (self.node_id(from_port)?, self.node_id(to_port)?);
        let slot = slot.to_string();
        setslot(to_port, &[&slot, "IMPORTING", &from_id])?;
        setslot(from_port, &[&slot, "MIGRATING", &to_id])?;
        Ok(from_port)
    }

    /// Moves every key of `slot` from `from_port` to `to_port` with `MIGRATE ... KEYS`, which
    /// keeps their TTLs. Returns how many keys moved.
    ///
    /// # Errors
    ///
    /// When a node does not answer or `MIGRATE` fails.
    pub fn migrate_keys(&self, slot: u16, from_port: u16, to_port: u16) -> io::Result<usize> {
        let keys = self.keys_in_slot(from_port, slot, 1000)?;
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        self.move_keys(from_port, to_port, &keys)
    }

    /// At most `count` keys of `slot` stored on the node on `port` (`CLUSTER GETKEYSINSLOT`),
    /// e.g. to pick the next keys to [`move_keys`](Self::move_keys) during a migration.
    ///
    /// # Errors
    ///
    /// When the node does not answer.
    pub fn keys_in_slot(&self, port: u16, slot: u16, count: usize) -> io::Result<Vec<String>> {
        query(
            port,
            &[
                "CLUSTER",
                "GETKEYSINSLOT",
                &slot.to_string(),
                &count.to_string(),
            ],
            QUERY_TIMEOUT,
        )
        .map_err(|e| probe::io_err(format!("port {port}: GETKEYSINSLOT"), e))
    }

    /// Moves the given `keys` (of a slot being migrated, see
    /// [`begin_slot_migration`](Self::begin_slot_migration)) from `from_port` to `to_port` in
    /// one `MIGRATE 127.0.0.1 <to> "" 0 5000 KEYS ...`, which keeps their TTLs; the other keys
    /// of the slot stay on the source, so the slot is left in its "some keys moved" state.
    /// Keys that no longer exist on the source are skipped. Returns how many keys moved.
    ///
    /// # Errors
    ///
    /// When a node does not answer or `MIGRATE` fails.
    pub fn move_keys(&self, from_port: u16, to_port: u16, keys: &[&str]) -> io::Result<usize> {
        // Asked per slot: `EXISTS` on a migrating source answers `ASK` for a missing key.
        let mut stored = std::collections::HashMap::new();
        let mut present = Vec::with_capacity(keys.len());
        for key in keys {
            let slot = key_slot(key.as_bytes());
            let in_slot = match stored.entry(slot) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(self.keys_in_slot(from_port, slot, 100_000)?)
                }
            };
            if in_slot.iter().any(|k| k == key) {
                present.push(*key);
            }
        }
        if present.is_empty() {
            return Ok(0);
        }
        let to = to_port.to_string();
        let mut args = vec!["MIGRATE", "127.0.0.1", &to, "", "0", "5000", "KEYS"];
        args.extend(present.iter().copied());
        // `NOKEY`: the keys expired or were deleted since they were looked up.
        let reply = query::<redis::Value>(from_port, &args, QUERY_TIMEOUT)
            .map_err(|e| probe::io_err(format!("port {from_port}: MIGRATE"), e))?;
        match reply {
            redis::Value::SimpleString(s) if s == "NOKEY" => Ok(0),
            _ => Ok(present.len()),
        }
    }

    /// Ends a slot migration: moves the keys still on the source (`CLUSTER SETSLOT .. NODE`
    /// refuses while the source holds keys of the slot), then `CLUSTER SETSLOT slot NODE
    /// <target>` on the target, the source and every other live primary, so clients asking the
    /// source now get `MOVED`.
    ///
    /// # Errors
    ///
    /// When a node does not answer or refuses.
    pub fn finish_slot_migration(&self, slot: u16, from_port: u16, to_port: u16) -> io::Result<()> {
        let to_id = self.node_id(to_port)?;
        self.migrate_keys(slot, from_port, to_port)?;
        let slot = slot.to_string();
        setslot(to_port, &[&slot, "NODE", &to_id])?;
        setslot(from_port, &[&slot, "NODE", &to_id])?;
        for primary in self.current_primaries()? {
            if ![from_port, to_port].contains(&primary.port()) {
                setslot(primary.port(), &[&slot, "NODE", &to_id])?;
            }
        }
        Ok(())
    }

    fn node_id(&self, port: u16) -> io::Result<String> {
        query(port, &["CLUSTER", "MYID"], QUERY_TIMEOUT)
            .map_err(|e| probe::io_err(format!("port {port}: CLUSTER MYID"), e))
    }

    /// The hash slot of `key` (see [`key_slot`]); equal to `CLUSTER KEYSLOT key`.
    pub fn keyslot(&self, key: &str) -> u16 {
        key_slot(key.as_bytes())
    }

    /// All keys matching `pattern` on the current primaries (a leak check), sorted. Primaries
    /// that are killed or paused are skipped.
    ///
    /// # Errors
    ///
    /// When the topology cannot be read or a live primary does not answer `SCAN`.
    pub fn keys(&self, pattern: &str) -> io::Result<Vec<String>> {
        let mut keys = Vec::new();
        for primary in self.current_primaries()? {
            if primary.is_running() && !primary.is_paused() {
                keys.extend(
                    probe::scan_keys(primary.port(), pattern)
                        .map_err(|e| probe::io_err(format!("SCAN on {}", primary.port()), e))?,
                );
            }
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_the_reference_values() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(
            key_slot(b"foo{}{bar}"),
            crc16(b"foo{}{bar}") % CLUSTER_SLOTS
        );
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
    }

    #[test]
    fn parses_cluster_nodes() {
        let text = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004,host replica e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460 [5461->-67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1]
6ec23923021cf3ffec47632106199cb7f496ce01 127.0.0.1:30005@31005 master,fail - 1426238316232 0 5 disconnected 10923 10924-16383
";
        let nodes = parse_cluster_nodes(text);
        assert_eq!(nodes.len(), 4);
        assert!(!nodes[0].primary);
        assert_eq!(nodes[0].port, 30004);
        assert_eq!(nodes[0].primary_id.as_deref(), Some(nodes[2].id.as_str()));
        assert_eq!(nodes[1].slots, vec![(5461, 10922)]);
        assert_eq!(nodes[2].slots, vec![(0, 5460)]);
        assert!(nodes[3].failed && !nodes[3].connected);
        assert_eq!(nodes[3].slots, vec![(10923, 10923), (10924, 16383)]);
        assert!(nodes[3].serves(16383) && !nodes[3].serves(0));
    }
}
