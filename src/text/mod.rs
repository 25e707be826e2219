//! Small text helpers shared by several modules: clipping prompts,
//! quoting a server's answer in an error message, where an answer's
//! code block ends (the engines stop there), and a stable hash of text
//! ([`fnv1a`]); [`python`] is the one scanner of Python source.

pub mod python;

/// FNV-1a (64 bit) of `parts`, a separator byte mixed in between them: a
/// hash that is the same in every process and release, for names, cache
/// keys and hashed features (not for security).
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            h ^= 0x1f;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        for &b in *p {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

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

/// Byte offset just past the closing fence of the answer's first code
/// block: a block opened by a "```python" (`py`, `python3`) or bare "```"
/// line, with a body that is not blank, closed by a later line that starts
/// with "```". `None` while no such block has closed. A blank block is a
/// stray opening (small models write "```" and then "```python"), and a
/// fence of another language is skipped, as the code extractor does.
pub fn code_block_end(text: &str) -> Option<usize> {
    // Inside a python/bare fence: whether its body has a non-blank line.
    let mut open: Option<bool> = None;
    let mut other = false;
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        let indent = bare.len() - bare.trim_start().len();
        if let Some(info) = bare.trim_start().strip_prefix("```") {
            if other {
                other = false;
            } else if open == Some(true) {
                return Some(at + indent + 3);
            } else {
                let info = info.trim().to_ascii_lowercase();
                if info.is_empty() || matches!(info.as_str(), "python" | "py" | "python3") {
                    open = Some(false);
                } else {
                    open = None;
                    other = true;
                }
            }
        } else if let Some(body) = open.as_mut() {
            // A line counts once it is complete: its end may still change.
            *body |= line.ends_with('\n') && !bare.trim().is_empty();
        }
        at += line.len();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::{body_excerpt, clip, code_block_end};

    #[test]
    fn a_code_block_ends_at_its_closing_fence() {
        let t = "Here:\n```python\ndef f():\n    return 1\n```\nIt returns 1.";
        assert_eq!(
            &t[..code_block_end(t).unwrap()],
            "Here:\n```python\ndef f():\n    return 1\n```"
        );
        assert_eq!(
            code_block_end("```python\ndef f():\n    return 1\n``"),
            None,
            "not closed yet"
        );
        assert_eq!(code_block_end("```python\ndef f():"), None);
        // A stray bare fence, then the real block.
        let t = "```\n```python\nx = 1\n```";
        assert_eq!(code_block_end(t), Some(t.len()));
        // Another language's block is not the answer.
        let t = "```text\nout\n```\n```py\nx = 1\n   ```\nmore";
        assert_eq!(
            &t[..code_block_end(t).unwrap()],
            "```text\nout\n```\n```py\nx = 1\n   ```"
        );
        assert_eq!(code_block_end("no code at all\n"), None);
    }

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
