//! Where the locks live ([`Topology`]) and how a locker connects to it: clients with the TLS
//! settings, the command connection, and where release notifications come from.

use std::time::Duration;

#[cfg(all(feature = "sentinel", feature = "tls"))]
use redis::sentinel::SentinelClientBuilder;
#[cfg(feature = "sentinel")]
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
#[cfg(feature = "sentinel")]
use redis::RedisConnectionInfo;

use crate::backend_error::BackendError;
#[cfg(feature = "sentinel")]
use crate::connection::SentinelPrimary;
use crate::connection::{Connection, Timeouts};
use crate::error::{ConfigError, LockError};
use crate::release_messages::PubSubSource;
use crate::store::{
    MinReplicas, Node, Opener, Quorum, RedLockStore, RestartGuard, SingleStore, Store,
};
#[cfg(feature = "tls")]
use crate::tls;
#[cfg(feature = "tls")]
pub(crate) use crate::tls::TlsConfig;

/// Without the `tls` feature there are no TLS settings: a stand-in that has no value, so that
/// the code handing an `Option<&TlsConfig>` around is the same in both builds.
#[cfg(not(feature = "tls"))]
#[derive(Clone, Debug)]
pub(crate) enum TlsConfig {}

/// Where the locks live.
#[derive(Clone)]
pub(crate) enum Topology {
    Server(String),
    Cluster(Vec<String>),
    Sentinel {
        master: String,
        /// The sentinels' URLs, which carry the sentinels' own credentials.
        sentinels: Vec<String>,
        /// The credentials of the data nodes the sentinels name (the primary, and the replica
        /// promoted in a failover); they are not the sentinels'.
        data: Option<Credentials>,
    },
    RedLock(Vec<String>),
}

impl Topology {
    /// Every URL the topology names (for Sentinel: the sentinels').
    #[cfg(any(not(feature = "tls"), test))]
    fn urls(&self) -> &[String] {
        match self {
            Self::Server(url) => std::slice::from_ref(url),
            Self::Cluster(urls) | Self::RedLock(urls) => urls,
            Self::Sentinel { sentinels, .. } => sentinels,
        }
    }
}

/// Refuses a topology, or a `rediss://` URL, whose feature this build leaves out. Run before
/// anything else looks at the URLs, so that the error names the feature to enable (redis-rs
/// itself would only say that it cannot parse the URL or connect).
pub(crate) fn check_features(topology: &Topology) -> Result<(), ConfigError> {
    #[cfg(not(feature = "cluster"))]
    if matches!(topology, Topology::Cluster(_)) {
        return Err(cluster_disabled());
    }
    #[cfg(not(feature = "sentinel"))]
    if let Topology::Sentinel { master, .. } = topology {
        return Err(sentinel_disabled(master));
    }
    #[cfg(not(feature = "tls"))]
    if let Some(url) = topology.urls().iter().find(|url| is_tls_scheme(url)) {
        return Err(ConfigError::FeatureDisabled {
            feature: "tls",
            what: format!("the TLS url {}", redact(url)),
        });
    }
    #[cfg(all(feature = "cluster", feature = "sentinel", feature = "tls"))]
    let _ = topology;
    Ok(())
}

#[cfg(not(feature = "cluster"))]
fn cluster_disabled() -> ConfigError {
    ConfigError::FeatureDisabled {
        feature: "cluster",
        what: "a Redis Cluster topology (`.cluster(..)`)".to_owned(),
    }
}

#[cfg(not(feature = "sentinel"))]
fn sentinel_disabled(master: &str) -> ConfigError {
    ConfigError::FeatureDisabled {
        feature: "sentinel",
        what: format!("a Sentinel topology (`.sentinel({master:?}, ..)`)"),
    }
}

/// Whether `url` asks for TLS (`rediss://`, or redis-rs's `valkeys://`), read as redis-rs's
/// URL parser reads it (the scheme is case-insensitive, leading blanks are dropped).
#[cfg(any(not(feature = "tls"), test))]
fn is_tls_scheme(url: &str) -> bool {
    let url = url.trim_start_matches(|c: char| c <= ' ');
    url.split_once("://").is_some_and(|(scheme, _)| {
        scheme.eq_ignore_ascii_case("rediss") || scheme.eq_ignore_ascii_case("valkeys")
    })
}

/// A username (none: the `default` user) and its password, for the data nodes behind Sentinel.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Credentials {
    pub(crate) username: Option<String>,
    pub(crate) password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The password never reaches logs or errors.
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"***")
            .finish()
    }
}

