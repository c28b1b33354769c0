//! stepwise-search: choosing among sampled solutions with reward models. Methods depend on the
//! seams of `stepwise-core`, never on a model.
#![warn(missing_docs)]

pub mod bon;
pub mod candidates;

pub use bon::{aggregate, select, Aggregation, Candidate, Selector};
pub use candidates::group_candidates;
