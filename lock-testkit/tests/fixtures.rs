//! The fixtures work: cluster, sentinel, independent servers and the fault proxy, and every
//! process and directory is gone after drop.

use std::io;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lock_testkit::{
    key_slot, FaultProxy, ProxyMode, RedisCluster, RedisSentinel, RedisServer, RedisServers,
    SentinelPasswords, TestCa, TlsServerConfig, Validity,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The processes and directories a fixture owns, to check they are gone after drop.
struct Owned {
    pids: Vec<u32>,
    dirs: Vec<PathBuf>,
}

impl Owned {
    fn of<'a>(servers: impl IntoIterator<Item = &'a RedisServer>) -> Self {
        let mut owned = Self {
            pids: Vec::new(),
            dirs: Vec::new(),
        };
        for server in servers {
            owned.pids.extend(server.pid());
            owned.dirs.push(server.dir().to_path_buf());
        }
        owned
    }

    fn assert_gone(&self) {
        for pid in &self.pids {
            let alive = Command::new("kill")
                .args(["-0", &pid.to_string()])
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            assert!(!alive, "process {pid} survived the fixture's drop");
        }
        for dir in &self.dirs {
            assert!(
                !dir.exists(),
                "{} survived the fixture's drop",
                dir.display()
            );
        }
    }
}

/// Held by each test that starts a Cluster or a Sentinel set (six servers or more, failing
/// over on short timeouts), so that they run one at a time: four test threads ran several at
/// once, and beside a busy loop on two cores one failed (a promoted replica without the key
/// its primary's `WAIT` had confirmed; the cause was not found).
fn one_topology_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TOPOLOGY: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A failed test poisons it; the next one runs all the same.
    TOPOLOGY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines().find_map(|l| {
        l.strip_prefix(&format!("{field}:"))
            .map(|v| v.trim().to_string())
    })
}

