//! DPO (Rafailov et al. 2023) on preference pairs, and with pairs of single steps after a shared
//! prefix, Step-DPO (Lai et al. 2024): the policy learns to raise the chosen completion's
//! likelihood over the rejected one's, relative to a frozen reference (the starting policy),
//! with no reward model and no sampling.
//!
//! For a pair, with `Δ = (log π(c) − log π_ref(c)) − (log π(r) − log π_ref(r))` summed over the
//! completions' tokens, the loss is `−(1−ε) log σ(βΔ) − ε log σ(−βΔ)` (`ε` = label smoothing,
//! conservative DPO for noisy pairs; 0 is DPO), plus `α` times the chosen completions' mean
//! negative log-likelihood a token where `rpo_alpha` is set (RPO). The log names TRL's: `rewards/chosen` is
//! `β (log π(c) − log π_ref(c))`, `rewards/accuracies` the share of pairs whose chosen reward
//! is the larger.
//!
//! The reference's log-probabilities are taken once, before the first step; a reference the run
//! owns ([`Frozen::Owned`]) is then let go, so training holds the policy's weights once, and a
//! learner training LoRA's adapters reads them from its own frozen base ([`Frozen::Base`]). The
//! pairs are shuffled each epoch (seeded); every `batch_size` pairs make one optimiser step, in
//! passes of `minibatch_size` pairs. A checkpoint every `checkpoint_every` steps; a run started again on
//! the same folder continues from it to the same weights.

use crate::learner::Learner;
use crate::updates::{commit, write_checkpoint};
use anyhow::{bail, Context, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;
use stepwise_core::preference::{PairPrompt, PreferencePair};
use stepwise_model::log_ratio::sequence_logprobs;
use stepwise_model::packed_engine::LoraConfig;
use stepwise_model::train::optim::schedule;
use stepwise_model::{Model, Prompt, Tokenizer};

/// DPO's settings (names as TRL's `DPOConfig` where they exist).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DpoConfig {
    /// `β`: how far the policy may move from the reference (TRL: 0.1).
    pub beta: f32,
    /// `ε`: the assumed share of pairs whose preference is wrong (conservative DPO; 0 is DPO).
    pub label_smoothing: f32,
    /// Weight of the chosen completions' negative log-likelihood added to the loss (RPO, Pang et
    /// al. 2024; TRL's `rpo_alpha`): it keeps DPO from lowering the chosen completions'
    /// likelihood along with the rejected ones' (0: DPO alone).
    #[serde(default)]
    pub rpo_alpha: f32,
    /// Passes over the pairs.
    pub epochs: usize,
    /// Pairs per optimiser step.
    pub batch_size: usize,
    /// Pairs per forward and backward pass (their gradients add up to one step).
    pub minibatch_size: usize,
    /// Peak learning rate (AdamW: linear warm-up, then cosine decay to a tenth).
    pub lr: f64,
    /// Share of the steps spent warming up.
    pub warmup_ratio: f64,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f64,
    /// Gradient-norm clipping (0: off).
    pub max_grad_norm: f64,
    /// Seed of the pairs' order.
    pub seed: u64,
    /// Checkpoint every this many optimiser steps (0: only at the end).
    pub checkpoint_every: usize,
    /// LoRA: the policy frozen and low-rank adapters trained ([`crate::RlConfig::lora`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraConfig>,
}

impl Default for DpoConfig {
    fn default() -> Self {
        DpoConfig {
            beta: 0.1,
            label_smoothing: 0.0,
            rpo_alpha: 0.0,
            epochs: 1,
            batch_size: 16,
            minibatch_size: 8,
            lr: 1e-6,
            warmup_ratio: 0.1,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
            seed: 0,
            checkpoint_every: 50,
            lora: None,
        }
    }
}

