//! Kafka Streams for `snapfence-bench job`: its jars, fetched with Maven into a cache folder the first time
//! the benchmark runs (never at build time: CI builds this crate without Maven), and
//! `bench/java/StreamsJob.java` compiled against them.
//!
//! The cache is `<snapfence cache>/kafka-streams/<version>/libs` (the fixture's cache root,
//! `$SNAPFENCE_CACHE` or `~/.cache/snapfence`). Maven copies into a private folder beside it and a rename
//! publishes it, so a half-fetched folder is never used.
//!
//! # References
//! - maven-dependency-plugin 3.6.1 `copy-dependencies` (shared/BROKER.md)

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The Kafka Streams release measured.
pub const VERSION: &str = "4.4.0";
/// Its logging binding: Streams 4.x logs through SLF4J 1.7; warnings and errors go to stderr.
const SLF4J_SIMPLE: &str = "1.7.36";
/// How long Maven may take to fetch the jars, and javac to compile.
const TOOL_TIMEOUT: Duration = Duration::from_secs(600);

/// A runnable Streams job: the classpath for `java -cp`.
#[derive(Debug, Clone)]
pub struct StreamsJar {
    /// `LIBS/*:CLASSES`.
    pub classpath: String,
    /// The folder of jars (to name the rocksdbjni it resolved in the report).
    pub libs: PathBuf,
}

impl StreamsJar {
    /// The rocksdbjni jar Maven resolved, by file name (e.g. `rocksdbjni-10.1.3.jar`).
    pub fn rocksdb(&self) -> String {
        std::fs::read_dir(&self.libs)
            .ok()
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|n| n.starts_with("rocksdbjni-"))
            .unwrap_or_else(|| "no rocksdbjni".into())
    }
}

/// Fetches the jars (once) and compiles StreamsJob.java into `classes`.
pub fn prepare(classes: &Path) -> Result<StreamsJar, Error> {
    let libs = libs_dir()?;
    std::fs::create_dir_all(classes)?;
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("java/StreamsJob.java");
    let jars = format!("{}/*", libs.display());
    let mut javac = Command::new(tool("javac"));
    javac.args(["-cp", &jars, "-d"]).arg(classes).arg(&src);
    run_tool(javac, "javac StreamsJob.java")?;
    Ok(StreamsJar {
        classpath: format!("{jars}:{}", classes.display()),
        libs,
    })
}

/// `$JAVA_HOME/bin/NAME`, or NAME from `PATH`.
pub fn tool(name: &str) -> PathBuf {
    match std::env::var_os("JAVA_HOME").filter(|h| !h.is_empty()) {
        Some(h) => PathBuf::from(h).join("bin").join(name),
        None => PathBuf::from(name),
    }
}

/// The folder of Kafka Streams jars, fetched on first use.
fn libs_dir() -> Result<PathBuf, Error> {
    let root = protocol_tests::cache_root()
        .join("kafka-streams")
        .join(VERSION);
    let libs = root.join("libs");
    if complete(&libs) {
        return Ok(libs);
    }
    std::fs::create_dir_all(&root)?;
    let work = root.join(format!("fetch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    std::fs::write(work.join("pom.xml"), pom())?;
    let out = work.join("libs");
    eprintln!(
        "== fetching kafka-streams {VERSION} with Maven into {}",
        libs.display()
    );
    let mut mvn = Command::new("mvn");
    mvn.current_dir(&work)
        .args([
            "-B",
            "-q",
            "org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy-dependencies",
            "-DincludeScope=runtime",
        ])
        .arg(format!("-DoutputDirectory={}", out.display()));
    run_tool(mvn, "mvn copy-dependencies (kafka-streams)")?;
    if !complete(&out) {
        return Err(format!(
            "Maven finished but {} lacks kafka-streams-{VERSION}.jar or rocksdbjni",
            out.display()
        )
        .into());
    }
    // Another runner may have published it meanwhile: then keep theirs.
    if std::fs::rename(&out, &libs).is_err() && !complete(&libs) {
        return Err(format!("cannot publish {}", libs.display()).into());
    }
    let _ = std::fs::remove_dir_all(&work);
    Ok(libs)
}

/// True when `dir` holds the Streams jar and a RocksDB jar.
fn complete(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    let names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.contains(&format!("kafka-streams-{VERSION}.jar"))
        && names.iter().any(|n| n.starts_with("rocksdbjni-"))
}

/// The pom Maven resolves: kafka-streams (its own kafka-clients and rocksdbjni come with it) and one
/// SLF4J binding.
fn pom() -> String {
    format!(
        r#"<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>snapfence.bench</groupId>
  <artifactId>streams-job</artifactId>
  <version>0</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-streams</artifactId><version>{VERSION}</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-simple</artifactId><version>{SLF4J_SIMPLE}</version></dependency>
  </dependencies>
</project>
"#
    )
}

/// Runs a build tool to its end, killing it after [`TOOL_TIMEOUT`]; fails with the tail of its output.
fn run_tool(mut cmd: Command, what: &str) -> Result<(), Error> {
    let log = std::env::temp_dir().join(protocol_tests::unique("snapfence-bench-tool"));
    let file = std::fs::File::create(&log)?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .map_err(|e| format!("{what}: cannot start: {e}"))?;
    let deadline = Instant::now() + TOOL_TIMEOUT;
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    match status {
        Some(s) if s.success() => Ok(()),
        Some(s) => {
            let tail: Vec<&str> = text.lines().rev().take(20).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            Err(format!("{what} exited with {s}:\n{}", tail.join("\n")).into())
        }
        None => Err(format!("{what} did not finish in {TOOL_TIMEOUT:?}").into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pom_names_streams_and_one_binding() {
        let pom = pom();
        assert!(pom.contains("<artifactId>kafka-streams</artifactId><version>4.4.0</version>"));
        assert_eq!(pom.matches("slf4j-").count(), 1);
    }
}
