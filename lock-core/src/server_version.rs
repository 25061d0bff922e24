//! Which server versions the kit can serve, read from `INFO server`, and the one check of a
//! node's version against what a kind of lock needs.
//!
//! The scripts need, by version (the Redis command docs' "History"):
//!
//! | need | since | used by |
//! |---|---|---|
//! | `SET .. PXAT` | 6.2.0 | `fence.lua`, `raise_fence.lua`: every fencing token, of every kind that has them |
//! | `PEXPIRE .. GT` | 7.0.0 | `permit_acquire.lua`, `permit_renew.lua`: semaphores only |
//!
//! Everything else the scripts call (`SET NX PX`, `ZADD NX/XX`, `PEXPIREAT`, `TIME` before a
//! write, which needs effects replication, the default since 5.0) is older. So a locker
//! refuses a server below 6.2 when it is built, and a semaphore's acquire refuses one below
//! 7.0; both remember the version they read, so an acquire costs no extra round trip.
//!
//! Valkey reports the Redis version it is compatible with in `redis_version` (7.2.4 for every
//! Valkey so far) and its own in `valkey_version`; Dragonfly reports `dragonfly_version` next
//! to its `redis_version`. The check reads `redis_version` and names the others in messages.

use std::fmt;

use redis::{FromRedisValue, InfoDict, Value};

use crate::kind::Kind;

/// A `major.minor.patch` version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Version {
    major: u32,
    minor: u32,
    patch: u32,
}

impl Version {
    pub(crate) const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }

    /// Reads `7.0.15`, `6.2`, `7.2.4-valkey`, `v7.4.0`: up to three numbers separated by dots,
    /// from the start; whatever follows the numbers (a suffix, a fourth number) is ignored, a
    /// missing minor or patch counts as 0. `None` when it does not start with a number.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let text = text.strip_prefix(['v', 'V']).unwrap_or(text);
        let mut numbers = [0u32; 3];
        let mut rest = text;
        for (i, number) in numbers.iter_mut().enumerate() {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 {
                if i == 0 {
                    return None;
                }
                break;
            }
            *number = rest[..digits].parse().ok()?;
            rest = &rest[digits..];
            match rest.strip_prefix('.') {
                Some(after) => rest = after,
                None => break,
            }
        }
        let [major, minor, patch] = numbers;
        Some(Self::new(major, minor, patch))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// What one server says it is (`INFO server`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServerInfo {
    /// `redis_version`: the Redis version whose commands it serves.
    pub(crate) version: Version,
    /// `redis_version` as reported.
    reported: String,
    /// Another product's own version (`valkey 8.0.1`, `dragonfly df-v1.25.0`), when it says.
    product: Option<String>,
    /// `run_id`: one run of one server (a new one at every start), when it says.
    pub(crate) run_id: Option<String>,
}

impl ServerInfo {
    /// From an `INFO server` reply; `None` without a readable `redis_version`.
    pub(crate) fn from_info(info: &InfoDict) -> Option<Self> {
        let reported: String = info.get("redis_version")?;
        let version = Version::parse(&reported)?;
        let product = [
            ("valkey_version", "valkey"),
            ("dragonfly_version", "dragonfly"),
        ]
        .into_iter()
        .find_map(|(field, name)| {
            info.get::<String>(field)
                .map(|own| format!("{name} {}", own.trim()))
        })
        .or_else(|| {
            // `server_name` alone (a fork that does not say its version).
            info.get::<String>("server_name")
                .map(|name| name.trim().to_owned())
                .filter(|name| !name.is_empty() && name != "redis")
        });
        let run_id = info
            .get::<String>("run_id")
            .map(|id| id.trim().to_owned())
            .filter(|id| !id.is_empty());
        Some(Self {
            version,
            reported: reported.trim().to_owned(),
            product,
            run_id,
        })
    }
}

/// `6.0.16`, or `7.2.4 (valkey 8.0.1)`.
impl fmt::Display for ServerInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reported)?;
        match &self.product {
            Some(product) => write!(f, " ({product})"),
            None => Ok(()),
        }
    }
}

/// What a kind of lock needs of the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Need {
    pub(crate) version: Version,
    /// What needs it, and the command or option that sets it.
    pub(crate) for_what: &'static str,
}

