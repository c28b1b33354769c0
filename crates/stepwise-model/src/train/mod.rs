//! Training: a next-token LM (policies), PRMs on hard or soft step labels, ORMs on outcome labels.
//! One loop for all of them, readable in one sitting: batches → loss → backward → clip → AdamW
//! with warm-up + cosine → periodic validation → early stop → checkpoints that resume exactly.

use crate::log_ratio::{span_sums, token_logprobs, LogRatio};
use crate::model::{pad_batch, Model};
use optim::{accumulate, schedule, AdamW};

pub mod examples;
pub mod optim;
pub mod packed;
pub mod run;
pub mod verifier;
use anyhow::{bail, Context, Result};
use candle_core::Tensor;
pub use candle_nn::VarMap;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// One training sequence.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Example {
    /// Token ids.
    pub ids: Vec<u32>,
    /// Classification targets: (position, probability that the step is good).
    #[serde(default)]
    pub targets: Vec<(usize, f32)>,
    /// Where the part being learned begins: the LM loss covers predictions of tokens at
    /// positions ≥ this; for labelled solutions, the first step's first token.
    #[serde(default)]
    pub lm_from: usize,
    /// Spans `[start, end)` of positions after `lm_from` whose tokens are context, not learned:
    /// a trajectory's observations, which the world writes and the policy only reads.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lm_skip: Vec<(usize, usize)>,
    /// For the log-ratio objective: the reference model's log-probability of each token given
    /// the ones before (see [`examples::attach_reference`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ref_logprobs: Vec<f32>,
}

impl Example {
    /// Whether the next-token loss covers the token at position `i` (at or past `lm_from`).
    pub fn learns(&self, i: usize) -> bool {
        !self.lm_skip.iter().any(|&(a, b)| (a..b).contains(&i))
    }

    /// The tokens a training step under `objective` reads: a classifier's through its last
    /// target (a causal model's later positions change nothing it reads: the steps after the
    /// first bad one that `--stop-at-first-bad` leaves unlabelled, say), every one otherwise.
    pub fn read_len(&self, objective: Objective) -> usize {
        let last = self.targets.iter().map(|&(p, _)| p + 1).max();
        match (objective, last) {
            (Objective::Classify, Some(end)) => end.min(self.ids.len()),
            _ => self.ids.len(),
        }
    }
}

/// What to learn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Objective {
    /// Next-token prediction.
    Lm,
    /// Binary classification at target positions (PRM on hard or soft step labels, or ORM with
    /// one target at the final position): numerically stable masked BCE-with-logits on
    /// `logit(good) - logit(bad)` (which is cross-entropy for hard labels), or on the value of a
    /// scalar head.
    Classify,
    /// Binary classification of spans by a causal LM's log-likelihood ratio against a reference
    /// ([`crate::log_ratio`]): the span of target `k` ends at its position and starts after
    /// the previous target (or at `lm_from`); the examples carry `ref_logprobs` unless the
    /// reference is a constant.
    LogRatio(LogRatio),
}

/// Hyper-parameters of a run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Peak learning rate.
    pub lr: f64,
    /// Warm-up steps.
    pub warmup: usize,
    /// Optimiser steps in total.
    pub steps: usize,
    /// Sequences per micro-batch.
    pub batch_size: usize,
    /// Micro-batches per optimiser step.
    pub grad_accum: usize,
    /// Clip the global gradient norm to this (0 = off).
    pub clip: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Validate every this many steps (0 = only at the end).
    pub eval_every: usize,
    /// Stop after this many validations without improvement (0 = never).
    pub patience: usize,
    /// Shuffling seed.
    pub seed: u64,
    /// Where to write checkpoints (and resume from); `None` keeps everything in memory.
    pub out_dir: Option<PathBuf>,
    /// End with the weights of the best validation (lowest loss) instead of the last step's, as
    /// transformers' `load_best_model_at_end` does: in `out_dir` the checkpoint becomes the best
    /// one, and the last step's weights are kept beside it for a resume.
    pub keep_best: bool,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            lr: 1e-3,
            warmup: 20,
            steps: 300,
            batch_size: 16,
            grad_accum: 1,
            clip: 1.0,
            weight_decay: 0.01,
            eval_every: 50,
            patience: 0,
            seed: 0,
            out_dir: None,
            keep_best: false,
        }
    }
}

