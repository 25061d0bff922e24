//! Every check that can fail once the attribute and the fn have parsed. Each turns what was
//! written into what the expansion needs ([`Options`], [`Locked`]), so the expansion has
//! nothing left to check and cannot fail.

use std::borrow::Cow;
use std::time::Duration;

use proc_macro2::Span;
use syn::{Expr, ExprLit, ExprPath, Ident, Lit, LitStr, Path, ReturnType, Type};

use crate::attr::{Args, KeyList};
use crate::item::{BoxedAsync, ItemFn};
use crate::key::Template;
use crate::ty::{future_output, is_surely_not_result, pretty, skip_shape, SkipShape};

/// Longest lease lock-core accepts (`lock_core::MAX_LEASE`, 365 days): a longer one is refused at
/// run time, so it is refused here already.
const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

/// What the body does when the lock is lost while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnLost {
    Abort,
    Continue,
}

/// What the fn does when the lock is busy for the whole wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnBusy {
    /// `on_busy = "error"` (the default): return `LockError::Busy` through the fn's error.
    Error,
    /// `on_busy = "skip"`: do not run the body; return `None`, `Ok(None)`, `()` or `Ok(())`.
    Skip,
}

/// How the one key of `key = ".."` is locked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `mode = "write"` (the default): the key's exclusive lock, its mutex.
    Write,
    /// `mode = "read"`: the read lock, shared with other readers.
    Read,
}

/// Which locks the fn takes, with templates not yet checked against the fn.
pub(crate) enum Target {
    /// `key = ".."`.
    One { key: LitStr, mode: Mode },
    /// `keys = [..]`, never empty: all of them, exclusively.
    All(Vec<LitStr>),
}

/// Which locks the fn takes, with checked templates.
pub(crate) enum Locks {
    One { key: Template, mode: Mode },
    All(Vec<Template>),
}

/// The checked options of one `#[distributed_lock(..)]`.
pub(crate) struct Options {
    /// The key template(s), checked against the fn's parameters by [`locked_fn`].
    pub(crate) target: Target,
    pub(crate) wait: Option<Duration>,
    pub(crate) lease: Option<Duration>,
    pub(crate) locker: Option<Expr>,
    pub(crate) on_lost: OnLost,
    pub(crate) on_busy: OnBusy,
    /// `fence = <name>`: the name the body sees the lock's `Fence` (`[Fence; N]` for `keys`)
    /// under. Never set with `mode = "read"`, and checked against the fn's parameters by
    /// [`locked_fn`].
    pub(crate) fence: Option<Ident>,
    /// Path of the lock-core crate: `::lock_core` unless `crate = ".."` says otherwise.
    pub(crate) krate: Path,
}

/// A fn that can be locked, with its checked options and key.
pub(crate) struct Locked<'a> {
    pub(crate) options: Options,
    pub(crate) locks: Locks,
    pub(crate) item: &'a ItemFn,
    pub(crate) body: Body<'a>,
}

/// How the fn runs asynchronously.
pub(crate) enum Body<'a> {
    /// `async fn f(..) -> R { body }`.
    AsyncFn {
        /// The declared return type (`()` when none is written).
        ret: Cow<'a, Type>,
    },
    /// What `#[async_trait]` makes of an `async fn`: `fn f(..) -> Pin<Box<dyn Future<Output =
    /// R> + ..>> { ..; Box::pin(async move { body }) }`.
    AsyncTrait {
        boxed: BoxedAsync<'a>,
        /// `R`, when it can be read from the signature.
        output: Option<&'a Type>,
        /// The declared return type (the boxed future).
        ret: &'a Type,
    },
}