#[test]
fn cluster_routes_keys_and_fails_over() {
    let _one = one_topology_at_a_time();
    let started = Instant::now();
    let mut cluster = RedisCluster::start(3, 1).expect("start a 3+3 cluster");
    eprintln!("cluster 3x1 up in {:?}", started.elapsed());
    assert_eq!(cluster.nodes().len(), 6);
    assert_eq!(cluster.urls().len(), 3);
    assert_eq!(cluster.all_urls().len(), 6);
    for node in cluster.nodes() {
        assert!(node.port() < 55535);
        let info: String = node.cmd(&["CLUSTER", "INFO"]);
        assert_eq!(info_field(&info, "cluster_state").as_deref(), Some("ok"));
        assert_eq!(
            info_field(&info, "cluster_known_nodes").as_deref(),
            Some("6")
        );
    }

    // The local slot function agrees with the server.
    let probe = cluster.node(0);
    for key in [
        "foo",
        "lock:{order-42}",
        "{user1000}.following",
        "a{}b",
        "",
        "ключ",
    ] {
        let server_slot: u16 = probe.cmd(&["CLUSTER", "KEYSLOT", key]);
        assert_eq!(cluster.keyslot(key), server_slot, "slot of {key:?}");
        assert_eq!(key_slot(key.as_bytes()), server_slot);
    }

    // SET/GET on the primary that owns the key; another primary redirects.
    let key = "lock:{order-42}";
    let owner = cluster.primary_for_key(key).expect("owner").port();
    let primary = &cluster.nodes()[cluster.index_of_port(owner).unwrap()];
    // The replica has the key before the owner is killed below: WAIT on the SET's connection.
    let ((), acked): ((), i64) =
        primary.write_and_wait(&["SET", key, "token-1"], 1, Duration::from_secs(2));
    assert_eq!(acked, 1);
    let got: String = primary.cmd(&["GET", key]);
    assert_eq!(got, "token-1");
    let other = cluster
        .current_primaries()
        .unwrap()
        .into_iter()
        .find(|p| p.port() != owner)
        .expect("another primary");
    let moved = other.try_cmd::<Option<String>>(&["GET", key]).unwrap_err();
    assert_eq!(moved.code(), Some("MOVED"), "{moved}");
    assert_eq!(cluster.keys("lock:*").unwrap(), vec![key.to_string()]);

    // Kill the owner: its replica takes over, with the key.
    let index = cluster.index_of_port(owner).unwrap();
    let killed = Instant::now();
    cluster.node_mut(index).kill9();
    let new_owner = loop {
        let candidate = cluster.primary_for_key(key).map(|p| p.port());
        if let Ok(port) = candidate {
            if port != owner {
                break port;
            }
        }
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "no cluster failover in 10 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    cluster.wait_until_ok(Duration::from_secs(10)).unwrap();
    eprintln!(
        "cluster failover: new owner {new_owner} after {:?}",
        killed.elapsed()
    );
    let new_primary = &cluster.nodes()[cluster.index_of_port(new_owner).unwrap()];
    let got: String = new_primary.cmd(&["GET", key]);
    assert_eq!(got, "token-1");

    let owned = Owned::of(cluster.nodes());
    drop(cluster);
    owned.assert_gone();
}

#[test]
fn small_clusters_are_created_by_hand() {
    let _one = one_topology_at_a_time();
    let started = Instant::now();
    let cluster = RedisCluster::start(2, 1).expect("start a 2+2 cluster");
    eprintln!("cluster 2x1 up in {:?}", started.elapsed());
    let primaries = cluster.current_primaries().unwrap();
    assert_eq!(primaries.len(), 2);
    let low = cluster.primary_for_slot(0).unwrap().port();
    let high = cluster.primary_for_slot(16383).unwrap().port();
    assert_ne!(low, high);
    let topology = cluster.topology().unwrap();
    assert_eq!(topology.iter().filter(|n| !n.primary).count(), 2);
    for node in cluster.nodes() {
        let info: String = node.cmd(&["CLUSTER", "INFO"]);
        assert_eq!(info_field(&info, "cluster_state").as_deref(), Some("ok"));
    }
    let owned = Owned::of(cluster.nodes());
    drop(cluster);
    owned.assert_gone();
}

#[test]
fn sentinel_loses_an_unreplicated_write_on_failover() {
    let _one = one_topology_at_a_time();
    let started = Instant::now();
    let mut sentinel = RedisSentinel::start("mymaster").expect("start sentinel fixture");
    eprintln!("sentinel 1+1+3 up in {:?}", started.elapsed());
    assert_eq!(sentinel.master_name(), "mymaster");
    assert_eq!(sentinel.sentinel_urls().len(), 3);
    let primary_port = sentinel.primary().port();
    assert_eq!(sentinel.current_master_port().unwrap(), primary_port);
    let info: String = sentinel.replica().cmd(&["INFO", "replication"]);
    assert_eq!(
        info_field(&info, "master_link_status").as_deref(),
        Some("up")
    );

    // Replicated write: WAIT sees the replica.
    let ((), acked): ((), i64) =
        sentinel
            .primary()
            .write_and_wait(&["SET", "before", "1"], 1, Duration::from_millis(1000));
    assert_eq!(acked, 1);

    // WAIT counts only the writes of its own connection: through `cmd`, a connection a call,
    // it answers 1 for a write the frozen replica cannot have; `write_and_wait` answers 0.
    sentinel.replica().pause();
    let _: () = sentinel.primary().cmd(&["SET", "frozen", "1"]);
    let acked: i64 = sentinel.primary().cmd(&["WAIT", "1", "100"]);
    assert_eq!(acked, 1, "WAIT on a connection without writes");
    let ((), acked): ((), i64) =
        sentinel
            .primary()
            .write_and_wait(&["SET", "frozen", "2"], 1, Duration::from_millis(100));
    assert_eq!(acked, 0, "WAIT on the write's connection");
    sentinel.replica().resume();

    // Broken replication can be restored.
    sentinel.break_replication().unwrap();
    let ((), acked): ((), i64) =
        sentinel
            .primary()
            .write_and_wait(&["SET", "during", "1"], 1, Duration::from_millis(200));
    assert_eq!(acked, 0);
    sentinel.restore_replication().unwrap();
    // A later write acknowledged: the stream, "during" first, reached the replica.
    let ((), acked): ((), i64) =
        sentinel
            .primary()
            .write_and_wait(&["SET", "after", "1"], 1, Duration::from_millis(1000));
    assert_eq!(acked, 1);
    let during: Option<String> = sentinel.replica().cmd(&["GET", "during"]);
    assert_eq!(during.as_deref(), Some("1"));

    // Broken replication: the write is acknowledged by nobody.
    let broke = Instant::now();
    sentinel.break_replication().unwrap();
    eprintln!("break_replication took {:?}", broke.elapsed());
    let (set, acked): (Option<String>, i64) = sentinel.primary().write_and_wait(
        &["SET", "lock", "holder-1", "NX", "PX", "30000"],
        1,
        Duration::from_millis(200),
    );
    assert_eq!(set.as_deref(), Some("OK"));
    assert_eq!(acked, 0);

    // Failover: the replica is promoted without the lock.
    let killed = Instant::now();
    assert_eq!(sentinel.kill_primary(), primary_port);
    let new_master = sentinel.wait_for_failover(Duration::from_secs(10)).unwrap();
    eprintln!(
        "sentinel failover to {new_master} after {:?}",
        killed.elapsed()
    );
    assert_eq!(new_master, sentinel.replica().port());
    assert_eq!(sentinel.current_master_port().unwrap(), new_master);
    assert_eq!(sentinel.known_master_port(), new_master);
    let master = sentinel.master();
    let lock: Option<String> = master.cmd(&["GET", "lock"]);
    assert_eq!(lock, None, "the unreplicated lock must be gone");
    let before: Option<String> = master.cmd(&["GET", "before"]);
    assert_eq!(before.as_deref(), Some("1"));
    let second: Option<String> = master.cmd(&["SET", "lock", "holder-2", "NX", "PX", "30000"]);
    assert_eq!(
        second.as_deref(),
        Some("OK"),
        "a second holder gets the lock"
    );

    let owned = Owned::of(
        [sentinel.primary(), sentinel.replica()]
            .into_iter()
            .chain(sentinel.sentinels()),
    );
    drop(sentinel);
    owned.assert_gone();
}

/// A Sentinel deployment with passwords: the data nodes and the sentinels refuse clients
/// without theirs, replicate and monitor with them, the fixture's helpers and URLs carry them,
/// and a failover works, with replication restored by password after it was broken.
#[test]
fn sentinel_with_passwords_requires_them_and_fails_over() {
    let _one = one_topology_at_a_time();
    let passwords = SentinelPasswords {
        data: "datapw".into(),
        sentinels: "sentinelpw".into(),
    };
    let mut sentinel = RedisSentinel::start_with_passwords("auth", &passwords).unwrap();
    let anonymous = |port: u16| -> redis::RedisResult<String> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
        redis::cmd("PING").query(&mut client.get_connection()?)
    };
    for server in [sentinel.primary(), sentinel.replica()]
        .into_iter()
        .chain(sentinel.sentinels())
    {
        let refused = anonymous(server.port()).unwrap_err();
        assert_eq!(refused.code(), Some("NOAUTH"), "{refused}");
        assert!(server.url().starts_with("redis://:"), "{}", server.url());
        let pong: String = server.cmd(&["PING"]);
        assert_eq!(pong, "PONG");
    }
    assert!(sentinel
        .sentinel_urls()
        .iter()
        .all(|u| u.starts_with("redis://:sentinelpw@")));
    assert!(sentinel.primary().url().starts_with("redis://:datapw@"));
    let ((), acked): ((), i64) =
        sentinel
            .primary()
            .write_and_wait(&["SET", "before", "1"], 1, Duration::from_millis(1000));
    assert_eq!(acked, 1, "replication with masterauth");
    sentinel.break_replication().unwrap();
    sentinel.restore_replication().unwrap();
    sentinel.kill_primary();
    let promoted = sentinel.wait_for_failover(Duration::from_secs(10)).unwrap();
    assert_eq!(promoted, sentinel.replica().port());
    let before: Option<String> = sentinel.master().cmd(&["GET", "before"]);
    assert_eq!(before.as_deref(), Some("1"));
    assert!(!format!("{passwords:?}").contains("datapw"));
    let err = RedisSentinel::start_with_passwords(
        "auth",
        &SentinelPasswords {
            data: "with space".into(),
            sentinels: "x".into(),
        },
    )
    .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
}

