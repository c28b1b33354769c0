//! An agent's RL run as `stepwise agent rl` and Python's `stepwise.agent_rl` start it: a policy
//! checkpoint folder, worlds to play, an environment, a reward named as both front ends name it
//! (`goal`, `oracle`, `prm:DIR`, `prime`), an output folder. It loads what [`train_agent_rl`] works on,
//! runs it (resuming from the folder's checkpoint), and leaves the policy, the optimiser and
//! `rl_log.jsonl` in the folder.
//!
//! The policy reads and writes trajectories in the layout the loss trains on
//! ([`Prompt::Pieces`]: the task and first observation, then each `action` + `Observation: …`,
//! each piece tokenised on its own, turns joined by the separator): what it sampled is what it
//! learns from, token for token, with a word-level tokenizer; a BPE tokenizer may merge an
//! action's last characters with the observation mark differently when the trajectory is
//! tokenised whole, which the loss then scores as written (the re-tokenisation drift of
//! multi-turn RL).

use crate::agent::{train_agent_rl, AgentRlRun};
use crate::job::{implicit_prm, TrainedPolicy};
use crate::trainer::{Heldout, Reference, RlConfig, UpdateLog};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use stepwise_agent::{Games, GoalReward, LabelReward, Oracle};
use stepwise_core::record::OBSERVATION_MARK;
use stepwise_core::seams::{Environment, Reward, RewardKind, ScorerReward};
use stepwise_core::Problem;
use stepwise_model::scoring::LoadedVerifier;
use stepwise_model::train::run::Trainer;
use stepwise_model::{default_precision, Placement, Prompt, SamplingParams, Tokenizer};

/// What an agent's RL run optimises.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentReward {
    /// Whether the goal was reached: outcome-only RL.
    Goal,
    /// The environment's verdict on every action (rooms, or a Python environment with `judge`):
    /// a process reward, the ceiling a PRM can reach.
    Oracle,
    /// A PRM's score of every action (any verifier folder `stepwise score` reads).
    Prm(PathBuf),
    /// PRIME: the goal plus an implicit PRM's token rewards on what the policy wrote, the PRM
    /// starting as the policy and learning online from the goal ([`RlConfig::prime`] holds its
    /// settings).
    Prime,
}

impl AgentReward {
    /// `goal` (or `outcome`), `oracle`, `prm:DIR` or `prime`.
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s.split_once(':') {
            Some(("prm", dir)) if !dir.is_empty() => AgentReward::Prm(PathBuf::from(dir)),
            None if s == "goal" || s == "outcome" => AgentReward::Goal,
            None if s == "oracle" => AgentReward::Oracle,
            None if s == "prime" => AgentReward::Prime,
            _ => bail!("reward `{s}`: use goal, oracle, prm:DIR or prime"),
        })
    }
}

/// An agent's RL run, as the front ends describe it.
pub struct AgentRlJob<'a> {
    /// The starting policy's checkpoint folder (also the KL reference).
    pub policy: &'a Path,
    /// The worlds to train in.
    pub problems: &'a [Problem],
    /// The environment.
    pub env: &'a dyn Environment,
    /// What is optimised.
    pub reward: AgentReward,
    /// A PRM reward's layout (as `stepwise score --layout`).
    pub layout: String,
    /// The goal's advantage added to a process reward's, per action (0: the process reward alone).
    pub goal_weight: f32,
    /// Whether the environment judges actions: the oracle's mean verdict on the update's
    /// actions is then logged beside the reward (`watched.oracle`).
    pub judged: bool,
    /// Text between turns.
    pub separator: String,
    /// Checkpoints, the log; resumed from when it holds a checkpoint.
    pub out: &'a Path,
    /// Worlds whose success is measured during training.
    pub heldout: Option<Heldout<'a>>,
    /// Where the policy trains and samples, and the reference and a PRM reward run.
    pub placement: Placement,
    /// Which trainer updates the policy (and PRIME's implicit PRM): on the CPU, `Auto` is the
    /// packed engine's for a pretrained policy, candle's autograd for a small one.
    pub trainer: Trainer,
    /// Most tokens in one pass of the packed trainer.
    pub max_batch_tokens: usize,
}