/// Checks the options' values; they do not depend on the fn, so a broken fn does not hide
/// their errors.
pub(crate) fn options(args: Args) -> syn::Result<Options> {
    let wait = args.wait.map(|lit| duration(&lit, "wait")).transpose()?;
    let lease = args.lease.map(|lit| lease(&lit)).transpose()?;
    let on_lost = args.on_lost.map(|lit| on_lost(&lit)).transpose()?;
    let on_busy = args.on_busy.map(|lit| on_busy(&lit)).transpose()?;
    let krate = args.krate.map(|lit| crate_path(&lit)).transpose()?;
    let fence = args.fence.map(|expr| fence_name(&expr)).transpose()?;
    let mode = args
        .mode
        .map(|lit| mode(&lit).map(|m| (m, lit)))
        .transpose()?;
    if let (Some(name), Some((Mode::Read, lit))) = (&fence, &mode) {
        let mut error = syn::Error::new(
            name.span(),
            format!(
                "`fence = {name}` cannot be combined with `mode = \"read\"`: a read lock has no \
                 fencing token (readers hold the key together, so no token could order their \
                 writes); drop `fence`, or take the write lock (`mode = \"write\"`) for a fn \
                 that writes"
            ),
        );
        error.combine(syn::Error::new(
            lit.span(),
            "the read lock is asked for here",
        ));
        return Err(error);
    }
    let target = match (args.key, args.keys) {
        (Some(key), _) => Target::One {
            key,
            mode: mode.map_or(Mode::Write, |(mode, _)| mode),
        },
        (None, Some(list)) => {
            if let Some((Mode::Read, lit)) = &mode {
                return Err(syn::Error::new(
                    lit.span(),
                    "`mode = \"read\"` cannot be combined with `keys`: several keys are only \
                     locked together exclusively (`Locker::lock_all`); drop `mode` to lock them \
                     all exclusively, or take one read lock with `key = \"..\"`",
                ));
            }
            Target::All(key_list(list)?)
        }
        (None, None) => {
            return Err(syn::Error::new(
                Span::call_site(),
                "missing `key`: say which lock the fn takes, e.g. \
                 `#[distributed_lock(key = \"order:<order_id>\")]` where `order_id` is a \
                 parameter, or `keys = [\"account:<from>\", \"account:<to>\"]` for several",
            ));
        }
    };
    Ok(Options {
        target,
        wait,
        lease,
        locker: args.locker,
        on_lost: on_lost.unwrap_or(OnLost::Abort),
        on_busy: on_busy.unwrap_or(OnBusy::Error),
        fence,
        krate: krate.unwrap_or_else(|| syn::parse_quote!(::lock_core)),
    })
}

/// Checks that the fn can be locked (async, returns a value) and that the key template names
/// its parameters.
pub(crate) fn locked_fn(options: Options, item: &ItemFn) -> syn::Result<Locked<'_>> {
    let body = body(item, options.on_busy)?;
    let scope = item.scope();
    if let Some(name) = &options.fence {
        // The binding is made after the key is formatted, so it would work, but the body
        // could no longer reach the parameter: almost surely a mistake, and a confusing one
        // (`fence.token()` on a `u64`).
        if let Some(param) = scope.params.iter().find(|param| *param == name) {
            let suggestion = if name == "fence" {
                "lock_fence"
            } else {
                "fence"
            };
            let mut error = syn::Error::new(
                name.span(),
                format!(
                    "`fence = {name}` would hide the parameter `{name}` in the body: name the \
                     lock's fence differently, e.g. `fence = {suggestion}`"
                ),
            );
            error.combine(syn::Error::new(
                param.span(),
                format!("`{name}` is declared here"),
            ));
            return Err(error);
        }
    }
    let locks = match &options.target {
        Target::One { key, mode } => Locks::One {
            key: Template::parse(key, &scope)?,
            mode: *mode,
        },
        // Every template is checked, so that all their mistakes are reported at once.
        Target::All(keys) => {
            let mut templates = Vec::with_capacity(keys.len());
            let mut errors: Option<syn::Error> = None;
            for key in keys {
                match Template::parse(key, &scope) {
                    Ok(template) => templates.push(template),
                    Err(error) => match &mut errors {
                        Some(first) => first.combine(error),
                        None => errors = Some(error),
                    },
                }
            }
            if let Some(errors) = errors {
                return Err(errors);
            }
            Locks::All(templates)
        }
    };
    Ok(Locked {
        options,
        locks,
        item,
        body,
    })
}

