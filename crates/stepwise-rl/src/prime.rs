//! PRIME (Cui et al. 2025, "Process Reinforcement through Implicit Rewards"): dense rewards
//! from an implicit PRM that learns online, from outcome labels only, on the very samples RL
//! draws.
//!
//! The implicit PRM `π_φ` is a causal LM started from the policy; its reference is the RL
//! reference (the starting policy). Each completion token `y_t` is rewarded
//! `β · (log π_φ(y_t | y<t) − log π_ref(y_t | y<t))`, and the sum over a completion is read as the
//! log-odds that it is correct. Every update:
//!
//! 1. the sampled completions are scored by the implicit PRM as it stands
//!    ([`OnlinePrm::score_and_learn`]);
//! 2. the implicit PRM takes one optimiser step on the cross-entropy of each completion's summed
//!    reward against its graded outcome (the verifier's 0/1), so it tracks the policy as it moves
//!    and needs no step labels; it learns only from groups with mixed outcomes
//!    ([`PrimeConfig::accuracy_bounds`]);
//! 3. the policy's advantages combine both streams ([`prime_advantages`]): each stream gets a
//!    leave-one-out baseline over its group (RLOO), the outcome sits on the last token, every
//!    token's advantage is the sum of the rewards from it to the end (its return), and the
//!    returns are whitened over the update's tokens — PRIME's recipe as its verl
//!    implementation computes it.
//!
//! Scores come from the forward pass that also gives the gradient, so the implicit PRM costs
//! one forward and one backward pass of its model per update.

use crate::learner::Learner;
use crate::rollout::Sequence;
use anyhow::{bail, Context, Result};
use candle_core::{Tensor, Var};
use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::path::Path;
use stepwise_core::seams::{Reward, RewardKind};
use stepwise_model::checkpoint::{load_training_checkpoint, save_training_checkpoint};
use stepwise_model::log_ratio::token_logprobs;
use stepwise_model::model::pad_batch;
use stepwise_model::train::bce_with_logits;
use stepwise_model::train::optim::{accumulate, named_vars, AdamW};
use stepwise_model::train::VarMap;
use stepwise_model::Model;

/// PRIME's settings (names as in its verl recipe where they exist).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PrimeConfig {
    /// `β` of the implicit reward `β · log π_φ / π_ref` (PRIME: 0.05).
    pub beta: f32,
    /// The implicit PRM's learning rate (AdamW, constant).
    pub lr: f64,
    /// Weight of the implicit process rewards in the advantage (`reward_dpo_coef`).
    pub process_coef: f32,
    /// Weight of the outcome reward (`reward_gt_coef`).
    pub outcome_coef: f32,
    /// The implicit PRM learns only from groups whose fraction of correct samples lies within
    /// these bounds (PRIME's online prompt filter, 0.2–0.8: balanced labels). PRIME also leaves
    /// the other groups out of the policy's update; here the policy learns from every group
    /// (their outcome advantage is 0, their process advantage is not), because at an equal
    /// sampling budget dropping them left the lab's policy too few samples per update and it
    /// collapsed (docs/lab.md).
    pub accuracy_bounds: (f32, f32),
}

impl Default for PrimeConfig {
    fn default() -> Self {
        PrimeConfig {
            beta: 0.05,
            lr: 1e-5,
            process_coef: 1.0,
            outcome_coef: 1.0,
            accuracy_bounds: (0.2, 0.8),
        }
    }
}

/// The implicit PRM an RL run trains beside the policy: a causal LM with the policy's
/// vocabulary (PRIME starts it from the policy itself).
pub enum ImplicitPrm<'a> {
    /// On the CPU, through candle's autograd: a model made trainable ([`Model::load_trainable`],
    /// [`Model::fresh`]).
    Candle(&'a mut Model),
    /// Wherever a [`Learner`] trains it (a GPU's packed trainer), its loss taken on the host
    /// from its tokens' log-probabilities.
    Learner(&'a mut dyn Learner),
}

/// What the implicit PRM saw in one update, measured before it learned from the update's
/// samples (so on completions it had not seen).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PrimeLog {
    /// Mean cross-entropy of its outcome predictions.
    pub loss: f64,
    /// Fraction of completions whose outcome it predicted (summed reward above 0 exactly when
    /// graded correct).
    pub accuracy: f64,
    /// Mean implicit reward per completion token.
    pub token_reward: f64,
    /// Share of the update's groups the prompt filter kept ([`PrimeConfig::accuracy_bounds`]).
    #[serde(default)]
    pub kept_groups: f64,
}

