//! `train-prm` as a library call ([`train_prm`]): a verifier (a PRM, an ORM, a log-ratio
//! verifier) trained from step-labelled solutions into a Hugging Face folder, on the CPU or a GPU.
//! The CLI's `stepwise train-prm` and Python's `stepwise.train_prm` both run it.

use super::examples::{LabelOptions, Neutral};
use super::packed::train_on_device;
use super::verifier::{Start, VerifierHead, VerifierSpec};
use super::{evaluate, train, Example, Metrics, TrainConfig, TrainState, VarMap};
use crate::log_ratio::LogRatio;
use crate::{HeadKind, Model, ModelConfig, Placement, Tokenizer};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use stepwise_core::Solution;

/// What to train, and how (the CLI's `train-prm` options; [`Default`] gives its defaults).
#[derive(Clone, Debug)]
pub struct TrainPrm {
    /// Start from this checkpoint folder (its head is replaced by `head`).
    pub base: Option<PathBuf>,
    /// Or train from scratch with a built-in shape: `tiny` (2×64), `small` (4×128), `base` (8×256).
    pub config: Option<String>,
    /// Tokenizer folder (required with `config`; defaults to `base`).
    pub tokenizer: Option<PathBuf>,
    /// Output folder (checkpoints, metrics; a run's folder resumes).
    pub out: PathBuf,
    /// Outcome reward model: one label per solution, from `correct`.
    pub outcome: bool,
    /// `classifier`, `value` or `log-ratio` (default: classifier for PRMs, value for outcomes).
    pub head: Option<String>,
    /// β of the log-ratio head.
    pub beta: f32,
    /// Log-ratio head: a constant reference log-probability instead of `base`.
    pub reference_logprob: Option<f32>,
    /// Log-ratio head: only each step's last N tokens.
    pub last_tokens: Option<usize>,
    /// Separator after each step.
    pub separator: String,
    /// Neutral ratings: `good`, `bad` or `skip`.
    pub neutral: String,
    /// Only the last labelled step carries a label.
    pub last_step_only: bool,
    /// Step targets stop at each solution's first bad step.
    pub stop_at_first_bad: bool,
    /// Optimiser steps.
    pub steps: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Sequences per batch.
    pub batch_size: usize,
    /// Micro-batches per step.
    pub grad_accum: usize,
    /// Fraction of solutions held out for validation (by whole problems).
    pub valid_fraction: f64,
    /// Solutions to validate on instead of a fraction of the training data (`--valid-data`):
    /// a fixed held-out set, the same for every run and every engine.
    pub valid_solutions: Option<Vec<Solution>>,
    /// Stop after this many validations without improvement (0 = never).
    pub patience: usize,
    /// Seed (initialisation, shuffling, the validation split).
    pub seed: u64,
    /// Longest training sequence in tokens.
    pub max_len: usize,
    /// Where it trains: the CPU, or a CUDA GPU.
    pub placement: Placement,
    /// Which trainer: candle's autograd (the CPU only) or the packed engine's (any device).
    pub trainer: Trainer,
    /// On a GPU, the most tokens in one batch.
    pub max_batch_tokens: usize,
    /// LoRA: the base frozen and low-rank adapters trained with the head (the packed trainer).
    pub lora: Option<crate::packed_engine::LoraConfig>,
}

impl Default for TrainPrm {
    fn default() -> Self {
        TrainPrm {
            base: None,
            config: None,
            tokenizer: None,
            out: PathBuf::new(),
            outcome: false,
            head: None,
            beta: 1.0,
            reference_logprob: None,
            last_tokens: None,
            separator: "\n".into(),
            neutral: "good".into(),
            last_step_only: false,
            stop_at_first_bad: false,
            steps: 500,
            lr: 1e-3,
            batch_size: 16,
            grad_accum: 1,
            valid_fraction: 0.1,
            valid_solutions: None,
            patience: 0,
            seed: 0,
            max_len: 512,
            placement: Placement::Cpu,
            trainer: Trainer::Auto,
            max_batch_tokens: crate::scoring::DEFAULT_MAX_BATCH_TOKENS,
            lora: None,
        }
    }
}

