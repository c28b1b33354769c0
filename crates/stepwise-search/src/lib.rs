//! stepwise-search: test-time selection and search with reward models. Best-of-N with every
//! aggregation and vote; step-level search guided by a PRM — beam search, DVTS, lookahead, and
//! verify → resample with a calibrated threshold — each in its own file behind
//! [`SearchMethod`], with compute accounting. Methods depend on the seams of `stepwise-core`,
//! never on a model.
//!
//! # Example
//!
//! `examples/beam.rs` (run it with `cargo run -p stepwise-search --example beam`; it is also a doc-test):
//!
#![doc = concat!("```\n", include_str!("../examples/beam.rs"), "```")]
#![warn(missing_docs)]

pub mod aggregation;
pub mod batch;
pub mod beam;
pub mod bon;
pub mod calibrate;
pub mod candidates;
pub mod dvts;
pub mod lookahead;
pub mod method;
pub mod resample;

pub use aggregation::{aggregate, Aggregation};
pub use batch::{compute_of, Job, Searcher, SEARCH_ERROR};
pub use beam::BeamSearch;
pub use bon::{select, BestOfN, Candidate, Selector};
pub use calibrate::{calibrate, Threshold};
pub use candidates::group_candidates;
pub use dvts::Dvts;
pub use lookahead::Lookahead;
pub use method::{search, Compute, Partial, Run, SearchConfig, SearchMethod, Searched};
pub use resample::Resample;

/// Every method's name, for help texts and tables.
pub const METHODS: [&str; 5] = ["bon", "beam", "dvts", "lookahead", "resample"];

/// The method called `name` (one of [`METHODS`]).
pub fn method(name: &str) -> anyhow::Result<Box<dyn SearchMethod>> {
    Ok(match name {
        "bon" => Box::new(BestOfN),
        "beam" => Box::new(BeamSearch),
        "dvts" => Box::new(Dvts),
        "lookahead" => Box::new(Lookahead),
        "resample" => Box::new(Resample),
        other => anyhow::bail!("unknown search method `{other}`: use {}", METHODS.join(", ")),
    })
}
