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
        lm_from,
        ..Default::default()
    })
}

/// The probability the policy gave to the token that ends each step (an equation's result, a
/// comparison's right side, the stated answer), reading the solution in the policy's own format
/// in one forward pass. A diagnostic: it shows whether the policy itself "knows" when a written
/// result is wrong — information a verifier fine-tuned from it could, in principle, use.
pub fn step_end_probabilities(model: &Model, tok: &Tokenizer, question: &str, steps: &[&str]) -> Result<Vec<f32>> {
    let mut ids = prompt_ids(tok, question, &[])?;
    let sep = tok.encode(SEP, false)?;
    let mut ends = Vec::with_capacity(steps.len());
    for s in steps {
        ids.extend(tok.encode(s, false)?);
        ends.push(ids.len() - 1);
        ids.extend(&sep);
    }
    let input = candle_core::Tensor::new(ids.as_slice(), &model.device)?.unsqueeze(0)?;
    let logits = model.head_logits(&model.hidden(&input, None, None)?)?.squeeze(0)?;
    let probs = candle_nn::ops::softmax_last_dim(&logits)?.to_vec2::<f32>()?;
    // The token at position p was predicted at position p - 1 (a question is never empty).
    Ok(ends.iter().map(|&p| probs[p - 1][ids[p] as usize]).collect())
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

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};
    use stepwise_model::{HeadKind, ModelConfig};

    #[test]
    fn step_end_probabilities_read_the_token_that_ends_each_step() {
        let tok = crate::vocab::tokenizer().unwrap();
        let cfg = ModelConfig::tiny(tok.vocab_size(), 32, 1, 4, 2, HeadKind::CausalLm);
        let model = Model::fresh(cfg, &candle_nn::VarMap::new(), &Device::Cpu, 3).unwrap();
        let (q, steps) = ("Ann has 3 bags of 4 coins .", ["3 * 4 = 12", "The answer is 12"]);
        let got = step_end_probabilities(&model, &tok, q, &steps).unwrap();
        // The same probabilities from the next-token distribution after each step's prefix.
        for (k, step) in steps.iter().enumerate() {
            let mut ids = prompt_ids(&tok, q, &steps[..k]).unwrap();
            let words = tok.encode(step, false).unwrap();
            ids.extend(&words[..words.len() - 1]);
            let input = Tensor::new(ids.as_slice(), &Device::Cpu).unwrap().unsqueeze(0).unwrap();
            let h = model.hidden(&input, None, None).unwrap();
            let last = model.head_logits(&h.narrow(1, ids.len() - 1, 1).unwrap()).unwrap();
            let p = candle_nn::ops::softmax_last_dim(&last.flatten_all().unwrap()).unwrap();
            let want = p.to_vec1::<f32>().unwrap()[*words.last().unwrap() as usize];
            assert!((got[k] - want).abs() < 1e-5, "step {k}: {} vs {want}", got[k]);
        }
    }
}
