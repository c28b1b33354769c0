//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// The repository's public data (`data/`, where each file came from in `data/README.md`).
pub fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data").join(rel)
}

/// A scratch directory unique to a test.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("stepwise-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
