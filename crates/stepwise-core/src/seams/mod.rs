//! The seams of the pipeline: the traits every stage is written against, so that a new backend,
//! annotator, reward or search method is one new file and never touches `Model`.
//!
//! - [`Policy`]: continues a partial solution by one step or to the end (local engine, remote
//!   server, scripted test double).
//! - [`StepScorer`]: one score per step of a partial or finished solution (a PRM of any layout,
//!   an ORM, an exact oracle, a remote scorer).
//! - [`Task`]: problems, gold answers and grading, and optionally an exact step checker.
//! - [`Annotator`]: labels the steps of a solution and says what it spent.
//! - [`Reward`]: per-step (process) or per-solution (outcome) rewards for RL.
//! - [`CodeRunner`]: runs the code a verifier writes inside its chain.
//! - [`Environment`]: where an agent's actions take effect; an [`Episode`] steps and forks.
//!
//! The stage functions that only need the traits live beside them ([`score_solutions`]).

mod annotator;
mod environment;
mod policy;
mod reward;
mod scorer;
mod task;
mod tool;

pub use annotator::{Annotator, Done, ProblemDone, Spent};
pub use environment::{replay, ActionKind, Environment, Episode, Observation};
pub use policy::{continue_each, split_steps_at, Continuation, NextOptions, NextSteps, Policy, PolicyBatch, Until};
pub use reward::{OracleReward, OutcomeReward, Reward, RewardKind, ScorerReward};
pub use scorer::{
    apply_outcome, score_in_order, score_solutions, score_solutions_with, turns_of, CheckerScorer, OnError,
    ScoreFailure, ScoreInput, ScoreOutcome, ScoreRun, Scored, StepScorer, Unavailable, SCORE_ERRORS,
};
pub use task::{MathTask, Task};
pub use tool::{chain_program, chain_reply, CodeRunner};
