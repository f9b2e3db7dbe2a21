//! `--metrics-addr`: the process's metrics in the Prometheus text format, over HTTP, while a long
//! command runs.
//!
//! A recorder of its own plus a small HTTP/1.1 responder, rather than `metrics-exporter-prometheus`:
//! that crate's HTTP listener brings hyper, hyper-util and metrics-util (with quanta and crossbeam) to
//! answer one `GET`, a long build on a small machine for a tool that serves a few dozen series to one
//! scraper; and its default features pull aws-lc-rs, which builds C. This file is the whole exporter:
//! counters, gauges and histograms with fixed buckets, rendered in the text exposition format, served to
//! any client that asks for `/metrics` (or `/`) and closed after each answer.
//!
//! # References
//! - Prometheus text exposition format 0.0.4:
//!   <https://prometheus.io/docs/instrumenting/exposition_formats/#text-based-format>

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::error::CliError;

/// Bucket bounds of `_seconds` histograms: from half a millisecond (a local round trip) to a minute (a
/// JoinGroup waiting out a rebalance).
const SECONDS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];
/// Bucket bounds of `_writes` histograms (writes per transaction): powers of two up to 4096.
const COUNTS: &[f64] = &[
    0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
];
/// Bucket bounds of any other histogram (sizes): powers of four from 64 bytes to 64 MiB.
const SIZES: &[f64] = &[
    64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0,
    67108864.0,
];

/// An `f64` updated in place: its bits in an atomic, added to by compare-and-swap.
#[derive(Default)]
struct AtomicF64(AtomicU64);

impl AtomicF64 {
    fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
    fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }
    fn add(&self, v: f64) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + v).to_bits())
            });
    }
}

#[derive(Default)]
struct CounterCell(AtomicU64);

