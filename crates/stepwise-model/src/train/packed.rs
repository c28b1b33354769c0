//! Training a reward model on the packed engine ([`PackedTrainer`]: a GPU, or the reference
//! backend in tests) with the CPU trainer's [`TrainConfig`]: warm-up and cosine schedule, clipping,
//! weight decay, accumulation, validation with early stopping, and checkpoints it resumes from.
//! Batches are bounded by a token budget as well as a count, so memory follows the budget.

use super::{optim, Example, Metrics, TrainConfig, TrainState};
use crate::packed::Packed;
use crate::packed_engine::train::{bce, good_logit};
use crate::packed_engine::{PackedTrainer, TrainBackend};
use anyhow::{bail, Context, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// The examples as one packed batch and their targets (rows over all its tokens), as
/// [`PackedTrainer::backward`] takes them.
pub fn packed(batch: &[&Example]) -> (Packed, Vec<(usize, f32)>) {
    let seqs: Vec<&[u32]> = batch.iter().map(|e| e.ids.as_slice()).collect();
    let packed = Packed::new(&seqs);
    let targets = batch
        .iter()
        .enumerate()
        .flat_map(|(i, e)| e.targets.iter().map(move |&(p, y)| (i, p, y)))
        .map(|(i, p, y)| (packed.row(i, p), y))
        .collect();
    (packed, targets)
}

/// Consecutive runs of `order`'s examples, each at most `count` of them and `max_tokens` tokens
/// (an example longer than the budget alone).
fn batches<'e>(examples: &'e [Example], order: &[usize], count: usize, max_tokens: usize) -> Vec<Vec<&'e Example>> {
    let mut out: Vec<Vec<&Example>> = Vec::new();
    let mut tokens = 0;
    for &i in order {
        let e = &examples[i];
        match out.last_mut() {
            Some(b) if b.len() < count.max(1) && tokens + e.ids.len() <= max_tokens => {
                tokens += e.ids.len();
                b.push(e);
            }
            _ => {
                tokens = e.ids.len();
                out.push(vec![e]);
            }
        }
    }
    out
}

/// Loss, accuracy and AUROC of `trainer`'s model on `data` (forward passes only).
pub fn evaluate_packed<B: TrainBackend>(
    trainer: &PackedTrainer<B>,
    data: &[Example],
    max_tokens: usize,
) -> Result<Metrics> {
    let order: Vec<usize> = (0..data.len()).collect();
    let (mut loss, mut pairs) = (0.0, Vec::new());
    for batch in batches(data, &order, usize::MAX, max_tokens) {
        let (packed, targets) = packed(&batch);
        if targets.is_empty() {
            continue;
        }
        let rows: Vec<usize> = targets.iter().map(|&(r, _)| r).collect();
        let (values, width) = trainer.decoder.head_at(&packed, &rows, None)?;
        for (v, &(_, y)) in values.chunks(width).zip(&targets) {
            let z = good_logit(v);
            loss += bce(z, y) as f64;
            pairs.push((1.0 / (1.0 + (-z).exp()), y));
        }
    }
    Ok(super::metrics(loss / pairs.len().max(1) as f64, &pairs))
}

