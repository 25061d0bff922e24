//! Which lock a request needs: the [`KeyExtractor`] trait and the ready-made [`KeyFrom`]
//! extractors.

use std::fmt;
use std::sync::Arc;

use http::{HeaderName, Request};

/// Derives the lock key of a request, or `None` when the request has none.
///
/// Implemented for every `Fn(&Request<B>) -> Option<String>` closure, and by [`KeyFrom`].
/// What happens to a request without a key is set with
/// [`on_missing_key`](crate::DistributedLockLayer::on_missing_key); a key that is not a valid
/// lock key (empty, or longer than [`lock_core::MAX_KEY_LEN`]) is rejected with `400 Bad Request`
/// by default.
///
/// # Examples
///
/// ```
/// use http::Request;
/// use lock_tower::KeyExtractor;
///
/// // Lock per tenant and order, from a header and the path.
/// let key = |req: &Request<()>| {
///     let tenant = req.headers().get("x-tenant")?.to_str().ok()?;
///     let order = req.uri().path().strip_prefix("/orders/")?;
///     Some(format!("order:{tenant}:{order}"))
/// };
/// let req = Request::builder().uri("/orders/7").header("x-tenant", "acme").body(()).unwrap();
/// assert_eq!(key.extract_key(&req).as_deref(), Some("order:acme:7"));
/// ```
pub trait KeyExtractor<B> {
    /// The lock key of `request`, or `None` when it has none.
    fn extract_key(&self, request: &Request<B>) -> Option<String>;

    /// Whose fault it is when [`extract_key`](Self::extract_key) finds no key, which decides
    /// the default answer (see [`MissingKey::Reject`](crate::MissingKey::Reject)). Default
    /// [`KeyAbsence::Request`]: the request lacks what the key comes from.
    fn absence(&self) -> KeyAbsence {
        KeyAbsence::Request
    }
}

/// Whose fault a missing key is: the client's or the server's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyAbsence {
    /// The request lacks the value (a header, a query parameter): the client's fault,
    /// answered `400 Bad Request` ([`Rejection::MissingKey`](crate::Rejection::MissingKey)).
    Request,
    /// The extractor can never find a key on this route (an axum path parameter the route
    /// does not have, or a layer applied before routing): the server is misconfigured,
    /// answered `500` ([`Rejection::Misconfigured`](crate::Rejection::Misconfigured)) and
    /// logged as an error once per route.
    Route,
}

impl<B, F> KeyExtractor<B> for F
where
    F: Fn(&Request<B>) -> Option<String>,
{
    fn extract_key(&self, request: &Request<B>) -> Option<String> {
        self(request)
    }
}

/// Ready-made key extractors: a path parameter, a header, a query parameter or a fixed key,
/// optionally behind a [`prefix`](Self::prefix).
///
/// An empty value is kept as an empty key (and [`prefix`](Self::prefix) does not make it
/// valid), so the request is rejected as an invalid key rather than locking a key shared by
/// every request with an empty value.
///
/// # Examples
///
/// ```
/// use lock_tower::{KeyExtractor, KeyFrom};
///
/// let key = KeyFrom::query_param("order").prefix("order:");
/// let req = http::Request::builder().uri("/pay?order=7&x=1").body(()).unwrap();
/// assert_eq!(key.extract_key(&req).as_deref(), Some("order:7"));
///
/// let key = KeyFrom::header("x-account").prefix("account:");
/// let req = http::Request::builder().header("x-account", "42").body(()).unwrap();
/// assert_eq!(key.extract_key(&req).as_deref(), Some("account:42"));
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
    /// to `axum::serve`) runs before routing and sees no parameters. A missing parameter, or
    /// one that is not valid UTF-8: no key, a server misconfiguration ([`KeyAbsence::Route`]).
    ///
    /// Reading the parameters clones the request's extensions once (axum keeps them in a
    /// private extension type that only its extractors can read).
    #[cfg(feature = "axum")]
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    pub fn path_param(name: impl Into<String>) -> Self {
        Self::new(Source::PathParam(name.into().into()))
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

    /// Puts `prefix` in front of every non-empty key, e.g. `"inventory:"`, so keys of
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

    fn raw<B>(&self, request: &Request<B>) -> Option<String> {
        match &self.source {
            #[cfg(feature = "axum")]
            Source::PathParam(name) => path_param(request, name),
            Source::Header(name) => {
                let value = request.headers().get(name)?;
                std::str::from_utf8(value.as_bytes())
                    .ok()
                    .map(str::to_owned)
            }
            Source::QueryParam(name) => query_param(request.uri().query()?, name),
            Source::Fixed(key) => Some(key.to_string()),
        }
    }
}

impl<B> KeyExtractor<B> for KeyFrom {
    /// [`KeyAbsence::Route`] for a path parameter (every request of a route either has it or
    /// not), [`KeyAbsence::Request`] for the others.
    fn absence(&self) -> KeyAbsence {
        match &self.source {
            #[cfg(feature = "axum")]
            Source::PathParam(_) => KeyAbsence::Route,
            Source::Header(_) | Source::QueryParam(_) | Source::Fixed(_) => KeyAbsence::Request,
        }
    }

    fn extract_key(&self, request: &Request<B>) -> Option<String> {
        let raw = self.raw(request)?;
        match &self.prefix {
            Some(prefix) if !raw.is_empty() => {
                let mut key = String::with_capacity(prefix.len() + raw.len());
                key.push_str(prefix);
                key.push_str(&raw);
                Some(key)
            }
            _ => Some(raw),
        }
    }
}

impl fmt::Debug for KeyFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("KeyFrom");
        match &self.source {
            #[cfg(feature = "axum")]
            Source::PathParam(name) => d.field("path_param", name),
            Source::Header(name) => d.field("header", name),
            Source::QueryParam(name) => d.field("query_param", name),
            Source::Fixed(key) => d.field("fixed", key),
        };
        d.field("prefix", &self.prefix).finish()
    }
}

/// Reads one path parameter through `axum::extract::RawPathParams`, the public way to reach
/// the parameters axum stores in the request extensions after routing.
#[cfg(feature = "axum")]
fn path_param<B>(request: &Request<B>, name: &str) -> Option<String> {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

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
        Poll::Ready(Ok(params)) => params
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.to_owned()),
        Poll::Ready(Err(_)) | Poll::Pending => None,
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

    #[cfg(feature = "axum")]
    #[test]
    fn no_path_params_outside_a_router() {
        assert_eq!(
            KeyFrom::path_param("sku").extract_key(&req("/skus/1")),
            None
        );
    }
}
