//! The key template: `"inventory:<sku_id>"`, `"order:<order.customer.id>"`, `"t:<self.tenant>"`.
//!
//! Grammar: text with placeholders `<path>`, where `path` is a parameter name (or `self`)
//! followed by `.field` or `.0` segments. `<<` is a literal `<`; a `>` outside a placeholder is
//! literal text. Every error is spanned on the template literal (stable Rust cannot point inside
//! a string literal) and quotes the offending placeholder.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::{Ident, Index, LitChar, LitStr};

/// The names a placeholder may start with.
pub(crate) struct Scope {
    /// Names bound by the fn's parameters, in order.
    pub(crate) params: Vec<Ident>,
    /// Whether the fn has a `self` receiver.
    pub(crate) has_self: bool,
}

impl Scope {
    /// "`a`, `b`" for messages.
    fn describe(&self) -> String {
        let mut names: Vec<String> = Vec::new();
        if self.has_self {
            names.push("`self`".to_owned());
        }
        names.extend(self.params.iter().map(|p| format!("`{p}`")));
        if names.is_empty() {
            "this fn has no parameters".to_owned()
        } else {
            format!("parameters: {}", names.join(", "))
        }
    }
}

/// A parsed and checked template.
pub(crate) struct Template {
    lit: LitStr,
    parts: Vec<Part>,
}

enum Part {
    Text(String),
    Placeholder { root: Root, fields: Vec<Field> },
}

enum Root {
    SelfValue,
    Param(Ident),
}

enum Field {
    Named(Ident),
    Index(u32),
}

impl Template {
    /// Parses `lit` and checks that every placeholder names something in `scope`.
    pub(crate) fn parse(lit: &LitStr, scope: &Scope) -> syn::Result<Self> {
        let value = lit.value();
        let err = |msg: String| syn::Error::new(lit.span(), msg);
        if value.is_empty() {
            return Err(err(
                "the key template is empty: write e.g. `key = \"order:<order_id>\"`".to_owned(),
            ));
        }

        let mut parts = Vec::new();
        let mut text = String::new();
        let mut rest = value.as_str();
        while let Some(open) = rest.find('<') {
            text.push_str(&rest[..open]);
            rest = &rest[open + 1..];
            if let Some(after) = rest.strip_prefix('<') {
                text.push('<');
                rest = after;
                continue;
            }
            let Some(close) = rest.find('>') else {
                return Err(err(format!(
                    "unclosed `<` in key template: `<{rest}` needs a closing `>` \
                     (write `<<` for a literal `<`)"
                )));
            };
            let inner = &rest[..close];
            rest = &rest[close + 1..];
            if !text.is_empty() {
                after_placeholder(&parts, &text, lit)?;
                parts.push(Part::Text(std::mem::take(&mut text)));
            } else if let Some(Part::Placeholder { .. }) = parts.last() {
                return Err(err(format!(
                    "placeholders side by side (`...><{inner}>`) in key template: two values \
                     with nothing between them can form the same key for different calls; put \
                     a separator between them, e.g. `<a>:<b>`"
                )));
            }
            parts.push(placeholder(inner, lit, scope)?);
        }
        text.push_str(rest);
        if !text.is_empty() {
            after_placeholder(&parts, &text, lit)?;
            parts.push(Part::Text(text));
        }
        Ok(Self {
            lit: lit.clone(),
            parts,
        })
    }

