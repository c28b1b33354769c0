//! Training on the packed engine ([`PackedTrainer`]: a GPU, or the reference backend in tests)
//! with the CPU trainer's [`TrainConfig`] and objectives: a reward head's labels, next-token
//! prediction, and a log-ratio verifier's spans; warm-up and cosine schedule, clipping, weight
//! decay, accumulation, validation with early stopping, and checkpoints it resumes from. Batches
//! are bounded by a token budget as well as a count, so memory follows the budget.

use super::{optim, Example, Metrics, Objective, TrainConfig, TrainState};
use crate::packed::Packed;
use crate::packed_engine::train::{bce, good_logit};
use crate::packed_engine::{PackedDecoder, PackedTrainer, Snapshot, Targets, TrainBackend};
use anyhow::{bail, ensure, Context, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::ops::Range;

/// The examples as one packed batch and their targets (rows over all its tokens), as
/// [`Targets::Labels`] takes them: each example through its last target
/// ([`Example::read_len`]).
pub fn packed(batch: &[&Example]) -> (Packed, Vec<(usize, f32)>) {
    let seqs: Vec<&[u32]> = batch.iter().map(|e| &e.ids[..e.read_len(Objective::Classify)]).collect();
    let packed = Packed::new(&seqs);
    let targets = batch
        .iter()
        .enumerate()
        .flat_map(|(i, e)| e.targets.iter().map(move |&(p, y)| (i, p, y)))
        .map(|(i, p, y)| (packed.row(i, p), y))
        .collect();
    (packed, targets)
}

/// A log-ratio verifier's span: its tokens (indices into [`TokenBatch::pairs`]), the reference's
/// log-probability summed over them, and its label.
struct Span {
    tokens: Range<usize>,
    reference: f32,
    label: f32,
}

/// A loss of a batch's token log-probabilities ([`TokenBatch::loss`]).
pub struct TokenLoss {
    /// The loss.
    pub value: f32,
    /// Its derivative by each token's log-probability.
    pub derivative: Vec<f32>,
    /// (P(good), label) of each log-ratio span.
    pub scores: Vec<(f32, f32)>,
}

/// Examples as one packed batch for an LM objective: each learned token as a `(row, token)` pair
/// (the row before it predicts it), and a log-ratio verifier's spans over them.
pub struct TokenBatch {
    /// The packed sequences.
    pub packed: Packed,
    /// The tokens learned: each one's predicting row and id.
    pub pairs: Vec<(usize, u32)>,
    spans: Vec<Span>,
}

impl TokenBatch {
    /// `batch` for `objective` (next-token prediction or a log-ratio): the tokens from each
    /// example's `lm_from` (at least its second token) to its end.
    pub fn new(batch: &[&Example], objective: Objective) -> Result<Self> {
        let seqs: Vec<&[u32]> = batch.iter().map(|e| e.ids.as_slice()).collect();
        let packed = Packed::new(&seqs);
        let mut pairs = packed.next_tokens(|i| batch[i].lm_from);
        if batch.iter().any(|e| !e.lm_skip.is_empty()) {
            // Positions left out of the loss (observations): the log-ratio's spans count every
            // token from `lm_from`, so only next-token prediction takes them.
            if let Objective::LogRatio(_) = objective {
                bail!("examples with positions left out of the loss (lm_skip) train only by next-token prediction");
            }
            let learned: Vec<bool> = batch
                .iter()
                .flat_map(|e| (e.lm_from.max(1)..e.ids.len()).map(|i| e.learns(i)))
                .collect();
            pairs = pairs.into_iter().zip(learned).filter_map(|(x, keep)| keep.then_some(x)).collect();
        }
        let (mut spans, mut base) = (Vec::new(), 0);
        for e in batch {
            let first = e.lm_from.max(1);
            if let Objective::LogRatio(lr) = objective {
                if lr.reference_logprob.is_none() && e.ref_logprobs.len() != e.ids.len() {
                    bail!("the log-ratio objective needs the reference log-probabilities of every example");
                }
                let ends: Vec<usize> = e.targets.iter().map(|&(p, _)| p).collect();
                for ((start, end), &(_, label)) in lr.step_spans(first, &ends).into_iter().zip(&e.targets) {
                    if start > end || end >= e.ids.len() {
                        bail!(
                            "a target at position {end} has no tokens of its own in a sequence of {}",
                            e.ids.len()
                        );
                    }
                    spans.push(Span {
                        tokens: base + start - first..base + end + 1 - first,
                        reference: lr.reference_sum(&e.ref_logprobs, start, end)?,
                        label,
                    });
                }
            }
            // This example's learned tokens in `pairs`.
            base += e.ids.len().saturating_sub(first);
        }
        Ok(TokenBatch { packed, pairs, spans })
    }

    /// The loss of the tokens' log-probabilities `logp` under `objective`, its derivative by
    /// each, and the (P(good), label) pair of each log-ratio span: the mean negative
    /// log-likelihood, or the mean BCE with logits on each span's `β · Σ (log π − log π_ref)`
    /// (what the CPU trainer's `Lm` and `LogRatio` objectives compute).
    pub fn loss(&self, objective: Objective, logp: &[f32]) -> Result<TokenLoss> {
        ensure!(logp.len() == self.pairs.len(), "one log-probability a learned token");
        match objective {
            Objective::Lm => {
                ensure!(!logp.is_empty(), "a batch without LM targets");
                let n = logp.len() as f32;
                Ok(TokenLoss {
                    value: -logp.iter().sum::<f32>() / n,
                    derivative: vec![-1.0 / n; logp.len()],
                    scores: Vec::new(),
                })
            }
            Objective::LogRatio(lr) => {
                ensure!(!self.spans.is_empty(), "a batch without targets");
                let n = self.spans.len() as f32;
                let (mut loss, mut coef, mut pairs) = (0.0, vec![0f32; logp.len()], Vec::new());
                for s in &self.spans {
                    let z = lr.beta * (logp[s.tokens.clone()].iter().sum::<f32>() - s.reference);
                    let p = 1.0 / (1.0 + (-z).exp());
                    loss += bce(z, s.label);
                    coef[s.tokens.clone()].iter_mut().for_each(|c| *c += lr.beta * (p - s.label) / n);
                    pairs.push((p, s.label));
                }
                Ok(TokenLoss {
                    value: loss / n,
                    derivative: coef,
                    scores: pairs,
                })
            }
            Objective::Classify => bail!("a classifier learns from labels, not tokens"),
        }
    }
}

/// The gradients of `batch` under `objective` added to `trainer`'s; returns the loss.
fn backward<B: TrainBackend>(trainer: &mut PackedTrainer<B>, batch: &[&Example], objective: Objective) -> Result<f32> {
    if objective == Objective::Classify {
        let (packed, labels) = packed(batch);
        return trainer.backward(&packed, Targets::Labels(&labels));
    }
    let tokens = TokenBatch::new(batch, objective)?;
    let mut loss = |logp: &[f32]| tokens.loss(objective, logp).map(|l| (l.value, l.derivative));
    trainer.backward(
        &tokens.packed,
        Targets::Tokens {
            pairs: &tokens.pairs,
            loss: &mut loss,
        },
    )
}

/// Each sequence's token log-probabilities under `decoder` (position 0 holds 0, as
/// [`crate::log_ratio::sequence_logprobs`]), in packed batches of at most `max_tokens` tokens.
pub fn sequence_logprobs<B: TrainBackend>(
    decoder: &PackedDecoder<B>,
    seqs: &[&[u32]],
    max_tokens: usize,
) -> Result<Vec<Vec<f32>>> {
    let mut out = Vec::with_capacity(seqs.len());
    let order: Vec<usize> = (0..seqs.len()).collect();
    let lens: Vec<usize> = seqs.iter().map(|s| s.len()).collect();
    for part in batches(&lens, &order, usize::MAX, max_tokens) {
        let batch: Vec<&[u32]> = part.iter().map(|&i| seqs[i]).collect();
        let packed = Packed::new(&batch);
        let pairs = packed.next_tokens(|_| 1);
        let logp = decoder.token_logprobs(&packed, &pairs)?;
        let mut at = 0;
        for s in batch {
            let mut v = vec![0f32; s.len()];
            let n = s.len().saturating_sub(1);
            v[1.min(s.len())..].copy_from_slice(&logp[at..at + n]);
            at += n;
            out.push(v);
        }
    }
    Ok(out)
}

/// Consecutive runs of `order`'s indices into `lens` (sequence lengths), each at most `count`
/// of them and `max_tokens` tokens (a sequence longer than the budget alone).
pub fn batches(lens: &[usize], order: &[usize], count: usize, max_tokens: usize) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut tokens = 0;
    for &i in order {
        match out.last_mut() {
            Some(b) if b.len() < count.max(1) && tokens + lens[i] <= max_tokens => {
                tokens += lens[i];
                b.push(i);
            }
            _ => {
                tokens = lens[i];
                out.push(vec![i]);
            }
        }
    }
    out
}

