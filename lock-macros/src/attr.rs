//! The attribute's options as written: `#[distributed_lock(key = "..", wait = "3s", ..)]`.
//!
//! Only the grammar is checked here: known option names, each at most once, each with `=` and
//! a value of the right kind (a string literal; a bracketed list of them for `keys`; any
//! expression for `locker` and `fence`). What a value means (a duration, an `on_lost` or `mode`
//! word, a path, a key template, a name to bind) and how options combine are checked in
//! `valid.rs`.

use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{bracketed, token, Expr, ExprLit, Ident, Lit, LitStr, Token};

mod kw {
    syn::custom_keyword!(key);
    syn::custom_keyword!(keys);
    syn::custom_keyword!(mode);
    syn::custom_keyword!(wait);
    syn::custom_keyword!(lease);
    syn::custom_keyword!(locker);
    syn::custom_keyword!(on_lost);
    syn::custom_keyword!(on_busy);
    syn::custom_keyword!(fence);
}

/// The options in the order the docs list them, for "expected one of" messages.
const OPTIONS: &str =
    "`key`, `keys`, `mode`, `wait`, `lease`, `locker`, `on_lost`, `on_busy`, `fence`, `crate`";

/// The options of one `#[distributed_lock(..)]`, each as written (`None`: left out).
pub(crate) struct Args {
    pub(crate) key: Option<LitStr>,
    pub(crate) keys: Option<KeyList>,
    pub(crate) mode: Option<LitStr>,
    pub(crate) wait: Option<LitStr>,
    pub(crate) lease: Option<LitStr>,
    pub(crate) locker: Option<Expr>,
    pub(crate) on_lost: Option<LitStr>,
    pub(crate) on_busy: Option<LitStr>,
    /// `fence = <name>`: the value as written, checked to be a plain name in `valid.rs` (parsed
    /// as an expression so that `fence = self` or `fence = "f"` get a message of ours).
    pub(crate) fence: Option<Expr>,
    pub(crate) krate: Option<LitStr>,
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut args = Self {
            key: None,
            keys: None,
            mode: None,
            wait: None,
            lease: None,
            locker: None,
            on_lost: None,
            on_busy: None,
            fence: None,
            krate: None,
        };

        while !input.is_empty() {
            if input.peek(kw::keys) {
                let kw = input.parse::<kw::keys>()?;
                let list = key_list(&kw, input)?;
                if args.key.is_some() {
                    return Err(key_and_keys(&kw));
                }
                set_once(&mut args.keys, &kw, list)?;
            } else if input.peek(kw::key) {
                let kw = input.parse::<kw::key>()?;
                let lit = string_value(&kw, input, "key = \"order:<order_id>\"")?;
                if args.keys.is_some() {
                    return Err(key_and_keys(&kw));
                }
                set_once(&mut args.key, &kw, lit)?;
            } else if input.peek(kw::mode) {
                let kw = input.parse::<kw::mode>()?;
                let lit = string_value(&kw, input, "mode = \"read\"")?;
                set_once(&mut args.mode, &kw, lit)?;
            } else if input.peek(kw::wait) {
                let kw = input.parse::<kw::wait>()?;
                let lit = string_value(&kw, input, "wait = \"3s\"")?;
                set_once(&mut args.wait, &kw, lit)?;
            } else if input.peek(kw::lease) {
                let kw = input.parse::<kw::lease>()?;
                let lit = string_value(&kw, input, "lease = \"10s\"")?;
                set_once(&mut args.lease, &kw, lit)?;
            } else if input.peek(kw::locker) {
                let kw = input.parse::<kw::locker>()?;
                expect_eq(&kw, input, "locker = self.locker")?;
                let expr = input.parse::<Expr>()?;
                set_once(&mut args.locker, &kw, expr)?;
            } else if input.peek(kw::on_lost) {
                let kw = input.parse::<kw::on_lost>()?;
                let lit = string_value(&kw, input, "on_lost = \"abort\"")?;
                set_once(&mut args.on_lost, &kw, lit)?;
            } else if input.peek(kw::on_busy) {
                let kw = input.parse::<kw::on_busy>()?;
                let lit = string_value(&kw, input, "on_busy = \"skip\"")?;
                set_once(&mut args.on_busy, &kw, lit)?;
            } else if input.peek(kw::fence) {
                let kw = input.parse::<kw::fence>()?;
                expect_eq(&kw, input, "fence = fence")?;
                let expr = input.parse::<Expr>()?;
                set_once(&mut args.fence, &kw, expr)?;
            } else if input.peek(Token![crate]) {
                let kw = input.parse::<Token![crate]>()?;
                let lit = string_value(&kw, input, "crate = \"my_lock_core\"")?;
                set_once(&mut args.krate, &kw, lit)?;
            } else {
                return Err(unknown_option(input));
            }

            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(args)
    }
}

