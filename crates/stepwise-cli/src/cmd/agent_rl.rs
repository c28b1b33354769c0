//! `stepwise agent rl`: GRPO over the policy's own trajectories in the rooms worlds, with a
//! reward per action (the oracle's, a PRM's) or per trajectory (the goal). Parsing and wiring:
//! the run is [`stepwise_rl::run_agent_rl`], which Python's `stepwise.agent_rl` calls too.

use anyhow::{Context, Result};
use std::path::PathBuf;
use stepwise_rl::{run_agent_rl, AgentReward, AgentRlJob, Credit, RlConfig};

/// RL in an environment: the policy plays, each action is rewarded, the policy learns.
#[derive(clap::Args)]
#[command(
    after_help = "Each update, the policy plays --group-size episodes in each of --worlds worlds (one action a \
turn, the world's answer after it), the reward speaks per action or per episode, advantages are normalised over \
each world's group (GRPO) and PPO-clip steps (--clip) with a KL penalty (--kl) to the starting policy follow. \
The loss reads the observations but learns only what the policy wrote: its actions, and the end token where it \
stopped. Rewards:
  goal        1 when the episode reaches the goal, else 0 (outcome-only RL)
  oracle      the world's verdict on every action (progress 1, useless 0.5, regress/invalid/ruin 0):
              the ceiling a PRM can reach
  prm:DIR     a PRM's score of every action (any verifier folder `stepwise score` reads)
  prime       PRIME: the goal, plus token rewards β·log π_φ/π_ref on what the policy wrote from an
              implicit PRM that starts as the policy and learns online from the goal (--prime-beta,
              --prime-lr, --prime-filter; kept in OUT/implicit_prm). Observations are neither
              scored nor learned.
A process reward (oracle, prm) has the goal's advantage added to every action at --goal-weight (0: the process \
reward alone). --credit says how an action is valued before the group's normalisation: min-so-far (the weakest \
reward up to it), own (its own reward: an oracle's verdict), progress (its reward minus the one before: a PRM \
that values states, the change it made), return-to-go (the sum of the rest). Measured (docs/agents.md): with \
min-so-far neither the oracle nor a PRM beat the goal; use own with the oracle, and try progress with a PRM. \
The update's log keeps the oracle's mean verdict beside the reward (is the policy pleasing the PRM or making \
progress?). Trajectories are laid out as the policy is trained on them: the task and first observation, then each \
`action` + `Observation: ...`, joined by --separator, every piece tokenised on its own: play the trained policy in \
that layout with `stepwise agent play --prompt pieces`.

Writes the policy (Hugging Face layout) with its optimiser every --checkpoint-every updates and at the end, \
rl_log.jsonl and rl.png/rl.svg (reward, success, held-out success with --eval-problems, KL). The same command on \
the same --out resumes after an interruption.

Where it trains is `stepwise rl`'s choice: --device cuda (a build with --features cuda) plays and trains on the GPU \
with the packed engine (the reference and a prm:DIR reward there too); on the CPU a pretrained policy (hidden size \
512 or more) trains on the same packed trainer and plays from its own weights, a small one with candle's autograd \
(--trainer chooses). With --reward prime the implicit PRM trains on the policy's trainer. On the packed engine an \
update's episodes play together: each turn every episode's action is decoded in one batch, and each episode's \
history stays cached between turns, so a turn reads only the action and the world's answer (6.2x a call a turn \
for 16 episodes x 8 turns of a 0.5B policy on 2 cores).

Example:
  stepwise agent games --count 64 --seed 1 --output games.jsonl
  stepwise agent rl --policy POLICY --problems games.jsonl --reward prm:PRM --silent \\
      --updates 16 --worlds 4 --group-size 8 --lr 1e-4 --out agent-rl/"
)]
pub struct Args {
    /// Policy checkpoint folder or cached Hugging Face model id to start from (also the KL
    /// reference).
    #[arg(long, value_parser = super::model_dir)]
    policy: PathBuf,
    /// `goal`, `oracle`, `prm:DIR` or `prime`.
    #[arg(long, default_value = "goal")]
    reward: String,
    /// Weight of the goal's advantage added to a process reward's (oracle, prm).
    #[arg(long, default_value_t = 1.0)]
    goal_weight: f32,
    /// The worlds to train in (from `stepwise agent games`).
    #[arg(long)]
    problems: PathBuf,
    /// Output folder (checkpoints, log, plot; resumed when present).
    #[arg(long)]
    out: PathBuf,
    /// Policy updates.
    #[arg(long, default_value_t = 16)]
    updates: usize,
    /// Worlds per update.
    #[arg(long, default_value_t = 4)]
    worlds: usize,
    /// Episodes per world (the group).
    #[arg(long, default_value_t = 8)]
    group_size: usize,
    /// Per-action credit of process rewards: min-so-far, own, progress or return-to-go.
    #[arg(long, default_value = "min-so-far")]
    credit: String,
    /// Most new tokens per action.
    #[arg(long, default_value_t = 24)]
    max_tokens: usize,
    /// Most actions an episode may take.
    #[arg(long, default_value_t = 30)]
    max_actions: usize,
    /// The world keeps the goal to itself (the lab's world): nothing says the goal is reached or
    /// lost, the player stops when it judges it done, and the outcome is whether it holds then.
    #[arg(long)]
    silent: bool,
    /// Text between turns.
    #[arg(long, default_value = "\n")]
    separator: String,
    /// Layout of a prm:DIR reward's verifier (as `stepwise score --layout`).
    #[arg(long, default_value = "auto")]
    layout: String,
    /// PRIME's implicit PRM, with `--reward prime`.
    #[command(flatten)]
    prime: super::rl::PrimeArgs,
    /// Held-out worlds measured during training.
    #[command(flatten)]
    eval: super::rl::HeldoutArgs,
    /// How each update learns (its micro-batches make one optimiser step).
    #[command(flatten)]
    optim: super::rl::Optimisation,
    /// What the reference and a PRM compute in.
    #[command(flatten)]
    dtype: super::backend::DtypeArg,
    /// Where the policy plays and trains, and the reference and a PRM reward run.
    #[command(flatten)]
    device: super::backend::DeviceArgs,
    /// Which trainer updates the policy.
    #[command(flatten)]
    trainer: super::backend::TrainerArg,
}

