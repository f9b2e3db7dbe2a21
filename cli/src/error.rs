//! The tool's error type: every failure names its cause and the operator's next step, and maps to an
//! exit status a script can branch on.

use snapfence::net::NetError;
use snapfence::records::DecodeError;
use snapfence::snapshot::{SnapshotError, StallDiagnosis};
use snapfence::ErrorCode;

/// Exit status of a run that did what was asked.
pub const EXIT_OK: i32 = 0;
/// Exit status of a failure not covered by a more specific status below.
pub const EXIT_FAILED: i32 = 1;
/// Exit status of a command line that cannot work (also what clap uses for a parse error).
pub const EXIT_USAGE: i32 = 2;
/// Exit status when no broker could be reached.
pub const EXIT_UNREACHABLE: i32 = 3;
/// Exit status when the topic, partition or offset asked for does not exist.
pub const EXIT_NOT_FOUND: i32 = 4;
/// Exit status when the cluster refused the request for lack of permissions.
pub const EXIT_NOT_AUTHORIZED: i32 = 5;
/// Exit status of a recovery read that stopped advancing past its stall deadline (`recover`).
pub const EXIT_STALLED: i32 = 6;
/// The SASL login was refused or the TLS handshake failed.
pub const EXIT_AUTHENTICATION: i32 = 7;
/// The consumer group has members, so its offsets cannot be moved (`reset`).
pub const EXIT_GROUP_ACTIVE: i32 = 8;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CliError {
    /// The command line asks for something that cannot work.
    #[error("{message}")]
    Usage {
        /// What is wrong.
        message: String,
        /// How to write it instead.
        hint: String,
    },
    /// No broker answered.
    #[error("cannot reach the Kafka cluster at {bootstrap}: {detail}")]
    Unreachable {
        /// The bootstrap list that was tried.
        bootstrap: String,
        /// What the connection attempts failed with.
        detail: String,
    },
    /// The cluster refused the SASL login, or the TLS handshake failed.
    // The net layer's message already names the broker, the mechanism and the refusal.
    #[error("{source}")]
    Authentication {
        /// The bootstrap list that was tried.
        bootstrap: String,
        /// The net layer's error (names the mechanism and the broker's message).
        #[source]
        source: NetError,
    },
    /// The topic does not exist (or is hidden from this principal, which Kafka reports the same way).
    #[error("topic {topic:?} does not exist")]
    UnknownTopic {
        /// The topic asked for.
        topic: String,
    },
    /// The topic exists but has no such partition.
    #[error("topic {topic:?} has no partition {partition} (it has {count})")]
    UnknownPartition {
        /// The topic.
        topic: String,
        /// The partition asked for.
        partition: i32,
        /// How many partitions the topic has.
        count: usize,
    },
    /// The offset asked for is outside the partition's log.
    #[error("offset {offset} is outside {topic}/{partition}, whose log spans {log_start}..{high_watermark}")]
    OffsetOutOfRange {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The offset asked for.
        offset: i64,
        /// The first offset still in the log.
        log_start: i64,
        /// The high watermark.
        high_watermark: i64,
    },
    /// The cluster refused for lack of an ACL.
    #[error("not authorized to {what}: {code}", code = code.name())]
    NotAuthorized {
        /// What was being done.
        what: String,
        /// The authorization error the broker answered with.
        code: ErrorCode,
    },
    /// A broker answered with an error this tool has no better words for.
    #[error("{what} failed: {source}")]
    Broker {
        /// What was being done.
        what: String,
        /// The net layer's error.
        #[source]
        source: NetError,
    },
    /// A fetched batch did not decode.
    #[error("the batch at {topic}/{partition} offset {offset} does not decode: {source}")]
    Decode {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The offset the fetch started at.
        offset: i64,
        /// The records layer's error.
        #[source]
        source: DecodeError,
    },
    /// The broker's answer does not fit the request (a missing partition, an unexpected entry).
    #[error("unexpected answer to {what}: {detail}")]
    Protocol {
        /// What was being done.
        what: String,
        /// What was wrong with the answer.
        detail: String,
    },
    /// The recovery read stopped advancing for longer than the stall deadline.
    #[error(
        "recovery of {topic}/{partition} stalled at offset {position} for {:.1} s, below its target \
         {target}: {diagnosis}",
        stalled_for.as_secs_f64()
    )]
    RecoveryStalled {
        /// The snapshot topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The read_committed position reached.
        position: i64,
        /// The high watermark captured at the start.
        target: i64,
        /// How long the position had not moved.
        stalled_for: std::time::Duration,
        /// What a fresh read of the log end found.
        diagnosis: StallDiagnosis,
    },
    /// The recovery read failed for a reason other than a stall.
    #[error("recovery of {topic}/{partition} failed: {source}")]
    Recovery {
        /// The snapshot topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The snapshot layer's error.
        #[source]
        source: SnapshotError,
    },
    /// `reset` refused: the group has members, which would commit over the reset and keep their state.
    #[error(
        "consumer group {group:?} has members{}; its offsets can only be reset while it is empty",
        if members.is_empty() { String::new() } else { format!(" ({})", members.join(", ")) }
    )]
    GroupActive {
        /// The group.
        group: String,
        /// The member ids its coordinator lists (empty when the coordinator refused the commit itself).
        members: Vec<String>,
    },
    /// A `reset --to-offset` position outside the input partition's log.
    #[error("offset {offset} is outside {topic}/{partition}, whose log spans {log_start}..{high_watermark}")]
    ResetOutOfRange {
        /// The input topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The offset asked for.
        offset: i64,
        /// The first offset still in the log.
        log_start: i64,
        /// The high watermark.
        high_watermark: i64,
    },
    /// The snapshot topic cannot be the input's: another partition count.
    #[error(
        "snapshot topic {snapshots:?} has {snapshot_partitions} partition(s), input topic {input:?} has \
         {input_partitions}: snapshot partition N holds input partition N's state"
    )]
    PartitionMismatch {
        /// The snapshot topic.
        snapshots: String,
        /// Its partition count.
        snapshot_partitions: usize,
        /// The input topic.
        input: String,
        /// Its partition count.
        input_partitions: usize,
    },
    /// A value on the snapshot topic is no envelope a flow wrote, so its offset is unknown.
    #[error(
        "{topic}/{partition}: the snapshot of key {key} is not a snapfence snapshot: {source}"
    )]
    ForeignSnapshot {
        /// The snapshot topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The key, as `dump` shows keys.
        key: String,
        /// What is wrong with the value.
        #[source]
        source: snapfence::snapshot::ForeignSnapshotValue,
    },
    /// `reset` found a snapshot (or a PostgreSQL fencing row) that accounts for another number of input
    /// topics than `--input` names: a flow's inputs are reset together, each named in the flow's order.
    #[error(
        "{store}/{partition}: {what} accounts for {inputs} input topic(s), and --input names {named}"
    )]
    InputCount {
        /// The snapshot topic, or the PostgreSQL tables.
        store: String,
        /// The partition.
        partition: i32,
        /// `the snapshot of key ...`, or `the fencing row`.
        what: String,
        /// How many inputs it accounts for.
        inputs: usize,
        /// How many `--input` names.
        named: usize,
    },
    /// Two input topics named to `reset` differ in partition count: a flow's inputs are co-partitioned.
    #[error(
        "input topic {other:?} has {other_partitions} partition(s), input topic {input:?} has \
         {input_partitions}: a flow's inputs have partition N of each folded together"
    )]
    InputPartitionMismatch {
        /// The first input topic.
        input: String,
        /// Its partition count.
        input_partitions: usize,
        /// The input topic that differs.
        other: String,
        /// Its partition count.
        other_partitions: usize,
    },
    /// A producer step of `reset` (InitProducerId, the tombstones' transaction) failed.
    #[error("{what}: {source}")]
    Producer {
        /// What was being done.
        what: String,
        /// The producer's error.
        #[source]
        source: snapfence::producer::ProducerError,
    },
    /// A PostgreSQL step of `reset --postgres` failed.
    #[cfg(feature = "postgres")]
    #[error("{what}: {source}")]
    Postgres {
        /// What was being done.
        what: String,
        /// The store's error.
        #[source]
        source: snapfence::snapshot::postgres::PgError,
    },
    /// The demo could not get a Kafka broker of its own.
    #[error("cannot start a local Kafka broker for the demo: {detail}")]
    Fixture {
        /// The fixture's error.
        detail: String,
    },
    /// The demo ran but did not show what it exists to show.
    #[error("the demo did not show the expected outcome: {detail}")]
    DemoFailed {
        /// What was off.
        detail: String,
    },
    /// Writing the output or reading the confirmation failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

