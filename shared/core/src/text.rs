//! The rules for text a caller supplies, each beside the JSON Schema
//! pattern that states it, so the published API contract and the check the
//! API applies are the same rule (`proto/openapi.json` carries these
//! patterns; a test holds the predicates to them).

/// A printable text: no control character (C0, DEL or C1) and at least one
/// character that is not a space.
pub const PRINTABLE_PATTERN: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]*[^\\u0000-\\u0020\\u007f-\\u009f][^\\u0000-\\u001f\\u007f-\\u009f]*$";

/// A secret or free text: no C0 control character and no DEL (Postgres
/// cannot store NUL; the rest is never meant).
pub const NO_CONTROL_PATTERN: &str = "^[^\\u0000-\\u001f\\u007f]*$";

/// A MAC address, `aa:bb:cc:dd:ee:ff` (either case).
pub const MAC_PATTERN: &str = "^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$";

/// A deploy profile's id.
pub const PROFILE_ID_PATTERN: &str = "^[a-z0-9._-]{1,64}$";

/// A host name as a machine reports it.
pub const HOSTNAME_PATTERN: &str = "^[A-Za-z0-9._-]{1,253}$";

fn is_control(c: char) -> bool {
    matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}')
}

/// [`PRINTABLE_PATTERN`] with a length of 1 to `max` characters.
pub fn is_printable(s: &str, max: usize) -> bool {
    let n = s.chars().count();
    (1..=max).contains(&n) && !s.chars().any(is_control) && s.chars().any(|c| c != ' ')
}

/// [`NO_CONTROL_PATTERN`] with a length of `min` to `max` characters.
pub fn is_free_text(s: &str, min: usize, max: usize) -> bool {
    let n = s.chars().count();
    (min..=max).contains(&n)
        && !s
            .chars()
            .any(|c| matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'))
}

/// [`MAC_PATTERN`].
pub fn is_mac(s: &str) -> bool {
    let parts: Vec<&str> = s.split(':').collect();
    parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// [`PROFILE_ID_PATTERN`].
pub fn is_profile_id(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        })
}

/// [`HOSTNAME_PATTERN`].
pub fn is_hostname(s: &str) -> bool {
    (1..=253).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_text_has_a_visible_character_and_no_control() {
        for good in ["a", " a ", "Rack 12 · U3", "\u{3000}x", "\u{a0}"] {
            assert!(is_printable(good, 128), "{good:?}");
        }
        for bad in [
            "",
            " ",
            "   ",
            "a\nb",
            "\u{0}",
            "tab\there",
            "\u{85}",
            "\u{9f}x",
        ] {
            assert!(!is_printable(bad, 128), "{bad:?}");
        }
        assert!(is_printable(&"x".repeat(128), 128));
        assert!(!is_printable(&"x".repeat(129), 128));
        assert!(is_printable(&"é".repeat(128), 128), "characters, not bytes");
    }

    #[test]
    fn the_other_rules() {
        assert!(is_free_text("", 0, 4) && !is_free_text("", 1, 4));
        assert!(!is_free_text("a\u{0}", 0, 4) && is_free_text("a\u{85}", 0, 4));
        assert!(
            is_mac("52:54:00:AA:00:01")
                && !is_mac("52-54-00-aa-00-01")
                && !is_mac("52:54:00:aa:00")
        );
        assert!(
            is_profile_id("ubuntu-24.04_gpu") && !is_profile_id("Ubuntu") && !is_profile_id("")
        );
        assert!(is_hostname("node-1.lab") && !is_hostname("node 1") && !is_hostname(""));
    }
}
