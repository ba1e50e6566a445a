//! Text that processes chose (names, command lines, paths, cgroups) shown to a person. Any
//! local user can put control characters in a process name, or characters that are invisible
//! or reorder what a terminal or browser shows (bidi overrides, zero-width joiners): printed
//! raw they move the cursor, recolour the screen, or make `rm -rf /` read as something else.
//! This is the one list of such characters; the terminal and HTML outputs escape them.

/// Characters that draw nothing or change the order or joining of what is drawn: Unicode's
/// format characters and fillers that render blank (bidi embeddings, overrides and isolates,
/// zero-width spaces and joiners, word joiners, variation selectors, tags), and the line and
/// paragraph separators. Control characters are [`char::is_control`].
pub fn is_hidden(c: char) -> bool {
    matches!(c,
        '\u{ad}' | '\u{34f}' | '\u{61c}' | '\u{115f}' | '\u{1160}' | '\u{17b4}' | '\u{17b5}'
        | '\u{180b}'..='\u{180f}'
        | '\u{200b}'..='\u{200f}'
        | '\u{2028}'..='\u{202e}'
        | '\u{2060}'..='\u{206f}'
        | '\u{3164}'
        | '\u{fe00}'..='\u{fe0f}'
        | '\u{feff}' | '\u{ffa0}'
        | '\u{fff9}'..='\u{fffb}'
        | '\u{1bca0}'..='\u{1bca3}'
        | '\u{1d173}'..='\u{1d17a}'
        | '\u{e0000}'..='\u{e007f}'
        | '\u{e0100}'..='\u{e01ef}')
}

/// Must be shown as an escape: a control character or a hidden one.
pub fn needs_escape(c: char) -> bool {
    c.is_control() || is_hidden(c)
}

fn push_escaped(o: &mut String, c: char) {
    if c.is_control() {
        // \n, \t, \r, \u{1b}: how Rust writes them.
        o.extend(c.escape_default());
    } else {
        o.extend(c.escape_unicode());
    }
}

/// One value for the terminal: every control and hidden character escaped, line breaks too.
pub fn for_terminal(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        if needs_escape(c) {
            push_escaped(&mut o, c);
        } else {
            o.push(c);
        }
    }
    o
}

/// A whole screen of output whose values may not all have gone through [`for_terminal`]:
/// everything but its own line breaks escaped, so that no value can reach the terminal raw.
pub fn for_terminal_keep_lines(s: &str) -> String {
    if !s.chars().any(|c| c != '\n' && needs_escape(c)) {
        return s.to_string();
    }
    let mut o = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if c != '\n' && needs_escape(c) {
            push_escaped(&mut o, c);
        } else {
            o.push(c);
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_reordering_characters_are_escaped() {
        // An "evil" name: a terminal escape, a right-to-left override and a zero-width joiner.
        let name = "a\u{1b}[2Jb\u{202e}txt.exe\u{200d}c\nd";
        assert_eq!(
            for_terminal(name),
            "a\\u{1b}[2Jb\\u{202e}txt.exe\\u{200d}c\\nd"
        );
        for c in [
            '\u{2066}',
            '\u{2069}',
            '\u{61c}',
            '\u{feff}',
            '\u{e0041}',
            '\u{2028}',
            '\u{85}',
        ] {
            assert!(needs_escape(c), "{c:?}");
        }
        for c in ['a', 'é', '中', '€', ' ', '-', '\u{1f600}'] {
            assert!(!needs_escape(c), "{c:?}");
        }
    }

    #[test]
    fn a_screen_keeps_its_lines_and_nothing_else() {
        assert_eq!(for_terminal_keep_lines("x\ny\n"), "x\ny\n");
        assert_eq!(
            for_terminal_keep_lines("pid 1 \u{202e}abc\tz\n"),
            "pid 1 \\u{202e}abc\\tz\n"
        );
    }
}
