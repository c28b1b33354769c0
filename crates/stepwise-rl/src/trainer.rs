//! The on-policy loop (GRPO with per-step credit): for each update, sample a group of solutions
//! for each of a few prompts with the current policy, reward them, turn rewards into per-token
//! advantages, then take PPO-clip steps with a KL penalty to the frozen starting policy. Every
//! `checkpoint_every` updates the policy (Hugging Face layout), the optimiser and the log are
//! written; a run started again on the same folder continues from there to the same weights an
//! uninterrupted run reaches.

use crate::advantage::{step_advantages, Credit};
use crate::learner::Learner;
use crate::prime::{prime_advantages, ImplicitPrm, OnlinePrm, PrimeConfig, PrimeLog};
use crate::rollout::{sequence_logprobs, token_advantages, Sequence};
use anyhow::{bail, Context, Result};
use rand::seq::{index::sample, SliceRandom};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Instant;
use stepwise_core::seams::{Policy, Reward, RewardKind, Task, Until};
use stepwise_core::{Problem, Solution, Step};
use stepwise_model::train::optim::schedule;
use stepwise_model::{EnginePolicy, Model, Prompt, SamplingParams, Tokenizer};

/// Hyper-parameters of an RL run (names as in TRL's GRPO trainer where they exist).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RlConfig {
    /// Policy updates (each samples a fresh batch).
    pub updates: usize,
    /// Prompts per update.
    pub prompts_per_update: usize,
    /// Solutions sampled per prompt (the group advantages are normalised over).
    pub group_size: usize,
    /// Passes over each update's samples (PPO epochs; 1 is on-policy GRPO).
    pub epochs: usize,
    /// Sequences per micro-batch (one forward and backward pass).
    pub minibatch_size: usize,
    /// Micro-batches whose gradients make one optimiser step (gradient accumulation).
    #[serde(default = "one")]
    pub grad_accum: usize,
    /// Peak learning rate (AdamW, linear warm-up then cosine).
    pub lr: f64,
    /// Warm-up updates.
    pub warmup: usize,
    /// AdamW weight decay.
    pub weight_decay: f64,
    /// Gradient-norm clipping (0 = off).
    pub max_grad_norm: f64,
    /// PPO's clip range ε on the probability ratio.
    pub clip: f32,
    /// Weight β of the k3 KL penalty to the starting policy.
    pub kl_coef: f32,
    /// How process rewards become step advantages.
    pub credit: Credit,
    /// Sampling temperature.
    pub temperature: f32,
    /// Most new tokens per solution.
    pub max_new_tokens: usize,
    /// Seed of prompt choice, sampling and minibatch order.
    pub seed: u64,
    /// Checkpoint every this many updates (0: only at the end).
    pub checkpoint_every: usize,
    /// PRIME: an implicit PRM ([`RlRun::implicit_prm`]) learns online from the outcome reward
    /// and its token rewards join the outcome's in the advantages ([`crate::prime`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prime: Option<PrimeConfig>,
}

fn one() -> usize {
    1
}

impl Default for RlConfig {
    fn default() -> Self {
        RlConfig {
            updates: 100,
            prompts_per_update: 8,
            group_size: 8,
            epochs: 1,
            minibatch_size: 32,
            grad_accum: 1,
            lr: 1e-5,
            warmup: 0,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
            clip: 0.2,
            kl_coef: 0.04,
            credit: Credit::ReturnToGo,
            temperature: 1.0,
            max_new_tokens: 256,
            seed: 0,
            checkpoint_every: 10,
            prime: None,
        }
    }
}

/// What one update saw and did.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct UpdateLog {
    /// Updates done (1-based).
    pub update: usize,
    /// Mean reward of the update's samples (a process reward: the mean over each solution's steps).
    pub reward: f64,
    /// Fraction of the update's samples the task grades correct.
    pub accuracy: f64,
    /// Mean k3 KL estimate to the reference over learned tokens.
    pub kl: f64,
    /// Fraction of learned tokens whose ratio was clipped.
    pub clip_fraction: f64,
    /// Mean loss over the update's optimiser steps.
    pub loss: f64,
    /// Tokens sampled so far (all updates).
    pub sampled_tokens: usize,
    /// Tokens learned from so far (all updates and epochs).
    pub updated_tokens: usize,
    /// Seconds this update took.
    pub seconds: f64,
    /// Of those, seconds spent sampling and rewarding (the rest went to log-probabilities and
    /// optimiser steps).
    #[serde(default)]
    pub sampling_seconds: f64,
    /// The mean of each watched reward over the update's samples (e.g. the oracle's verdict
    /// beside the PRM being optimised: is the policy pleasing the PRM or being right?).
    #[serde(default)]
    pub watched: std::collections::BTreeMap<String, f64>,
    /// Single-sample accuracy on the held-out problems ([`RlRun::heldout`]), on the updates
    /// where it was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heldout_accuracy: Option<f64>,
    /// PRIME's implicit PRM on the update's samples, before it learned from them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub implicit_prm: Option<PrimeLog>,
}

