use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use stepwise_core::{Format, Solution, SolutionReader};
use stepwise_model::log_ratio::LogRatio;
use stepwise_model::train::examples::{LabelOptions, Neutral};
use stepwise_model::train::verifier::{Start, VerifierHead, VerifierSpec};
use stepwise_model::train::{evaluate, train, TrainConfig, TrainState, VarMap};
use stepwise_model::{default_device, HeadKind, Model, ModelConfig, Tokenizer};

/// Train a process reward model (or, with --outcome, an outcome reward model).
#[derive(clap::Args)]
#[command(
    after_help = "Inputs use TRL's PRM layout (problem, then each step followed by \"\\n\", the label on that \
separator). A PRM is a 2-class token classifier (AutoModelForTokenClassification); --outcome puts one label, the \
solution's `correct`, on its last step and by default trains a scalar value head (AutoModelForSequenceClassification, \
num_labels=1, the usual ORM). Both are written as Hugging Face folders that `stepwise score` reads back. Hard labels \
train with cross-entropy, soft labels (Monte Carlo values) with BCE. An interrupted run started again with the same \
--out resumes from its last checkpoint.

--head log-ratio keeps the --base causal LM and scores each step by β·Σ log π/π_base over its tokens (the implicit-PRM \
parameterisation; with --outcome, the implicit PRM itself). Its input is the policy's layout: problem, separator, \
then each step and separator. The folder gets a reward.json naming --base as the reference; `stepwise score` loads both. \
With --reference-logprob L the reference is a constant instead (every token at log-probability L): each step scores \
β·(Σ log π − n·L) over its n tokens, the verifier's own log-likelihood, and no reference model is kept.

