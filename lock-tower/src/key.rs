//! Which lock(s) a request needs: the [`KeyExtractor`] trait, the [`LockKeys`] it returns, and
//! the ready-made [`KeyFrom`] extractors.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use http::{Extensions, HeaderName, Request};

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

    /// [`extract_keys`](Self::extract_keys) with the request in hand, which is what the layer
    /// calls: for an extractor that reads the request more cheaply when it may move parts of
    /// it out and back (the path parameter extractors read axum's parameters this way rather
    /// than cloning every extension of the request). It must leave `request` as it found it
    /// and find the same keys as `extract_keys`. The default calls `extract_keys`.
    fn extract_keys_mut(&self, request: &mut Request<B>) -> Option<LockKeys> {
        self.extract_keys(request)
    }

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

/// Why a request has no key: the client's fault or the server's configuration, and whether
/// the layer may let it through unlocked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyAbsence {
    /// The request lacks the value (a header, a query parameter): the client's fault,
    /// answered `400 Bad Request` ([`Rejection::MissingKey`](crate::Rejection::MissingKey)),
    /// or let through unlocked under [`MissingKey::Pass`](crate::MissingKey::Pass).
    Request,
    /// The extractor can never find a key on this route (an axum path parameter the route
    /// does not have, or a layer applied before routing): the server is misconfigured,
    /// answered `500` ([`Rejection::Misconfigured`](crate::Rejection::Misconfigured)) and
    /// logged as an error once per route, or let through unlocked under
    /// [`MissingKey::Pass`](crate::MissingKey::Pass).
    Route,
    /// The request carries the value but not as one readable key: not UTF-8 (once
    /// percent-decoded), or a query parameter given more than once (handlers disagree on
    /// which one counts). Answered `400 Bad Request`
    /// ([`Rejection::MissingKey`](crate::Rejection::MissingKey)) under every
    /// [`MissingKey`](crate::MissingKey) setting: letting it through unlocked would let a
    /// client skip the lock of a key it does name.
    Unreadable,
    /// The value is there but does not parse as the type of a typed extractor
    /// ([`KeyFrom::path_param_as`] and the like): answered `400 Bad Request`
    /// ([`Rejection::MalformedKey`](crate::Rejection::MalformedKey)) under every
    /// [`MissingKey`](crate::MissingKey) setting, as for [`Unreadable`](Self::Unreadable).
    Malformed,
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
/// fixed key, optionally behind a [`prefix`](Self::prefix); each as text or typed.
///
/// # The key must be the resource's canonical form
///
/// Two requests exclude each other only when they lock the same key. The text extractors
/// ([`path_param`](Self::path_param), [`path_params`](Self::path_params),
/// [`header`](Self::header), [`query_param`](Self::query_param)) lock the value as the client
/// wrote it (percent-decoded), which is not always the resource the handler serves: a handler
/// that takes `Path<u64>` reads `/skus/7`, `/skus/07`, `/skus/+7` and `/skus/%2B7` all as SKU
/// 7, while `path_param("sku")` locks four different keys for them, so their purchases run
/// together. When the handler parses the value, use the **typed extractor** of the same
/// type ([`path_param_as`](Self::path_param_as), [`path_params_as`](Self::path_params_as),
/// [`header_as`](Self::header_as), [`query_param_as`](Self::query_param_as)): it parses the
/// value with the type's `FromStr`, as axum's `Path` and `Query` do, and locks its `Display`
/// (`7` for all four). A value that does not parse is refused with `400 Bad Request`
/// ([`Rejection::MalformedKey`](crate::Rejection::MalformedKey)). Pick a type whose
/// `Display` is canonical (integers; `uuid::Uuid`, which prints lowercase); for a `String`
/// key the typed and the text extractor are the same.
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
/// // Any spelling of order 7 that `u64::from_str` accepts locks `order:7`.
/// let key = KeyFrom::query_param_as::<u64>("order").prefix("order:");
/// let req = http::Request::builder().uri("/pay?order=007&x=1").body(()).unwrap();
/// assert_eq!(key.extract_keys(&req), Some(LockKeys::one("order:7")));
///
/// let key = KeyFrom::header_as::<u64>("x-account").prefix("account:");
/// let req = http::Request::builder().header("x-account", "+42").body(()).unwrap();
/// assert_eq!(key.extract_keys(&req), Some(LockKeys::one("account:42")));
///
/// // The text as it came, for keys that are text to the handler too.
/// let key = KeyFrom::header("x-tenant").prefix("tenant:");
/// let req = http::Request::builder().header("x-tenant", "acme").body(()).unwrap();
/// assert_eq!(key.extract_keys(&req), Some(LockKeys::one("tenant:acme")));
/// ```
#[derive(Clone)]
pub struct KeyFrom {
    source: Source,
    prefix: Option<Arc<str>>,
    /// Set for the typed extractors.
    canonical: Option<Canonical>,
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

/// How a typed extractor turns the text of a value into its key.
#[derive(Clone, Copy)]
struct Canonical {
    /// The type's name, for `Debug`.
    type_name: &'static str,
    /// Parses with the type's `FromStr` and appends its `Display` to the key being built;
    /// `false` when the text does not parse. A plain function, so a typed extractor costs no
    /// allocation of its own.
    form: fn(&str, &mut String) -> bool,
}

impl Canonical {
    fn of<T: FromStr + fmt::Display>() -> Self {
        Self {
            type_name: std::any::type_name::<T>(),
            form: |text, key| match text.parse::<T>() {
                Ok(value) => fmt::Write::write_fmt(key, format_args!("{value}")).is_ok(),
                Err(_) => false,
            },
        }
    }
}

impl KeyFrom {
    /// The axum path parameter `name` (`"sku"` for a route `/skus/{sku}/purchase`),
    /// percent-decoded, **as text**.
    ///
    /// **The key is the text the client wrote, not the value the handler reads**: behind a
    /// handler that takes `Path<u64>`, `/skus/7` and `/skus/07` are one SKU but two keys, and
    /// run together. Use [`path_param_as`](Self::path_param_as) with the handler's type unless
    /// the handler too takes the parameter as text.
    ///
    /// Path parameters exist once the router has matched a route: apply the layer with
    /// `Router::route_layer` (or `Router::layer`, `MethodRouter::layer`, which also wrap each
    /// route; `Router::layer` wraps the fallback as well, so a request that matches no route
    /// is answered `404` by the layer, [`Rejection::NoRoute`](crate::Rejection::NoRoute),
    /// not by your fallback). A layer in front of the whole app (a `ServiceBuilder` around
    /// the router handed to `axum::serve`) runs before routing and sees no parameters. A missing parameter: no
    /// key, a server misconfiguration ([`KeyAbsence::Route`]). A parameter the client sent
    /// that is not valid UTF-8 once percent-decoded (`/skus/%FF/purchase`): refused, the
    /// client's fault ([`KeyAbsence::Unreadable`]).
    ///
    /// Reading the parameters clones the request's extensions once (axum keeps them in a
    /// private extension type that only its extractors can read).
    #[cfg(feature = "axum")]
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    pub fn path_param(name: impl Into<String>) -> Self {
        Self::new(Source::PathParam(name.into().into()))
    }