const WEIGHTS_DIR: &str = "implicit_prm";
const OPTIM: &str = "optimizer.safetensors";

/// An implicit PRM with its optimiser, as the trainer drives it.
pub struct OnlinePrm<'a> {
    trainer: Trainer<'a>,
    /// Its settings.
    pub cfg: PrimeConfig,
}

/// Where the implicit PRM trains.
enum Trainer<'a> {
    Candle {
        model: &'a mut Model,
        varmap: VarMap,
        vars: Vec<Var>,
        opt: AdamW,
    },
    Learner(&'a mut dyn Learner),
}

impl<'a> OnlinePrm<'a> {
    /// Ready `prm` for online training.
    pub fn new(prm: ImplicitPrm<'a>, cfg: PrimeConfig) -> Result<Self> {
        let trainer = match prm {
            ImplicitPrm::Candle(model) => {
                let varmap = model
                    .varmap()
                    .context("the implicit PRM trains a model made trainable (Model::load_trainable)")?
                    .clone();
                let named = named_vars(&varmap);
                let vars = named.iter().map(|(_, v)| v.clone()).collect();
                let opt = AdamW::new(named, cfg.lr, 0.0)?;
                Trainer::Candle {
                    model,
                    varmap,
                    vars,
                    opt,
                }
            }
            ImplicitPrm::Learner(learner) => Trainer::Learner(learner),
        };
        Ok(OnlinePrm { trainer, cfg })
    }

    /// The implicit PRM of a run whose settings are `cfg` (given exactly when it is) and whose
    /// reward is `reward`, which must be an outcome (the labels it learns from).
    pub fn for_run(
        cfg: Option<PrimeConfig>,
        prm: Option<ImplicitPrm<'a>>,
        reward: &dyn Reward,
    ) -> Result<Option<Self>> {
        match (cfg, prm) {
            (Some(c), Some(prm)) if reward.kind() == RewardKind::Outcome => Ok(Some(OnlinePrm::new(prm, c)?)),
            (Some(_), Some(_)) => bail!(
                "PRIME learns from an outcome reward (the verifier's labels); `{}` is a process reward",
                reward.name()
            ),
            (None, None) => Ok(None),
            (Some(_), None) => bail!("PRIME is configured but no implicit PRM was given"),
            (None, Some(_)) => bail!("an implicit PRM was given but PRIME is not configured"),
        }
    }

    /// Where a run folder keeps the implicit PRM (Hugging Face layout, with its optimiser).
    pub fn dir(run_dir: &Path) -> std::path::PathBuf {
        run_dir.join(WEIGHTS_DIR)
    }

    /// Write the weights and optimiser state into `run_dir`'s implicit PRM folder.
    pub fn save(&self, run_dir: &Path) -> Result<()> {
        let dir = Self::dir(run_dir);
        std::fs::create_dir_all(&dir)?;
        match &self.trainer {
            Trainer::Candle { model, varmap, opt, .. } => {
                save_training_checkpoint(&dir, &model.config, varmap)?;
                opt.save(&dir.join(OPTIM))
            }
            Trainer::Learner(learner) => learner.save(&dir),
        }
    }

    /// Restore what [`OnlinePrm::save`] wrote.
    pub fn load(&mut self, run_dir: &Path) -> Result<()> {
        let dir = Self::dir(run_dir);
        match &mut self.trainer {
            Trainer::Candle { varmap, opt, .. } => {
                load_training_checkpoint(varmap, &dir)?;
                opt.load(&dir.join(OPTIM))
            }
            Trainer::Learner(learner) => learner.load(&dir),
        }
    }

