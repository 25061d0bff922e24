//! Which lock(s) a request needs: the [`KeyExtractor`] trait, the [`LockKeys`] it returns, and
//! the ready-made [`KeyFrom`] extractors.

use std::fmt;
use std::sync::Arc;

use http::{HeaderName, Request};

/// Derives the lock key (or keys) of a request, or `None` when the request has none.
///
/// Implemented for every closure `Fn(&Request<B>) -> Option<K>` where `K` is one key (a
/// `String` or `&'static str`) or several (`Vec<String>`, `[String; N]`; anything
/// `Into<`[`LockKeys`]`>`), and by [`KeyFrom`]. One key is locked with `Locker::lock` (or
/// `Locker::read`, see [`Mode`](crate::Mode)); several are locked together with
/// `Locker::lock_all`, all or nothing, in one order for every request, so requests naming the
/// same keys in different orders cannot deadlock. What happens to a request without a key (or
/// with an empty list) is set with
/// [`on_missing_key`](crate::DistributedLockLayer::on_missing_key); a key that is not a valid
/// lock key (empty, or longer than [`lock_core::MAX_KEY_LEN`]) is rejected with `400 Bad
/// Request` by default.
///
/// # Examples
///
/// ```
/// use http::Request;
/// use lock_tower::{KeyExtractor, LockKeys};
///
/// // Lock per tenant and order, from a header and the path.
/// let key = |req: &Request<()>| {
///     let tenant = req.headers().get("x-tenant")?.to_str().ok()?;
///     let order = req.uri().path().strip_prefix("/orders/")?;
///     Some(format!("order:{tenant}:{order}"))
/// };
/// let req = Request::builder().uri("/orders/7").header("x-tenant", "acme").body(()).unwrap();
/// assert_eq!(key.extract_keys(&req), Some(LockKeys::one("order:acme:7")));
///
/// // Both accounts of `/transfer/{from}/{to}`: a transfer locks the two.
/// let keys = |req: &Request<()>| {
///     let (from, to) = req.uri().path().strip_prefix("/transfer/")?.split_once('/')?;
///     Some([format!("account:{from}"), format!("account:{to}")])
/// };
/// let req = Request::builder().uri("/transfer/7/3").body(()).unwrap();
/// assert_eq!(keys.extract_keys(&req), Some(LockKeys::all(["account:7", "account:3"])));
/// ```
pub trait KeyExtractor<B> {
    /// The lock key(s) of `request`, or `None` when it has none. Return `None` when any of
    /// several keys is missing: a request is locked on all its keys or on none.
    fn extract_keys(&self, request: &Request<B>) -> Option<LockKeys>;

    /// Whose fault it is that [`extract_keys`](Self::extract_keys) found no key in `request`,
    /// which decides the default answer (see [`MissingKey::Reject`](crate::MissingKey::Reject)).
    /// Asked only for a request without a key. Default [`KeyAbsence::Request`]: the request
    /// lacks what the key comes from.
    fn absence(&self, request: &Request<B>) -> KeyAbsence {
        let _ = request;
        KeyAbsence::Request
    }
}

/// The lock key(s) of one request: one key, or several locked together.
///
/// Built from a `String` or `&str` (one key), from `Vec<String>` or an array (several), or
/// with [`one`](Self::one) / [`all`](Self::all). Several keys, even a list of one, are locked
/// with `Locker::lock_all` and show in the handler as [`HeldLocks`](crate::HeldLocks) only;
/// one key also as [`HeldLock`](crate::HeldLock). So what a route's handler can extract
/// depends on the extractor, not on the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockKeys(Keys);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Keys {
    One(String),
    All(Vec<String>),
}

impl LockKeys {
    /// One key.
    pub fn one(key: impl Into<String>) -> Self {
        Self(Keys::One(key.into()))
    }

    /// Several keys, locked together, all or nothing. An empty list counts as no key.
    pub fn all<I, S>(keys: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self(Keys::All(keys.into_iter().map(Into::into).collect()))
    }

