//! stepwise-eval: metrics and plots.
#![warn(missing_docs)]

pub mod bon;
pub mod labels;
pub mod plot;
pub mod prmbench;
pub mod processbench;
pub mod ranking;