/// Validation metrics.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Metrics {
    /// Mean loss.
    pub loss: f64,
    /// Classification accuracy at threshold 0.5 (targets ≥ 0.5 count as good).
    pub accuracy: f64,
    /// Area under the ROC curve of P(good) against hard targets.
    pub auroc: f64,
}

/// What happened in a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TrainState {
    /// Optimiser steps done.
    pub step: usize,
    /// Loss of the last step.
    pub last_loss: f64,
    /// Best validation loss so far.
    pub best_valid_loss: Option<f64>,
    /// Validations since the best one.
    pub since_best: usize,
    /// Validation history: (step, metrics).
    pub history: Vec<(usize, Metrics)>,
    /// Whether the run stopped early.
    pub stopped_early: bool,
    /// The step of the best validation.
    #[serde(default)]
    pub best_step: Option<usize>,
    /// Tokens of the training sequences run so far (each as often as it was batched).
    #[serde(default)]
    pub tokens: usize,
    /// Seconds spent in training steps (forward, backward, update; not validation or
    /// checkpoints).
    #[serde(default)]
    pub seconds: f64,
}

/// Stable BCE with logits: `max(z, 0) - z·y + log(1 + exp(-|z|))`, averaged.
pub fn bce_with_logits(z: &Tensor, y: &Tensor) -> Result<Tensor> {
    let loss = ((z.relu()? - (z * y)?)? + (z.abs()?.neg()?.exp()? + 1.0)?.log()?)?;
    Ok(loss.mean_all()?)
}

/// Loss of one micro-batch, plus (P(good), target) pairs for metrics.
pub fn batch_loss(model: &Model, batch: &[&Example], objective: Objective) -> Result<(Tensor, Vec<(f32, f32)>)> {
    let dev = model.device.clone();
    let seqs: Vec<&[u32]> = batch.iter().map(|e| e.ids.as_slice()).collect();
    let (ids, mask, t) = pad_batch(&seqs, &dev)?;
    if let Objective::LogRatio(lr) = objective {
        return log_ratio_loss(model, batch, &ids, mask.as_ref(), t, lr);
    }
    let hidden = model.hidden(crate::Input::padded(&ids, mask.as_ref()))?;
    let h = hidden.dim(2)?;
    let flat = hidden.reshape((batch.len() * t, h))?;
    match objective {
        Objective::Classify => {
            let (mut rows, mut ys) = (Vec::new(), Vec::new());
            for (b, e) in batch.iter().enumerate() {
                for &(p, y) in &e.targets {
                    rows.push((b * t + p) as u32);
                    ys.push(y);
                }
            }
            if rows.is_empty() {
                bail!("a batch without targets");
            }
            let idx = Tensor::new(rows.as_slice(), &dev)?;
            let logits = model.head_logits(&flat.index_select(&idx, 0)?)?;
            let z = crate::model::good_logit(&logits)?;
            let y = Tensor::new(ys.as_slice(), &dev)?;
            let loss = bce_with_logits(&z, &y)?;
            let p: Vec<f32> = candle_nn::ops::sigmoid(&z.detach())?.to_vec1()?;
            Ok((loss, p.into_iter().zip(ys).collect()))
        }
        Objective::Lm => {
            // Predict token i+1 from position i, for i+1 ≥ lm_from.
            let (mut rows, mut tgt) = (Vec::new(), Vec::new());
            for (b, e) in batch.iter().enumerate() {
                for i in (e.lm_from.max(1)..e.ids.len()).filter(|&i| e.learns(i)) {
                    rows.push((b * t + i - 1) as u32);
                    tgt.push(e.ids[i]);
                }
            }
            if rows.is_empty() {
                bail!("a batch without LM targets");
            }
            let idx = Tensor::new(rows.as_slice(), &dev)?;
            let logits = model.head_logits(&flat.index_select(&idx, 0)?)?;
            let loss = crate::kernels::token_logprobs(&logits, &tgt)?.neg()?.mean_all()?;
            Ok((loss, Vec::new()))
        }
        Objective::LogRatio(_) => unreachable!("handled above"),
    }
}

