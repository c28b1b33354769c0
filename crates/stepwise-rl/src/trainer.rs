//! The on-policy loop (GRPO with per-step credit) for single-turn solutions: for each update,
//! sample a group of solutions for each of a few prompts with the current policy, reward them,
//! turn rewards into per-token advantages, then take PPO-clip steps with a KL penalty to the
//! frozen starting policy (`updates.rs`, shared with the agent's loop). Every
//! `checkpoint_every` updates the policy (Hugging Face layout), the optimiser and the log are
//! written; a run started again on the same folder continues from there to the same weights an
//! uninterrupted run reaches.

use crate::advantage::{step_advantages, Credit};
use crate::learner::Learner;
use crate::prime::{ImplicitPrm, OnlinePrm, PrimeConfig, PrimeLog};
use crate::rollout::{token_advantages, Sequence};
use crate::updates::{mean_rewards, rng_seed, run_updates, Core, Sampler, Samples};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::PathBuf;
use stepwise_core::seams::{Continuation, Policy, Reward, Task, Until};
use stepwise_core::{Problem, Solution, Step};
use stepwise_model::packed_engine::LoraConfig;
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
    /// Weight β of the k3 KL penalty to the starting policy (0: none, and without PRIME no
    /// reference is needed: [`RlConfig::needs_reference`]).
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
    /// LoRA: the policy frozen and low-rank adapters trained on its projections (the packed
    /// trainer only; the checkpoint is the merged policy beside PEFT's adapter files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraConfig>,
}

fn one() -> usize {
    1
}

impl RlConfig {
    /// Settings no run can train with, refused before any work, named as the command line names
    /// them: a learning rate that is not a positive number (NaN trained a policy of NaN weights),
    /// empty micro-batches, a negative or non-finite temperature.
    pub fn check(&self) -> Result<()> {
        let positive = |x: f64| x.is_finite() && x > 0.0;
        if !positive(self.lr) {
            bail!("--lr {}: the learning rate must be a positive number", self.lr);
        }
        if let Some(p) = &self.prime {
            if !positive(p.lr) {
                bail!("--prime-lr {}: the learning rate must be a positive number", p.lr);
            }
        }
        if self.minibatch_size == 0 || self.grad_accum == 0 || self.epochs == 0 {
            bail!("--minibatch-size, --grad-accum and --epochs: each at least 1");
        }
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            bail!("--temperature {}: a number from 0 (greedy) up", self.temperature);
        }
        if !(self.kl_coef.is_finite() && self.kl_coef >= 0.0) {
            bail!("--kl {}: a number from 0 (no KL penalty) up", self.kl_coef);
        }
        Ok(())
    }

    /// Whether a run needs the frozen starting policy: for the KL penalty (`kl_coef` > 0) or
    /// PRIME's implicit rewards. Without it a run neither loads it nor takes its pass over the
    /// samples (TRL's GRPO at `beta=0`, DAPO's and Dr. GRPO's recipes), and logs no `kl`.
    pub fn needs_reference(&self) -> bool {
        self.kl_coef != 0.0 || self.prime.is_some()
    }

    /// The same settings with each update's samples making one optimiser step: micro-batches of
    /// at most `minibatch_size` sequences, their gradients accumulated over the update.
    pub fn one_step_per_update(mut self) -> Self {
        let batch = (self.prompts_per_update * self.group_size).max(1);
        self.minibatch_size = self.minibatch_size.clamp(1, batch);
        self.grad_accum = batch.div_ceil(self.minibatch_size);
        self
    }
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
            lora: None,
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
    /// Mean k3 KL estimate to the reference over learned tokens (none in a run without a
    /// reference: [`RlConfig::needs_reference`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kl: Option<f64>,
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
    /// Of those, seconds spent on the samples' log-probabilities under the policy before the
    /// update and under the reference (verl's `timing_s/old_log_prob` and `timing_s/ref`).
    #[serde(default)]
    pub logprob_seconds: f64,
    /// Of those, seconds spent on the PPO passes: each micro-batch's forward and backward, and
    /// the optimiser steps (verl's `timing_s/update_actor`). What is left of `seconds` went to
    /// PRIME's implicit PRM and the held-out measure.
    #[serde(default)]
    pub learn_seconds: f64,
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

