//! Keys built from a `#[distributed_lock]` template: literal text and escaped values.
//!
//! Distinct argument tuples must give distinct keys: with `"<a>:<b>"`, (`"x:y"`, `"z"`) and
//! (`"x"`, `"y:z"`) would both format as `"x:y:z"` and two unrelated calls would share a lock
//! (or worse, two calls that must exclude each other could get different ones). So each value
//! followed by template text is written with a backslash before every `\` and before every
//! occurrence of the first character of that text. Reading a key from the left, a value then
//! ends at the first unescaped occurrence of that character, so the key determines the values.
//! A value that ends the template is the rest of the key and is written as it is: that is the
//! key `lock-tower`'s layer builds from the same value (its prefix, then the value), so a
//! function locked by `key = "inventory:<sku>"` and a route locked by
//! `KeyFrom::path_param("sku").prefix("inventory:")` exclude each other for every SKU,
//! `a\b` included. The macro rejects what would break this at compile time: two placeholders
//! with no text between them, and text after a placeholder that starts with `\`. Values
//! without those characters (ids, numbers, most names) appear unchanged.

use std::fmt::{self, Display, Write};

/// Builds the key of one call of a locked fn.
#[derive(Debug, Default)]
pub struct KeyBuilder {
    key: String,
}

impl KeyBuilder {
    /// An empty key.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends literal template text as it is.
    pub fn text(&mut self, text: &str) {
        self.key.push_str(text);
    }

    /// Appends `value`'s `Display` output, escaping `\` and `boundary` (the first character of
    /// the template text that follows the value); as it is at the end of the template
    /// (`boundary` `None`), where the value is the rest of the key.
    pub fn value<T: Display + ?Sized>(&mut self, value: &T, boundary: Option<char>) {
        let mut escaping = Escaping {
            key: &mut self.key,
            boundary,
        };
        // Writing into a `String` cannot fail; a `Display` impl that reports an error anyway
        // leaves what it wrote so far, as `format!` would have panicked instead.
        let _ = write!(escaping, "{value}");
    }

    /// The finished key.
    pub fn finish(self) -> String {
        self.key
    }
}

/// A `fmt::Write` that escapes as it appends, so no value is formatted twice.
struct Escaping<'a> {
    key: &'a mut String,
    boundary: Option<char>,
}

impl Write for Escaping<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let Some(boundary) = self.boundary else {
            self.key.push_str(s);
            return Ok(());
        };
        for c in s.chars() {
            if c == '\\' || c == boundary {
                self.key.push('\\');
            }
            self.key.push(c);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// A template as the macro sees it: `None` for a placeholder.
    type Template<'a> = &'a [Option<&'a str>];

    fn build(template: Template<'_>, values: &[String]) -> String {
        let mut key = KeyBuilder::new();
        let mut values = values.iter();
        for (i, part) in template.iter().enumerate() {
            match part {
                Some(text) => key.text(text),
                None => {
                    let boundary = template
                        .get(i + 1)
                        .and_then(|next| next.and_then(|text| text.chars().next()));
                    key.value(values.next().expect("a value per placeholder"), boundary);
                }
            }
        }
        key.finish()
    }

    /// The unescaped formatting the macro used before: the control for the checker.
    fn build_unescaped(template: Template<'_>, values: &[String]) -> String {
        let mut values = values.iter();
        template
            .iter()
            .map(|part| match part {
                Some(text) => (*text).to_owned(),
                None => values.next().expect("a value per placeholder").clone(),
            })
            .collect()
    }

    /// Every string of up to `max_len` characters over `alphabet`.
    fn strings(alphabet: &[char], max_len: usize) -> Vec<String> {
        let mut all = vec![String::new()];
        let mut last = vec![String::new()];
        for _ in 0..max_len {
            last = last
                .iter()
                .flat_map(|s| {
                    alphabet.iter().map(move |c| {
                        let mut s = s.clone();
                        s.push(*c);
                        s
                    })
                })
                .collect();
            all.extend(last.iter().cloned());
        }
        all
    }

    /// The first two different tuples that give the same key, if any.
    fn collision(
        template: Template<'_>,
        tuples: impl Iterator<Item = Vec<String>>,
        build: fn(Template<'_>, &[String]) -> String,
    ) -> Option<(Vec<String>, Vec<String>)> {
        let mut seen: HashMap<String, Vec<String>> = HashMap::new();
        for tuple in tuples {
            let key = build(template, &tuple);
            if let Some(previous) = seen.insert(key, tuple.clone()) {
                if previous != tuple {
                    return Some((previous, tuple));
                }
            }
        }
        None
    }

    /// Templates whose text is made of the characters the values are drawn from, so every
    /// kind of confusion between text and values is tried.
    const TEMPLATES: &[Template<'static>] = &[
        &[None, Some(":"), None],
        &[Some("a:"), None, Some(":"), None],
        &[None, Some("-x"), None, Some(":")],
        &[Some("x"), None, Some("x:"), None, Some(":\\")],
        &[None, Some("::"), None],
    ];

    const ALPHABET: &[char] = &['x', ':', '\\', '-'];

    #[test]
    fn distinct_values_give_distinct_keys_exhaustively() {
        // All pairs of values up to 4 characters over the alphabet: 341² = 116,281 per template.
        let values = &strings(ALPHABET, 4);
        for template in TEMPLATES {
            let pairs = values
                .iter()
                .flat_map(move |a| values.iter().map(move |b| vec![a.clone(), b.clone()]));
            assert_eq!(
                collision(template, pairs.clone(), build),
                None,
                "template {template:?}"
            );
            // The checker finds the collisions of unescaped formatting.
            assert!(
                collision(template, pairs, build_unescaped).is_some(),
                "template {template:?}: the control found no collision"
            );
        }
    }

    #[test]
    fn distinct_values_give_distinct_keys_with_three_placeholders() {
        let template: Template<'_> = &[None, Some(":"), None, Some("/"), None];
        let values = &strings(&['x', ':', '/', '\\'], 3);
        let triples = values.iter().flat_map(move |a| {
            values.iter().flat_map(move |b| {
                values
                    .iter()
                    .map(move |c| vec![a.clone(), b.clone(), c.clone()])
            })
        });
        assert_eq!(collision(template, triples, build), None);
    }

    #[test]
    fn plain_values_are_unchanged_and_separators_escaped() {
        let template: Template<'_> = &[Some("inventory:"), None, Some(":"), None];
        assert_eq!(
            build(template, &["sku-1".into(), "eu".into()]),
            "inventory:sku-1:eu"
        );
        assert_eq!(
            build(template, &["x:y".into(), "z".into()]),
            "inventory:x\\:y:z"
        );
        assert_eq!(
            build(template, &["x".into(), "y:z".into()]),
            "inventory:x:y:z"
        );
        assert_eq!(
            build(template, &["a\\".into(), "b".into()]),
            "inventory:a\\\\:b"
        );
        // The last value is the rest of the key, as the layer writes it.
        assert_eq!(
            build(template, &["a".into(), "b\\c:d".into()]),
            "inventory:a:b\\c:d"
        );
    }
}