/// `keys = ["..", ".."]` as written: the templates, and the brackets (where an empty list is
/// reported).
pub(crate) struct KeyList {
    pub(crate) bracket: token::Bracket,
    pub(crate) templates: Vec<LitStr>,
}

/// Parses `= ["..", ..]`; each element must be a string literal (checked as a template later).
fn key_list(kw: &kw::keys, input: ParseStream<'_>) -> syn::Result<KeyList> {
    const EXAMPLE: &str = "keys = [\"account:<from>\", \"account:<to>\"]";
    expect_eq(kw, input, EXAMPLE)?;
    if !input.peek(token::Bracket) {
        let value = input.parse::<Expr>()?;
        let hint = if matches!(
            &value,
            Expr::Lit(ExprLit {
                lit: Lit::Str(_),
                ..
            })
        ) {
            " (or `key = \"..\"` for a single lock)"
        } else {
            ""
        };
        return Err(syn::Error::new_spanned(
            value,
            format!("`keys` expects a list of key templates in brackets: write `{EXAMPLE}`{hint}"),
        ));
    }
    let content;
    let bracket = bracketed!(content in input);
    let elements = Punctuated::<Expr, Token![,]>::parse_terminated(&content)?;
    let templates = elements
        .into_iter()
        .map(|element| match element {
            Expr::Lit(ExprLit {
                lit: Lit::Str(lit), ..
            }) => Ok(lit),
            other => Err(syn::Error::new_spanned(
                other,
                format!("each of `keys` is a key template string: write `{EXAMPLE}`"),
            )),
        })
        .collect::<syn::Result<_>>()?;
    Ok(KeyList { bracket, templates })
}

/// The error for `key` and `keys` in one attribute, on the one written second.
fn key_and_keys<K: ToTokens>(kw: &K) -> syn::Error {
    syn::Error::new_spanned(
        kw,
        "`key` and `keys` cannot be combined: write `key = \"..\"` for one lock, or put every \
         template in `keys = [\"..\", \"..\"]` to take them all",
    )
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
                "locks" | "lock_keys" | "key_list" | "all" => " (did you mean `keys`?)",
                "access" | "kind" | "lock_mode" => " (did you mean `mode`?)",
                "read" | "shared" | "readonly" => " (did you mean `mode = \"read\"`?)",
                "write" | "exclusive" => " (did you mean `mode = \"write\"`?)",
                "on_lose" | "lost" | "onlost" => " (did you mean `on_lost`?)",
                "onbusy" | "on_contention" | "on_locked" | "if_busy" | "when_busy" | "busy" => {
                    " (did you mean `on_busy`?)"
                }
                "skip" | "skip_if_busy" | "skip_busy" | "try_once" | "try_lock" | "single" => {
                    " (did you mean `on_busy = \"skip\"`?)"
                }
                "guard" | "token" | "fencing_token" | "fencing" | "fence_token" => {
                    " (did you mean `fence = <name>`? it binds the lock's `Fence` in the body)"
                }
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