    /// Score every completion token of `seqs` (`β · (log π_φ − log π_ref)`, 0 on the prompt;
    /// the reference's log-probabilities are the sequences' own) and take one optimiser step on
    /// the cross-entropy of each completion's summed reward against its outcome (`outcomes`: 1
    /// correct, 0 wrong), learning from the `groups` (each prompt's completions) that pass
    /// [`PrimeConfig::keeps`]. The scores are those before the step. `minibatch` sequences go
    /// through the model at a time; their gradients add up to one step, clipped to
    /// `max_grad_norm` (0: off). The log's loss and accuracy are over the completions learned
    /// from.
    pub fn score_and_learn(
        &mut self,
        seqs: &[Sequence],
        outcomes: &[f32],
        groups: &[Range<usize>],
        minibatch: usize,
        max_grad_norm: f64,
    ) -> Result<(Vec<Vec<f32>>, PrimeLog)> {
        if seqs.len() != outcomes.len() || groups.iter().any(|g| g.end > seqs.len()) {
            bail!(
                "{} sequences, {} outcomes and groups reaching past them",
                seqs.len(),
                outcomes.len()
            );
        }
        // PRIME's prompt filter: it learns from groups with mixed outcomes.
        let mut learn = vec![false; seqs.len()];
        let kept = groups.iter().filter(|g| self.cfg.keeps(&outcomes[(*g).clone()]));
        let mut kept_groups = 0;
        for g in kept {
            learn[g.clone()].fill(true);
            kept_groups += 1;
        }
        let mut rewards: Vec<Vec<f32>> = seqs.iter().map(|s| vec![0.0; s.ids.len()]).collect();
        // Completions with at least one token: the ones scored.
        let scored: Vec<usize> = (0..seqs.len())
            .filter(|&i| seqs[i].ids.len() > seqs[i].learn_from)
            .collect();
        if let Some(i) = scored
            .iter()
            .find(|&&i| seqs[i].ref_logprobs.len() != seqs[i].ids.len())
        {
            bail!("the implicit PRM needs the reference log-probabilities of every token (sequence {i})");
        }
        let learned = scored.iter().filter(|&&i| learn[i]).count();
        let batch = Completions {
            seqs,
            outcomes,
            learn,
            scored,
            learned,
            beta: self.cfg.beta,
            minibatch: minibatch.max(1),
        };
        let mut seen = Seen::default();
        match &mut self.trainer {
            Trainer::Candle { model, vars, opt, .. } => {
                let grads = candle_score_and_learn(model, vars, &batch, &mut rewards, &mut seen)?;
                if let Some(grads) = grads {
                    let mut scale = 1.0;
                    if max_grad_norm > 0.0 {
                        let norm = opt.grad_norm(&grads)?;
                        if norm > max_grad_norm {
                            scale = max_grad_norm / norm;
                        }
                    }
                    opt.step(&grads, scale)?;
                }
            }
            Trainer::Learner(learner) => {
                learner_score_and_learn(&mut **learner, &batch, &mut rewards, &mut seen)?;
                if learned > 0 {
                    learner.step(self.cfg.lr, 0.0, max_grad_norm, 1)?;
                }
            }
        }
        Ok((
            rewards,
            PrimeLog {
                loss: seen.loss,
                accuracy: seen.right as f64 / learned.max(1) as f64,
                token_reward: seen.reward / seen.tokens.max(1) as f64,
                kept_groups: kept_groups as f64 / groups.len().max(1) as f64,
            },
        ))
    }
}

/// One update's completions as the implicit PRM scores them and learns from them.
struct Completions<'s> {
    seqs: &'s [Sequence],
    /// Each sequence's outcome (1 correct, 0 wrong).
    outcomes: &'s [f32],
    /// Whether each sequence is learned from (its group passed the filter).
    learn: Vec<bool>,
    /// The sequences with at least one completion token, in order.
    scored: Vec<usize>,
    /// How many of those are learned from.
    learned: usize,
    beta: f32,
    /// Sequences a pass.
    minibatch: usize,
}

/// What scoring saw: the loss over the completions learned from, how many of them were predicted
/// right, the tokens scored and their summed reward.
#[derive(Default)]
struct Seen {
    loss: f64,
    right: usize,
    tokens: usize,
    reward: f64,
}