    /// The keys, as extracted (in the extractor's order; the lock order is sorted).
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        let keys: &[String] = match &self.0 {
            Keys::One(key) => std::slice::from_ref(key),
            Keys::All(keys) => keys,
        };
        keys.iter().map(String::as_str)
    }

    /// How many keys.
    pub fn len(&self) -> usize {
        match &self.0 {
            Keys::One(_) => 1,
            Keys::All(keys) => keys.len(),
        }
    }

    /// Whether there is no key at all (an empty list).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether these are several keys to lock together ([`all`](Self::all)), even a list of
    /// one.
    pub fn is_several(&self) -> bool {
        matches!(self.0, Keys::All(_))
    }

    /// `Ok(key)` for one key, `Err(keys)` for several.
    pub(crate) fn into_one_or_all(self) -> Result<String, Vec<String>> {
        match self.0 {
            Keys::One(key) => Ok(key),
            Keys::All(keys) => Err(keys),
        }
    }

    /// Puts `prefix` in front of every non-empty key.
    fn prefixed(self, prefix: &str) -> Self {
        let add = |key: String| {
            if key.is_empty() {
                key
            } else {
                let mut prefixed = String::with_capacity(prefix.len() + key.len());
                prefixed.push_str(prefix);
                prefixed.push_str(&key);
                prefixed
            }
        };
        Self(match self.0 {
            Keys::One(key) => Keys::One(add(key)),
            Keys::All(keys) => Keys::All(keys.into_iter().map(add).collect()),
        })
    }
}

impl fmt::Display for LockKeys {
    /// One key as it is; several as `a, b`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, key) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(key)?;
        }
        Ok(())
    }
}

impl From<String> for LockKeys {
    fn from(key: String) -> Self {
        Self::one(key)
    }
}

impl From<&str> for LockKeys {
    fn from(key: &str) -> Self {
        Self::one(key)
    }
}

impl<S: Into<String>> From<Vec<S>> for LockKeys {
    fn from(keys: Vec<S>) -> Self {
        Self::all(keys)
    }
}

impl<S: Into<String>, const N: usize> From<[S; N]> for LockKeys {
    fn from(keys: [S; N]) -> Self {
        Self::all(keys)
    }
}

/// Whose fault a missing key is: the client's or the server's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyAbsence {
    /// The request lacks the value (a header, a query parameter), or has one that cannot be
    /// read (a path parameter that is not UTF-8 once percent-decoded): the client's fault,
    /// answered `400 Bad Request` ([`Rejection::MissingKey`](crate::Rejection::MissingKey)).
    Request,
    /// The extractor can never find a key on this route (an axum path parameter the route
    /// does not have, or a layer applied before routing): the server is misconfigured,
    /// answered `500` ([`Rejection::Misconfigured`](crate::Rejection::Misconfigured)) and
    /// logged as an error once per route.
    Route,
}

impl<B, F, K> KeyExtractor<B> for F
where
    F: Fn(&Request<B>) -> Option<K>,
    K: Into<LockKeys>,
{
    fn extract_keys(&self, request: &Request<B>) -> Option<LockKeys> {
        self(request).map(Into::into)
    }
}

/// Ready-made key extractors: a path parameter (or several), a header, a query parameter or a
/// fixed key, optionally behind a [`prefix`](Self::prefix).
///
/// An empty value is kept as an empty key (and [`prefix`](Self::prefix) does not make it
/// valid), so the request is rejected as an invalid key rather than locking a key shared by
/// every request with an empty value.
///
/// # Examples
///
/// ```
/// use lock_tower::{KeyExtractor, KeyFrom, LockKeys};
///
/// let key = KeyFrom::query_param("order").prefix("order:");
/// let req = http::Request::builder().uri("/pay?order=7&x=1").body(()).unwrap();
/// assert_eq!(key.extract_keys(&req), Some(LockKeys::one("order:7")));
///
/// let key = KeyFrom::header("x-account").prefix("account:");
/// let req = http::Request::builder().header("x-account", "42").body(()).unwrap();
/// assert_eq!(key.extract_keys(&req), Some(LockKeys::one("account:42")));
/// ```
#[derive(Clone)]
pub struct KeyFrom {
    source: Source,
    prefix: Option<Arc<str>>,
}

#[derive(Clone)]
enum Source {
    #[cfg(feature = "axum")]
    PathParam(Arc<str>),
    #[cfg(feature = "axum")]
    PathParams(Arc<[Arc<str>]>),
    Header(HeaderName),
    QueryParam(Arc<str>),
    Fixed(Arc<str>),
}

