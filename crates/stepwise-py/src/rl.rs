//! `stepwise.rl`: single-turn RL, as `stepwise rl` ([`run_rl`]).

use crate::agent::problems_arg;
use crate::convert::{to_py, value_error, without_gil};
use crate::progress::Progress;
use pyo3::prelude::*;
use std::path::PathBuf;
use stepwise_rl::trainer::Heldout;
use stepwise_rl::{run_rl, Credit, PrimeConfig, RlConfig, RlJob, RlReward};

/// RL for a policy (a checkpoint folder or cached Hugging Face model id) on `problems` (dicts
/// with `question` and a gold answer in `gold_answer` or `answer`, or a path to a file of them):
/// each update samples `group_size` solutions for each of `prompts` problems, rewards them,
/// normalises the rewards over each group (GRPO) and takes PPO-clip steps with a KL penalty to
/// the starting policy. `reward` is `"outcome"` (the graded answer), `"orm:DIR"` (an outcome
/// model), `"prm:DIR"` (a PRM's score of every step, each step's tokens with its advantage,
/// credited by `credit`: `"return_to_go"` or `"min_so_far"`) or `"prime"` (the outcome plus an
/// implicit PRM learning online: `prime_beta`, `prime_lr`, and `prime_filter`, the range of a
/// group's share of correct samples it learns from). `device` is `auto`, `cpu` or `cuda[:N]`
/// (a CUDA build). `trainer` is `"auto"` (the packed engine's on a GPU, and on the CPU for a
/// pretrained policy, hidden size 512 or more; candle's f32 autograd for a small one),
/// `"packed"` or `"autograd"` (the CPU only). The policy, optimiser and `rl_log.jsonl` are written to `out` every
/// `checkpoint_every` updates and at the end; a call on the same `out` resumes. Returns each
/// update's log (`reward`, `accuracy`, `kl`, `heldout_accuracy` with `eval_problems`,
/// `implicit_prm` with PRIME). `kl=0` without PRIME trains with no reference: it is neither
/// loaded nor run over the samples, and the log has no `kl`. `lora_rank` trains LoRA adapters
/// on the frozen policy (the packed trainer; `out` holds the merged policy and PEFT's adapter
/// files).
///
/// >>> log = stepwise.rl("policy/", "problems.jsonl", "rl-run/", reward="prm:prm/", updates=20)
#[pyfunction]
#[pyo3(signature = (policy, problems, out, reward="outcome", updates=100, prompts=8, group_size=8, epochs=1, minibatch_size=32, grad_accum=1, lr=1e-5, kl=0.04, clip=0.2, credit="return_to_go", temperature=1.0, max_tokens=256, separator="\n", chat=false, layout="auto", prime_beta=0.05, prime_lr=None, prime_filter=(0.2, 0.8), eval_problems=None, eval_every=10, eval_samples=4, checkpoint_every=10, seed=0, device=None, trainer="auto", max_batch_tokens=stepwise_model::DEFAULT_MAX_BATCH_TOKENS, lora_rank=0, lora_alpha=None, lora_targets="all-linear", progress=None))]
#[allow(clippy::too_many_arguments)]
pub fn rl<'py>(
    py: Python<'py>,
    policy: PathBuf,
    problems: &Bound<'py, PyAny>,
    out: PathBuf,
    reward: &str,
    updates: usize,
    prompts: usize,
    group_size: usize,
    epochs: usize,
    minibatch_size: usize,
    grad_accum: usize,
    lr: f64,
    kl: f32,
    clip: f32,
    credit: &str,
    temperature: f32,
    max_tokens: usize,
    separator: &str,
    chat: bool,
    layout: &str,
    prime_beta: f32,
    prime_lr: Option<f64>,
    prime_filter: (f32, f32),
    eval_problems: Option<&Bound<'py, PyAny>>,
    eval_every: usize,
    eval_samples: usize,
    checkpoint_every: usize,
    seed: u64,
    device: Option<&Bound<'py, PyAny>>,
    trainer: &str,
    max_batch_tokens: usize,
    lora_rank: usize,
    lora_alpha: Option<f32>,
    lora_targets: &str,
    progress: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let lora = crate::convert::lora_arg(lora_rank, lora_alpha, lora_targets, seed)?;
    let reward = RlReward::parse(reward).map_err(|e| value_error(e.to_string()))?;
    let prime = prime_config(reward == RlReward::Prime, (prime_beta, prime_lr, prime_filter), lr)?;
    let placement = crate::convert::placement_arg(device)?;
    let trainer = crate::convert::trainer_arg(trainer)?;
    let problems = problems_arg(problems)?;
    stepwise_rl::job::check_gold(&problems).map_err(|e| value_error(e.to_string()))?;
    let heldout = eval_problems.map(problems_arg).transpose()?;
    let cfg = RlConfig {
        grad_accum,
        prime,
        lora,
        ..grpo_config(
            (updates, prompts, group_size),
            (epochs, minibatch_size, lr, kl, clip),
            credit,
            (temperature, max_tokens),
            (seed, checkpoint_every),
        )?
    };
    let progress = Progress::start(py, progress, "updates", updates)?;
    let log = without_gil(py, || {
        let policy = stepwise_model::hub::resolve(&policy.to_string_lossy())?;
        let job = RlJob {
            policy: &policy,
            problems: &problems,
            reward,
            layout: layout.to_string(),
            chat,
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
        let log = run_rl(job, &cfg, |l| progress.done(l.update))?;
        Ok(serde_json::to_value(log)?)
    });
    progress.finish();
    to_py(py, &log?)
}

/// PRIME's settings where the reward is `prime`, from Python's `(prime_beta, prime_lr,
/// prime_filter)` (the policy's `lr` unless `prime_lr` says); the filter's range checked.
pub(crate) fn prime_config(
    is_prime: bool,
    (beta, prime_lr, filter): (f32, Option<f64>, (f32, f32)),
    lr: f64,
) -> PyResult<Option<PrimeConfig>> {
    let (low, high) = filter;
    if !(0.0..=1.0).contains(&low) || !(low..=1.0).contains(&high) {
        return Err(value_error(format!(
            "prime_filter=({low}, {high}): need 0 <= low <= high <= 1"
        )));
    }
    Ok(is_prime.then(|| PrimeConfig {
        beta,
        lr: prime_lr.unwrap_or(lr),
        accuracy_bounds: filter,
        ..Default::default()
    }))
}

/// The settings `rl` and `agent_rl` share, from their keyword arguments: `(updates, prompts,
/// group)`, `(epochs, minibatch, lr, kl, clip)`, the credit's name, `(temperature, max_tokens)`
/// and `(seed, checkpoint_every)`.
pub(crate) fn grpo_config(
    (updates, prompts, group_size): (usize, usize, usize),
    (epochs, minibatch_size, lr, kl, clip): (usize, usize, f64, f32, f32),
    credit: &str,
    (temperature, max_new_tokens): (f32, usize),
    (seed, checkpoint_every): (u64, usize),
) -> PyResult<RlConfig> {
    let credit: Credit = credit.parse().map_err(|e: anyhow::Error| value_error(e.to_string()))?;
    Ok(RlConfig {
        updates,
        prompts_per_update: prompts,
        group_size,
        epochs,
        minibatch_size,
        lr,
        warmup: updates / 10,
        kl_coef: kl,
        clip,
        credit,
        temperature,
        max_new_tokens,
        seed,
        checkpoint_every,
        ..Default::default()
    })
}
