//! The labelling studio: people rate the steps of reasoning chains in the browser, as
//! PRM800K's labellers did, with a PRM's suggestions beside each step (or hidden, for blind
//! labelling), a queue ordered by an active-learning policy, gold quality-control records,
//! agreement statistics, a reviewer's adjudication, and export to every step format.
//!
//! - [`store`]: the SQLite store (WAL; a rating is on disk when the page says saved).
//! - [`server`]: the page, its assets and the JSON API, behind sessions and roles.
//! - [`select`]: queue priorities (uniform, convincing wrong answers, uncertainty).
//! - [`agreement`]: Cohen's and Fleiss' κ, first-error agreement.
//! - [`export`]: labels as records of any format.
//! - [`client`]: the HTTP API from Rust, for scripts that label.
//!
//! # Example
//!
//! `examples/label_by_script.rs` (run it with `cargo run -p stepwise-studio --example label_by_script`; it is also a doc-test):
//!
#![doc = concat!("```no_run\n", include_str!("../examples/label_by_script.rs"), "```")]

pub mod agreement;
pub mod client;
pub mod export;
pub mod select;
pub mod server;
pub mod settings;
pub mod store;
pub mod time;

pub use settings::{Policy, Role, Settings};
pub use store::{NewRecord, Project, Store};
