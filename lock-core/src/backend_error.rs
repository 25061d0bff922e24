//! [`BackendError`]: what went wrong between the kit and Redis, and how to classify it.
//!
//! The Redis client is an implementation detail of the kit: its error type stays inside, so the
//! client can change without a breaking change here. What callers need from it (a message, the
//! chain of causes, "was it a timeout", the server's error code) is offered by methods.

use std::error::Error as StdError;
use std::fmt;
#[cfg(feature = "tls")]
use std::sync::Arc;

use crate::error::ConfigError;
use crate::server_version::TooOld;

/// A failure of the Redis backend: unreachable, timed out, or an error reply.
///
/// Opaque on purpose; [`Display`](fmt::Display) and [`source`](StdError::source) describe it,
/// and the methods classify it.
#[derive(Debug)]
pub struct BackendError {
    repr: Repr,
    /// What the kit was doing, naming the server(s) with credentials redacted (`connecting to
    /// redis://db:6379`): an error at start-up is useless without the host.
    context: Option<String>,
    /// The call it ended never left this process (no connection could be had for it): it
    /// cannot run in Redis later.
    unsent: bool,
}

#[derive(Debug)]
enum Repr {
    /// The Redis client failed, or Redis answered with an error.
    Redis(redis::RedisError),
    /// A limit the kit sets on a call ran out; the call may still run on the server.
    TimedOut(&'static str),
    /// An acquire's call was cut at the end of its wait.
    Deadline,
    /// No answer decided the question (too few RedLock nodes answered, a renewal failed).
    Undecided(&'static str),
    /// What the servers showed to be set up wrong: a server too old for the call, which was
    /// not sent, or one server named twice among RedLock's nodes. Never public: the lock error
    /// built from it is [`LockError::Config`](crate::LockError::Config).
    Config(Box<ConfigError>),
    /// A reply of another shape than the call's own (a script's, documented in its `.lua`
    /// header): `from` names the call (`release.lua`), `error` what did not fit.
    UnexpectedReply {
        from: &'static str,
        error: redis::ParsingError,
    },
}

impl BackendError {
    pub(crate) fn redis(error: redis::RedisError) -> Self {
        Self {
            repr: Repr::Redis(error),
            context: None,
            unsent: false,
        }
    }

    /// A timeout the kit imposed (not one of the client's own).
    pub(crate) fn timed_out(what: &'static str) -> Self {
        Self {
            repr: Repr::TimedOut(what),
            context: None,
            unsent: false,
        }
    }

    /// An acquire's call cut at the end of the wait.
    pub(crate) fn deadline() -> Self {
        Self {
            repr: Repr::Deadline,
            context: None,
            unsent: false,
        }
    }

    /// Whether this is an acquire's call cut at the end of its wait.
    pub(crate) fn is_deadline(&self) -> bool {
        matches!(self.repr, Repr::Deadline)
    }

    /// A reply of `from` (a script's file name, or the command) that the kit cannot read:
    /// every reply that does not fit its type is reported through here, with the call named.
    pub(crate) fn unexpected_reply(from: &'static str, error: redis::ParsingError) -> Self {
        Self {
            repr: Repr::UnexpectedReply { from, error },
            context: None,
            unsent: false,
        }
    }

    /// No answer decided it.
    pub(crate) fn undecided(what: &'static str) -> Self {
        Self {
            repr: Repr::Undecided(what),
            context: None,
            unsent: false,
        }
    }

    /// A call not sent because the server cannot serve it (see [`TooOld`]).
    pub(crate) fn too_old(too_old: TooOld) -> Self {
        Self {
            repr: Repr::Config(Box::new(too_old.into())),
            context: None,
            unsent: false,
        }
    }

    /// A RedLock node whose server answers under another node's name too (the same `run_id`,
    /// read on its first connection): its votes do not count (see `RedLockStore`).
    pub(crate) fn named_twice(first: String, second: String) -> Self {
        Self {
            repr: Repr::Config(Box::new(ConfigError::RedLockNodeTwice { first, second })),
            context: None,
            unsent: false,
        }
    }

    /// What the servers showed to be set up wrong, if this is such an error; the error itself
    /// otherwise.
    pub(crate) fn into_config(self) -> Result<ConfigError, Self> {
        match self.repr {
            Repr::Config(config) => Ok(*config),
            repr => Err(Self { repr, ..self }),
        }
    }

    /// Marks the error as one of a call that was never sent (see
    /// [`was_unsent`](Self::was_unsent)).
    pub(crate) fn unsent(mut self) -> Self {
        self.unsent = true;
        self
    }

    /// Whether the call this error ended never left this process: nothing of it can still
    /// run in Redis.
    pub(crate) fn was_unsent(&self) -> bool {
        self.unsent
    }

    /// The same error, saying what the kit was doing: `"connecting to redis://db:6379"`. The
    /// text must not hold credentials (see `topology::redact`).
    pub(crate) fn context(mut self, context: String) -> Self {
        self.context = Some(context);
        self
    }

    /// Whether this is [`named_twice`](Self::named_twice)'s error.
    pub(crate) fn is_named_twice(&self) -> bool {
        matches!(&self.repr, Repr::Config(config) if matches!(**config, ConfigError::RedLockNodeTwice { .. }))
    }

    /// `true` when a command or a connection attempt timed out.
    pub fn is_timeout(&self) -> bool {
        match &self.repr {
            Repr::Redis(e) => e.is_timeout(),
            Repr::TimedOut(_) | Repr::Deadline => true,
            Repr::Undecided(_) | Repr::Config(_) | Repr::UnexpectedReply { .. } => false,
        }
    }

    /// `true` when the connection could not be made or broke (refused, reset, closed).
    pub fn is_connection(&self) -> bool {
        match &self.repr {
            Repr::Redis(e) => {
                e.is_connection_refusal() || e.is_connection_dropped() || e.is_io_error()
            }
            Repr::TimedOut(_)
            | Repr::Deadline
            | Repr::Undecided(_)
            | Repr::Config(_)
            | Repr::UnexpectedReply { .. } => false,
        }
    }

    /// The error code of an error reply from the server (`"NOPERM"`, `"LOADING"`, ...).
    pub fn code(&self) -> Option<&str> {
        match &self.repr {
            Repr::Redis(e) => e.code(),
            Repr::TimedOut(_)
            | Repr::Deadline
            | Repr::Undecided(_)
            | Repr::Config(_)
            | Repr::UnexpectedReply { .. } => None,
        }
    }

    /// Errors after which the same call may succeed: lost connections, timeouts, a server that
    /// is loading, busy with a script, or a cluster in transition (MOVED/ASK/TRYAGAIN/
    /// CLUSTERDOWN that outlasted the cluster client's own retries), or a primary demoted by a
    /// failover (READONLY: Sentinel then names the new one, see `SentinelPrimary::check`).
    pub(crate) fn is_transient(&self) -> bool {
        match &self.repr {
            Repr::Redis(e) => {
                e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_timeout()
                    || e.is_connection_refusal()
                    || e.is_cluster_error()
                    || matches!(
                        e.code(),
                        Some(
                            "LOADING"
                                | "BUSY"
                                | "TRYAGAIN"
                                | "CLUSTERDOWN"
                                | "MASTERDOWN"
                                | "READONLY"
                        )
                    )
            }
            Repr::TimedOut(_) | Repr::Deadline | Repr::Undecided(_) => true,
            Repr::Config(_) | Repr::UnexpectedReply { .. } => false,
        }
    }

    /// Whether a call that failed this way may be sent again at once because it surely or
    /// probably did not run: a dropped or refused connection, not a timeout (a timed-out call
    /// may still run). For idempotent calls.
    pub(crate) fn is_dropped_connection(&self) -> bool {
        match &self.repr {
            Repr::Redis(e) => e.is_connection_dropped() || e.is_io_error() && !e.is_timeout(),
            Repr::TimedOut(_)
            | Repr::Deadline
            | Repr::Undecided(_)
            | Repr::Config(_)
            | Repr::UnexpectedReply { .. } => false,
        }
    }

    /// Whether the server refused the call before it changed anything: a cluster (MOVED, ASK,
    /// TRYAGAIN, CLUSTERDOWN that outlasted the cluster client's own retries: a slot changing
    /// hands, or a script whose keys a migrating slot has split between two nodes), or a
    /// replica (READONLY: a primary demoted by a failover refuses every write, a script's
    /// first one included; MASTERDOWN: a replica that serves nothing while its primary is
    /// away). Nothing was written, so the call may be sent again.
    pub(crate) fn is_refusal(&self) -> bool {
        match &self.repr {
            Repr::Redis(e) => {
                e.is_cluster_error()
                    || matches!(
                        e.code(),
                        Some(
                            "MOVED"
                                | "ASK"
                                | "TRYAGAIN"
                                | "CLUSTERDOWN"
                                | "READONLY"
                                | "MASTERDOWN"
                        )
                    )
            }
            Repr::TimedOut(_)
            | Repr::Deadline
            | Repr::Undecided(_)
            | Repr::Config(_)
            | Repr::UnexpectedReply { .. } => false,
        }
    }

    /// Whether Redis said the key holds another type.
    pub(crate) fn is_wrong_type(&self) -> bool {
        self.code() == Some("WRONGTYPE")
    }

    /// Whether this is a TLS failure: a rejected certificate, a handshake alert, a peer that
    /// does not speak TLS, or a host name that cannot be checked.
    #[cfg(feature = "tls")]
    pub(crate) fn is_tls(&self) -> bool {
        match &self.repr {
            Repr::Redis(e) => is_tls_cause(e),
            Repr::TimedOut(_)
            | Repr::Deadline
            | Repr::Undecided(_)
            | Repr::Config(_)
            | Repr::UnexpectedReply { .. } => false,
        }
    }

    /// Without the `tls` feature no connection uses TLS, so no failure is a TLS one.
    #[cfg(not(feature = "tls"))]
    pub(crate) fn is_tls(&self) -> bool {
        false
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(context) = &self.context {
            write!(f, "{context}: ")?;
        }
        match &self.repr {
            Repr::Redis(e) => fmt::Display::fmt(e, f),
            Repr::TimedOut(what) => write!(f, "timed out: {what}"),
            Repr::Deadline => {
                f.write_str("timed out: redis did not answer before the acquire's deadline")
            }
            Repr::Undecided(what) => f.write_str(what),
            Repr::Config(config) => fmt::Display::fmt(config, f),
            Repr::UnexpectedReply { from, error } => {
                write!(f, "unexpected reply from {from}: {error}")
            }
        }
    }
}

impl StdError for BackendError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        // The client's message is this error's own text; its causes come next.
        match &self.repr {
            Repr::Redis(e) => e.source(),
            Repr::TimedOut(_)
            | Repr::Deadline
            | Repr::Undecided(_)
            | Repr::Config(_)
            | Repr::UnexpectedReply { .. } => None,
        }
    }
}

