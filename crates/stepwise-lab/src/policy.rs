//! The lab policy: a small causal LM over `question | step | step | <eos>`, behind the
//! [`stepwise_label::Policy`] seam so Monte Carlo annotation does not know it is local.

use crate::vocab::{EOS, SEP};
use anyhow::Result;
use stepwise_model::train::Example;
use stepwise_model::{generate, Model, SamplingParams, Tokenizer};

/// A trained lab policy.
pub struct LabPolicy<'a> {
    /// The model.
    pub model: &'a Model,
    /// The lab tokenizer.
    pub tok: &'a Tokenizer,
    /// Sampling temperature.
    pub temperature: f32,
    /// Most new tokens per completion.
    pub max_new_tokens: usize,
}

/// Token ids of a question and step prefix, each step followed by the separator.
pub fn prompt_ids(tok: &Tokenizer, question: &str, prefix: &[&str]) -> Result<Vec<u32>> {
    let mut ids = tok.encode(question, false)?;
    let sep = tok.encode(SEP, false)?;
    ids.extend(&sep);
    for s in prefix {
        ids.extend(tok.encode(s, false)?);
        ids.extend(&sep);
    }
    Ok(ids)
}

/// A next-token training example for a full solution (loss on the solution part only).
pub fn lm_example(tok: &Tokenizer, question: &str, steps: &[String]) -> Result<Example> {
    let q = prompt_ids(tok, question, &[])?;
    let lm_from = q.len();
    let refs: Vec<&str> = steps.iter().map(String::as_str).collect();
    let mut ids = prompt_ids(tok, question, &refs)?;
    ids.pop(); // the last separator is replaced by the end token
    ids.extend(tok.encode(EOS, false)?);
    Ok(Example {
        ids,
        targets: Vec::new(),
        lm_from,
    })
}

impl stepwise_label::Policy for LabPolicy<'_> {
    fn complete(&self, question: &str, prefix: &[&str], k: usize, seed: u64) -> Result<Vec<Vec<String>>> {
        let ids = prompt_ids(self.tok, question, prefix)?;
        let eos = self.tok.token_id(EOS).into_iter().collect();
        let p = SamplingParams {
            temperature: self.temperature,
            max_new_tokens: self.max_new_tokens,
            seed,
            stop_token_ids: eos,
            ..Default::default()
        };
        generate(self.model, None, &ids, k, &p)?
            .into_iter()
            .map(|out| {
                let text = self.tok.decode(&out)?;
                Ok(text
                    .replace(EOS, "")
                    .split(SEP)
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect())
            })
            .collect()
    }
}