impl KeyFrom {
    /// The axum path parameter `name` (`"sku"` for a route `/skus/{sku}/purchase`),
    /// percent-decoded.
    ///
    /// Path parameters exist once the router has matched a route: apply the layer with
    /// `Router::route_layer` (or `Router::layer`, `MethodRouter::layer`, which also wrap each
    /// route). A layer in front of the whole app (a `ServiceBuilder` around the router handed
    /// to `axum::serve`) runs before routing and sees no parameters. A missing parameter: no
    /// key, a server misconfiguration ([`KeyAbsence::Route`]). A parameter the client sent
    /// that is not valid UTF-8 once percent-decoded (`/skus/%FF/purchase`): no key, the
    /// client's fault ([`KeyAbsence::Request`]).
    ///
    /// Reading the parameters clones the request's extensions once (axum keeps them in a
    /// private extension type that only its extractors can read).
    #[cfg(feature = "axum")]
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    pub fn path_param(name: impl Into<String>) -> Self {
        Self::new(Source::PathParam(name.into().into()))
    }

    /// Several axum path parameters, locked together: `["from", "to"]` for a route
    /// `/transfer/{from}/{to}` locks both accounts, with [`prefix`](Self::prefix) in front of
    /// each (`KeyFrom::path_params(["from", "to"]).prefix("account:")`). The keys are taken
    /// with `Locker::lock_all`, all or nothing, in one order for every request (sorted), so
    /// `/transfer/7/3` and `/transfer/3/7` at once cannot deadlock; a transfer from an account
    /// to itself locks it once. The handler sees them as [`HeldLocks`](crate::HeldLocks).
    ///
    /// As for [`path_param`](Self::path_param): any of them missing means no key, a server
    /// misconfiguration ([`KeyAbsence::Route`]), and any of them not UTF-8 a client error
    /// ([`KeyAbsence::Request`]); the request is never locked on some of its keys only.
    #[cfg(feature = "axum")]
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    pub fn path_params<I, S>(names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let names: Vec<Arc<str>> = names.into_iter().map(|n| n.into().into()).collect();
        Self::new(Source::PathParams(names.into()))
    }

    /// The first value of the header `name`. Absent, or not valid UTF-8: no key.
    ///
    /// # Panics
    ///
    /// When `name` is not a valid header name.
    pub fn header<N>(name: N) -> Self
    where
        HeaderName: TryFrom<N>,
        <HeaderName as TryFrom<N>>::Error: fmt::Debug,
    {
        let name = HeaderName::try_from(name).expect("KeyFrom::header: invalid header name");
        Self::new(Source::Header(name))
    }

    /// The first value of the query parameter `name`, decoded like a form
    /// (`application/x-www-form-urlencoded`: `+` is a space, `%XX` a byte). Absent, or not
    /// valid UTF-8 once decoded: no key.
    pub fn query_param(name: impl Into<String>) -> Self {
        Self::new(Source::QueryParam(name.into().into()))
    }

    /// The same key for every request: the layer then serializes the whole route.
    pub fn fixed(key: impl Into<String>) -> Self {
        Self::new(Source::Fixed(key.into().into()))
    }

    /// Puts `prefix` in front of every non-empty key (each of several), e.g. `"inventory:"`, so keys of
    /// different routes or resources cannot collide. Calling it again replaces the prefix.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into().into());
        self
    }

    fn new(source: Source) -> Self {
        Self {
            source,
            prefix: None,
        }
    }

    fn raw<B>(&self, request: &Request<B>) -> Option<LockKeys> {
        let one = match &self.source {
            #[cfg(feature = "axum")]
            Source::PathParam(name) => path_params(request, std::slice::from_ref(name)).ok()?.pop(),
            #[cfg(feature = "axum")]
            Source::PathParams(names) => {
                return path_params(request, names).ok().map(LockKeys::all)
            }
            Source::Header(name) => {
                let value = request.headers().get(name)?;
                std::str::from_utf8(value.as_bytes())
                    .ok()
                    .map(str::to_owned)
            }
            Source::QueryParam(name) => query_param(request.uri().query()?, name),
            Source::Fixed(key) => Some(key.to_string()),
        };
        one.map(LockKeys::one)
    }
}