impl CounterFn for CounterCell {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::Relaxed);
    }
    fn absolute(&self, value: u64) {
        self.0.fetch_max(value, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct GaugeCell(AtomicF64);

impl GaugeFn for GaugeCell {
    fn increment(&self, value: f64) {
        self.0.add(value);
    }
    fn decrement(&self, value: f64) {
        self.0.add(-value);
    }
    fn set(&self, value: f64) {
        self.0.set(value);
    }
}

struct HistogramCell {
    bounds: &'static [f64],
    /// Per bucket, not cumulative; the last one is `+Inf`.
    counts: Box<[AtomicU64]>,
    sum: AtomicF64,
}

impl HistogramCell {
    fn new(name: &str) -> HistogramCell {
        let bounds = if name.ends_with("_seconds") {
            SECONDS
        } else if name.ends_with("_writes") {
            COUNTS
        } else {
            SIZES
        };
        HistogramCell {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicF64::default(),
        }
    }
}

impl HistogramFn for HistogramCell {
    fn record(&self, value: f64) {
        let bucket = self.bounds.partition_point(|b| *b < value);
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum.add(value);
    }
}

enum Series {
    Counter(Arc<CounterCell>),
    Gauge(Arc<GaugeCell>),
    Histogram(Arc<HistogramCell>),
}

impl Series {
    fn kind(&self) -> &'static str {
        match self {
            Series::Counter(_) => "counter",
            Series::Gauge(_) => "gauge",
            Series::Histogram(_) => "histogram",
        }
    }
}

/// A metric's label pairs, in the order they were given.
pub(crate) type Labels = Vec<(String, String)>;

/// Everything recorded in this process, by name and then by label set.
#[derive(Default)]
pub(crate) struct Registry {
    help: Mutex<HashMap<String, String>>,
    series: Mutex<BTreeMap<String, BTreeMap<Labels, Series>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Each critical section is one map lookup or insertion; a panic cannot leave one half done.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Registry {
    fn register<T>(
        &self,
        key: &Key,
        make: impl FnOnce() -> Series,
        pick: impl FnOnce(&Series) -> Option<T>,
    ) -> Option<T> {
        let labels = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        let mut series = lock(&self.series);
        let by_labels = series.entry(key.name().to_owned()).or_default();
        // A name registered as two kinds is a bug in the caller; the second kind records nowhere.
        pick(by_labels.entry(labels).or_insert_with(make))
    }

    fn describe(&self, key: KeyName, help: SharedString) {
        lock(&self.help).insert(key.as_str().to_owned(), help.to_string());
    }

    /// Every series of the counter `name` recorded so far, with its value.
    pub(crate) fn counter_values(&self, name: &str) -> Vec<(Labels, u64)> {
        let series = lock(&self.series);
        let Some(by_labels) = series.get(name) else {
            return Vec::new();
        };
        by_labels
            .iter()
            .filter_map(|(labels, s)| match s {
                Series::Counter(c) => Some((labels.clone(), c.0.load(Ordering::Relaxed))),
                _ => None,
            })
            .collect()
    }

    /// The text exposition format of everything recorded so far.
    pub(crate) fn render(&self) -> String {
        let help = lock(&self.help).clone();
        let series = lock(&self.series);
        let mut out = String::new();
        for (name, by_labels) in series.iter() {
            let Some(first) = by_labels.values().next() else {
                continue;
            };
            if let Some(h) = help.get(name) {
                let _ = writeln!(
                    out,
                    "# HELP {name} {}",
                    h.replace('\\', "\\\\").replace('\n', "\\n")
                );
            }
            let _ = writeln!(out, "# TYPE {name} {}", first.kind());
            for (labels, s) in by_labels {
                match s {
                    Series::Counter(c) => {
                        let _ = writeln!(
                            out,
                            "{name}{} {}",
                            labels_text(labels, None),
                            c.0.load(Ordering::Relaxed)
                        );
                    }
                    Series::Gauge(g) => {
                        let _ = writeln!(
                            out,
                            "{name}{} {}",
                            labels_text(labels, None),
                            number(g.0.get())
                        );
                    }
                    Series::Histogram(h) => {
                        let mut cumulative = 0u64;
                        for (i, count) in h.counts.iter().enumerate() {
                            cumulative += count.load(Ordering::Relaxed);
                            let le = h.bounds.get(i).map_or("+Inf".to_owned(), |b| number(*b));
                            let _ = writeln!(
                                out,
                                "{name}_bucket{} {cumulative}",
                                labels_text(labels, Some(&le))
                            );
                        }
                        let l = labels_text(labels, None);
                        let _ = writeln!(out, "{name}_sum{l} {}", number(h.sum.get()));
                        let _ = writeln!(out, "{name}_count{l} {cumulative}");
                    }
                }
            }
        }
        out
    }
}

/// `{k="v",...}` with `le` last when given; empty for no labels.
fn labels_text(labels: &Labels, le: Option<&str>) -> String {
    let mut parts: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    if let Some(le) = le {
        parts.push(format!("le=\"{le}\""));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn number(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        format!("{v}")
    }
}

/// The registry as the process's recorder.
struct Installed(Arc<Registry>);

impl Recorder for Installed {
    fn describe_counter(&self, key: KeyName, _: Option<Unit>, help: SharedString) {
        self.0.describe(key, help);
    }
    fn describe_gauge(&self, key: KeyName, _: Option<Unit>, help: SharedString) {
        self.0.describe(key, help);
    }
    fn describe_histogram(&self, key: KeyName, _: Option<Unit>, help: SharedString) {
        self.0.describe(key, help);
    }

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.0
            .register(
                key,
                || Series::Counter(Arc::default()),
                |s| match s {
                    Series::Counter(c) => Some(Counter::from_arc(c.clone())),
                    _ => None,
                },
            )
            .unwrap_or_else(Counter::noop)
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.0
            .register(
                key,
                || Series::Gauge(Arc::default()),
                |s| match s {
                    Series::Gauge(g) => Some(Gauge::from_arc(g.clone())),
                    _ => None,
                },
            )
            .unwrap_or_else(Gauge::noop)
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.0
            .register(
                key,
                || Series::Histogram(Arc::new(HistogramCell::new(key.name()))),
                |s| match s {
                    Series::Histogram(h) => Some(Histogram::from_arc(h.clone())),
                    _ => None,
                },
            )
            .unwrap_or_else(Histogram::noop)
    }
}

/// Installs this process's recorder (once; later calls return the same registry). It must happen
/// before the cluster is connected: connections register their handles when they open.
pub(crate) fn install() -> Result<Arc<Registry>, CliError> {
    static INSTALLED: OnceLock<Option<Arc<Registry>>> = OnceLock::new();
    let registry = INSTALLED.get_or_init(|| {
        let registry = Arc::new(Registry::default());
        metrics::set_global_recorder(Installed(registry.clone()))
            .ok()
            .map(|()| registry)
    });
    let registry = registry.clone().ok_or_else(|| CliError::Usage {
        message: "cannot serve metrics: another metrics recorder is already installed".into(),
        hint: "run the command without --metrics-addr".into(),
    })?;
    snapfence::describe_metrics();
    Ok(registry)
}

/// The HTTP listener; it stops when dropped.
pub(crate) struct Served {
    /// Where it listens (the real port when `:0` was asked for).
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts answering scrapes of `registry` on `addr`.
pub(crate) async fn serve(addr: &str, registry: Arc<Registry>) -> Result<Served, CliError> {
    let listener = TcpListener::bind(addr).await.map_err(|e| CliError::Usage {
        message: format!("cannot serve metrics on {addr}: {e}"),
        hint: "pass --metrics-addr a free HOST:PORT (port 0 picks one)".into(),
    })?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                // Out of file descriptors, say: wait a little rather than spin.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let registry = registry.clone();
            tokio::spawn(async move {
                // A scraper that stalls is dropped; it only ever loses its own answer.
                let _ =
                    tokio::time::timeout(Duration::from_secs(10), answer(stream, &registry)).await;
            });
        }
    });
    Ok(Served { addr, task })
}