#[cfg(feature = "sentinel")]
impl Credentials {
    /// The connection settings redis-rs authenticates the data nodes' connections with.
    fn connection_info(&self) -> RedisConnectionInfo {
        let info = RedisConnectionInfo::default().set_password(&self.password);
        match &self.username {
            Some(username) => info.set_username(username),
            None => info,
        }
    }
}

/// A client for `url`, with the TLS settings when there are any. Every URL of every topology
/// comes through here, so this is where `#insecure` is refused.
fn open(url: &str, tls: Option<&TlsConfig>) -> Result<redis::Client, ConfigError> {
    let client = redis::Client::open(url).map_err(|e| ConfigError::Url(BackendError::redis(e)))?;
    // redis-rs reads `rediss://..#insecure` as "accept any certificate". It refuses to connect
    // only while its `tls-rustls-insecure` feature is off, which any crate in the build could
    // turn on: the kit refuses it itself.
    if matches!(
        client.get_connection_info().addr(),
        redis::ConnectionAddr::TcpTls { insecure: true, .. }
    ) {
        return Err(ConfigError::Tls {
            what: "url",
            reason: format!(
                "{} turns certificate verification off (`#insecure`); the kit refuses it: \
                 trust the server's CA with `.tls(TlsConfig::new().root_certificate_pem(..))`",
                redact(url)
            ),
        });
    }
    #[cfg(not(feature = "tls"))]
    let _: Option<&TlsConfig> = tls; // no value exists without the feature
    #[cfg(feature = "tls")]
    {
        let secure = is_tls_url(&client);
        if secure {
            tls::check_crypto_provider()?;
        }
        match tls {
            None => {}
            Some(_) if !secure => {
                return Err(ConfigError::Tls {
                    what: "url",
                    reason: format!("TLS settings need `rediss://` urls, got {}", redact(url)),
                })
            }
            Some(tls) => {
                return redis::Client::build_with_tls(url, tls.certificates()).map_err(|e| {
                    ConfigError::Tls {
                        what: "certificates",
                        reason: e.to_string(),
                    }
                })
            }
        }
    }
    Ok(client)
}

#[cfg(any(feature = "tls", feature = "sentinel"))]
fn is_tls_url(client: &redis::Client) -> bool {
    matches!(
        client.get_connection_info().addr(),
        redis::ConnectionAddr::TcpTls { .. }
    )
}

/// The clients of RedLock's nodes, once the nodes are checked: at least three, no
/// `min_replicas`, no address given twice.
fn redlock_clients(
    urls: &[String],
    min_replicas: bool,
    tls: Option<&TlsConfig>,
) -> Result<Vec<redis::Client>, LockError> {
    if urls.len() < 3 {
        return Err(ConfigError::RedLockNodes { count: urls.len() }.into());
    }
    if min_replicas {
        return Err(ConfigError::MinReplicasWithRedLock.into());
    }
    let clients = clients(urls, tls)?;
    let addresses: Vec<_> = clients
        .iter()
        .map(|client| {
            let address = client.get_connection_info().addr().to_string();
            Some(address.to_lowercase())
        })
        .collect();
    if let Some((first, second)) = named_twice(&addresses) {
        return Err(ConfigError::RedLockNodeTwice {
            first: redact(&urls[first]),
            second: redact(&urls[second]),
        }
        .into());
    }
    Ok(clients)
}

/// The first two places of `names` that name the same thing (`None`: unknown, never a
/// match).
fn named_twice<T: PartialEq>(names: &[Option<T>]) -> Option<(usize, usize)> {
    names.iter().enumerate().find_map(|(second, name)| {
        let name = name.as_ref()?;
        names[..second]
            .iter()
            .position(|earlier| earlier.as_ref() == Some(name))
            .map(|first| (first, second))
    })
}

fn clients(urls: &[String], tls: Option<&TlsConfig>) -> Result<Vec<redis::Client>, LockError> {
    urls.iter()
        .map(|u| open(u, tls).map_err(LockError::from))
        .collect()
}

