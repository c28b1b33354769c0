//! stepwise-model: the neural engine. Qwen2/Qwen2.5 and Llama/Mistral decoders on candle, read
//! from Hugging Face checkpoint folders; the PRM heads in use; scoring every step in one forward
//! pass; shared-prefix generation; training of policies, PRMs and ORMs.
//!
//! The text side — the tokenizer ([`Tokenizer`], chat templates), the prompt layouts
//! ([`Prompt`]) and the PRM input layouts ([`PrmLayout`], `reward.json`) — is the
//! `stepwise-text` crate, re-exported here under its old paths; a client of served models
//! (`stepwise-remote` without its `engine` feature) depends on that alone. Without its default
//! `engine` feature this crate is only that re-export.
//!
//! # Example
//!
//! `examples/score.rs` (run it with `cargo run -p stepwise-model --example score`; it is also a doc-test):
//!
#![doc = concat!("```\n", include_str!("../examples/score.rs"), "```")]
#![warn(missing_docs)]

/// Items of the engine (candle), there only with the `engine` feature.
macro_rules! engine {
    ($($item:item)*) => { $( #[cfg(feature = "engine")] $item )* };
}

engine! {
    pub mod adapters;
    pub mod config;
    pub mod decode_cache;
    pub mod engine;
    pub mod generate;
    pub mod incremental;
    pub mod input;
    pub mod kernels;
    mod kept_prefixes;
    pub mod logprobs;
    pub mod kv_cache;
    pub mod kv_rows;
    pub mod merged_cache;
    pub mod checkpoint;
    pub mod model;
    pub mod packed;
    pub mod packed_engine;
    pub mod peft;
    pub mod placement;
    pub mod policy;
    pub mod pooler;
    pub mod precision;
    mod primers;
    pub mod sampling;
    pub mod scoring;
    mod tensor_file;
    pub mod train;
    pub mod transformer;

    pub use adapters::{AdapterLease, Adapters};
    pub use config::{Family, HeadKind, ModelConfig};
    pub use decode_cache::{DecodeCache, PassAdapters};
    pub use generate::{first_tokens, generate, generate_with, Decoding, SamplingParams, StepRows};
    pub use incremental::IncrementalScorer;
    pub use input::{BatchCache, Input};
    pub use kernels::bf16_products_available;
    pub use kv_rows::RowsCache;
    pub use logprobs::{token_logprob, TokenLogprob};
    pub use checkpoint::checkpoint_fingerprint;
    pub use model::Model;
    pub use precision::{default_precision, set_default_precision, Precision, WeightDtype, PRECISIONS};
    pub use packed::{token_batches, Packed};
    pub use placement::Placement;
    pub use policy::{EnginePolicy, LoadedPolicy};
    pub use scoring::{PrmScorer, DEFAULT_MAX_BATCH_TOKENS};
}
pub mod alloc;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod layout;
engine! {
    pub mod log_ratio;
}
#[cfg(not(feature = "engine"))]
pub use stepwise_text::log_ratio;
/// The text side (`stepwise-text`), under the paths it has always had here.
pub use stepwise_text::{chat_turns, prompt, tokenizer};

/// Checkpoints by Hugging Face model id (`stepwise-text`'s [`stepwise_text::hub`]), and with the
/// engine PEFT LoRA adapter folders merged onto their base ([`peft`]).
pub mod hub {
    #[cfg(feature = "engine")]
    use anyhow::Context;
    pub use stepwise_text::hub::*;

    /// A checkpoint folder from a command-line argument ([`stepwise_text::hub::resolve`]: a
    /// folder, or a model id found in the cache or downloaded); a PEFT adapter's folder or id
    /// gives its merged model ([`crate::peft::resolve`]).
    #[cfg(feature = "engine")]
    pub fn resolve(arg: &str) -> anyhow::Result<std::path::PathBuf> {
        crate::peft::resolve(stepwise_text::hub::resolve(arg)?, stepwise_text::hub::resolve)
    }

    /// A folder from a command-line argument as [`resolve`] finds it, an adapter's left as it
    /// is (not merged).
    pub fn resolve_folder(arg: &str) -> anyhow::Result<std::path::PathBuf> {
        stepwise_text::hub::resolve(arg)
    }

    /// The PEFT adapter `adapter` (a folder or model id) merged onto `base` (else the base it
    /// names, found as any model) into the new folder `out` ([`crate::peft::merge_to`]).
    #[cfg(feature = "engine")]
    pub fn merge_adapter(adapter: &str, base: Option<&std::path::Path>, out: &std::path::Path) -> anyhow::Result<()> {
        let dir = resolve_folder(adapter)?;
        crate::peft::merge_to(&dir, base, resolve, out).with_context(|| format!("merging {}", dir.display()))
    }

    /// Model `id` found in the Hugging Face cache or downloaded into it (only what stepwise
    /// reads), and for a PEFT adapter its base when that is a model id: each id with its
    /// snapshot folder. Refused for a folder (nothing to download).
    #[cfg(feature = "engine")]
    pub fn download(id: &str) -> anyhow::Result<Vec<(String, std::path::PathBuf)>> {
        use std::path::Path;
        anyhow::ensure!(
            !Path::new(id).exists(),
            "{id}: a folder here, not a model id to download"
        );
        let dir = resolve_folder(id)?;
        let mut got = vec![(id.to_string(), dir.clone())];
        if is_adapter(&dir) {
            let base = crate::peft::base_model(&dir)?;
            if !Path::new(&base).exists() && !dir.join(&base).exists() {
                let base_dir = resolve_folder(&base).with_context(|| format!("{id}: its base model {base}"))?;
                got.push((base, base_dir));
            }
        }
        Ok(got)
    }
}

pub use layout::PrmLayout;
pub use prompt::Prompt;
pub use tokenizer::Tokenizer;

/// The device candle's tensors live on: the CPU. (The GPU is the CUDA engine's, chosen by
/// [`Placement`]: it scores packed batches with its own kernels.)
#[cfg(feature = "engine")]
pub fn default_device() -> candle_core::Device {
    candle_core::Device::Cpu
}
