//! A [`Policy`] backed by a local checkpoint (Qwen2/Llama folder): the prompt is the question
//! (optionally in the tokenizer's chat template) followed by the prefix steps, each ending with
//! the step separator; completions are split back into steps at that separator. The prompt is
//! encoded once and its KV cache shared by the `k` rollouts.

use crate::Policy;
use anyhow::Result;
use stepwise_model::tokenizer::Message;
use stepwise_model::{generate, Model, SamplingParams, Tokenizer};

/// A local model as a rollout policy.
pub struct EnginePolicy<'a> {
    /// The policy model.
    pub model: &'a Model,
    /// Its tokenizer.
    pub tokenizer: &'a Tokenizer,
    /// Sampling settings (the seed is set per call).
    pub params: SamplingParams,
    /// Wrap the question in the chat template (instruction-tuned policies).
    pub chat: bool,
    /// Text between steps, e.g. `"\n\n"` or `"\n"`.
    pub separator: String,
}

impl EnginePolicy<'_> {
    /// The prompt text for a question and the steps so far.
    pub fn prompt(&self, question: &str, prefix: &[&str]) -> Result<String> {
        let mut text = if self.chat {
            self.tokenizer
                .apply_chat_template(&[Message::new("user", question)], true)?
        } else {
            format!("{question}{}", self.separator)
        };
        for s in prefix {
            text.push_str(s);
            text.push_str(&self.separator);
        }
        Ok(text)
    }
}

impl Policy for EnginePolicy<'_> {
    fn complete(&self, question: &str, prefix: &[&str], k: usize, seed: u64) -> Result<Vec<Vec<String>>> {
        let ids = self.tokenizer.encode(&self.prompt(question, prefix)?, true)?;
        let params = SamplingParams {
            seed,
            ..self.params.clone()
        };
        generate(self.model, Some(self.tokenizer), &ids, k, &params)?
            .into_iter()
            .map(|out| {
                let body: Vec<u32> = out.into_iter().filter(|t| !params.stop_token_ids.contains(t)).collect();
                Ok(self
                    .tokenizer
                    .decode(&body)?
                    .split(self.separator.as_str())
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect())
            })
            .collect()
    }
}
