//! stepwise-label: automatic step annotation.
#![warn(missing_docs)]

pub mod montecarlo;

pub use montecarlo::{annotate, McOptions, Policy};
