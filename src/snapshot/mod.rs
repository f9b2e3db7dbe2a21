//! Generation-fenced snapshot persistence.
