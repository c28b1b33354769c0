//! stepwise-text: a model's text side. Everything that turns a problem and its steps into the
//! token ids a model reads, and nothing that runs the model: the tokenizer with its chat template
//! ([`Tokenizer`]), the prompt layouts a policy continues ([`Prompt`]), the PRM input layouts with
//! where step rewards are read ([`PrmLayout`], `reward.json`), a log-ratio verifier's spans
//! ([`log_ratio::LogRatio`]), chat turns read off a template ([`chat_turns`]), and model ids
//! resolved in the Hugging Face cache ([`hub`]; downloaded with the `download` feature).
//!
//! `stepwise-model` (the engine) re-exports it; a client of served models (`stepwise-remote`
//! without its `engine` feature) needs only this, so it builds without candle.
#![warn(missing_docs)]

pub mod chat_turns;
pub mod hub;
pub mod layout;
pub mod log_ratio;
pub mod prompt;
pub mod tokenizer;

pub use layout::PrmLayout;
pub use prompt::Prompt;
pub use tokenizer::Tokenizer;