/// What every locker needs: fencing tokens (`fence.lua`) are set with `SET .. PXAT`, 6.2.0.
pub(crate) const KIT: Need = Need {
    version: Version::new(6, 2, 0),
    for_what: "the kit (fencing tokens use `SET .. PXAT`)",
};

/// What a semaphore needs: its holders' set is renewed with `PEXPIRE .. GT`, 7.0.0.
pub(crate) const SEMAPHORE: Need = Need {
    version: Version::new(7, 0, 0),
    for_what: "semaphores (`PEXPIRE .. GT` in their scripts)",
};

impl Need {
    /// What an acquire of `kind` needs.
    pub(crate) fn of(kind: Kind) -> Self {
        match kind {
            Kind::Permits { .. } => SEMAPHORE,
            Kind::Exclusive | Kind::Shared | Kind::Fair => KIT,
        }
    }
}

/// A server too old for what was asked of it; becomes
/// [`ConfigError::ServerTooOld`](crate::ConfigError::ServerTooOld).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TooOld {
    pub(crate) node: String,
    pub(crate) found: String,
    pub(crate) needed: Version,
    pub(crate) for_what: &'static str,
}

/// The first of `servers` (a name and what it said) below `need`.
pub(crate) fn first_too_old<'a>(
    servers: impl IntoIterator<Item = &'a (String, ServerInfo)>,
    need: Need,
) -> Option<TooOld> {
    servers
        .into_iter()
        .find(|(_, server)| server.version < need.version)
        .map(|(node, server)| TooOld {
            node: node.clone(),
            found: server.to_string(),
            needed: need.version,
            for_what: need.for_what,
        })
}

/// The `INFO` text of each server in `reply`: one server's, or a cluster's map of node
/// address to its reply (redis-rs sends `INFO` to every primary). A node's error reply is
/// `Err` with its message.
pub(crate) fn info_replies(reply: &Value) -> Vec<(Option<String>, Result<InfoDict, String>)> {
    match reply {
        Value::Map(pairs) => pairs
            .iter()
            .map(|(node, reply)| {
                let node = String::from_redis_value_ref(node).ok();
                (node, info_dict(reply))
            })
            .collect(),
        reply => vec![(None, info_dict(reply))],
    }
}

