//! stepwise-label: automatic step annotation. Every annotator implements
//! [`stepwise_core::Annotator`] over the [`stepwise_core::Policy`] and [`stepwise_core::Task`]
//! seams, so it runs the same on a local checkpoint, a remote server or a scripted test double;
//! [`annotate_resumable`] runs any of them over a file with a journal that survives `kill -9`.
#![warn(missing_docs)]

pub mod binary_search;
pub mod montecarlo;
pub mod resumable;

pub use binary_search::BinarySearch;
pub use montecarlo::{McOptions, MonteCarlo};
pub use resumable::annotate_resumable;
