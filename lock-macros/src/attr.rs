//! Parsing and validation of the attribute's options: `#[distributed_lock(key = "..", ..)]`.

use std::time::Duration;

use proc_macro2::Span;
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::{Expr, ExprLit, Ident, Lit, LitStr, Path, Token};

mod kw {
    syn::custom_keyword!(key);
    syn::custom_keyword!(wait);
    syn::custom_keyword!(lease);
    syn::custom_keyword!(locker);
    syn::custom_keyword!(on_lost);
}

/// The options in the order the docs list them, for "expected one of" messages.
const OPTIONS: &str = "`key`, `wait`, `lease`, `locker`, `on_lost`, `crate`";

/// Longest lease lock-core accepts (`lock_core::MAX_LEASE`, 365 days): a longer one is refused at
/// run time, so it is refused here already.
const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

/// What the body does when the lock is lost while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnLost {
    Abort,
    Continue,
}

/// The validated options of one `#[distributed_lock(..)]`.
pub(crate) struct Options {
    /// The key template, parsed later against the fn's parameters (see `key.rs`).
    pub(crate) key: LitStr,
    pub(crate) wait: Option<Duration>,
    pub(crate) lease: Option<Duration>,
    pub(crate) locker: Option<Expr>,
    pub(crate) on_lost: OnLost,
    /// Path of the lock-core crate: `::lock_core` unless `crate = ".."` says otherwise.
    pub(crate) krate: Path,
}

impl Parse for Options {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut key = None;
        let mut wait = None;
        let mut lease = None;
        let mut locker = None;
        let mut on_lost = None;
        let mut krate = None;

        while !input.is_empty() {
            if input.peek(kw::key) {
                let kw = input.parse::<kw::key>()?;
                let lit = string_value(&kw, input, "key = \"order:<order_id>\"")?;
                set_once(&mut key, &kw, lit)?;
            } else if input.peek(kw::wait) {
                let kw = input.parse::<kw::wait>()?;
                let lit = string_value(&kw, input, "wait = \"3s\"")?;
                let value = duration(&lit, "wait")?;
                set_once(&mut wait, &kw, value)?;
            } else if input.peek(kw::lease) {
                let kw = input.parse::<kw::lease>()?;
                let lit = string_value(&kw, input, "lease = \"10s\"")?;
                let value = duration(&lit, "lease")?;
                check_lease(&lit, value)?;
                set_once(&mut lease, &kw, value)?;
            } else if input.peek(kw::locker) {
                let kw = input.parse::<kw::locker>()?;
                expect_eq(&kw, input, "locker = self.locker")?;
                let expr = input.parse::<Expr>()?;
                set_once(&mut locker, &kw, expr)?;
            } else if input.peek(kw::on_lost) {
                let kw = input.parse::<kw::on_lost>()?;
                let lit = string_value(&kw, input, "on_lost = \"abort\"")?;
                let value = match lit.value().as_str() {
                    "abort" => OnLost::Abort,
                    "continue" => OnLost::Continue,
                    other => {
                        return Err(syn::Error::new(
                            lit.span(),
                            format!(
                                "unknown `on_lost` value {other:?}: write `on_lost = \"abort\"` \
                                 (stop the body when the lock is lost, the default) or \
                                 `on_lost = \"continue\"` (let it finish)"
                            ),
                        ))
                    }
                };
                set_once(&mut on_lost, &kw, value)?;
            } else if input.peek(Token![crate]) {
                let kw = input.parse::<Token![crate]>()?;
                let lit = string_value(&kw, input, "crate = \"my_lock_core\"")?;
                let path = lit.parse::<Path>().map_err(|_| {
                    syn::Error::new(
                        lit.span(),
                        format!(
                            "`crate` expects the path of the lock-core crate, e.g. \
                             `crate = \"my_lock_core\"`; {:?} is not a path",
                            lit.value()
                        ),
                    )
                })?;
                set_once(&mut krate, &kw, path)?;
            } else {
                return Err(unknown_option(input));
            }

            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }

