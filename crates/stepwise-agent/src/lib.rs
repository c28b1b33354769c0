//! Agents as a domain of process supervision: a step is an action whose effect comes back from
//! an environment, and whether it was right is not always clear-cut (an action can be valid and
//! still make no progress).
//!
//! - Trajectories are [`stepwise_core::Solution`]s whose steps carry the environment's answer in
//!   `observation`; the `messages` (OpenAI tool calls) and `conversations` (AgentInstruct,
//!   AgentBank) formats read and write them.
//! - [`stepwise_core::seams::Environment`] is the seam: reset to a problem, step, fork.
//! - [`rooms`]: a text world of rooms, containers and items with an exact oracle, and
//!   [`rooms::Expert`], a noisy expert policy for runs without a model.
//! - [`rollout`]: a [`stepwise_core::Policy`] playing in an environment.
//! - [`search`]: beam search over actions, the environment stepping every candidate.
//! - [`labels`]: oracle, Monte Carlo and TD(λ)/GAE labels for actions; [`binary_search`]: the
//!   first dead action found by binary search over Monte Carlo probes; [`quality`]: how well
//!   labels separate the oracle's good actions from its bad ones.
//! - [`reward`]: the goal, or any annotator's labels, as what RL optimises.

pub mod binary_search;
pub mod labels;
pub mod quality;
pub mod reward;
pub mod rollout;
pub mod rooms;
pub mod search;

pub use binary_search::BinarySearch;
pub use labels::{progress_targets, td_targets, training_targets, Games, MonteCarlo, Oracle, TemporalDifference};
pub use reward::{GoalReward, LabelReward};
pub use rollout::{play, End, Played};
pub use rooms::{Expert, Rooms};