#[cfg(feature = "tls")]
fn is_tls_cause(error: &(dyn StdError + 'static)) -> bool {
    if error.is::<rustls::Error>() || error.is::<rustls::pki_types::InvalidDnsNameError>() {
        return true;
    }
    if let Some(io) = error.downcast_ref::<std::io::Error>() {
        // tokio-rustls reports handshake failures as an io::Error wrapping the rustls error;
        // io::Error::source skips the wrapped error itself, so look at it directly.
        if let Some(inner) = io.get_ref() {
            if is_tls_cause(inner) {
                return true;
            }
        }
    }
    // redis-rs keeps the error it wraps behind an `Arc`.
    if let Some(shared) = error.downcast_ref::<Arc<dyn StdError + Send + Sync>>() {
        if is_tls_cause(shared.as_ref()) {
            return true;
        }
    }
    error.source().is_some_and(is_tls_cause)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kits_own_timeouts_are_timeouts_not_connection_errors() {
        let error = BackendError::timed_out("redis did not answer before the acquire's deadline");
        assert!(error.is_timeout() && error.is_transient());
        assert!(!error.is_connection() && !error.is_dropped_connection() && !error.is_tls());
        assert_eq!(error.code(), None);
        assert_eq!(
            error.to_string(),
            "timed out: redis did not answer before the acquire's deadline"
        );
    }

    /// A slot in migration, a cluster in transition or a demoted primary refuses a command
    /// before it runs: the acquire loop retries it within its wait, and a release may be sent
    /// again (its latch makes a retry of a call that did run safe).
    #[test]
    fn cluster_redirections_and_refusals_are_transient() {
        for reply in [
            "-TRYAGAIN Multiple keys request during rehashing of slot\r\n",
            "-ASK 3999 127.0.0.1:6381\r\n",
            "-MOVED 3999 127.0.0.1:6381\r\n",
            "-CLUSTERDOWN The cluster is down\r\n",
            "-READONLY You can't write against a read only replica.\r\n",
            "-MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.\r\n",
        ] {
            let error = redis::parse_redis_value(reply.as_bytes())
                .and_then(redis::Value::extract_error)
                .expect_err("an error reply");
            let error = BackendError::redis(error);
            assert!(error.is_transient(), "{reply}: {error}");
            assert!(error.is_refusal(), "{reply}: {error}");
            assert!(!error.is_dropped_connection(), "{reply}: {error}");
        }
        // What a script met when a key it had not declared was missing from a migrating slot:
        // not transient, since the script may have written before it failed.
        let halfway = redis::parse_redis_value(
            b"-ERR Script attempted to access a non local key in a cluster node\r\n",
        )
        .and_then(redis::Value::extract_error)
        .expect_err("an error reply");
        let halfway = BackendError::redis(halfway);
        assert!(!halfway.is_transient() && !halfway.is_refusal());
    }

    #[test]
    fn redis_errors_keep_their_classification() {
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        let error = BackendError::redis(redis::RedisError::from(reset));
        assert!(error.is_connection() && error.is_dropped_connection() && error.is_transient());
        assert!(!error.is_timeout());

        let wrong_type = redis::make_extension_error(
            "WRONGTYPE".to_owned(),
            Some("Operation against a key holding the wrong kind of value".to_owned()),
        );
        let error = BackendError::redis(wrong_type);
        assert!(!error.is_transient());
        let locked = crate::LockError::backend(Some("k"), error);
        assert!(
            matches!(locked, crate::LockError::WrongType { .. }),
            "{locked:?}"
        );
    }
}