/// The candle path of [`OnlinePrm::score_and_learn`]: each minibatch's forward gives the scores
/// and, for the completions learned from, the BCE's gradient (returned, summed).
fn candle_score_and_learn(
    model: &mut Model,
    vars: &[Var],
    c: &Completions<'_>,
    rewards: &mut [Vec<f32>],
    seen: &mut Seen,
) -> Result<Option<candle_core::backprop::GradStore>> {
    let (seqs, outcomes, learn, beta) = (c.seqs, c.outcomes, &c.learn, c.beta);
    let dev = model.device.clone();
    let mut grads = None;
    model.set_training(c.learned > 0);
    for chunk in c.scored.chunks(c.minibatch) {
        let ids: Vec<&[u32]> = chunk.iter().map(|&i| seqs[i].ids.as_slice()).collect();
        let (padded, mask, t) = pad_batch(&ids, &dev)?;
        let logp = token_logprobs(model, &padded, mask.as_ref())?;
        let values: Vec<f32> = logp.to_vec1()?;
        let (mut rows, mut ref_sums, mut ys) = (Vec::new(), Vec::new(), Vec::new());
        for (b, &i) in chunk.iter().enumerate() {
            let s = &seqs[i];
            reward_tokens(
                s,
                beta,
                |p| values[b * t + p],
                &mut rewards[i],
                learn[i],
                outcomes[i],
                seen,
            );
            if learn[i] {
                rows.push((b, s));
                ref_sums.push(s.learned().map(|p| s.ref_logprobs[p]).sum::<f32>());
                ys.push(outcomes[i]);
            }
        }
        if ys.is_empty() {
            continue;
        }
        let own = learned_sums(&logp, t, &rows)?;
        let z = ((own - Tensor::new(ref_sums.as_slice(), &dev)?)? * beta as f64)?;
        let loss = bce_with_logits(&z, &Tensor::new(ys.as_slice(), &dev)?)?;
        // The chunk's share of the mean over the completions learned from.
        let share = ys.len() as f64 / c.learned as f64;
        seen.loss += loss.to_scalar::<f32>()? as f64 * share;
        let g = (loss * share)?.backward()?;
        match grads.as_mut() {
            None => grads = Some(g),
            Some(acc) => accumulate(acc, g, vars)?,
        }
    }
    model.set_training(false);
    Ok(grads)
}

/// Each row's sum of `values` (`[rows · t]`, row `b` at `b · t`) over its sequence's learned
/// positions, differentiably (one matrix product).
fn learned_sums(values: &Tensor, t: usize, rows: &[(usize, &Sequence)]) -> Result<Tensor> {
    let n = values.dim(0)?;
    let mut select = vec![0f32; rows.len() * n];
    for (k, &(b, s)) in rows.iter().enumerate() {
        for p in s.learned() {
            select[k * n + b * t + p] = 1.0;
        }
    }
    let select = Tensor::from_vec(select, (rows.len(), n), values.device())?;
    Ok(select.matmul(&values.unsqueeze(1)?)?.squeeze(1)?)
}

/// The [`Learner`] path of [`OnlinePrm::score_and_learn`]: each minibatch's log-probabilities
/// (from the backward's own forward where it learns) give the scores and the BCE's derivative by
/// each token's log-probability, taken here.
fn learner_score_and_learn(
    learner: &mut dyn Learner,
    c: &Completions<'_>,
    rewards: &mut [Vec<f32>],
    seen: &mut Seen,
) -> Result<()> {
    let (seqs, outcomes, learn, beta, learned) = (c.seqs, c.outcomes, &c.learn, c.beta, c.learned);
    for chunk in c.scored.chunks(c.minibatch) {
        if !chunk.iter().any(|&i| learn[i]) {
            let ids: Vec<&[u32]> = chunk.iter().map(|&i| seqs[i].ids.as_slice()).collect();
            for (&i, logp) in chunk.iter().zip(learner.logprobs(&ids, c.minibatch)?) {
                reward_tokens(&seqs[i], beta, |p| logp[p], &mut rewards[i], false, outcomes[i], seen);
            }
            continue;
        }
        let batch: Vec<(&[u32], usize)> = chunk
            .iter()
            .map(|&i| (seqs[i].ids.as_slice(), seqs[i].learn_from))
            .collect();
        // The BCE of each learned completion's summed reward, over all completions learned from.
        let mut loss = |logp: &[f32]| -> Result<(f32, Vec<f32>)> {
            let (mut at, mut value, mut derivative) = (0, 0.0, vec![0f32; logp.len()]);
            for &i in chunk {
                let s = &seqs[i];
                let span = at..at + s.ids.len() - s.learn_from;
                let sum = reward_tokens(
                    s,
                    beta,
                    |p| logp[span.start + p - s.learn_from],
                    &mut rewards[i],
                    learn[i],
                    outcomes[i],
                    seen,
                );
                if learn[i] {
                    let z = sum;
                    value += (z.max(0.0) - z * outcomes[i] + (-z.abs()).exp().ln_1p()) / learned as f32;
                    let d = beta * (1.0 / (1.0 + (-z).exp()) - outcomes[i]) / learned as f32;
                    s.learned().for_each(|p| derivative[span.start + p - s.learn_from] = d);
                }
                at = span.end;
            }
            Ok((value, derivative))
        };
        seen.loss += learner.backward_tokens(&batch, &mut loss)? as f64;
    }
    Ok(())
}