/// Run `job` with `cfg`; `on_update` sees each update's log. Returns the log of every update
/// (a resumed run's earlier part included), also written to `OUT/rl_log.jsonl`. The policy
/// trains where the job's placement and trainer say ([`RlJob`](crate::RlJob)'s choice).
pub fn run_agent_rl(job: AgentRlJob<'_>, cfg: &RlConfig, on_update: impl FnMut(&UpdateLog)) -> Result<Vec<UpdateLog>> {
    // Refused before a model is loaded or the folder made.
    cfg.check()?;
    if (job.reward == AgentReward::Prime) != cfg.prime.is_some() {
        bail!("the prime reward and PRIME's settings (RlConfig::prime) go together");
    }
    let placement = job.placement.resolve()?;
    let tok = Tokenizer::from_dir(job.policy)?;
    let trainer = (job.trainer, cfg.lora.as_ref());
    let mut policy = TrainedPolicy::load(job.policy, placement, trainer, job.max_batch_tokens, cfg.seed)?;
    let reference = policy.reference_if(cfg.needs_reference(), job.policy, placement)?;
    let eos = stepwise_model::ModelConfig::from_dir(job.policy)?.eos_token_ids;
    std::fs::create_dir_all(job.out).with_context(|| format!("creating {}", job.out.display()))?;
    stepwise_model::tokenizer::copy_files(job.policy, job.out)?;
    let games = Games::new(job.env, job.problems.iter().cloned());
    let oracle_annotator = Oracle(&games);
    let oracle = LabelReward {
        name: "oracle".into(),
        annotator: &oracle_annotator,
        neutral: 0.5,
    };
    let verifier = match &job.reward {
        AgentReward::Prm(dir) => {
            let dir = stepwise_model::hub::resolve(&dir.to_string_lossy())
                .with_context(|| format!("reward prm:{}", dir.display()))?;
            Some(LoadedVerifier::load_on(
                &dir,
                &job.layout,
                placement,
                default_precision(),
            )?)
        }
        _ => None,
    };
    let scorer = verifier.as_ref().map(LoadedVerifier::scorer);
    let prm = scorer.as_ref().map(|s| ScorerReward {
        name: "prm".into(),
        scorer: s,
        kind: RewardKind::Process,
    });
    let reward: &dyn Reward = match (&job.reward, &prm) {
        (AgentReward::Prm(_), Some(p)) => p,
        (AgentReward::Oracle, _) => &oracle,
        _ => &GoalReward,
    };
    let watch: Vec<&dyn Reward> = if job.judged && job.reward != AgentReward::Oracle {
        vec![&oracle]
    } else {
        Vec::new()
    };
    let mut implicit = match &cfg.prime {
        Some(p) => Some(implicit_prm(
            job.policy,
            job.out,
            &job.separator,
            p.beta,
            (policy.packed().then_some(placement), job.max_batch_tokens),
            cfg.seed,
        )?),
        None => None,
    };
    let log = policy.with_learner(|learner| {
        let run = AgentRlRun {
            learner,
            reference: Reference::pick(reference.as_ref(), cfg.needs_reference()),
            params: action_params(&tok, &eos, cfg.max_new_tokens),
            end: tok.eos_token.clone().unwrap_or_default(),
            tokenizer: &tok,
            prompt: Prompt::Pieces,
            separator: job.separator,
            env: job.env,
            problems: job.problems,
            reward,
            goal_weight: job.goal_weight,
            watch,
            out_dir: Some(job.out.to_path_buf()),
            heldout: job.heldout,
            implicit_prm: implicit.as_mut().map(TrainedPolicy::as_implicit),
        };
        train_agent_rl(run, cfg, on_update)
    })?;
    stepwise_core::io::write_jsonl(job.out.join("rl_log.jsonl"), &log)?;
    Ok(log)
}

/// How one action is sampled: it ends where the policy starts writing the observation mark
/// (the world's answer is not the policy's to write) or the end of sequence (the episode).
fn action_params(tok: &Tokenizer, eos: &[u32], max_new_tokens: usize) -> SamplingParams {
    let mark = OBSERVATION_MARK.trim();
    let mut stop = eos.to_vec();
    stop.extend(tok.eos_id());
    stop.extend(tok.token_id(mark));
    SamplingParams {
        max_new_tokens,
        stop_token_ids: stop,
        stop_strings: vec![mark.to_string()],
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewards_are_read_as_the_front_ends_name_them() {
        assert_eq!(AgentReward::parse("goal").unwrap(), AgentReward::Goal);
        assert_eq!(AgentReward::parse("outcome").unwrap(), AgentReward::Goal);
        assert_eq!(AgentReward::parse("oracle").unwrap(), AgentReward::Oracle);
        assert_eq!(AgentReward::parse("prime").unwrap(), AgentReward::Prime);
        assert_eq!(
            AgentReward::parse("prm:runs/prm").unwrap(),
            AgentReward::Prm(PathBuf::from("runs/prm"))
        );
        for bad in ["prm:", "orm:x", "gold", ""] {
            let e = AgentReward::parse(bad).unwrap_err().to_string();
            assert!(e.contains("goal, oracle, prm:DIR or prime"), "{bad}: {e}");
        }
    }
}
