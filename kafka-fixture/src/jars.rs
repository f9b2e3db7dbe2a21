//! The Kafka broker jars: fetched once from Maven Central with `mvn`, then kept in a stable cache folder so
//! every later run starts offline.
//!
//! # Why the cache looks like this
//! `<cache>/kafka/<version>/libs` only ever appears whole: Maven copies into a private temp folder beside it,
//! the folder is checked (the broker jar is there, exactly one SLF4J binding), and a `rename` publishes it.
//! A second test process that starts at the same moment blocks on `flock` of `<cache>/kafka/<version>/.lock`
//! and then finds the finished folder, so neither corrupts the other (nor the shared `~/.m2`).
//!
//! # References
//! - maven-dependency-plugin 3.6.1 `copy-dependencies` (`-DincludeScope=runtime`)
//! - Kafka 3.9 logs through SLF4J 1.7 + reload4j; Kafka 4.x through SLF4J 1.7 + Log4j 2 (`log4j-slf4j-impl`)

use std::fs::{self, File};
use std::io::Write as _;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::progress::{Observer, Progress, Step};
use crate::{FixtureError, KafkaVersion};

/// Artifacts of an SLF4J 1.7 binding (or an SLF4J 2 provider). A folder with two of these makes SLF4J pick
/// one at random and warn; a folder with none makes the broker log nothing at all.
const SLF4J_BINDINGS: &[&str] = &[
    "slf4j-reload4j-",
    "slf4j-log4j12-",
    "log4j-slf4j-impl-",
    "log4j-slf4j2-impl-",
    "logback-classic-",
    "slf4j-simple-",
    "slf4j-jdk14-",
    "slf4j-nop-",
];

/// The folder every fixture file lives under: `$SNAPFENCE_CACHE`, else `$XDG_CACHE_HOME/snapfence`, else
/// `~/.cache/snapfence`.
pub fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("SNAPFENCE_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("snapfence");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    home.join(".cache").join("snapfence")
}

/// The `java` to run: `$JAVA_HOME/bin/java` when `JAVA_HOME` is set, else `java` from `PATH`.
pub fn java_binary() -> PathBuf {
    match std::env::var_os("JAVA_HOME").filter(|d| !d.is_empty()) {
        Some(home) => PathBuf::from(home).join("bin").join("java"),
        None => PathBuf::from("java"),
    }
}

