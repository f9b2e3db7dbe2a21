//! How values reach the screen: record bytes shown safely, times and ages in human units, aligned tables.
//!
//! Record keys and values are arbitrary bytes. Printing them raw would let a value move the cursor,
//! clear the screen or break a JSON line, so text is shown only when it is valid UTF-8 without control
//! characters, and everything else as hex; both are cut at a byte limit with the full size stated.

use serde_json::{json, Value};

/// How a key or value is shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShownBytes {
    /// `"utf8"` or `"hex"`.
    pub encoding: &'static str,
    /// The (possibly cut) text or hex digits.
    pub data: String,
    /// The full length in bytes.
    pub size: usize,
    /// Whether `data` covers fewer than `size` bytes.
    pub truncated: bool,
}

impl ShownBytes {
    /// Shows `bytes`, cut after `limit` bytes.
    pub fn new(bytes: &[u8], limit: usize) -> ShownBytes {
        let size = bytes.len();
        let cut = &bytes[..size.min(limit)];
        // A cut may split a multi-byte character; the valid prefix is what decides "text".
        let text = match std::str::from_utf8(cut) {
            Ok(s) => Some(s),
            Err(e) if cut.len() < size && e.error_len().is_none() => {
                std::str::from_utf8(&cut[..e.valid_up_to()]).ok()
            }
            Err(_) => None,
        };
        match text.filter(|s| !s.chars().any(char::is_control)) {
            Some(s) => ShownBytes {
                encoding: "utf8",
                truncated: s.len() < size,
                data: s.to_owned(),
                size,
            },
            None => ShownBytes {
                encoding: "hex",
                data: hex(cut),
                size,
                truncated: cut.len() < size,
            },
        }
    }

    /// For text output: `"text"` or `0xhex`, plus `…(N bytes)` when cut.
    pub fn text(&self) -> String {
        let body = match self.encoding {
            "utf8" => format!("{:?}", self.data),
            _ => format!("0x{}", self.data),
        };
        if self.truncated {
            format!("{body}…({} bytes)", self.size)
        } else {
            body
        }
    }

    /// For JSON output.
    pub fn json(&self) -> Value {
        json!({
            "encoding": self.encoding,
            "data": self.data,
            "size": self.size,
            "truncated": self.truncated,
        })
    }
}

/// An optional key or value for text output: `null` for a null field.
pub(crate) fn opt_text(bytes: Option<&[u8]>, limit: usize) -> String {
    bytes.map_or_else(|| "null".to_owned(), |b| ShownBytes::new(b, limit).text())
}

/// An optional key or value for JSON output.
pub(crate) fn opt_json(bytes: Option<&[u8]>, limit: usize) -> Value {
    bytes.map_or(Value::Null, |b| ShownBytes::new(b, limit).json())
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// A duration in milliseconds as `1d2h`, `3h4m`, `5m6s`, `7.8s` or `9ms` (negative: clock skew, shown
/// with a minus sign rather than hidden).
pub(crate) fn age(ms: i64) -> String {
    if ms < 0 {
        return format!("-{}", age(ms.saturating_neg()));
    }
    let s = ms / 1000;
    match s {
        0 => format!("{ms}ms"),
        1..=59 => format!("{}.{}s", s, (ms % 1000) / 100),
        60..=3599 => format!("{}m{}s", s / 60, s % 60),
        3600..=86399 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{}h", s / 86400, (s % 86400) / 3600),
    }
}

/// A Unix time in milliseconds as UTC `YYYY-MM-DDTHH:MM:SS.mmmZ`; `-` for the protocol's "none" (-1).
pub(crate) fn utc(ms: i64) -> String {
    if ms < 0 {
        return "-".into();
    }
    let (days, rem) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3_600_000,
        (rem / 60_000) % 60,
        (rem / 1000) % 60,
        rem % 1000
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (the well-known era-based conversion).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Milliseconds since the Unix epoch by this machine's clock.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis().min(i64::MAX as u128) as i64)
}

/// Rows of cells printed with every column as wide as its widest cell.
pub(crate) struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table {
            rows: vec![header.iter().map(|h| (*h).to_owned()).collect()],
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .map(|s| s.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate() {
                if c + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    let pad = widths[c] - cell.chars().count() + 2;
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Printable UTF-8 is shown as quoted text and anything else as hex, so a value can never send an
    /// escape sequence to the terminal.
    #[test]
    fn text_stays_text_and_the_rest_becomes_hex() {
        let s = ShownBytes::new(b"order-17", 64);
        assert_eq!((s.encoding, s.text().as_str()), ("utf8", "\"order-17\""));
        // An escape sequence must never reach the terminal as is.
        let s = ShownBytes::new(b"\x1b[2Jboom", 64);
        assert_eq!(s.encoding, "hex");
        assert_eq!(s.data, "1b5b324a626f6f6d");
        let s = ShownBytes::new(&[0xff, 0x00, 0x10], 64);
        assert_eq!(s.text(), "0xff0010");
    }

    /// A value longer than the limit is cut, never inside a UTF-8 character, and says its full size.
    #[test]
    fn long_values_are_cut_with_their_size() {
        let s = ShownBytes::new(&[b'a'; 100], 8);
        assert!(s.truncated);
        assert_eq!(s.text(), "\"aaaaaaaa\"…(100 bytes)");
        assert_eq!(s.json()["size"], 100);
        // Cutting inside "é" (2 bytes) keeps the text reading.
        let s = ShownBytes::new("abé".as_bytes(), 3);
        assert_eq!(
            (s.encoding, s.data.as_str(), s.truncated),
            ("utf8", "ab", true)
        );
        let s = ShownBytes::new(&[0xff; 10], 2);
        assert_eq!((s.data.as_str(), s.truncated), ("ffff", true));
    }

    /// Ages print in the largest units that read naturally, negative ones included, times as UTC ISO
    /// 8601 to the millisecond, and a -1 timestamp as "-".
    #[test]
    fn ages_and_times_read_naturally() {
        assert_eq!(age(12), "12ms");
        assert_eq!(age(1_250), "1.2s");
        assert_eq!(age(192_000), "3m12s");
        assert_eq!(age(3 * 3_600_000 + 60_000), "3h1m");
        assert_eq!(age(-1_500), "-1.5s");
        assert_eq!(utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(1_709_251_199_999), "2024-02-29T23:59:59.999Z");
        assert_eq!(utc(-1), "-");
    }

    /// Table columns are padded to their widest cell so they line up.
    #[test]
    fn tables_align_columns() {
        let mut t = Table::new(&["A", "LONGER"]);
        t.row(vec!["wide cell".into(), "x".into()]);
        assert_eq!(t.render(), "A          LONGER\nwide cell  x\n");
    }
}
