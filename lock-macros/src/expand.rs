//! Code generation: the fn keeps its signature; its body acquires the lock, runs the user's body
//! in its own `async move` block under the guard, and releases.

use proc_macro2::{Group, Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned, ToTokens};
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{
    braced, token, Attribute, Block, Expr, ExprAsync, ExprCall, FnArg, GenericArgument, Ident, Pat,
    PathArguments, ReturnType, Signature, Stmt, Token, Type, TypeParamBound, Visibility,
};

use crate::attr::{OnLost, Options};
use crate::key::{Scope, Template};

/// Entry point: the expanded fn, or on any error the untouched item plus the error, so the
/// rest of the crate (and the IDE) still sees the fn.
pub(crate) fn distributed_lock(attr: TokenStream, item: TokenStream) -> TokenStream {
    match expand(attr, item.clone()) {
        Ok(tokens) => tokens,
        Err(error) => {
            let mut tokens = item;
            tokens.extend(error.into_compile_error());
            tokens
        }
    }
}

fn expand(attr: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let (options, function) = match (syn::parse2::<Options>(attr), syn::parse2::<LockedFn>(item)) {
        (Ok(options), Ok(function)) => (options, function),
        (Err(mut first), Err(second)) => {
            first.combine(second);
            return Err(first);
        }
        (Err(error), Ok(_)) | (Ok(_), Err(error)) => return Err(error),
    };
    let shape = function.shape()?;
    let key = Template::parse(&options.key, &scope(&function.sig))?;
    Ok(function.generate(&options, &key, shape))
}

/// An fn item, split the way the expansion needs it (inner attributes apart from outer ones).
struct LockedFn {
    attrs: Vec<Attribute>,
    vis: Visibility,
    sig: Signature,
    brace: token::Brace,
    inner_attrs: Vec<Attribute>,
    stmts: Vec<Stmt>,
}

impl Parse for LockedFn {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis = input.parse::<Visibility>()?;
        let starts_fn = input.peek(Token![fn])
            || input.peek(Token![async])
            || input.peek(Token![const])
            || input.peek(Token![unsafe])
            || input.peek(Token![extern]);
        if !starts_fn {
            return Err(syn::Error::new(
                input.span(),
                "`#[distributed_lock]` applies to an `async fn` only",
            ));
        }
        let sig = input.parse::<Signature>()?;
        if input.peek(Token![;]) {
            return Err(syn::Error::new(
                input.span(),
                "`#[distributed_lock]` needs the fn's body: put it on the fn in the `impl` \
                 block, not on the trait's declaration",
            ));
        }
        let content;
        let brace = braced!(content in input);
        let inner_attrs = content.call(Attribute::parse_inner)?;
        let stmts = content.call(Block::parse_within)?;
        Ok(Self {
            attrs,
            vis,
            sig,
            brace,
            inner_attrs,
            stmts,
        })
    }
}

/// How the fn runs asynchronously.
enum Shape<'a> {
    /// `async fn f(..) -> R { body }`.
    AsyncFn {
        /// The declared return type.
        ret: &'a Type,
    },
    /// What `#[async_trait]` makes of an `async fn`: `fn f(..) -> Pin<Box<dyn Future<Output =
    /// R> + ..>> { ..; Box::pin(async move { body }) }`.
    AsyncTrait {
        /// Statements before the `Box::pin(..)` (none, with today's async-trait).
        before: &'a [Stmt],
        box_pin: &'a Expr,
        block: &'a ExprAsync,
        /// `R`, when it can be read from the signature.
        output: Option<&'a Type>,
        /// The declared return type (the boxed future).
        ret: &'a Type,
    },
}