/// The examples' lengths as a step under `objective` reads them.
fn lengths(examples: &[Example], objective: Objective) -> Vec<usize> {
    examples.iter().map(|e| e.read_len(objective)).collect()
}

/// Loss, accuracy and AUROC of `trainer`'s model on `data` under `objective` (forward passes
/// only; next-token prediction has a loss only).
pub fn evaluate_packed<B: TrainBackend>(
    trainer: &PackedTrainer<B>,
    data: &[Example],
    objective: Objective,
    max_tokens: usize,
) -> Result<Metrics> {
    let order: Vec<usize> = (0..data.len()).collect();
    let (mut loss, mut count, mut pairs) = (0.0, 0usize, Vec::new());
    for part in batches(&lengths(data, objective), &order, usize::MAX, max_tokens) {
        let batch: Vec<&Example> = part.iter().map(|&i| &data[i]).collect();
        if objective != Objective::Classify {
            let tokens = TokenBatch::new(&batch, objective)?;
            let n = match objective {
                Objective::Lm => tokens.pairs.len(),
                _ => tokens.spans.len(),
            };
            if n == 0 {
                continue;
            }
            let logp = trainer.decoder.token_logprobs(&tokens.packed, &tokens.pairs)?;
            let l = tokens.loss(objective, &logp)?;
            loss += l.value as f64 * n as f64;
            count += n;
            pairs.extend(l.scores);
            continue;
        }
        let (packed, targets) = packed(&batch);
        if targets.is_empty() {
            continue;
        }
        let rows: Vec<usize> = targets.iter().map(|&(r, _)| r).collect();
        let (values, width) = trainer.decoder.head_at(&packed, &rows, None)?;
        for (v, &(_, y)) in values.chunks(width).zip(&targets) {
            let z = good_logit(v);
            loss += bce(z, y) as f64;
            count += 1;
            pairs.push((1.0 / (1.0 + (-z).exp()), y));
        }
    }
    Ok(super::metrics(loss / count.max(1) as f64, &pairs))
}

