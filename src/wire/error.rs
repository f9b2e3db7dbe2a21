//! The wire layer's error type.

/// Why bytes could not be turned into a frame or a message, or a message into bytes.
///
/// Every variant is about the bytes themselves: none of them says anything about the broker's answer
/// (that is an [`ErrorCode`](crate::ErrorCode) inside a decoded message) or about the socket (that is the
/// net layer's business).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The size prefix announced a frame bigger than the configured maximum. Nothing was allocated for it.
    #[error("frame of {len} bytes exceeds the maximum frame size of {max} bytes")]
    FrameTooLarge {
        /// The announced length.
        len: usize,
        /// The configured maximum.
        max: usize,
    },
    /// The size prefix was negative.
    #[error("negative frame length {0}")]
    NegativeFrameLength(i32),
    /// A response frame too short to hold even its correlation id.
    #[error("response frame of {len} bytes is too short to hold a correlation id")]
    FrameTooShort {
        /// The frame's length.
        len: usize,
    },
    /// kafka-protocol refused to encode a request (a field does not fit the chosen version).
    #[error("cannot encode api key {api_key} v{version}: {message}")]
    Encode {
        /// The request's API key.
        api_key: i16,
        /// The version it was encoded at.
        version: i16,
        /// kafka-protocol's explanation.
        message: String,
    },
    /// A response header or body did not decode at the version it was requested at.
    #[error("cannot decode the {part} of api key {api_key} v{version}: {message}")]
    Decode {
        /// The API key of the request this answers.
        api_key: i16,
        /// The version the response was decoded at.
        version: i16,
        /// `"header"` or `"body"`.
        part: &'static str,
        /// kafka-protocol's explanation.
        message: String,
    },
    /// A response decoded but left bytes over: the broker and this client disagree about the layout.
    #[error("{trailing} bytes left over after decoding api key {api_key} v{version}")]
    TrailingBytes {
        /// The API key of the request this answers.
        api_key: i16,
        /// The version the response was decoded at.
        version: i16,
        /// How many bytes were not consumed.
        trailing: usize,
    },
    /// A version outside the range kafka-protocol can encode for this API.
    #[error("api key {api_key} has no version {version} in this client (it knows {min}..={max})")]
    UnsupportedVersion {
        /// The API key.
        api_key: i16,
        /// The version asked for.
        version: i16,
        /// Lowest version this client encodes.
        min: i16,
        /// Highest version this client encodes.
        max: i16,
    },
}
