//! stepwise-label: automatic step annotation.
#![warn(missing_docs)]

pub mod engine;
pub mod montecarlo;

pub use engine::EnginePolicy;
pub use montecarlo::{annotate, annotate_resumable, McOptions, Policy};
