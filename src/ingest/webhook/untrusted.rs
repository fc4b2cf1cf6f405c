//! Text that came with a request (a ref, a delivery id, a header, an error
//! quoting the payload), made safe for a log line: control characters are
//! escaped, so a newline cannot start a forged line in the text log, and the
//! length is capped, so a 100,000-character ref is not logged whole. The JSON
//! log escapes on its own, but it gets the same cap.
//!
//! Every value a request brings goes through [`Untrusted`] before it reaches
//! `tracing`: `git_ref = %Untrusted(&push.git_ref)`.

use std::fmt::{self, Write as _};

/// Characters of an untrusted value written to a log line; the rest is
/// counted, not written.
pub const MAX_LOGGED: usize = 200;

/// A request-derived value, displayed escaped and cut at `MAX_LOGGED`
/// characters (or at the cap given to [`Untrusted::capped`]).
#[derive(Clone, Copy)]
pub struct Untrusted<'a>(pub &'a str);

impl<'a> Untrusted<'a> {
    /// The same, cut at `cap` characters, for a short echo in a message.
    pub fn capped(value: &'a str, cap: usize) -> Capped<'a> {
        Capped { value, cap }
    }
}

impl fmt::Display for Untrusted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_escaped(f, self.0, MAX_LOGGED)
    }
}

impl fmt::Debug for Untrusted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_char('"')?;
        write_escaped(f, self.0, MAX_LOGGED)?;
        f.write_char('"')
    }
}

/// [`Untrusted`] with a cap of its own.
#[derive(Clone, Copy)]
pub struct Capped<'a> {
    value: &'a str,
    cap: usize,
}

impl fmt::Display for Capped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_escaped(f, self.value, self.cap)
    }
}

/// `value` with every character that could end or disguise a line escaped,
/// cut after `cap` characters with a note of what was left out.
fn write_escaped(f: &mut fmt::Formatter<'_>, value: &str, cap: usize) -> fmt::Result {
    let mut chars = value.char_indices();
    for (_, c) in chars.by_ref().take(cap) {
        match c {
            '\n' => f.write_str("\\n")?,
            '\r' => f.write_str("\\r")?,
            '\t' => f.write_str("\\t")?,
            '\\' => f.write_str("\\\\")?,
            c if needs_escape(c) => write!(f, "\\u{{{:x}}}", c as u32)?,
            c => f.write_char(c)?,
        }
    }
    if let Some((at, _)) = chars.next() {
        write!(f, "…({} more bytes)", value.len() - at)?;
    }
    Ok(())
}

/// Controls (C0, DEL, C1), the Unicode line and paragraph separators, and
/// the bidirectional overrides that make a line read other than it is.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_escaped_and_plain_text_kept() {
        assert_eq!(Untrusted("refs/heads/main").to_string(), "refs/heads/main");
        assert_eq!(
            Untrusted("main\n2026-01-01T00:00:00Z  INFO forged\r\u{1b}[31m\u{7f}").to_string(),
            "main\\n2026-01-01T00:00:00Z  INFO forged\\r\\u{1b}[31m\\u{7f}"
        );
        assert_eq!(Untrusted("a\\nb").to_string(), "a\\\\nb");
        assert_eq!(
            Untrusted("x\u{2028}y\u{202e}z\u{85}").to_string(),
            "x\\u{2028}y\\u{202e}z\\u{85}"
        );
        assert_eq!(Untrusted("ünïcødé ✓").to_string(), "ünïcødé ✓");
        assert_eq!(format!("{:?}", Untrusted("a\nb")), "\"a\\nb\"");
    }

    #[test]
    fn long_values_are_cut_and_say_so() {
        let long = "r".repeat(100_000);
        let shown = Untrusted(&long).to_string();
        assert_eq!(
            shown,
            format!("{}…(99800 more bytes)", "r".repeat(MAX_LOGGED))
        );
        let exact = "r".repeat(MAX_LOGGED);
        assert_eq!(Untrusted(&exact).to_string(), exact);
        assert_eq!(
            Untrusted::capped("héllo world", 5).to_string(),
            "héllo…(6 more bytes)"
        );
    }
}
