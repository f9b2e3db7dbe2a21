//! The partition reader and the group consumer.