    /// The axum path parameter `name`, parsed as a `T` with `FromStr` (as axum's `Path<T>`
    /// does) and locked as its `Display`: the canonical form, so every spelling of one
    /// resource locks one key. A value that does not parse: refused with `400 Bad Request`
    /// ([`KeyAbsence::Malformed`], [`Rejection::MalformedKey`](crate::Rejection::MalformedKey)),
    /// before any lock. Otherwise as [`path_param`](Self::path_param).
    ///
    /// ```
    /// # #[cfg(feature = "axum")] {
    /// use axum::{extract::Path, routing::post, Router};
    /// use lock_tower::{DistributedLockLayer, KeyFrom};
    ///
    /// // `/skus/7`, `/skus/07`, `/skus/+7` and `/skus/%2B7` all lock `inventory:7`.
    /// async fn purchase(Path(sku): Path<u64>) -> String {
    ///     format!("bought {sku}")
    /// }
    /// # fn app(locker: lock_core::Locker) -> Router {
    /// Router::new()
    ///     .route("/skus/{sku}/purchase", post(purchase))
    ///     .route_layer(DistributedLockLayer::new(
    ///         locker,
    ///         KeyFrom::path_param_as::<u64>("sku").prefix("inventory:"),
    ///     ))
    /// # }
    /// # }
    /// ```
    #[cfg(feature = "axum")]
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    pub fn path_param_as<T>(name: impl Into<String>) -> Self
    where
        T: FromStr + fmt::Display,
    {
        Self::path_param(name).typed::<T>()
    }

