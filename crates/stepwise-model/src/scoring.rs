//! Scoring every step of a solution in one forward pass, for the four PRM layouts in use.
//!
//! Each layout says how to lay a problem and its steps out as tokens, where the step rewards are
//! read, and how a reward is computed from the model's outputs there.

use crate::config::HeadKind;
use crate::log_ratio::{span_sums, spans, token_logprobs, LogRatio};
use crate::model::{pad_batch, Model};
use crate::tokenizer::{Message, Tokenizer};
use anyhow::{bail, Context, Result};
use candle_core::Tensor;

/// How a PRM expects its input and yields step rewards.
#[derive(Debug, Clone, PartialEq)]
pub enum PrmLayout {
    /// Qwen2.5-Math-PRM: chat template, steps joined by `<extra_0>`; softmax class 1 there.
    QwenPrm {
        /// System prompt of the chat.
        system: String,
        /// The step separator token.
        step_token: String,
    },
    /// Math-Shepherd / RLHFlow: `problem + " " + step + " ки\n" ...`; P(`+`) over {`+`, `-`} at `ки`.
    StepTag {
        /// The step tag.
        tag: String,
        /// Token meaning "good".
        good: String,
        /// Token meaning "bad".
        bad: String,
    },
    /// TRL token classifier: problem ids, then each step's ids + separator ids (no special
    /// tokens); softmax class 1 at the last token of each step + separator.
    TokenClassifier {
        /// The separator after each step.
        separator: String,
    },
    /// A causal LM scored by its log-likelihood ratio against a reference over each step's
    /// tokens ([`crate::log_ratio`]); the input is laid out as the policy writes it (problem,
    /// separator, then each step and separator) and the step reward is
    /// `sigmoid(β · Σ log π_θ/π_ref)`. Needs [`StepScorer::reference`] unless the reference is
    /// a constant.
    LogRatio {
        /// The separator after each step.
        separator: String,
        /// Span scoring.
        log_ratio: LogRatio,
    },
}

/// Qwen2.5-Math-PRM's system prompt.
pub const QWEN_PRM_SYSTEM: &str = "Please reason step by step, and put your final answer within \\boxed{}.";

impl PrmLayout {
    /// The layout a checkpoint was built for, from its head and tokenizer.
    pub fn detect(model: &Model, tok: &Tokenizer) -> Result<Self> {
        Ok(match model.config.head {
            HeadKind::ProcessRewardMlp => PrmLayout::QwenPrm {
                system: QWEN_PRM_SYSTEM.into(),
                step_token: "<extra_0>".into(),
            },
            // A sequence classifier read at each step's end scores each solution prefix; its
            // last step is the outcome score transformers would return.
            HeadKind::TokenClassification | HeadKind::SequenceClassification => {
                PrmLayout::TokenClassifier { separator: "\n".into() }
            }
            HeadKind::CausalLm if tok.token_id("ки").is_some() => PrmLayout::StepTag {
                tag: "ки".into(),
                good: "+".into(),
                bad: "-".into(),
            },
            HeadKind::CausalLm => {
                bail!("a causal LM without a `ки` step tag is a policy, not a PRM (pass --layout)")
            }
        })
    }

    /// Token ids for a problem and its steps, the positions where the step rewards are read, and
    /// where the first step starts (for the step layouts; 0 for the others).
    pub fn encode(&self, tok: &Tokenizer, problem: &str, steps: &[&str]) -> Result<Encoded> {
        match self {
            PrmLayout::QwenPrm { system, step_token } => {
                let head =
                    tok.apply_chat_template(&[Message::new("system", system), Message::new("user", problem)], true)?;
                let body: String = steps.iter().map(|s| format!("{s}{step_token}")).collect();
                let text = format!("{head}{body}<|im_end|><|endoftext|>");
                let ids = tok.encode(&text, true)?;
                let id = tok
                    .token_id(step_token)
                    .with_context(|| format!("the tokenizer has no `{step_token}` token"))?;
                Ok(positions_of(ids, id))
            }
            PrmLayout::StepTag { tag, .. } => {
                let body: String = steps.iter().map(|s| format!("{s} {tag}\n")).collect();
                let ids = tok.encode(&format!("{problem} {body}"), true)?;
                let id = tok
                    .token_id(tag)
                    .with_context(|| format!("the tokenizer has no `{tag}` token"))?;
                Ok(positions_of(ids, id))
            }
            PrmLayout::TokenClassifier { separator } | PrmLayout::LogRatio { separator, .. } => {
                let after_problem = matches!(self, PrmLayout::LogRatio { .. });
                let e = crate::examples::encode_steps(tok, problem, steps, separator, after_problem)?;
                Ok(Encoded {
                    ids: e.ids,
                    positions: e.ends,
                    steps_from: e.steps_from,
                })
            }
        }
    }