fn info_dict(reply: &Value) -> Result<InfoDict, String> {
    match reply {
        Value::ServerError(error) => Err(error.to_string()),
        reply => InfoDict::from_redis_value_ref(reply).map_err(|e| e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(text: &str) -> InfoDict {
        InfoDict::new(text)
    }

    #[test]
    fn versions_parse_from_what_servers_report() {
        let v = |text| Version::parse(text);
        assert_eq!(v("7.0.15"), Some(Version::new(7, 0, 15)));
        assert_eq!(v("6.2.0"), Some(Version::new(6, 2, 0)));
        assert_eq!(v(" 6.0.16\r"), Some(Version::new(6, 0, 16)));
        assert_eq!(v("7.2.4-valkey"), Some(Version::new(7, 2, 4)));
        assert_eq!(v("7.2"), Some(Version::new(7, 2, 0)));
        assert_eq!(v("8"), Some(Version::new(8, 0, 0)));
        assert_eq!(v("v7.4.0"), Some(Version::new(7, 4, 0)));
        assert_eq!(v("7.0.0-rc1"), Some(Version::new(7, 0, 0)));
        assert_eq!(v("255.255.255"), Some(Version::new(255, 255, 255)));
        assert_eq!(v("1.2.3.4"), Some(Version::new(1, 2, 3)));
        assert_eq!(v(""), None);
        assert_eq!(v("df-v1.25.0"), None);
        assert_eq!(v("x7.0"), None);
        assert_eq!(v("99999999999.0.0"), None);
        // Ordered by number, not by text.
        assert!(v("6.10.0") > v("6.2.0"));
        assert!(v("10.0.0") > v("7.2.4"));
        assert!(v("6.2.0") < v("7.0.0") && v("6.0.16") < v("6.2.0"));
    }

    #[test]
    fn server_info_names_valkey_and_dragonfly() {
        let redis = ServerInfo::from_info(&info(
            "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n",
        ))
        .unwrap();
        assert_eq!(redis.version, Version::new(7, 0, 15));
        assert_eq!(redis.to_string(), "7.0.15");
        let valkey = ServerInfo::from_info(&info(
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.0.1\r\n",
        ))
        .unwrap();
        assert_eq!(valkey.version, Version::new(7, 2, 4));
        assert_eq!(valkey.to_string(), "7.2.4 (valkey 8.0.1)");
        let dragonfly = ServerInfo::from_info(&info(
            "# Server\r\nredis_version:7.4.0\r\ndragonfly_version:df-v1.25.0\r\n",
        ))
        .unwrap();
        assert_eq!(dragonfly.to_string(), "7.4.0 (dragonfly df-v1.25.0)");
        let named = ServerInfo::from_info(&info("redis_version:7.2.4\r\nserver_name:fork\r\n"));
        assert_eq!(named.unwrap().to_string(), "7.2.4 (fork)");
        assert_eq!(
            ServerInfo::from_info(&info("# Server\r\nrun_id:ab\r\n")),
            None
        );
        assert_eq!(
            ServerInfo::from_info(&info("redis_version:unknown\r\n")),
            None
        );
    }

    #[test]
    fn each_kind_needs_its_version() {
        let server =
            |v: &str| ServerInfo::from_info(&info(&format!("redis_version:{v}\r\n"))).unwrap();
        let at = |v: &str| vec![("a:1".to_owned(), server(v))];
        for kind in [Kind::Exclusive, Kind::Shared, Kind::Fair] {
            assert_eq!(Need::of(kind), KIT);
        }
        assert_eq!(Need::of(Kind::Permits { limit: 3 }), SEMAPHORE);
        assert_eq!(
            first_too_old(&at("6.0.16"), KIT),
            Some(TooOld {
                node: "a:1".into(),
                found: "6.0.16".into(),
                needed: Version::new(6, 2, 0),
                for_what: KIT.for_what,
            })
        );
        assert_eq!(first_too_old(&at("6.2.0"), KIT), None);
        assert!(first_too_old(&at("6.2.14"), SEMAPHORE).is_some());
        assert_eq!(first_too_old(&at("7.0.0"), SEMAPHORE), None);
        assert_eq!(first_too_old(&at("7.2.4"), SEMAPHORE), None);
    }

    /// A cluster answers `INFO` with one reply per primary: every one is checked, and the
    /// refusal names the node that is too old.
    #[test]
    fn a_cluster_is_checked_node_by_node() {
        let text = |v: &str| Value::BulkString(format!("# Server\r\nredis_version:{v}\r\n").into());
        let node = |addr: &str| Value::BulkString(addr.as_bytes().to_vec());
        let reply = Value::Map(vec![
            (node("10.0.0.1:7000"), text("7.2.4")),
            (node("10.0.0.2:7001"), text("6.0.9")),
            (node("10.0.0.3:7002"), text("7.0.15")),
        ]);
        let servers: Vec<(String, ServerInfo)> = info_replies(&reply)
            .into_iter()
            .map(|(node, info)| {
                let info = ServerInfo::from_info(&info.unwrap()).unwrap();
                (node.unwrap(), info)
            })
            .collect();
        assert_eq!(servers.len(), 3);
        let refused = first_too_old(&servers, KIT).unwrap();
        assert_eq!(
            (refused.node.as_str(), refused.found.as_str()),
            ("10.0.0.2:7001", "6.0.9")
        );
        let servers: Vec<_> = servers
            .into_iter()
            .filter(|(node, _)| node != "10.0.0.2:7001")
            .collect();
        assert_eq!(first_too_old(&servers, KIT), None);
        assert_eq!(
            first_too_old(&servers, SEMAPHORE),
            None,
            "7.2.4 and 7.0.15 serve semaphores"
        );
        // One server's reply, and a node's error reply.
        let single = info_replies(&text("6.2.0"));
        assert!(matches!(&single[..], [(None, Ok(_))]));
        let failed = info_replies(&Value::Map(vec![(node("a:1"), Value::Nil)]));
        assert!(matches!(&failed[..], [(Some(_), Err(_))]));
    }
}
