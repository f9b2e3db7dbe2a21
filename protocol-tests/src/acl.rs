//! ACLs for the tests on secured clusters: the codes of the resource types, pattern types and operations
//! the tests grant, one ALLOW entry, and CreateAcls through the client under test as a super user.

use kafka_protocol::messages::create_acls_request::{AclCreation, CreateAclsRequest};
use kafka_protocol::protocol::StrBytes;
use snapfence::net::{Client, Target};
use snapfence::ErrorCode;

/// Resource type TOPIC.
pub const TOPIC: i8 = 2;
/// Resource type GROUP.
pub const GROUP: i8 = 3;
/// Resource type CLUSTER (its one resource is named `kafka-cluster`).
pub const CLUSTER: i8 = 4;
/// Resource type TRANSACTIONAL_ID.
pub const TRANSACTIONAL_ID: i8 = 5;
/// Pattern type LITERAL.
pub const LITERAL: i8 = 3;
/// Pattern type PREFIXED.
pub const PREFIXED: i8 = 4;
/// Operation READ.
pub const READ: i8 = 3;
/// Operation WRITE.
pub const WRITE: i8 = 4;
/// Operation DESCRIBE.
pub const DESCRIBE: i8 = 8;
/// Operation DESCRIBE_CONFIGS.
pub const DESCRIBE_CONFIGS: i8 = 10;
/// Operation TWO_PHASE_COMMIT (KIP-939; 15 in Kafka 4.4's `AclOperation`).
pub const TWO_PHASE_COMMIT: i8 = 15;

/// An ALLOW entry for `principal` (`User:name`) on any host.
pub fn allow(principal: &str, resource_type: i8, name: &str, pattern: i8, op: i8) -> AclCreation {
    AclCreation::default()
        .with_resource_type(resource_type)
        .with_resource_name(StrBytes::from_string(name.to_owned()))
        .with_resource_pattern_type(pattern)
        .with_principal(StrBytes::from_string(principal.to_owned()))
        .with_host(StrBytes::from_static_str("*"))
        .with_operation(op)
        .with_permission_type(3)
}

/// Creates ACLs through `admin` (a super user's client); panics on any per-ACL error. The broker's
/// authorizer sees them a moment after this returns (they travel through the metadata log).
pub async fn create_acls(admin: &Client, acls: Vec<AclCreation>) {
    let answer = admin
        .send(Target::Any, |_| {
            CreateAclsRequest::default().with_creations(acls.clone())
        })
        .await
        .expect("CreateAcls")
        .0;
    for r in answer.results {
        assert_eq!(
            ErrorCode::from_code(r.error_code),
            ErrorCode::None,
            "CreateAcls: {:?}",
            r.error_message
        );
    }
}
