//! Scoring every step of a solution in one forward pass, for every PRM layout
//! ([`crate::layout::PrmLayout`]): a local checkpoint as a [`stepwise_core::StepScorer`].

use crate::config::HeadKind;
use crate::layout::{Encoded, PrmLayout};
use crate::log_ratio::{span_sums, token_logprobs, LogRatio};
use crate::model::{pad_batch, Model};
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
        let lengths: Vec<usize> = batch.iter().map(|e| e.ids.len()).collect();
        let mut out = vec![Vec::new(); batch.len()];
        for group in token_batches(&lengths, self.max_batch_tokens) {
            let part: Vec<&Encoded> = group.iter().map(|&i| &batch[i]).collect();
            for (i, rewards) in group.into_iter().zip(self.score_pass(&part)?) {
                out[i] = rewards;
            }
        }
        Ok(out)
    }

    /// Step rewards of the solutions of one forward pass.
    fn score_pass(&self, batch: &[&Encoded]) -> Result<Vec<Vec<f32>>> {
        if let PrmLayout::LogRatio { log_ratio, .. } = &self.layout {
            return self.score_log_ratio(batch, *log_ratio);
        }
        #[cfg(feature = "cuda")]
        if let Some(gpu) = &self.model.gpu {
            return self.score_on_gpu(gpu, batch);
        }
        let seqs: Vec<&[u32]> = batch.iter().map(|e| e.ids.as_slice()).collect();
        // The decoder's last layer runs only where rewards are read, and so does the head.
        let rows: Vec<Vec<usize>> = batch.iter().map(|e| e.positions.clone()).collect();
        let hidden = self
            .model
            .hidden(crate::Input::packed(&crate::packed::Packed::new(&seqs)).read(&rows))?;
        let mut out = Vec::with_capacity(batch.len());
        let mut first = 0;
        for e in batch {
            let at = hidden.narrow(0, first, e.positions.len())?;
            first += e.positions.len();
            let logits = self.model.head_logits(&at)?;
            let local: Vec<usize> = (0..e.positions.len()).collect();
            out.push(self.layout.rewards(self.tokenizer, &logits, &local)?);
        }
        Ok(out)
    }

    /// [`PrmScorer::score_pass`] on the CUDA engine: the solutions packed end to end, the head
    /// read at their reward positions only.
    #[cfg(feature = "cuda")]
    fn score_on_gpu(&self, gpu: &crate::cuda::GpuModel, batch: &[&Encoded]) -> Result<Vec<Vec<f32>>> {
        let seqs: Vec<&[u32]> = batch.iter().map(|e| e.ids.as_slice()).collect();
        let packed = crate::packed::Packed::new(&seqs);
        let read: Vec<usize> = batch
            .iter()
            .enumerate()
            .flat_map(|(i, e)| e.positions.iter().map(move |&p| (i, p)))
            .map(|(i, p)| packed.row(i, p))
            .collect();
        let columns = self.layout.head_columns(self.tokenizer)?;
        let (values, width) = gpu.head_at(&packed, &read, columns.as_ref().map(|c| c.as_slice()))?;
        let logits = candle_core::Tensor::from_vec(values, (read.len(), width), &candle_core::Device::Cpu)?;
        let probs: Vec<f32> = crate::model::good_prob(&logits)?.to_vec1()?;
        Ok(per_solution(&probs, batch))
    }

    /// Step rewards of a log-ratio verifier: both models read the batch once.
    fn score_log_ratio(&self, batch: &[&Encoded], lr: LogRatio) -> Result<Vec<Vec<f32>>> {
        let seqs: Vec<&[u32]> = batch.iter().map(|e| e.ids.as_slice()).collect();
        let (ids, mask, t) = pad_batch(&seqs, &self.model.device)?;
        let own = token_logprobs(self.model, &ids, mask.as_ref())?;
        let ratio = match lr.reference_logprob {
            Some(c) => (own - c as f64)?,
            None => {
                let reference = self
                    .reference
                    .context("a log-ratio verifier scores against its reference model: none was given")?;
                (own - token_logprobs(reference, &ids, mask.as_ref())?)?
            }
        };
        let all: Vec<(usize, usize, usize)> = batch
            .iter()
            .enumerate()
            .flat_map(|(b, e)| {
                lr.step_spans(e.steps_from.max(1), &e.positions)
                    .into_iter()
                    .map(move |(s, end)| (b, s, end))
            })
            .collect();
        if all.is_empty() {
            return Ok(batch.iter().map(|_| Vec::new()).collect());
        }
        let p: Vec<f32> = candle_nn::ops::sigmoid(&(span_sums(&ratio, t, &all)? * lr.beta as f64)?)?.to_vec1()?;
        Ok(per_solution(&p, batch))
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
    /// The reference model named in its `reward.json`, if any.
    pub reference: Option<Model>,
}

impl LoadedVerifier {
    /// Load the verifier in `dir` on the CPU. `layout` is `auto` (from `reward.json`, else from
    /// the head and tokenizer), `qwen-prm`, `step-tag`, `token-cls` or `log-ratio`.
    pub fn load(dir: &std::path::Path, layout: &str, device: &candle_core::Device) -> Result<Self> {
        Self::load_model(dir, layout, Model::load(dir, device)?)
    }

    /// [`LoadedVerifier::load`] where `placement` says (the CPU in `precision`, or a CUDA GPU).
    pub fn load_on(
        dir: &std::path::Path,
        layout: &str,
        placement: crate::Placement,
        precision: crate::Precision,
    ) -> Result<Self> {
        Self::load_model(dir, layout, Model::load_on(dir, placement, precision)?)
    }

    fn load_model(dir: &std::path::Path, layout: &str, model: Model) -> Result<Self> {
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
            ("auto", None) => PrmLayout::detect(&model, &tokenizer)?,
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
                Model::load(&r, &model.device)
                    .with_context(|| format!("loading the reference model named in {}", file()))?,
            ),
            _ => None,
        };
        Ok(LoadedVerifier {
            model,
            tokenizer,
            layout,
            reference,
        })
    }

    /// It, as a step scorer.
    pub fn scorer(&self) -> PrmScorer<'_> {
        PrmScorer::new(&self.model, &self.tokenizer, self.layout.clone()).with_reference(self.reference.as_ref())
    }
}

/// `values`, one per reward position of every solution of `batch` in order, split into each
/// solution's.
fn per_solution(values: &[f32], batch: &[&Encoded]) -> Vec<Vec<f32>> {
    let mut rest = values;
    batch
        .iter()
        .map(|e| {
            let (mine, tail) = rest.split_at(e.positions.len());
            rest = tail;
            mine.to_vec()
        })
        .collect()
}