impl Heldout<'_> {
    /// Whether a measure is due after update `u` (0-based; `last`: the run's last update).
    pub fn due(&self, u: usize, last: bool) -> bool {
        last || (self.every > 0 && (u + 1).is_multiple_of(self.every))
    }
}

/// Where an RL run's reference log-probabilities (the frozen starting policy's) come from.
#[derive(Clone, Copy)]
pub enum Reference<'a> {
    /// No reference: no KL term and no PRIME (a 0.5B policy's bf16 weights and a pass over
    /// every update's samples saved).
    None,
    /// A model of its own: the starting policy loaded a second time.
    Model(&'a Model),
    /// The learner's frozen base, its LoRA adapters switched off for the pass
    /// ([`Learner::base_logprobs`]; TRL with PEFT does the same): no second copy.
    Base,
}

impl<'a> Reference<'a> {
    /// The reference a run needs (`needed`: [`RlConfig::needs_reference`]): `own` where the
    /// caller loaded one, else the learner's frozen base; none where not needed and not loaded.
    pub fn pick(own: Option<&'a Model>, needed: bool) -> Self {
        match (own, needed) {
            (Some(model), _) => Reference::Model(model),
            (None, true) => Reference::Base,
            (None, false) => Reference::None,
        }
    }

    /// Whether there is one.
    pub fn is_some(&self) -> bool {
        !matches!(self, Reference::None)
    }
}

/// Everything an RL run works on.
pub struct RlRun<'a> {
    /// The policy being trained, where it trains (candle's [`crate::CandleLearner`] on the CPU, the
    /// packed engine's [`crate::PackedLearner`] on a GPU or the CPU).
    pub learner: &'a mut dyn Learner,
    /// The frozen starting policy: the KL penalty's reference, and PRIME's. It may be
    /// [`Reference::None`] where [`RlConfig::needs_reference`] says neither is used; given
    /// anyway, the KL to it is measured and logged.
    pub reference: Reference<'a>,
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

/// Run RL; `on_update` sees each update's log. Returns the log of every update (those of a
/// resumed run's earlier part included).
pub fn train_rl(run: RlRun<'_>, cfg: &RlConfig, on_update: impl FnMut(&UpdateLog)) -> Result<Vec<UpdateLog>> {
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
    cfg.check()?;
    let prime = OnlinePrm::for_run(cfg.prime, implicit_prm, reward)?;
    let mut sampler = SingleTurn {
        tokenizer,
        prompt,
        separator,
        params: SamplingParams {
            temperature: cfg.temperature,
            max_new_tokens: cfg.max_new_tokens,
            stop_token_ids,
            ..Default::default()
        },
        task,
        reward,
        watch,
        heldout,
        cfg,
        separators: HashMap::new(),
    };
    let core = Core {
        learner,
        reference,
        problems,
        out_dir,
        prime,
    };
    run_updates(core, cfg, &mut sampler, on_update)
}

/// Single-turn samples: a group of solutions to each prompt, graded by the task and rewarded.
struct SingleTurn<'a> {
    tokenizer: &'a Tokenizer,
    prompt: Prompt,
    separator: String,
    params: SamplingParams,
    task: &'a dyn Task,
    reward: &'a dyn Reward,
    watch: Vec<&'a dyn Reward>,
    heldout: Option<Heldout<'a>>,
    cfg: &'a RlConfig,
    /// Whether a token ends a step (its text holds the separator: `"|"`, `"\n"`, `".\n\n"`, …).
    separators: HashMap<u32, bool>,
}

impl SingleTurn<'_> {
    fn is_separator(&mut self, t: u32) -> Result<bool> {
        if let Some(&b) = self.separators.get(&t) {
            return Ok(b);
        }
        let b = self.tokenizer.decode(&[t])?.contains(self.separator.as_str());
        self.separators.insert(t, b);
        Ok(b)
    }

    /// The graded solutions of the continuations `conts` of problem `p`.
    fn solutions(&self, p: &Problem, conts: &[Continuation], u: usize) -> Vec<Solution> {
        conts
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
                self.task.grade_solution(&mut s);
                s
            })
            .collect()
    }
}

