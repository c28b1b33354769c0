use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use stepwise_core::{Format, Solution, SolutionReader};
use stepwise_model::train::run::{default_lr, train_prm, TrainPrm};

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

--device cuda (a build with --features cuda) trains on the GPU with the packed engine, every head (a log-ratio \
verifier's reference log-probabilities computed there too): bf16 products with f32 sums, f32 master weights, \
AdamW, batches of at most --max-batch-tokens tokens (and --batch-size solutions), the LM head's vocabulary \
logits a chunk of rows at a time. The last line gives tokens/s in training steps on either device. \
On an H200 a 0.5B PRM trained at batch 16 in 12.5 GiB (each layer recomputed, before the activation budget).

On the CPU a pretrained --base (hidden size 512 or more) is fine-tuned by the GPU's packed trainer (bf16 products \
with f32 sums; each layer's activations kept within half the free memory, recomputed past it): a 0.5B PRM on a \
2-vCPU Xeon with AMX trained at 1.62-2.19x PyTorch's bf16-autocast tokens/s at batch 1 and 1.31x (a steady step) \
to 1.72x (two steps) at batch 4, in 11-12 GiB against its 12-16 (bench/train_steady_cpu.sh). The small shapes (--config, a small --base) train with candle's f32 autograd, which keeps \
every op's buffers: 19.7 GiB and 26 tokens/s for one 871-token solution of the same 0.5B PRM with --trainer \
autograd. Either way the run ends with its best validation's weights (lowest loss; the last step's are kept \
beside them, and a longer run on the same --out continues from those).

Examples:
  stepwise train-prm --data labeled.jsonl --base fixtures/hf-tiny/qwen2-policy --out prm/
  stepwise train-prm --data labeled.jsonl --config tiny \\
      --tokenizer fixtures/hf-tiny/qwen2-policy --out prm/
  stepwise train-prm --data labeled.jsonl --config tiny --tokenizer TOK --outcome --out orm/
  # an agent's progress head
  stepwise train-prm --data td.jsonl --base policy/ --target progress --separator '|' \\
      --out progress/
  stepwise train-prm --data labeled.jsonl --base policy/ --head log-ratio --separator '|' --out prm/
  stepwise train-prm --data labeled.jsonl --base policy/ --head log-ratio \\
      --reference-logprob -0.5 --separator '|' --out prm/
  stepwise train-prm --data processbench/gsm8k.json --base Qwen/Qwen2.5-Math-PRM-7B \\
      --stop-at-first-bad --device cuda --out prm/
  # a 0.5B base on the CPU (the packed trainer), in bounded memory
  stepwise train-prm --data labeled.jsonl --base Qwen/Qwen2.5-0.5B --device cpu \\
      --batch-size 8 --out prm/
  # a fixed validation set
  stepwise train-prm --data prm800k.jsonl --valid-data processbench/math.json --base policy/ \\
      --out prm/"
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
    /// What each step's label is: `promise` (the label itself: a PRM) or `progress` (an agent's
    /// TD labels' GAE advantage A = Q − V from `source.progress`, trained as the soft label
    /// (A + 1) / 2: a progress head, whose score s reads as A = 2s − 1).
    #[arg(long, default_value = "promise", value_parser = ["promise", "progress"])]
    pub target: String,
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
    /// Peak learning rate. Default: 1e-5 to fine-tune a pretrained --base (hidden size 512 or
    /// more, as TRL's PRMConfig has it: at 1e-3 AdamW wrecks a pretrained model), 1e-3 for a
    /// small base or a --config shape (trained nearly from nothing).
    #[arg(long)]
    pub lr: Option<f64>,
    /// Sequences per batch.
    #[arg(long, default_value_t = 16)]
    pub batch_size: usize,
    /// Micro-batches per step.
    #[arg(long, default_value_t = 1)]
    pub grad_accum: usize,
    /// Fraction of solutions held out for validation (by whole problems).
    #[arg(long, default_value_t = 0.1)]
    pub valid_fraction: f64,
    /// Validate on these step-labelled solutions (any format) instead of a fraction of --data:
    /// a fixed held-out set, the same for every run (and for another trainer compared with this one).
    #[arg(long, conflicts_with = "valid_fraction")]
    pub valid_data: Option<PathBuf>,
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
    /// Which trainer updates it.
    #[command(flatten)]
    pub trainer: super::backend::TrainerArg,
    #[command(flatten)]
    pub lora: super::LoraArgs,
}

pub fn run(a: Args) -> Result<()> {
    a.dtype.apply();
    let lr = a.lr.unwrap_or_else(|| {
        let (lr, why) = default_lr(a.base.as_deref());
        eprintln!("learning rate {lr:e} ({why}; --lr sets it)");
        lr
    });
    let mut run = TrainPrm {
        base: a.base,
        config: a.config,
        tokenizer: a.tokenizer,
        out: a.out,
        outcome: a.outcome,
        head: a.head,
        beta: a.beta,
        reference_logprob: a.reference_logprob,
        last_tokens: a.last_tokens,
        separator: a.separator,
        neutral: a.neutral,
        last_step_only: a.last_step_only,
        stop_at_first_bad: a.stop_at_first_bad,
        steps: a.steps,
        lr,
        batch_size: a.batch_size,
        grad_accum: a.grad_accum,
        valid_fraction: a.valid_fraction,
        valid_solutions: None,
        patience: a.patience,
        seed: a.seed,
        max_len: a.max_len,
        placement: a.device.device,
        trainer: a.trainer.get()?,
        max_batch_tokens: a.device.max_batch_tokens,
        lora: a.lora.config(a.seed),
    };
    let solutions = read_targets(&a.data, a.from, &a.target, &run.out)?;
    if let Some(valid) = &a.valid_data {
        // Its own format, detected: a held-out set is often another dataset's file.
        run.valid_solutions = Some(read_targets(valid, None, &a.target, &run.out)?);
    }
    let bar = crate::progress::bar(Some(run.steps as u64), "training");
    bar.set_style(indicatif::ProgressStyle::with_template(
        "{msg:>12} [{bar:30}] {pos}/{len} {prefix} ({per_sec}, eta {eta})",
    )?);
    let report = train_prm(
        &run,
        solutions,
        |step, loss| {
            bar.set_position(step as u64);
            bar.set_prefix(format!("loss {loss:.4}"));
        },
        |line| bar.suspend(|| eprintln!("{line}")),
    );
    bar.finish_and_clear();
    eprintln!("{}", report?.summary(&run.out));
    Ok(())
}

/// The solutions of `path` with their `--target` labels; a file that cannot be read names itself,
/// its line and field, and says that `out` was not written.
fn read_targets(path: &Path, from: Option<Format>, target: &str, out: &Path) -> Result<Vec<Solution>> {
    let solutions: Vec<_> = match SolutionReader::open(path, from).and_then(|r| r.collect::<Result<_, _>>()) {
        Ok(s) => s,
        Err(e) => return Err(anyhow::Error::new(e).context(format!("{} was not written", out.display()))),
    };
    stepwise_agent::training_targets(target, solutions)
        .with_context(|| format!("{}: --target {target}", path.display()))
}