/// Held-out problems the policy is measured on during training.
pub struct Heldout<'a> {
    /// The problems (with gold answers).
    pub problems: &'a [Problem],
    /// Measure after every this many updates (and after the last).
    pub every: usize,
    /// Samples per problem.
    pub samples: usize,
}

/// Everything an RL run works on.
pub struct RlRun<'a> {
    /// The policy being trained, where it trains (the CPU's [`crate::CandleLearner`], a GPU's
    /// [`crate::PackedLearner`]).
    pub learner: &'a mut dyn Learner,
    /// The frozen starting policy (the KL penalty's reference).
    pub reference: &'a Model,
    /// The tokenizer.
    pub tokenizer: &'a Tokenizer,
    /// How the question becomes the prompt.
    pub prompt: Prompt,
    /// The step separator: it must be one token of the tokenizer (steps are found in the
    /// sampled tokens).
    pub separator: String,
    /// Tokens that end a solution.
    pub stop_token_ids: Vec<u32>,
    /// The prompts to train on.
    pub problems: &'a [Problem],
    /// Grades solutions (the accuracy logged).
    pub task: &'a dyn Task,
    /// What is optimised.
    pub reward: &'a dyn Reward,
    /// Rewards only measured on the samples, by name (logged in [`UpdateLog::watched`]).
    pub watch: Vec<&'a dyn Reward>,
    /// Checkpoint folder (resumed from when it holds one).
    pub out_dir: Option<PathBuf>,
    /// Measure held-out accuracy during training (logged in [`UpdateLog::heldout_accuracy`]).
    pub heldout: Option<Heldout<'a>>,
    /// PRIME's implicit PRM, trained online; given exactly when [`RlConfig::prime`] is set, with
    /// an outcome `reward` (the verifier whose labels it learns from). It is checkpointed in the
    /// run folder's `implicit_prm/`.
    pub implicit_prm: Option<ImplicitPrm<'a>>,
}

const STATE: &str = "rl_state.json";

#[derive(Serialize, Deserialize)]
struct State {
    config: RlConfig,
    log: Vec<UpdateLog>,
}

