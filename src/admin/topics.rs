//! Creating and deleting topics.
//!
//! # References
//! - CreateTopics (key 19), DeleteTopics (key 20; topic ids from v6, KIP-516)
//! - KIP-590: in KRaft mode any broker forwards these to the active controller

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::{CreateTopicsRequest, DeleteTopicsRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::net::{CallOptions, Client, NetError, Target, Verdict};
use crate::ErrorCode;

/// Creates a topic and waits until every partition has a leader in the metadata.
///
/// `replication` of -1 uses the broker's default. A TOPIC_ALREADY_EXISTS answer is an error, except
/// on a retry after an attempt whose outcome is unknown (that attempt probably created it).
///
/// Not cancel-safe in effect: dropping the future may leave the topic created.
///
/// ```no_run
/// # async fn run(client: &snapfence::Client) -> Result<(), snapfence::NetError> {
/// // A snapshot topic: compacted, one partition per input partition, the broker's replication.
/// snapfence::admin::create_topic(client, "balances-snapshots", 4, -1, &[("cleanup.policy", "compact")])
///     .await?;
/// # Ok(())
/// # }
/// ```
pub async fn create_topic(
    client: &Client,
    name: &str,
    partitions: i32,
    replication: i16,
    configs: &[(&str, &str)],
) -> Result<(), NetError> {
    let attempts = AtomicU32::new(0);
    let broker_timeout = client.config().request_timeout / 2;
    let topic = CreatableTopic::default()
        .with_name(TopicName(StrBytes::from_string(name.to_owned())))
        .with_num_partitions(partitions)
        .with_replication_factor(replication)
        .with_configs(
            configs
                .iter()
                .map(|(k, v)| {
                    CreatableTopicConfig::default()
                        .with_name(StrBytes::from_string((*k).to_owned()))
                        .with_value(Some(StrBytes::from_string((*v).to_owned())))
                })
                .collect(),
        );
    let created = client
        .call(
            Target::Any,
            &CallOptions::default(),
            |_| {
                attempts.fetch_add(1, Ordering::Relaxed);
                CreateTopicsRequest::default()
                    .with_topics(vec![topic.clone()])
                    .with_timeout_ms(broker_timeout.as_millis().min(i32::MAX as u128) as i32)
            },
            |response, _| {
                let Some(r) = response.topics.iter().find(|t| t.name.0.as_str() == name) else {
                    return Verdict::Done(Err(NetError::broker(
                        ErrorCode::UnknownServerError,
                        Some("the answer does not mention the topic"),
                        format!("create topic {name}"),
                    )));
                };
                let code = ErrorCode::from_code(r.error_code);
                match code {
                    ErrorCode::None => Verdict::Done(Ok(())),
                    ErrorCode::TopicAlreadyExists if attempts.load(Ordering::Relaxed) > 1 => {
                        Verdict::Done(Ok(()))
                    }
                    _ => Verdict::from_code(
                        r.error_code,
                        Err(NetError::broker(
                            code,
                            r.error_message.as_deref(),
                            format!("create topic {name}"),
                        )),
                    ),
                }
            },
        )
        .await?;
    created?;
    await_leaders(client, name, partitions).await
}

/// Waits until `topic` has `partitions` partitions that all have a leader.
async fn await_leaders(client: &Client, topic: &str, partitions: i32) -> Result<(), NetError> {
    let mut backoff = client.backoff();
    loop {
        let last = match client.fetch_metadata(Some(&[topic])).await {
            Ok(m) => match m.topics.get(topic) {
                Some(t) if t.error.is_ok() => {
                    let led = (0..partitions).all(|p| m.leader(topic, p).is_some());
                    if led && t.partitions.len() as i32 >= partitions {
                        return Ok(());
                    }
                    NetError::broker(
                        ErrorCode::LeaderNotAvailable,
                        None,
                        format!("new topic {topic}"),
                    )
                }
                Some(t) => NetError::broker(t.error, None, format!("new topic {topic}")),
                None => NetError::broker(
                    ErrorCode::UnknownTopicOrPartition,
                    None,
                    format!("new topic {topic}"),
                ),
            },
            Err(e) => e,
        };
        if !last.is_retriable() {
            return Err(last);
        }
        match backoff.next_delay() {
            Some(d) => tokio::time::sleep(d).await,
            None => {
                return Err(NetError::RetriesExhausted {
                    attempts: backoff.retries() + 1,
                    outcome_unknown: false,
                    last: Box::new(last),
                })
            }
        }
    }
}

/// Deletes a topic. UNKNOWN_TOPIC_OR_PARTITION is an error, except on a retry after an attempt whose
/// outcome is unknown.
///
/// Not cancel-safe in effect: dropping the future may leave the topic deleted.
pub async fn delete_topic(client: &Client, name: &str) -> Result<(), NetError> {
    let attempts = AtomicU32::new(0);
    let broker_timeout = client.config().request_timeout / 2;
    let deleted = client
        .call(
            Target::Any,
            &CallOptions::default(),
            |version| {
                attempts.fetch_add(1, Ordering::Relaxed);
                let topic = TopicName(StrBytes::from_string(name.to_owned()));
                let request = DeleteTopicsRequest::default()
                    .with_timeout_ms(broker_timeout.as_millis().min(i32::MAX as u128) as i32);
                if version >= 6 {
                    request.with_topics(vec![DeleteTopicState::default().with_name(Some(topic))])
                } else {
                    request.with_topic_names(vec![topic])
                }
            },
            |response, _| {
                let Some(r) = response.responses.first() else {
                    return Verdict::Done(Err(NetError::broker(
                        ErrorCode::UnknownServerError,
                        Some("the answer does not mention the topic"),
                        format!("delete topic {name}"),
                    )));
                };
                let code = ErrorCode::from_code(r.error_code);
                match code {
                    ErrorCode::None => Verdict::Done(Ok(())),
                    ErrorCode::UnknownTopicOrPartition if attempts.load(Ordering::Relaxed) > 1 => {
                        Verdict::Done(Ok(()))
                    }
                    // Deleting a topic that does not exist is not going to start working.
                    ErrorCode::UnknownTopicOrPartition => Verdict::Done(Err(NetError::broker(
                        code,
                        r.error_message.as_deref(),
                        format!("delete topic {name}"),
                    ))),
                    _ => Verdict::from_code(
                        r.error_code,
                        Err(NetError::broker(
                            code,
                            r.error_message.as_deref(),
                            format!("delete topic {name}"),
                        )),
                    ),
                }
            },
        )
        .await?;
    deleted?;
    client.forget_topic(name);
    // The controller has accepted the deletion; brokers learn of it from the metadata log a moment
    // later. Wait until Metadata stops listing the topic, as create_topic waits for leaders, so a
    // caller that re-creates or checks the topic next sees the deletion.
    let deadline = tokio::time::Instant::now() + client.config().request_timeout;
    let mut backoff = client.backoff();
    loop {
        let metadata = client.metadata(&[name]).await?;
        match metadata.topics.get(name) {
            Some(t) if t.error.is_ok() => {}
            _ => return Ok(()),
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(NetError::broker(
                ErrorCode::RequestTimedOut,
                Some("the topic is still listed in the metadata"),
                format!("delete topic {name}"),
            ));
        }
        let delay = backoff.next_delay().unwrap_or(Duration::from_millis(200));
        tokio::time::sleep(delay).await;
    }
}