/// Trains `trainer`'s reward model on `train_set`'s targets (the `Classify` objective) as
/// [`super::train`] trains on the CPU, batches of at most `cfg.batch_size` examples and
/// `max_tokens` tokens. With `cfg.out_dir`, a checkpoint (HF folder with the exact f32 weights
/// beside it, and the run's state) is written at every validation and at the end, and a run
/// started again on it continues from its step (AdamW's moments start again).
/// `on_step(step, loss)` reports progress.
pub fn train_packed<B: TrainBackend>(
    trainer: &mut PackedTrainer<B>,
    train_set: &[Example],
    valid_set: &[Example],
    cfg: &TrainConfig,
    max_tokens: usize,
    mut on_step: impl FnMut(usize, f64),
) -> Result<TrainState> {
    if !train_set.iter().any(|e| !e.targets.is_empty()) {
        bail!("no training examples with labelled steps");
    }
    let mut state = TrainState::default();
    if let Some(dir) = &cfg.out_dir {
        let saved = dir.join(super::STATE);
        if saved.exists() {
            state = serde_json::from_str(&std::fs::read_to_string(&saved)?)
                .with_context(|| format!("reading {}", saved.display()))?;
        }
    }
    let usable: Vec<usize> = (0..train_set.len()).filter(|&i| !train_set[i].targets.is_empty()).collect();
    let mut epoch = 0u64;
    let mut queue: Vec<Vec<&Example>> = Vec::new();
    let mut next = || -> Vec<&Example> {
        if queue.is_empty() {
            // A new shuffle each epoch, seeded by the run's seed and the epoch.
            let mut order = usable.clone();
            order.shuffle(&mut ChaCha8Rng::seed_from_u64(cfg.seed ^ epoch.wrapping_mul(0x9e37_79b9)));
            epoch += 1;
            queue = batches(train_set, &order, cfg.batch_size, max_tokens);
            queue.reverse();
        }
        queue.pop().expect("refilled above")
    };
    let validate = |trainer: &PackedTrainer<B>, state: &mut TrainState| -> Result<bool> {
        if valid_set.is_empty() {
            return Ok(false);
        }
        let m = evaluate_packed(trainer, valid_set, max_tokens)?;
        let better = state.best_valid_loss.is_none_or(|b| m.loss < b);
        if better {
            state.best_valid_loss = Some(m.loss);
            state.best_step = Some(state.step);
            state.since_best = 0;
        } else {
            state.since_best += 1;
        }
        state.history.push((state.step, m));
        Ok(cfg.patience > 0 && state.since_best >= cfg.patience)
    };
    let save = |trainer: &PackedTrainer<B>, state: &TrainState| -> Result<()> {
        if let Some(dir) = &cfg.out_dir {
            let varmap = trainer.varmap()?;
            crate::model::save_training_checkpoint(dir, &trainer.decoder.config, &varmap)?;
            std::fs::write(dir.join(super::STATE), serde_json::to_string_pretty(state)?)?;
        }
        Ok(())
    };
    while state.step < cfg.steps {
        let started = std::time::Instant::now();
        let lr = optim::schedule(state.step, cfg.lr, cfg.warmup, cfg.steps) as f32;
        let (mut loss, micro) = (0.0, cfg.grad_accum.max(1));
        for _ in 0..micro {
            let batch = next();
            state.tokens += batch.iter().map(|e| e.ids.len()).sum::<usize>();
            let (packed, targets) = packed(&batch);
            loss += trainer.backward(&packed, &targets)? as f64 / micro as f64;
        }
        let clip = (cfg.clip > 0.0).then_some(cfg.clip as f32);
        trainer.update(lr, cfg.weight_decay as f32, clip, micro)?;
        state.seconds += started.elapsed().as_secs_f64();
        state.step += 1;
        state.last_loss = loss;
        on_step(state.step, loss);
        if cfg.eval_every > 0 && state.step % cfg.eval_every == 0 && state.step < cfg.steps {
            let stop = validate(trainer, &mut state)?;
            save(trainer, &state)?;
            if stop {
                state.stopped_early = true;
                break;
            }
        }
    }
    if !state.stopped_early {
        validate(trainer, &mut state)?;
    }
    save(trainer, &state)?;
    Ok(state)
}

/// [`train_packed`] on CUDA GPU `ordinal`, the reward model read from the checkpoint folder
/// `dir` (bf16 copies on the device, f32 masters). A build without the `cuda` feature refuses.
#[allow(clippy::too_many_arguments)]
pub fn train_on_gpu(
    dir: &std::path::Path,
    ordinal: usize,
    train_set: &[Example],
    valid_set: &[Example],
    cfg: &TrainConfig,
    max_tokens: usize,
    on_step: impl FnMut(usize, f64),
) -> Result<TrainState> {
    #[cfg(feature = "cuda")]
    {
        let gpu = crate::cuda::open(ordinal)?;
        let config = crate::ModelConfig::from_dir(dir)?;
        let mut trainer = PackedTrainer::load(dir, config, gpu)
            .with_context(|| format!("loading {} onto cuda:{ordinal} to train", dir.display()))?;
        train_packed(&mut trainer, train_set, valid_set, cfg, max_tokens, on_step)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (dir, train_set, valid_set, cfg, max_tokens, on_step);
        bail!("cuda:{ordinal}: this stepwise was built without CUDA")
    }
}
