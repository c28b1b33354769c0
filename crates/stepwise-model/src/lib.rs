//! stepwise-model: the neural engine. Qwen2/Qwen2.5 and Llama/Mistral decoders on candle, read
//! from Hugging Face checkpoint folders; the PRM heads in use; scoring every step in one forward
//! pass; shared-prefix generation; training of policies, PRMs and ORMs.
//!
//! # Example
//!
//! `examples/score.rs` (run it with `cargo run -p stepwise-model --example score`; it is also a doc-test):
//!
#![doc = concat!("```\n", include_str!("../examples/score.rs"), "```")]
#![warn(missing_docs)]

pub mod config;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod generate;
pub mod hub;
pub mod incremental;
pub mod kernels;
pub mod kv_cache;
pub mod kv_rows;
pub mod layout;
pub mod log_ratio;
pub mod model;
pub mod packed;
pub mod packed_engine;
pub mod placement;
pub mod policy;
pub mod sampling;
pub mod scoring;
pub mod tokenizer;
pub mod train;
pub mod transformer;

pub use config::{Family, HeadKind, ModelConfig};
pub use generate::{generate, Decoding, SamplingParams, StepRows};
pub use incremental::IncrementalScorer;
pub use kernels::{bf16_products, set_bf16_products};
pub use kv_rows::RowsCache;
pub use layout::PrmLayout;
pub use model::{checkpoint_fingerprint, set_weight_dtype, weight_dtype, Model, WeightDtype};
pub use packed::{token_batches, Packed};
pub use placement::Placement;
pub use policy::{EnginePolicy, LoadedPolicy, Prompt};
pub use scoring::PrmScorer;
pub use tokenizer::Tokenizer;

/// The device candle's tensors live on: the CPU. (The GPU is the CUDA engine's, chosen by
/// [`Placement`]: it scores packed batches with its own kernels.)
pub fn default_device() -> candle_core::Device {
    candle_core::Device::Cpu
}
