//! The progress line of a standalone measurement (`ethand snapshot PID` with no daemon).

/// One progress line on stderr ("measuring pid 42: 3/10 s"), rewritten in place and cleared
/// on drop; nothing at all when stderr is not a terminal (a file, a pipe, the journal).
pub struct Progress {
    label: String,
    total_s: u64,
    shown_s: Option<u64>,
    on: bool,
}

/// Back to the start of the line, and the line erased.
const CLEAR_LINE: &str = "\r\x1b[K";

impl Progress {
    pub fn new(label: String, total: std::time::Duration) -> Self {
        use std::io::IsTerminal as _;
        Self {
            label,
            total_s: total.as_secs(),
            shown_s: None,
            on: std::io::stderr().is_terminal(),
        }
    }

    pub fn show(&mut self, elapsed: std::time::Duration) {
        if let Some(line) = self.on.then(|| self.update(elapsed)).flatten() {
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        }
    }

    /// What to write for `elapsed`: None when the shown second has not changed.
    fn update(&mut self, elapsed: std::time::Duration) -> Option<String> {
        let s = elapsed.as_secs().min(self.total_s);
        if self.shown_s == Some(s) {
            return None;
        }
        self.shown_s = Some(s);
        Some(format!(
            "{CLEAR_LINE}{}: {s}/{} s",
            self.label, self.total_s
        ))
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if self.on && self.shown_s.is_some() {
            let _ = std::io::Write::write_all(&mut std::io::stderr(), CLEAR_LINE.as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_line_is_rewritten_once_per_second() {
        let mut p = Progress {
            label: "measuring pid 42".into(),
            total_s: 3,
            shown_s: None,
            on: false,
        };
        let ms = std::time::Duration::from_millis;
        let lines: Vec<Option<String>> = [250, 900, 1000, 2600, 3100, 3500]
            .into_iter()
            .map(|t| p.update(ms(t)))
            .collect();
        let want = |s: &str| Some(format!("\r\x1b[Kmeasuring pid 42: {s} s"));
        assert_eq!(
            lines,
            [
                want("0/3"),
                None,
                want("1/3"),
                want("2/3"),
                want("3/3"),
                None
            ]
        );
    }
}
