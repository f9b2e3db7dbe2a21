//! Connections, version negotiation, cluster metadata and request routing.