impl Sampler for SingleTurn<'_> {
    fn sample(&mut self, model: &Model, chosen: &[&Problem], u: usize) -> Result<Samples> {
        let (cfg, reward) = (self.cfg, self.reward);
        let engine = sampling_policy(model, self.tokenizer, &self.params, self.prompt, &self.separator);
        let asks: Vec<(&str, usize, u64)> = (chosen.iter().enumerate())
            .map(|(k, p)| (p.question.as_str(), cfg.group_size, rng_seed(cfg.seed, u, k)))
            .collect();
        let groups = sample_groups(&engine, &asks)?;
        let mut out = Samples::default();
        for (p, conts) in chosen.iter().zip(groups) {
            let prompt_ids = engine.prompt_ids(&p.question, &[])?;
            let sols = self.solutions(p, &conts, u);
            out.correct += sols.iter().filter(|s| s.correct == Some(true)).count();
            let rewards = reward.rewards(&sols)?;
            out.reward_sum += mean_rewards(&rewards);
            for w in &self.watch {
                *out.watched.entry(w.name().to_string()).or_insert(0.0) += mean_rewards(&w.rewards(&sols)?);
            }
            out.outcomes
                .extend(rewards.iter().map(|r| r.last().copied().unwrap_or(0.0)));
            out.groups.push(out.seqs.len()..out.seqs.len() + sols.len());
            let steps: Vec<usize> = sols.iter().map(|s| s.steps.len()).collect();
            let advantages = step_advantages(&rewards, &steps, reward.kind(), cfg.credit);
            for (c, a) in conts.iter().zip(advantages) {
                out.tokens += c.token_ids.len();
                let mut ids = prompt_ids.clone();
                ids.extend(&c.token_ids);
                let mut adv = vec![0.0; prompt_ids.len()];
                let seps: Vec<bool> = c
                    .token_ids
                    .iter()
                    .map(|&t| self.is_separator(t))
                    .collect::<Result<_>>()?;
                adv.extend(token_advantages(&seps, &a));
                out.seqs.push(Sequence {
                    learn_from: prompt_ids.len(),
                    ids,
                    advantages: adv,
                    ..Default::default()
                });
            }
        }
        Ok(out)
    }

    fn heldout_due(&self, u: usize, last: bool) -> bool {
        self.heldout.as_ref().is_some_and(|h| h.due(u, last))
    }

    fn heldout(&mut self, model: &Model) -> Result<f64> {
        let engine = sampling_policy(model, self.tokenizer, &self.params, self.prompt, &self.separator);
        match &self.heldout {
            Some(h) => heldout_accuracy(&engine, self.task, h, self.cfg.seed),
            None => Ok(0.0),
        }
    }
}

/// Single-sample accuracy of `policy` on the held-out problems (the same seeds at every
/// measurement, so the curve moves with the policy only), sampled as an update's prompts are.
fn heldout_accuracy(policy: &EnginePolicy<'_>, task: &dyn Task, h: &Heldout<'_>, seed: u64) -> Result<f64> {
    let golds: Vec<&str> = (h.problems.iter())
        .map(|p| {
            (p.gold_answer.as_deref())
                .with_context(|| format!("held-out problem `{}`: field `gold_answer`: missing", p.id))
        })
        .collect::<Result<_>>()?;
    let asks: Vec<(&str, usize, u64)> = (h.problems.iter().enumerate())
        .map(|(k, p)| (p.question.as_str(), h.samples, rng_seed(seed ^ 0xe7a1, 0, k)))
        .collect();
    let conts = sample_groups(policy, &asks)?;
    let (mut correct, mut total) = (0usize, 0usize);
    for (gold, cs) in golds.iter().zip(&conts) {
        correct += cs.iter().filter(|c| task.is_correct(gold, &c.steps)).count();
        total += cs.len();
    }
    Ok(correct as f64 / total.max(1) as f64)
}

/// For each `(question, n, seed)`, `n` solutions to the end: on a packed engine all decoded in
/// one batch (the weights read once a step for every group), on the CPU decoder question by
/// question, as the lab's recorded runs sampled them.
fn sample_groups(policy: &EnginePolicy<'_>, asks: &[(&str, usize, u64)]) -> Result<Vec<Vec<Continuation>>> {
    match policy.model.packed() {
        Some(_) => policy.continue_each(asks),
        None => (asks.iter())
            .map(|&(question, n, seed)| policy.continue_from(question, &[], n, Until::End, seed))
            .collect(),
    }
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
        adapter: None,
    }
}