/// A server's directory is made fresh for it, private (mode 0700) and under a random name:
/// another user of the machine can neither predict it nor plant it (or a symlink in its
/// place) beforehand to have the server's files (config, TLS keys, logs, snapshots) written
/// where they choose. Before, it was `/tmp/lock-testkit-<pid>-<port>`, accepted when it existed.
#[test]
fn server_directories_are_fresh_private_and_unpredictable() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let server = RedisServer::start().unwrap();
    let dir = server.dir().to_path_buf();
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    let predictable = format!("{}-{}", std::process::id(), server.port());
    assert!(
        !name.contains(&predictable) && !name.contains(&server.port().to_string()),
        "a predictable directory: {}",
        dir.display()
    );
    let meta = std::fs::symlink_metadata(&dir).unwrap();
    assert!(meta.is_dir() && !meta.file_type().is_symlink());
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o700,
        "{} is readable by others",
        dir.display()
    );
    let own: u32 = String::from_utf8(Command::new("id").arg("-u").output().unwrap().stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(meta.uid(), own);
    let other = RedisServer::start().unwrap();
    assert_ne!(other.dir(), server.dir());
    drop((server, other));
    assert!(!dir.exists(), "{} survived the drop", dir.display());
}

#[test]
fn invalid_fixture_arguments_are_rejected() {
    let err = RedisCluster::start(0, 1).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    let err = RedisSentinel::start("my master").unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    let ca = TestCa::new("fixture CA");
    let cert = ca.server_cert(&["127.0.0.1"], Validity::Current);
    let err = RedisCluster::start_tls(3, 0, &TlsServerConfig::new(cert, &ca)).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    let err = RedisServer::start_with(&["--no-such-directive", "1"]).unwrap_err();
    assert!(err.to_string().contains("exited early"), "{err}");
    assert!(err.to_string().contains("no-such-directive"), "{err}");
    let empty = RedisServers::start(0).unwrap();
    assert!(empty.is_empty() && empty.urls().is_empty());
}

