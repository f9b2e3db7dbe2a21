//! Delivered records in the line format the Java peer (`protocol-tests/java/RecordsFixture.java`) prints:
//! `offset \t key \t value \t headers`. Shared, by path, between the offline fixture test in the library
//! and the live broker test in protocol-tests, so both compare against Java in exactly the same words.

use super::Visible;

/// Our delivered records in the Java peer's line format.
pub(crate) fn render(v: &Visible) -> Vec<String> {
    let text =
        |b: Option<&[u8]>| b.map_or("null".into(), |b| String::from_utf8_lossy(b).into_owned());
    v.iter()
        .map(|r| {
            let headers: Vec<String> = r
                .headers()
                .map(|(k, v)| format!("{}={}", String::from_utf8_lossy(k), text(v)))
                .collect();
            let headers = if headers.is_empty() {
                "-".to_owned()
            } else {
                headers.join(",")
            };
            format!(
                "{}\t{}\t{}\t{headers}",
                r.offset(),
                text(r.key()),
                text(r.value())
            )
        })
        .collect()
}