    /// Several axum path parameters, **as text**, locked together: `["from", "to"]` for a
    /// route `/transfer/{from}/{to}` locks both accounts, with [`prefix`](Self::prefix) in
    /// front of each (`KeyFrom::path_params(["from", "to"]).prefix("account:")`). The keys
    /// are taken with `Locker::lock_all`, all or nothing, in one order for every request
    /// (sorted), so `/transfer/7/3` and `/transfer/3/7` at once cannot deadlock; a transfer
    /// from an account to itself locks it once. The handler sees them as
    /// [`HeldLocks`](crate::HeldLocks).
    ///
    /// **The keys are the text the client wrote**, as for [`path_param`](Self::path_param):
    /// use [`path_params_as`](Self::path_params_as) when the handler parses them.
    ///
    /// As for [`path_param`](Self::path_param): any of them missing means no key, a server
    /// misconfiguration ([`KeyAbsence::Route`]), and any of them not UTF-8 a client error
    /// ([`KeyAbsence::Unreadable`]); the request is never locked on some of its keys only.
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

    /// Several axum path parameters, each parsed as a `T` and locked as its `Display` (see
    /// [`path_param_as`](Self::path_param_as)); any of them that does not parse refuses the
    /// request. Otherwise as [`path_params`](Self::path_params).
    ///
    /// ```
    /// # #[cfg(feature = "axum")] {
    /// use lock_tower::KeyFrom;
    ///
    /// // Behind a handler that takes `Path<(u64, u64)>`: `/transfer/07/3` locks
    /// // `account:7` and `account:3`, the keys the handler names for its fencing tokens.
    /// let accounts = KeyFrom::path_params_as::<u64>(["from", "to"]).prefix("account:");
    /// # let _ = accounts;
    /// # }
    /// ```
    #[cfg(feature = "axum")]
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    pub fn path_params_as<T>(names: impl IntoIterator<Item = impl Into<String>>) -> Self
    where
        T: FromStr + fmt::Display,
    {
        Self::path_params(names).typed::<T>()
    }

    /// The first value of the header `name`, **as text** (what `HeaderMap::get` returns).
    /// Absent: no key ([`KeyAbsence::Request`]). Not valid UTF-8: refused
    /// ([`KeyAbsence::Unreadable`]).
    ///
    /// **The key is the text the client wrote**: use [`header_as`](Self::header_as) when the
    /// handler parses the value.
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

    /// The first value of the header `name`, parsed as a `T` and locked as its `Display` (see
    /// [`path_param_as`](Self::path_param_as)); a value that does not parse refuses the
    /// request. Otherwise as [`header`](Self::header).
    ///
    /// # Panics
    ///
    /// When `name` is not a valid header name.
    pub fn header_as<T>(name: impl TryInto<HeaderName, Error: fmt::Debug>) -> Self
    where
        T: FromStr + fmt::Display,
    {
        let name = name
            .try_into()
            .expect("KeyFrom::header_as: invalid header name");
        Self::new(Source::Header(name)).typed::<T>()
    }

