//! `stepwise dpo`: parsing and wiring; the run is [`stepwise_rl::run_dpo`], which Python's
//! `stepwise.dpo` calls too.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use stepwise_core::preference::{read_preference_pairs, Origin, PreferencePair};
use stepwise_rl::{run_dpo, DpoConfig, DpoJob, DpoLog};

/// Train a policy by DPO on preference pairs.
#[derive(clap::Args)]
#[command(after_help = DPO_HELP)]
pub struct Args {
    /// Policy checkpoint folder or Hugging Face model id to start from (also the reference), or
    /// a PEFT LoRA adapter's (merged onto its base once).
    #[arg(long, value_parser = super::model_dir)]
    pub policy: PathBuf,
    /// Preference pairs: `stepwise pairs` output in any layout (stepwise, step-dpo, trl), or
    /// step-labelled records (mined for step pairs here, as `stepwise pairs` does).
    #[arg(long)]
    pub pairs: PathBuf,
    /// Held-out pairs (same formats) measured at the end of each epoch.
    #[arg(long)]
    pub eval_pairs: Option<PathBuf>,
    /// Output folder (the policy, checkpoints, log, plot; resumed when present).
    #[arg(long)]
    pub out: PathBuf,
    /// β: how far the policy may move from the reference.
    #[arg(long, default_value_t = 0.1)]
    pub beta: f32,
    /// ε: the assumed share of pairs whose preference is wrong (conservative DPO; 0 is DPO).
    #[arg(long, default_value_t = 0.0)]
    pub label_smoothing: f32,
    /// Weight of the chosen completions' negative log-likelihood added to the loss (RPO, TRL's
    /// `rpo_alpha`): keeps the chosen steps' likelihood from falling with the rejected ones'.
    #[arg(long, default_value_t = 0.0)]
    pub rpo_alpha: f32,
    /// Passes over the pairs.
    #[arg(long, default_value_t = 1)]
    pub epochs: usize,
    /// Pairs per optimiser step.
    #[arg(long, default_value_t = 16)]
    pub batch_size: usize,
    /// Pairs per forward and backward pass (gradients accumulate up to --batch-size).
    #[arg(long, default_value_t = 8)]
    pub minibatch_size: usize,
    /// Peak learning rate (AdamW; linear warm-up, then cosine decay to a tenth).
    #[arg(long, default_value_t = 1e-6)]
    pub lr: f64,
    /// Share of the steps spent warming up.
    #[arg(long, default_value_t = 0.1)]
    pub warmup_ratio: f64,
    /// AdamW weight decay.
    #[arg(long, default_value_t = 0.0)]
    pub weight_decay: f64,
    /// Gradient-norm clipping (0: off).
    #[arg(long, default_value_t = 1.0)]
    pub max_grad_norm: f64,
    /// Seed of the pairs' order.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub lora: super::LoraArgs,
    /// Checkpoint every this many optimiser steps (and at the end).
    #[arg(long, default_value_t = 50)]
    pub checkpoint_every: usize,
    /// Step-labelled input: a step with a soft (Monte Carlo) label is chosen from this value up.
    #[arg(long, default_value_t = 0.5)]
    pub chosen_min: f32,
    /// Text after each step (in the prompt and the completions; Step-DPO's
    /// `initial_reason_steps` is split at it).
    #[arg(long, default_value = "\n")]
    pub separator: String,
    /// Wrap the question in the tokenizer's chat template.
    #[arg(long)]
    pub chat: bool,
    /// What loaded models compute in.
    #[command(flatten)]
    pub dtype: super::backend::DtypeArg,
    /// Where the policy trains and the reference runs.
    #[command(flatten)]
    pub device: super::backend::DeviceArgs,
    /// Which trainer updates it.
    #[command(flatten)]
    pub trainer: super::backend::TrainerArg,
}

const DPO_HELP: &str =
    "For each pair, with Δ = (log π(chosen) − log π_ref(chosen)) − (log π(rejected) − log π_ref(rejected))
summed over the completion's tokens, the loss is −(1−ε)·log σ(βΔ) − ε·log σ(−βΔ) (DPO; ε > 0 is
conservative DPO, for pairs some of which are wrong), plus --rpo-alpha times the chosen completions'
mean negative log-likelihood a token (RPO). The reference is the starting policy, its
log-probabilities taken once. With step pairs (`stepwise pairs`) the completions are single steps
after a shared prefix: Step-DPO.

Pairs are laid out as `stepwise rl` lays out its prompts: the question (in the chat template with
--chat), then each prefix step and --separator; a completion is its text and --separator, or the
end token where it ended its solution (`chosen_ends`/`rejected_ends`). TRL's layout keeps its
`prompt` text as it stands. Each completion is encoded on its own, as TRL's DPOTrainer does.