impl DpoConfig {
    /// Settings no run can train with, refused before any work, named as the command line names
    /// them.
    pub fn check(&self) -> Result<()> {
        if !(self.lr.is_finite() && self.lr > 0.0) {
            bail!("--lr {}: the learning rate must be a positive number", self.lr);
        }
        if !(self.beta.is_finite() && self.beta > 0.0) {
            bail!("--beta {}: a positive number", self.beta);
        }
        if !(0.0..0.5).contains(&self.label_smoothing) {
            bail!(
                "--label-smoothing {}: from 0 up to (not including) 0.5",
                self.label_smoothing
            );
        }
        if !(self.rpo_alpha.is_finite() && self.rpo_alpha >= 0.0) {
            bail!("--rpo-alpha {}: a number from 0 up", self.rpo_alpha);
        }
        if !(0.0..=1.0).contains(&self.warmup_ratio) {
            bail!("--warmup-ratio {}: from 0 to 1", self.warmup_ratio);
        }
        if self.epochs == 0 || self.batch_size == 0 || self.minibatch_size == 0 {
            bail!("--epochs, --batch-size and --minibatch-size: each at least 1");
        }
        Ok(())
    }

    /// Optimiser steps an epoch over `pairs` pairs makes.
    pub fn steps_per_epoch(&self, pairs: usize) -> usize {
        pairs.div_ceil(self.batch_size.max(1))
    }
}

/// A pair as token ids: the prompt and each completion, and where the completion starts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenPair {
    /// The pair's id.
    pub id: String,
    /// Prompt and chosen completion.
    pub chosen: Vec<u32>,
    /// Prompt and rejected completion.
    pub rejected: Vec<u32>,
    /// The prompt's length: the completions' first position.
    pub from: usize,
}

/// `pair` as the policy reads it: its prompt laid out by `prompt` (a text prompt encoded as it
/// stands), each completion encoded on its own (as TRL does) followed by the separator, or by
/// `end` (the end token) where it ended its solution.
pub fn tokenize_pair(
    tok: &Tokenizer,
    prompt: Prompt,
    separator: &str,
    end: u32,
    pair: &PreferencePair,
) -> Result<TokenPair> {
    let ids = match &pair.prompt {
        PairPrompt::Steps { question, prefix } => {
            let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
            prompt.ids(tok, separator, question, &prefix)?
        }
        PairPrompt::Text(text) => tok.encode(text, true)?,
    };
    let sep = tok.encode(separator, false)?;
    let complete = |text: &str, ends: bool| -> Result<Vec<u32>> {
        let mut full = ids.clone();
        full.extend(tok.encode(text, false)?);
        match ends {
            true => full.push(end),
            false => full.extend(&sep),
        }
        Ok(full)
    };
    let (chosen, rejected) = (
        complete(&pair.chosen, pair.chosen_ends)?,
        complete(&pair.rejected, pair.rejected_ends)?,
    );
    if ids.is_empty() {
        bail!("pair `{}`: an empty prompt", pair.id);
    }
    Ok(TokenPair {
        id: pair.id.clone(),
        from: ids.len(),
        chosen,
        rejected,
    })
}

/// What DPO saw over some pairs (means over them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct DpoStats {
    /// The loss.
    pub loss: f64,
    /// Share of pairs whose chosen reward exceeds the rejected one's (`rewards/accuracies`).
    pub accuracy: f64,
    /// Chosen reward minus rejected reward (`rewards/margins`).
    pub margin: f64,
    /// `β (log π(c) − log π_ref(c))` (`rewards/chosen`).
    pub chosen_reward: f64,
    /// `β (log π(r) − log π_ref(r))` (`rewards/rejected`).
    pub rejected_reward: f64,
    /// The chosen completions' log-probability under the policy (`logps/chosen`).
    pub chosen_logp: f64,
    /// The rejected ones' (`logps/rejected`).
    pub rejected_logp: f64,
    /// The chosen completions' mean negative log-likelihood a token (TRL's `nll_loss`).
    #[serde(default)]
    pub chosen_nll: f64,
}

