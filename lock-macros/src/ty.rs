//! Reading types as written: whether a return type can be a `Result`, where its error type is,
//! the output of a boxed future, and the type as a `let` can name it.

use proc_macro2::Span;
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{GenericArgument, PathArguments, Token, Type, TypeParamBound};

/// A type as written, for messages (`Option<u32>`, not `Option < u32 >`).
pub(crate) fn pretty(ty: &Type) -> String {
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
pub(crate) fn is_surely_not_result(ty: &Type) -> bool {
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

/// Whether a return type can say "skipped" (`on_busy = "skip"`), as far as it can be read.
pub(crate) enum SkipShape<'a> {
    /// `()`, `Option<T>`, `Result<(), E>`, `Result<Option<T>, E>` (or a one-argument alias
    /// named `Result`).
    Fits,
    /// Surely not: `at` is the part that cannot say it, `instead` the type to write.
    Refused { at: &'a Type, instead: String },
    /// An alias or a generic parameter: left to the type checker.
    Unknown,
}

/// Reads `ty` as the return type of a fn that may be skipped.
pub(crate) fn skip_shape(ty: &Type) -> SkipShape<'_> {
    match ty {
        Type::Paren(paren) => return skip_shape(&paren.elem),
        Type::Group(group) => return skip_shape(&group.elem),
        _ => {}
    }
    if can_say_skipped(ty) {
        return SkipShape::Fits;
    }
    if let Some((ok, _)) = result_args(ty) {
        return match ok {
            Some(ok) if can_say_skipped(ok) => SkipShape::Fits,
            Some(ok) if is_surely_not_skip_value(ok) => SkipShape::Refused {
                at: ok,
                instead: pretty(ty).replacen(&pretty(ok), &format!("Option<{}>", pretty(ok)), 1),
            },
            _ => SkipShape::Unknown,
        };
    }
    if is_surely_not_skip_value(ty) {
        let instead = match ty {
            Type::Never(_) => "()".to_owned(),
            _ => format!("Option<{}>", pretty(&erase_impl_trait(ty))),
        };
        return SkipShape::Refused { at: ty, instead };
    }
    SkipShape::Unknown
}

/// `()` or `Option<..>`: a value that can be the skip.
fn can_say_skipped(ty: &Type) -> bool {
    match ty {
        Type::Tuple(tuple) => tuple.elems.is_empty(),
        Type::Path(path) => {
            path.qself.is_none()
                && path
                    .path
                    .segments
                    .last()
                    .is_some_and(|last| last.ident == "Option")
        }
        Type::Paren(paren) => can_say_skipped(&paren.elem),
        _ => false,
    }
}

/// Types that surely cannot be the skip (`u32`, `String`, `Result<..>`, a tuple of values).
fn is_surely_not_skip_value(ty: &Type) -> bool {
    if can_say_skipped(ty) {
        return false;
    }
    is_surely_not_result(ty) || result_args(ty).is_some()
}

/// The `Ok` type (if written) and the error type (if written) of a path named `Result` with
/// angle-bracketed arguments.
fn result_args(ty: &Type) -> Option<(Option<&Type>, Option<&Type>)> {
    let Type::Path(path) = ty else {
        return None;
    };
    let last = path.path.segments.last()?;
    if path.qself.is_some() || last.ident != "Result" {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    let mut types = args.args.iter().filter_map(|arg| match arg {
        GenericArgument::Type(ty) => Some(ty),
        _ => None,
    });
    Some((types.next(), types.next()))
}

/// Where errors about the fn's return type are reported: on `E` of a `Result<T, E>` (a missing
/// `From<LockError>` is its fault), else on the return type (not a `Result` at all).
pub(crate) fn error_type_span(ty: &Type) -> Span {
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
pub(crate) fn future_output(ty: &Type) -> Option<&Type> {
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
pub(crate) fn erase_impl_trait(ty: &Type) -> Type {
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
    use syn::parse_quote;

    use super::*;

    #[test]
    fn tells_types_that_cannot_be_a_result() {
        let not: [Type; 6] = [
            parse_quote!(Option<u32>),
            parse_quote!(()),
            parse_quote!(&str),
            parse_quote!(impl Display),
            parse_quote!(std::vec::Vec<u8>),
            parse_quote!((bool)),
        ];
        for ty in &not {
            assert!(is_surely_not_result(ty), "{}", pretty(ty));
        }
        let maybe: [Type; 4] = [
            parse_quote!(Result<u32, E>),
            parse_quote!(AppResult<()>),
            parse_quote!(anyhow::Result<()>),
            parse_quote!(<T as Trait>::Option),
        ];
        for ty in &maybe {
            assert!(!is_surely_not_result(ty), "{}", pretty(ty));
        }
    }

    #[test]
    fn tells_return_types_that_can_say_skipped() {
        let fits: [Type; 6] = [
            parse_quote!(()),
            parse_quote!(Option<u32>),
            parse_quote!(Result<(), E>),
            parse_quote!(Result<Option<u32>, E>),
            parse_quote!(anyhow::Result<()>),
            parse_quote!((Option<u8>)),
        ];
        for ty in &fits {
            assert!(matches!(skip_shape(ty), SkipShape::Fits), "{}", pretty(ty));
        }
        let refused: [(Type, &str); 4] = [
            (parse_quote!(u32), "Option<u32>"),
            (parse_quote!(Result<u32, E>), "Result<Option<u32>, E>"),
            (parse_quote!(Vec<u8>), "Option<Vec<u8>>"),
            (parse_quote!((u8, u8)), "Option<(u8, u8)>"),
        ];
        for (ty, expected) in &refused {
            match skip_shape(ty) {
                SkipShape::Refused { instead, .. } => assert_eq!(instead, *expected),
                _ => panic!("{} is refused", pretty(ty)),
            }
        }
        let unknown: [Type; 3] = [
            parse_quote!(AppResult<u32>),
            parse_quote!(T),
            parse_quote!(Result<T, E>),
        ];
        for ty in &unknown {
            assert!(
                matches!(skip_shape(ty), SkipShape::Unknown),
                "{}",
                pretty(ty)
            );
        }
    }

    #[test]
    fn reads_the_output_of_a_boxed_future() {
        let boxed: Type = parse_quote!(
            ::core::pin::Pin<Box<dyn ::core::future::Future<Output = Result<u32, E>> + Send + 'a>>
        );
        let output: Type = parse_quote!(Result<u32, E>);
        assert_eq!(future_output(&boxed), Some(&output));
        assert_eq!(future_output(&parse_quote!(Result<u32, E>)), None);
    }

    #[test]
    fn erases_impl_trait() {
        let erased = erase_impl_trait(&parse_quote!(Result<Vec<impl Display>, impl Error>));
        assert_eq!(erased, parse_quote!(Result<Vec<_>, _>));
    }

    #[test]
    fn writes_types_for_messages() {
        assert_eq!(pretty(&parse_quote!(Option<u32>)), "Option<u32>");
        assert_eq!(
            pretty(&parse_quote!(std::collections::HashMap<&str, u8>)),
            "std::collections::HashMap<&str, u8>"
        );
    }
}