/// Parses a humantime duration ("3s", "250ms", "1m 30s").
fn duration(lit: &LitStr, name: &str) -> syn::Result<Duration> {
    let text = lit.value();
    parse_duration(text.trim()).map_err(|error| {
        syn::Error::new(
            lit.span(),
            format!(
                "invalid `{name}` duration {text:?} ({error}): write a number and a unit, \
                 e.g. \"3s\", \"250ms\", \"1m 30s\""
            ),
        )
    })
}

/// humantime's parse, of a text whose total cannot reach `u64::MAX` seconds: humantime 2.4
/// panics (`Duration::new` overflowing) when the seconds add up to exactly that and the
/// nanoseconds to exactly one second (`"18446744073709551615s 1000000000ns"`), and a panic
/// here is the compiler's "custom attribute panicked" instead of an error on the attribute.
/// The bound counts every number in the text as years (the largest unit), so it refuses only
/// totals over 500 billion years' worth of numbers, none of them a sensible wait or lease.
fn parse_duration(text: &str) -> Result<Duration, String> {
    const YEAR_SECS: u128 = 31_557_600;
    let mut bound: u128 = 0;
    // The number being read, if the last character was a digit.
    let mut number: Option<u128> = None;
    for c in text.chars().chain(std::iter::once(' ')) {
        match (c.to_digit(10), number) {
            (Some(digit), _) => {
                let value = number.unwrap_or(0).saturating_mul(10);
                number = Some(value.saturating_add(u128::from(digit)));
            }
            // A fraction's digits count as a number of their own: more than the fraction.
            (None, Some(value)) => {
                bound = bound.saturating_add(value.saturating_add(1).saturating_mul(YEAR_SECS));
                number = None;
            }
            (None, None) => {}
        }
    }
    if bound >= u128::from(u64::MAX) {
        return Err("number is too large".to_owned());
    }
    humantime::parse_duration(text).map_err(|error| error.to_string())
}

/// A duration that lock-core accepts as a lease.
fn lease(lit: &LitStr) -> syn::Result<Duration> {
    let lease = duration(lit, "lease")?;
    if lease < Duration::from_millis(1) {
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "`lease` must be at least 1ms, got {:?}: a shorter lease expires before the body \
                 runs; leave `lease` out to get the watchdog-renewed lease",
                lit.value()
            ),
        ));
    }
    if lease > MAX_LEASE {
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "`lease` must be at most 365 days, got {:?}; leave `lease` out to get the \
                 watchdog-renewed lease",
                lit.value()
            ),
        ));
    }
    Ok(lease)
}

fn on_lost(lit: &LitStr) -> syn::Result<OnLost> {
    match lit.value().as_str() {
        "abort" => Ok(OnLost::Abort),
        "continue" => Ok(OnLost::Continue),
        other => Err(syn::Error::new(
            lit.span(),
            format!(
                "unknown `on_lost` value {other:?}: write `on_lost = \"abort\"` (stop the body \
                 when the lock is lost, the default) or `on_lost = \"continue\"` (let it finish)"
            ),
        )),
    }
}

