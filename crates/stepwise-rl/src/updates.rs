//! The update loop every RL run shares, whatever produces its samples (single-turn solutions
//! in [`crate::trainer`], an agent's multi-turn trajectories in [`crate::agent`]): choose the
//! update's prompts, have the [`Sampler`] sample and reward them with the current policy, take
//! log-probabilities under it and the reference, PRIME's advantages where configured, PPO-clip
//! steps, the log, and a checkpoint every `checkpoint_every` updates that a run started again
//! on the same folder continues from.

use crate::learner::Learner;
use crate::prime::{prime_advantages, OnlinePrm, PrimeLog};
use crate::rollout::{sequence_logprobs, Sequence};
use crate::trainer::{Reference, RlConfig, UpdateLog};
use anyhow::{bail, Context, Result};
use rand::seq::{index::sample, SliceRandom};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Instant;
use stepwise_core::Problem;
use stepwise_model::train::optim::schedule;
use stepwise_model::Model;

/// One update's samples, rewarded, with each token's advantage set.
#[derive(Default)]
pub(crate) struct Samples {
    /// The training sequences.
    pub seqs: Vec<Sequence>,
    /// Each sequence's last reward (the outcome, for an outcome reward), for PRIME.
    pub outcomes: Vec<f32>,
    /// Each prompt's sequences.
    pub groups: Vec<Range<usize>>,
    /// The sum over samples of each one's mean reward.
    pub reward_sum: f64,
    /// Samples graded correct (goals reached).
    pub correct: usize,
    /// The sum over samples of each watched reward's mean.
    pub watched: BTreeMap<String, f64>,
    /// Tokens the policy sampled.
    pub tokens: usize,
}

/// Samples the policy and rewards what it sampled.
pub(crate) trait Sampler {
    /// A group of samples of `model` for each of `chosen` (update `u`, 0-based).
    fn sample(&mut self, model: &Model, chosen: &[&Problem], u: usize) -> Result<Samples>;
    /// Whether a held-out measure is due after update `u` (`last`: the run's last update).
    fn heldout_due(&self, u: usize, last: bool) -> bool;
    /// The held-out measure of `model`.
    fn heldout(&mut self, model: &Model) -> Result<f64>;
}

/// What the loop trains.
pub(crate) struct Core<'a> {
    /// The policy, where it trains.
    pub learner: &'a mut dyn Learner,
    /// The frozen starting policy, where the run has it.
    pub reference: Reference<'a>,
    /// The prompts.
    pub problems: &'a [Problem],
    /// Checkpoint folder (resumed from when it holds one).
    pub out_dir: Option<PathBuf>,
    /// PRIME's implicit PRM, learning online.
    pub prime: Option<OnlinePrm<'a>>,
}

const STATE: &str = "rl_state.json";
/// A checkpoint being written.
const STAGING: &str = ".rl_checkpoint";
/// A checkpoint written whole, being moved into the run folder.
const STAGED: &str = ".rl_checkpoint.done";

/// Finish what [`Core::save`] started in `dir`: a checkpoint marked whole is moved in, file by
/// file (each rename replaces the file before it, so running this again after a kill finishes
/// the move); a checkpoint not marked whole is discarded.
pub(crate) fn commit(dir: &Path) -> Result<()> {
    let staging = dir.join(STAGING);
    if staging.exists() {
        std::fs::remove_dir_all(&staging).with_context(|| format!("removing {}", staging.display()))?;
    }
    let staged = dir.join(STAGED);
    if staged.exists() {
        move_into(&staged, dir).with_context(|| format!("moving the checkpoint in {} into place", staged.display()))?;
        std::fs::remove_dir_all(&staged)?;
    }
    Ok(())
}

