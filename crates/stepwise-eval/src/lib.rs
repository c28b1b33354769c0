//! stepwise-eval: metrics and plots.
//!
//! # Example
//!
//! `examples/processbench.rs` (run it with `cargo run -p stepwise-eval --example processbench`; it is also a doc-test):
//!
#![doc = concat!("```\n", include_str!("../examples/processbench.rs"), "```")]
#![warn(missing_docs)]

pub mod bon;
pub mod labels;
pub mod paired;
pub mod plot;
pub mod prmbench;
pub mod processbench;
pub mod ranking;
