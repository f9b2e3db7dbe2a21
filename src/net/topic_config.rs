//! Reading a topic's configuration (DescribeConfigs), for callers that must refuse a topic set up
//! wrongly before they depend on it (the snapshot layer checks `cleanup.policy`).
//!
//! Kept apart from the routing code in `client.rs` on purpose: it is an admin call, and admin calls are
//! headed for a module of their own.
//!
//! # References
//! - DescribeConfigs (key 32): resource type 2 is a topic; `configuration_keys` null means every key

use std::collections::BTreeMap;

use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::DescribeConfigsRequest;
use kafka_protocol::protocol::StrBytes;

use super::client::{CallOptions, Client, Target};
use super::retry::Verdict;
use super::NetError;
use crate::wire::ErrorCode;

/// DescribeConfigs resource type of a topic.
const TOPIC_RESOURCE: i8 = 2;

impl Client {
    /// The effective values of `keys` in `topic`'s configuration (the topic's own setting, else the
    /// broker's or the built-in default), as the broker reports them. A key the broker does not report
    /// is absent from the map; a sensitive one maps to `None`.
    ///
    /// UNKNOWN_TOPIC_OR_PARTITION is returned at once, not retried: a topic that does not exist is not
    /// going to appear by waiting.
    ///
    /// Cancel-safe: it only reads.
    pub async fn topic_configs(
        &self,
        topic: &str,
        keys: &[&str],
    ) -> Result<BTreeMap<String, Option<String>>, NetError> {
        let context = || format!("describe the configuration of topic {topic}");
        let result = self
            .call(
                Target::Any,
                &CallOptions::default(),
                |_| {
                    DescribeConfigsRequest::default().with_resources(vec![
                        DescribeConfigsResource::default()
                            .with_resource_type(TOPIC_RESOURCE)
                            .with_resource_name(StrBytes::from_string(topic.to_owned()))
                            .with_configuration_keys(Some(
                                keys.iter()
                                    .map(|k| StrBytes::from_string((*k).to_owned()))
                                    .collect(),
                            )),
                    ])
                },
                |response, _| {
                    let Some(r) = response
                        .results
                        .iter()
                        .find(|r| r.resource_name.as_str() == topic)
                    else {
                        return Verdict::Done(Err(NetError::broker(
                            ErrorCode::UnknownServerError,
                            Some("the answer does not mention the topic"),
                            context(),
                        )));
                    };
                    let code = ErrorCode::from_code(r.error_code);
                    let err = || NetError::broker(code, r.error_message.as_deref(), context());
                    match code {
                        ErrorCode::None => Verdict::Done(Ok(r
                            .configs
                            .iter()
                            .map(|c| (c.name.to_string(), c.value.as_ref().map(|v| v.to_string())))
                            .collect())),
                        ErrorCode::UnknownTopicOrPartition => Verdict::Done(Err(err())),
                        _ => Verdict::from_code(r.error_code, Err(err())),
                    }
                },
            )
            .await?;
        result
    }
}
