//! Small text helpers shared by the prompt builders of several modules.

/// The first `max` characters of `s`, followed by `marker` when anything
/// was cut (each prompt says "cut" its own way: `…`, `\n... [cut]`).
pub fn clip(s: &str, max: usize, marker: &str) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some((at, _)) => format!("{}{marker}", &s[..at]),
    }
}

#[cfg(test)]
mod tests {
    use super::clip;

    #[test]
    fn clips_at_characters_not_bytes() {
        assert_eq!(clip("héllo", 2, "…"), "hé…");
        assert_eq!(clip("héllo", 5, "…"), "héllo");
        assert_eq!(clip("abc", 0, "[cut]"), "[cut]");
    }
}
