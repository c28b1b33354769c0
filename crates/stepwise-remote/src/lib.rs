//! stepwise-remote: models behind HTTP. A policy or a PRM served by any OpenAI-compatible server
//! (vLLM, SGLang, llama.cpp, `stepwise serve`) as the same [`stepwise_core::seams::Policy`] and
//! [`stepwise_core::seams::StepScorer`] a local checkpoint is, with retries and several servers
//! per run ([`client`]); and `stepwise serve`, a local policy and PRM behind that API (`serve`).
//!
//! The client alone (`default-features = false`) builds without the engine: it encodes with
//! `stepwise-text` (tokenizer, chat templates, prompt and PRM layouts), with no stepwise-model,
//! candle or axum; the default `engine` feature adds `serve` and `backend` (a model argument as a
//! local checkpoint or a server).
//!
//! # Example
//!
//! `examples/remote_prm.rs` (run it with `cargo run -p stepwise-remote --example remote_prm`; it is also a doc-test):
//!
#![doc = concat!("```\n", include_str!("../examples/remote_prm.rs"), "```")]
#![warn(missing_docs)]

#[cfg(feature = "engine")]
pub mod backend;
pub mod client;
pub mod fleet;
pub mod policy;
pub mod sandbox;
pub mod scorer;
#[cfg(feature = "engine")]
pub mod serve;
mod weigh;

pub use client::{is_url, Client, ServerConfig};
pub use policy::RemotePolicy;
pub use sandbox::RemoteSandbox;
pub use scorer::{Protocol, RemoteScorer};
