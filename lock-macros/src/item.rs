//! The fn the attribute is on, as written, and what can be read off it without judging it: the
//! names its parameters bind, and the boxed-future body `#[async_trait]` gives a method.

use syn::parse::{Parse, ParseStream};
use syn::{
    braced, token, Attribute, Block, Expr, ExprAsync, ExprCall, FnArg, Ident, Pat, Signature, Stmt,
    Token, Visibility,
};

use crate::key::Scope;

/// An fn item, split the way the expansion needs it (inner attributes apart from outer ones).
pub(crate) struct ItemFn {
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) sig: Signature,
    pub(crate) brace: token::Brace,
    pub(crate) inner_attrs: Vec<Attribute>,
    pub(crate) stmts: Vec<Stmt>,
}

/// The body `#[async_trait]` makes of an `async fn`: `..; Box::pin(async move { body })`.
pub(crate) struct BoxedAsync<'a> {
    /// Statements before the `Box::pin(..)` (none, with today's async-trait).
    pub(crate) before: &'a [Stmt],
    /// The `Box::pin` path, as written.
    pub(crate) box_pin: &'a Expr,
    pub(crate) block: &'a ExprAsync,
}

impl Parse for ItemFn {
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

impl ItemFn {
    /// The names a key placeholder can refer to.
    pub(crate) fn scope(&self) -> Scope {
        let mut scope = Scope {
            params: Vec::new(),
            has_self: false,
        };
        for input in &self.sig.inputs {
            match input {
                FnArg::Receiver(_) => scope.has_self = true,
                FnArg::Typed(typed) => bindings(&typed.pat, &mut scope.params),
            }
        }
        // Const generics are values too: `key = "buf:<N>"`.
        scope
            .params
            .extend(self.sig.generics.const_params().map(|p| p.ident.clone()));
        scope
    }

    /// Recognises `Box::pin(async move { .. })` as the last statement: an `#[async_trait]`
    /// method that macro has already expanded.
    pub(crate) fn boxed_async(&self) -> Option<BoxedAsync<'_>> {
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
        Some(BoxedAsync {
            before,
            box_pin: func,
            block,
        })
    }
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