/// Which trainer a run uses (`--trainer`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Trainer {
    /// The packed engine's on a GPU, and on the CPU for a pretrained base ([`PRETRAINED_WIDTH`]
    /// wide or more); candle's autograd on the CPU for the small shapes.
    #[default]
    Auto,
    /// candle's autograd in f32 (the CPU only): every operation's buffers are kept for the
    /// backward, so memory grows with batch size × sequence length × layers.
    Autograd,
    /// The packed engine's trainer on the run's device: bf16 products with f32 sums and f32
    /// master weights (PyTorch's bf16 autocast), each layer's activations kept while they fit
    /// half the free memory and recomputed in the backward past it.
    Packed,
}

impl std::str::FromStr for Trainer {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "auto" => Trainer::Auto,
            "autograd" => Trainer::Autograd,
            "packed" => Trainer::Packed,
            other => bail!("unknown trainer `{other}`: use auto, autograd or packed"),
        })
    }
}

impl Trainer {
    /// Whether a run placed at `placement` from a base of width `width` (none: a built-in shape)
    /// trains on the packed engine; autograd on a GPU is refused.
    pub fn packed_at(self, placement: Placement, width: Option<usize>) -> Result<bool> {
        let pretrained = width.is_some_and(|w| w >= PRETRAINED_WIDTH);
        Ok(match (self, placement) {
            (Trainer::Autograd, Placement::Cuda(_)) => {
                bail!("--trainer autograd runs on the CPU only: on a GPU the packed engine trains")
            }
            (Trainer::Autograd, _) => false,
            (Trainer::Auto, Placement::Cpu | Placement::Auto) => pretrained,
            (Trainer::Packed, _) | (Trainer::Auto, Placement::Cuda(_)) => true,
        })
    }
}

/// Models at least this wide (`hidden_size`) are pretrained language models to fine-tune (the
/// smallest Qwen2.5 has 896), not the small shapes trained nearly from nothing.
pub const PRETRAINED_WIDTH: usize = 512;

/// The learning rate a run gets when none is given, and why: 1e-5 (TRL's `PRMConfig` default)
/// to fine-tune a pretrained `base` ([`PRETRAINED_WIDTH`] wide or more: at 1e-3 AdamW would wreck
/// it), 1e-3 for a small base or a from-scratch `config` shape.
pub fn default_lr(base: Option<&Path>) -> (f64, String) {
    match base.map(ModelConfig::from_dir) {
        Some(Ok(c)) if c.hidden_size >= PRETRAINED_WIDTH => (
            1e-5,
            format!("a pretrained base (hidden size {}): TRL's PRMConfig default", c.hidden_size),
        ),
        Some(Ok(c)) => (1e-3, format!("a small base (hidden size {})", c.hidden_size)),
        _ => (1e-3, "a model trained from its built-in shape".into()),
    }
}

/// What a run did.
#[derive(Clone, Debug)]
pub struct TrainReport {
    /// The run's state (steps, last loss, tokens and seconds in steps, validations).
    pub state: TrainState,
    /// The final validation (also in `metrics.json`), when solutions were held out.
    pub metrics: Option<Metrics>,
    /// Where it trained (`cpu`, `cuda:0`).
    pub device: String,
    /// Training sequences and validation sequences.
    pub sequences: (usize, usize),
    /// Wall-clock seconds of the whole run.
    pub seconds: f64,
}

impl TrainReport {
    /// The run's last line: steps, time, tokens/s in training steps, the last loss, the folder.
    pub fn summary(&self, out: &Path) -> String {
        let s = &self.state;
        let kept = match s.best_step {
            Some(best) if best != s.step && self.sequences.1 > 0 => {
                format!(", the best validation's (step {best}) kept")
            }
            _ => String::new(),
        };
        format!(
            "trained {} steps on {} in {:.1}s ({:.1}s in steps: {} tokens, {:.0} tokens/s), loss {:.4}{}{kept}; checkpoint in {}",
            s.step,
            self.device,
            self.seconds,
            s.seconds,
            s.tokens,
            s.tokens as f64 / s.seconds.max(1e-9),
            s.last_loss,
            if s.stopped_early { " (early stop)" } else { "" },
            out.display()
        )
    }
}

/// A built-in from-scratch shape.
pub fn shape(name: &str, vocab: usize, head: HeadKind) -> Result<ModelConfig> {
    Ok(match name {
        "tiny" => ModelConfig::tiny(vocab, 64, 2, 4, 2, head),
        "small" => ModelConfig::tiny(vocab, 128, 4, 4, 2, head),
        "base" => ModelConfig::tiny(vocab, 256, 8, 8, 4, head),
        other => bail!("unknown --config `{other}`: use tiny, small or base"),
    })
}

