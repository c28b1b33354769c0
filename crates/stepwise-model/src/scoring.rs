//! Scoring every step of a solution in one forward pass, for every PRM layout
//! ([`crate::layout::PrmLayout`]): a local checkpoint as a [`stepwise_core::StepScorer`].

use crate::config::HeadKind;
use crate::layout::{Encoded, PrmLayout};
use crate::log_ratio::sequence_logprobs;
use crate::pooler;
use crate::model::Model;
use crate::packed::token_batches;
use crate::tokenizer::Tokenizer;
use anyhow::{bail, Context, Result};
use stepwise_core::seams::{ScoreInput, Scored, StepScorer};

/// Tokens one forward pass of scoring takes by default ([`PrmScorer::max_batch_tokens`]).
pub const DEFAULT_MAX_BATCH_TOKENS: usize = 16384;

/// A local checkpoint that scores steps: a PRM of any layout, an ORM, a log-ratio verifier.
#[derive(Clone)]
pub struct PrmScorer<'a> {
    /// The model.
    pub model: &'a Model,
    /// Its tokenizer.
    pub tokenizer: &'a Tokenizer,
    /// Its layout.
    pub layout: PrmLayout,
    /// The reference model of a [`PrmLayout::LogRatio`] verifier (`None` for the others, and
    /// for a constant reference).
    pub reference: Option<&'a Model>,
    /// Most tokens in one forward pass: a batch is scored in passes of solutions packed up to
    /// this budget (a longer solution alone), which bounds the memory a pass takes.
    pub max_batch_tokens: usize,
}

impl<'a> PrmScorer<'a> {
    /// `model` read through `layout`, with no reference model and the default token budget.
    pub fn new(model: &'a Model, tokenizer: &'a Tokenizer, layout: PrmLayout) -> Self {
        PrmScorer {
            model,
            tokenizer,
            layout,
            reference: None,
            max_batch_tokens: DEFAULT_MAX_BATCH_TOKENS,
        }
    }

    /// With the reference model of a log-ratio verifier.
    pub fn with_reference(mut self, reference: Option<&'a Model>) -> Self {
        self.reference = reference;
        self
    }

    /// With at most `tokens` tokens a forward pass.
    pub fn with_max_batch_tokens(mut self, tokens: usize) -> Self {
        self.max_batch_tokens = tokens.max(1);
        self
    }

    /// Encode a problem and its steps.
    pub fn encode(&self, problem: &str, steps: &[&str]) -> Result<Encoded> {
        // A text far longer than the model reads is refused before tokenizing it (a 50 MB line
        // took seconds and gigabytes to tokenize only to be refused after).
        let cfg = &self.model.config;
        let positions = cfg.scoring_positions();
        let bytes = problem.len() + steps.iter().map(|s| s.len()).sum::<usize>();
        let limit = positions * self.tokenizer.longest_token_bytes() + 4096;
        if bytes > limit {
            bail!("a solution of {bytes} bytes is more than the model's {positions} positions can hold, whatever its tokens");
        }
        let e = self.layout.encode(self.tokenizer, problem, steps)?;
        if e.ids.len() > positions {
            bail!(
                "{} tokens: longer than the {positions} positions a verifier reads (four times its max_position_embeddings of {}, at most 32768)",
                e.ids.len(),
                cfg.max_position_embeddings
            );
        }
        if e.ids.len() > cfg.max_position_embeddings {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                eprintln!(
                    "warning: a solution of {} tokens is longer than the model's max_position_embeddings ({}): \
                     solutions past the trained context are scored with extrapolated positions, as \
                     transformers scores them (up to {positions} tokens)",
                    e.ids.len(),
                    cfg.max_position_embeddings
                )
            });
        }
        if e.positions.len() != steps.len() {
            bail!(
                "{} steps but {} reward positions in the encoded input (a step contains the step token?)",
                steps.len(),
                e.positions.len()
            );
        }
        Ok(e)
    }

    /// Step rewards for a batch of encoded solutions, in forward passes of at most
    /// [`PrmScorer::max_batch_tokens`] tokens (every solution scores as it would alone).
    pub fn score_batch(&self, batch: &[Encoded]) -> Result<Vec<Vec<f32>>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let seqs: Vec<&[u32]> = batch.iter().map(|e| e.ids.as_slice()).collect();
        let mut out = vec![Vec::new(); batch.len()];
        for group in token_batches(&seqs, self.max_batch_tokens) {
            let part: Vec<&Encoded> = group.iter().map(|&i| &batch[i]).collect();
            for (i, rewards) in group.into_iter().zip(self.score_pass(&part)?) {
                out[i] = rewards;
            }
        }
        Ok(out)
    }

    /// Step rewards of the solutions of one forward pass: the engine gives what the layout
    /// reads, the pooler turns it into rewards.
    fn score_pass(&self, batch: &[&Encoded]) -> Result<Vec<Vec<f32>>> {
        let seqs: Vec<&[u32]> = batch.iter().map(|e| e.ids.as_slice()).collect();
        if let PrmLayout::LogRatio { log_ratio, .. } = &self.layout {
            // Both models read the batch once, each where its weights are.
            let logprobs = |model: &Model| sequence_logprobs(model, &seqs, seqs.len(), self.max_batch_tokens);
            let own = logprobs(self.model)?;
            let reference = match (log_ratio.reference_logprob, self.reference) {
                (None, Some(r)) => Some(logprobs(r)?),
                _ => None,
            };
            return pooler::log_ratio_rewards(batch, &own, reference.as_deref(), *log_ratio);
        }
        // The decoder's last layer runs only where rewards are read, and so does the head.
        let rows: Vec<Vec<usize>> = batch.iter().map(|e| e.positions.clone()).collect();
        let columns = self.layout.head_columns(self.tokenizer)?;
        let (values, width) = self.model.head_at(&seqs, &rows, columns.as_ref().map(|c| c.as_slice()))?;
        Ok(pooler::per_solution(&pooler::good_probs(values, width)?, batch))
    }

    /// Step rewards of one solution.
    pub fn score(&self, problem: &str, steps: &[&str]) -> Result<Vec<f32>> {
        let e = self.encode(problem, steps)?;
        Ok(self.score_batch(std::slice::from_ref(&e))?.remove(0))
    }
}

