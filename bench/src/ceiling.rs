//! The broker's own ceiling for a plain burst: Kafka's `kafka-producer-perf-test`
//! (`org.apache.kafka.tools.ProducerPerformance`, in the broker's jars) writing the same records to the
//! same kind of topic with the Java peer's producer settings, as a client of the runner
//! (`snapfence-bench ceiling CLASSPATH plain-burst BOOTSTRAP TOPIC N SIZE LINGER_MS PARTITIONS`). The
//! tool's class is in `org.apache.kafka:kafka-tools`, which the broker does not depend on: [`classpath`]
//! fetches that one jar with Maven beside the broker's, once.
//!
//! The tool measures from its first send, cold: a fresh JVM, the metadata fetch and the connection
//! inside the clock, where every other client warms up first. So it writes [`STEADY`] times the burst's
//! records and the ceiling is its steady rate: the time the burst's `N` records take at the rate the
//! tool reports for all of them. Its records go where its default partitioner puts them (a batch at a
//! time to each partition in turn), not record `i` to partition `i % PARTITIONS`; over twenty bursts'
//! worth that spreads them evenly, which is what B' measures.

use std::path::Path;
use std::process::Command;

use crate::workload::Outcome;

/// How many bursts' worth of records the tool writes, so that its cold start weighs little (B' on one
/// node: 1 burst 683 ms, 5 bursts 366 ms, 20 bursts 181 ms; but 20 bursts, 640 MB a run, filled the
/// broker's disk and slowed every client of the run after it). `SNAPFENCE_BENCH_CEILING_BURSTS`
/// overrides it. The tool's topic is deleted after each run.
const STEADY: usize = 10;

pub fn main(args: &[String]) -> i32 {
    match run(args) {
        Ok(outcome) => {
            println!("{outcome}");
            0
        }
        Err(e) => {
            eprintln!("ERROR {e}");
            1
        }
    }
}

/// The classpath that runs the tool: the broker's jars in `libs` and `kafka-tools` of their version,
/// fetched into `libs/../tools` when not there yet.
pub fn classpath(libs: &Path) -> Result<String, String> {
    let version = std::fs::read_dir(libs)
        .map_err(|e| format!("{}: {e}", libs.display()))?
        .flatten()
        .find_map(|f| {
            let name = f.file_name().to_string_lossy().into_owned();
            Some(
                name.strip_prefix("kafka-clients-")?
                    .strip_suffix(".jar")?
                    .to_owned(),
            )
        })
        .ok_or_else(|| format!("no kafka-clients jar in {}", libs.display()))?;
    let tools = libs.with_file_name("tools");
    let jar = tools.join(format!("kafka-tools-{version}.jar"));
    if !jar.is_file() {
        let out = Command::new("mvn")
            .args([
                "-B",
                "-q",
                "org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy",
            ])
            .arg(format!("-Dartifact=org.apache.kafka:kafka-tools:{version}"))
            .arg(format!("-DoutputDirectory={}", tools.display()))
            .current_dir(std::env::temp_dir())
            .output()
            .map_err(|e| format!("mvn did not start: {e}"))?;
        if !out.status.success() || !jar.is_file() {
            return Err(format!(
                "fetching kafka-tools {version} failed: {}",
                String::from_utf8_lossy(&out.stdout)
            ));
        }
    }
    Ok(format!("{}/*:{}", libs.display(), jar.display()))
}

