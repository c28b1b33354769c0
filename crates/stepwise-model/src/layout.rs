//! How a problem and its steps are laid out as model input: `stepwise_text::layout`, re-exported,
//! and the one thing that needs a loaded model, [`detect`]ing the layout a checkpoint was built
//! for.

pub use stepwise_text::layout::*;

#[cfg(feature = "engine")]
use crate::{config::HeadKind, model::Model, tokenizer::Tokenizer};
#[cfg(feature = "engine")]
use anyhow::{bail, Result};

/// The layout a checkpoint was built for, from its head and tokenizer.
#[cfg(feature = "engine")]
pub fn detect(model: &Model, tok: &Tokenizer) -> Result<PrmLayout> {
    match model.config.head {
        HeadKind::ProcessRewardMlp => PrmLayout::by_name("qwen-prm"),
        // A sequence classifier read at each step's end scores each solution prefix; its
        // last step is the outcome score transformers would return.
        HeadKind::TokenClassification | HeadKind::SequenceClassification => PrmLayout::by_name("token-cls"),
        HeadKind::CausalLm if tok.token_id("ки").is_some() => PrmLayout::by_name("step-tag"),
        HeadKind::CausalLm => {
            bail!("a causal LM without a `ки` step tag is a policy, not a PRM (pass --layout)")
        }
    }
}