    /// The value of the query parameter `name`, **as text**, decoded like a form
    /// (`application/x-www-form-urlencoded`: `+` is a space, `%XX` a byte). Absent: no key
    /// ([`KeyAbsence::Request`]). Given more than once (`?order=7&order=8`: axum's
    /// `Query<HashMap<..>>` reads the last, other readers the first), or not valid UTF-8 once
    /// decoded: refused ([`KeyAbsence::Unreadable`]).
    ///
    /// **The key is the text the client wrote**: use
    /// [`query_param_as`](Self::query_param_as) when the handler parses the value.
    pub fn query_param(name: impl Into<String>) -> Self {
        Self::new(Source::QueryParam(name.into().into()))
    }

    /// The value of the query parameter `name`, decoded like a form, parsed as a `T` (as
    /// axum's `Query` does) and locked as its `Display` (see
    /// [`path_param_as`](Self::path_param_as)); a value that does not parse refuses the
    /// request. Otherwise as [`query_param`](Self::query_param).
    pub fn query_param_as<T>(name: impl Into<String>) -> Self
    where
        T: FromStr + fmt::Display,
    {
        Self::query_param(name).typed::<T>()
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
            canonical: None,
        }
    }

    fn typed<T: FromStr + fmt::Display>(mut self) -> Self {
        self.canonical = Some(Canonical::of::<T>());
        self
    }

    /// Whether the keys come from path parameters, which every request of a route has or
    /// lacks alike.
    fn reads_the_path(&self) -> bool {
        match self.source {
            #[cfg(feature = "axum")]
            Source::PathParam(_) | Source::PathParams(_) => true,
            Source::Header(_) | Source::QueryParam(_) | Source::Fixed(_) => false,
        }
    }

    /// The prefixed key(s) of `request`, or why it has none. `extensions` are the request's
    /// (moved out of it, or a clone) where the key is read from the path parameters; empty
    /// otherwise.
    fn read<B>(
        &self,
        request: &Request<B>,
        extensions: &mut Extensions,
    ) -> Result<LockKeys, KeyAbsence> {
        #[cfg(not(feature = "axum"))]
        let _ = extensions;
        let key = match &self.source {
            #[cfg(feature = "axum")]
            Source::PathParam(name) => {
                path_params(extensions, |params| self.key(param(params, name)?))?
            }
            #[cfg(feature = "axum")]
            Source::PathParams(names) => {
                let keys = path_params(extensions, |params| {
                    // A parameter the route lacks is the server's fault, whatever the others
                    // hold: looked for first.
                    for name in names.iter() {
                        param(params, name)?;
                    }
                    names
                        .iter()
                        .map(|name| self.key(param(params, name)?))
                        .collect::<Result<Vec<_>, _>>()
                })?;
                return Ok(LockKeys::all(keys));
            }
            Source::Header(name) => {
                let value = request.headers().get(name).ok_or(KeyAbsence::Request)?;
                self.key(
                    std::str::from_utf8(value.as_bytes()).map_err(|_| KeyAbsence::Unreadable)?,
                )?
            }
            Source::QueryParam(name) => {
                self.key(&query_param(request.uri().query().unwrap_or(""), name)?)?
            }
            Source::Fixed(key) => self.key(key)?,
        };
        Ok(LockKeys::one(key))
    }

    /// [`read`](Self::read) from a shared request: its extensions are cloned when the key is in
    /// the path parameters.
    fn read_shared<B>(&self, request: &Request<B>) -> Result<LockKeys, KeyAbsence> {
        let mut extensions = if self.reads_the_path() {
            request.extensions().clone()
        } else {
            Extensions::new()
        };
        self.read(request, &mut extensions)
    }