fn run(args: &[String]) -> Result<Outcome, String> {
    let [classpath, work, bootstrap, topic, n, size, linger, ..] = args else {
        return Err(
            "usage: ceiling CLASSPATH plain-burst BOOTSTRAP TOPIC N SIZE LINGER_MS [PARTITIONS]"
                .into(),
        );
    };
    if work != "plain-burst" {
        return Err(format!("the ceiling runs plain-burst only, not {work}"));
    }
    let n: usize = n.parse().map_err(|_| format!("bad N {n}"))?;
    let bursts = std::env::var("SNAPFENCE_BENCH_CEILING_BURSTS")
        .ok()
        .and_then(|b| b.parse().ok())
        .unwrap_or(STEADY);
    let records = n * bursts;
    // The tool's records have no key, which a compacted topic refuses: it writes to a topic of the same
    // partitions with the default policy.
    let partitions: i32 = args
        .get(7)
        .map_or(Ok(1), |p| p.parse())
        .map_err(|_| "bad PARTITIONS".to_string())?;
    let topic = plain_topic(bootstrap, topic, partitions)?;
    let topic = &topic;
    let java = std::env::var_os("JAVA_HOME")
        .map(|h| std::path::PathBuf::from(h).join("bin/java"))
        .unwrap_or_else(|| "java".into());
    let out = Command::new(java)
        .args([
            "-cp",
            classpath,
            "org.apache.kafka.tools.ProducerPerformance",
        ])
        .args(["--topic", topic, "--num-records", &records.to_string()])
        .args(["--record-size", size, "--throughput", "-1"])
        .arg("--producer-props")
        .arg(format!("bootstrap.servers={bootstrap}"))
        .args(["acks=all", "enable.idempotence=true"])
        .arg(format!("linger.ms={linger}"))
        .arg(format!("batch.size={}", 256 * 1024))
        .output()
        .map_err(|e| format!("java did not start: {e}"))?;
    // The topic goes now, whatever the run's outcome, so its bytes do not weigh on the runs after it.
    let deleted = admin(bootstrap, |client| async move {
        snapfence::admin::delete_topic(&client, topic).await?;
        Ok(())
    });
    if let Err(e) = deleted {
        eprintln!("deleting {topic} failed: {e}");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "perf-test failed: {} {}",
            stdout.lines().last().unwrap_or_default(),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or_default()
        ));
    }
    let rate = summary_rate(&stdout, records).ok_or_else(|| {
        format!(
            "no summary line for {records} records in: {stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    Ok(Outcome {
        ms: n as f64 / rate * 1e3,
        records: n as u64,
        ..Outcome::default()
    })
}

/// Makes `<topic>-plain` with `partitions` partitions and waits until each answers at its leader.
fn plain_topic(bootstrap: &str, topic: &str, partitions: i32) -> Result<String, String> {
    let name = format!("{topic}-plain");
    let made = name.clone();
    admin(bootstrap, |client| async move {
        snapfence::admin::create_topic(&client, &made, partitions, -1, &[]).await?;
        crate::scale::ready(&client, &made, partitions).await
    })?;
    Ok(name)
}

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Runs `work` with a client of `bootstrap` on a runtime of its own.
fn admin<F, Fut>(bootstrap: &str, work: F) -> Result<(), String>
where
    F: FnOnce(snapfence::net::Client) -> Fut,
    Fut: std::future::Future<Output = Result<(), Error>>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime
        .block_on(async {
            let client =
                snapfence::net::Client::connect(snapfence::net::ClientConfig::new(bootstrap))
                    .await?;
            work(client).await
        })
        .map_err(|e| e.to_string())
}

/// The records per second of the tool's final summary line, `N records sent, R records/sec (...)`.
fn summary_rate(stdout: &str, records: usize) -> Option<f64> {
    let prefix = format!("{records} records sent, ");
    let line = stdout.lines().rev().find(|l| l.starts_with(&prefix))?;
    let rate = line[prefix.len()..].split_whitespace().next()?;
    rate.parse().ok().filter(|r: &f64| *r > 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The final summary is found among the tool's progress lines, and a run that printed none has no
    /// rate.
    #[test]
    fn the_summary_rate_is_read_from_the_last_line_that_counts_every_record() {
        let out = "48000 records sent, 9583.2 records/sec (9.36 MB/sec), 1.2 ms avg latency, 210.0 ms max latency.\n\
                   160000 records sent, 31250.5 records/sec (30.52 MB/sec), 2.10 ms avg latency, 300.00 ms max latency, 1 ms 50th, 5 ms 95th, 9 ms 99th, 12 ms 99.9th.\n";
        assert_eq!(summary_rate(out, 160000), Some(31250.5));
        assert_eq!(summary_rate(out, 32000), None);
        assert_eq!(summary_rate("", 1), None);
    }
}