/// One optimiser step's log.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DpoLog {
    /// Steps done (1-based).
    pub step: usize,
    /// Epochs done, fractional.
    pub epoch: f64,
    /// Steps the run makes in all.
    pub steps: usize,
    /// The learning rate of the step.
    pub lr: f64,
    /// The step's pairs, before the step.
    pub train: DpoStats,
    /// Tokens learned from so far (completions of both sides, all steps).
    pub tokens: usize,
    /// Seconds the step took.
    pub seconds: f64,
    /// The held-out pairs after the step, at the end of each epoch where there are any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval: Option<DpoStats>,
}

/// One pair's loss, its derivatives by the chosen and the rejected completion's summed
/// log-probabilities, and the two rewards: `policy` and `reference` are `(chosen, rejected)`.
pub fn dpo_pair(policy: (f64, f64), reference: (f64, f64), beta: f64, smoothing: f64) -> (f64, f64, f64, (f64, f64)) {
    let rewards = (beta * (policy.0 - reference.0), beta * (policy.1 - reference.1));
    let z = rewards.0 - rewards.1;
    // −log σ(z) = softplus(−z), computed without overflow.
    let softplus = |x: f64| x.max(0.0) + (-x.abs()).exp().ln_1p();
    let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
    let loss = (1.0 - smoothing) * softplus(-z) + smoothing * softplus(z);
    let dz = -(1.0 - smoothing) * sigmoid(-z) + smoothing * sigmoid(z);
    (loss, dz * beta, -dz * beta, rewards)
}

/// The summed completion log-probability of each of `seqs` (token log-probabilities from `from`).
fn sums(logps: &[Vec<f32>], from: &[usize]) -> Vec<f64> {
    logps
        .iter()
        .zip(from)
        .map(|(l, &f)| l.iter().skip(f.max(1)).map(|&x| x as f64).sum())
        .collect()
}

/// Each pair's two sequences, chosen then rejected, with where learning starts.
fn sequences<'p>(pairs: &[&'p TokenPair]) -> Vec<(&'p [u32], usize)> {
    pairs
        .iter()
        .flat_map(|p| [(p.chosen.as_slice(), p.from), (p.rejected.as_slice(), p.from)])
        .collect()
}

/// The stats of pairs whose summed log-probabilities are `policy` and `reference` (chosen,
/// rejected, chosen, …) over `lens` learned tokens each, and each sequence's derivative of the
/// pairs' mean loss by each of its tokens' log-probabilities: the DPO term's, and on the chosen
/// side RPO's negative log-likelihood term's (`rpo_alpha` × the chosen tokens' mean NLL).
fn stats_of(policy: &[f64], reference: &[f64], lens: &[usize], cfg: &DpoConfig) -> (DpoStats, Vec<f64>) {
    let n = policy.len() / 2;
    let m = n.max(1) as f64;
    let chosen_tokens = (0..n).map(|k| lens[2 * k]).sum::<usize>().max(1) as f64;
    let mut s = DpoStats::default();
    let mut grads = Vec::with_capacity(policy.len());
    for k in 0..n {
        let (p, r) = (
            (policy[2 * k], policy[2 * k + 1]),
            (reference[2 * k], reference[2 * k + 1]),
        );
        let (loss, dc, dr, (rc, rr)) = dpo_pair(p, r, cfg.beta as f64, cfg.label_smoothing as f64);
        s.loss += loss / m;
        s.accuracy += f64::from(u8::from(rc > rr)) / m;
        s.margin += (rc - rr) / m;
        s.chosen_reward += rc / m;
        s.rejected_reward += rr / m;
        s.chosen_logp += p.0 / m;
        s.rejected_logp += p.1 / m;
        s.chosen_nll -= p.0 / chosen_tokens;
        grads.extend([dc / m - cfg.rpo_alpha as f64 / chosen_tokens, dr / m]);
    }
    s.loss += cfg.rpo_alpha as f64 * s.chosen_nll;
    (s, grads)
}