    /// The key of the value `text`: the prefix, then the text as it is or, for a typed
    /// extractor, parsed and formatted again; built in one allocation. An empty value (or
    /// canonical form) is an empty key, without the prefix.
    fn key(&self, text: &str) -> Result<String, KeyAbsence> {
        let prefix = self.prefix.as_deref().unwrap_or("");
        let mut key = String::with_capacity(prefix.len() + text.len());
        key.push_str(prefix);
        match self.canonical {
            None => key.push_str(text),
            Some(canonical) => {
                if !(canonical.form)(text, &mut key) {
                    return Err(KeyAbsence::Malformed);
                }
            }
        }
        if key.len() == prefix.len() {
            key.clear();
        }
        Ok(key)
    }
}

impl<B> KeyExtractor<B> for KeyFrom {
    /// [`KeyAbsence::Route`] for a missing path parameter (every request of a route either has
    /// it or not), [`KeyAbsence::Unreadable`] for a value that is not UTF-8 or a query
    /// parameter given twice, [`KeyAbsence::Malformed`] for a value a typed extractor cannot
    /// parse, and [`KeyAbsence::Request`] for a missing header or query parameter.
    fn absence(&self, request: &Request<B>) -> KeyAbsence {
        match self.read_shared(request) {
            Err(absence) => {
                if absence == KeyAbsence::Malformed {
                    tracing::debug!(extractor = ?self, "the lock key value does not parse");
                }
                absence
            }
            // An empty list of path parameters: no request of the route ever has a key.
            Ok(_) if self.reads_the_path() => KeyAbsence::Route,
            Ok(_) => KeyAbsence::Request,
        }
    }

    fn extract_keys(&self, request: &Request<B>) -> Option<LockKeys> {
        self.read_shared(request).ok()
    }

    /// Moves the request's extensions out while axum's extractor reads the path parameters
    /// from them, and back: no clone of every extension per request.
    fn extract_keys_mut(&self, request: &mut Request<B>) -> Option<LockKeys> {
        let mut extensions = std::mem::take(request.extensions_mut());
        let read = self.read(request, &mut extensions);
        *request.extensions_mut() = extensions;
        read.ok()
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
        if let Some(canonical) = &self.canonical {
            d.field("as", &canonical.type_name);
        }
        d.field("prefix", &self.prefix).finish()
    }
}

/// Reads the path parameters through `axum::extract::RawPathParams`, the public way to reach
/// the parameters axum stores in the request extensions after routing, and hands them to
/// `keys`. No parameters (a layer before routing): [`KeyAbsence::Route`]; a parameter the
/// client sent that is not UTF-8 once percent-decoded: [`KeyAbsence::Unreadable`].
/// `extensions` are the request's: moved into the parts the extractor reads, and back.
#[cfg(feature = "axum")]
fn path_params<T>(
    extensions: &mut Extensions,
    keys: impl FnOnce(&axum::extract::RawPathParams) -> Result<T, KeyAbsence>,
) -> Result<T, KeyAbsence> {
    use axum::extract::rejection::RawPathParamsRejection;
    use axum::extract::{FromRequestParts, RawPathParams};
    use futures_util::FutureExt;

    let (mut parts, ()) = Request::new(()).into_parts();
    parts.extensions = std::mem::take(extensions);
    // The extractor reads the extensions and never waits: one poll completes it.
    let read = RawPathParams::from_request_parts(&mut parts, &()).now_or_never();
    *extensions = parts.extensions;
    match read {
        Some(Ok(params)) => keys(&params),
        // The route matched and has parameters, but the client's bytes do not decode.
        Some(Err(RawPathParamsRejection::InvalidUtf8InPathParam(_))) => Err(KeyAbsence::Unreadable),
        Some(Err(_)) | None => Err(KeyAbsence::Route),
    }
}