impl StepScorer for PrmScorer<'_> {
    fn score(&self, batch: &[ScoreInput<'_>]) -> Result<Scored> {
        // Tokenized on every core: an H100 scores ProcessBench's GSM8K at the 0.5B shape in
        // 1.3 s, and tokenizing it one solution after another takes 0.13 s of one core.
        use rayon::prelude::*;
        let enc = batch
            .par_iter()
            .map(|s| self.encode(s.question, &s.steps))
            .collect::<Result<Vec<_>>>()?;
        Ok(Scored {
            tokens: enc.iter().map(|e| e.ids.len()).sum(),
            scores: self.score_batch(&enc)?,
        })
    }
}

/// A verifier folder loaded for scoring: the model, its tokenizer, its layout and, for a
/// log-ratio verifier scored against a model, that reference model.
pub struct LoadedVerifier {
    /// The verifier.
    pub model: Model,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// How it reads solutions.
    pub layout: PrmLayout,
    /// The reference model named in its `reward.json`, if any (loaded where the verifier is).
    pub reference: Option<Model>,
    /// Most tokens in one forward pass of every scorer it gives (log-ratio passes and the
    /// reference model's included); [`DEFAULT_MAX_BATCH_TOKENS`] unless set.
    pub max_batch_tokens: usize,
}

impl LoadedVerifier {
    /// Load the verifier in `dir` on the CPU. `layout` is `auto` (from `reward.json`, else from
    /// the head and tokenizer), `qwen-prm`, `step-tag`, `token-cls` or `log-ratio`.
    pub fn load(dir: &std::path::Path, layout: &str, device: &candle_core::Device) -> Result<Self> {
        let model = Model::load(dir, device)?;
        Self::load_model(dir, layout, model, |r| Model::load(r, device))
    }

    /// [`LoadedVerifier::load`] where `placement` says (the CPU in `precision`, or a CUDA GPU).
    pub fn load_on(
        dir: &std::path::Path,
        layout: &str,
        placement: crate::Placement,
        precision: crate::Precision,
    ) -> Result<Self> {
        let model = Model::load_on(dir, placement, precision)?;
        Self::load_model(dir, layout, model, |r| Model::load_on(r, placement, precision))
    }

    /// At most `tokens` (at least 1) tokens in one forward pass.
    pub fn with_max_batch_tokens(mut self, tokens: usize) -> Self {
        self.max_batch_tokens = tokens.max(1);
        self
    }

    fn load_model(
        dir: &std::path::Path,
        layout: &str,
        model: Model,
        load_reference: impl Fn(&std::path::Path) -> Result<Model>,
    ) -> Result<Self> {
        use crate::layout::{RewardSpec, REWARD_FILE};
        let tokenizer = Tokenizer::from_dir(dir)?;
        // The folder's reward.json says how it was trained to read steps (layout, separator).
        let spec = RewardSpec::load(dir)?;
        let file = || dir.join(REWARD_FILE).display().to_string();
        if let Some(s) = &spec {
            let causal = model.config.head == HeadKind::CausalLm;
            if causal != (s.kind == RewardSpec::LOG_LIKELIHOOD_RATIO) {
                bail!(
                    "{}: field `kind`: `{}` does not fit the model's {:?} head",
                    file(),
                    s.kind,
                    model.config.head
                );
            }
        }
        let layout = match (layout, &spec) {
            ("auto", Some(s)) => s.layout(),
            ("auto", None) => crate::layout::detect(&model, &tokenizer)?,
            ("log-ratio", Some(s)) if s.log_ratio.is_some() => s.layout(),
            ("log-ratio", _) => bail!("layout log-ratio: {} has no {REWARD_FILE} of that kind", dir.display()),
            // A classifier's own separator, not the layout's default.
            ("token-cls", Some(s)) if s.log_ratio.is_none() => s.layout(),
            (other, _) => PrmLayout::by_name(other)?,
        };
        // A log-ratio verifier names its reference model (unless its reference is a constant);
        // it is scored against it.
        let reference = match spec.as_ref().and_then(|s| s.reference_dir(dir)) {
            Some(r) if matches!(layout, PrmLayout::LogRatio { .. }) => Some(
                load_reference(&r)
                    .with_context(|| format!("loading the reference model named in {}", file()))?,
            ),
            _ => None,
        };
        Ok(LoadedVerifier {
            model,
            tokenizer,
            layout,
            reference,
            max_batch_tokens: DEFAULT_MAX_BATCH_TOKENS,
        })
    }

    /// It, as a step scorer.
    pub fn scorer(&self) -> PrmScorer<'_> {
        PrmScorer::new(&self.model, &self.tokenizer, self.layout.clone())
            .with_reference(self.reference.as_ref())
            .with_max_batch_tokens(self.max_batch_tokens)
    }
}
