//! stepwise-lab: the built-in lab. A verifiable synthetic reasoning domain — arithmetic word
//! problems ([`task`]) or the same stories as straight-line programs checked by execution
//! ([`code`]), behind the [`stepwise_core::Task`] seam as [`oracle::LabTask`] — and the whole
//! process-supervision loop on it ([`fn@run`]), one file per stage ([`stages`]): train a policy from
//! scratch, sample, annotate steps by Monte Carlo rollouts, train PRMs and an ORM, evaluate,
//! report.
//!
//! # Example
//!
//! `examples/quick_lab.rs` (run it with `cargo run -p stepwise-lab --example quick_lab`; it is also a doc-test):
//!
#![doc = concat!("```no_run\n", include_str!("../examples/quick_lab.rs"), "```")]
#![warn(missing_docs)]

pub mod agent;
pub mod code;
pub mod confidence;
mod html;
pub mod oracle;
pub mod preset;
pub mod problems;
pub mod progress;
pub mod reasoning;
pub mod report;
pub mod run;
mod scoring;
pub mod splits;
pub mod stages;
pub mod task;
pub mod vocab;

pub use preset::Preset;
pub use run::{run, LabOptions};
pub use stages::evaluate::Report;