impl<B> KeyExtractor<B> for KeyFrom {
    /// [`KeyAbsence::Route`] for a missing path parameter (every request of a route either has
    /// it or not), [`KeyAbsence::Request`] for one the client sent that is not UTF-8, and for
    /// the other sources.
    fn absence(&self, request: &Request<B>) -> KeyAbsence {
        match &self.source {
            #[cfg(feature = "axum")]
            Source::PathParam(name) => path_absence(request, std::slice::from_ref(name)),
            #[cfg(feature = "axum")]
            Source::PathParams(names) => path_absence(request, names),
            Source::Header(_) | Source::QueryParam(_) | Source::Fixed(_) => {
                let _ = request;
                KeyAbsence::Request
            }
        }
    }

    fn extract_keys(&self, request: &Request<B>) -> Option<LockKeys> {
        let raw = self.raw(request)?;
        Some(match &self.prefix {
            Some(prefix) => raw.prefixed(prefix),
            None => raw,
        })
    }
}

impl fmt::Debug for KeyFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("KeyFrom");
        match &self.source {
            #[cfg(feature = "axum")]
            Source::PathParam(name) => d.field("path_param", name),
            #[cfg(feature = "axum")]
            Source::PathParams(names) => d.field("path_params", names),
            Source::Header(name) => d.field("header", name),
            Source::QueryParam(name) => d.field("query_param", name),
            Source::Fixed(key) => d.field("fixed", key),
        };
        d.field("prefix", &self.prefix).finish()
    }
}

/// Why path parameters could not be read.
#[cfg(feature = "axum")]
enum PathFailure {
    /// No parameters (a layer before routing) or not this one: the route's configuration.
    Missing,
    /// A parameter the client sent is not UTF-8 once percent-decoded.
    NotUtf8,
}

/// Whose fault it is that the path parameters `names` of `request` gave no key.
#[cfg(feature = "axum")]
fn path_absence<B>(request: &Request<B>, names: &[Arc<str>]) -> KeyAbsence {
    match path_params(request, names) {
        Err(PathFailure::NotUtf8) => KeyAbsence::Request,
        Ok(_) | Err(PathFailure::Missing) => KeyAbsence::Route,
    }
}

/// Reads the path parameters `names` through `axum::extract::RawPathParams`, the public way to
/// reach the parameters axum stores in the request extensions after routing.
#[cfg(feature = "axum")]
fn path_params<B>(request: &Request<B>, names: &[Arc<str>]) -> Result<Vec<String>, PathFailure> {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    use axum::extract::rejection::RawPathParamsRejection;
    use axum::extract::{FromRequestParts, RawPathParams};

    let (mut parts, ()) = Request::new(()).into_parts();
    parts.extensions = request.extensions().clone();
    // The extractor reads the extensions and never waits: one poll completes it.
    let extract = RawPathParams::from_request_parts(&mut parts, &());
    let mut extract = std::pin::pin!(extract);
    match extract
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(Ok(params)) => names
            .iter()
            .map(|name| {
                params
                    .iter()
                    .find(|(key, _)| *key == &**name)
                    .map(|(_, value)| value.to_owned())
                    .ok_or(PathFailure::Missing)
            })
            .collect(),
        // The route matched and has parameters, but the client's bytes do not decode.
        Poll::Ready(Err(RawPathParamsRejection::InvalidUtf8InPathParam(_))) => {
            Err(PathFailure::NotUtf8)
        }
        Poll::Ready(Err(_)) | Poll::Pending => Err(PathFailure::Missing),
    }
}

/// The first value of `name` in a form-encoded query string.
fn query_param(query: &str, name: &str) -> Option<String> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .find_map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (form_decode(key).as_deref() == Some(name)).then(|| form_decode(value))
        })
        .flatten()
}

