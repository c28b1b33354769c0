//! stepwise-lab: the built-in lab. A verifiable synthetic reasoning domain ([`task`]) and the
//! whole process-supervision loop on it ([`pipeline`]): train a policy from scratch, sample,
//! annotate steps by Monte Carlo rollouts, train PRMs and an ORM, evaluate, report.
#![warn(missing_docs)]

pub mod pipeline;
pub mod policy;
pub mod report;
pub mod task;
pub mod vocab;

pub use pipeline::{run, LabOptions, Preset};