fn on_busy(lit: &LitStr) -> syn::Result<OnBusy> {
    match lit.value().as_str() {
        "error" => Ok(OnBusy::Error),
        "skip" => Ok(OnBusy::Skip),
        other => {
            let hint = match other.trim().to_ascii_lowercase().as_str() {
                "skip" | "skipped" | "skips" | "ignore" | "none" | "quiet" | "silent"
                | "return" => " (did you mean `on_busy = \"skip\"`?)",
                "error" | "err" | "fail" | "reject" | "busy" => {
                    " (did you mean `on_busy = \"error\"`?)"
                }
                _ => "",
            };
            Err(syn::Error::new(
                lit.span(),
                format!(
                    "unknown `on_busy` value {other:?}{hint}: write `on_busy = \"skip\"` (do not \
                     run the fn when another holder has the lock: it returns `None`, `Ok(None)`, \
                     `()` or `Ok(())`) or `on_busy = \"error\"` (return `LockError::Busy` \
                     through the fn's error, the default)"
                ),
            ))
        }
    }
}

fn mode(lit: &LitStr) -> syn::Result<Mode> {
    match lit.value().as_str() {
        "write" => Ok(Mode::Write),
        "read" => Ok(Mode::Read),
        other => Err(syn::Error::new(
            lit.span(),
            format!(
                "unknown `mode` value {other:?}: write `mode = \"read\"` (shared with other \
                 readers, excludes writers) or `mode = \"write\"` (exclusive, the default)"
            ),
        )),
    }
}

/// The templates of `keys = [..]`: at least one, none written twice.
fn key_list(list: KeyList) -> syn::Result<Vec<LitStr>> {
    if list.templates.is_empty() {
        return Err(syn::Error::new(
            list.bracket.span.join(),
            "`keys` is empty: list the locks the fn takes, e.g. \
             `keys = [\"account:<from>\", \"account:<to>\"]`",
        ));
    }
    for (i, lit) in list.templates.iter().enumerate() {
        let value = lit.value();
        if list.templates[..i]
            .iter()
            .any(|earlier| earlier.value() == value)
        {
            return Err(syn::Error::new(
                lit.span(),
                format!(
                    "`keys` names the template {value:?} twice: each template is one lock, \
                     remove the repeated one"
                ),
            ));
        }
    }
    Ok(list.templates)
}

/// The name of `fence = <name>`: one identifier, which the body can bind.
fn fence_name(expr: &Expr) -> syn::Result<Ident> {
    const EXAMPLE: &str = "fence = fence";
    if let Expr::Path(ExprPath {
        attrs,
        qself: None,
        path,
    }) = expr
    {
        if attrs.is_empty() {
            if let Some(ident) = path.get_ident() {
                if matches!(
                    ident.to_string().as_str(),
                    "self" | "Self" | "super" | "crate"
                ) {
                    return Err(syn::Error::new(
                        ident.span(),
                        format!(
                            "`fence = {ident}`: `{ident}` is a keyword, not a name the body can \
                             use; write e.g. `{EXAMPLE}`"
                        ),
                    ));
                }
                return Ok(ident.clone());
            }
        }
    }
    let hint = match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) if syn::parse_str::<Ident>(&lit.value()).is_ok() => {
            format!("write `fence = {}`, without quotes", lit.value())
        }
        _ => format!("write e.g. `{EXAMPLE}`"),
    };
    Err(syn::Error::new_spanned(
        expr,
        format!(
            "`fence` expects a name: the body gets the lock's `Fence` under it (its `token()` is \
             the fencing token); {hint}"
        ),
    ))
}

fn crate_path(lit: &LitStr) -> syn::Result<Path> {
    lit.parse::<Path>().map_err(|_| {
        syn::Error::new(
            lit.span(),
            format!(
                "`crate` expects the path of the lock-core crate, e.g. \
                 `crate = \"my_lock_core\"`; {:?} is not a path",
                lit.value()
            ),
        )
    })
}