/// The frozen starting policy a DPO run compares against.
pub enum Frozen<'a> {
    /// Shared with the caller, who keeps it.
    Shared(&'a Model),
    /// The run's own: let go once its log-probabilities are taken, before the first step (a
    /// 0.5B policy's bf16 weights are 1.2 GiB that training no longer holds beside its own).
    Owned(Box<Model>),
    /// The learner's frozen base, its LoRA adapters switched off for the pass
    /// ([`Learner::base_logprobs`]; TRL with PEFT does the same): never a second copy.
    Base,
}

impl Frozen<'_> {
    /// The model, where the reference is one of its own.
    pub fn model(&self) -> Option<&Model> {
        match self {
            Frozen::Shared(m) => Some(m),
            Frozen::Owned(m) => Some(m),
            Frozen::Base => None,
        }
    }
}

/// Everything a DPO run works on.
pub struct DpoRun<'a> {
    /// The policy being trained.
    pub learner: &'a mut dyn Learner,
    /// The frozen starting policy.
    pub reference: Frozen<'a>,
    /// The training pairs.
    pub pairs: &'a [TokenPair],
    /// Held-out pairs, measured at the end of each epoch (may be empty).
    pub eval: &'a [TokenPair],
    /// Checkpoint folder (resumed from when it holds one).
    pub out_dir: Option<PathBuf>,
}

const STATE: &str = "dpo_state.json";

#[derive(Serialize, Deserialize)]
struct State {
    config: DpoConfig,
    /// A fingerprint of the pairs' tokens: a resume on other pairs is refused.
    pairs: String,
    log: Vec<DpoLog>,
}

/// Train `run.learner` with DPO on `run.pairs` (module docs); `on_step` sees each step's log.
/// Returns every step's log (a resumed run's earlier steps included).
pub fn train_dpo(run: DpoRun<'_>, cfg: &DpoConfig, mut on_step: impl FnMut(&DpoLog)) -> Result<Vec<DpoLog>> {
    cfg.check()?;
    if run.pairs.is_empty() {
        bail!("no preference pairs to train on");
    }
    let DpoRun {
        learner,
        reference,
        pairs,
        eval,
        out_dir,
    } = run;
    let fingerprint = stepwise_core::journal::fingerprint(pairs)?;
    let mut log = resume(learner, out_dir.as_deref(), cfg, &fingerprint)?;
    let per_epoch = cfg.steps_per_epoch(pairs.len());
    let total = per_epoch * cfg.epochs;
    let warmup = (cfg.warmup_ratio * total as f64).round() as usize;
    if log.len() >= total {
        // A finished run, read back: no reference pass.
        return Ok(log);
    }
    let ref_train = reference_sums(&reference, learner, pairs, cfg.minibatch_size)?;
    let ref_eval = reference_sums(&reference, learner, eval, cfg.minibatch_size)?;
    drop(reference);
    let mut tokens = log.last().map_or(0, |l| l.tokens);
    for step in log.len()..total {
        let start = Instant::now();
        let (epoch, k) = (step / per_epoch, step % per_epoch);
        let mut order: Vec<usize> = (0..pairs.len()).collect();
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(
            cfg.seed ^ (epoch as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        ));
        let batch = &order[k * cfg.batch_size..((k + 1) * cfg.batch_size).min(pairs.len())];
        let lr = schedule(step, cfg.lr, warmup, total);
        let mut seen = Vec::new();
        let micro: Vec<&[usize]> = batch.chunks(cfg.minibatch_size).collect();
        for mb in &micro {
            let chosen: Vec<&TokenPair> = mb.iter().map(|&i| &pairs[i]).collect();
            let refs: Vec<f64> = mb
                .iter()
                .flat_map(|&i| [ref_train[2 * i], ref_train[2 * i + 1]])
                .collect();
            seen.push(backward_pairs(learner, &chosen, &refs, cfg)?);
            tokens += chosen
                .iter()
                .map(|p| p.chosen.len() + p.rejected.len() - 2 * p.from)
                .sum::<usize>();
        }
        learner.step(lr, cfg.weight_decay, cfg.max_grad_norm, micro.len())?;
        let last_of_epoch = k + 1 == per_epoch;
        let entry = DpoLog {
            step: step + 1,
            epoch: (step + 1) as f64 / per_epoch as f64,
            steps: total,
            lr,
            train: weighted_mean(&seen),
            tokens,
            seconds: start.elapsed().as_secs_f64(),
            eval: match last_of_epoch && !eval.is_empty() {
                true => Some(measure(learner, eval, &ref_eval, cfg)?),
                false => None,
            },
        };
        on_step(&entry);
        log.push(entry);
        let last = step + 1 == total;
        if last || (cfg.checkpoint_every > 0 && (step + 1) % cfg.checkpoint_every == 0) {
            if let Some(dir) = &out_dir {
                let state = State {
                    config: cfg.clone(),
                    pairs: fingerprint.clone(),
                    log: log.clone(),
                };
                write_checkpoint(dir, STATE, &state, |staging| learner.save(staging))?;
            }
        }
    }
    Ok(log)
}

