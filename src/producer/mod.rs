//! The idempotent and transactional producer.
