//! stepwise-search: choosing among sampled solutions with reward models.
#![warn(missing_docs)]

pub mod bon;

pub use bon::{aggregate, select, Aggregation, Candidate, Selector};
