//! Stage 1, the policy: a small causal LM over `question | step | step | <eos>` trained from
//! scratch (next-token loss) on reference solutions, some with one arithmetic slip; and the
//! policy behind the [`stepwise_core::Policy`] seam, so sampling and annotation do not know it is
//! local.

use super::train_stage;
use crate::preset::Preset;
use crate::task::{self, LabProblem};
use crate::vocab::{EOS, SEP};
use anyhow::Result;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::path::Path;
use stepwise_model::layout::encode_steps;
use stepwise_model::train::{Example, Objective, TrainConfig};
use stepwise_model::{EnginePolicy, HeadKind, Model, ModelConfig, Prompt, SamplingParams, Tokenizer};

/// A lab model's configuration.
pub fn shape(vocab: usize, (hidden, layers): (usize, usize), head: HeadKind) -> ModelConfig {
    ModelConfig::tiny(vocab, hidden, layers, 4, 2, head)
}

/// A next-token training example for a full solution (loss on the solution part only).
pub fn lm_example(tok: &Tokenizer, question: &str, steps: &[String]) -> Result<Example> {
    let lm_from = encode_steps(tok, question, &[], SEP, true)?.ids.len();
    let refs: Vec<&str> = steps.iter().map(String::as_str).collect();
    let mut ids = encode_steps(tok, question, &refs, SEP, true)?.ids;
    ids.pop(); // the last separator is replaced by the end token
    ids.extend(tok.encode(EOS, false)?);
    Ok(Example {
        ids,
        lm_from,
        ..Default::default()
    })
}

/// Train (or reuse) the policy in `dir` on the policy split.
pub fn train_policy(dir: &Path, p: &Preset, seed: u64, problems: &[LabProblem], tok: &Tokenizer) -> Result<Model> {
    let lm = LanguageModel {
        domain: p.domain,
        what: "training policy",
        shape: p.policy.shape,
        steps: p.policy.steps,
        slip: p.policy.slip,
    };
    lm.train(dir, seed, problems, tok)
}

/// Train (or reuse) the verifiers' base LM in `dir`: the policy's recipe on the same problems,
/// with `p.verifiers.base_shape` and `p.verifiers.base_steps`, and reference solutions without
/// slips (a verifier's base should not learn that a wrong result is sometimes written).
pub fn train_verifier_base(
    dir: &Path,
    p: &Preset,
    seed: u64,
    problems: &[LabProblem],
    tok: &Tokenizer,
) -> Result<Model> {
    let lm = LanguageModel {
        domain: p.domain,
        what: "training the verifiers' base",
        shape: p.verifiers.base_shape,
        steps: p.verifiers.base_steps,
        slip: 0.0,
    };
    lm.train(dir, seed ^ 8, problems, tok)
}

/// A lab language model's recipe: next-token loss on reference solutions (one in `slip` with
/// an arithmetic slip), a twentieth held out for validation, batches of 32 at peak learning
/// rate 3e-3.
struct LanguageModel<'a> {
    domain: crate::task::Domain,
    what: &'a str,
    shape: (usize, usize),
    steps: usize,
    slip: f64,
}

impl LanguageModel<'_> {
    fn train(&self, dir: &Path, seed: u64, problems: &[LabProblem], tok: &Tokenizer) -> Result<Model> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 1);
        let lm: Vec<_> = problems
            .iter()
            .map(|q| lm_example(tok, &q.question, &task::noisy_reference(q, &mut rng, self.slip)))
            .collect::<Result<_>>()?;
        let (lm_valid, lm_train) = lm.split_at(lm.len() / 20);
        let tc = TrainConfig {
            lr: 3e-3,
            warmup: self.steps / 20,
            steps: self.steps,
            batch_size: 32,
            eval_every: self.steps / 4,
            seed,
            ..Default::default()
        };
        let cfg = shape(tok.vocab_size(), self.shape, HeadKind::CausalLm);
        train_stage(
            dir,
            self.domain,
            self.what,
            |varmap, dev| Model::fresh(cfg, varmap, dev, seed),
            lm_train,
            lm_valid,
            Objective::Lm,
            tc,
        )
    }
}

/// The trained policy as a [`stepwise_core::Policy`]: the lab's own prompt layout, sampling at
/// `temperature`, at most 64 new tokens, ending at `<eos>`.
pub fn lab_policy<'a>(model: &'a Model, tok: &'a Tokenizer, temperature: f32) -> EnginePolicy<'a> {
    EnginePolicy {
        model,
        tokenizer: tok,
        params: SamplingParams {
            temperature,
            max_new_tokens: 64,
            stop_token_ids: tok.token_id(EOS).into_iter().collect(),
            ..Default::default()
        },
        prompt: Prompt::Pieces,
        separator: SEP.into(),
        adapter: None,
    }
}