/// The log of a checkpoint in `dir`, its weights loaded into `learner` (empty where none).
fn resume(learner: &mut dyn Learner, dir: Option<&Path>, cfg: &DpoConfig, fingerprint: &str) -> Result<Vec<DpoLog>> {
    let Some(dir) = dir else { return Ok(Vec::new()) };
    commit(dir)?;
    let path = dir.join(STATE);
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let state: State = serde_json::from_str(&text).with_context(|| format!("{}: invalid", path.display()))?;
    if state.config != *cfg {
        bail!(
            "{} was started with other DPO settings: use another folder, or delete it to start over",
            dir.display()
        );
    }
    if state.pairs != fingerprint {
        bail!(
            "{} was started on other pairs (or another prompt layout): use another folder, or delete it to start over",
            dir.display()
        );
    }
    learner.load(dir)?;
    Ok(state.log)
}

/// The reference's summed completion log-probabilities of `pairs` (chosen, rejected, …): its
/// own model's, or the `learner`'s frozen base's.
fn reference_sums(
    reference: &Frozen<'_>,
    learner: &mut dyn Learner,
    pairs: &[TokenPair],
    minibatch: usize,
) -> Result<Vec<f64>> {
    let (sums, _) = completion_sums(pairs, |ids| match reference.model() {
        Some(model) => sequence_logprobs(model, ids, 2 * minibatch, stepwise_model::DEFAULT_MAX_BATCH_TOKENS),
        None => learner.base_logprobs(ids),
    })?;
    Ok(sums)
}

/// Each of `pairs`' sequences (chosen, rejected, …) as `logprobs` scores them: its completion's
/// summed log-probability and its learned tokens.
fn completion_sums(
    pairs: &[TokenPair],
    logprobs: impl FnOnce(&[&[u32]]) -> Result<Vec<Vec<f32>>>,
) -> Result<(Vec<f64>, Vec<usize>)> {
    let refs: Vec<&TokenPair> = pairs.iter().collect();
    let seqs = sequences(&refs);
    let ids: Vec<&[u32]> = seqs.iter().map(|&(s, _)| s).collect();
    let from: Vec<usize> = seqs.iter().map(|&(_, f)| f).collect();
    let lens: Vec<usize> = seqs.iter().map(|&(s, f)| s.len() - f.max(1)).collect();
    Ok((sums(&logprobs(&ids)?, &from), lens))
}

