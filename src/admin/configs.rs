//! Reading a topic's or a broker's configuration (DescribeConfigs).
//!
//! # References
//! - DescribeConfigs (key 32; `config_source` from v1, KIP-226; resource types 2 = topic, 4 = broker)

use std::collections::BTreeMap;

use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::DescribeConfigsRequest;
use kafka_protocol::protocol::StrBytes;

use crate::net::{CallOptions, Client, NetError, Target, Verdict};
use crate::ErrorCode;

/// Whose configuration to read.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConfigResource {
    /// A topic's configuration, overrides and inherited defaults alike (any broker answers).
    Topic(String),
    /// One broker's configuration (asked of that broker, which alone knows its per-broker settings).
    Broker(i32),
}

impl ConfigResource {
    fn resource_type(&self) -> i8 {
        match self {
            ConfigResource::Topic(_) => 2,
            ConfigResource::Broker(_) => 4,
        }
    }

    fn resource_name(&self) -> String {
        match self {
            ConfigResource::Topic(t) => t.clone(),
            ConfigResource::Broker(b) => b.to_string(),
        }
    }

    fn target(&self) -> Target {
        match self {
            ConfigResource::Topic(_) => Target::Any,
            ConfigResource::Broker(b) => Target::Broker(*b),
        }
    }
}

impl std::fmt::Display for ConfigResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigResource::Topic(t) => write!(f, "topic {t}"),
            ConfigResource::Broker(b) => write!(f, "broker {b}"),
        }
    }
}

/// Where a configuration value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConfigSource {
    /// Set on this topic (`kafka-configs.sh --entity-type topics`).
    Topic,
    /// Set dynamically for this broker.
    DynamicBroker,
    /// Set dynamically as the cluster-wide broker default.
    DynamicDefaultBroker,
    /// From the broker's `server.properties`.
    StaticBroker,
    /// Kafka's built-in default.
    Default,
    /// A source this client has no name for (the raw `config_source` value).
    Other(i8),
}

impl ConfigSource {
    fn from_wire(source: i8) -> Self {
        match source {
            1 => ConfigSource::Topic,
            2 => ConfigSource::DynamicBroker,
            3 => ConfigSource::DynamicDefaultBroker,
            4 => ConfigSource::StaticBroker,
            5 => ConfigSource::Default,
            other => ConfigSource::Other(other),
        }
    }
}

/// One configuration entry.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfigEntry {
    /// The value; `None` when the broker hides it (a sensitive setting) or it has none.
    pub value: Option<String>,
    /// Where the value comes from.
    pub source: ConfigSource,
    /// Whether it can only be changed by restarting the broker.
    pub read_only: bool,
    /// Whether the broker withholds the value as a secret.
    pub sensitive: bool,
}

/// The configuration of `resource`: every entry when `names` is empty, else only those named (a name
/// the broker does not know is left out of the map).
///
/// Errors: a resource-level error code (UNKNOWN_TOPIC_OR_PARTITION for a missing topic, returned at
/// once; an authorization failure) is a [`NetError`] carrying the [`ErrorCode`]; codes that mean
/// "moved" or "busy" are retried first.
///
/// Cancel-safe: a read only.
///
/// ```no_run
/// # async fn run(client: &snapfence::Client) -> Result<(), snapfence::NetError> {
/// use snapfence::admin::{describe_configs, ConfigResource};
/// let configs =
///     describe_configs(client, &ConfigResource::Topic("snapshots".into()), &["cleanup.policy"]).await?;
/// let compacted = configs
///     .get("cleanup.policy")
///     .and_then(|e| e.value.as_deref())
///     .is_some_and(|p| p.split(',').any(|p| p.trim() == "compact"));
/// # let _ = compacted;
/// # Ok(())
/// # }
/// ```
pub async fn describe_configs(
    client: &Client,
    resource: &ConfigResource,
    names: &[&str],
) -> Result<BTreeMap<String, ConfigEntry>, NetError> {
    let context = format!("describe the configuration of {resource}");
    let resource_name = resource.resource_name();
    let request =
        DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
            .with_resource_type(resource.resource_type())
            .with_resource_name(StrBytes::from_string(resource_name.clone()))
            .with_configuration_keys((!names.is_empty()).then(|| {
                names
                    .iter()
                    .map(|n| StrBytes::from_string((*n).to_owned()))
                    .collect()
            }))]);
    let answer = client
        .call(
            resource.target(),
            &CallOptions::default(),
            |_| request.clone(),
            |response, _| {
                let Some(r) = response
                    .results
                    .iter()
                    .find(|r| r.resource_name.as_str() == resource_name)
                else {
                    return Verdict::Done(Err(NetError::broker(
                        ErrorCode::UnknownServerError,
                        Some("the answer does not mention the resource"),
                        context.clone(),
                    )));
                };
                let code = ErrorCode::from_code(r.error_code);
                let err = || NetError::broker(code, r.error_message.as_deref(), context.clone());
                match code {
                    ErrorCode::None => {}
                    // A topic that does not exist is not going to appear by waiting (the routing
                    // loop would read the code as stale metadata and retry to its deadline).
                    ErrorCode::UnknownTopicOrPartition => return Verdict::Done(Err(err())),
                    _ => return Verdict::from_code(r.error_code, Err(err())),
                }
                let entries = r
                    .configs
                    .iter()
                    .filter(|c| names.is_empty() || names.contains(&c.name.as_str()))
                    .map(|c| {
                        (
                            c.name.to_string(),
                            ConfigEntry {
                                value: c.value.as_ref().map(|v| v.to_string()),
                                source: ConfigSource::from_wire(c.config_source),
                                read_only: c.read_only,
                                sensitive: c.is_sensitive,
                            },
                        )
                    })
                    .collect();
                Verdict::Done(Ok(entries))
            },
        )
        .await?;
    answer
}

/// The value of one setting of `topic` (e.g. `cleanup.policy`), inherited defaults included; `None`
/// when the broker reports no value for it.
///
/// Cancel-safe: a read only.
pub async fn topic_config(
    client: &Client,
    topic: &str,
    name: &str,
) -> Result<Option<String>, NetError> {
    let mut configs =
        describe_configs(client, &ConfigResource::Topic(topic.to_owned()), &[name]).await?;
    Ok(configs.remove(name).and_then(|e| e.value))
}

/// Whether the transaction coordinator of `transactional_id` runs with
/// `transaction.two.phase.commit.enable` (KIP-939). A two-phase producer's init refused with
/// TRANSACTIONAL_ID_AUTHORIZATION_FAILED means either a missing TWO_PHASE_COMMIT ACL or this setting off
/// ([`TwoPhaseCommitRefusal::NotAuthorizedOrDisabled`](crate::producer::TwoPhaseCommitRefusal)); this
/// tells which. `None`: the broker reports no such setting (a broker before KIP-939).
///
/// Errors: as [`describe_configs`] (a principal without DESCRIBE_CONFIGS on the cluster is refused).
///
/// Cancel-safe: a read only.
pub async fn two_phase_commit_enabled(
    client: &Client,
    transactional_id: &str,
) -> Result<Option<bool>, NetError> {
    const SETTING: &str = "transaction.two.phase.commit.enable";
    let node = client
        .coordinator(crate::net::CoordinatorKind::Transaction, transactional_id)
        .await?;
    let mut configs = describe_configs(client, &ConfigResource::Broker(node), &[SETTING]).await?;
    Ok(configs
        .remove(SETTING)
        .and_then(|e| e.value)
        .map(|v| v.trim().eq_ignore_ascii_case("true")))
}