/// Trains the verifier `run` describes on `solutions` into `run.out`: the validation split, the
/// examples, the trainer of the device (the CPU trainer, or the packed engine's on a GPU), the
/// checkpoint with its `reward.json`, tokenizer and `metrics.json`. `on_step(step, loss)` reports
/// progress and `log` what the run says. A run that fails leaves its last checkpoint to resume
/// from, or no folder when it wrote none.
pub fn train_prm(
    run: &TrainPrm,
    solutions: Vec<Solution>,
    mut on_step: impl FnMut(usize, f64),
    mut log: impl FnMut(&str),
) -> Result<TrainReport> {
    let out = &run.out;
    let fresh = !out.exists();
    let trained = train_into(run, solutions, &mut on_step, &mut log);
    let resumable = out.join(super::STATE).exists();
    match trained {
        Err(e) if fresh && !resumable => {
            // Nothing worth keeping: no half-written folder is left to be mistaken for a model.
            let _ = std::fs::remove_dir_all(out);
            Err(e.context(format!("{} was not written", out.display())))
        }
        Err(e) if resumable => Err(e.context(format!(
            "the last checkpoint in {} is kept: run the same command to resume from it",
            out.display()
        ))),
        other => other,
    }
}

fn train_into(
    a: &TrainPrm,
    sols: Vec<Solution>,
    on_step: &mut dyn FnMut(usize, f64),
    log: &mut dyn FnMut(&str),
) -> Result<TrainReport> {
    check_settings(a)?;
    let started = std::time::Instant::now();
    let dev = crate::default_device();
    let tok_dir = a.tokenizer.as_ref().or(a.base.as_ref()).context("pass --base DIR, or --config with --tokenizer DIR")?;
    let tok = Tokenizer::from_dir(tok_dir)?;
    let neutral = neutral_of(a)?;
    let base_config = a.base.as_deref().map(ModelConfig::from_dir).transpose()?;
    let max_len = match &base_config {
        Some(c) => c.max_position_embeddings.min(a.max_len),
        None => a.max_len,
    };
    let head = verifier_head(a)?;
    let start = match (&a.base, &a.config) {
        (Some(base), _) => Start::Checkpoint(base.clone()),
        (None, Some(name)) => Start::Fresh(shape(name, tok.vocab_size(), HeadKind::TokenClassification)?),
        (None, None) => bail!("pass --base DIR or --config tiny|small|base"),
    };
    if matches!(head, VerifierHead::LogRatio(_)) && a.base.is_none() {
        bail!("--head log-ratio needs --base (the LM to fine-tune; also the reference unless --reference-logprob)");
    }
    let placement = a.placement.resolve()?;
    let packed = a.trainer.packed_at(placement, base_config.map(|c| c.hidden_size))?;
    if a.lora.is_some() && !packed {
        bail!("LoRA trains on the packed trainer (--trainer packed), not candle's");
    }
    let spec = VerifierSpec {
        head,
        start,
        extra_layers: 0,
        labels: LabelOptions {
            neutral,
            last_step_only: a.last_step_only,
            stop_at_first_bad: a.stop_at_first_bad,
            outcome: a.outcome,
            separator: a.separator.clone(),
            max_len,
            separator_after_problem: false,
        },
    };
    // Refuse a head that cannot start from --base before any work is done.
    spec.config()?;
    // A log-ratio verifier against its --base: the base's log-probabilities are attached once,
    // where the verifier trains.
    let reference = match head {
        VerifierHead::LogRatio(LogRatio {
            reference_logprob: None,
            ..
        }) => {
            let base = a.base.as_ref().expect("checked above");
            Some(match placement {
                Placement::Cuda(_) => Model::load_on(base, placement, crate::WeightDtype::Bf16)?,
                _ => Model::load(base, &dev)?,
            })
        }
        _ => None,
    };
    let (valid_sols, train_sols) = match &a.valid_solutions {
        Some(valid) => (valid.clone(), sols),
        None => validation_split(sols, a.valid_fraction, a.seed),
    };
    let train_set = spec.examples(&tok, &train_sols, reference.as_ref())?;
    let valid_set = spec.examples(&tok, &valid_sols, reference.as_ref())?;
    let against_base = reference.is_some();
    drop(reference);
    log(&format!("{} training sequences, {} validation", train_set.len(), valid_set.len()));
    let dropped = train_sols.len() + valid_sols.len() - train_set.len() - valid_set.len();
    if dropped > 0 {
        log(&dropped_message(a, dropped, train_sols.len() + valid_sols.len()));
    }
    let relative_base = reference_from_out(a, against_base)?;
    spec.reward_spec(relative_base.as_deref()).save(&a.out)?;
    let (state, metrics) = match packed {
        true => on_packed(a, placement, &spec, &train_set, &valid_set, on_step)?,
        false => on_cpu(a, &spec, &train_set, &valid_set, on_step)?,
    };
    let device = match placement {
        Placement::Cuda(ordinal) => format!("cuda:{ordinal}"),
        _ if packed => "cpu (packed engine)".to_string(),
        _ => "cpu".to_string(),
    };
    for f in ["tokenizer.json", "tokenizer_config.json"].map(|f| tok_dir.join(f)) {
        if f.exists() {
            std::fs::copy(&f, a.out.join(f.file_name().expect("a file")))?;
        }
    }
    if let Some(m) = &metrics {
        log(&format!(
            "validation: loss {:.4}, step accuracy {:.3}, AUROC {:.3}",
            m.loss, m.accuracy, m.auroc
        ));
        std::fs::write(a.out.join("metrics.json"), serde_json::to_string_pretty(m)?)?;
    }
    Ok(TrainReport {
        state,
        metrics,
        device,
        sequences: (train_set.len(), valid_set.len()),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Settings no run can train with, refused before any work, named as the command line names
/// them: a learning rate or β that is not a positive number (`--lr nan` wrote a checkpoint of NaN
/// weights, its scores null), empty batches, a validation fraction outside [0, 1).
fn check_settings(a: &TrainPrm) -> Result<()> {
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if !positive(a.lr) {
        bail!("--lr {}: the learning rate must be a positive number", a.lr);
    }
    if !positive(a.beta as f64) {
        bail!("--beta {}: a positive number", a.beta);
    }
    if a.batch_size == 0 || a.grad_accum == 0 {
        bail!("--batch-size and --grad-accum: each at least 1");
    }
    if !(0.0..1.0).contains(&a.valid_fraction) {
        bail!(
            "--valid-fraction {}: a fraction from 0 up to, not including, 1 (the rest trains)",
            a.valid_fraction
        );
    }
    Ok(())
}

/// `--neutral`: what a neutral step's label becomes.
fn neutral_of(a: &TrainPrm) -> Result<Neutral> {
    Ok(match a.neutral.as_str() {
        "good" => Neutral::Good,
        "bad" => Neutral::Bad,
        "skip" => Neutral::Skip,
        o => bail!("unknown --neutral `{o}`: use good, bad or skip"),
    })
}

/// The verifier's head from `--head` (and `--outcome`), its options checked.
fn verifier_head(a: &TrainPrm) -> Result<VerifierHead> {
    if a.separator.is_empty() {
        bail!("--separator: empty (steps could not be told apart when the verifier is scored)");
    }
    if a.reference_logprob.is_some() && a.head.as_deref() != Some("log-ratio") {
        bail!("--reference-logprob is for --head log-ratio");
    }
    if a.last_tokens.is_some() && (a.head.as_deref() != Some("log-ratio") || a.outcome) {
        bail!("--last-tokens is for --head log-ratio on step labels (not --outcome)");
    }
    Ok(match a.head.as_deref() {
        Some("log-ratio") => {
            let lr = LogRatio {
                beta: a.beta,
                cumulative: a.outcome,
                reference_logprob: a.reference_logprob,
                last_tokens: a.last_tokens,
            };
            lr.check().context("--reference-logprob, --last-tokens")?;
            VerifierHead::LogRatio(lr)
        }
        Some("value") => VerifierHead::Value,
        Some("classifier") => VerifierHead::Classifier,
        Some(other) => bail!("unknown --head `{other}`: use classifier, value or log-ratio"),
        None if a.outcome => VerifierHead::Value,
        None => VerifierHead::Classifier,
    })
}

/// Why solutions were left out of training.
fn dropped_message(a: &TrainPrm, dropped: usize, all: usize) -> String {
    format!(
        "{dropped} of {all} solutions left out: nothing to learn from them ({})",
        if a.outcome {
            "no `correct` field, or no steps"
        } else {
            "no labelled step, only neutral steps with --neutral skip, or every label past --max-len"
        }
    )
}

/// Makes the output folder; a verifier scored against its base names the base relative to it,
/// so the two can move together.
fn reference_from_out(a: &TrainPrm, against_base: bool) -> Result<Option<PathBuf>> {
    std::fs::create_dir_all(&a.out)?;
    Ok(match (against_base, &a.base) {
        (true, Some(base)) => {
            let base = std::fs::canonicalize(base).with_context(|| format!("{}", base.display()))?;
            let out = std::fs::canonicalize(&a.out).with_context(|| format!("{}", a.out.display()))?;
            Some(relative_path(&out, &base))
        }
        _ => None,
    })
}

/// Trains on the CPU (candle's autograd): the run's state and the validation metrics.
fn on_cpu(
    a: &TrainPrm,
    spec: &VerifierSpec,
    train_set: &[Example],
    valid_set: &[Example],
    on_step: &mut dyn FnMut(usize, f64),
) -> Result<(TrainState, Option<Metrics>)> {
    let varmap = VarMap::new();
    let mut model = spec.build(&varmap, &crate::default_device(), a.seed)?;
    let objective = spec.objective();
    let state = train(&mut model, &varmap, train_set, valid_set, objective, &train_config(a, true), on_step)?;
    let metrics = (!valid_set.is_empty())
        .then(|| evaluate(&model, valid_set, objective, a.batch_size * 2))
        .transpose()?;
    Ok((state, metrics))
}

/// The run's settings as the trainers take them.
fn train_config(a: &TrainPrm, keep_best: bool) -> TrainConfig {
    TrainConfig {
        lr: a.lr,
        warmup: (a.steps / 20).max(1),
        steps: a.steps,
        batch_size: a.batch_size,
        grad_accum: a.grad_accum,
        eval_every: (a.steps / 5).max(1),
        patience: a.patience,
        seed: a.seed,
        out_dir: Some(a.out.clone()),
        keep_best,
        ..Default::default()
    }
}

/// Training at `placement` (a CUDA GPU or the CPU) with the packed engine's trainer: from `base` when that
/// already has the verifier's head, else from the verifier built here and written to `out`
/// first (a fresh shape, a new head); a folder with a run's state continues it. Returns the
/// state and the last validation.
fn on_packed(
    a: &TrainPrm,
    placement: Placement,
    spec: &VerifierSpec,
    train_set: &[Example],
    valid_set: &[Example],
    on_step: &mut dyn FnMut(usize, f64),
) -> Result<(TrainState, Option<Metrics>)> {
    let wanted = spec.config()?;
    let base_fits = a.base.as_ref().is_some_and(|b| {
        ModelConfig::from_dir(b).is_ok_and(|c| c.head == wanted.head && c.num_labels == wanted.num_labels)
    });
    let fresh = |dir: &Path| -> Result<()> {
        let varmap = VarMap::new();
        let model = spec.build(&varmap, &crate::default_device(), a.seed)?;
        crate::checkpoint::save_training_checkpoint(dir, &model.config, &varmap)
    };
    let resumed = a.out.join(super::STATE).exists();
    let was_lora = a.out.join("adapter_config.json").exists();
    if resumed && was_lora != a.lora.is_some() {
        let (then, now) = if was_lora { ("with", "without") } else { ("without", "with") };
        bail!(
            "{} was trained {then} LoRA; continuing it {now} would mix the two: give the same --lora-rank, or use another folder",
            a.out.display()
        );
    }
    let start = if a.lora.is_some() {
        // LoRA's trainer always starts from its frozen base (a resumed run's adapters and head
        // are read from the run's folder): `--base`, or the base with its new head, written
        // once beside the run.
        match base_fits {
            true => a.base.clone().expect("checked above"),
            false => lora_base(&a.out, fresh)?,
        }
    } else if resumed {
        a.out.clone()
    } else if base_fits {
        a.base.clone().expect("checked above")
    } else {
        fresh(&a.out)?;
        a.out.clone()
    };
    let cfg = train_config(a, true);
    let objective = spec.objective();
    let state = train_on_device(
        &start,
        (placement, a.lora.clone()),
        train_set,
        valid_set,
        objective,
        &cfg,
        a.max_batch_tokens,
        on_step,
    )?;
    // The best validation's, whose weights the run ends with.
    let best = state.history.iter().rev().find(|(step, _)| Some(*step) == state.best_step);
    let metrics = best.or(state.history.last()).map(|(_, m)| m.clone());
    Ok((state, metrics))
}

/// The frozen base of a LoRA run whose head is new: `out/lora-base`, made by `make` once
/// (in a folder renamed into place when complete, so a run killed while writing it makes it
/// again).
fn lora_base(out: &Path, make: impl FnOnce(&Path) -> Result<()>) -> Result<PathBuf> {
    let dir = out.join("lora-base");
    if !dir.join("config.json").exists() {
        let tmp = out.join("lora-base.tmp");
        let _ = std::fs::remove_dir_all(&tmp);
        make(&tmp)?;
        std::fs::rename(&tmp, &dir).with_context(|| format!("writing {}", dir.display()))?;
    }
    Ok(dir)
}

/// Solutions held out for validation, about `fraction` of them, by whole problems (the
/// solutions of one problem all on one side, so validation measures problems not seen in
/// training) drawn at random with `seed`: never the first lines of a file, which in sorted
/// datasets (ProcessBench) are all of one kind. Returns (validation, training), each in file
/// order.
fn validation_split(sols: Vec<Solution>, fraction: f64, seed: u64) -> (Vec<Solution>, Vec<Solution>) {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let key = |s: &Solution| {
        if s.problem_id.is_empty() {
            s.id.clone()
        } else {
            s.problem_id.clone()
        }
    };
    let mut problems: Vec<String> = sols.iter().map(key).collect();
    problems.sort();
    problems.dedup();
    problems.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(seed));
    let want = ((sols.len() as f64) * fraction.clamp(0.0, 1.0)).round() as usize;
    let mut per_problem: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for s in &sols {
        *per_problem.entry(key(s)).or_default() += 1;
    }
    let mut held = std::collections::HashSet::new();
    let mut taken = 0;
    for p in problems {
        if taken >= want {
            break;
        }
        taken += per_problem[&p];
        held.insert(p);
    }
    sols.into_iter().partition(|s| held.contains(&key(s)))
}

/// The path of `to` relative to the folder `from` (both absolute): `../policy` for siblings.
fn relative_path(from: &Path, to: &Path) -> PathBuf {
    let (f, t): (Vec<_>, Vec<_>) = (from.components().collect(), to.components().collect());
    let shared = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
    let mut rel: PathBuf = std::iter::repeat_n(std::path::Component::ParentDir, f.len() - shared).collect();
    rel.extend(&t[shared..]);
    if rel.as_os_str().is_empty() {
        rel.push(".");
    }
    rel
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trainer_follows_the_device_and_autograd_stays_on_the_cpu() {
        let packed = |t: Trainer, p: Placement| t.packed_at(p, Some(64)).unwrap();
        assert!(!packed(Trainer::Auto, Placement::Cpu) && packed(Trainer::Auto, Placement::Cuda(0)));
        assert!(packed(Trainer::Packed, Placement::Cpu) && packed(Trainer::Packed, Placement::Cuda(1)));
        assert!(!packed(Trainer::Autograd, Placement::Cpu));
        // On the CPU, auto fine-tunes a pretrained base on the packed engine, and trains the
        // small shapes (a small base, or none) with autograd.
        assert!(Trainer::Auto.packed_at(Placement::Cpu, Some(PRETRAINED_WIDTH)).unwrap());
        assert!(!Trainer::Auto.packed_at(Placement::Cpu, None).unwrap());
        assert!(!Trainer::Autograd.packed_at(Placement::Cpu, Some(896)).unwrap());
        let refused = Trainer::Autograd.packed_at(Placement::Cuda(0), None).unwrap_err();
        assert!(refused.to_string().contains("CPU only"), "{refused}");
        assert_eq!("packed".parse::<Trainer>().unwrap(), Trainer::Packed);
        assert!("jax".parse::<Trainer>().unwrap_err().to_string().contains("use auto, autograd or packed"));
    }
}
