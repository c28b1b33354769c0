//! `stepwise.agent_rl`: RL in an environment, as `stepwise agent rl` ([`run_agent_rl`]).

use crate::agent::{environment_of, problems_arg};
use crate::convert::{to_py, value_error, without_gil};
use crate::progress::Progress;
use pyo3::prelude::*;
use std::path::PathBuf;
use stepwise_core::seams::Environment;
use stepwise_rl::trainer::Heldout;
use stepwise_rl::{run_agent_rl, AgentReward, AgentRlJob};

/// RL for an agent: each update the policy (a checkpoint folder or cached Hugging Face model id)
/// plays `group_size` episodes in each of `worlds` of `problems` in `env` (`"rooms"`, or a class
/// whose objects have `reset(problem)` and `step(action)`, as `stepwise.play` takes), the reward
/// speaks per action or per episode, and GRPO with PPO-clip steps and a KL penalty to the start
/// follows; the loss learns the policy's actions, never the observations. `reward` is `"goal"`
/// (outcome-only), `"oracle"` (the environment's verdict on every action: rooms, or a Python
/// environment with `judge`), `"prm:DIR"` (a PRM's score of every action) or `"prime"` (the
/// goal plus an implicit PRM's token rewards on the actions, the PRM learning online from the
/// goal: `prime_beta`, `prime_lr`, `prime_filter`); a process reward has the goal's advantage
/// added at `goal_weight`, credited by `credit` (`"min_so_far"`: the weakest reward so far;
/// `"own"`: the action's own reward; `"progress"`: its reward minus the one before;
/// `"return_to_go"`). `silent=True` plays the rooms world that keeps
/// the goal to itself (the lab's). The policy, its optimiser and `rl_log.jsonl` are written to
/// `out` every `checkpoint_every` updates and at the end, and a call on the same `out` resumes.
/// `device` and `trainer` are `stepwise.rl`'s: a pretrained policy (hidden size 512 or more) trains
/// on the packed engine's trainer and plays from its own weights (on the CPU, or a GPU with
/// `device="cuda"` in a CUDA build), a small one with candle's autograd on the CPU. Returns each update's log (`reward`, `accuracy`: the share of episodes that
/// reached the goal, `kl`, `watched["oracle"]` where the environment judges, `heldout_accuracy`
/// with `eval_problems`). `lora_rank` trains LoRA adapters on the frozen policy, as `stepwise.rl`.
///
/// >>> log = stepwise.agent_rl("policy/", stepwise.rooms(64, seed=1), "agent-rl/", reward="oracle", updates=16)
#[pyfunction]
#[pyo3(signature = (policy, problems, out, reward="goal", env=None, goal_weight=1.0, updates=16, worlds=4, group_size=8, epochs=1, minibatch_size=32, lr=1e-5, kl=0.04, clip=0.2, credit="min_so_far", temperature=1.0, max_tokens=24, max_actions=30, silent=false, separator="\n", layout="auto", prime_beta=0.05, prime_lr=None, prime_filter=(0.2, 0.8), eval_problems=None, eval_every=10, eval_samples=4, checkpoint_every=10, seed=0, step_timeout=60.0, device=None, trainer="auto", max_batch_tokens=stepwise_model::DEFAULT_MAX_BATCH_TOKENS, lora_rank=0, lora_alpha=None, lora_targets="all-linear", progress=None))]
#[allow(clippy::too_many_arguments)]
pub fn agent_rl<'py>(
    py: Python<'py>,
    policy: PathBuf,
    problems: &Bound<'py, PyAny>,
    out: PathBuf,
    reward: &str,
    env: Option<&Bound<'py, PyAny>>,
    goal_weight: f32,
    updates: usize,
    worlds: usize,
    group_size: usize,
    epochs: usize,
    minibatch_size: usize,
    lr: f64,
    kl: f32,
    clip: f32,
    credit: &str,
    temperature: f32,
    max_tokens: usize,
    max_actions: usize,
    silent: bool,
    separator: &str,
    layout: &str,
    prime_beta: f32,
    prime_lr: Option<f64>,
    prime_filter: (f32, f32),
    eval_problems: Option<&Bound<'py, PyAny>>,
    eval_every: usize,
    eval_samples: usize,
    checkpoint_every: usize,
    seed: u64,
    step_timeout: f64,
    device: Option<&Bound<'py, PyAny>>,
    trainer: &str,
    max_batch_tokens: usize,
    lora_rank: usize,
    lora_alpha: Option<f32>,
    lora_targets: &str,
    progress: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let reward = AgentReward::parse(reward).map_err(|e| value_error(e.to_string()))?;
    let placement = crate::convert::placement_arg(device)?;
    let trainer = crate::convert::trainer_arg(trainer)?;
    let prime = crate::rl::prime_config(reward == AgentReward::Prime, (prime_beta, prime_lr, prime_filter), lr)?;
    let problems = problems_arg(problems)?;
    let heldout = eval_problems.map(problems_arg).transpose()?;
    let (env, judged) = environment(env, max_actions, silent, step_timeout)?;
    let cfg = stepwise_rl::RlConfig {
        prime,
        lora: crate::convert::lora_arg(lora_rank, lora_alpha, lora_targets, seed)?,
        ..crate::rl::grpo_config(
            (updates, worlds, group_size),
            (epochs, minibatch_size, lr, kl, clip),
            credit,
            (temperature, max_tokens),
            (seed, checkpoint_every),
        )?
    }
    .one_step_per_update();
    let progress = Progress::start(py, progress, "updates", updates)?;
    let log = without_gil(py, || {
        let policy = stepwise_model::hub::resolve(&policy.to_string_lossy())?;
        let job = AgentRlJob {
            policy: &policy,
            problems: &problems,
            env: &*env,
            reward,
            layout: layout.to_string(),
            goal_weight,
            judged,
            separator: separator.to_string(),
            out: &out,
            heldout: heldout.as_deref().map(|problems| Heldout {
                problems,
                every: eval_every,
                samples: eval_samples,
            }),
            placement,
            trainer,
            max_batch_tokens,
        };
        let log = run_agent_rl(job, &cfg, |l| progress.done(l.update))?;
        Ok(serde_json::to_value(log)?)
    });
    progress.finish();
    to_py(py, &log?)
}

/// The environment of `env=` and whether it judges actions (rooms; a class with `judge`).
fn environment(
    env: Option<&Bound<'_, PyAny>>,
    max_actions: usize,
    silent: bool,
    step_timeout: f64,
) -> PyResult<(Box<dyn Environment>, bool)> {
    let rooms = env.is_none_or(|e| e.extract::<String>().is_ok_and(|s| s == "rooms"));
    if silent && !rooms {
        return Err(value_error(
            "silent=True is a rooms world's setting; a Python environment decides what it says",
        ));
    }
    if silent {
        return Ok((Box::new(stepwise_agent::Rooms::silent(max_actions)), true));
    }
    let judged = rooms || env.is_some_and(|e| e.hasattr("judge").unwrap_or(false));
    Ok((environment_of(env, max_actions, step_timeout)?, judged))
}
