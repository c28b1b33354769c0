//! stepwise-model: the neural engine. Qwen2/Qwen2.5 and Llama/Mistral decoders on candle, read
//! from Hugging Face checkpoint folders; the PRM heads in use; scoring every step in one forward
//! pass; shared-prefix generation; training of policies, PRMs and ORMs.
//!
//! Without its default `engine` feature it is only what a client needs to send a server the
//! token ids a local model would see: the tokenizer ([`Tokenizer`], chat templates), the
//! prompt layouts ([`Prompt`]) and the PRM input layouts ([`PrmLayout`], `reward.json`), with
//! no candle (`stepwise-remote` without its `engine` feature is such a client).
//!
//! # Example
//!
//! `examples/score.rs` (run it with `cargo run -p stepwise-model --example score`; it is also a doc-test):
//!
#![doc = concat!("```\n", include_str!("../examples/score.rs"), "```")]
#![warn(missing_docs)]

#[cfg(feature = "engine")]
pub mod config;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "engine")]
pub mod generate;
pub mod hub;
#[cfg(feature = "engine")]
pub mod incremental;
#[cfg(feature = "engine")]
pub mod kernels;
#[cfg(feature = "engine")]
pub mod kv_cache;
#[cfg(feature = "engine")]
pub mod kv_rows;
pub mod layout;
pub mod log_ratio;
#[cfg(feature = "engine")]
pub mod model;
#[cfg(feature = "engine")]
pub mod packed;
#[cfg(feature = "engine")]
pub mod packed_engine;
#[cfg(feature = "engine")]
pub mod placement;
#[cfg(feature = "engine")]
pub mod policy;
pub mod prompt;
#[cfg(feature = "engine")]
pub mod sampling;
#[cfg(feature = "engine")]
pub mod scoring;
pub mod tokenizer;
#[cfg(feature = "engine")]
pub mod train;
#[cfg(feature = "engine")]
pub mod transformer;

#[cfg(feature = "engine")]
pub use config::{Family, HeadKind, ModelConfig};
#[cfg(feature = "engine")]
pub use generate::{generate, Decoding, SamplingParams, StepRows};
#[cfg(feature = "engine")]
pub use incremental::IncrementalScorer;
#[cfg(feature = "engine")]
pub use kernels::{bf16_products, set_bf16_products};
#[cfg(feature = "engine")]
pub use kv_rows::RowsCache;
pub use layout::PrmLayout;
#[cfg(feature = "engine")]
pub use model::{checkpoint_fingerprint, set_weight_dtype, weight_dtype, Model, WeightDtype};
#[cfg(feature = "engine")]
pub use packed::{token_batches, Packed};
#[cfg(feature = "engine")]
pub use placement::Placement;
#[cfg(feature = "engine")]
pub use policy::{EnginePolicy, LoadedPolicy};
pub use prompt::Prompt;
#[cfg(feature = "engine")]
pub use scoring::PrmScorer;
pub use tokenizer::Tokenizer;

/// The device candle's tensors live on: the CPU. (The GPU is the CUDA engine's, chosen by
/// [`Placement`]: it scores packed batches with its own kernels.)
#[cfg(feature = "engine")]
pub fn default_device() -> candle_core::Device {
    candle_core::Device::Cpu
}
