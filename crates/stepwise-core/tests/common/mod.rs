//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// The repository's public data (`data/`, where each file came from in `data/README.md`).
pub fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data").join(rel)
}

/// A fresh scratch directory for a test, removed when it is dropped.
pub fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::TempDir::with_prefix(format!("stepwise-test-{name}-")).unwrap()
}