impl LockedFn {
    /// Checks that the fn is async (or the `#[async_trait]` shape) and returns a value.
    fn shape(&self) -> syn::Result<Shape<'_>> {
        let sig = &self.sig;
        if sig.asyncness.is_none() {
            if let Some(shape) = self.async_trait_shape() {
                return Ok(shape);
            }
            return Err(syn::Error::new(
                sig.fn_token.span,
                format!(
                    "`#[distributed_lock]` requires an async fn: write `async fn {}`",
                    sig.ident
                ),
            ));
        }
        match &sig.output {
            ReturnType::Type(_, ty) if is_surely_not_result(ty) => {
                let ty = pretty(ty);
                Err(syn::Error::new_spanned(
                    &sig.output,
                    format!(
                        "`#[distributed_lock]` needs a fn that returns `Result<T, E>` with \
                         `E: From<LockError>` (the lock can fail), not `{ty}`: return e.g. \
                         `Result<{ty}, AppError>`"
                    ),
                ))
            }
            ReturnType::Type(_, ty) => Ok(Shape::AsyncFn { ret: ty }),
            ReturnType::Default => Err(syn::Error::new(
                sig.ident.span(),
                "`#[distributed_lock]` needs a fn that returns `Result<T, E>` with \
                 `E: From<LockError>` (the lock can fail): add a return type such as \
                 `-> Result<(), AppError>`",
            )),
        }
    }

    /// Recognises `Box::pin(async move { .. })` as the last statement of a non-async fn, the
    /// way tracing-attributes does for `#[async_trait]` methods.
    fn async_trait_shape(&self) -> Option<Shape<'_>> {
        let (last, before) = self.stmts.split_last()?;
        let Stmt::Expr(Expr::Call(ExprCall { func, args, .. }), None) = last else {
            return None;
        };
        let Expr::Path(path) = func.as_ref() else {
            return None;
        };
        let segments: Vec<String> = path
            .path
            .segments
            .iter()
            .map(|s| s.ident.to_string())
            .collect();
        if !segments.ends_with(&["Box".to_owned(), "pin".to_owned()]) || args.len() != 1 {
            return None;
        }
        let Expr::Async(block) = &args[0] else {
            return None;
        };
        block.capture?;
        let ReturnType::Type(_, ret) = &self.sig.output else {
            return None;
        };
        Some(Shape::AsyncTrait {
            before,
            box_pin: func,
            block,
            output: future_output(ret),
            ret,
        })
    }

    fn generate(&self, options: &Options, key: &Template, shape: Shape<'_>) -> TokenStream {
        let Self {
            attrs,
            vis,
            sig,
            brace,
            inner_attrs,
            stmts,
        } = self;
        let body = match shape {
            Shape::AsyncFn { ret } => {
                let anchor = return_anchor(ret);
                let user_body = quote_spanned!(brace.span.join()=> { #(#stmts)* });
                locked_body(
                    options,
                    key,
                    error_type_span(ret),
                    quote!(#anchor #user_body),
                )
            }
            Shape::AsyncTrait {
                before,
                box_pin,
                block,
                output,
                ret,
            } => {
                // async-trait's block already starts with its own return-type anchor.
                let inner = &block.block.stmts;
                let error_span = error_type_span(output.unwrap_or(ret));
                let body = locked_body(options, key, error_span, quote!(#(#inner)*));
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
}

/// Acquire, run `body` (the contents of an `async move` block that evaluates to the fn's
/// `Result`) under the guard, release. Errors of the lock become the fn's error via `From`;
/// that code is spanned on the return type's error type (`error_span`), so a missing
/// `From<LockError>` impl or a return type that is no `Result` is reported there.
fn locked_body(
    options: &Options,
    key: &Template,
    error_span: Span,
    body: TokenStream,
) -> TokenStream {
    let krate = &options.krate;
    let private = quote!(#krate::__private);
    let locker = Ident::new("__lock_locker", Span::mixed_site());
    let locker_ref = Ident::new("__lock_locker_ref", Span::mixed_site());
    let key_var = Ident::new("__lock_key", Span::mixed_site());
    let guard = Ident::new("__lock_guard", Span::mixed_site());
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
    let bail = quote_spanned! {error_span=>
        ::core::result::Result::Err(#error) => {
            return ::core::result::Result::Err(::core::convert::From::from(#error));
        }
    };
    let key_expr = key.expr(&private);
    let wait = duration(options.wait);
    let lease = duration(options.lease);
    let on_lost = match options.on_lost {
        OnLost::Abort => quote!(#private::OnLost::Abort),
        OnLost::Continue => quote!(#private::OnLost::Continue),
    };
    // The whole call is spanned on the return type, so that an error type without
    // `From<LockError>` or a body that is no `Result` is reported there.
    let run = respan(quote!(#private::run), error_span);
    let body_block = quote_spanned!(error_span=> async move { #body });
    let run_call = quote_spanned!(error_span=> #run(#guard, #on_lost, #body_block).await);
    quote! {
        #find_locker
        // `From::from` is the identity when the fn's error type is `LockError` itself.
        #[allow(clippy::useless_conversion)]
        let #locker = match #locker {
            ::core::result::Result::Ok(#value) => #value,
            #bail
        };
        let #key_var: ::std::string::String = #key_expr;
        #[allow(clippy::useless_conversion)]
        let #guard = match #private::acquire(#locker, #key_var, #wait, #lease).await {
            ::core::result::Result::Ok(#value) => #value,
            #bail
        };
        #run_call
    }
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

/// `Some(Duration::new(s, n))` or `None`, exact and computed at compile time.
fn duration(value: Option<std::time::Duration>) -> TokenStream {
    match value {
        Some(d) => {
            let secs = d.as_secs();
            let nanos = d.subsec_nanos();
            quote!(::core::option::Option::Some(::core::time::Duration::new(#secs, #nanos)))
        }
        None => quote!(::core::option::Option::None),
    }
}

/// A never-taken `return` of the declared type as the first statement of the body's block, so
/// that the block's type is inferred from the signature and type errors point at the user's
/// code, not at the generated wrapper (the technique of tracing-attributes).
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

/// The names a key placeholder can refer to.
fn scope(sig: &Signature) -> Scope {
    let mut scope = Scope {
        params: Vec::new(),
        has_self: false,
    };
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(_) => scope.has_self = true,
            FnArg::Typed(typed) => bindings(&typed.pat, &mut scope.params),
        }
    }
    // Const generics are values too: `key = "buf:<N>"`.
    scope
        .params
        .extend(sig.generics.const_params().map(|p| p.ident.clone()));
    scope
}

/// Every name a pattern binds.
fn bindings(pat: &Pat, out: &mut Vec<Ident>) {
    match pat {
        Pat::Ident(p) => {
            out.push(p.ident.clone());
            if let Some((_, sub)) = &p.subpat {
                bindings(sub, out);
            }
        }
        Pat::Tuple(p) => p.elems.iter().for_each(|e| bindings(e, out)),
        Pat::TupleStruct(p) => p.elems.iter().for_each(|e| bindings(e, out)),
        Pat::Struct(p) => p.fields.iter().for_each(|f| bindings(&f.pat, out)),
        Pat::Slice(p) => p.elems.iter().for_each(|e| bindings(e, out)),
        Pat::Reference(p) => bindings(&p.pat, out),
        Pat::Paren(p) => bindings(&p.pat, out),
        Pat::Type(p) => bindings(&p.pat, out),
        Pat::Or(p) => {
            if let Some(first) = p.cases.first() {
                bindings(first, out);
            }
        }
        _ => {}
    }
}

/// A type as written, for messages (`Option<u32>`, not `Option < u32 >`).
fn pretty(ty: &Type) -> String {
    let mut text = ty.to_token_stream().to_string();
    for (from, to) in [
        (" <", "<"),
        ("< ", "<"),
        (" >", ">"),
        (" ::", "::"),
        (":: ", "::"),
        (" ,", ","),
        ("& ", "&"),
    ] {
        text = text.replace(from, to);
    }
    text
}

/// Return types that cannot be a `Result` (aliases of `Result` are left to the type checker).
fn is_surely_not_result(ty: &Type) -> bool {
    const NOT_RESULT: &[&str] = &[
        "Option", "Vec", "String", "Box", "bool", "char", "str", "u8", "u16", "u32", "u64", "u128",
        "usize", "i8", "i16", "i32", "i64", "i128", "isize", "f32", "f64",
    ];
    match ty {
        Type::Tuple(_)
        | Type::Reference(_)
        | Type::Array(_)
        | Type::Slice(_)
        | Type::Never(_)
        | Type::Ptr(_)
        | Type::ImplTrait(_)
        | Type::TraitObject(_) => true,
        Type::Path(path) => {
            path.qself.is_none()
                && path
                    .path
                    .segments
                    .last()
                    .is_some_and(|last| NOT_RESULT.iter().any(|name| last.ident == name))
        }
        Type::Paren(paren) => is_surely_not_result(&paren.elem),
        _ => false,
    }
}

/// Where errors about the fn's return type are reported: on `E` of a `Result<T, E>` (a missing
/// `From<LockError>` is its fault), else on the return type (not a `Result` at all).
fn error_type_span(ty: &Type) -> Span {
    if let Type::Path(path) = ty {
        if let Some(last) = path.path.segments.last() {
            if let PathArguments::AngleBracketed(args) = &last.arguments {
                let types: Vec<&Type> = args
                    .args
                    .iter()
                    .filter_map(|arg| match arg {
                        GenericArgument::Type(ty) => Some(ty),
                        _ => None,
                    })
                    .collect();
                if last.ident == "Result" && types.len() == 2 {
                    return types[1].span();
                }
            }
        }
    }
    ty.span()
}

/// `R` in `Pin<Box<dyn Future<Output = R> + Send + 'a>>`.
fn future_output(ty: &Type) -> Option<&Type> {
    match ty {
        Type::Path(path) => {
            let PathArguments::AngleBracketed(args) = &path.path.segments.last()?.arguments else {
                return None;
            };
            args.args.iter().find_map(|arg| match arg {
                GenericArgument::AssocType(assoc) if assoc.ident == "Output" => Some(&assoc.ty),
                GenericArgument::Type(inner) => future_output(inner),
                _ => None,
            })
        }
        Type::TraitObject(object) => object.bounds.iter().find_map(|bound| match bound {
            TypeParamBound::Trait(bound) => {
                let PathArguments::AngleBracketed(args) = &bound.path.segments.last()?.arguments
                else {
                    return None;
                };
                args.args.iter().find_map(|arg| match arg {
                    GenericArgument::AssocType(assoc) if assoc.ident == "Output" => Some(&assoc.ty),
                    _ => None,
                })
            }
            _ => None,
        }),
        Type::Paren(paren) => future_output(&paren.elem),
        Type::Group(group) => future_output(&group.elem),
        _ => None,
    }
}

/// The type with every `impl Trait` replaced by `_`, usable in a `let`.
fn erase_impl_trait(ty: &Type) -> Type {
    struct Eraser;
    impl VisitMut for Eraser {
        fn visit_type_mut(&mut self, ty: &mut Type) {
            if let Type::ImplTrait(impl_trait) = ty {
                *ty = Type::Infer(syn::TypeInfer {
                    underscore_token: Token![_](impl_trait.impl_token.span),
                });
            } else {
                syn::visit_mut::visit_type_mut(self, ty);
            }
        }
    }
    let mut ty = ty.clone();
    Eraser.visit_type_mut(&mut ty);
    ty
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_str(attr: TokenStream, item: TokenStream) -> String {
        distributed_lock(attr, item).to_string()
    }

    #[test]
    fn generated_code_uses_absolute_paths() {
        let out = expand_str(
            quote!(
                key = "inventory:<sku_id>",
                wait = "3s",
                lease = "250ms",
                locker = self.locker
            ),
            quote! {
                /// Docs.
                pub async fn reserve(&self, sku_id: u64) -> Result<u32, AppError> { Ok(1) }
            },
        );
        assert!(out.contains(":: lock_core :: __private :: locker"), "{out}");
        assert!(
            out.contains(":: lock_core :: __private :: acquire"),
            "{out}"
        );
        assert!(out.contains(":: lock_core :: __private :: run"), "{out}");
        assert!(
            out.contains(":: core :: time :: Duration :: new (3u64 , 0u32)"),
            "{out}"
        );
        assert!(
            out.contains(":: core :: time :: Duration :: new (0u64 , 250000000u32)"),
            "{out}"
        );
        assert!(
            out.contains(":: lock_core :: __private :: KeyBuilder :: value (& mut __lock_key_builder , & (sku_id) , :: core :: option :: Option :: None)"),
            "{out}"
        );
        assert!(out.contains("OnLost :: Abort"), "{out}");
        assert!(
            out.starts_with("# [doc = r\" Docs.\"] pub async fn reserve"),
            "{out}"
        );
        assert!(!out.contains("compile_error"), "{out}");
    }

    #[test]
    fn errors_keep_the_item() {
        let out = expand_str(
            quote!(key = "k", nope = 1),
            quote!(
                async fn f() -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(
            out.starts_with("async fn f () -> Result < () , E > { Ok (()) }"),
            "{out}"
        );
        assert!(out.contains("compile_error"), "{out}");
        assert!(out.contains("unknown option `nope`"), "{out}");
    }

    #[test]
    fn crate_option_replaces_the_path() {
        let out = expand_str(
            quote!(key = "k", crate = "my_locks", on_lost = "continue"),
            quote!(
                async fn f() -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(out.contains("my_locks :: __private :: run"), "{out}");
        assert!(
            out.contains("my_locks :: __private :: OnLost :: Continue"),
            "{out}"
        );
        assert!(!out.contains("lock_core"), "{out}");
    }
}