#[test]
fn independent_servers_and_leak_checks() {
    let started = Instant::now();
    let mut servers = RedisServers::start(5).expect("start 5 servers");
    eprintln!("5 independent servers up in {:?}", started.elapsed());
    assert_eq!(servers.len(), 5);
    let mut ports = servers.ports();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 5, "distinct ports");
    assert_eq!(servers.urls()[3], servers[3].url());
    for server in &servers {
        let pong: String = server.cmd(&["PING"]);
        assert_eq!(pong, "PONG");
        let role: Vec<redis::Value> = server.cmd(&["ROLE"]);
        assert_eq!(
            redis::from_redis_value::<String>(role[0].clone()).unwrap(),
            "master"
        );
    }

    // Leak-check helpers.
    let _: () = servers[0].cmd(&["SET", "lock:a", "1"]);
    let _: () = servers[0].cmd(&["SET", "other", "1"]);
    let _: () = servers[4].cmd(&["SET", "lock:b", "1"]);
    assert_eq!(servers[0].keys("lock:*"), vec!["lock:a".to_string()]);
    assert_eq!(
        servers.keys("lock:*"),
        vec![(0, "lock:a".to_string()), (4, "lock:b".to_string())]
    );
    assert!(servers[1].pubsub_channels().is_empty());
    wait_client_count(&servers[1], 0);
    let mut subscriber = servers[1].client();
    let mut pubsub = subscriber.as_pubsub();
    pubsub.subscribe("lock:released:a").unwrap();
    assert_eq!(
        servers[1].pubsub_channels(),
        vec!["lock:released:a".to_string()]
    );
    wait_client_count(&servers[1], 1);
    drop(pubsub);
    drop(subscriber);

    // One server down, the others still answer; a paused one is skipped by `keys`.
    servers[2].kill9();
    assert!(servers[2].try_cmd::<String>(&["PING"]).is_err());
    servers[4].pause();
    assert!(servers[4].is_paused());
    let paused = Instant::now();
    assert!(servers[4].try_cmd::<String>(&["PING"]).is_err());
    assert!(paused.elapsed() < Duration::from_secs(5));
    assert_eq!(servers.keys("lock:*"), vec![(0, "lock:a".to_string())]);
    servers[4].resume();
    let pong: String = servers[4].cmd(&["PING"]);
    assert_eq!(pong, "PONG");

    assert!(lock_testkit::running_servers() >= 4);
    let owned = Owned::of(&servers);
    drop(servers);
    owned.assert_gone();
}

