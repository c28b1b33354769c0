//! stepwise-rl: optimise a policy against rewards from the [`stepwise_core::Reward`] seam, dense
//! per-step (a PRM, the lab's oracle) or per solution (the grader, an ORM).
//!
//! - [`agent`]: the same loop for an agent in an environment, trajectories as sequences whose
//!   observations the loss leaves out, and [`agent_job`] the run from a checkpoint folder as the
//!   command line and Python start it;
//! - [`advantage`]: GRPO's group-normalised advantages and per-step credit (DeepSeekMath's
//!   return-to-go of normalised step rewards, or the min-so-far of step rewards);
//! - [`job`]: a single-turn run from a checkpoint folder as the command line and Python start it;
//! - [`dpo`]: DPO and Step-DPO on preference pairs (no reward model, no sampling), and
//!   [`dpo_job`] the run from a checkpoint folder as the command line and Python start it;
//! - [`dense`]: step scores as per-token rewards for RL engines that take them (verl, OpenRLHF);
//! - [`learner`]: where the policy trains (candle's autograd on the CPU, the packed engine's
//!   trainer on a GPU);
//! - [`loss`]: the PPO-clip policy-gradient loss with GRPO's k3 KL penalty to a frozen reference,
//!   on the engine's differentiable path;
//! - [`prime`]: PRIME's implicit PRM, learning online from outcome labels, and its advantages;
//! - [`rollout`]: sampled solutions as training sequences, each token carrying its step's advantage;
//! - [`trainer`]: the on-policy loop, resumable from its checkpoints (`updates.rs` is the part
//!   both loops share).
//!
//! # Example
//!
//! `examples/dense_rewards.rs` (run it with `cargo run -p stepwise-rl --example dense_rewards`; it is also a doc-test):
//!
#![doc = concat!("```\n", include_str!("../examples/dense_rewards.rs"), "```")]
#![warn(missing_docs)]

pub mod advantage;
pub mod agent;
pub mod agent_job;
pub mod dense;
pub mod dpo;
pub mod dpo_job;
pub mod job;
pub mod learner;
pub mod loss;
pub mod prime;
pub mod rollout;
pub mod trainer;
mod updates;

pub use advantage::{step_advantages, Credit};
pub use agent::{train_agent_rl, AgentRlRun};
pub use agent_job::{run_agent_rl, AgentReward, AgentRlJob};
pub use dpo::{train_dpo, DpoConfig, DpoLog, DpoRun, DpoStats, Frozen, TokenPair};
pub use dpo_job::{run_dpo, DpoJob};
pub use job::{run_rl, RlJob, RlReward};
pub use learner::{CandleLearner, Learner, PackedLearner};
pub use loss::{policy_loss, LossStats};
pub use prime::{ImplicitPrm, PrimeConfig, PrimeLog};
pub use trainer::{train_rl, Reference, RlConfig, UpdateLog};