/// The gradients of `pairs`' mean loss added to the learner's; returns what it saw and how
/// many pairs.
fn backward_pairs(
    learner: &mut dyn Learner,
    pairs: &[&TokenPair],
    reference: &[f64],
    cfg: &DpoConfig,
) -> Result<(DpoStats, usize)> {
    let seqs = sequences(pairs);
    let lens: Vec<usize> = seqs.iter().map(|&(s, f)| s.len() - f.max(1)).collect();
    let mut seen = DpoStats::default();
    let mut loss = |logp: &[f32]| -> Result<(f32, Vec<f32>)> {
        anyhow::ensure!(
            logp.len() == lens.iter().sum::<usize>(),
            "one log-probability a learned token"
        );
        let mut at = 0;
        let policy: Vec<f64> = lens
            .iter()
            .map(|&n| {
                at += n;
                logp[at - n..at].iter().map(|&x| x as f64).sum()
            })
            .collect();
        let (stats, grads) = stats_of(&policy, reference, &lens, cfg);
        seen = stats;
        let derivative = lens
            .iter()
            .zip(&grads)
            .flat_map(|(&n, &g)| std::iter::repeat_n(g as f32, n))
            .collect();
        Ok((stats.loss as f32, derivative))
    };
    learner.backward_tokens(&seqs, &mut loss)?;
    Ok((seen, pairs.len()))
}

/// The mean of the minibatches' stats, weighted by their pairs.
fn weighted_mean(parts: &[(DpoStats, usize)]) -> DpoStats {
    let n = parts.iter().map(|(_, k)| k).sum::<usize>().max(1) as f64;
    let mut m = DpoStats::default();
    for (s, k) in parts {
        let w = *k as f64 / n;
        m.loss += w * s.loss;
        m.accuracy += w * s.accuracy;
        m.margin += w * s.margin;
        m.chosen_reward += w * s.chosen_reward;
        m.rejected_reward += w * s.rejected_reward;
        m.chosen_logp += w * s.chosen_logp;
        m.rejected_logp += w * s.rejected_logp;
        m.chosen_nll += w * s.chosen_nll;
    }
    m
}

/// `pairs` measured under the learner's policy now.
fn measure(learner: &mut dyn Learner, pairs: &[TokenPair], reference: &[f64], cfg: &DpoConfig) -> Result<DpoStats> {
    let (policy, lens) = completion_sums(pairs, |ids| learner.logprobs(ids, 2 * cfg.minibatch_size))?;
    Ok(stats_of(&policy, reference, &lens, cfg).0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The derivative by each token's log-probability of the mean loss over two pairs, DPO's and
    /// RPO's terms with label smoothing, against central differences of the loss itself.
    #[test]
    fn each_tokens_derivative_is_the_losss() {
        let cfg = DpoConfig {
            beta: 0.3,
            label_smoothing: 0.1,
            rpo_alpha: 0.7,
            ..Default::default()
        };
        // Four sequences (chosen, rejected, chosen, rejected) of 3, 2, 1 and 4 learned tokens.
        let lens = [3usize, 2, 1, 4];
        let tokens: Vec<f64> = vec![-0.5, -1.25, -2.0, -0.75, -3.0, -0.25, -1.0, -0.5, -2.5, -0.125];
        let reference = [-4.0, -3.5, -0.5, -4.5];
        let loss_and_grads = |t: &[f64]| {
            let mut at = 0;
            let sums: Vec<f64> = lens
                .iter()
                .map(|&n| {
                    at += n;
                    t[at - n..at].iter().sum()
                })
                .collect();
            stats_of(&sums, &reference, &lens, &cfg)
        };
        let (stats, grads) = loss_and_grads(&tokens);
        assert!(
            (stats.chosen_nll - (3.75 + 0.25) / 4.0).abs() < 1e-12,
            "{}",
            stats.chosen_nll
        );
        let per_token: Vec<f64> = lens
            .iter()
            .zip(&grads)
            .flat_map(|(&n, &g)| std::iter::repeat_n(g, n))
            .collect();
        for (i, want) in per_token.iter().enumerate() {
            let h = 1e-6;
            let (mut up, mut down) = (tokens.clone(), tokens.clone());
            up[i] += h;
            down[i] -= h;
            let numeric = (loss_and_grads(&up).0.loss - loss_and_grads(&down).0.loss) / (2.0 * h);
            assert!((numeric - want).abs() < 1e-6, "token {i}: {numeric} against {want}");
        }
    }
}