/// `leftovers` catches each kind of leak under the prefix (a lock key, a read lock's or a
/// semaphore's set, waiting marks and lines, whatever their expiry; a key without an expiry,
/// a subscribed channel, a pattern subscription), ignores fence counters and release latches
/// with a TTL, keys of the allowed suffixes and anything outside the prefix, and is empty after
/// the cleanup. A user key holding `:lock:` does not make a fence key a lock key.
#[test]
fn leftovers_catch_every_kind_of_leak() {
    let server = RedisServer::start().expect("start redis-server");
    assert!(server.leftovers("lock:", &[]).is_empty());

    let _: () = server.cmd(&["SET", "lock:{t}:lock:k", "token", "PX", "60000"]);
    let _: () = server.cmd(&["SET", "lock:{t}:fence:k", "7", "PX", "60000"]);
    let _: () = server.cmd(&["SET", "lock:{t}:fence:a:lock:b", "7", "PX", "60000"]);
    let _: () = server.cmd(&["SET", "lock:{t}:unlocked:tok", "1", "PX", "60000"]);
    // Held, with an expiry: a permit set and a reader set; waiting: marks and a line.
    for (key, member) in [
        ("lock:{t}:semaphore:s", "tok|host:1"),
        ("lock:{t}:readers:r", "tok"),
        ("lock:{t}:waiters:k", "tok"),
        ("lock:{t}:semaphore-line:s", "tok|host:1"),
    ] {
        let _: () = server.cmd(&["ZADD", key, "1", member]);
        let _: () = server.cmd(&["PEXPIRE", key, "60000"]);
    }
    let _: () = server.cmd(&["SET", "lock:{t}:forever", "1"]);
    let _: () = server.cmd(&["SET", "lock:{t}:node-epoch", "1"]);
    let _: () = server.cmd(&["SET", "elsewhere", "1"]);
    let mut subscriber = server.client();
    let mut pubsub = subscriber.as_pubsub();
    pubsub.subscribe("lock:{t}:released:k").unwrap();
    pubsub.subscribe("elsewhere").unwrap();
    pubsub.psubscribe("lock:*").unwrap();

    let left = server.leftovers("lock:", &[":node-epoch"]);
    let mut held = left.lock_keys.clone();
    held.sort();
    assert_eq!(
        held,
        [
            "lock:{t}:lock:k",
            "lock:{t}:readers:r",
            "lock:{t}:semaphore:s"
        ]
    );
    let mut waiting = left.waiting.clone();
    waiting.sort();
    assert_eq!(waiting, ["lock:{t}:semaphore-line:s", "lock:{t}:waiters:k"]);
    assert_eq!(left.keys_without_ttl, ["lock:{t}:forever"]);
    assert_eq!(left.channels, ["lock:{t}:released:k"]);
    assert_eq!(left.patterns, 1);
    assert!(!left.is_empty());
    let text = left.to_string();
    for part in ["lock:{t}:lock:k", "lock:{t}:forever", "lock:{t}:released:k"] {
        assert!(text.contains(part), "{text}");
    }
    // Without the allowance the epoch key is a key without an expiry too.
    assert_eq!(
        server.leftovers("lock:", &[]).keys_without_ttl,
        ["lock:{t}:forever", "lock:{t}:node-epoch"]
    );

    // Each kind alone is enough.
    let _: () = server.cmd(&[
        "DEL",
        "lock:{t}:lock:k",
        "lock:{t}:forever",
        "lock:{t}:node-epoch",
        "lock:{t}:semaphore:s",
        "lock:{t}:readers:r",
        "lock:{t}:waiters:k",
        "lock:{t}:semaphore-line:s",
    ]);
    let left = server.leftovers("lock:", &[]);
    assert!(left.lock_keys.is_empty() && left.keys_without_ttl.is_empty());
    assert!(left.waiting.is_empty());
    assert!(!left.is_empty(), "the subscriptions are still there");
    pubsub.punsubscribe("lock:*").unwrap();
    // (Each call waits for the server's confirmation.)
    pubsub.unsubscribe("lock:{t}:released:k").unwrap();
    let left = server.leftovers("lock:", &[]);
    assert!(left.is_empty(), "{left}");
}