Writes the policy to --out in Hugging Face layout every --checkpoint-every steps and at the end
(with the optimiser), dpo_log.jsonl (one line per step: loss, reward accuracy and margin, chosen
and rejected rewards and log-probabilities, TRL's names in docs/commands.md) and dpo.png/dpo.svg;
the same command on the same --out resumes after an interruption. --device and --trainer as for
`stepwise rl`.

Examples:
  stepwise pairs labels.jsonl pairs.jsonl && \\
      stepwise dpo --policy fixtures/hf-tiny/qwen2-policy --pairs pairs.jsonl --out dpo-run/
  stepwise dpo --policy POLICY --pairs math_step_dpo_10k.parquet --chat --epochs 8 --lr 5e-7 \\
      --beta 0.4 --out step-dpo/";

/// The pairs of `path`, said on stderr as read.
fn read(path: &Path, a: &Args) -> Result<Vec<PreferencePair>> {
    let (pairs, origin) = read_preference_pairs(path, a.chosen_min, &a.separator)?;
    let how = match origin {
        Origin::Pairs(layout) => format!("{layout} layout"),
        Origin::Mined(s) => format!(
            "mined from {} step-labelled records; {} of {} wrong steps had no right step beside them",
            s.records, s.without_chosen, s.wrong_steps
        ),
    };
    eprintln!("{}: {} pairs ({how})", path.display(), pairs.len());
    if pairs.is_empty() {
        anyhow::bail!("{}: no preference pairs", path.display());
    }
    Ok(pairs)
}

pub fn run(a: Args) -> Result<()> {
    a.dtype.apply();
    let cfg = DpoConfig {
        beta: a.beta,
        label_smoothing: a.label_smoothing,
        rpo_alpha: a.rpo_alpha,
        epochs: a.epochs,
        batch_size: a.batch_size,
        minibatch_size: a.minibatch_size,
        lr: a.lr,
        warmup_ratio: a.warmup_ratio,
        weight_decay: a.weight_decay,
        max_grad_norm: a.max_grad_norm,
        seed: a.seed,
        checkpoint_every: a.checkpoint_every,
        lora: a.lora.config(a.seed),
    };
    cfg.check()?;
    stepwise_core::pairs::check_chosen_min("--chosen-min", a.chosen_min).map_err(anyhow::Error::msg)?;
    let pairs = read(&a.pairs, &a)?;
    let eval = a
        .eval_pairs
        .as_deref()
        .map(|p| read(p, &a))
        .transpose()?
        .unwrap_or_default();
    let steps = cfg.steps_per_epoch(pairs.len()) * cfg.epochs;
    let bar = crate::progress::bar(Some(steps as u64), "DPO");
    let log = run_dpo(
        DpoJob {
            policy: &a.policy,
            pairs: &pairs,
            eval: &eval,
            chat: a.chat,
            separator: a.separator.clone(),
            out: &a.out,
            placement: a.device.device,
            trainer: a.trainer.get()?,
            max_batch_tokens: a.device.max_batch_tokens,
        },
        &cfg,
        |l| {
            bar.set_length(l.steps as u64);
            bar.set_position(l.step as u64);
            bar.set_message(format!(
                "loss {:.4} reward acc {:.2} margin {:.3}",
                l.train.loss, l.train.accuracy, l.train.margin
            ));
        },
    )
    .with_context(|| format!("DPO into {}", a.out.display()))?;
    bar.finish_and_clear();
    report(&a.out, &log);
    Ok(())
}

/// The curves plotted into `out/dpo.*` and the run's figures on stderr.
fn report(out: &Path, log: &[DpoLog]) {
    let series = |f: &dyn Fn(&stepwise_rl::DpoStats) -> f64| -> Vec<(String, Vec<(f64, f64)>)> {
        let mut s = vec![(
            "train".to_string(),
            log.iter().map(|l| (l.step as f64, f(&l.train))).collect(),
        )];
        let eval: Vec<(f64, f64)> = log
            .iter()
            .filter_map(|l| Some((l.step as f64, f(l.eval.as_ref()?))))
            .collect();
        if !eval.is_empty() {
            s.push(("held-out pairs".to_string(), eval));
        }
        s
    };
    let plotted = stepwise_eval::plot::panels_plot(
        &out.join("dpo"),
        "DPO",
        "optimiser step",
        &[
            ("loss".into(), series(&|s| s.loss)),
            (
                "reward accuracy (chosen above rejected)".into(),
                series(&|s| s.accuracy),
            ),
            ("reward margin".into(), series(&|s| s.margin)),
            (
                "rewards (β·log π/π_ref)".into(),
                vec![
                    (
                        "chosen".into(),
                        log.iter().map(|l| (l.step as f64, l.train.chosen_reward)).collect(),
                    ),
                    (
                        "rejected".into(),
                        log.iter().map(|l| (l.step as f64, l.train.rejected_reward)).collect(),
                    ),
                ],
            ),
        ],
    );
    if let Err(e) = plotted {
        eprintln!("plot skipped: {e}");
    }
    let Some(last) = log.last() else { return };
    let first = &log[0];
    let held_out = last
        .eval
        .map(|e| {
            format!(
                "; held-out pairs: loss {:.4}, reward accuracy {:.3}",
                e.loss, e.accuracy
            )
        })
        .unwrap_or_default();
    eprintln!(
        "{} steps ({:.2} epochs, {} tokens learned): loss {:.4} -> {:.4}, reward accuracy {:.3} -> {:.3}{held_out}; policy in {}",
        log.len(),
        last.epoch,
        last.tokens,
        first.train.loss,
        last.train.loss,
        first.train.accuracy,
        last.train.accuracy,
        out.display()
    );
}
