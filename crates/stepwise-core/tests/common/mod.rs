//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// `../shared/data` (or `$STEPWISE_SHARED/data`).
pub fn data(rel: &str) -> PathBuf {
    let base = std::env::var_os("STEPWISE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    base.join("data").join(rel)
}

/// A scratch directory unique to a test.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("stepwise-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