/// Waits until `server` has `want` clients besides the asking one (a connection closed just
/// before may still be listed for a moment).
fn wait_client_count(server: &RedisServer, want: usize) {
    let start = Instant::now();
    loop {
        let count = server.client_count();
        if count == want {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{count} clients, want {want}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Sends `PING` and waits for `+PONG` at most `wait`; returns the round-trip time.
async fn ping(stream: &mut TcpStream, wait: Duration) -> io::Result<Duration> {
    let start = Instant::now();
    stream.write_all(b"PING\r\n").await?;
    read_pong(stream, wait).await?;
    Ok(start.elapsed())
}

async fn read_pong(stream: &mut TcpStream, wait: Duration) -> io::Result<()> {
    let mut buf = [0u8; 7];
    match tokio::time::timeout(wait, stream.read_exact(&mut buf)).await {
        Err(_) => Err(io::ErrorKind::TimedOut.into()),
        Ok(Err(e)) => Err(e),
        Ok(Ok(_)) => {
            assert_eq!(&buf, b"+PONG\r\n");
            Ok(())
        }
    }
}

/// Reads once (without sending): `Ok(0)` is end-of-stream.
async fn read_once(stream: &mut TcpStream) -> io::Result<usize> {
    let mut buf = [0u8; 64];
    tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buf))
        .await
        .expect("the proxy must close or reset, not hang")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_proxy_modes() {
    let server = RedisServer::start().unwrap();
    let started = Instant::now();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    eprintln!("fault proxy up in {:?}", started.elapsed());
    assert_eq!(proxy.upstream_port(), server.port());
    assert_eq!(proxy.url(), format!("redis://127.0.0.1:{}/", proxy.port()));
    let addr = ("127.0.0.1", proxy.port());
    let short = Duration::from_millis(300);

    // Pass: a real client works through the proxy.
    let client = redis::Client::open(proxy.url()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let pong: String = redis::cmd("PING").query_async(&mut con).await.unwrap();
    assert_eq!(pong, "PONG");
    let mut a = TcpStream::connect(addr).await.unwrap();
    let base = ping(&mut a, short).await.unwrap();

    // Delay: every chunk waits 100 ms in each direction.
    proxy
        .set_mode(ProxyMode::Delay(Duration::from_millis(100)))
        .await;
    let delayed = ping(&mut a, Duration::from_secs(2)).await.unwrap();
    eprintln!("PING round trip: {base:?} passing, {delayed:?} with Delay(100ms)");
    assert!(delayed >= Duration::from_millis(200), "{delayed:?}");
    assert!(delayed < Duration::from_millis(1000), "{delayed:?}");

    // Hole: nothing comes back, on old and new connections; the requests are held.
    proxy.set_mode(ProxyMode::Hole).await;
    let err = ping(&mut a, short).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    let mut b = TcpStream::connect(addr).await.unwrap();
    let err = ping(&mut b, short).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    // A client that gives up and closes: its SET still runs once the hole heals (ghost).
    let mut ghost = TcpStream::connect(addr).await.unwrap();
    ghost
        .write_all(b"SET ghost holder NX PX 10000\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(ghost);
    assert!(server.keys("ghost").is_empty());
    proxy.set_mode(ProxyMode::Pass).await;
    read_pong(&mut a, Duration::from_secs(2)).await.unwrap();
    read_pong(&mut b, Duration::from_secs(2)).await.unwrap();
    let healed = Instant::now();
    while server.keys("ghost").is_empty() {
        assert!(
            healed.elapsed() < Duration::from_secs(2),
            "held SET was not delivered"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ttl: i64 = server.cmd(&["PTTL", "ghost"]);
    assert!(ttl > 9000, "the ghost lock has a fresh TTL: {ttl}");

    // Reset: existing connections get an RST; new ones pass.
    assert!(proxy.open_connections() >= 2);
    proxy.set_mode(ProxyMode::Reset).await;
    assert_eq!(proxy.open_connections(), 0);
    let err = read_once(&mut a).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}");
    let mut c = TcpStream::connect(addr).await.unwrap();
    ping(&mut c, short).await.unwrap();

    // Drop: existing connections are closed, new ones are closed on accept.
    proxy.set_mode(ProxyMode::Drop).await;
    assert_eq!(read_once(&mut c).await.unwrap(), 0);
    let mut d = TcpStream::connect(addr).await.unwrap();
    assert_eq!(read_once(&mut d).await.unwrap(), 0);

    // Refuse: nobody listens.
    proxy.set_mode(ProxyMode::Pass).await;
    let mut e = TcpStream::connect(addr).await.unwrap();
    ping(&mut e, short).await.unwrap();
    proxy.set_mode(ProxyMode::Refuse).await;
    assert_eq!(read_once(&mut e).await.unwrap(), 0);
    let err = TcpStream::connect(addr).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
    let failed: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut con).await;
    assert!(failed.is_err());

    // Back to Pass: the same port listens again.
    proxy.set_mode(ProxyMode::Pass).await;
    let mut f = TcpStream::connect(addr).await.unwrap();
    ping(&mut f, short).await.unwrap();
    assert_eq!(proxy.mode(), ProxyMode::Pass);
    assert!(proxy.connections() >= 7, "{}", proxy.connections());

    // Dropping the proxy closes its connections and its port.
    drop(proxy);
    assert_eq!(read_once(&mut f).await.unwrap(), 0);
    let dropped = Instant::now();
    loop {
        match TcpStream::connect(addr).await {
            Err(err) if err.kind() == io::ErrorKind::ConnectionRefused => break,
            other => assert!(dropped.elapsed() < Duration::from_secs(2), "{other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A TLS server listens on a second free loopback port with the certificate files in its own
/// directory; after a restart it still does; on drop the process and the files are gone.
#[test]
fn tls_server_listens_on_its_own_port_and_cleans_up() {
    let ca = TestCa::new("fixture CA");
    let cert = ca.server_cert(&["127.0.0.1"], Validity::Current);
    let mut server = RedisServer::start_tls(&TlsServerConfig::new(cert, &ca)).unwrap();
    let tls_port = server.tls_port().unwrap();
    assert_ne!(tls_port, server.port());
    assert_eq!(server.tls_url(), format!("rediss://127.0.0.1:{tls_port}/"));
    let tls_dir = server.dir().join("tls");
    for file in ["server.crt", "server.key", "ca.crt"] {
        assert!(tls_dir.join(file).exists(), "{file}");
    }
    let conf: Vec<String> = server.cmd(&["CONFIG", "GET", "tls-port"]);
    assert_eq!(conf, ["tls-port".to_owned(), tls_port.to_string()]);
    assert!(std::net::TcpStream::connect(("127.0.0.1", tls_port)).is_ok());
    server.restart().unwrap();
    assert!(std::net::TcpStream::connect(("127.0.0.1", tls_port)).is_ok());
    assert!(RedisServer::start().unwrap().tls_port().is_none());
    let owned = Owned::of([&server]);
    drop(server);
    owned.assert_gone();
}

/// A TLS Sentinel deployment: replication and the sentinels' monitoring run over TLS (the
/// sentinels report TLS ports), a failover promotes the replica, and everything is gone after
/// drop.
#[test]
fn tls_sentinel_replicates_and_fails_over_over_tls() {
    let _one = one_topology_at_a_time();
    let ca = TestCa::new("fixture CA");
    let cert = ca.server_cert(&["127.0.0.1"], Validity::Current);
    let started = Instant::now();
    let mut sentinel = RedisSentinel::start_tls("tlsmaster", &TlsServerConfig::new(cert, &ca))
        .expect("start TLS sentinel fixture");
    eprintln!("TLS sentinel 1+1+3 up in {:?}", started.elapsed());
    let primary_tls = sentinel.primary().tls_port().unwrap();
    let replica_tls = sentinel.replica().tls_port().unwrap();
    assert_eq!(sentinel.current_master_port().unwrap(), primary_tls);
    assert_eq!(sentinel.known_master_port(), primary_tls);
    let urls = sentinel.sentinel_tls_urls();
    assert_eq!(urls.len(), 3);
    for (url, s) in urls.iter().zip(sentinel.sentinels()) {
        assert_eq!(
            *url,
            format!("rediss://127.0.0.1:{}/", s.tls_port().unwrap())
        );
        // The sentinel monitors the TLS ports (which speak nothing but TLS) and sees both
        // servers: its own connections to them are TLS.
        let master: Vec<String> = s.cmd(&["SENTINEL", "MASTER", "tlsmaster"]);
        let port = master
            .chunks_exact(2)
            .find(|p| p[0] == "port")
            .map(|p| p[1].clone());
        assert_eq!(port, Some(primary_tls.to_string()));
        let flags = master
            .chunks_exact(2)
            .find(|p| p[0] == "flags")
            .map(|p| p[1].clone());
        assert_eq!(flags.as_deref(), Some("master"));
    }
    // The replica replicates from the primary's TLS port.
    let info: String = sentinel.replica().cmd(&["INFO", "replication"]);
    assert_eq!(
        info_field(&info, "master_port"),
        Some(primary_tls.to_string())
    );
    assert_eq!(
        info_field(&info, "master_link_status").as_deref(),
        Some("up")
    );
    let ((), acked): ((), i64) =
        sentinel
            .primary()
            .write_and_wait(&["SET", "before", "1"], 1, Duration::from_millis(1000));
    assert_eq!(acked, 1);

    assert_eq!(sentinel.kill_primary(), primary_tls);
    let new_master = sentinel.wait_for_failover(Duration::from_secs(15)).unwrap();
    assert_eq!(new_master, replica_tls);
    assert_eq!(sentinel.master().port(), sentinel.replica().port());
    let before: Option<String> = sentinel.master().cmd(&["GET", "before"]);
    assert_eq!(before.as_deref(), Some("1"));

    let owned = Owned::of(
        [sentinel.primary(), sentinel.replica()]
            .into_iter()
            .chain(sentinel.sentinels()),
    );
    drop(sentinel);
    owned.assert_gone();
}

/// A TLS cluster: every node has a TLS port and `tls-cluster yes` / `tls-replication yes`;
/// the fixture's plaintext probes see plaintext ports, the seeds are the primaries' TLS URLs,
/// the replicas replicate over TLS, and everything is gone after drop.
#[test]
fn tls_cluster_is_created_with_tls_bus_and_replication() {
    let _one = one_topology_at_a_time();
    let ca = TestCa::new("fixture CA");
    let cert = ca.server_cert(&["127.0.0.1"], Validity::Current);
    let config = TlsServerConfig::new(cert, &ca).with_client_identity(ca.client_cert("node"));
    let cluster = RedisCluster::start_tls(3, 1, &config).expect("start TLS cluster fixture");
    let primaries = cluster.current_primaries().unwrap();
    assert_eq!(primaries.len(), 3);
    let seeds = cluster.tls_urls();
    let expected: Vec<String> = primaries.iter().map(|p| p.tls_url()).collect();
    assert_eq!(seeds, expected);
    for node in cluster.nodes() {
        for (name, want) in [("tls-cluster", "yes"), ("tls-replication", "yes")] {
            let conf: Vec<String> = node.cmd(&["CONFIG", "GET", name]);
            assert_eq!(conf, [name.to_owned(), want.to_owned()]);
        }
        let bus: Vec<String> = node.cmd(&["CONFIG", "GET", "cluster-port"]);
        assert_eq!(bus[1], (node.port() + 10000).to_string());
    }
    // A replica replicates from its primary's TLS port.
    let replica = cluster
        .topology()
        .unwrap()
        .into_iter()
        .find(|n| !n.primary)
        .unwrap();
    let replica = &cluster.nodes()[cluster.index_of_port(replica.port).unwrap()];
    let info: String = replica.cmd(&["INFO", "replication"]);
    let master_port: u16 = info_field(&info, "master_port").unwrap().parse().unwrap();
    assert!(
        cluster
            .nodes()
            .iter()
            .any(|n| n.tls_port() == Some(master_port)),
        "replica replicates from {master_port}, not a TLS port"
    );
    assert_eq!(
        info_field(&info, "master_link_status").as_deref(),
        Some("up")
    );
    let owned = Owned::of(cluster.nodes());
    drop(cluster);
    owned.assert_gone();
}

#[test]
fn fixtures_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<RedisServer>();
    assert_send_sync::<RedisServers>();
    assert_send_sync::<RedisCluster>();
    assert_send_sync::<RedisSentinel>();
    assert_send_sync::<FaultProxy>();
}

/// A server whose port is taken says so with `AddrInUse`, the error the fixtures that pick
/// their own ports start again on other ports for.
#[test]
fn a_server_on_a_taken_port_fails_with_addr_in_use() {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = holder.local_addr().unwrap().port();
    let error = RedisServer::start_on(port).unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::AddrInUse, "{error}");
    drop(holder);
}