/// Fails with a message naming the tool and how to install it when `program --version`-style probing
/// cannot even start it.
pub fn require_tool(program: &Path, probe_arg: &str, why: &str) -> Result<(), FixtureError> {
    let status = Command::new(program)
        .arg(probe_arg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    match status {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(FixtureError::MissingTool {
            tool: program.display().to_string(),
            detail: format!("`{} {probe_arg}` exited with {s}. {why}", program.display()),
        }),
        Err(e) => Err(FixtureError::MissingTool {
            tool: program.display().to_string(),
            detail: format!("cannot run `{}`: {e}. {why}", program.display()),
        }),
    }
}

const JAVA_HINT: &str = "The Kafka test fixture runs the broker on a JVM: install Java 17+ \
     (`apt-get install -y openjdk-17-jre-headless`) or point JAVA_HOME at one.";
const MAVEN_HINT: &str =
    "The Kafka test fixture fetches the broker jars from Maven Central with Maven \
     on first use: install it (`apt-get install -y maven`), or fill the cache folder by hand.";

/// Makes sure a JVM can be started; returns what `java -version` printed (it identifies the JVM build).
pub fn require_java() -> Result<String, FixtureError> {
    let java = java_binary();
    match Command::new(&java)
        .arg("-version")
        .stdin(Stdio::null())
        .output()
    {
        Ok(out) if out.status.success() => Ok(String::from_utf8_lossy(&out.stderr).into_owned()),
        Ok(out) => Err(FixtureError::MissingTool {
            tool: java.display().to_string(),
            detail: format!(
                "`{} -version` exited with {}. {JAVA_HINT}",
                java.display(),
                out.status
            ),
        }),
        Err(e) => Err(FixtureError::MissingTool {
            tool: java.display().to_string(),
            detail: format!("cannot run `{}`: {e}. {JAVA_HINT}", java.display()),
        }),
    }
}

/// The folder holding every jar the broker of `version` needs (for `-cp "DIR/*"`), fetching it on first use
/// (told to `observe` as it begins and ends).
pub fn libs_dir(version: &KafkaVersion, observe: Observer<'_>) -> Result<PathBuf, FixtureError> {
    let root = cache_root().join("kafka").join(version.as_str());
    let libs = root.join("libs");
    if is_complete(&libs, version) {
        return Ok(libs);
    }
    fs::create_dir_all(&root).map_err(|e| FixtureError::io(&root, e))?;
    let _lock = FileLock::exclusive(&root.join(".lock"))?;
    // Another process may have finished the download while this one waited for the lock.
    if is_complete(&libs, version) {
        return Ok(libs);
    }
    require_tool(Path::new("mvn"), "-v", MAVEN_HINT)?;

    let pom = root.join("pom.xml");
    fs::write(&pom, pom_xml(version)).map_err(|e| FixtureError::io(&pom, e))?;
    let tmp = root.join(format!("libs.tmp-{}", std::process::id()));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(|e| FixtureError::io(&tmp, e))?;
    }
    observe(Progress::Began {
        step: Step::FetchJars,
        version: version.to_string(),
        into: Some(libs.clone()),
    });
    let started = std::time::Instant::now();
    let output = Command::new("mvn")
        .arg("-B")
        .arg("-q")
        .arg("-f")
        .arg(&pom)
        .arg("org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy-dependencies")
        .arg(format!("-DoutputDirectory={}", tmp.display()))
        .arg("-DincludeScope=runtime")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| FixtureError::MissingTool {
            tool: "mvn".into(),
            detail: format!("cannot run `mvn`: {e}. {MAVEN_HINT}"),
        })?;
    if !output.status.success() {
        let _ = fs::remove_dir_all(&tmp);
        return Err(FixtureError::Download {
            version: version.to_string(),
            detail: format!(
                "`mvn ... copy-dependencies -f {}` exited with {}:\n{}{}",
                pom.display(),
                output.status,
                tail(&String::from_utf8_lossy(&output.stdout), 40),
                tail(&String::from_utf8_lossy(&output.stderr), 40),
            ),
        });
    }
    if let Err(detail) = check_folder(&tmp, version) {
        let _ = fs::remove_dir_all(&tmp);
        return Err(FixtureError::Download {
            version: version.to_string(),
            detail,
        });
    }
    // A stale, incomplete `libs` (a half-deleted cache) must not block the publish.
    if libs.exists() {
        fs::remove_dir_all(&libs).map_err(|e| FixtureError::io(&libs, e))?;
    }
    fs::rename(&tmp, &libs).map_err(|e| FixtureError::io(&libs, e))?;
    observe(Progress::Done {
        step: Step::FetchJars,
        took: started.elapsed(),
    });
    Ok(libs)
}

fn is_complete(libs: &Path, version: &KafkaVersion) -> bool {
    libs.join(format!("kafka_2.13-{}.jar", version.as_str()))
        .is_file()
}

