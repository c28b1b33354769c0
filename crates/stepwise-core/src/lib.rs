//! stepwise-core: the records of process supervision and the formats, step splitting, answer
//! extraction and grading every other stepwise stage builds on.
//!
//! # Example
//!
//! `examples/records.rs` (run it with `cargo run -p stepwise-core --example records`; it is also a doc-test):
//!
#![doc = concat!("```\n", include_str!("../examples/records.rs"), "```")]
#![warn(missing_docs)]

pub mod answer;
pub mod calc;
pub mod error;
pub mod formats;
pub mod grader;
pub mod io;
pub mod journal;
pub mod json;
pub mod output;
pub mod pairs;
pub mod parallel;
pub mod parquet_io;
pub mod preference;
pub mod record;
pub mod seams;
pub mod stats;
pub mod steps;
pub mod testing;

pub use error::{Error, FieldError, RecordError};
pub use formats::Format;
pub use io::{read_solutions, write_solutions, SolutionReader, SolutionWriter};
pub use record::{LabelValue, Meta, Problem, Provenance, Rating, Solution, Step, StepLabel};
pub use seams::{Annotator, Environment, Episode, Policy, Reward, StepScorer, Task};