/// Trains `trainer`'s model on `train_set` under `objective` as [`super::train`] trains on the
/// CPU, batches of at most `cfg.batch_size` examples and `max_tokens` tokens. With
/// `cfg.out_dir`, a checkpoint (HF folder with the exact f32 weights beside it, AdamW's state in
/// the CPU trainer's layout, and the run's state) is written at every validation and at the end,
/// and a run started again on it continues from its step. With `cfg.keep_best` the run ends
/// with the best validation's weights, in the trainer and in the folder (the last step's kept
/// beside them for a resume), as the CPU trainer does. `on_step(step, loss)` reports progress.
pub fn train_packed<B: TrainBackend>(
    trainer: &mut PackedTrainer<B>,
    train_set: &[Example],
    valid_set: &[Example],
    objective: Objective,
    cfg: &TrainConfig,
    max_tokens: usize,
    mut on_step: impl FnMut(usize, f64),
) -> Result<TrainState> {
    let learns = |e: &Example| match objective {
        Objective::Lm => e.ids.len() > e.lm_from.max(1),
        _ => !e.targets.is_empty(),
    };
    if !train_set.iter().any(learns) {
        bail!("no training examples with labelled steps (or, for next-token prediction, tokens to predict)");
    }
    let mut run = Checkpoints {
        cfg,
        valid_set,
        objective,
        max_tokens,
        best: None,
    };
    let mut state = run.resume(trainer)?;
    let usable: Vec<usize> = (0..train_set.len()).filter(|&i| learns(&train_set[i])).collect();
    let lens = lengths(train_set, objective);
    let mut epoch = 0u64;
    let mut queue: Vec<Vec<usize>> = Vec::new();
    let mut next = || -> Vec<&Example> {
        if queue.is_empty() {
            // A new shuffle each epoch, seeded by the run's seed and the epoch.
            let mut order = usable.clone();
            order.shuffle(&mut ChaCha8Rng::seed_from_u64(cfg.seed ^ epoch.wrapping_mul(0x9e37_79b9)));
            epoch += 1;
            queue = batches(&lens, &order, cfg.batch_size, max_tokens);
            queue.reverse();
        }
        let part = queue.pop().expect("refilled above");
        part.into_iter().map(|i| &train_set[i]).collect()
    };
    // A resumed run skips the batches its steps took, so it sees the batches the run would have.
    for _ in 0..state.step * cfg.grad_accum.max(1) {
        next();
    }
    // A run that stopped early stays stopped when started again.
    while state.step < cfg.steps && !state.stopped_early {
        let started = std::time::Instant::now();
        let lr = optim::schedule(state.step, cfg.lr, cfg.warmup, cfg.steps) as f32;
        let (mut loss, micro) = (0.0, cfg.grad_accum.max(1));
        for _ in 0..micro {
            let batch = next();
            state.tokens += batch.iter().map(|e| e.read_len(objective)).sum::<usize>();
            loss += backward(trainer, &batch, objective)? as f64 / micro as f64;
        }
        let clip = (cfg.clip > 0.0).then_some(cfg.clip as f32);
        trainer.update(lr, cfg.weight_decay as f32, clip, micro)?;
        state.seconds += started.elapsed().as_secs_f64();
        state.step += 1;
        state.last_loss = loss;
        on_step(state.step, loss);
        if cfg.eval_every > 0 && state.step % cfg.eval_every == 0 && state.step < cfg.steps {
            let stop = run.validate(trainer, &mut state)?;
            run.save(trainer, &state)?;
            if stop {
                state.stopped_early = true;
                break;
            }
        }
    }
    // The last step is validated once (not again when a finished run is started again).
    let validated = state.history.last().is_some_and(|(step, _)| *step == state.step);
    if !state.stopped_early && !validated {
        run.validate(trainer, &mut state)?;
    }
    run.save(trainer, &state)?;
    run.finish(trainer, &state)?;
    Ok(state)
}