/// The value of the path parameter `name`; [`KeyAbsence::Route`] when the route has none of
/// that name.
#[cfg(feature = "axum")]
fn param<'a>(params: &'a axum::extract::RawPathParams, name: &str) -> Result<&'a str, KeyAbsence> {
    params
        .iter()
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
        .ok_or(KeyAbsence::Route)
}

/// The value of `name` in a form-encoded query string: [`KeyAbsence::Request`] when it is not
/// there, [`KeyAbsence::Unreadable`] when it is there more than once or not UTF-8 once
/// decoded.
fn query_param(query: &str, name: &str) -> Result<String, KeyAbsence> {
    let mut found = None;
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if form_decode(key).as_deref() != Some(name) {
            continue;
        }
        if found.is_some() {
            // Readers disagree on which of several values counts: lock none of them.
            return Err(KeyAbsence::Unreadable);
        }
        found = Some(value);
    }
    form_decode(found.ok_or(KeyAbsence::Request)?).ok_or(KeyAbsence::Unreadable)
}

/// Decodes one `application/x-www-form-urlencoded` component; `None` when the bytes are not
/// UTF-8 (a lossy decoding would lock a different key than the one the client sent). A `%` not
/// followed by two hex digits stays as it is. A `+` is a space; an encoded one (`%2B`) is not.
fn form_decode(s: &str) -> Option<String> {
    let spaced = s.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced)
        .decode_utf8()
        .ok()
        .map(std::borrow::Cow::into_owned)
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
            key.extract_key(&req("/?a=1&order+id=A%2fb+c&b=2")),
            Some("A/b c".to_owned())
        );
        // Given twice, under one spelling of the name or two: no key, and never passed.
        for twice in ["/?order+id=A&order+id=B", "/?order+id=A&order%20id=A"] {
            assert_eq!(key.extract_key(&req(twice)), None, "{twice}");
            assert_eq!(key.absence(&req(twice)), KeyAbsence::Unreadable, "{twice}");
        }
        assert_eq!(key.absence(&req("/?a=1")), KeyAbsence::Request);
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
        // Every spelling of `+7` a client can send: a literal `+` is a space, `%2B` a plus.
        assert_eq!(
            KeyFrom::query_param("k").extract_key(&req("/?k=%2B7")),
            Some("+7".to_owned())
        );
        assert_eq!(
            KeyFrom::query_param("k").extract_key(&req("/?k=+7")),
            Some(" 7".to_owned())
        );
        // Not UTF-8 once decoded.
        assert_eq!(KeyFrom::query_param("k").extract_key(&req("/?k=%FF")), None);
        assert_eq!(
            KeyFrom::query_param("k").absence(&req("/?k=%FF")),
            KeyAbsence::Unreadable
        );
    }

    #[test]
    fn typed_extractors_lock_the_canonical_form() {
        let query = KeyFrom::query_param_as::<u64>("sku").prefix("inventory:");
        // `+` is a space in a query, as for axum's `Query`: ` 7` is no `u64`, `%2B7` is.
        for (uri, key) in [
            ("/?sku=7", Some("inventory:7")),
            ("/?sku=0007", Some("inventory:7")),
            ("/?sku=%2B7", Some("inventory:7")),
            ("/?sku=+7", None),
            ("/?sku=seven", None),
            ("/?sku=", None),
            ("/?sku=18446744073709551616", None),
        ] {
            assert_eq!(query.extract_key(&req(uri)).as_deref(), key, "{uri}");
        }
        assert_eq!(query.absence(&req("/?sku=seven")), KeyAbsence::Malformed);
        assert_eq!(query.absence(&req("/?sku=7&sku=7")), KeyAbsence::Unreadable);
        assert_eq!(query.absence(&req("/?other=7")), KeyAbsence::Request);

        let header = KeyFrom::header_as::<i64>("x-account");
        let with = |value: &str| {
            Request::builder()
                .header("x-account", value)
                .body(())
                .unwrap()
        };
        assert_eq!(header.extract_key(&with("-07")), Some("-7".to_owned()));
        assert_eq!(header.extract_key(&with("+0")), Some("0".to_owned()));
        assert_eq!(header.extract_key(&with("7 ")), None);
        assert_eq!(header.absence(&with("7 ")), KeyAbsence::Malformed);
        assert_eq!(header.absence(&req("/")), KeyAbsence::Request);
        // A header name given as a `HeaderName` too.
        let named = KeyFrom::header_as::<u8>(http::header::HeaderName::from_static("x-n"));
        assert_eq!(
            named.extract_key(&Request::builder().header("x-n", "09").body(()).unwrap()),
            Some("9".to_owned())
        );
        assert_eq!(
            format!("{header:?}"),
            r#"KeyFrom { header: "x-account", as: "i64", prefix: None }"#
        );
    }

    #[test]
    fn a_header_that_is_not_utf8_is_unreadable() {
        let request = Request::builder()
            .header("x-key", http::HeaderValue::from_bytes(b"\xff").unwrap())
            .body(())
            .unwrap();
        for key in [KeyFrom::header("x-key"), KeyFrom::header_as::<u64>("x-key")] {
            assert_eq!(key.extract_key(&request), None);
            assert_eq!(key.absence(&request), KeyAbsence::Unreadable);
        }
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
    #[should_panic(expected = "invalid header name")]
    fn invalid_typed_header_name_panics() {
        let _ = KeyFrom::header_as::<u64>("not a header");
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
    fn prefix_goes_before_a_key_but_not_an_empty_one() {
        let with = |value: &str| Request::builder().header("x-k", value).body(()).unwrap();
        let text = KeyFrom::header("x-k").prefix("p:");
        assert_eq!(text.extract_key(&with("x")), Some("p:x".to_owned()));
        assert_eq!(text.extract_key(&with("")), Some(String::new()));
        let typed = KeyFrom::header_as::<String>("x-k").prefix("p:");
        assert_eq!(typed.extract_key(&with("")), Some(String::new()));
        assert_eq!(typed.extract_key(&with("y")), Some("p:y".to_owned()));
        assert_eq!(
            KeyFrom::fixed("f").prefix("p:").extract_keys(&with("")),
            Some(LockKeys::one("p:f"))
        );
        assert_eq!(
            KeyFrom::fixed("f").extract_key(&with("")),
            Some("f".to_owned())
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
        let typed = KeyFrom::path_param_as::<u64>("sku");
        assert_eq!(typed.extract_key(&req("/skus/1")), None);
        assert_eq!(typed.absence(&req("/skus/1")), KeyAbsence::Route);
    }

    /// What the layer calls finds what `extract_keys` finds, and leaves the request's
    /// extensions as they were (the path extractors move them out and back).
    #[test]
    fn extract_keys_mut_finds_the_same_keys_and_keeps_the_extensions() {
        #[derive(Clone, Debug, PartialEq)]
        struct Marker(u32);
        let mut extractors = vec![
            KeyFrom::header("x-k").prefix("h:"),
            KeyFrom::query_param_as::<u64>("k").prefix("q:"),
            KeyFrom::fixed("f"),
        ];
        #[cfg(feature = "axum")]
        extractors.extend([KeyFrom::path_param("k"), KeyFrom::path_params(["a", "b"])]);
        for key in extractors {
            let mut request = Request::builder()
                .uri("/x?k=07")
                .header("x-k", "7")
                .extension(Marker(7))
                .body(())
                .unwrap();
            let shared = key.extract_keys(&request);
            assert_eq!(key.extract_keys_mut(&mut request), shared, "{key:?}");
            assert_eq!(
                request.extensions().get::<Marker>(),
                Some(&Marker(7)),
                "{key:?}"
            );
            assert_eq!(request.extensions().len(), 1, "{key:?}");
        }
    }
}