/// Decodes one `application/x-www-form-urlencoded` component; `None` when the bytes are not
/// UTF-8. A `%` not followed by two hex digits stays as it is.
fn form_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => match (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            ) {
                (Some(hi), Some(lo)) => {
                    out.push(hi << 4 | lo);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one key an extractor finds (these tests are about single keys).
    trait ExtractOne<B> {
        fn extract_key(&self, request: &Request<B>) -> Option<String>;
    }

    impl<B, K: KeyExtractor<B>> ExtractOne<B> for K {
        fn extract_key(&self, request: &Request<B>) -> Option<String> {
            match self.extract_keys(request)?.into_one_or_all() {
                Ok(key) => Some(key),
                Err(keys) => panic!("several keys: {keys:?}"),
            }
        }
    }

    fn req(uri: &str) -> Request<()> {
        Request::builder().uri(uri).body(()).unwrap()
    }

    #[test]
    fn query_params_are_form_decoded() {
        let key = KeyFrom::query_param("order id");
        assert_eq!(
            key.extract_key(&req("/?a=1&order+id=A%2fb+c&order+id=2")),
            Some("A/b c".to_owned())
        );
        assert_eq!(key.extract_key(&req("/?a=1")), None);
        assert_eq!(key.extract_key(&req("/")), None);
        assert_eq!(
            KeyFrom::query_param("k").extract_key(&req("/?k")),
            Some(String::new())
        );
        assert_eq!(
            KeyFrom::query_param("k").extract_key(&req("/?k=100%&x")),
            Some("100%".to_owned())
        );
        assert_eq!(
            KeyFrom::query_param("k").extract_key(&req("/?k=%4")),
            Some("%4".to_owned())
        );
        assert_eq!(
            KeyFrom::query_param("k").extract_key(&req("/?k=%C3%A9")),
            Some("é".to_owned())
        );
        // Not UTF-8 once decoded.
        assert_eq!(KeyFrom::query_param("k").extract_key(&req("/?k=%FF")), None);
    }

    #[test]
    fn headers_and_fixed_keys() {
        let request = Request::builder()
            .header("x-key", "abc")
            .header("x-key", "second")
            .body(())
            .unwrap();
        assert_eq!(
            KeyFrom::header("x-key").extract_key(&request),
            Some("abc".to_owned())
        );
        assert_eq!(KeyFrom::header("x-other").extract_key(&request), None);
        assert_eq!(
            KeyFrom::fixed("nightly")
                .prefix("job:")
                .extract_key(&request),
            Some("job:nightly".to_owned())
        );
    }

    #[test]
    fn prefix_leaves_empty_keys_empty_and_replaces() {
        let key = KeyFrom::query_param("k").prefix("a:").prefix("b:");
        assert_eq!(key.extract_key(&req("/?k=1")), Some("b:1".to_owned()));
        assert_eq!(key.extract_key(&req("/?k=")), Some(String::new()));
    }

    #[test]
    #[should_panic(expected = "invalid header name")]
    fn invalid_header_name_panics() {
        let _ = KeyFrom::header("not a header");
    }

    #[test]
    fn closures_are_extractors() {
        fn check<B, K: KeyExtractor<B>>(k: K, r: &Request<B>) -> Option<String> {
            k.extract_key(r)
        }
        let r = req("/a/b");
        assert_eq!(
            check(|r: &Request<()>| Some(r.uri().path().to_owned()), &r),
            Some("/a/b".to_owned())
        );
    }

    #[test]
    fn closures_may_return_several_keys() {
        let r = req("/transfer/7/3");
        let pair = |r: &Request<()>| {
            let (a, b) = r.uri().path().strip_prefix("/transfer/")?.split_once('/')?;
            Some([a.to_owned(), b.to_owned()])
        };
        let keys = pair.extract_keys(&r).unwrap();
        assert!(keys.is_several());
        assert_eq!(keys.iter().collect::<Vec<_>>(), ["7", "3"]);
        assert_eq!(keys.to_string(), "7, 3");
        let list = |_: &Request<()>| Some(vec!["only"]);
        let keys = list.extract_keys(&r).unwrap();
        assert!(keys.is_several(), "a list of one is still a list");
        assert_eq!(keys.len(), 1);
        let none = |_: &Request<()>| Some(Vec::<String>::new());
        assert!(none.extract_keys(&r).unwrap().is_empty());
        let one = |_: &Request<()>| Some("fixed");
        assert_eq!(one.extract_keys(&r), Some(LockKeys::one("fixed")));
    }

    #[test]
    fn prefix_goes_before_each_of_several_keys_but_not_an_empty_one() {
        let keys = LockKeys::all(["7", "", "3"]).prefixed("account:");
        assert_eq!(
            keys.iter().collect::<Vec<_>>(),
            ["account:7", "", "account:3"]
        );
        assert_eq!(
            LockKeys::one("x").prefixed("p:").into_one_or_all(),
            Ok("p:x".to_owned())
        );
    }

    #[cfg(feature = "axum")]
    #[test]
    fn no_path_params_outside_a_router() {
        assert_eq!(
            KeyFrom::path_params(["from", "to"]).extract_keys(&req("/transfer/1/2")),
            None
        );
        assert_eq!(
            KeyFrom::path_param("sku").extract_key(&req("/skus/1")),
            None
        );
    }
}