/// A Sentinel client for `master`. With `rediss://` sentinel URLs, the sentinels are asked
/// over TLS and the primary they name is connected over TLS as well, both verified with the
/// configured certificates (or the system trust store); with `redis://` URLs, everything is
/// plaintext. The sentinels are asked with the credentials of their URLs, the data nodes
/// they name are connected with `data` (both the command and the pub/sub connections come
/// from this client).
#[cfg(feature = "sentinel")]
fn sentinel_client(
    master: &str,
    sentinels: &[String],
    data: Option<&Credentials>,
    tls: Option<&TlsConfig>,
) -> Result<SentinelClient, ConfigError> {
    // `open` refuses `redis://` URLs when TLS settings are given.
    let opened = sentinels
        .iter()
        .map(|url| open(url, tls))
        .collect::<Result<Vec<_>, _>>()?;
    let secure = opened.iter().filter(|c| is_tls_url(c)).count();
    if secure == 0 {
        let data = data.map(|credentials| {
            SentinelNodeConnectionInfo::default()
                .set_redis_connection_info(credentials.connection_info())
        });
        return SentinelClient::build(
            sentinels.iter().map(String::as_str).collect(),
            // A `String` (redis-rs takes `impl AsRef<str>` only with its TLS feature).
            String::from(master),
            data,
            SentinelServerType::Master,
        )
        .map_err(|e| ConfigError::Url(BackendError::redis(e)));
    }
    if secure != opened.len() {
        return Err(ConfigError::Tls {
            what: "topology",
            reason: "sentinel urls mix `redis://` and `rediss://`; use `rediss://` for all of them"
                .to_owned(),
        });
    }
    tls_sentinel_client(master, &opened, data, tls)
}

/// [`sentinel_client`] for `rediss://` sentinels (`opened`: their clients, all TLS).
#[cfg(all(feature = "sentinel", feature = "tls"))]
fn tls_sentinel_client(
    master: &str,
    opened: &[redis::Client],
    data: Option<&Credentials>,
    tls: Option<&TlsConfig>,
) -> Result<SentinelClient, ConfigError> {
    let build_error = |e: redis::RedisError| ConfigError::Tls {
        what: "sentinel",
        reason: e.to_string(),
    };
    // The builder takes one set of credentials for all sentinels.
    let credentials = |c: &redis::Client| {
        let info = c.get_connection_info().redis_settings();
        (
            info.username().map(str::to_owned),
            info.password().map(str::to_owned),
        )
    };
    let (username, password) = credentials(&opened[0]);
    if opened[1..]
        .iter()
        .any(|c| credentials(c) != (username.clone(), password.clone()))
    {
        return Err(ConfigError::Tls {
            what: "topology",
            reason: "with `rediss://` sentinels, every sentinel url must carry the same username \
                     and password"
                .to_owned(),
        });
    }
    // Each address carries its TLS parameters (the certificates) from `open`.
    let addrs = opened
        .iter()
        .map(|c| c.get_connection_info().addr().clone());
    let mut builder = SentinelClientBuilder::new(addrs, master, SentinelServerType::Master)
        .map_err(build_error)?
        .set_client_to_redis_tls_mode(redis::TlsMode::Secure);
    if let Some(username) = username {
        builder = builder.set_client_to_sentinel_username(username);
    }
    if let Some(password) = password {
        builder = builder.set_client_to_sentinel_password(password);
    }
    if let Some(data) = data {
        builder = builder.set_client_to_redis_password(&data.password);
        if let Some(username) = &data.username {
            builder = builder.set_client_to_redis_username(username);
        }
    }
    if let Some(tls) = tls {
        builder = builder.set_client_to_redis_certificates(tls.certificates());
    }
    builder.build().map_err(build_error)
}

/// Without the `tls` feature no sentinel URL opens as TLS ([`check_features`] refuses
/// `rediss://` first); this answers the same should one get here.
#[cfg(all(feature = "sentinel", not(feature = "tls")))]
fn tls_sentinel_client(
    _master: &str,
    _opened: &[redis::Client],
    _data: Option<&Credentials>,
    _tls: Option<&TlsConfig>,
) -> Result<SentinelClient, ConfigError> {
    Err(ConfigError::FeatureDisabled {
        feature: "tls",
        what: "`rediss://` sentinel urls".to_owned(),
    })
}

