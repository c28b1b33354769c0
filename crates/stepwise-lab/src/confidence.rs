//! *Policy confidence*, a diagnostic baseline behind the [`StepScorer`] seam: each step scored by
//! the probability the policy itself gave the token that ends it (an equation's result, a
//! comparison's right side, the stated answer), reading the solution in the policy's own layout
//! in one forward pass. It shows whether the policy "knows" when a written result is wrong —
//! information a verifier fine-tuned from it could, in principle, use.

use crate::vocab::SEP;
use anyhow::Result;
use stepwise_core::seams::{ScoreInput, Scored, StepScorer};
use stepwise_model::layout::encode_steps;
use stepwise_model::{Model, Tokenizer};

/// The policy's probability of each step's last token.
pub struct PolicyConfidence<'a> {
    /// The policy.
    pub model: &'a Model,
    /// The lab tokenizer.
    pub tok: &'a Tokenizer,
}

impl PolicyConfidence<'_> {
    /// The probabilities for one solution.
    pub fn step_end_probabilities(&self, question: &str, steps: &[&str]) -> Result<Vec<f32>> {
        Ok(self.probabilities(question, steps)?.0)
    }

    /// The probabilities for one solution and the tokens it was encoded into.
    fn probabilities(&self, question: &str, steps: &[&str]) -> Result<(Vec<f32>, usize)> {
        let e = encode_steps(self.tok, question, steps, SEP, true)?;
        let sep_len = self.tok.encode(SEP, false)?.len();
        // A step's last token sits just before its separator.
        let ends: Vec<usize> = e.ends.iter().map(|&p| p - sep_len).collect();
        let model = self.model;
        let input = candle_core::Tensor::new(e.ids.as_slice(), &model.device)?.unsqueeze(0)?;
        let logits = model
            .head_logits(&model.hidden(stepwise_model::Input::padded(&input, None))?)?
            .squeeze(0)?;
        let probs = candle_nn::ops::softmax_last_dim(&logits)?.to_vec2::<f32>()?;
        // The token at position p was predicted at position p - 1 (a question is never empty).
        Ok((
            ends.iter().map(|&p| probs[p - 1][e.ids[p] as usize]).collect(),
            e.ids.len(),
        ))
    }
}

impl StepScorer for PolicyConfidence<'_> {
    fn score(&self, batch: &[ScoreInput<'_>]) -> Result<Scored> {
        let mut scores = Vec::with_capacity(batch.len());
        let mut tokens = 0;
        for i in batch {
            let (s, n) = self.probabilities(i.question, &i.steps)?;
            tokens += n;
            scores.push(s);
        }
        Ok(Scored { scores, tokens })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};
    use stepwise_model::{HeadKind, ModelConfig};

    #[test]
    fn step_end_probabilities_read_the_token_that_ends_each_step() {
        let tok = crate::vocab::tokenizer(crate::task::Domain::Arithmetic).unwrap();
        let cfg = ModelConfig::tiny(tok.vocab_size(), 32, 1, 4, 2, HeadKind::CausalLm);
        let model = Model::fresh(cfg, &candle_nn::VarMap::new(), &Device::Cpu, 3).unwrap();
        let (q, steps) = ("Ann has 3 bags of 4 coins .", ["3 * 4 = 12", "The answer is 12"]);
        let got = PolicyConfidence {
            model: &model,
            tok: &tok,
        }
        .step_end_probabilities(q, &steps)
        .unwrap();
        // The same probabilities from the next-token distribution after each step's prefix.
        for (k, step) in steps.iter().enumerate() {
            let mut ids = encode_steps(&tok, q, &steps[..k], SEP, true).unwrap().ids;
            let words = tok.encode(step, false).unwrap();
            ids.extend(&words[..words.len() - 1]);
            let input = Tensor::new(ids.as_slice(), &Device::Cpu).unwrap().unsqueeze(0).unwrap();
            let h = model.hidden(stepwise_model::Input::padded(&input, None)).unwrap();
            let last = model.head_logits(&h.narrow(1, ids.len() - 1, 1).unwrap()).unwrap();
            let p = candle_nn::ops::softmax_last_dim(&last.flatten_all().unwrap()).unwrap();
            let want = p.to_vec1::<f32>().unwrap()[*words.last().unwrap() as usize];
            assert!((got[k] - want).abs() < 1e-5, "step {k}: {} vs {want}", got[k]);
        }
    }
}