/// The implicit rewards of `s`'s learned tokens (its completion but the observations it read),
/// `β · (log π_φ − log π_ref)` from each position's log-probability `logp(p)`, written into
/// `rewards` (0 elsewhere) and counted in `seen` (with whether their sum predicts `outcome`, for
/// a completion `learned` from); returns their sum, the completion's log-odds of being correct.
fn reward_tokens(
    s: &Sequence,
    beta: f32,
    logp: impl Fn(usize) -> f32,
    rewards: &mut [f32],
    learned: bool,
    outcome: f32,
    seen: &mut Seen,
) -> f32 {
    let mut sum = 0.0;
    for p in s.learned() {
        rewards[p] = beta * (logp(p) - s.ref_logprobs[p]);
        sum += rewards[p];
        seen.tokens += 1;
    }
    seen.reward += sum as f64;
    if learned {
        seen.right += usize::from((sum > 0.0) == (outcome > 0.5));
    }
    sum
}

impl PrimeConfig {
    /// Whether a group with these outcomes (1 correct, 0 wrong) passes the accuracy filter.
    pub fn keeps(&self, outcomes: &[f32]) -> bool {
        let accuracy = outcomes.iter().filter(|&&o| o > 0.5).count() as f32 / outcomes.len().max(1) as f32;
        let (low, high) = self.accuracy_bounds;
        !outcomes.is_empty() && low <= accuracy && accuracy <= high
    }
}

