//! What a name may be: every name an operator or a tenant gives the system (de-duplication groups,
//! co-operative node names, container names in provisioner reports, ...) passes [`name_problem`]
//! before it is kept (issue 30, item 6).
//!
//! A name is shown back in logs, the admin API, `/ui/` and the CLI's tables, so it must read as what
//! it is: no control characters (C0, DEL, C1: a newline or a NUL forges log lines and breaks
//! tables), no line or paragraph separators (U+2028, U+2029), no direction overrides or isolates
//! (U+202A-202E, U+2066-2069, U+061C, U+200E/200F: "\u{202E}cba" shows as "abc") and no invisible
//! formatting characters (zero widths U+200B-200D, U+2060-2064, U+FEFF, soft hyphen U+00AD, tags
//! U+E0000-E007F: two names that look the same must be the same), and a bounded length in bytes.
//! The list is Unicode's general categories Cc, Cf, Zl and Zp, spelled out here so that the check
//! needs no Unicode tables.

/// The longest pool label (a container's cgroup name; Linux allows 255 bytes for a directory name).
pub const MAX_POOL_LABEL_BYTES: usize = 255;

/// Why a name is refused, for the error naming the field.
pub fn name_problem(name: &str, max_bytes: usize) -> Option<&'static str> {
    if name.is_empty() {
        return Some("must not be empty");
    }
    if name.len() > max_bytes {
        return Some("too long");
    }
    if name.chars().any(is_hidden) {
        return Some("holds a control, direction or invisible formatting character");
    }
    None
}

/// Whether `c` is a control, separator (line, paragraph) or format character (Cc, Zl, Zp, Cf).
pub fn is_hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{0600}'..='\u{0605}'
                | '\u{061C}'
                | '\u{06DD}'
                | '\u{070F}'
                | '\u{0890}'..='\u{0891}'
                | '\u{08E2}'
                | '\u{180E}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{206F}'
                | '\u{FEFF}'
                | '\u{FFF9}'..='\u{FFFB}'
                | '\u{110BD}'
                | '\u{110CD}'
                | '\u{13430}'..='\u{1343F}'
                | '\u{1BCA0}'..='\u{1BCA3}'
                | '\u{1D173}'..='\u{1D17A}'
                | '\u{E0001}'
                | '\u{E0020}'..='\u{E007F}'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_refuse_hidden_characters_and_length() {
        for ok in ["web", "db-1", "groupe-é", "名前", "a b"] {
            assert_eq!(name_problem(ok, 128), None, "{ok:?}");
        }
        for bad in [
            "",
            "a\0b",
            "a\nb",
            "a\u{7f}",
            "a\u{85}",
            "\u{202E}cba",
            "a\u{200B}b",
            "a\u{2028}b",
            "\u{FEFF}a",
            "a\u{2066}b",
            "a\u{200F}",
            "a\u{E0041}",
            "a\u{00AD}b",
        ] {
            assert!(name_problem(bad, 128).is_some(), "{bad:?}");
        }
        assert_eq!(name_problem(&"x".repeat(129), 128), Some("too long"));
        assert_eq!(name_problem(&"x".repeat(128), 128), None);
    }
}
