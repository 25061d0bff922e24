//! How a request's lock is taken: the [`Mode`], chosen per request by a [`ChooseMode`]
//! ([`ByMethod`] by default).

use http::{Method, Request};

/// How the lock of a request is taken: which of lock-core's kinds of lock it is, by the
/// same names as the macro's `mode` and lock-core's metric label `kind` (`Read`: `"read"`,
/// label `read`; `Exclusive`: `"write"`, label `mutex`; `Limit`: label `semaphore`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// The read lock (`Locker::read`): any number of requests, in every instance, hold it
    /// together while no exclusive holder does. No fencing token
    /// ([`HeldLock::fencing_token`](crate::HeldLock::fencing_token) answers
    /// `LockError::NotExclusive`): readers hold together, tokens order exclusive holders.
    Read,
    /// The exclusive lock, the key's write lock (`Locker::lock`, the same as `Locker::write`):
    /// one holder at a time, readers excluded, with fencing tokens. What the layer took for
    /// every request before read locks existed.
    Exclusive,
    /// At most this many requests per key at once, across every instance: the key's
    /// semaphore (`Locker::semaphore(key, n)`), the distributed counterpart of tower's
    /// `ConcurrencyLimitLayer`. A request that finds every permit taken for the whole wait is
    /// rejected with [`Rejection::Full`](crate::Rejection::Full) (`429 Too Many Requests` with
    /// `Retry-After`). Permits expire with their lease like locks, so a crashed instance's
    /// requests give theirs back; no fencing token. Several keys are locked exclusively.
    /// Needs Redis 7.0 or later, as semaphores do. `Limit(0)` admits nobody: each request
    /// is answered `500` ([`Rejection::Failed`](crate::Rejection::Failed) with lock-core's
    /// `ConfigError::Permits`); build the layer with
    /// [`concurrency_limit`](crate::DistributedLockLayer::concurrency_limit), which refuses
    /// it up front.
    Limit(u32),
}

impl Mode {
    /// `"read"`, `"exclusive"` or `"limit"`, for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Exclusive => "exclusive",
            Self::Limit(_) => "limit",
        }
    }
}

/// Chooses the [`Mode`] of each request's lock.
///
/// Implemented by [`Mode`] itself (the same mode for every request), by [`ByMethod`] (the
/// default), and by every closure `Fn(&Request<B>) -> Mode`. The mode applies to a request
/// with one key; several keys are always locked exclusively (lock-core takes several keys
/// only as exclusive locks), whatever the chooser says.
///
/// # Examples
///
/// ```
/// use http::Request;
/// use lock_tower::{ChooseMode, Mode};
///
/// // Reads of a report share the lock unless the client asks for a fresh rebuild.
/// let mode = |req: &Request<()>| {
///     if req.headers().contains_key("x-rebuild") { Mode::Exclusive } else { Mode::Read }
/// };
/// let req = Request::builder().header("x-rebuild", "1").body(()).unwrap();
/// assert_eq!(mode.mode(&req), Mode::Exclusive);
/// ```
pub trait ChooseMode<B> {
    /// The mode of `request`'s lock.
    fn mode(&self, request: &Request<B>) -> Mode;
}

/// The default [`ChooseMode`]: the safe methods, which do not change the resource (`GET`,
/// `HEAD`, `OPTIONS`, `TRACE`; RFC 9110, 9.2.1), take the [read lock](Mode::Read); every
/// other method (`POST`, `PUT`, `PATCH`, `DELETE`, ...) the [exclusive lock](Mode::Exclusive).
///
/// So reads of a key run side by side and never see a write half done, and writes run one at
/// a time. A `GET` handler that writes under its key (or calls a `#[distributed_lock]` fn that
/// takes the same key exclusively, which then fails with `LockError::WriteInsideRead`) needs
/// the exclusive lock: set [`Mode::Exclusive`] with
/// [`DistributedLockLayer::mode`](crate::DistributedLockLayer::mode).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ByMethod;

impl ByMethod {
    /// The mode of a request with `method`.
    pub fn mode_of(method: &Method) -> Mode {
        if matches!(
            *method,
            Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
        ) {
            Mode::Read
        } else {
            Mode::Exclusive
        }
    }
}

impl<B> ChooseMode<B> for ByMethod {
    fn mode(&self, request: &Request<B>) -> Mode {
        Self::mode_of(request.method())
    }
}

impl<B> ChooseMode<B> for Mode {
    fn mode(&self, _: &Request<B>) -> Mode {
        *self
    }
}

impl<B, F> ChooseMode<B> for F
where
    F: Fn(&Request<B>) -> Mode,
{
    fn mode(&self, request: &Request<B>) -> Mode {
        self(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: Method) -> Request<()> {
        Request::builder().method(method).body(()).unwrap()
    }

    #[test]
    fn safe_methods_read_and_the_others_are_exclusive() {
        for method in [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE] {
            assert_eq!(ByMethod.mode(&req(method.clone())), Mode::Read, "{method}");
        }
        for method in [
            Method::POST,
            Method::PUT,
            Method::PATCH,
            Method::DELETE,
            Method::CONNECT,
            Method::from_bytes(b"PURGE").unwrap(),
        ] {
            assert_eq!(
                ByMethod.mode(&req(method.clone())),
                Mode::Exclusive,
                "{method}"
            );
        }
    }

    #[test]
    fn a_mode_is_the_same_for_every_request_and_closures_choose() {
        assert_eq!(Mode::Exclusive.mode(&req(Method::GET)), Mode::Exclusive);
        assert_eq!(Mode::Read.mode(&req(Method::POST)), Mode::Read);
        let by_path = |r: &Request<()>| {
            if r.uri().path() == "/" {
                Mode::Read
            } else {
                Mode::Exclusive
            }
        };
        assert_eq!(by_path.mode(&req(Method::POST)), Mode::Read);
    }
}