/// Connects the command side and describes where release notifications come from.
/// `fence_window`: how long a fence key outlives its lock and its last token.
pub(crate) async fn connect(
    topology: Topology,
    timeouts: Timeouts,
    fence_window: Duration,
    min_replicas: Option<MinReplicas>,
    restart_guard: Option<RestartGuard>,
    tls: Option<&TlsConfig>,
) -> Result<(Store, PubSubSource), LockError> {
    let backend = |e| LockError::backend(None, e);
    let node =
        |conn, name, restart_guard| Node::new(conn, name, restart_guard, timeouts, fence_window);
    let single =
        |node, opener| Store::Single(SingleStore::new(node, min_replicas, opener, timeouts));
    Ok(match topology {
        Topology::Server(url) => {
            let client = open(&url, tls)?;
            let conn = Connection::server(client.clone(), timeouts)
                .await
                .map_err(|e| backend(e.context(format!("connecting to {}", redact(&url)))))?;
            let node = node(conn, redact(&url), restart_guard);
            (
                single(node, Some(Opener::Server(Box::new(client.clone())))),
                PubSubSource::Nodes(vec![client]),
            )
        }
        #[cfg(feature = "cluster")]
        Topology::Cluster(seeds) => {
            if seeds.is_empty() {
                return Err(ConfigError::NoClusterSeeds.into());
            }
            let pubsub = PubSubSource::Nodes(clients(&seeds, tls)?);
            #[cfg(feature = "tls")]
            let certificates = tls.map(TlsConfig::certificates);
            #[cfg(not(feature = "tls"))]
            let certificates = None;
            let conn = Connection::cluster(&seeds, timeouts, certificates)
                .await
                .map_err(|e| {
                    let seeds = redact_all(&seeds);
                    backend(e.context(format!("connecting to cluster seeds {seeds}")))
                })?;
            // The builder refuses a restart guard for a cluster.
            let node = node(conn, "cluster".to_owned(), None);
            // No connections of their own for `WAIT`s: see `store::wait`.
            (single(node, None), pubsub)
        }
        #[cfg(feature = "sentinel")]
        Topology::Sentinel {
            master,
            sentinels,
            data,
        } => {
            if sentinels.is_empty() {
                return Err(ConfigError::NoSentinels { master }.into());
            }
            let client = sentinel_client(&master, &sentinels, data.as_ref(), tls)?;
            let primary = SentinelPrimary::connect(client, timeouts)
                .await
                .map_err(|e| {
                    let sentinels = redact_all(&sentinels);
                    backend(e.context(format!(
                        "connecting to primary `{master}` through sentinels {sentinels}"
                    )))
                })?;
            let conn = Connection::Sentinel(primary.clone());
            let node = node(conn, format!("primary `{master}`"), restart_guard);
            (
                single(node, Some(Opener::Sentinel(primary.clone()))),
                PubSubSource::Sentinel(primary),
            )
        }
        // `check_features` refused these already; answered the same should one get here.
        #[cfg(not(feature = "cluster"))]
        Topology::Cluster(_) => return Err(cluster_disabled().into()),
        #[cfg(not(feature = "sentinel"))]
        Topology::Sentinel { master, .. } => return Err(sentinel_disabled(&master).into()),
        Topology::RedLock(urls) => {
            let clients = redlock_clients(&urls, min_replicas.is_some(), tls)?;
            // Nodes that are down at start-up are connected lazily: RedLock must start with a
            // majority up, not all of them.
            let mut nodes = Vec::new();
            let mut up = 0;
            let mut down = Vec::new();
            for (client, url) in clients.iter().zip(&urls) {
                let conn = match Connection::server(client.clone(), timeouts).await {
                    Ok(conn) => {
                        up += 1;
                        conn
                    }
                    Err(error) => {
                        down.push(format!("{} ({error})", redact(url)));
                        Connection::lazy(client.clone(), timeouts).map_err(backend)?
                    }
                };
                nodes.push(node(conn, redact(url), restart_guard.clone()));
            }
            // One server under two names (`localhost` and `127.0.0.1`, a DNS alias) is told
            // apart by the `run_id`s `Store::check_servers` reads next.
            if !Quorum::of(urls.len()).carried(up) {
                let error =
                    BackendError::undecided("fewer than a majority of RedLock nodes are reachable");
                return Err(backend(
                    error.context(format!("unreachable: {}", down.join(", "))),
                ));
            }
            let store = Store::RedLock(RedLockStore::new(nodes, timeouts.command));
            (store, PubSubSource::Nodes(clients))
        }
    })
}