/// Every file under `from` renamed to the same place under `to`.
fn move_into(from: &Path, to: &Path) -> Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            std::fs::create_dir_all(&target)?;
            move_into(&entry.path(), &target)?;
        } else {
            std::fs::rename(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// A checkpoint of the run in `dir`: what `save` writes and `state` (as JSON, in `state_file`)
/// go into a staging folder, which a rename marks whole before its files are moved into `dir`
/// ([`commit`]). A run killed at any point leaves the folder's weights and state from one
/// checkpoint, never a mix: a staging folder not marked whole is discarded, one marked whole is
/// moved in on resuming.
pub(crate) fn write_checkpoint<S: Serialize>(
    dir: &Path,
    state_file: &str,
    state: &S,
    save: impl FnOnce(&Path) -> Result<()>,
) -> Result<()> {
    let staging = dir.join(STAGING);
    if staging.exists() {
        std::fs::remove_dir_all(&staging).with_context(|| format!("removing {}", staging.display()))?;
    }
    std::fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
    save(&staging)?;
    std::fs::write(staging.join(state_file), serde_json::to_string_pretty(state)?)?;
    std::fs::rename(&staging, dir.join(STAGED))?;
    commit(dir)
}

#[derive(Serialize, Deserialize)]
struct State {
    config: RlConfig,
    log: Vec<UpdateLog>,
}

impl Core<'_> {
    /// The log of a checkpoint in the run folder, its weights loaded (empty where none).
    fn resume(&mut self, cfg: &RlConfig) -> Result<Vec<UpdateLog>> {
        if let Some(dir) = &self.out_dir {
            commit(dir)?;
        }
        let Some(dir) = self.out_dir.as_ref().filter(|d| d.join(STATE).exists()) else {
            return Ok(Vec::new());
        };
        let text = std::fs::read_to_string(dir.join(STATE))?;
        let state: State =
            serde_json::from_str(&text).with_context(|| format!("{}: invalid", dir.join(STATE).display()))?;
        if state.config != *cfg {
            bail!(
                "{} was started with other RL settings: use another folder, or delete it to start over",
                dir.display()
            );
        }
        self.learner.load(dir)?;
        if let Some(p) = self.prime.as_mut() {
            p.load(dir)?;
        }
        Ok(state.log)
    }

    /// A checkpoint of the weights, PRIME's and the state ([`write_checkpoint`]).
    fn save(&self, cfg: &RlConfig, log: &[UpdateLog]) -> Result<()> {
        let Some(dir) = &self.out_dir else { return Ok(()) };
        let state = State {
            config: cfg.clone(),
            log: log.to_vec(),
        };
        write_checkpoint(dir, STATE, &state, |staging| {
            self.learner.save(staging)?;
            if let Some(p) = &self.prime {
                p.save(staging)?;
            }
            Ok(())
        })
    }

    /// Old and reference log-probabilities of the samples, and PRIME's advantages in place of
    /// the sampler's where it learns.
    /// Returns PRIME's log and the seconds the log-probabilities took.
    fn prepare(&mut self, s: &mut Samples, cfg: &RlConfig) -> Result<(Option<PrimeLog>, f64)> {
        let start = Instant::now();
        let all: Vec<&[u32]> = s.seqs.iter().map(|s| s.ids.as_slice()).collect();
        // Taken once before the policy moves, the loss's old log-probabilities are its own.
        let on_policy = cfg.epochs <= 1 && micro_batches(all.len(), cfg) <= cfg.grad_accum.max(1);
        let old = match on_policy && self.learner.old_logprobs_in_backward() {
            true => vec![Vec::new(); all.len()],
            false => self.learner.logprobs(&all, cfg.minibatch_size)?,
        };
        let refs = match self.reference {
            Reference::Model(reference) => sequence_logprobs(
                reference,
                &all,
                cfg.minibatch_size,
                stepwise_model::DEFAULT_MAX_BATCH_TOKENS,
            )?,
            Reference::Base => self.learner.base_logprobs(&all)?,
            // No reference: no KL term in the loss (an empty row), and no pass.
            Reference::None => vec![Vec::new(); all.len()],
        };
        for ((q, o), r) in s.seqs.iter_mut().zip(old).zip(refs) {
            q.old_logprobs = o;
            q.ref_logprobs = r;
        }
        let logprob_seconds = start.elapsed().as_secs_f64();
        let Some(p) = self.prime.as_mut() else {
            return Ok((None, logprob_seconds));
        };
        let (token_rewards, stats) =
            p.score_and_learn(&s.seqs, &s.outcomes, &s.groups, cfg.minibatch_size, cfg.max_grad_norm)?;
        let advantages = prime_advantages(&s.seqs, &token_rewards, &s.outcomes, &s.groups, &p.cfg);
        for (q, a) in s.seqs.iter_mut().zip(advantages) {
            q.advantages = a;
        }
        Ok((Some(stats), logprob_seconds))
    }

    /// PPO-clip steps over the samples: `(loss, kl, clip fraction)` summed over micro-batches,
    /// the micro-batches, and the tokens learned.
    fn ppo(&mut self, seqs: &[Sequence], cfg: &RlConfig, lr: f64, rng: &mut ChaCha8Rng) -> Result<Steps> {
        let mut st = Steps::default();
        let mut order: Vec<usize> = (0..seqs.len()).collect();
        for _ in 0..cfg.epochs.max(1) {
            order.shuffle(rng);
            // Micro-batches of `minibatch_size` ([`micro_batches`]); gradients of `grad_accum` of
            // them make one step.
            let micro: Vec<&[usize]> = order.chunks(cfg.minibatch_size.max(1)).collect();
            for group in micro.chunks(cfg.grad_accum.max(1)) {
                for mb in group {
                    let batch: Vec<&Sequence> = mb.iter().map(|&i| &seqs[i]).collect();
                    let (loss, stats) = self.learner.backward(&batch, cfg.clip, cfg.kl_coef)?;
                    st.loss += loss;
                    st.kl += stats.kl;
                    st.clip += stats.clip_fraction;
                    st.tokens += stats.tokens;
                    st.micro += 1;
                }
                self.learner
                    .step(lr, cfg.weight_decay, cfg.max_grad_norm, group.len())?;
            }
        }
        Ok(st)
    }
}

/// What an update's PPO steps saw.
#[derive(Default)]
struct Steps {
    loss: f64,
    kl: f64,
    clip: f64,
    tokens: usize,
    micro: usize,
}

/// Run the updates `cfg` asks for, from the checkpoint in `core.out_dir` where there is one;
/// `on_update` sees each update's log. Returns every update's log.
pub(crate) fn run_updates(
    mut core: Core<'_>,
    cfg: &RlConfig,
    sampler: &mut dyn Sampler,
    mut on_update: impl FnMut(&UpdateLog),
) -> Result<Vec<UpdateLog>> {
    if matches!(core.reference, Reference::None) && cfg.needs_reference() {
        bail!("a KL penalty (kl_coef / --kl above 0) and PRIME need the reference policy: the run was given none");
    }
    if matches!(core.reference, Reference::Base) && !core.learner.has_base() {
        bail!("the reference is the learner's frozen base, but it trains every weight (no LoRA): load the starting policy as the reference");
    }
    let mut log = core.resume(cfg)?;
    let (mut sampled, mut updated) = log.last().map_or((0, 0), |l| (l.sampled_tokens, l.updated_tokens));
    for u in log.len()..cfg.updates {
        let start = Instant::now();
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ (u as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let n_prompts = cfg.prompts_per_update.min(core.problems.len());
        let chosen: Vec<&Problem> = sample(&mut rng, core.problems.len(), n_prompts)
            .into_iter()
            .map(|i| &core.problems[i])
            .collect();
        let mut samples = sampler.sample(&*core.learner.sampler()?, &chosen, u)?;
        sampled += samples.tokens;
        let sampling_seconds = start.elapsed().as_secs_f64();
        let (implicit_prm, logprob_seconds) = core.prepare(&mut samples, cfg)?;
        let lr = schedule(u, cfg.lr, cfg.warmup, cfg.updates);
        let learning = Instant::now();
        let st = core.ppo(&samples.seqs, cfg, lr, &mut rng)?;
        let learn_seconds = learning.elapsed().as_secs_f64();
        updated += st.tokens;
        let last = u + 1 == cfg.updates;
        let heldout_accuracy = match sampler.heldout_due(u, last) {
            true => Some(sampler.heldout(&*core.learner.sampler()?)?),
            false => None,
        };
        let n = samples.seqs.len().max(1) as f64;
        let steps = st.micro.max(1) as f64;
        let entry = UpdateLog {
            update: u + 1,
            reward: samples.reward_sum / n,
            accuracy: samples.correct as f64 / n,
            kl: core.reference.is_some().then(|| st.kl / steps),
            clip_fraction: st.clip / steps,
            loss: st.loss / steps,
            sampled_tokens: sampled,
            updated_tokens: updated,
            seconds: start.elapsed().as_secs_f64(),
            sampling_seconds,
            logprob_seconds,
            learn_seconds,
            watched: samples.watched.into_iter().map(|(k, v)| (k, v / n)).collect(),
            heldout_accuracy,
            implicit_prm,
        };
        on_update(&entry);
        log.push(entry);
        if last || (cfg.checkpoint_every > 0 && (u + 1) % cfg.checkpoint_every == 0) {
            core.save(cfg, &log)?;
        }
    }
    Ok(log)
}

/// The micro-batches an epoch over `n` samples makes.
fn micro_batches(n: usize, cfg: &RlConfig) -> usize {
    n.div_ceil(cfg.minibatch_size.max(1))
}

/// The sampling seed of prompt `k` of update `u`.
pub(crate) fn rng_seed(seed: u64, u: usize, k: usize) -> u64 {
    seed.wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add((u as u64) << 20)
        .wrapping_add(k as u64)
}

/// The sum over samples of each one's mean reward (over its steps, for process rewards).
pub(crate) fn mean_rewards(rewards: &[Vec<f32>]) -> f64 {
    rewards
        .iter()
        .map(|r| r.iter().sum::<f32>() as f64 / r.len().max(1) as f64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kill while a checkpoint is written keeps the one before; a kill while a whole one is
    /// moved in is finished by the next start.
    #[test]
    fn a_checkpoint_is_in_place_whole_or_not_at_all() {
        let dir_tmp = tempfile::tempdir().unwrap();
        let dir = dir_tmp.path().join("stepwise-commit");
        std::fs::create_dir_all(dir.join(STAGING)).unwrap();
        std::fs::write(dir.join(STATE), "update 1").unwrap();
        std::fs::write(dir.join("model.safetensors"), "weights 1").unwrap();
        // Killed while writing update 2: half of it staged, not marked whole.
        std::fs::write(dir.join(STAGING).join("model.safetensors"), "weights 2").unwrap();
        commit(&dir).unwrap();
        assert!(!dir.join(STAGING).exists());
        assert_eq!(
            std::fs::read_to_string(dir.join("model.safetensors")).unwrap(),
            "weights 1"
        );
        // Killed while moving update 2 in: its weights moved, its state and PRIME's not yet.
        let staged = dir.join(STAGED);
        std::fs::create_dir_all(staged.join("implicit_prm")).unwrap();
        std::fs::write(staged.join(STATE), "update 2").unwrap();
        std::fs::write(staged.join("implicit_prm").join("model.safetensors"), "prm 2").unwrap();
        std::fs::write(dir.join("model.safetensors"), "weights 2").unwrap();
        commit(&dir).unwrap();
        assert!(!staged.exists());
        assert_eq!(std::fs::read_to_string(dir.join(STATE)).unwrap(), "update 2");
        assert_eq!(
            std::fs::read_to_string(dir.join("model.safetensors")).unwrap(),
            "weights 2"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("implicit_prm").join("model.safetensors")).unwrap(),
            "prm 2"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