        let Some(key) = key else {
            return Err(syn::Error::new(
                Span::call_site(),
                "missing `key`: say which lock the fn takes, e.g. \
                 `#[distributed_lock(key = \"order:<order_id>\")]` where `order_id` is a parameter",
            ));
        };
        Ok(Self {
            key,
            wait,
            lease,
            locker,
            on_lost: on_lost.unwrap_or(OnLost::Abort),
            krate: krate.unwrap_or_else(|| syn::parse_quote!(::lock_core)),
        })
    }
}

/// Stores `value` in `slot`, or fails with "`x` specified more than once" on the repeated
/// keyword.
fn set_once<K: ToTokens, T>(slot: &mut Option<T>, kw: &K, value: T) -> syn::Result<()> {
    if slot.is_some() {
        let name = kw.to_token_stream().to_string();
        return Err(syn::Error::new_spanned(
            kw,
            format!("`{name}` specified more than once: keep one `{name} = ..`"),
        ));
    }
    *slot = Some(value);
    Ok(())
}

/// Parses the `=` after an option name, with a hint when it is missing.
fn expect_eq<K: ToTokens>(kw: &K, input: ParseStream<'_>, example: &str) -> syn::Result<()> {
    if input.peek(Token![=]) {
        input.parse::<Token![=]>()?;
        Ok(())
    } else {
        let name = kw.to_token_stream().to_string();
        Err(syn::Error::new_spanned(
            kw,
            format!("`{name}` needs a value: write `{example}`"),
        ))
    }
}

/// Parses `= "..."`; any other value is an error spanned on it that shows the expected form.
fn string_value<K: ToTokens>(kw: &K, input: ParseStream<'_>, example: &str) -> syn::Result<LitStr> {
    expect_eq(kw, input, example)?;
    let name = kw.to_token_stream().to_string();
    let expr = input.parse::<Expr>()?;
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Ok(lit),
        Expr::Lit(ExprLit {
            lit: lit @ (Lit::Int(_) | Lit::Float(_)),
            ..
        }) if name == "wait" || name == "lease" => {
            let text = lit.to_token_stream().to_string();
            let hint = if text.chars().last().is_some_and(|c| c.is_ascii_digit()) {
                format!("`{name} = \"{text}s\"` or `{name} = \"{text}ms\"`")
            } else {
                format!("`{name} = \"{text}\"`")
            };
            Err(syn::Error::new_spanned(
                lit,
                format!("`{name}` expects a duration string with a unit: write {hint}"),
            ))
        }
        other => Err(syn::Error::new_spanned(
            other,
            format!("`{name}` expects a string literal: write `{example}`"),
        )),
    }
}

/// Parses a humantime duration ("3s", "250ms", "1m 30s").
fn duration(lit: &LitStr, name: &str) -> syn::Result<Duration> {
    humantime::parse_duration(lit.value().trim()).map_err(|error| {
        syn::Error::new(
            lit.span(),
            format!(
                "invalid `{name}` duration {:?} ({error}): write a number and a unit, \
                 e.g. \"3s\", \"250ms\", \"1m 30s\"",
                lit.value()
            ),
        )
    })
}

fn check_lease(lit: &LitStr, lease: Duration) -> syn::Result<()> {
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
    Ok(())
}

/// The error for a token that starts no known option.
fn unknown_option(input: ParseStream<'_>) -> syn::Error {
    if input.peek(LitStr) {
        let span = input.span();
        return syn::Error::new(
            span,
            "the key template needs a name: write `key = \"order:<order_id>\"`",
        );
    }
    match input.fork().call(Ident::parse_any) {
        Ok(ident) => {
            let name = ident.to_string();
            let hint = match name.as_str() {
                "timeout" | "wait_time" | "wait_for" | "max_wait" => " (did you mean `wait`?)",
                "ttl" | "expire" | "expiry" | "lease_time" | "hold" => " (did you mean `lease`?)",
                "name" | "lock" | "lock_key" => " (did you mean `key`?)",
                "on_lose" | "lost" | "onlost" => " (did you mean `on_lost`?)",
                _ => "",
            };
            syn::Error::new(
                ident.span(),
                format!("unknown option `{name}`{hint}: expected one of {OPTIONS}"),
            )
        }
        Err(_) => syn::Error::new(input.span(), format!("expected one of {OPTIONS}")),
    }
}