/// The broker jar is present and exactly one SLF4J binding sits beside it.
fn check_folder(dir: &Path, version: &KafkaVersion) -> Result<(), String> {
    let names: Vec<String> = fs::read_dir(dir)
        .map_err(|e| format!("cannot list {}: {e}", dir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let broker = format!("kafka_2.13-{}.jar", version.as_str());
    if !names.contains(&broker) {
        return Err(format!(
            "Maven finished but {broker} is not in {}",
            dir.display()
        ));
    }
    let bindings: Vec<&String> = names
        .iter()
        .filter(|n| SLF4J_BINDINGS.iter().any(|b| n.starts_with(b)))
        .collect();
    if bindings.len() != 1 {
        return Err(format!(
            "expected exactly one SLF4J binding in {}, found {:?}",
            dir.display(),
            bindings
        ));
    }
    Ok(())
}

/// Maven coordinates of the broker plus the one logging binding its SLF4J 1.7 API needs.
fn pom_xml(version: &KafkaVersion) -> String {
    let mut deps = vec![(
        "org.apache.kafka",
        "kafka_2.13",
        version.as_str().to_owned(),
    )];
    match version.major() {
        // 3.x ships log4j 1 configs: SLF4J 1.7 → reload4j, the maintained log4j 1 drop-in.
        ..=3 => {
            deps.push(("org.slf4j", "slf4j-reload4j", "1.7.36".into()));
            deps.push(("ch.qos.reload4j", "reload4j", "1.2.25".into()));
        }
        // 4.x moved to Log4j 2 but kept the SLF4J 1.7 API, so the binding is log4j-slf4j-impl, not the
        // slf4j2 one. 4.0/4.1 were built against Log4j 2.24, 4.2+ against 2.25.
        _ => {
            let log4j = if version.minor() <= 1 {
                "2.24.3"
            } else {
                "2.25.3"
            };
            deps.push(("org.apache.logging.log4j", "log4j-slf4j-impl", log4j.into()));
        }
    }
    let mut xml = String::from(
        "<project xmlns=\"http://maven.apache.org/POM/4.0.0\">\n  <modelVersion>4.0.0</modelVersion>\n  \
         <groupId>snapfence.kafka-fixture</groupId>\n  <artifactId>kafka-broker-libs</artifactId>\n",
    );
    xml.push_str(&format!(
        "  <version>{}</version>\n  <packaging>pom</packaging>\n  <dependencies>\n",
        version.as_str()
    ));
    for (group, artifact, v) in deps {
        xml.push_str(&format!(
            "    <dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>\
             <version>{v}</version></dependency>\n"
        ));
    }
    xml.push_str("  </dependencies>\n</project>\n");
    xml
}

/// The last `lines` lines of `text`, for error messages that must stay readable.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    let start = all.len().saturating_sub(lines);
    let mut out = all[start..].join("\n");
    if !out.is_empty() {
        out.push('\n');
    }
    out
}

/// An exclusive `flock` held until drop. The lock dies with the process, so a test binary killed mid-download
/// never leaves the cache locked.
pub struct FileLock {
    _file: File,
}

impl FileLock {
    /// Blocks until the lock on `path` (created if missing) is held.
    pub fn exclusive(path: &Path) -> Result<FileLock, FixtureError> {
        let mut file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| FixtureError::io(path, e))?;
        loop {
            // SAFETY: flock on a descriptor this function owns; no memory is involved.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                break;
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(FixtureError::io(path, err));
            }
        }
        // Who holds it, for a human looking at a stuck run.
        let _ = file.set_len(0);
        let _ = writeln!(file, "{}", std::process::id());
        Ok(FileLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pom_picks_one_binding_per_family() {
        let k4 = pom_xml(&KafkaVersion::new("4.4.0"));
        assert!(k4.contains("log4j-slf4j-impl</artifactId><version>2.25.3"));
        assert!(!k4.contains("reload4j"));
        let k41 = pom_xml(&KafkaVersion::new("4.1.1"));
        assert!(k41.contains("<version>2.24.3</version>"));
        let k39 = pom_xml(&KafkaVersion::new("3.9.2"));
        assert!(k39.contains("slf4j-reload4j"));
        assert!(!k39.contains("log4j-slf4j-impl"));
    }

    #[test]
    fn folder_check_rejects_two_bindings() {
        let dir = std::env::temp_dir().join(format!("snapfence-jars-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let v = KafkaVersion::new("4.4.0");
        fs::write(dir.join("kafka_2.13-4.4.0.jar"), b"").unwrap();
        assert!(
            check_folder(&dir, &v).is_err(),
            "no binding must be refused"
        );
        fs::write(dir.join("log4j-slf4j-impl-2.25.3.jar"), b"").unwrap();
        assert!(check_folder(&dir, &v).is_ok());
        fs::write(dir.join("slf4j-reload4j-1.7.36.jar"), b"").unwrap();
        assert!(
            check_folder(&dir, &v).is_err(),
            "two bindings must be refused"
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