impl CliError {
    /// The exit status for this failure.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage { .. } => EXIT_USAGE,
            CliError::Unreachable { .. } => EXIT_UNREACHABLE,
            CliError::UnknownTopic { .. }
            | CliError::UnknownPartition { .. }
            | CliError::OffsetOutOfRange { .. }
            | CliError::ResetOutOfRange { .. } => EXIT_NOT_FOUND,
            CliError::GroupActive { .. } => EXIT_GROUP_ACTIVE,
            CliError::NotAuthorized { .. } => EXIT_NOT_AUTHORIZED,
            CliError::RecoveryStalled { .. } => EXIT_STALLED,
            CliError::Authentication { .. } => EXIT_AUTHENTICATION,
            _ => EXIT_FAILED,
        }
    }

    /// What the operator can do about it.
    pub fn next_step(&self) -> String {
        match self {
            CliError::Usage { hint, .. } => hint.clone(),
            CliError::Unreachable { .. } => "check that a broker listens at that address (set it with \
                --bootstrap host:port or SNAPFENCE_BOOTSTRAP) and that the addresses it advertises \
                (advertised.listeners) are reachable from this machine"
                .into(),
            CliError::Authentication {
                source: NetError::Tls { .. },
                ..
            } => {
                "check --tls-ca (the CA that signed the brokers' certificates), and for a listener \
                 that requires client certificates --tls-cert and --tls-key"
                    .into()
            }
            CliError::Authentication { .. } => "check --sasl-mechanism and --sasl-username, and the \
                password in SNAPFENCE_SASL_PASSWORD or --sasl-password-file; the mechanism must be \
                enabled on the listener (sasl.enabled.mechanisms) and the user must exist on the cluster"
                .into(),
            CliError::UnknownTopic { .. } => "check the spelling; topic names are case-sensitive. If the \
                topic exists, the principal may lack DESCRIBE on it (Kafka reports both the same way)"
                .into(),
            CliError::UnknownPartition { count, .. } => {
                format!("use a partition between 0 and {}", count.saturating_sub(1))
            }
            CliError::OffsetOutOfRange {
                log_start,
                high_watermark,
                ..
            } => format!(
                "pass an --offset between {log_start} and {high_watermark}, or leave it out to start at \
                 the log start"
            ),
            CliError::NotAuthorized { code, .. } => authorization_hint(*code).into(),
            // Retries already ran out inside the client; the code says whether waiting may help.
            CliError::Broker { source, .. }
                if source.error_code().is_some_and(ErrorCode::is_retriable) =>
            {
                "the cluster may be electing a leader or loading a coordinator: try again in a few \
                 seconds; if it persists, check the broker logs"
                    .into()
            }
            CliError::Broker { .. } | CliError::Protocol { .. } => {
                "check the broker logs around this time; run with RUST_LOG=debug for the requests sent"
                    .into()
            }
            CliError::Decode { .. } => "the batch is corrupt or uses a format this tool cannot read; \
                dump from a later --offset to skip it, and compare with kafka-dump-log.sh on the broker"
                .into(),
            CliError::RecoveryStalled {
                topic, diagnosis, ..
            } => stall_hint(topic, diagnosis),
            CliError::Recovery { .. } => "check that the brokers are up (`snapfence inspect <topic>`) and \
                try again; run with RUST_LOG=debug for the requests sent"
                .into(),
            CliError::GroupActive { group, .. } => format!(
                "stop every member of group {group:?} (close the flows; a member that was killed drops \
                 out after its session timeout), check with `snapfence inspect <input> --group {group}`, \
                 and run reset again"
            ),
            CliError::ResetOutOfRange {
                log_start,
                high_watermark,
                ..
            } => format!(
                "pass a --to-offset between {log_start} and {high_watermark}, or use --to-earliest or \
                 --to-latest"
            ),
            CliError::PartitionMismatch { .. } => "check --input and --snapshots: they must name a flow's \
                input topic and its snapshot topic"
                .into(),
            CliError::InputCount { .. } => "name every input topic of the flow with --input, in the \
                flow's order (FlowConfig::input_topic first, then more_input_topics); nothing was changed"
                .into(),
            CliError::InputPartitionMismatch { .. } => "check --input: it must name the input topics of \
                one flow, which all have as many partitions; nothing was changed"
                .into(),
            CliError::ForeignSnapshot { .. } => "this topic holds records a snapfence flow did not write: \
                check --snapshots, and look at the key with `snapfence recover <topic> -p <partition> \
                --values`; nothing was changed"
                .into(),
            CliError::Producer { source, .. } if source.is_fatal() => "another producer initialised the \
                same transactional id meanwhile (a flow started?), or the principal may not write it: stop \
                the flow, check the ACLs, and run reset again"
                .into(),
            CliError::Producer { .. } => "run reset again: it is safe to repeat (the offsets already \
                moved stay, and the snapshots at or past them are found and deleted again)"
                .into(),
            #[cfg(feature = "postgres")]
            CliError::Postgres {
                source: snapfence::snapshot::postgres::PgError::InputCount { .. },
                ..
            } => "name every input topic of the flow with --input, in the flow's order \
                (FlowConfig::input_topic first, then more_input_topics); nothing was changed"
                .into(),
            #[cfg(feature = "postgres")]
            CliError::Postgres { .. } => "check --postgres (the connection string the flow uses) and \
                --postgres-table-prefix, and that the server is up; a failed reset of a partition \
                changed nothing there, and running reset again is safe"
                .into(),
            CliError::Fixture { .. } => "install what the message names (a JDK 17 and Maven; the broker jars \
                come from Maven Central on first use), or run the demo against a cluster of yours with \
                --bootstrap host:port"
                .into(),
            CliError::DemoFailed { .. } => "read the story above for the step that went differently; the \
                session timeout it printed is short on purpose, so rerun to rule out a slow machine"
                .into(),
            CliError::Io(_) => "check that the output can be written".into(),
        }
    }

    /// Classifies a net-layer error met while doing `what`.
    pub(crate) fn from_net(what: impl Into<String>, bootstrap: &str, err: NetError) -> CliError {
        let what = what.into();
        if err.is_fatal_connect() {
            return CliError::Authentication {
                bootstrap: bootstrap.to_owned(),
                source: err,
            };
        }
        if err.is_transport() {
            return CliError::Unreachable {
                bootstrap: bootstrap.to_owned(),
                detail: unreachable_detail(&what, bootstrap, &err),
            };
        }
        match err.error_code() {
            Some(code) if is_authorization(code) => CliError::NotAuthorized { what, code },
            _ => CliError::Broker { what, source: err },
        }
    }

    /// A broker error code found inside a response body while doing `what`.
    pub(crate) fn from_code(
        what: impl Into<String>,
        code: ErrorCode,
        message: Option<&str>,
    ) -> Self {
        let what = what.into();
        if is_authorization(code) {
            return CliError::NotAuthorized { what, code };
        }
        CliError::Broker {
            source: NetError::Broker {
                code,
                message: message.map(str::to_owned),
                context: what.clone(),
            },
            what,
        }
    }

    /// Whether this is an output pipe closed by the reader (`snapfence dump ... | head`), which ends the
    /// run quietly rather than as a failure.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, CliError::Io(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
    }
}