/// [`connect`] without connecting: every connection is made on first use (and made again
/// after failures), for a single server and RedLock. A cluster and Sentinel need an answer
/// before they can route a command (the slot map, the primary's address), so they are refused.
pub(crate) fn connect_lazy(
    topology: Topology,
    timeouts: Timeouts,
    fence_window: Duration,
    min_replicas: Option<MinReplicas>,
    restart_guard: Option<RestartGuard>,
    tls: Option<&TlsConfig>,
) -> Result<(Store, PubSubSource), LockError> {
    let backend = |e| LockError::backend(None, e);
    let node =
        |conn, name, restart_guard| Node::new(conn, name, restart_guard, timeouts, fence_window);
    Ok(match topology {
        Topology::Server(url) => {
            let client = open(&url, tls)?;
            let conn = Connection::lazy(client.clone(), timeouts).map_err(backend)?;
            let node = node(conn, redact(&url), restart_guard);
            let opener = Some(Opener::Server(Box::new(client.clone())));
            let store = Store::Single(SingleStore::new(node, min_replicas, opener, timeouts));
            (store, PubSubSource::Nodes(vec![client]))
        }
        Topology::RedLock(urls) => {
            let clients = redlock_clients(&urls, min_replicas.is_some(), tls)?;
            let nodes = clients
                .iter()
                .zip(&urls)
                .map(|(client, url)| {
                    Connection::lazy(client.clone(), timeouts)
                        .map(|conn| node(conn, redact(url), restart_guard.clone()))
                        .map_err(backend)
                })
                .collect::<Result<Vec<_>, _>>()?;
            let store = Store::RedLock(RedLockStore::new(nodes, timeouts.command));
            (store, PubSubSource::Nodes(clients))
        }
        Topology::Cluster(_) => {
            return Err(ConfigError::LazyTopology {
                topology: "cluster",
            }
            .into())
        }
        Topology::Sentinel { .. } => {
            return Err(ConfigError::LazyTopology {
                topology: "sentinel",
            }
            .into())
        }
    })
}

/// The URLs, redacted, comma-separated.
#[cfg(any(feature = "cluster", feature = "sentinel"))]
fn redact_all(urls: &[String]) -> String {
    urls.iter()
        .map(|u| redact(u))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The form of a Redis URL to print: `redis://user:secret@host/` becomes
/// `redis://user:***@host/`, and a `pass` or `password` query value
/// (`redis+unix:///sock?pass=secret`) becomes `***`. The kit prints URLs only in this form
/// (`Debug`, errors, logs); use it for yours.
///
/// ```
/// assert_eq!(
///     lock_core::redact_url("redis://app:hunter2@db:6379/0"),
///     "redis://app:***@db:6379/0"
/// );
/// ```
///
/// Written for URLs as users type them, which a URL parser may refuse: a password can hold an
/// unencoded `/`, `@`, `:`, `?` or `#`. So the credentials end at the *last* `@` (a host has
/// none), and the user name is what comes before the first `:`. Where that over-reaches (an `@`
/// in a query) it hides more, never less.
pub fn redact(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let (credentials, address) = match rest.rfind('@') {
        Some(at) => {
            let user = rest[..at].split(':').next().unwrap_or("");
            // Without a `:` the part before `@` is a user name only; one holding `/` is no
            // user name at all (a password with a `/` and no user).
            let user = if user.contains('/') { "" } else { user };
            (format!("{user}:***@"), &rest[at + 1..])
        }
        None => (String::new(), rest),
    };
    format!("{scheme}{credentials}{}", redact_query(address))
}

/// `host/0?db=1&pass=secret` becomes `host/0?db=1&pass=***`.
fn redact_query(address: &str) -> String {
    let Some((before, query)) = address.split_once('?') else {
        return address.to_owned();
    };
    let (query, fragment) = match query.split_once('#') {
        Some((query, fragment)) => (query, Some(fragment)),
        None => (query, None),
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if matches!(name, "pass" | "password") => format!("{name}=***"),
            _ => pair.to_owned(),
        })
        .collect();
    let fragment = fragment.map(|f| format!("#{f}")).unwrap_or_default();
    format!("{before}?{}{fragment}", query.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_given_twice_is_found_and_unknown_names_never_match() {
        assert_eq!(named_twice(&[Some("a"), Some("b"), Some("c")]), None);
        assert_eq!(
            named_twice(&[Some("a"), Some("b"), Some("a")]),
            Some((0, 2))
        );
        assert_eq!(
            named_twice(&[Some("a"), Some("b"), Some("b"), Some("a")]),
            Some((1, 2))
        );
        assert_eq!(named_twice::<&str>(&[None, None, None]), None);
        assert_eq!(
            named_twice(&[None, Some("a"), None, Some("a")]),
            Some((1, 3))
        );
    }

    #[test]
    fn tls_schemes_are_read_as_redis_rs_reads_them() {
        for url in [
            "rediss://h",
            "REDISS://h:6380/0",
            "  rediss://h",
            "valkeys://h",
        ] {
            assert!(is_tls_scheme(url), "{url}");
        }
        for url in [
            "redis://h",
            "redis+unix:///tmp/s",
            "h:6379",
            "rediss",
            "xrediss://h",
        ] {
            assert!(!is_tls_scheme(url), "{url}");
        }
        let sentinel = Topology::Sentinel {
            master: "m".to_owned(),
            sentinels: vec!["redis://a".to_owned(), "rediss://b".to_owned()],
            data: None,
        };
        assert!(sentinel.urls().iter().any(|u| is_tls_scheme(u)));
    }
}