/// The log-ratio objective's loss: BCE on `β · Σ_span (log π_θ − log π_ref)`.
fn log_ratio_loss(
    model: &Model,
    batch: &[&Example],
    ids: &Tensor,
    mask: Option<&Tensor>,
    t: usize,
    lr: LogRatio,
) -> Result<(Tensor, Vec<(f32, f32)>)> {
    let dev = &model.device;
    let (mut all_spans, mut ys, mut ref_sums) = (Vec::new(), Vec::new(), Vec::new());
    for (b, e) in batch.iter().enumerate() {
        if lr.reference_logprob.is_none() && e.ref_logprobs.len() != e.ids.len() {
            bail!("the log-ratio objective needs the reference log-probabilities of every example");
        }
        let ends: Vec<usize> = e.targets.iter().map(|&(p, _)| p).collect();
        for ((start, end), &(_, y)) in lr.step_spans(e.lm_from.max(1), &ends).into_iter().zip(&e.targets) {
            if start > end || end >= e.ids.len() {
                bail!(
                    "a target at position {end} has no tokens of its own in a sequence of {}",
                    e.ids.len()
                );
            }
            all_spans.push((b, start, end));
            ys.push(y);
            ref_sums.push(lr.reference_sum(&e.ref_logprobs, start, end)?);
        }
    }
    if ys.is_empty() {
        bail!("a batch without targets");
    }
    let own = span_sums(&token_logprobs(model, ids, mask)?, t, &all_spans)?;
    let z = ((own - Tensor::new(ref_sums.as_slice(), dev)?)? * lr.beta as f64)?;
    let y = Tensor::new(ys.as_slice(), dev)?;
    let loss = bce_with_logits(&z, &y)?;
    let p: Vec<f32> = candle_nn::ops::sigmoid(&z.detach())?.to_vec1()?;
    Ok((loss, p.into_iter().zip(ys).collect()))
}

/// Loss, accuracy and AUROC on held-out examples (inference path, no gradients).
pub fn evaluate(model: &Model, data: &[Example], objective: Objective, batch_size: usize) -> Result<Metrics> {
    let mut m = model.clone();
    m.set_training(false);
    let (mut loss, mut n) = (0.0, 0usize);
    let mut pairs = Vec::new();
    for chunk in data.chunks(batch_size.max(1)) {
        let refs: Vec<&Example> = chunk.iter().collect();
        let (l, p) = batch_loss(&m, &refs, objective)?;
        loss += l.to_scalar::<f32>()? as f64 * chunk.len() as f64;
        n += chunk.len();
        pairs.extend(p);
    }
    Ok(metrics(loss / n.max(1) as f64, &pairs))
}

/// The metrics of a validation: its mean `loss`, and the accuracy at 0.5 and AUROC of the
/// `(P(good), target)` pairs against hard targets (≥ 0.5 good).
fn metrics(loss: f64, pairs: &[(f32, f32)]) -> Metrics {
    let hard: Vec<(f32, bool)> = pairs.iter().map(|&(p, y)| (p, y >= 0.5)).collect();
    let acc = hard.iter().filter(|(p, y)| (*p >= 0.5) == *y).count() as f64 / hard.len().max(1) as f64;
    Metrics {
        loss,
        accuracy: acc,
        auroc: stepwise_core::stats::auroc(&hard),
    }
}