    /// An expression of type `String`: the key for this call. Values go through the kit's
    /// `KeyBuilder` (under `private`), which escapes them so that distinct values give
    /// distinct keys.
    pub(crate) fn expr(&self, private: &TokenStream) -> TokenStream {
        let span = self.lit.span();
        if !self
            .parts
            .iter()
            .any(|part| matches!(part, Part::Placeholder { .. }))
        {
            let key = LitStr::new(&self.lit.value(), span);
            return quote!(::std::string::String::from(#key));
        }
        let builder = Ident::new("__lock_key_builder", Span::mixed_site());
        let steps = self.parts.iter().enumerate().map(|(i, part)| match part {
            Part::Text(text) => {
                let text = LitStr::new(text, span);
                quote!(#private::KeyBuilder::text(&mut #builder, #text);)
            }
            Part::Placeholder { root, fields } => {
                let boundary = match self.parts.get(i + 1) {
                    Some(Part::Text(text)) => match text.chars().next() {
                        Some(c) => {
                            let c = LitChar::new(c, span);
                            quote!(::core::option::Option::Some(#c))
                        }
                        None => quote!(::core::option::Option::None),
                    },
                    _ => quote!(::core::option::Option::None),
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
}

/// Text that follows a placeholder may not start with `\\`: the kit escapes values with it, so a
/// value could not be told apart from the text.
fn after_placeholder(parts: &[Part], text: &str, lit: &LitStr) -> syn::Result<()> {
    if text.starts_with('\\') && matches!(parts.last(), Some(Part::Placeholder { .. })) {
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "key template text `{text}` right after a placeholder starts with `\\`, the \
                 escape character of key values; put another character first, e.g. `<a>:\\x`"
            ),
        ));
    }
    Ok(())
}

/// Parses the inside of one `<...>`.
fn placeholder(inner: &str, lit: &LitStr, scope: &Scope) -> syn::Result<Part> {
    let err = |msg: String| syn::Error::new(lit.span(), msg);
    if inner.trim().is_empty() {
        return Err(err(format!(
            "empty placeholder `<{inner}>` in key template: name a parameter, e.g. `<order_id>` \
             ({})",
            scope.describe()
        )));
    }
    let invalid = |why: &str| {
        err(format!(
            "invalid placeholder `<{inner}>` in key template{why}: write a parameter name or a \
             field path such as `<order.customer.id>` ({})",
            scope.describe()
        ))
    };

    let mut segments = inner.split('.');
    let first = segments.next().unwrap_or_default();
    let root = if first == "self" {
        if !scope.has_self {
            return Err(err(format!(
                "`<{inner}>` needs a `self` receiver, and this fn has none: name a parameter \
                 instead ({})",
                scope.describe()
            )));
        }
        Root::SelfValue
    } else {
        let Some(ident) = ident(first, lit) else {
            return Err(invalid(&keyword_hint(first)));
        };
        let Some(param) = scope.params.iter().find(|p| **p == ident) else {
            let suggestion = closest(first, &scope.params)
                .map(|p| format!(" (did you mean `{p}`?)"))
                .unwrap_or_default();
            return Err(err(format!(
                "unknown parameter `{first}` in key template{suggestion}: a placeholder must \
                 name a parameter of the fn ({})",
                scope.describe()
            )));
        };
        let mut param = param.clone();
        param.set_span(lit.span());
        Root::Param(param)
    };

    let mut fields = Vec::new();
    for segment in segments {
        if !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit()) {
            match segment.parse::<u32>() {
                Ok(index) if segment == index.to_string() => fields.push(Field::Index(index)),
                _ => return Err(invalid(&format!(": `{segment}` is not a tuple index"))),
            }
        } else if let Some(ident) = ident(segment, lit) {
            fields.push(Field::Named(ident));
        } else if segment.is_empty() {
            return Err(invalid(": empty field name"));
        } else {
            return Err(invalid(&keyword_hint(segment)));
        }
    }
    Ok(Part::Placeholder { root, fields })
}

/// `text` as an identifier (raw ones included), spanned on the template; `None` for keywords,
/// `_`, and anything that is not an identifier.
fn ident(text: &str, lit: &LitStr) -> Option<Ident> {
    if text.is_empty() || text.chars().any(char::is_whitespace) {
        return None;
    }
    let mut ident = syn::parse_str::<Ident>(text).ok()?;
    ident.set_span(lit.span());
    Some(ident)
}

fn keyword_hint(segment: &str) -> String {
    if syn::parse_str::<Ident>(&format!("r#{segment}")).is_ok() {
        format!(": `{segment}` is a keyword, write `r#{segment}`")
    } else {
        format!(": `{segment}` is not an identifier")
    }
}

/// The parameter most like `name` (a typo, or a prefix like `sku` for `sku_id`), if any.
fn closest<'a>(name: &str, params: &'a [Ident]) -> Option<&'a Ident> {
    params
        .iter()
        .filter_map(|param| {
            let text = param.to_string();
            let prefix = text.starts_with(name) || name.starts_with(text.as_str());
            let distance = edit_distance(name, &text);
            let typo = distance <= 2.max(text.len() / 3);
            (prefix || typo).then_some((if prefix { 0 } else { distance }, param))
        })
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, param)| param)
}

/// Levenshtein distance (parameter names are short).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(params: &[&str], has_self: bool) -> Scope {
        Scope {
            params: params
                .iter()
                .map(|p| Ident::new(p, proc_macro2::Span::call_site()))
                .collect(),
            has_self,
        }
    }

