//! The README's count as a service, the way it runs in Kubernetes: stopped with SIGTERM (or Ctrl-C), a
//! readiness probe, and lookups of one key's state, on a small HTTP endpoint.
//!
//! Run: `cargo run --example service -- --bootstrap host:port --input events --snapshots counts --group
//! counter [--http 127.0.0.1:8080]`. The snapshot topic is created if missing; a fresh group starts at the
//! first event. It prints `listening on http://ADDR` first, then serves:
//! - `GET /ready`: 200 once every assigned partition has recovered and caught up with the input that was
//!   there when it was assigned, 503 (with each partition's progress) before;
//! - `GET /count/KEY`: 200 with KEY's count, 404 when KEY has none, 421 when another member holds it.
//!
//! On SIGTERM or SIGINT it flushes, commits, leaves the group and prints `stopped cleanly`.

use std::time::Duration;

use bytes::Bytes;
use snapfence::consumer::{GroupConfig, GroupConsumerConfig, OffsetReset};
use snapfence::records::Record;
use snapfence::snapshot::{
    BoxError, Change, Flow, FlowConfig, FlowHandle, Fold, LookupError, MissingSnapshotTopic,
    Outputs, SnapshotConfig,
};
use snapfence::{Client, ClientConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

struct Count;
impl Fold for Count {
    type State = u64;
    fn fold(
        &self,
        _key: &Bytes,
        n: &mut Option<u64>,
        _event: &Record,
        _out: &mut Outputs,
    ) -> Change {
        *n.get_or_insert(0) += 1;
        Change::Update
    }
    fn encode(&self, n: &u64) -> Bytes {
        n.to_string().into()
    }
    fn decode(&self, b: &[u8]) -> Result<u64, BoxError> {
        Ok(std::str::from_utf8(b)?.parse()?)
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: &'static str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map_or(default.to_owned(), String::clone)
    };
    // Installed first: a SIGTERM that arrives while the flow starts is not lost.
    let stop = snapfence::shutdown_signal()?;

    let client = Client::connect(ClientConfig::new(arg("--bootstrap", "localhost:9092"))).await?;
    let mut consumer = GroupConsumerConfig::new(GroupConfig::new(arg("--group", "counter")));
    consumer.reader.reset = OffsetReset::Earliest;
    let snapshots = SnapshotConfig::new(arg("--snapshots", "counts"), arg("--group", "counter"));
    let mut config = FlowConfig::new(consumer, arg("--input", "events"), snapshots);
    config.missing_snapshot_topic = MissingSnapshotTopic::Create {
        replication_factor: None,
    };
    let flow = Flow::start(client, config, Count).await?;

    let listener = TcpListener::bind(arg("--http", "127.0.0.1:8080")).await?;
    println!("listening on http://{}", listener.local_addr()?);
    let handle = flow.handle();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            tokio::spawn(answer(conn, handle.clone()));
        }
    });

    flow.run(stop).await?;
    println!("stopped cleanly");
    Ok(())
}

/// Answers one HTTP/1.1 request on `conn` and closes it. Reads at most 8 KiB of request head.
async fn answer(mut conn: TcpStream, flow: FlowHandle<Count>) {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
        match tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => head.extend_from_slice(&buf[..n]),
            _ => return,
        }
    }
    let line = String::from_utf8_lossy(&head);
    let path = line.split_whitespace().nth(1).unwrap_or("/");
    let (status, body) = if path == "/ready" {
        let readiness = flow.readiness();
        if readiness.is_ready() {
            ("200 OK", "ready\n".to_owned())
        } else {
            ("503 Service Unavailable", format!("{readiness:?}\n"))
        }
    } else if let Some(key) = path.strip_prefix("/count/") {
        match flow.get(key.as_bytes()) {
            Ok(found) => match found.state {
                Some(n) => ("200 OK", format!("{n}\n")),
                None => ("404 Not Found", "no count\n".to_owned()),
            },
            Err(e @ LookupError::NotHeld { .. }) => ("421 Misdirected Request", format!("{e}\n")),
            Err(e) => ("500 Internal Server Error", format!("{e}\n")),
        }
    } else {
        ("404 Not Found", "try /ready or /count/KEY\n".to_owned())
    };
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = conn.write_all(response.as_bytes()).await;
}