/// Files a run keeps in `out_dir`.
const STATE: &str = "trainer_state.json";
const OPTIM: &str = "optimizer.safetensors";
/// The best validation's exact weights ([`TrainConfig::keep_best`]).
const BEST: &str = "best.safetensors";

/// Train `model` (whose weights live in `varmap`). `on_step(step, loss)` reports progress.
/// With `out_dir`, a checkpoint (HF folder + optimiser + state) is written at every validation
/// and at the end, and a run restarted on the same folder resumes from it.
pub fn train(
    model: &mut Model,
    varmap: &VarMap,
    train_set: &[Example],
    valid_set: &[Example],
    objective: Objective,
    cfg: &TrainConfig,
    mut on_step: impl FnMut(usize, f64),
) -> Result<TrainState> {
    if train_set.is_empty() {
        bail!("no training examples");
    }
    let named = optim::named_vars(varmap);
    let vars: Vec<candle_core::Var> = named.iter().map(|(_, v)| v.clone()).collect();
    let mut opt = AdamW::new(named, cfg.lr, cfg.weight_decay)?;
    let mut state = resume(cfg, varmap, &mut opt)?;
    model.set_training(true);
    let mut best_in_memory: Option<Vec<(candle_core::Var, Tensor)>> = None;
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let mut order: Vec<usize> = (0..train_set.len()).collect();
    // Replay the shuffles of the steps already done, so a resumed run sees the same batches.
    let mut cursor = 0usize;
    order.shuffle(&mut rng);
    let mut next_batch = |rng: &mut ChaCha8Rng| -> Vec<usize> {
        let mut b = Vec::with_capacity(cfg.batch_size);
        for _ in 0..cfg.batch_size {
            if cursor == order.len() {
                order.shuffle(rng);
                cursor = 0;
            }
            b.push(order[cursor]);
            cursor += 1;
        }
        b
    };
    for _ in 0..state.step * cfg.grad_accum {
        next_batch(&mut rng);
    }
    // A run that stopped early stays stopped when started again.
    while state.step < cfg.steps && !state.stopped_early {
        let started = std::time::Instant::now();
        opt.lr = schedule(state.step, cfg.lr, cfg.warmup, cfg.steps);
        let mut grads = None;
        let mut loss_sum = 0.0;
        for _ in 0..cfg.grad_accum {
            let batch: Vec<&Example> = next_batch(&mut rng).into_iter().map(|i| &train_set[i]).collect();
            state.tokens += batch.iter().map(|e| e.ids.len()).sum::<usize>();
            let (loss, _) = batch_loss(model, &batch, objective)?;
            loss_sum += loss.to_scalar::<f32>()? as f64;
            let g = loss.backward()?;
            match grads.as_mut() {
                None => grads = Some(g),
                Some(acc) => accumulate(acc, g, &vars)?,
            }
        }
        let grads = grads.expect("grad_accum >= 1");
        let mut scale = 1.0 / cfg.grad_accum as f64;
        if cfg.clip > 0.0 {
            let norm = opt.grad_norm(&grads)? * scale;
            if norm > cfg.clip {
                scale *= cfg.clip / norm;
            }
        }
        opt.step(&grads, scale)?;
        state.seconds += started.elapsed().as_secs_f64();
        state.step += 1;
        state.last_loss = loss_sum / cfg.grad_accum as f64;
        on_step(state.step, state.last_loss);
        let validate = state.step == cfg.steps || (cfg.eval_every > 0 && state.step % cfg.eval_every == 0);
        if validate {
            let run = Run { model: &mut *model, varmap, cfg };
            run.validate(valid_set, objective, &mut state, &mut best_in_memory, &opt)?;
        }
        if state.stopped_early {
            break;
        }
    }
    model.set_training(false);
    if cfg.keep_best && state.best_step.is_some_and(|b| b != state.step) {
        restore_best(model, varmap, cfg, best_in_memory)?;
    }
    Ok(state)
}

