//! The key template: `"inventory:<sku_id>"`, `"order:<order.customer.id>"`, `"t:<self.tenant>"`.
//!
//! Grammar: text with placeholders `<path>`, where `path` is a parameter name (or `self`)
//! followed by `.field` or `.0` segments. `<<` is a literal `<`; a `>` outside a placeholder is
//! literal text. Every error is spanned on the template literal (stable Rust cannot point inside
//! a string literal) and quotes the offending placeholder.

use syn::{Ident, LitStr};

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
    /// The literal as written: its span is where errors about the key are reported.
    pub(crate) lit: LitStr,
    pub(crate) parts: Vec<Part>,
}

#[cfg_attr(test, derive(Debug, PartialEq))]
pub(crate) enum Part {
    Text(String),
    /// A value, formatted with `Display`.
    Placeholder {
        root: Root,
        fields: Vec<Field>,
        /// The first character of the text that follows, which the value's own occurrences
        /// are escaped against so that distinct values give distinct keys (`None`: the value
        /// ends the key).
        boundary: Option<char>,
    },
}

#[cfg_attr(test, derive(Debug, PartialEq))]
pub(crate) enum Root {
    SelfValue,
    /// A parameter, spanned on the template.
    Param(Ident),
}

#[cfg_attr(test, derive(Debug, PartialEq))]
pub(crate) enum Field {
    /// A named field, spanned on the template.
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
                push_text(&mut parts, std::mem::take(&mut text), lit)?;
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
            push_text(&mut parts, text, lit)?;
        }
        Ok(Self {
            lit: lit.clone(),
            parts,
        })
    }
}

/// Appends literal text, which ends the placeholder before it (if any): its first character
/// becomes that placeholder's boundary.
fn push_text(parts: &mut Vec<Part>, text: String, lit: &LitStr) -> syn::Result<()> {
    if let Some(Part::Placeholder { boundary, .. }) = parts.last_mut() {
        after_placeholder(&text, lit)?;
        *boundary = text.chars().next();
    }
    parts.push(Part::Text(text));
    Ok(())
}

/// Text that follows a placeholder may not start with `\\`: the kit escapes values with it, so a
/// value could not be told apart from the text.
fn after_placeholder(text: &str, lit: &LitStr) -> syn::Result<()> {
    if text.starts_with('\\') {
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
    Ok(Part::Placeholder {
        root,
        fields,
        boundary: None,
    })
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
            params: params.iter().map(|p| syn::parse_str(p).unwrap()).collect(),
            has_self,
        }
    }

    fn parse(template: &str, scope: &Scope) -> Result<Vec<Part>, String> {
        let lit = LitStr::new(template, proc_macro2::Span::call_site());
        Template::parse(&lit, scope)
            .map(|t| t.parts)
            .map_err(|e| e.to_string())
    }

    fn text(text: &str) -> Part {
        Part::Text(text.to_owned())
    }

    /// `path` as in a placeholder (`order.customer.id`, `self.tenant`, `pair.0`).
    fn value(path: &str, boundary: Option<char>) -> Part {
        let mut segments = path.split('.');
        let root = match segments.next() {
            Some("self") => Root::SelfValue,
            Some(name) => Root::Param(syn::parse_str(name).unwrap()),
            None => unreachable!("split yields at least one segment"),
        };
        let fields = segments
            .map(|segment| match segment.parse() {
                Ok(index) => Field::Index(index),
                Err(_) => Field::Named(syn::parse_str(segment).unwrap()),
            })
            .collect();
        Part::Placeholder {
            root,
            fields,
            boundary,
        }
    }

    #[test]
    fn splits_text_and_values() {
        let s = scope(&["sku_id", "order", "pair", "r#type"], true);
        assert_eq!(
            parse("inventory:<sku_id>", &s).unwrap(),
            [text("inventory:"), value("sku_id", None)]
        );
        assert_eq!(
            parse("o:<order.customer.id>/<pair.0>-<self.tenant>", &s).unwrap(),
            [
                text("o:"),
                value("order.customer.id", Some('/')),
                text("/"),
                value("pair.0", Some('-')),
                text("-"),
                value("self.tenant", None),
            ]
        );
        assert_eq!(parse("fixed", &s).unwrap(), [text("fixed")]);
        assert_eq!(
            parse("{<<a>}:<sku_id>", &s).unwrap(),
            [text("{<a>}:"), value("sku_id", None)]
        );
        assert_eq!(
            parse("<r#type>::<sku_id>", &s).unwrap(),
            [
                value("r#type", Some(':')),
                text("::"),
                value("sku_id", None)
            ]
        );
    }

    #[test]
    fn reports_errors() {
        let s = scope(&["sku_id"], false);
        let err = |t: &str| parse(t, &s).unwrap_err();
        assert!(err("a:<sku_id").contains("unclosed `<`"));
        assert!(err("a:<>").contains("empty placeholder"));
        assert!(err("a:<sku>").contains("did you mean `sku_id`?"));
        assert!(err("a:<self.x>").contains("needs a `self` receiver"));
        assert!(err("a:<sku_id.type>").contains("write `r#type`"));
        assert!(err("a:<sku_id..x>").contains("empty field name"));
        assert!(err("a:<sku id>").contains("invalid placeholder"));
        assert!(err("").contains("empty"));
        let s = scope(&["a", "b"], false);
        let err = |t: &str| parse(t, &s).unwrap_err();
        assert!(err("k:<a><b>").contains("placeholders side by side"));
        assert!(err("k:<a>\\:<b>").contains("starts with `\\`"));
        assert!(err("k:<a>\\").contains("starts with `\\`"));
        assert!(parse("\\k:<a>:\\<b>", &s).is_ok());
    }

    #[test]
    fn distance() {
        assert_eq!(edit_distance("sku", "sku_id"), 3);
        assert_eq!(edit_distance("skuid", "sku_id"), 1);
        assert_eq!(edit_distance("", "ab"), 2);
    }
}