/// A packed run's validations and files ([`train_packed`]).
struct Checkpoints<'a, B: TrainBackend> {
    cfg: &'a TrainConfig,
    valid_set: &'a [Example],
    objective: Objective,
    max_tokens: usize,
    /// The best validation's weights, kept on the device when the run has no folder.
    best: Option<Snapshot<B>>,
}

impl<B: TrainBackend> Checkpoints<'_, B> {
    /// The state of the run in `cfg.out_dir` (AdamW's state and the last step's weights, when
    /// the folder holds the best validation's, loaded), or a fresh one.
    fn resume(&self, trainer: &mut PackedTrainer<B>) -> Result<TrainState> {
        let Some(dir) = &self.cfg.out_dir else {
            return Ok(TrainState::default());
        };
        let saved = dir.join(super::STATE);
        if !saved.exists() {
            return Ok(TrainState::default());
        }
        let state = serde_json::from_str(&std::fs::read_to_string(&saved)?)
            .with_context(|| format!("reading {}", saved.display()))?;
        if dir.join(super::OPTIM).exists() {
            trainer.load_optimizer(&dir.join(super::OPTIM))?;
        }
        if trainer.lora().is_some() {
            // LoRA's trainer was loaded from its frozen base: the run's adapters and head are
            // the checkpoint's.
            trainer.load_weights(dir)?;
        }
        let last = dir.join(crate::checkpoint::LAST_WEIGHTS);
        if last.exists() {
            trainer.load_weights_file(&last)?;
        }
        Ok(state)
    }

    /// A validation (when there is a validation set): the best loss and its weights kept, and
    /// whether the run stops early.
    fn validate(&mut self, trainer: &PackedTrainer<B>, state: &mut TrainState) -> Result<bool> {
        if self.valid_set.is_empty() {
            return Ok(false);
        }
        let m = evaluate_packed(trainer, self.valid_set, self.objective, self.max_tokens)?;
        if state.best_valid_loss.is_none_or(|b| m.loss < b) {
            state.best_valid_loss = Some(m.loss);
            state.best_step = Some(state.step);
            state.since_best = 0;
            if self.cfg.keep_best {
                match &self.cfg.out_dir {
                    Some(dir) => trainer.save_weights(&dir.join(super::BEST))?,
                    None => self.best = Some(trainer.snapshot()?),
                }
            }
        } else {
            state.since_best += 1;
        }
        state.history.push((state.step, m));
        Ok(self.cfg.patience > 0 && state.since_best >= self.cfg.patience)
    }

    /// The checkpoint, AdamW's state and the run's state written to the run's folder (whose
    /// checkpoint is then the last step's).
    fn save(&self, trainer: &PackedTrainer<B>, state: &TrainState) -> Result<()> {
        if let Some(dir) = &self.cfg.out_dir {
            trainer.save_checkpoint(dir)?;
            let _ = std::fs::remove_file(dir.join(crate::checkpoint::LAST_WEIGHTS));
            trainer.save_optimizer(&dir.join(super::OPTIM))?;
            std::fs::write(dir.join(super::STATE), serde_json::to_string_pretty(state)?)?;
        }
        Ok(())
    }

    /// With `keep_best`, the best validation's weights back in the trainer and, in the run's
    /// folder, its checkpoint (the last step's weights written beside it first).
    fn finish(self, trainer: &mut PackedTrainer<B>, state: &TrainState) -> Result<()> {
        if !self.cfg.keep_best || state.best_step.is_none_or(|b| b == state.step) {
            return Ok(());
        }
        match (&self.cfg.out_dir, self.best) {
            (Some(dir), _) => {
                trainer.save_weights(&dir.join(crate::checkpoint::LAST_WEIGHTS))?;
                trainer.load_weights_file(&dir.join(super::BEST))?;
                trainer.save_checkpoint(dir)
            }
            (None, Some(best)) => trainer.restore(&best),
            (None, None) => Ok(()),
        }
    }
}

