//! A DPO run as `stepwise dpo` and Python's `stepwise.dpo` start it: a policy checkpoint
//! folder, preference pairs ([`stepwise_core::preference`]), an output folder and a device. It
//! loads the policy where the device and the trainer say (as [`crate::run_rl`] does), lays the
//! pairs out as the policy reads its prompts, runs [`train_dpo`] (resuming from the folder's
//! checkpoint), and leaves the policy (Hugging Face layout), the optimiser and `dpo_log.jsonl`
//! in the folder.

use crate::dpo::{tokenize_pair, train_dpo, DpoConfig, DpoLog, DpoRun, Frozen, TokenPair};
use crate::job::TrainedPolicy;
use anyhow::{Context, Result};
use std::path::Path;
use stepwise_core::preference::PreferencePair;
use stepwise_model::train::run::Trainer;
use stepwise_model::{ModelConfig, Placement, Prompt, Tokenizer};

/// A DPO run, as the front ends describe it.
pub struct DpoJob<'a> {
    /// The starting policy's checkpoint folder (also the reference).
    pub policy: &'a Path,
    /// The training pairs.
    pub pairs: &'a [PreferencePair],
    /// Held-out pairs, measured at the end of each epoch (may be empty).
    pub eval: &'a [PreferencePair],
    /// Wrap the question in the tokenizer's chat template.
    pub chat: bool,
    /// Text after each step.
    pub separator: String,
    /// Checkpoints, the log, the trained policy; resumed from when it holds a checkpoint.
    pub out: &'a Path,
    /// Where the policy trains and the reference runs.
    pub placement: Placement,
    /// Which trainer updates the policy ([`crate::RlJob::trainer`]).
    pub trainer: Trainer,
    /// Most tokens in one pass of the packed trainer.
    pub max_batch_tokens: usize,
}

/// Run `job` with `cfg`; `on_step` sees each optimiser step's log. Returns every step's log (a
/// resumed run's earlier steps included), also written to `OUT/dpo_log.jsonl`.
pub fn run_dpo(job: DpoJob<'_>, cfg: &DpoConfig, on_step: impl FnMut(&DpoLog)) -> Result<Vec<DpoLog>> {
    cfg.check()?;
    if job.pairs.is_empty() {
        anyhow::bail!("no preference pairs to train on");
    }
    let placement = job.placement.resolve()?;
    let tok = Tokenizer::from_dir(job.policy)?;
    let trainer = (job.trainer, cfg.lora.as_ref());
    let mut policy = TrainedPolicy::load(job.policy, placement, trainer, job.max_batch_tokens, cfg.seed)?;
    // The reference: the learner's frozen base with LoRA, else the policy loaded again.
    let reference = match policy.has_base() {
        true => Frozen::Base,
        false => Frozen::Owned(Box::new(policy.reference(job.policy, placement)?)),
    };
    let config = ModelConfig::from_dir(job.policy)?;
    let end = config
        .eos_token_ids
        .first()
        .copied()
        .or_else(|| tok.eos_id())
        .with_context(|| format!("{}: the policy names no end token (eos_token_id)", job.policy.display()))?;
    let prompt = if job.chat { Prompt::Chat } else { Prompt::Text };
    let lay_out = |pairs: &[PreferencePair]| -> Result<Vec<TokenPair>> {
        pairs
            .iter()
            .map(|p| tokenize_pair(&tok, prompt, &job.separator, end, p))
            .collect()
    };
    let context = config.max_position_embeddings;
    let (pairs, eval) = (
        fitting(lay_out(job.pairs)?, context, "")?,
        fitting(lay_out(job.eval)?, context, "held-out ")?,
    );
    std::fs::create_dir_all(job.out).with_context(|| format!("creating {}", job.out.display()))?;
    stepwise_model::tokenizer::copy_files(job.policy, job.out)?;
    let log = policy.with_learner(|learner| {
        let run = DpoRun {
            learner,
            reference,
            pairs: &pairs,
            eval: &eval,
            out_dir: Some(job.out.to_path_buf()),
        };
        train_dpo(run, cfg, on_step)
    })?;
    stepwise_core::io::write_jsonl(job.out.join("dpo_log.jsonl"), &log)?;
    Ok(log)
}

/// `pairs` whose sequences fit the policy's `context` positions; the others are left out, said
/// on stderr (as TRL truncates at its `max_length`, but without training on half a step). None
/// fitting is an error.
fn fitting(pairs: Vec<TokenPair>, context: usize, what: &str) -> Result<Vec<TokenPair>> {
    let n = pairs.len();
    let kept: Vec<TokenPair> = pairs
        .into_iter()
        .filter(|p| p.chosen.len().max(p.rejected.len()) <= context)
        .collect();
    if kept.len() < n {
        eprintln!(
            "{} of {n} {what}pairs are longer than the policy's {context} positions and were left out",
            n - kept.len()
        );
        if kept.is_empty() {
            anyhow::bail!("no {what}pair fits the policy's {context} positions");
        }
    }
    Ok(kept)
}