/// What to say after "cannot reach the Kafka cluster at {bootstrap}: ".
///
/// When no bootstrap address could be opened, the client reports one `Connect` for the whole list whose
/// message joins each address's own `Connect` text ("cannot connect to A: A: refused"): that sentence
/// already is "cannot reach the cluster at A", so only the reasons are kept, and the request that was
/// about to be sent adds nothing (nothing was sent). Any other transport failure (an advertised broker
/// unreachable from here, a connection dying mid-request) keeps what was being done and its own text:
/// those name an address or a request the bootstrap list does not.
fn unreachable_detail(what: &str, bootstrap: &str, err: &NetError) -> String {
    match err {
        NetError::Connect { addr, message } if addr == bootstrap => {
            // With one address the list holds one entry, whose "cannot connect to A: " is the sentence
            // already said; with several, each entry names its address and stays.
            let single = format!("cannot connect to {addr}: ");
            say_once(message.strip_prefix(&single).unwrap_or(message))
        }
        _ => say_once(&format!("{what}: {err}")),
    }
}

/// The text printed after `error: `: `e`, then each cause in its `source()` chain that the text so far
/// does not already contain, each fact said once (see `say_once`).
///
/// Most errors here and in the library embed their source in their own message (`"... failed: {source}"`)
/// and also return it from `source()`, so a cause is usually already in the text and is skipped; one that
/// is not (a boxed cause without the embedding) is appended instead of being lost.
pub fn render(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let line = c.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        cause = c.source();
    }
    say_once(&text)
}

