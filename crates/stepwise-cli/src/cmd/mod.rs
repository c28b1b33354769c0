//! One module per subcommand.
pub mod annotate;
pub mod bon;
pub mod convert;
pub mod eval;
pub mod generate;
pub mod grade;
pub mod lab;
pub mod score;
pub mod stats;
pub mod train_prm;