    /// The expansion as a string; expected token streams written as Rust code get trailing
    /// commas from rustfmt, so `.replace(" ,)", ")")` evens those out.
    fn expand(template: &str, scope: &Scope) -> Result<String, String> {
        let lit = LitStr::new(template, proc_macro2::Span::call_site());
        Template::parse(&lit, scope)
            .map(|t| t.expr(&quote!(p)).to_string())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn builds_keys_with_escaped_values() {
        let s = scope(&["sku_id", "order", "pair"], true);
        assert_eq!(
            expand("inventory:<sku_id>", &s).unwrap(),
            quote!({
                let mut __lock_key_builder = p::KeyBuilder::new();
                p::KeyBuilder::text(&mut __lock_key_builder, "inventory:");
                p::KeyBuilder::value(
                    &mut __lock_key_builder,
                    &(sku_id),
                    ::core::option::Option::None,
                );
                p::KeyBuilder::finish(__lock_key_builder)
            })
            .to_string()
            .replace(" ,)", ")")
        );
        assert_eq!(
            expand("o:<order.customer.id>/<pair.0>-<self.tenant>", &s).unwrap(),
            quote!({
                let mut __lock_key_builder = p::KeyBuilder::new();
                p::KeyBuilder::text(&mut __lock_key_builder, "o:");
                p::KeyBuilder::value(
                    &mut __lock_key_builder,
                    &(order.customer.id),
                    ::core::option::Option::Some('/'),
                );
                p::KeyBuilder::text(&mut __lock_key_builder, "/");
                p::KeyBuilder::value(
                    &mut __lock_key_builder,
                    &(pair.0),
                    ::core::option::Option::Some('-'),
                );
                p::KeyBuilder::text(&mut __lock_key_builder, "-");
                p::KeyBuilder::value(
                    &mut __lock_key_builder,
                    &(self.tenant),
                    ::core::option::Option::None,
                );
                p::KeyBuilder::finish(__lock_key_builder)
            })
            .to_string()
            .replace(" ,)", ")")
        );
        assert_eq!(
            expand("fixed", &s).unwrap(),
            quote!(::std::string::String::from("fixed")).to_string()
        );
        assert_eq!(
            expand("{<<a>}:<sku_id>", &s).unwrap(),
            quote!({
                let mut __lock_key_builder = p::KeyBuilder::new();
                p::KeyBuilder::text(&mut __lock_key_builder, "{<a>}:");
                p::KeyBuilder::value(
                    &mut __lock_key_builder,
                    &(sku_id),
                    ::core::option::Option::None,
                );
                p::KeyBuilder::finish(__lock_key_builder)
            })
            .to_string()
            .replace(" ,)", ")")
        );
    }

    #[test]
    fn reports_errors() {
        let s = scope(&["sku_id"], false);
        let err = |t: &str| expand(t, &s).unwrap_err();
        assert!(err("a:<sku_id").contains("unclosed `<`"));
        assert!(err("a:<>").contains("empty placeholder"));
        assert!(err("a:<sku>").contains("did you mean `sku_id`?"));
        assert!(err("a:<self.x>").contains("needs a `self` receiver"));
        assert!(err("a:<sku_id.type>").contains("write `r#type`"));
        assert!(err("a:<sku_id..x>").contains("empty field name"));
        assert!(err("a:<sku id>").contains("invalid placeholder"));
        assert!(err("").contains("empty"));
        let s = scope(&["a", "b"], false);
        let err = |t: &str| expand(t, &s).unwrap_err();
        assert!(err("k:<a><b>").contains("placeholders side by side"));
        assert!(err("k:<a>\\:<b>").contains("starts with `\\`"));
        assert!(err("k:<a>\\").contains("starts with `\\`"));
        assert!(expand("\\k:<a>:\\<b>", &s).is_ok());
    }

    #[test]
    fn distance() {
        assert_eq!(edit_distance("sku", "sku_id"), 3);
        assert_eq!(edit_distance("skuid", "sku_id"), 1);
        assert_eq!(edit_distance("", "ab"), 2);
    }
}