/// Largest request head read; a scrape's is a few hundred bytes.
const MAX_HEAD: usize = 8 * 1024;

/// Reads one request head and answers it; the connection closes after the answer.
async fn answer(mut stream: TcpStream, registry: &Registry) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() >= MAX_HEAD {
            return respond(&mut stream, "431 Request Header Fields Too Large", "").await;
        }
        let mut chunk = [0u8; 1024];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&chunk[..n]);
    }
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let mut words = std::str::from_utf8(line).unwrap_or_default().split(' ');
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics" | "/") => respond(&mut stream, "200 OK", &registry.render()).await,
        ("GET", _) => respond(&mut stream, "404 Not Found", "try /metrics\n").await,
        _ => respond(&mut stream, "405 Method Not Allowed", "").await,
    }
}

async fn respond(stream: &mut TcpStream, status: &str, body: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &'static str, labels: &[(&'static str, &'static str)]) -> Key {
        let labels: Vec<metrics::Label> = labels
            .iter()
            .map(|(k, v)| metrics::Label::new(*k, *v))
            .collect();
        Key::from_parts(name, labels)
    }

    /// The three kinds render as the text format wants them: counters and gauges as one line per label
    /// set, histograms as cumulative buckets ending in `+Inf`, then `_sum` and `_count`.
    #[test]
    fn renders_the_text_exposition_format() {
        let registry = Arc::new(Registry::default());
        let r = Installed(registry.clone());
        let meta = Metadata::new("t", metrics::Level::INFO, None);
        r.describe_counter(
            KeyName::from_const_str("x_bytes_total"),
            None,
            SharedString::const_str("Bytes \"sent\""),
        );
        r.register_counter(&key("x_bytes_total", &[]), &meta)
            .increment(42);
        r.register_gauge(&key("x_in_flight", &[]), &meta)
            .increment(2.0);
        let h = r.register_histogram(&key("x_seconds", &[("api", "Fe\"tch")]), &meta);
        h.record(0.0007);
        h.record(0.2);
        h.record(1000.0);
        let text = registry.render();
        assert!(
            text.contains("# HELP x_bytes_total Bytes \"sent\"\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE x_bytes_total counter\nx_bytes_total 42\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE x_in_flight gauge\nx_in_flight 2\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE x_seconds histogram\n"), "{text}");
        assert!(
            text.contains("x_seconds_bucket{api=\"Fe\\\"tch\",le=\"0.0005\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("x_seconds_bucket{api=\"Fe\\\"tch\",le=\"0.001\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("x_seconds_bucket{api=\"Fe\\\"tch\",le=\"0.25\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("x_seconds_bucket{api=\"Fe\\\"tch\",le=\"+Inf\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("x_seconds_count{api=\"Fe\\\"tch\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("x_seconds_sum{api=\"Fe\\\"tch\"} 1000.2007"),
            "{text}"
        );
    }

    /// A count histogram (writes per transaction) gets buckets for counts, starting at 0 (an
    /// offset-only transaction), not the byte sizes' 64 and up; counter values are read back by name,
    /// one per label set.
    #[test]
    fn count_histograms_and_counter_values() {
        let registry = Arc::new(Registry::default());
        let r = Installed(registry.clone());
        let meta = Metadata::new("t", metrics::Level::INFO, None);
        let h = r.register_histogram(&key("x_writes", &[]), &meta);
        h.record(0.0);
        h.record(3.0);
        let text = registry.render();
        assert!(text.contains("x_writes_bucket{le=\"0\"} 1\n"), "{text}");
        assert!(text.contains("x_writes_bucket{le=\"4\"} 2\n"), "{text}");
        for (labels, n) in [
            (&[("class", "fatal")][..], 2),
            (&[("class", "abortable")][..], 5),
        ] {
            r.register_counter(&key("x_total", labels), &meta)
                .increment(n);
        }
        let mut values = registry.counter_values("x_total");
        values.sort();
        let class = |v: &str| vec![("class".to_owned(), v.to_owned())];
        assert_eq!(values, vec![(class("abortable"), 5), (class("fatal"), 2)]);
        assert!(registry.counter_values("missing_total").is_empty());
    }

    /// A scrape over a real socket gets the rendered text; anything else gets a 404.
    #[tokio::test]
    async fn serves_metrics_over_http() {
        let registry = Arc::new(Registry::default());
        let meta = Metadata::new("t", metrics::Level::INFO, None);
        Installed(registry.clone())
            .register_counter(&key("y_total", &[]), &meta)
            .increment(7);
        let served = serve("127.0.0.1:0", registry).await.unwrap();
        let addr = served.addr;
        let get = move |path: &'static str| async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut text = String::new();
            s.read_to_string(&mut text).await.unwrap();
            text
        };
        let text = get("/metrics").await;
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(
            text.ends_with("\r\n\r\n# TYPE y_total counter\ny_total 7\n"),
            "{text}"
        );
        assert!(get("/nope").await.starts_with("HTTP/1.1 404"));
    }
}