pub fn run(a: Args) -> Result<()> {
    a.dtype.apply();
    let reward = AgentReward::parse(&a.reward).context("--reward")?;
    let credit: Credit = a.credit.parse().context("--credit")?;
    let problems = super::agent::read_games(&a.problems)?;
    let heldout = a.eval.read(super::agent::read_games)?;
    let env = super::agent::rooms(a.max_actions, a.silent);
    let cfg = config(&a, credit);
    let bar = crate::progress::bar(Some(a.updates as u64), "RL in the rooms");
    let log = run_agent_rl(
        AgentRlJob {
            policy: &a.policy,
            problems: &problems,
            env: &env,
            reward,
            layout: a.layout.clone(),
            goal_weight: a.goal_weight,
            judged: true,
            separator: a.separator.clone(),
            out: &a.out,
            heldout: a.eval.heldout(&heldout),
            placement: a.device.device,
            trainer: a.trainer.get()?,
            max_batch_tokens: a.device.max_batch_tokens,
        },
        &cfg,
        |l| {
            bar.set_position(l.update as u64);
            let oracle = l
                .watched
                .get("oracle")
                .map(|o| format!(" oracle {o:.2}"))
                .unwrap_or_default();
            bar.set_message(format!(
                "reward {:.3} success {:.2}{oracle}{}",
                l.reward,
                l.accuracy,
                super::rl::kl_text(l)
            ));
        },
    )?;
    bar.finish_and_clear();
    super::rl::report(&a.out, &a.reward, "success", &log);
    Ok(())
}

/// The run's settings: an update's trajectories make one optimiser step.
fn config(a: &Args, credit: Credit) -> RlConfig {
    RlConfig {
        prime: a.prime.config(&a.reward, a.optim.lr),
        ..a.optim.config(a.updates, a.worlds, a.group_size, credit, a.max_tokens)
    }
    .one_step_per_update()
}