/// Drops the parts of a `"a: b: c"` chain that repeat the part just before them.
///
/// Errors built from other errors' text stack up their prefixes: the client's bootstrap `Connect` wraps
/// each address's `Connect`, whose reason starts with the address again, and a broker error carries the
/// same "what was being done" as the tool's message around it. A part (between `": "`) is dropped when the
/// part before it already contains it as whole words ("cannot connect to A: A: refused" loses the second
/// "A"; "read t failed: read t: broker error" loses the second "read t"), so nothing new is ever dropped.
pub(crate) fn say_once(chain: &str) -> String {
    let mut kept: Vec<&str> = Vec::new();
    for part in chain.split(": ") {
        let repeated = kept.last().is_some_and(|prev| {
            !part.trim().is_empty() && format!(" {prev} ").contains(&format!(" {} ", part.trim()))
        });
        if !repeated {
            kept.push(part);
        }
    }
    kept.join(": ")
}

fn stall_hint(topic: &str, diagnosis: &StallDiagnosis) -> String {
    match diagnosis {
        StallDiagnosis::Truncated { .. } => "records the broker had acknowledged are gone (an unclean \
            leader election or a lost disk): an operator must choose between resetting the input group's \
            offsets so the state is rebuilt from the input, and restoring the snapshot topic from a backup"
            .into(),
        StallDiagnosis::OpenTransaction { .. } => format!(
            "find the transaction with `snapfence inspect {topic}` and `snapfence find-hanging --topic \
             {topic}`: a hanging one can be ended with `find-hanging --abort`; a healthy one ends within \
             its transaction timeout, so retry with a --stall-timeout above it"
        ),
        _ => "the broker could not be asked why: check that it is reachable and try again".into(),
    }
}

