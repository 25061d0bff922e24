//! The `#[distributed_lock]` attribute of the Redis lock kit.
//!
//! Use it through `lock-core`, which re-exports it under its default `macros` feature (the way
//! `tokio` re-exports `tokio::main`): `use lock_core::distributed_lock;`. All documentation is
//! on [`distributed_lock`].

// Parse (`attr`, `item`, `key`), validate (`valid`), expand (`expand`); `ty` reads types.
mod attr;
mod expand;
mod item;
mod key;
mod ty;
mod valid;

use proc_macro2::TokenStream;

/// Runs an async fn under a distributed lock on Redis.
///
/// The lock is acquired before the body runs and released after it on every path: `Ok`,
/// `Err`, early `return`, `?`, a panic or a dropped future (the last two release in the
/// background). A failure to lock (busy, Redis down, no locker) becomes the fn's error through
/// `From<LockError>`, and the body does not run.
///
/// # Examples
///
/// ```no_run
/// use lock_core::{distributed_lock, LockError, Locker};
///
/// #[derive(Debug)]
/// enum AppError {
///     Lock(LockError),
///     OutOfStock,
/// }
///
/// impl From<LockError> for AppError {
///     fn from(error: LockError) -> Self {
///         Self::Lock(error)
///     }
/// }
///
/// struct Inventory {
///     locker: Locker,
///     // db: Pool, ...
/// }
///
/// impl Inventory {
///     /// Only one instance of the service runs this at a time for a given `sku_id`.
///     #[distributed_lock(key = "inventory:<sku_id>", wait = "3s", locker = self.locker)]
///     async fn reserve(&self, sku_id: u64, qty: u32) -> Result<u32, AppError> {
///         let stock = 10; // read the stock
///         if stock < qty {
///             return Err(AppError::OutOfStock); // the lock is released here too
///         }
///         // write stock - qty
///         Ok(stock - qty)
///     }
/// }
///
/// # async fn demo() -> Result<(), AppError> {
/// let inventory = Inventory { locker: Locker::connect("redis://127.0.0.1:6379").await? };
/// inventory.reserve(42, 1).await?;
/// # Ok(())
/// # }
/// ```
///
/// # Options
///
/// | option | meaning | default |
/// |---|---|---|
/// | `key = "inventory:<sku_id>"` | the key template (below) | `key` or `keys` is required |
/// | `keys = ["account:<from>", "account:<to>"]` | several key templates: the fn runs holding all of them ([Several keys](#several-keys-keys)) | |
/// | `mode = "read"` or `"write"` | with `key`: the read lock (shared with other readers) or the write lock ([Read locks](#read-locks-mode--read)) | `"write"`: exclusive |
/// | `wait = "3s"` | how long to wait for the lock; `"0s"` tries once | the locker's `default_wait` (30 s); with `on_busy = "skip"`: zero, one try |
/// | `lease = "10s"` | a fixed lease, at least `1ms`: the lock expires after it and is never renewed | watchdog lease, renewed while the body runs |
/// | `locker = <expr>` | the `Locker` to use: any expression of type `Locker`, `&Locker` or `Arc<Locker>` (anything `AsRef<Locker>`), e.g. `self.locker` or `state.locker` | `Locker::global()` |
/// | `on_lost = "abort"` or `"continue"` | what happens when the lock is lost while the body runs (below) | `"abort"` |
/// | `on_busy = "skip"` or `"error"` | what happens when another holder has the lock: skip the fn quietly (it returns `None`, `Ok(None)`, `()` or `Ok(())`), or return `LockError::Busy` ([Skip when busy](#skip-when-busy-on_busy--skip)) | `"error"` |
/// | `fence = <name>` | binds the lock's `Fence` to `<name>` in the body, for its fencing token (`[Fence; N]` with `keys`) ([The fencing token](#the-fencing-token-fence)) | no binding |
/// | `crate = "path"` | the path of lock-core, when it is renamed in `Cargo.toml` | `::lock_core` |
///
/// Durations are [humantime](https://docs.rs/humantime) strings: `"250ms"`, `"3s"`, `"1m 30s"`.
/// A malformed duration, a zero lease, an unknown or repeated option are compile errors.
///
/// # Several keys: `keys`
///
/// `keys = [..]` takes every key with `Locker::lock_all`, all or nothing, as one guard: a
/// transfer between two accounts holds both. Each element is a template like `key`'s. The keys
/// are taken in one order for every caller (sorted), so two calls naming the same accounts in
/// opposite orders cannot deadlock; `wait` bounds the whole acquisition; a key that cannot be
/// taken gives back the ones already taken before the fn returns `LockError::Busy` (its body
/// does not run); `on_lost` applies when any of them is lost. Equal keys of one call (a
/// transfer from an account to itself) are locked once.
///
/// ```no_run
/// use lock_core::{distributed_lock, LockError, Locker};
///
/// struct Bank {
///     locker: Locker,
/// }
///
/// impl Bank {
///     #[distributed_lock(keys = ["account:<from>", "account:<to>"], wait = "3s", locker = self.locker)]
///     async fn transfer(&self, from: u64, to: u64, cents: u64) -> Result<(), LockError> {
///         // Nobody else moves money from or to either account now.
///         let _ = (from, to, cents);
///         Ok(())
///     }
/// }
/// ```
///
/// Several keys are always locked exclusively: lock-core has no multi-key read lock, so
/// `mode = "read"` with `keys` is a compile error.
///
/// # Read locks: `mode = "read"`
///
/// `mode = "read"` takes the read lock of the key (`Locker::read`): any number of readers, in
/// every process, run at once, while no writer holds the key or waits for it. `mode = "write"`
/// (the default, the behaviour without `mode`) takes the write lock, which is the key's
/// exclusive lock (`Locker::write`, the same as `Locker::lock`): a `#[distributed_lock(key =
/// "..")]` fn without `mode` excludes readers and writers of that key.
///
/// ```no_run
/// use lock_core::{distributed_lock, LockError, Locker};
///
/// struct Catalogue {
///     locker: Locker,
/// }
///
/// impl Catalogue {
///     /// Many at once.
///     #[distributed_lock(key = "catalogue:<shop>", mode = "read", locker = self.locker)]
///     async fn price(&self, shop: u32, sku: u64) -> Result<u64, LockError> {
///         let _ = (shop, sku);
///         Ok(100)
///     }
///
///     /// Alone: no reader sees the catalogue half rewritten.
///     #[distributed_lock(key = "catalogue:<shop>", mode = "write", locker = self.locker)]
///     async fn reprice(&self, shop: u32, percent: u32) -> Result<(), LockError> {
///         let _ = (shop, percent);
///         Ok(())
///     }
/// }
/// ```
///
/// A waiting writer is not starved: new readers wait behind it. Within one task, a read inside
/// the task's own write of the key nests; a write inside its own read fails at once with
/// `LockError::WriteInsideRead` (a read lock cannot be upgraded: it would wait for itself).
///
/// # The fencing token: `fence`
///
/// A lock alone cannot stop a holder that lost it without knowing (a pause longer than its
/// lease, a partition) from writing after the next holder did. A fencing token can: it is
/// strictly greater for every later holder of the key, so the database can refuse a write
/// that carries an older one. `fence = <name>` binds the held lock's `lock_core::Fence` to
/// `<name>` in the body; `<name>.token().await?` is the fencing token, the one
/// `LockGuard::fencing_token` gives for the same acquisition.
///
/// ```no_run
/// use lock_core::{distributed_lock, LockError, Locker};
///
/// struct Inventory {
///     locker: Locker,
/// }
///
/// impl Inventory {
///     #[distributed_lock(key = "inventory:<sku>", wait = "3s", locker = self.locker, fence = fence)]
///     async fn reserve(&self, sku: u64) -> Result<u64, LockError> {
///         let token = fence.token().await?;
///         // UPDATE skus SET stock = stock - 1, last_fence = ?token
///         //   WHERE id = ?sku AND last_fence < ?token
///         let _ = sku;
///         Ok(token)
///     }
/// }
/// ```
///
/// - The token is issued by Redis on the first `token()` (one round trip, and only while the
///   lock is still ours: a holder that lost it gets `LockError::Lost`, never a token); later
///   calls return it without a round trip. A body that binds the fence and never asks pays
///   nothing.
/// - The `Fence` is an owned handle (`Clone`, `Send`, `'static`), so it can go with the
///   work to another task or into a `move` closure; it belongs to this acquisition only.
/// - With `keys = [..]`, `<name>` is an array `[Fence; N]`, one fence per template **in the
///   order the templates are written** (not the sorted order the keys are locked in), so
///   `let [debit, credit] = fences;` matches `keys = ["account:<from>", "account:<to>"]`
///   whatever the values. Equal keys (a transfer from an account to itself) are locked once
///   and share one fence, so they get the same token.
/// - `mode = "read"` has no fencing token (readers hold the key together, so no token could
///   order their writes): `fence` with it is a compile error, as is a name that is not an
///   identifier or that hides a parameter of the fn.
///
/// `fence` rather than the guard itself: the macro owns the guard (it watches it for loss and
/// releases it on every path), and a guard the body could release or move would undo that.
///
/// # Skip when busy: `on_busy = "skip"`
///
/// For work that should run in one instance only (a scheduled job every instance starts):
/// try the lock once and, if another holder has it, return at once without running the body,
/// quietly (a debug-level log, and the acquire counted as `skipped` in the metrics). The fn
/// says it was skipped through its return type, which must be able to:
///
/// | return type | skipped | other lock failures |
/// |---|---|---|
/// | `Option<T>` | `None` | `None`, logged (warn: Redis unavailable or the lock lost; error: anything else) |
/// | `()` (or none) | `()` | `()`, logged as above |
/// | `Result<Option<T>, E>` | `Ok(None)` | `Err(E::from(error))`, with `E: From<LockError>` |
/// | `Result<(), E>` | `Ok(())` | `Err(E::from(error))` |
///
/// Prefer a `Result` where the caller must hear that Redis was unavailable: with `Option` or
/// `()` that is only in the log.
///
/// ```no_run
/// use lock_core::{distributed_lock, LockError, Locker};
///
/// struct Reports {
///     locker: Locker,
/// }
///
/// impl Reports {
///     /// Every instance calls this at midnight; one sends the report.
///     #[distributed_lock(key = "report:<day>", on_busy = "skip", locker = self.locker)]
///     async fn send_daily(&self, day: u32) -> Result<Option<usize>, LockError> {
///         let recipients = 3; // build and send it
///         let _ = day;
///         Ok(Some(recipients))
///     }
/// }
/// ```
///
/// The wait is zero unless `wait` is given, then it is how long the fn tries before it skips.
/// Keep it zero for work that must run once per schedule: with a wait, an instance that
/// starts a little late gets the lock after the first one finished and runs the work again.
/// Without the macro it is `locker.lock(key).skip_if_busy().with_lock(..)`
/// (`lock_core::SkipIfBusy`). `on_busy = "error"` (the default) returns `LockError::Busy`
/// through the fn's error. A return type that cannot say "skipped" (`-> u32`,
/// `-> Result<u32, E>`) is a compile error.
///
/// # The key template
///
/// Literal text with placeholders: `<name>` is a parameter of the fn, `<name.field.sub>` a
/// field of one (tuple fields too: `<pair.0>`), `<self.field>` a field of the receiver. Each
/// placeholder is formatted with `Display`, so `key = "order:<order.id>"` for `order.id == 7`
/// locks `"order:7"`. Write `<<` for a literal `<` (a `>` outside a placeholder is literal).
/// A placeholder that names no parameter is a compile error that lists the parameters.
///
/// Distinct arguments always give distinct keys. With `key = "pair:<a>:<b>"`, the calls
/// (`"x:y"`, `"z"`) and (`"x"`, `"y:z"`) must not share a lock, so a value followed by text is
/// written with a `\` before each `\` and before each occurrence of the first character of
/// that text: they lock `pair:x\:y:z` and `pair:x:y:z`. A value that ends the key is written
/// as it is, as `lock-tower`'s layer writes its keys (the prefix, then the value): `key =
/// "inventory:<sku>"` and a layer's `KeyFrom::path_param("sku").prefix("inventory:")` lock
/// the same key for every SKU. Values without those characters (ids, numbers) appear as they
/// are. Two placeholders with no text between them (`<a><b>`), and text after a placeholder
/// that starts with `\`, are compile errors: no escaping could keep those keys apart.
///
/// # When the lock is lost: `on_lost`
///
/// The kit can learn while the body runs that the lock is no longer ours: the watchdog's
/// renewal found another owner or no key, or renewals failed until the lease ran out (Redis
/// unreachable, a long pause). From that moment another process may hold the lock and be
/// writing.
///
/// - `on_lost = "abort"` (the default) stops the body at its next `.await` (its future is
///   dropped) and the fn returns `LockError::Lost` converted into its error type.
/// - `on_lost = "continue"` lets the body finish; the release then fails and a `tracing`
///   warning is logged, and the body's result is returned.
///
/// Abort is the default because the lock exists for correctness: once another holder may have
/// come in, every further write of this body is a write without mutual exclusion, exactly the
/// race the lock was taken to prevent. Stopping early turns a silent double write into an error
/// the caller sees and can retry. Choose `"continue"` only for bodies that are safe to finish
/// anyway (idempotent work, or writes guarded by a fencing token or a conditional update), or
/// where a half-done body would be worse than a duplicate. Aborting drops the body's future at
/// an `.await`, so a body whose partial effects matter should be written with that in mind (a
/// transaction that is not committed rolls back). Neither mode can stop a write that is already
/// in flight: for that, pass the lock's fencing token to the database (`fence = ..`,
/// [below](#the-fencing-token-fence)).
///
/// # Requirements on the fn
///
/// - It is `async` (or an `#[async_trait]` method: put `#[distributed_lock]` on the method
///   inside the `#[async_trait] impl`).
/// - It returns `Result<T, E>` (or an alias of it) where `E: From<LockError>`
///   (`anyhow::Error` qualifies); with `on_busy = "skip"`, one of the return types
///   [above](#skip-when-busy-on_busy--skip).
///
/// It works on free fns, `&self` / `&mut self` / `self` methods, trait impl methods, generic
/// fns, fns with `impl Trait` arguments and lifetimes. Docs, attributes, visibility and `where`
/// clauses are kept, and `#[tracing::instrument]` can stand above or below it. The returned
/// future is `Send` when the body's is.
///
/// # Reentrancy
///
/// Locks are reentrant per tokio task: a locked fn that calls another locked fn with the same
/// key (on the same locker) gets the lock at once without a Redis round trip, and the key is
/// released when the outer fn returns. Futures joined inside one task (`join!`, `select!`) are
/// one owner and do not exclude each other; spawn tasks to get separate owners.
///
/// # Equivalent code without the macro
///
/// The example above expands to about this: lock-core's closure API, which the generated code
/// calls (with absolute paths, and a return-type anchor so that type errors in the body are
/// reported on your code):
///
/// ```no_run
/// # use std::time::Duration;
/// # use lock_core::{LockError, Locker, OnLost};
/// # #[derive(Debug)] enum AppError { Lock(LockError), OutOfStock }
/// # impl From<LockError> for AppError { fn from(e: LockError) -> Self { Self::Lock(e) } }
/// # struct Inventory { locker: Locker }
/// impl Inventory {
///     async fn reserve(&self, sku_id: u64, qty: u32) -> Result<u32, AppError> {
///         let locker: &Locker = &self.locker; // or Locker::global()?
///         locker
///             .lock(format!("inventory:{}", sku_id))
///             .wait(Duration::from_secs(3))
///             .on_lost(OnLost::Abort) // on_lost = "abort", the default
///             .with_lock(move |_fence| async move {
///                 let stock = 10;
///                 if stock < qty {
///                     return Err(AppError::OutOfStock);
///                 }
///                 Ok(stock - qty)
///             })
///             .await
///     }
/// }
/// ```
///
/// `with_lock` acquires (a lock failure is the fn's error through `From`, and the body does not
/// run), runs the body, stops it at its next `.await` if the lock is lost (or, with
/// `on_lost = "continue"`, lets it finish), and releases on every path, a panic included.
/// With `mode = "read"` the acquire is `locker.read(..)` instead of `locker.lock(..)`; with
/// `keys` it is `locker.lock_all([format!(..), format!(..)])`, whose `with_lock` hands the body
/// the fence of every key. With `fence = fence`, the closure's argument is bound to `fence`
/// (with `keys`: the fence of each formatted key, in template order).
///
/// # Errors
///
/// Besides the body's own errors, the fn returns (converted with `From`):
/// `LockError::Busy` when the lock (any of `keys`) stayed held by another owner for the whole
/// `wait` (not with `on_busy = "skip"`: the fn is skipped), `LockError::WriteInsideRead` when
/// the task holds the key's read lock and the fn takes its write lock,
/// `LockError::Lost` when it was lost while the body ran (with `on_lost = "abort"`),
/// `LockError::NotConfigured` when no `locker` is given and `Locker::set_global` was never
/// called, `LockError::InvalidKey` for a formatted key that is empty or too long,
/// `LockError::Backend` when Redis is unreachable or fails.
///
/// # Cancel safety
///
/// Dropping the fn's future while it waits for the lock gives up the wait and leaves nothing
/// behind; dropping it while the body runs drops the body and releases the lock in the
/// background.
///
/// # Panics
///
/// The generated code does not panic. A panic in the body unwinds through the guard, which
/// releases the lock in the background.
///
/// # Compile errors
///
/// Each is reported on the offending token with what to write instead: a missing `key` (or
/// `keys`); both `key` and `keys`; an empty `keys = []`, a `keys` that is no bracketed list of
/// strings, a template listed twice; an unknown `mode`, or `mode = "read"` with `keys`; an
/// unknown or repeated option; a value of the wrong kind (`wait = 5`); a `fence` value that is
/// not a plain name, that names a parameter, or `fence` with `mode = "read"`; a malformed duration or
/// a lease under 1 ms; an unclosed `<` or an empty `<>` in the template; a placeholder naming no
/// parameter, or naming `self` in a fn without a receiver; a non-`async` fn; a fn without a
/// return type. A body whose error type lacks `From<LockError>` is reported by rustc on the
/// return type.
///
/// The doc examples are `no_run`: they need a Redis server. The crate's tests run the same
/// shapes against a real `redis-server`.
#[proc_macro_attribute]
pub fn distributed_lock(
    attr: proc_macro::TokenStream,
    item: proc_macro::TokenStream,
) -> proc_macro::TokenStream {
    let item = TokenStream::from(item);
    match lock(attr.into(), item.clone()) {
        Ok(expanded) => expanded.into(),
        // The item stays as written, so the rest of the crate (and the IDE) still sees the fn
        // and the macro's error is the only one.
        Err(error) => {
            let mut tokens = item;
            tokens.extend(error.into_compile_error());
            tokens.into()
        }
    }
}

/// Parses and checks the attribute and the fn, then expands; only the first two can fail.
fn lock(attr: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    // Both are parsed (and the options checked) before either error is returned, so a broken
    // attribute on a broken item reports both.
    let options = syn::parse2::<attr::Args>(attr).and_then(valid::options);
    let item = syn::parse2::<item::ItemFn>(item);
    let (options, item) = match (options, item) {
        (Ok(options), Ok(item)) => (options, item),
        (Err(mut first), Err(second)) => {
            first.combine(second);
            return Err(first);
        }
        (Err(error), Ok(_)) | (Ok(_), Err(error)) => return Err(error),
    };
    let locked = valid::locked_fn(options, &item)?;
    Ok(expand::locked_fn(&locked))
}
