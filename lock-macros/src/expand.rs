//! Code generation for a checked fn: it keeps its signature; its body acquires the lock, runs
//! the user's body in its own `async move` block under the guard, and releases.

use proc_macro2::{Group, Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, Index, LitChar, LitStr, Type};

use crate::item::{BoxedAsync, ItemFn};
use crate::key::{Field, Part, Root, Template};
use crate::ty::{erase_impl_trait, error_type_span};
use crate::valid::{Body, Locked, Locks, Mode, OnBusy, OnLost, Options};

/// The fn with its body run under the lock.
pub(crate) fn locked_fn(locked: &Locked<'_>) -> TokenStream {
    let Locked {
        options,
        locks,
        item,
        body,
    } = locked;
    let ItemFn {
        attrs,
        vis,
        sig,
        brace,
        inner_attrs,
        stmts,
    } = item;
    let body = match body {
        Body::AsyncFn { ret } => {
            let ret: &Type = ret;
            let anchor = return_anchor(ret);
            let user_body = quote_spanned!(brace.span.join()=> { #(#stmts)* });
            locked_body(
                options,
                locks,
                error_type_span(ret),
                quote!(#anchor #user_body),
            )
        }
        Body::AsyncTrait {
            boxed:
                BoxedAsync {
                    before,
                    box_pin,
                    block,
                },
            output,
            ret,
        } => {
            // async-trait's block already starts with its own return-type anchor.
            let inner = &block.block.stmts;
            let error_span = error_type_span(output.unwrap_or(ret));
            let body = locked_body(options, locks, error_span, quote!(#(#inner)*));
            let anchor = output.map(return_anchor);
            let async_attrs = &block.attrs;
            quote! {
                #(#before)*
                #box_pin(#(#async_attrs)* async move { #anchor #body })
            }
        }
    };
    quote! {
        #(#attrs)*
        #vis #sig {
            #(#inner_attrs)*
            #body
        }
    }
}

/// Acquire (one key exclusively or for reading, or all of `keys`) and run `body` (the contents
/// of an `async move` block that evaluates to the fn's `Result`) under the lock with lock-core's
/// public closure API, `Acquire::with_lock` / `AcquireAll::with_lock`, configured with the
/// attribute's `wait`, `lease` and `on_lost`. Errors of the lock become the fn's error via
/// `From`; that code is spanned on the return type's error type (`error_span`), so a missing
/// `From<LockError>` impl or a return type that is no `Result` is reported there.
fn locked_body(
    options: &Options,
    locks: &Locks,
    error_span: Span,
    body: TokenStream,
) -> TokenStream {
    let krate = &options.krate;
    let private = quote!(#krate::__private);
    let locker = Ident::new("__lock_locker", Span::mixed_site());
    let locker_ref = Ident::new("__lock_locker_ref", Span::mixed_site());
    let key_var = Ident::new("__lock_key", Span::mixed_site());
    let fences = Ident::new("__lock_fences", Span::mixed_site());
    let value = Ident::new("__lock_value", Span::mixed_site());
    // Spanned (with call-site hygiene: rustc reports mixed-site spans of an external macro at
    // the attribute) where the conversion of a `LockError` fails; only this match arm sees it.
    let error = Ident::new("__lock_error", error_span);

    // `&(expr)` in a `let` initializer extends the life of a temporary, so `locker = make()`
    // works as well as `locker = self.locker` (`Locker`, `&Locker`, `Arc<Locker>`: any
    // `AsRef<Locker>`).
    let find_locker = match &options.locker {
        Some(expr) => {
            let call = quote_spanned!(expr.span()=> #private::locker(::core::option::Option::Some(#locker_ref)));
            quote! {
                let #locker_ref = &(#expr);
                let #locker = #call;
            }
        }
        None => quote! {
            let #locker = #private::locker::<#private::Locker>(::core::option::Option::None);
        },
    };
    let skip = options.on_busy == OnBusy::Skip;
    // A lock failure before the acquire: the fn's error, or (skipping) what the fn's return
    // type makes of it.
    let bail = if skip {
        let failed = respan(quote!(#private::Skippable::failed), error_span);
        quote_spanned! {error_span=>
            ::core::result::Result::Err(#error) => {
                return #failed(#error);
            }
        }
    } else {
        quote_spanned! {error_span=>
            ::core::result::Result::Err(#error) => {
                return ::core::result::Result::Err(::core::convert::From::from(#error));
            }
        }
    };
    // Inside the closure, whose error type is `LockError` when skipping.
    let bail_in_body = if skip {
        quote! {
            ::core::result::Result::Err(#error) => {
                return ::core::result::Result::Err(#error);
            }
        }
    } else {
        bail.clone()
    };
    let on_lost = match options.on_lost {
        OnLost::Abort => quote!(#krate::OnLost::Abort),
        OnLost::Continue => quote!(#krate::OnLost::Continue),
    };
    // The key (or the keys, in the order written: lock-core sorts them), the builder that
    // takes it the way the attribute says, and what the closure binds for `fence = <name>`.
    let (key_type, key_value, builder, acquire, param, fence) = match locks {
        Locks::One { key, mode } => {
            let key = key_expr(key, &private);
            let method = match mode {
                Mode::Write => quote!(lock),
                Mode::Read => quote!(read),
            };
            let acquire = quote!(#krate::Locker::#method(#locker, #key_var));
            // valid.rs refuses `fence` with `mode = "read"`: only the write lock reaches here
            // with a name.
            let (param, fence) = match &options.fence {
                Some(name) => (
                    quote!(#fences: #krate::Fence),
                    Some(quote!(let #name: #krate::Fence = #fences;)),
                ),
                None => (quote!(_: #krate::Fence), None),
            };
            (
                quote!(::std::string::String),
                key,
                quote!(#krate::Acquire),
                acquire,
                param,
                fence,
            )
        }
        Locks::All(keys) => {
            let count = keys.len();
            let keys = keys.iter().map(|key| key_expr(key, &private));
            let fence_param = quote!(::std::vec::Vec<#krate::Fence>);
            let (acquire, param, fence) = match &options.fence {
                None => (
                    quote!(#krate::Locker::lock_all(#locker, #key_var)),
                    quote!(_: #fence_param),
                    None,
                ),
                // The keys are kept to find each one's fence among those of the closure (in
                // lock order), so that the body gets them in the order the templates are
                // written.
                Some(name) => (
                    quote!(#krate::Locker::lock_all(#locker, ::core::clone::Clone::clone(&#key_var))),
                    quote!(#fences: #fence_param),
                    Some(quote! {
                        #[allow(clippy::useless_conversion)]
                        let #name: [#krate::Fence; #count] = match #private::fences(&#fences, &#key_var) {
                            ::core::result::Result::Ok(#value) => #value,
                            #bail_in_body
                        };
                    }),
                ),
            };
            (
                quote!([::std::string::String; #count]),
                quote!([#(#keys),*]),
                quote!(#krate::AcquireAll),
                acquire,
                param,
                fence,
            )
        }
    };
    let mut acquire = acquire;
    if let Some(wait) = duration(options.wait) {
        acquire = quote!(#builder::wait(#acquire, #wait));
    }
    if let Some(lease) = duration(options.lease) {
        acquire = quote!(#builder::lease(#acquire, #lease));
    }
    let acquire = quote!(#builder::on_lost(#acquire, #on_lost));
    // The whole call is spanned on the return type, so that an error type without
    // `From<LockError>` or a body that is no `Result` is reported there.
    let run_call = if skip {
        // The body's value, whatever its type, is the closure's `Ok`; a skip and the lock's
        // errors become that type through `Skippable`, whose bound explains a type that
        // cannot say "skipped".
        let with_lock = respan(
            quote!(#krate::SkipIfBusy::<#builder>::with_lock),
            error_span,
        );
        let finish = respan(quote!(#private::Skippable::finish), error_span);
        let body_block = quote_spanned! {error_span=>
            async move {
                #fence
                ::core::result::Result::Ok::<_, #private::LockError>(async move { #body }.await)
            }
        };
        quote_spanned! {error_span=>
            #finish(#with_lock(#builder::skip_if_busy(#acquire), move |#param| #body_block).await)
        }
    } else {
        let with_lock = respan(quote!(#builder::with_lock), error_span);
        let body_block = quote_spanned!(error_span=> async move { #fence #body });
        quote_spanned!(error_span=> #with_lock(#acquire, move |#param| #body_block).await)
    };
    quote! {
        #find_locker
        // `From::from` is the identity when the fn's error type is `LockError` itself.
        #[allow(clippy::useless_conversion)]
        let #locker = match #locker {
            ::core::result::Result::Ok(#value) => #value,
            #bail
        };
        let #key_var: #key_type = #key_value;
        #run_call
    }
}

/// An expression of type `String`: the key for this call. Values go through the kit's
/// `KeyBuilder` (under `private`), which escapes each one followed by text against its
/// boundary so that distinct values give distinct keys, and writes the one that ends the key
/// as it is.
fn key_expr(key: &Template, private: &TokenStream) -> TokenStream {
    let span = key.lit.span();
    if !key
        .parts
        .iter()
        .any(|part| matches!(part, Part::Placeholder { .. }))
    {
        // The parsed text, not the literal: `<<` in it stands for `<`.
        let text: String = key
            .parts
            .iter()
            .filter_map(|part| match part {
                Part::Text(text) => Some(text.as_str()),
                Part::Placeholder { .. } => None,
            })
            .collect();
        let key = LitStr::new(&text, span);
        return quote!(::std::string::String::from(#key));
    }
    let builder = Ident::new("__lock_key_builder", Span::mixed_site());
    let steps = key.parts.iter().map(|part| match part {
        Part::Text(text) => {
            let text = LitStr::new(text, span);
            quote!(#private::KeyBuilder::text(&mut #builder, #text);)
        }
        Part::Placeholder {
            root,
            fields,
            boundary,
        } => {
            let boundary = match boundary {
                Some(c) => {
                    let c = LitChar::new(*c, span);
                    quote!(::core::option::Option::Some(#c))
                }
                None => quote!(::core::option::Option::None),
            };
            let root = match root {
                Root::SelfValue => quote_spanned!(span=> self),
                Root::Param(ident) => quote!(#ident),
            };
            let fields = fields.iter().map(|field| match field {
                Field::Named(ident) => quote!(. #ident),
                Field::Index(index) => {
                    let index = Index {
                        index: *index,
                        span,
                    };
                    quote!(. #index)
                }
            });
            // Spanned on the template: a value without `Display` is reported there.
            quote_spanned!(span=> #private::KeyBuilder::value(&mut #builder, &(#root #(#fields)*), #boundary);)
        }
    });
    quote!({
        let mut #builder = #private::KeyBuilder::new();
        #(#steps)*
        #private::KeyBuilder::finish(#builder)
    })
}

/// The tokens with every span set to `span` (their hygiene becomes call-site).
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            if let TokenTree::Group(group) = &token {
                let mut new = Group::new(group.delimiter(), respan(group.stream(), span));
                new.set_span(span);
                token = TokenTree::Group(new);
            } else {
                token.set_span(span);
            }
            token
        })
        .collect()
}

/// `Duration::new(s, n)`, exact and computed at compile time, for a setting that was given.
fn duration(value: Option<std::time::Duration>) -> Option<TokenStream> {
    value.map(|d| {
        let secs = d.as_secs();
        let nanos = d.subsec_nanos();
        quote!(::core::time::Duration::new(#secs, #nanos))
    })
}

/// A never-taken `return` of the declared type as the first statement of the body's block, so
/// that the block's type is inferred from the signature and type errors point at the user's
/// code, not at the generated wrapper.
fn return_anchor(ret: &Type) -> TokenStream {
    let span = ret.span();
    let ret = erase_impl_trait(ret);
    quote_spanned! {span=>
        #[allow(
            unknown_lints,
            unreachable_code,
            clippy::diverging_sub_expression,
            clippy::empty_loop,
            clippy::let_unit_value,
            clippy::let_with_type_underscore,
            clippy::needless_return,
            clippy::unreachable
        )]
        if false {
            let __lock_fake_return: #ret = loop {};
            return __lock_fake_return;
        }
    }
}
