//! The wire layer: size-prefixed frames, request and response headers, API version ranges, and the
//! Kafka error-code table.

mod error_code;

pub use error_code::ErrorCode;
