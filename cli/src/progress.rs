//! A one-line progress indicator for long reads, drawn on stderr only when stderr is a terminal.
//!
//! When the output is piped or captured, nothing is drawn, so logs and JSON consumers never see
//! carriage returns. Redraws are limited to a few per second because a terminal write per fetched batch
//! would cost more than the fetch.

use std::io::Write;
use std::time::{Duration, Instant};

const REDRAW_EVERY: Duration = Duration::from_millis(100);

/// The indicator. Disabled, every method is a no-op.
pub(crate) struct Progress {
    enabled: bool,
    label: String,
    last_draw: Option<Instant>,
    drawn: bool,
}

impl Progress {
    pub fn new(enabled: bool, label: impl Into<String>) -> Progress {
        Progress {
            enabled,
            label: label.into(),
            last_draw: None,
            drawn: false,
        }
    }

    /// Changes the words before the bar (a read that starts waiting says so); shown at the next redraw.
    pub fn set_label(&mut self, label: impl Into<String>) {
        self.label = label.into();
    }

    /// Shows `done` of `total` (a bar when the total is known).
    pub fn update(&mut self, err: &mut dyn Write, done: u64, total: Option<u64>) {
        if !self.enabled {
            return;
        }
        let now = Instant::now();
        if self
            .last_draw
            .is_some_and(|t| now.duration_since(t) < REDRAW_EVERY)
        {
            return;
        }
        self.last_draw = Some(now);
        let line = render(&self.label, done, total);
        // Progress is best effort: a terminal that cannot be written to must not fail the read.
        let _ = write!(err, "\r\x1b[2K{line}");
        let _ = err.flush();
        self.drawn = true;
    }

    /// Erases the line, leaving the terminal as it was.
    pub fn finish(&mut self, err: &mut dyn Write) {
        if self.drawn {
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
            self.drawn = false;
        }
    }
}

fn render(label: &str, done: u64, total: Option<u64>) -> String {
    const WIDTH: u64 = 30;
    match total {
        Some(total) if total > 0 => {
            let done = done.min(total);
            let filled = (done * WIDTH / total) as usize;
            format!(
                "{label} [{}{}] {done}/{total} ({}%)",
                "#".repeat(filled),
                "-".repeat(WIDTH as usize - filled),
                done * 100 / total
            )
        }
        _ => format!("{label} {done}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Disabled progress (stderr not a terminal) writes nothing at all, so piped output never sees a
    /// carriage return.
    #[test]
    fn disabled_progress_writes_nothing() {
        let mut out = Vec::new();
        let mut p = Progress::new(false, "dump");
        p.update(&mut out, 5, Some(10));
        p.finish(&mut out);
        assert!(out.is_empty());
    }

    /// Enabled progress shows the count and percentage, erases its line when done so output stays clean,
    /// and never shows more done than the total.
    #[test]
    fn enabled_progress_draws_and_erases() {
        let mut out = Vec::new();
        let mut p = Progress::new(true, "dump");
        p.update(&mut out, 5, Some(10));
        p.finish(&mut out);
        let s = String::from_utf8(out).unwrap();
        assert!(s.contains("5/10 (50%)"), "{s:?}");
        assert!(s.ends_with("\r\x1b[2K"));
        assert_eq!(
            render("x", 20, Some(10)),
            format!("x [{}] 10/10 (100%)", "#".repeat(30))
        );
    }
}