Examples:
  stepwise train-prm --data labeled.jsonl --base ../shared/fixtures/hf-tiny/qwen2-policy --out prm/
  stepwise train-prm --data labeled.jsonl --config tiny --tokenizer ../shared/fixtures/hf-tiny/qwen2-policy --out prm/
  stepwise train-prm --data labeled.jsonl --config tiny --tokenizer TOK --outcome --out orm/
  stepwise train-prm --data labeled.jsonl --base policy/ --head log-ratio --separator '|' --out prm/
  stepwise train-prm --data labeled.jsonl --base policy/ --head log-ratio --reference-logprob -0.5 --separator '|' --out prm/"
)]
pub struct Args {
    /// Step-labelled solutions in any format stepwise reads.
    #[arg(long)]
    pub data: PathBuf,
    /// Start from this checkpoint folder or cached Hugging Face model id (its head is replaced by
    /// the --head).
    #[arg(long, conflicts_with = "config", value_parser = super::model_dir)]
    pub base: Option<PathBuf>,
    /// Train from scratch with a built-in shape: tiny (2×64), small (4×128) or base (8×256).
    #[arg(long)]
    pub config: Option<String>,
    /// Tokenizer folder or cached model id (required with --config; defaults to --base).
    #[arg(long, value_parser = super::model_dir)]
    pub tokenizer: Option<PathBuf>,
    /// Output folder (checkpoints, metrics; resumes if present).
    #[arg(long)]
    pub out: PathBuf,
    /// Outcome reward model: one label per solution, from `correct`.
    #[arg(long)]
    pub outcome: bool,
    /// Head: `classifier` (2-class token classifier, TRL's PRM layout), `value` (scalar value
    /// head read through a sigmoid, saved as *ForSequenceClassification with one label) or
    /// `log-ratio` (the --base LM itself, scored against a frozen copy). Default: classifier for
    /// PRMs, value for --outcome.
    #[arg(long, value_parser = ["classifier", "value", "log-ratio"])]
    pub head: Option<String>,
    /// β of the log-ratio head.
    #[arg(long, default_value_t = 1.0)]
    pub beta: f32,
    /// Log-ratio head: compare every token with this constant log-probability instead of the
    /// --base model (the step's score is then the verifier's own log-likelihood).
    #[arg(long, allow_negative_numbers = true)]
    pub reference_logprob: Option<f32>,
    /// Log-ratio head: score only each step's last N tokens, its separator counted (2: the
    /// step's last token, usually its written result, and the separator) instead of all of
    /// them. Not with --outcome.
    #[arg(long, value_name = "N")]
    pub last_tokens: Option<usize>,
    /// Separator after each step (and, for the log-ratio head, after the problem).
    #[arg(long, default_value = "\n")]
    pub separator: String,
    /// Neutral ratings: good, bad or skip.
    #[arg(long, default_value = "good")]
    pub neutral: String,
    /// Only the last labelled step carries a label (TRL's train_on_last_step_only).
    #[arg(long)]
    pub last_step_only: bool,
    /// Step targets stop at each solution's first bad step (label below 0.5), as PRM800K's
    /// raters stop at the first error; later steps are then not trained on.
    #[arg(long)]
    pub stop_at_first_bad: bool,
    /// Optimiser steps.
    #[arg(long, default_value_t = 500)]
    pub steps: usize,
    /// Peak learning rate.
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f64,
    /// Sequences per batch.
    #[arg(long, default_value_t = 16)]
    pub batch_size: usize,
    /// Micro-batches per step.
    #[arg(long, default_value_t = 1)]
    pub grad_accum: usize,
    /// Fraction of solutions held out for validation.
    #[arg(long, default_value_t = 0.1)]
    pub valid_fraction: f64,
    /// Stop after this many validations without improvement (0 = never).
    #[arg(long, default_value_t = 0)]
    pub patience: usize,
    /// Seed (initialisation and shuffling).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Longest training sequence in tokens (longer solutions are cut at a step boundary).
    #[arg(long, default_value_t = 512)]
    pub max_len: usize,
    /// Input format (detected when omitted).
    #[arg(long)]
    pub from: Option<Format>,
    /// What loaded models compute in.
    #[command(flatten)]
    pub dtype: super::backend::DtypeArg,
    /// Where it trains, and the most tokens in one batch.
    #[command(flatten)]
    pub device: super::backend::DeviceArgs,
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

pub fn run(a: Args) -> Result<()> {
    a.dtype.apply();
    let out = a.out.clone();
    let fresh = !out.exists();
    let trained = train_into(a);
    let resumable = out.join("trainer_state.json").exists();
    match trained {
        Err(e) if fresh && !resumable => {
            // Nothing worth keeping: no half-written folder is left to be mistaken for a model.
            let _ = std::fs::remove_dir_all(&out);
            Err(e.context(format!("{} was not written", out.display())))
        }
        Err(e) if resumable => Err(e.context(format!(
            "the last checkpoint in {} is kept: run the same command to resume from it",
            out.display()
        ))),
        other => other,
    }
}

fn train_into(a: Args) -> Result<()> {
    let dev = default_device();
    let placement = a.device.device.resolve()?;
    let tok_dir = a
        .tokenizer
        .clone()
        .or(a.base.clone())
        .context("pass --base DIR, or --config with --tokenizer DIR")?;
    let tok = Tokenizer::from_dir(&tok_dir)?;
    let sols: Vec<_> = SolutionReader::open(&a.data, a.from)?.collect::<Result<_, _>>()?;
    let neutral = match a.neutral.as_str() {
        "good" => Neutral::Good,
        "bad" => Neutral::Bad,
        "skip" => Neutral::Skip,
        o => bail!("unknown --neutral `{o}`"),
    };
    let max_len = match &a.base {
        Some(base) => ModelConfig::from_dir(base)?.max_position_embeddings.min(a.max_len),
        None => a.max_len,
    };
    if a.separator.is_empty() {
        bail!("--separator: empty (steps could not be told apart when the verifier is scored)");
    }
    if a.reference_logprob.is_some() && a.head.as_deref() != Some("log-ratio") {
        bail!("--reference-logprob is for --head log-ratio");
    }
    if a.last_tokens.is_some() && (a.head.as_deref() != Some("log-ratio") || a.outcome) {
        bail!("--last-tokens is for --head log-ratio on step labels (not --outcome)");
    }
    let head = match a.head.as_deref() {
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
        Some(_) => VerifierHead::Classifier,
        None if a.outcome => VerifierHead::Value,
        None => VerifierHead::Classifier,
    };
    let start = match (&a.base, &a.config) {
        (Some(base), _) => Start::Checkpoint(base.clone()),
        (None, Some(name)) => Start::Fresh(shape(name, tok.vocab_size(), HeadKind::TokenClassification)?),
        (None, None) => bail!("pass --base DIR or --config tiny|small|base"),
    };
    if matches!(head, VerifierHead::LogRatio(_)) && a.base.is_none() {
        bail!("--head log-ratio needs --base (the LM to fine-tune; also the reference unless --reference-logprob)");
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
    // A log-ratio verifier against its --base: the base's log-probabilities are attached once.
    let reference = match head {
        VerifierHead::LogRatio(LogRatio {
            reference_logprob: None,
            ..
        }) => Some(Model::load(a.base.as_ref().unwrap(), &dev)?),
        _ => None,
    };
    let (valid_sols, train_sols) = validation_split(sols, a.valid_fraction, a.seed);
    let (valid_sols, train_sols) = (&valid_sols[..], &train_sols[..]);
    let train_set = spec.examples(&tok, train_sols, reference.as_ref())?;
    let valid_set = spec.examples(&tok, valid_sols, reference.as_ref())?;
    eprintln!("{} training sequences, {} validation", train_set.len(), valid_set.len());
    let dropped = train_sols.len() + valid_sols.len() - train_set.len() - valid_set.len();
    if dropped > 0 {
        eprintln!(
            "{dropped} of {} solutions left out: nothing to learn from them ({})",
            train_sols.len() + valid_sols.len(),
            if a.outcome {
                "no `correct` field, or no steps"
            } else {
                "no labelled step, only neutral steps with --neutral skip, or every label past --max-len"
            }
        );
    }
    let objective = spec.objective();
    // The reference is named relative to the verifier's folder, so the two can move together.
    std::fs::create_dir_all(&a.out)?;
    let relative_base = match (&reference, &a.base) {
        (Some(_), Some(base)) => {
            let base = std::fs::canonicalize(base).with_context(|| format!("{}", base.display()))?;
            let out = std::fs::canonicalize(&a.out).with_context(|| format!("{}", a.out.display()))?;
            Some(relative_path(&out, &base))
        }
        _ => None,
    };
    spec.reward_spec(relative_base.as_deref()).save(&a.out)?;
    if let stepwise_model::Placement::Cuda(ordinal) = placement {
        return train_on_gpu(&a, ordinal, &spec, &tok_dir, &train_set, &valid_set);
    }
    let varmap = VarMap::new();
    let mut model = spec.build(&varmap, &dev, a.seed)?;
    let cfg = train_config(&a, true);
    let bar = crate::progress::bar(Some(a.steps as u64), "training");
    bar.set_style(indicatif::ProgressStyle::with_template(
        "{msg:>12} [{bar:30}] {pos}/{len} {prefix} ({per_sec}, eta {eta})",
    )?);
    let started = std::time::Instant::now();
    let state = train(
        &mut model,
        &varmap,
        &train_set,
        &valid_set,
        objective,
        &cfg,
        |step, loss| {
            bar.set_position(step as u64);
            bar.set_prefix(format!("loss {loss:.4}"));
        },
    )?;
    bar.finish_and_clear();
    copy_tokenizer(&tok_dir, &a.out)?;
    if !valid_set.is_empty() {
        let m = evaluate(&model, &valid_set, objective, a.batch_size * 2)?;
        eprintln!(
            "validation: loss {:.4}, step accuracy {:.3}, AUROC {:.3}",
            m.loss, m.accuracy, m.auroc
        );
        std::fs::write(a.out.join("metrics.json"), serde_json::to_string_pretty(&m)?)?;
    }
    let kept = match state.best_step {
        Some(best) if best != state.step && !valid_set.is_empty() => {
            format!(", the best validation's (step {best}) kept")
        }
        _ => String::new(),
    };
    report(&state, "cpu", started, &kept, &a.out);
    Ok(())
}

/// The run's last line: steps, time, tokens/s (in training steps), the last loss, the folder.
fn report(state: &TrainState, device: &str, started: std::time::Instant, kept: &str, out: &std::path::Path) {
    eprintln!(
        "trained {} steps on {device} in {:.1}s ({:.1}s in steps: {} tokens, {:.0} tokens/s), loss {:.4}{}{kept}; checkpoint in {}",
        state.step,
        started.elapsed().as_secs_f64(),
        state.seconds,
        state.tokens,
        state.tokens as f64 / state.seconds.max(1e-9),
        state.last_loss,
        if state.stopped_early { " (early stop)" } else { "" },
        out.display()
    );
}

/// The run's settings as the trainers take them.
fn train_config(a: &Args, keep_best: bool) -> TrainConfig {
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

/// `train-prm` on CUDA GPU `ordinal`: the packed engine's trainer (bf16 products with f32
/// sums, f32 master weights, AdamW), batches bounded by `--max-batch-tokens` as well as
/// `--batch-size`. It starts from `--base` when that already has the verifier's head, else from
/// the verifier built here and written to `--out` first (a fresh `--config`, a new head); a
/// folder with a run's state continues it.
fn train_on_gpu(
    a: &Args,
    ordinal: usize,
    spec: &VerifierSpec,
    tok_dir: &std::path::Path,
    train_set: &[stepwise_model::train::Example],
    valid_set: &[stepwise_model::train::Example],
) -> Result<()> {
    if matches!(spec.head, VerifierHead::LogRatio(_)) {
        bail!("--head log-ratio trains on the CPU (--device cpu): the GPU trains classifier and value heads");
    }
    let wanted = spec.config()?;
    let base_fits = a.base.as_ref().is_some_and(|b| {
        ModelConfig::from_dir(b).is_ok_and(|c| c.head == wanted.head && c.num_labels == wanted.num_labels)
    });
    let start = if a.out.join("trainer_state.json").exists() {
        a.out.clone()
    } else if base_fits {
        a.base.clone().expect("checked above")
    } else {
        let varmap = VarMap::new();
        let model = spec.build(&varmap, &default_device(), a.seed)?;
        stepwise_model::model::save_training_checkpoint(&a.out, &model.config, &varmap)?;
        a.out.clone()
    };
    let bar = crate::progress::bar(Some(a.steps as u64), "training");
    bar.set_style(indicatif::ProgressStyle::with_template(
        "{msg:>12} [{bar:30}] {pos}/{len} {prefix} ({per_sec}, eta {eta})",
    )?);
    let started = std::time::Instant::now();
    let state = stepwise_model::train::packed::train_on_gpu(
        &start,
        ordinal,
        train_set,
        valid_set,
        &train_config(a, false),
        a.device.max_batch_tokens,
        |step, loss| {
            bar.set_position(step as u64);
            bar.set_prefix(format!("loss {loss:.4}"));
        },
    )?;
    bar.finish_and_clear();
    copy_tokenizer(tok_dir, &a.out)?;
    if let Some((_, m)) = state.history.last() {
        eprintln!(
            "validation: loss {:.4}, step accuracy {:.3}, AUROC {:.3}",
            m.loss, m.accuracy, m.auroc
        );
        std::fs::write(a.out.join("metrics.json"), serde_json::to_string_pretty(m)?)?;
    }
    report(&state, &format!("cuda:{ordinal}"), started, "", &a.out);
    Ok(())
}

/// The tokenizer's files beside the checkpoint.
fn copy_tokenizer(tok_dir: &std::path::Path, out: &std::path::Path) -> Result<()> {
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        if tok_dir.join(f).exists() {
            std::fs::copy(tok_dir.join(f), out.join(f))?;
        }
    }
    Ok(())
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
fn relative_path(from: &std::path::Path, to: &std::path::Path) -> PathBuf {
    let (f, t): (Vec<_>, Vec<_>) = (from.components().collect(), to.components().collect());
    let shared = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
    let mut rel: PathBuf = std::iter::repeat_n(std::path::Component::ParentDir, f.len() - shared).collect();
    rel.extend(&t[shared..]);
    if rel.as_os_str().is_empty() {
        rel.push(".");
    }
    rel
}
