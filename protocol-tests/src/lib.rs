//! A real Apache Kafka cluster for tests, run from Maven Central jars (no Docker).