/// PRIME's per-token advantages for `seqs` (groups of completions of one prompt each in
/// `groups`), from each token's implicit reward (`token_rewards`, aligned with the sequences'
/// tokens) and each completion's outcome reward:
///
/// - process stream: each token's reward `r` becomes `(n·r − Σ m)/(n−1)`, where `m` is each of the
///   group's `n` completions' mean token reward (verl's RLOO at token level: over a completion
///   of `L` tokens it sums to `L` times its mean minus the other completions' mean);
/// - outcome stream: on the last token, the outcome minus the other completions' mean outcome;
/// - the streams weighted by [`PrimeConfig::process_coef`] and [`PrimeConfig::outcome_coef`] and
///   added; a token's advantage is the sum from it to the end of its completion (γ = 1);
/// - whitened (mean 0, standard deviation 1) over every completion token of the update.
///
/// Only the tokens the loss learns count ([`Sequence::learned`]: in an agent's trajectory, its
/// actions, not the observations between them): the means, the outcome's place (the last
/// learned token), the returns and the whitening are over them; the rest get 0, as prompt tokens
/// do. A group of one completion has no baseline and gets 0.
pub fn prime_advantages(
    seqs: &[Sequence],
    token_rewards: &[Vec<f32>],
    outcomes: &[f32],
    groups: &[Range<usize>],
    cfg: &PrimeConfig,
) -> Vec<Vec<f32>> {
    // Each sequence's learned positions, found once.
    let learned: Vec<Vec<usize>> = seqs.iter().map(|s| s.learned().collect()).collect();
    let mut out: Vec<Vec<f32>> = seqs.iter().map(|s| vec![0.0; s.ids.len()]).collect();
    for g in groups.iter().filter(|g| g.len() >= 2) {
        let n = g.len() as f32;
        let mean_reward = |i: usize| {
            let ps = &learned[i];
            ps.iter().map(|&p| token_rewards[i][p]).sum::<f32>() / ps.len().max(1) as f32
        };
        let process_sum: f32 = g.clone().map(mean_reward).sum();
        let outcome_sum: f32 = outcomes[g.clone()].iter().sum();
        for i in g.clone() {
            let ps = &learned[i];
            for &p in ps {
                out[i][p] = cfg.process_coef * (token_rewards[i][p] * n - process_sum) / (n - 1.0);
            }
            if let Some(&last) = ps.last() {
                out[i][last] += cfg.outcome_coef * (outcomes[i] * n - outcome_sum) / (n - 1.0);
            }
            // The return: each token's reward plus every later one's.
            let mut acc = 0.0;
            for &p in ps.iter().rev() {
                acc += out[i][p];
                out[i][p] = acc;
            }
        }
    }
    // Whiten over the learned tokens.
    let all: Vec<f32> = learned
        .iter()
        .enumerate()
        .flat_map(|(i, ps)| ps.iter().map(move |&p| (i, p)))
        .map(|(i, p)| out[i][p])
        .collect();
    if all.is_empty() {
        return out;
    }
    let mean = all.iter().sum::<f32>() / all.len() as f32;
    let var = all.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / all.len() as f32;
    let scale = 1.0 / (var + 1e-8).sqrt();
    for (a, ps) in out.iter_mut().zip(&learned) {
        for &p in ps {
            a[p] = (a[p] - mean) * scale;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(prompt: usize, completion: usize) -> Sequence {
        Sequence {
            ids: vec![1; prompt + completion],
            learn_from: prompt,
            ..Default::default()
        }
    }

    #[test]
    // One group, given as the one range it is.
    #[allow(clippy::single_range_in_vec_init)]
    fn advantages_follow_prime_rloo_returns_and_whitening() {
        // One group of two: the first correct, the second wrong; no process rewards.
        let seqs = [seq(2, 3), seq(2, 2)];
        let zero: Vec<Vec<f32>> = seqs.iter().map(|s| vec![0.0; s.ids.len()]).collect();
        let cfg = PrimeConfig::default();
        let a = prime_advantages(&seqs, &zero, &[1.0, 0.0], &[0..2], &cfg);
        // Before whitening: RLOO outcome +1 and −1 on each last token, returned to every token.
        // Raw: [1, 1, 1] and [−1, −1]; mean 0.2, std sqrt(0.96).
        let std = 0.96f32.sqrt();
        for (p, want) in [(2, 0.8 / std), (3, 0.8 / std), (4, 0.8 / std)] {
            assert!((a[0][p] - want).abs() < 1e-5, "{:?}", a[0]);
        }
        assert!((a[1][2] + 1.2 / std).abs() < 1e-5);
        assert_eq!(&a[0][..2], &[0.0, 0.0], "the prompt gets nothing");

        // Process rewards only (outcomes equal): (2·r − Σ means) per token, returned.
        let rewards = vec![vec![0.0, 0.0, 1.0, 0.0], vec![0.0, 0.0, 0.0, 0.0]];
        let seqs = [seq(2, 2), seq(2, 2)];
        let cfg = PrimeConfig {
            outcome_coef: 0.0,
            ..cfg
        };
        let a = prime_advantages(&seqs, &rewards, &[1.0, 1.0], &[0..2], &cfg);
        // Means 0.5 and 0 (sum 0.5): RLOO rewards [1.5, −0.5] and [−0.5, −0.5]; returns
        // [1, −0.5] and [−1, −0.5]; whitened over four tokens.
        let raw = [1.0f32, -0.5, -1.0, -0.5];
        let m = raw.iter().sum::<f32>() / 4.0;
        let s = (raw.iter().map(|x| (x - m).powi(2)).sum::<f32>() / 4.0).sqrt();
        let got = [a[0][2], a[0][3], a[1][2], a[1][3]];
        for (g, r) in got.iter().zip(raw) {
            assert!((g - (r - m) / s).abs() < 1e-5, "{got:?}");
        }
        // An agent's trajectory: the observation (positions 3..5) is read, not written: it gets
        // no advantage, the outcome sits on the last action token, and the whitening leaves
        // it out — the same as the trajectory without the observation.
        let with_obs = |skip: bool| Sequence {
            ids: vec![1; if skip { 7 } else { 5 }],
            learn_from: 1,
            skip: if skip { vec![(3, 5)] } else { Vec::new() },
            ..Default::default()
        };
        let cfg = PrimeConfig::default();
        let (a, b) = (with_obs(true), with_obs(false));
        let r_a = vec![vec![0.0, 0.1, 0.2, 9.0, 9.0, 0.3, 0.4], vec![0.0; 7]];
        let r_b = vec![vec![0.0, 0.1, 0.2, 0.3, 0.4], vec![0.0; 5]];
        let got = prime_advantages(&[a.clone(), a.clone()], &r_a, &[1.0, 0.0], &[0..2], &cfg);
        let want = prime_advantages(&[b.clone(), b], &r_b, &[1.0, 0.0], &[0..2], &cfg);
        assert_eq!(&got[0][3..5], &[0.0, 0.0], "observations get nothing");
        for k in 0..2 {
            let learned: Vec<f32> = a.learned().map(|p| got[k][p]).collect();
            assert_eq!(learned, want[k][1..].to_vec());
        }
        // A lone completion has no baseline.
        let a = prime_advantages(&[seq(1, 2)], &[vec![0.0, 3.0, 3.0]], &[1.0], &[0..1], &cfg);
        assert_eq!(a[0], vec![0.0; 3]);
    }
}