/// Run RL; `on_update` sees each update's log. Returns the log of every update (those of a
/// resumed run's earlier part included).
pub fn train_rl(run: RlRun<'_>, cfg: &RlConfig, mut on_update: impl FnMut(&UpdateLog)) -> Result<Vec<UpdateLog>> {
    let RlRun {
        learner,
        reference,
        tokenizer,
        prompt,
        separator,
        stop_token_ids,
        problems,
        task,
        reward,
        watch,
        out_dir,
        heldout,
        implicit_prm,
    } = run;
    if problems.is_empty() || cfg.group_size < 2 || cfg.prompts_per_update == 0 {
        bail!("RL needs problems, a group of at least 2 samples per prompt and at least one prompt per update");
    }
    let mut prime = match (cfg.prime, implicit_prm) {
        (Some(c), Some(prm)) if reward.kind() == RewardKind::Outcome => Some(OnlinePrm::new(prm, c)?),
        (Some(_), Some(_)) => bail!(
            "PRIME learns from an outcome reward (the verifier's labels); `{}` is a process reward",
            reward.name()
        ),
        (None, None) => None,
        (Some(_), None) => bail!("PRIME is configured but no implicit PRM was given"),
        (None, Some(_)) => bail!("an implicit PRM was given but PRIME is not configured"),
    };
    // A token ends a step when its text holds the separator (`"|"`, `"\n"`, `".\n\n"`, …).
    let mut separators = std::collections::HashMap::new();
    let mut is_separator = |t: u32| -> Result<bool> {
        if let Some(&b) = separators.get(&t) {
            return Ok(b);
        }
        let b = tokenizer.decode(&[t])?.contains(separator.as_str());
        separators.insert(t, b);
        Ok(b)
    };
    let mut log: Vec<UpdateLog> = Vec::new();
    if let Some(dir) = out_dir.as_ref().filter(|d| d.join(STATE).exists()) {
        let text = std::fs::read_to_string(dir.join(STATE))?;
        let state: State =
            serde_json::from_str(&text).with_context(|| format!("{}: invalid", dir.join(STATE).display()))?;
        if state.config != *cfg {
            bail!(
                "{} was started with other RL settings: use another folder, or delete it to start over",
                dir.display()
            );
        }
        learner.load(dir)?;
        if let Some(p) = prime.as_mut() {
            p.load(dir)?;
        }
        log = state.log;
    }
    let save = |learner: &dyn Learner, prime: Option<&OnlinePrm<'_>>, log: &[UpdateLog]| -> Result<()> {
        if let Some(dir) = &out_dir {
            learner.save(dir)?;
            if let Some(p) = prime {
                p.save(dir)?;
            }
            let state = State {
                config: cfg.clone(),
                log: log.to_vec(),
            };
            // The state is written last: a checkpoint counts only once all of it is there.
            let tmp = dir.join(format!("{STATE}.tmp"));
            std::fs::write(&tmp, serde_json::to_string_pretty(&state)?)?;
            std::fs::rename(tmp, dir.join(STATE))?;
        }
        Ok(())
    };
    // The policy as it samples: for the update's groups and for held-out measurements.
    let params = SamplingParams {
        temperature: cfg.temperature,
        max_new_tokens: cfg.max_new_tokens,
        stop_token_ids: stop_token_ids.clone(),
        ..Default::default()
    };
    let (mut sampled, mut updated) = log.last().map_or((0, 0), |l| (l.sampled_tokens, l.updated_tokens));
    for u in log.len()..cfg.updates {
        let start = Instant::now();
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ (u as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let chosen: Vec<&Problem> = sample(&mut rng, problems.len(), cfg.prompts_per_update.min(problems.len()))
            .into_iter()
            .map(|i| &problems[i])
            .collect();

        // Sample a group per prompt with the current policy.
        let sampler = learner.sampler()?;
        let engine = sampling_policy(&sampler, tokenizer, &params, prompt, &separator);
        let mut seqs: Vec<Sequence> = Vec::new();
        // Each sequence's last reward (the outcome, for an outcome reward) and each prompt's
        // sequences, for PRIME.
        let (mut outcomes, mut groups) = (Vec::new(), Vec::new());
        let (mut reward_sum, mut correct) = (0.0, 0usize);
        let mut watched = std::collections::BTreeMap::new();
        for (k, p) in chosen.iter().enumerate() {
            let prompt_ids = engine.prompt_ids(&p.question, &[])?;
            let conts = engine.continue_from(&p.question, &[], cfg.group_size, Until::End, rng_seed(cfg.seed, u, k))?;
            let sols: Vec<Solution> = conts
                .iter()
                .enumerate()
                .map(|(j, c)| {
                    let mut s = Solution {
                        id: format!("{}-u{u}-{j}", p.id),
                        problem_id: p.id.clone(),
                        question: p.question.clone(),
                        steps: c.steps.iter().map(Step::new).collect(),
                        gold_answer: p.gold_answer.clone(),
                        ..Default::default()
                    };
                    task.grade_solution(&mut s);
                    s
                })
                .collect();
            correct += sols.iter().filter(|s| s.correct == Some(true)).count();
            let rewards = reward.rewards(&sols)?;
            reward_sum += mean_rewards(&rewards);
            for w in &watch {
                *watched.entry(w.name().to_string()).or_insert(0.0) += mean_rewards(&w.rewards(&sols)?);
            }
            outcomes.extend(rewards.iter().map(|r| r.last().copied().unwrap_or(0.0)));
            groups.push(seqs.len()..seqs.len() + sols.len());
            let steps: Vec<usize> = sols.iter().map(|s| s.steps.len()).collect();
            let advantages = step_advantages(&rewards, &steps, reward.kind(), cfg.credit);
            for (c, a) in conts.iter().zip(advantages) {
                sampled += c.token_ids.len();
                let mut ids = prompt_ids.clone();
                ids.extend(&c.token_ids);
                let mut adv = vec![0.0; prompt_ids.len()];
                let seps: Vec<bool> = c.token_ids.iter().map(|&t| is_separator(t)).collect::<Result<_>>()?;
                adv.extend(token_advantages(&seps, &a));
                seqs.push(Sequence {
                    learn_from: prompt_ids.len(),
                    ids,
                    advantages: adv,
                    ..Default::default()
                });
            }
        }
        drop(engine);
        drop(sampler);
        let sampling_seconds = start.elapsed().as_secs_f64();
        let all: Vec<&[u32]> = seqs.iter().map(|s| s.ids.as_slice()).collect();
        let old = learner.logprobs(&all, cfg.minibatch_size)?;
        let refs = sequence_logprobs(reference, &all, cfg.minibatch_size)?;
        for ((s, o), r) in seqs.iter_mut().zip(old).zip(refs) {
            s.old_logprobs = o;
            s.ref_logprobs = r;
        }
        // PRIME: the implicit PRM scores the samples, learns from their outcomes, and its token
        // rewards with the outcomes make the advantages.
        let implicit_prm = match prime.as_mut() {
            Some(p) => {
                let (token_rewards, stats) =
                    p.score_and_learn(&seqs, &outcomes, &groups, cfg.minibatch_size, cfg.max_grad_norm)?;
                let advantages = prime_advantages(&seqs, &token_rewards, &outcomes, &groups, &p.cfg);
                for (s, a) in seqs.iter_mut().zip(advantages) {
                    s.advantages = a;
                }
                Some(stats)
            }
            None => None,
        };

        // PPO-clip steps over the samples.
        let lr = schedule(u, cfg.lr, cfg.warmup, cfg.updates);
        let (mut loss_sum, mut kl_sum, mut clip_sum, mut steps) = (0.0, 0.0, 0.0, 0usize);
        let mut order: Vec<usize> = (0..seqs.len()).collect();
        for _ in 0..cfg.epochs.max(1) {
            order.shuffle(&mut rng);
            // Micro-batches of `minibatch_size`; gradients of `grad_accum` of them make one step.
            let micro: Vec<&[usize]> = order.chunks(cfg.minibatch_size.max(1)).collect();
            for group in micro.chunks(cfg.grad_accum.max(1)) {
                for mb in group {
                    let batch: Vec<&Sequence> = mb.iter().map(|&i| &seqs[i]).collect();
                    let (loss, stats) = learner.backward(&batch, cfg.clip, cfg.kl_coef)?;
                    loss_sum += loss;
                    kl_sum += stats.kl;
                    clip_sum += stats.clip_fraction;
                    updated += stats.tokens;
                    steps += 1;
                }
                learner.step(lr, cfg.weight_decay, cfg.max_grad_norm, group.len())?;
            }
        }
        let last = u + 1 == cfg.updates;
        let heldout_accuracy = match &heldout {
            Some(h) if last || (h.every > 0 && (u + 1) % h.every == 0) => {
                let sampler = learner.sampler()?;
                let engine = sampling_policy(&sampler, tokenizer, &params, prompt, &separator);
                Some(heldout_accuracy(&engine, task, h, cfg.seed)?)
            }
            _ => None,
        };
        let n = seqs.len().max(1) as f64;
        watched.values_mut().for_each(|v| *v /= n);
        let entry = UpdateLog {
            update: u + 1,
            reward: reward_sum / n,
            accuracy: correct as f64 / n,
            kl: kl_sum / steps.max(1) as f64,
            clip_fraction: clip_sum / steps.max(1) as f64,
            loss: loss_sum / steps.max(1) as f64,
            sampled_tokens: sampled,
            updated_tokens: updated,
            seconds: start.elapsed().as_secs_f64(),
            sampling_seconds,
            watched,
            heldout_accuracy,
            implicit_prm,
        };
        on_update(&entry);
        log.push(entry);
        if last || (cfg.checkpoint_every > 0 && (u + 1) % cfg.checkpoint_every == 0) {
            save(&*learner, prime.as_ref(), &log)?;
        }
    }
    Ok(log)
}