/// The fn is async (or the `#[async_trait]` shape) and returns a value that can be a `Result`
/// (with `on_busy = "skip"`: a value that can say the fn was skipped).
fn body(item: &ItemFn, on_busy: OnBusy) -> syn::Result<Body<'_>> {
    let sig = &item.sig;
    if sig.asyncness.is_none() {
        if let (Some(boxed), ReturnType::Type(_, ret)) = (item.boxed_async(), &sig.output) {
            let output = future_output(ret);
            if let (OnBusy::Skip, Some(output)) = (on_busy, output) {
                can_skip(output)?;
            }
            return Ok(Body::AsyncTrait { boxed, output, ret });
        }
        return Err(syn::Error::new(
            sig.fn_token.span,
            format!(
                "`#[distributed_lock]` requires an async fn: write `async fn {}`",
                sig.ident
            ),
        ));
    }
    if on_busy == OnBusy::Skip {
        return Ok(Body::AsyncFn {
            ret: match &sig.output {
                ReturnType::Type(_, ty) => {
                    can_skip(ty)?;
                    Cow::Borrowed(&**ty)
                }
                ReturnType::Default => Cow::Owned(syn::parse_quote_spanned!(sig.ident.span()=> ())),
            },
        });
    }
    // `Option` and `()` can say "skipped": the fn may have wanted that.
    let skip_hint = "; or, to skip the fn quietly while another holder has the lock, add \
                     `on_busy = \"skip\"`";
    match &sig.output {
        ReturnType::Type(_, ty) if is_surely_not_result(ty) => {
            let hint = match skip_shape(ty) {
                SkipShape::Fits => skip_hint,
                _ => "",
            };
            let ty = pretty(ty);
            Err(syn::Error::new_spanned(
                &sig.output,
                format!(
                    "`#[distributed_lock]` needs a fn that returns `Result<T, E>` with \
                     `E: From<LockError>` (the lock can fail), not `{ty}`: return e.g. \
                     `Result<{ty}, AppError>`{hint}"
                ),
            ))
        }
        ReturnType::Type(_, ty) => Ok(Body::AsyncFn {
            ret: Cow::Borrowed(&**ty),
        }),
        ReturnType::Default => Err(syn::Error::new(
            sig.ident.span(),
            format!(
                "`#[distributed_lock]` needs a fn that returns `Result<T, E>` with \
                 `E: From<LockError>` (the lock can fail): add a return type such as \
                 `-> Result<(), AppError>`{skip_hint}"
            ),
        )),
    }
}

/// With `on_busy = "skip"`: the return type can say the fn was skipped, as far as the macro
/// can read it (an alias is left to the type checker, which lock-core's `Skippable` bound
/// explains).
fn can_skip(ty: &Type) -> syn::Result<()> {
    match skip_shape(ty) {
        SkipShape::Fits | SkipShape::Unknown => Ok(()),
        SkipShape::Refused { at, instead } => Err(syn::Error::new_spanned(
            at,
            format!(
                "`on_busy = \"skip\"` needs a return type that can say the fn was skipped: \
                 `Option<T>` (skipped: `None`), `Result<Option<T>, E>` (`Ok(None)`), `()` or \
                 `Result<(), E>` (`Ok(())`), not `{}`: return `{instead}`",
                pretty(ty)
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_as_humantime_does() {
        for (text, secs) in [
            ("3s", 3),
            ("1m 30s", 90),
            ("1h", 3600),
            ("100y", 3_155_760_000),
        ] {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_secs(secs)),
                "{text}"
            );
        }
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert!(parse_duration("3").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn totals_that_make_humantime_panic_are_an_error() {
        // humantime 2.4 panics on each of these (its carry of exactly one second).
        for text in [
            "18446744073709551615s 1000000000ns",
            "18446744073709551615s 999999999ns 1ns",
            "18446744073709551615s 500ms 500ms",
            "18446744073709551614s 1s 1000000000ns",
        ] {
            assert_eq!(
                parse_duration(text),
                Err("number is too large".to_owned()),
                "{text}"
            );
        }
        // Near the bound, and far beyond it, never a panic.
        for text in [
            "584542046090y",
            "584542046091y",
            "99999999999999999999999999999999999s",
        ] {
            assert!(parse_duration(text).is_err(), "{text}");
        }
        assert!(parse_duration("500000000000y").is_ok());
    }
}