/// The state of a run to resume from `cfg.out_dir`'s last checkpoint (weights and optimiser
/// loaded), or a fresh one.
fn resume(cfg: &TrainConfig, varmap: &VarMap, opt: &mut AdamW) -> Result<TrainState> {
    let mut state = TrainState::default();
    if let Some(dir) = &cfg.out_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        if dir.join(STATE).exists() && dir.join(OPTIM).exists() {
            state = serde_json::from_str(&std::fs::read_to_string(dir.join(STATE))?)?;
            crate::checkpoint::load_training_checkpoint(varmap, dir)?;
            opt.load(&dir.join(OPTIM))?;
        }
    }
    Ok(state)
}

/// What a validation needs of the run.
struct Run<'a> {
    model: &'a mut Model,
    varmap: &'a VarMap,
    cfg: &'a TrainConfig,
}

impl Run<'_> {
    /// At a validation step: the validation loss, the best weights kept, early stopping decided,
    /// and the checkpoint written (with the optimiser and the state) where the run has a folder.
    fn validate(
        self,
        valid_set: &[Example],
        objective: Objective,
        state: &mut TrainState,
        best_in_memory: &mut Option<Vec<(candle_core::Var, Tensor)>>,
        opt: &AdamW,
    ) -> Result<()> {
    if !valid_set.is_empty() {
        let m = evaluate(self.model, valid_set, objective, self.cfg.batch_size * 2)?;
        self.model.set_training(true);
        let better = state.best_valid_loss.is_none_or(|b| m.loss < b);
        if better {
            state.best_valid_loss = Some(m.loss);
            state.best_step = Some(state.step);
            state.since_best = 0;
            if self.cfg.keep_best {
                match &self.cfg.out_dir {
                    Some(dir) => crate::checkpoint::save_exact_weights(&self.model.config, self.varmap, &dir.join(BEST))?,
                    None => *best_in_memory = Some(snapshot(self.varmap)?),
                }
            }
        } else {
            state.since_best += 1;
        }
        state.history.push((state.step, m));
        if self.cfg.patience > 0 && state.since_best >= self.cfg.patience {
            state.stopped_early = true;
        }
    }
    if let Some(dir) = &self.cfg.out_dir {
        crate::checkpoint::save_training_checkpoint(dir, &self.model.config, self.varmap)?;
        // The folder's checkpoint is the last step's again.
        let _ = std::fs::remove_file(dir.join(crate::checkpoint::LAST_WEIGHTS));
        opt.save(&dir.join(OPTIM))?;
        std::fs::write(dir.join(STATE), serde_json::to_string_pretty(&state)?)?;
    }
        Ok(())
    }
}

/// The best validation's weights back in `varmap` (the last step's kept beside them in the run's
/// folder, for a resume).
fn restore_best(
    model: &Model,
    varmap: &VarMap,
    cfg: &TrainConfig,
    best_in_memory: Option<Vec<(candle_core::Var, Tensor)>>,
) -> Result<()> {
    match (&cfg.out_dir, best_in_memory) {
        (Some(dir), _) => {
            // The last step's weights stay beside the best for a resume.
            crate::checkpoint::save_exact_weights(&model.config, varmap, &dir.join(crate::checkpoint::LAST_WEIGHTS))?;
            crate::checkpoint::load_into(varmap, &dir.join(BEST))?;
            crate::checkpoint::save_checkpoint(dir, &model.config, varmap)?;
        }
        (None, Some(best)) => {
            for (var, value) in best {
                var.set(&value)?;
            }
        }
        (None, None) => {}
    }

    Ok(())
}

/// A copy of every variable's value.
fn snapshot(varmap: &VarMap) -> Result<Vec<(candle_core::Var, Tensor)>> {
    let data = varmap.data().lock().unwrap();
    data.values().map(|v| Ok((v.clone(), v.as_tensor().copy()?))).collect()
}