/// The sampling seed of prompt `k` of update `u`.
fn rng_seed(seed: u64, u: usize, k: usize) -> u64 {
    seed.wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add((u as u64) << 20)
        .wrapping_add(k as u64)
}

/// The sum over solutions of each solution's mean reward (over its steps, for process rewards).
fn mean_rewards(rewards: &[Vec<f32>]) -> f64 {
    rewards
        .iter()
        .map(|r| r.iter().sum::<f32>() as f64 / r.len().max(1) as f64)
        .sum()
}

/// Single-sample accuracy of `policy` on the held-out problems (the same seeds at every
/// measurement, so the curve moves with the policy only).
fn heldout_accuracy(policy: &dyn Policy, task: &dyn Task, h: &Heldout<'_>, seed: u64) -> Result<f64> {
    let (mut correct, mut total) = (0usize, 0usize);
    for (k, p) in h.problems.iter().enumerate() {
        let gold = p
            .gold_answer
            .as_deref()
            .with_context(|| format!("held-out problem `{}`: field `gold_answer`: missing", p.id))?;
        for c in policy.continue_from(&p.question, &[], h.samples, Until::End, rng_seed(seed ^ 0xe7a1, 0, k))? {
            correct += usize::from(task.is_correct(gold, &c.steps));
            total += 1;
        }
    }
    Ok(correct as f64 / total.max(1) as f64)
}

/// `model` as the policy that samples.
fn sampling_policy<'m>(
    model: &'m Model,
    tokenizer: &'m Tokenizer,
    params: &SamplingParams,
    prompt: Prompt,
    separator: &str,
) -> EnginePolicy<'m> {
    EnginePolicy {
        model,
        tokenizer,
        params: params.clone(),
        prompt,
        separator: separator.to_string(),
    }
}
