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

/// A checkpoint's small file (`config.json`, `tokenizer.json`, `reward.json`, an index) as text,
/// after checking that it is a file: a device or pipe in its place (`/dev/zero`) would be read
/// without end. Links are followed (the Hugging Face cache links snapshots to blobs).
pub fn read_model_file(path: &std::path::Path) -> anyhow::Result<String> {
    use anyhow::Context;
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if !meta.is_file() {
        anyhow::bail!(
            "{}: not a regular file (a folder, device or pipe): a checkpoint's files are files",
            path.display()
        );
    }
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}
