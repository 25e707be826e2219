//! Small text helpers shared by several modules: clipping prompts, and
//! quoting a server's answer in an error message.

/// The first `max` characters of `s`, followed by `marker` when anything
/// was cut (each prompt says "cut" its own way: `…`, `\n... [cut]`).
pub fn clip(s: &str, max: usize, marker: &str) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some((at, _)) => format!("{}{marker}", &s[..at]),
    }
}

/// The first `max` characters of an HTTP body on one line (whitespace
/// runs as one space), for error messages; `(empty body)` when empty.
pub fn body_excerpt(body: &str, max: usize) -> String {
    let flat: String = body.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.is_empty() {
        return "(empty body)".into();
    }
    clip(&flat, max, "…")
}

#[cfg(test)]
mod tests {
    use super::{body_excerpt, clip};

    #[test]
    fn a_body_excerpt_is_one_clipped_line() {
        assert_eq!(body_excerpt("  \n ", 5), "(empty body)");
        assert_eq!(body_excerpt("a\n  b\tc", 10), "a b c");
        assert_eq!(body_excerpt("abcdef", 3), "abc…");
    }

    #[test]
    fn clips_at_characters_not_bytes() {
        assert_eq!(clip("héllo", 2, "…"), "hé…");
        assert_eq!(clip("héllo", 5, "…"), "héllo");
        assert_eq!(clip("abc", 0, "[cut]"), "[cut]");
    }
}