/// [`train_packed`] at `placement` ([`crate::packed_engine::with_trainer`] opens the device:
/// CUDA GPU `n`, or the CPU backend), the model read from the checkpoint folder `dir` (with
/// `lora`, frozen under LoRA's adapters).
#[allow(clippy::too_many_arguments)]
pub fn train_on_device(
    dir: &std::path::Path,
    (placement, lora): (crate::Placement, Option<crate::packed_engine::LoraConfig>),
    train_set: &[Example],
    valid_set: &[Example],
    objective: Objective,
    cfg: &TrainConfig,
    max_tokens: usize,
    on_step: impl FnMut(usize, f64),
) -> Result<TrainState> {
    let run = Run { train_set, valid_set, objective, cfg, max_tokens, on_step };
    crate::packed_engine::with_trainer(dir, placement, lora, run)
}

/// A packed training run waiting for its trainer ([`train_on_device`]).
struct Run<'a, F> {
    train_set: &'a [Example],
    valid_set: &'a [Example],
    objective: Objective,
    cfg: &'a TrainConfig,
    max_tokens: usize,
    on_step: F,
}

impl<F: FnMut(usize, f64)> crate::packed_engine::WithTrainer for Run<'_, F> {
    type Output = TrainState;

    fn run<B: TrainBackend + 'static>(self, mut trainer: PackedTrainer<B>) -> Result<TrainState> {
        let Run { train_set, valid_set, objective, cfg, max_tokens, on_step } = self;
        train_packed(&mut trainer, train_set, valid_set, objective, cfg, max_tokens, on_step)
    }
}
