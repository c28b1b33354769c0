//! One module per subcommand.
pub mod convert;
pub mod grade;
pub mod stats;