fn is_authorization(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::TopicAuthorizationFailed
            | ErrorCode::GroupAuthorizationFailed
            | ErrorCode::ClusterAuthorizationFailed
            | ErrorCode::TransactionalIdAuthorizationFailed
    )
}

fn authorization_hint(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::TopicAuthorizationFailed => {
            "grant this principal DESCRIBE on the topic (inspect, find-hanging) and READ (dump)"
        }
        ErrorCode::GroupAuthorizationFailed => "grant this principal DESCRIBE on the group",
        ErrorCode::TransactionalIdAuthorizationFailed => {
            "grant this principal DESCRIBE on the transactional ids (ListTransactions and \
             DescribeTransactions only show ids it may describe)"
        }
        ErrorCode::ClusterAuthorizationFailed => {
            "aborting a transaction (WriteTxnMarkers) needs CLUSTER_ACTION on the cluster; run --abort \
             as a cluster administrator"
        }
        _ => "ask the cluster administrator for the missing ACL",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A transport failure exits as unreachable and an ACL code as not authorised, each with the next
    /// step that fits it, and any other broker error points at the broker logs or a retry.
    #[test]
    fn transport_failures_are_unreachable_and_acl_codes_not_authorized() {
        let down = NetError::Connect {
            addr: "127.0.0.1:1".into(),
            message: "connection refused".into(),
        };
        let e = CliError::from_net("connect", "127.0.0.1:1", down);
        assert_eq!(e.exit_code(), EXIT_UNREACHABLE);
        assert!(e.to_string().contains("127.0.0.1:1"), "{e}");
        assert!(e.next_step().contains("--bootstrap"));

        let refused = CliError::from_code("read t", ErrorCode::TopicAuthorizationFailed, None);
        assert_eq!(refused.exit_code(), EXIT_NOT_AUTHORIZED);
        assert!(refused.to_string().contains("TOPIC_AUTHORIZATION_FAILED"));
        assert!(refused.next_step().contains("DESCRIBE"));

        let other = CliError::from_code("read t", ErrorCode::InvalidRecord, None);
        assert_eq!(other.exit_code(), EXIT_FAILED);
        assert!(other.next_step().contains("broker logs"));
        let busy = CliError::from_net(
            "describe",
            "b:1",
            NetError::RetriesExhausted {
                attempts: 21,
                outcome_unknown: false,
                last: Box::new(NetError::Broker {
                    code: ErrorCode::CoordinatorLoadInProgress,
                    message: None,
                    context: "describe".into(),
                }),
            },
        );
        assert!(
            busy.next_step().contains("try again"),
            "{}",
            busy.next_step()
        );
    }

    /// An operator reads each fact of a failure once: the client's nested connect errors and a broker
    /// error's repeated context must not reach the screen twice.
    #[test]
    fn error_chains_say_each_fact_once() {
        // What the client reports when its only bootstrap address refuses: a Connect for the list wrapping
        // the address's own Connect, whose reason starts with the resolved address.
        let refused = "127.0.0.1:1: Connection refused (os error 111)";
        let nested = NetError::Connect {
            addr: "127.0.0.1:1".into(),
            message: format!("cannot connect to 127.0.0.1:1: {refused}"),
        };
        let e = CliError::from_net("connect", "127.0.0.1:1", nested);
        assert_eq!(
            render(&e),
            "cannot reach the Kafka cluster at 127.0.0.1:1: Connection refused (os error 111)"
        );

        // Two addresses: each keeps its own name, once.
        let both = NetError::Connect {
            addr: "a:1,b:1".into(),
            message: "cannot connect to a:1: 10.0.0.1:1: refused; cannot connect to b:1: cannot \
                      resolve: no such host"
                .into(),
        };
        let e = CliError::from_net("describe t", "a:1,b:1", both);
        assert_eq!(
            render(&e),
            "cannot reach the Kafka cluster at a:1,b:1: cannot connect to a:1: 10.0.0.1:1: refused; \
             cannot connect to b:1: cannot resolve: no such host"
        );

        // An advertised broker unreachable from here: its address and the request are new facts.
        let advertised = NetError::Connect {
            addr: "kafka-1:9092".into(),
            message: "cannot resolve: no such host".into(),
        };
        let e = CliError::from_net("fetch t/0", "localhost:9092", advertised);
        assert_eq!(
            render(&e),
            "cannot reach the Kafka cluster at localhost:9092: fetch t/0: cannot connect to \
             kafka-1:9092: cannot resolve: no such host"
        );

        let refused = CliError::from_code("create topic t", ErrorCode::InvalidRecord, Some("bad"));
        let text = render(&refused);
        assert_eq!(text.matches("create topic t").count(), 1, "{text}");
        assert!(text.contains("bad"), "{text}");
    }

    /// A part of an error message is dropped only when the part just before it already says it in whole
    /// words, so repeats go and new facts stay.
    #[test]
    fn say_once_keeps_what_is_new() {
        assert_eq!(say_once("x failed: x: y"), "x failed: y");
        assert_eq!(say_once("a: a: b"), "a: b");
        // A part is only dropped as whole words: "1" is not a repeat of "a:1"'s digits.
        assert_eq!(say_once("offset 10: 1"), "offset 10: 1");
        assert_eq!(say_once("a: b: a"), "a: b: a");
        assert_eq!(say_once("plain"), "plain");
    }

    /// A cause left out of its parent's message is appended, not lost; one already in it is not repeated.
    #[test]
    fn render_walks_the_source_chain() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] std::io::Error);
        let e = Outer(std::io::Error::other("inner"));
        assert_eq!(render(&e), "outer: inner");
        let e = CliError::Io(std::io::Error::other("disk full"));
        assert_eq!(render(&e), "i/o: disk full");
    }

    /// A partition that does not exist exits as not found and says which partitions do.
    #[test]
    fn not_found_errors_say_what_exists() {
        let e = CliError::UnknownPartition {
            topic: "t".into(),
            partition: 7,
            count: 3,
        };
        assert_eq!(e.exit_code(), EXIT_NOT_FOUND);
        assert!(
            e.next_step().contains("between 0 and 2"),
            "{}",
            e.next_step()
        );
    }
}