    /// Step rewards from head outputs `[t, classes or vocab]` of one sequence at `positions`.
    fn rewards(&self, tok: &Tokenizer, out: &Tensor, positions: &[usize]) -> Result<Vec<f32>> {
        if positions.is_empty() {
            return Ok(Vec::new());
        }
        let idx = Tensor::new(positions.iter().map(|&p| p as u32).collect::<Vec<_>>(), out.device())?;
        let at = out.index_select(&idx, 0)?;
        let pair = match self {
            PrmLayout::StepTag { good, bad, .. } => {
                let g = tok.token_id(good).with_context(|| format!("no `{good}` token"))?;
                let b = tok.token_id(bad).with_context(|| format!("no `{bad}` token"))?;
                // P(good) = softmax over [good, bad] → class 0 of that pair; reorder as [bad, good].
                let gi = Tensor::new(&[b, g], out.device())?;
                at.index_select(&gi, 1)?
            }
            _ => at,
        };
        Ok(crate::model::good_prob(&pair)?.to_vec1::<f32>()?)
    }
}

fn positions_of(ids: Vec<u32>, id: u32) -> Encoded {
    let positions = ids
        .iter()
        .enumerate()
        .filter(|(_, &t)| t == id)
        .map(|(i, _)| i)
        .collect();
    Encoded {
        ids,
        positions,
        steps_from: 0,
    }
}

/// One encoded solution ready for scoring.
pub struct Encoded {
    /// Token ids.
    pub ids: Vec<u32>,
    /// Where the step rewards are read.
    pub positions: Vec<usize>,
    /// The first step's first token (0 where the layout does not say).
    pub steps_from: usize,
}

/// Scores steps with a PRM.
pub struct StepScorer<'a> {
    /// The model.
    pub model: &'a Model,
    /// Its tokenizer.
    pub tokenizer: &'a Tokenizer,
    /// Its layout.
    pub layout: PrmLayout,
    /// The reference model of a [`PrmLayout::LogRatio`] verifier (`None` for the others, and
    /// for a constant reference).
    pub reference: Option<&'a Model>,
}

impl StepScorer<'_> {
    /// Encode a problem and its steps.
    pub fn encode(&self, problem: &str, steps: &[&str]) -> Result<Encoded> {
        let e = self.layout.encode(self.tokenizer, problem, steps)?;
        if e.positions.len() != steps.len() {
            bail!(
                "{} steps but {} reward positions in the encoded input (a step contains the step token?)",
                steps.len(),
                e.positions.len()
            );
        }
        Ok(e)
    }

    /// Step rewards for a batch of encoded solutions, in ONE forward pass: right-padded to the
    /// longest, with a padding mask so that every solution scores as it would alone.
    pub fn score_batch(&self, batch: &[Encoded]) -> Result<Vec<Vec<f32>>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        if let PrmLayout::LogRatio { log_ratio, .. } = &self.layout {
            return self.score_log_ratio(batch, *log_ratio);
        }
        let dev = &self.model.device;
        let seqs: Vec<&[u32]> = batch.iter().map(|e| e.ids.as_slice()).collect();
        let (ids, mask, _) = pad_batch(&seqs, dev)?;
        // The decoder's last layer runs only where rewards are read, and so does the head.
        let rows: Vec<Vec<usize>> = batch.iter().map(|e| e.positions.clone()).collect();
        let hidden = self.model.hidden_rows(&ids, mask.as_ref(), &rows)?;
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

    /// Step rewards of a log-ratio verifier: both models read the batch once.
    fn score_log_ratio(&self, batch: &[Encoded], lr: LogRatio) -> Result<Vec<Vec<f32>>> {
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
                spans(e.steps_from.max(1), &e.positions, lr.cumulative)
                    .into_iter()
                    .map(move |(s, end)| (b, s, end))
            })
            .collect();
        if all.is_empty() {
            return Ok(batch.iter().map(|_| Vec::new()).collect());
        }
        let p: Vec<f32> = candle_nn::ops::sigmoid(&(span_sums(&ratio, t, &all)? * lr.beta as f64)?)?.to_vec1()?;
        let mut rest = p.as_slice();
        Ok(batch
            .iter()
            .map(|e| {
                let (mine, tail) = rest.split_at(e.positions.len());
                rest = tail;
                mine.to_vec()
            })
            .collect())
    }

    /// Step rewards of one solution.
    pub fn score(&self, problem: &str, steps: &[&str]) -> Result<Vec<f32>> {
        let e = self.encode(problem, steps)?;
        Ok(self.score_batch(std::slice::from_ref(&e))?.remove(0))
    }
}
