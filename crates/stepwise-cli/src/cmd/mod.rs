//! One module per subcommand.
pub mod convert;
pub mod generate;
pub mod grade;
pub mod lab;
pub mod score;
pub mod stats;
pub mod train_prm;
