//! [`Reward`]: what RL optimises, per step or per solution.

use super::{CheckerScorer, ScoreInput, StepScorer, Task};
use crate::Solution;
use anyhow::{Context, Result};

/// Whether a reward speaks about every step or only about the outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RewardKind {
    /// One reward per solution.
    Outcome,
    /// One reward per step.
    Process,
}

/// Turns solutions into rewards: one per step ([`RewardKind::Process`]) or one per solution
/// ([`RewardKind::Outcome`]).
pub trait Reward: Sync {
    /// A short name (`outcome`, `orm`, `prm`, `oracle`).
    fn name(&self) -> &str;
    /// Per step or per solution.
    fn kind(&self) -> RewardKind;
    /// The rewards of each solution: one per step, or a single one for outcome rewards.
    fn rewards(&self, sols: &[Solution]) -> Result<Vec<Vec<f32>>>;
}

/// 1 for a solution whose answer the task grades correct, else 0.
pub struct OutcomeReward<'a> {
    /// Grades the answers.
    pub task: &'a dyn Task,
}

impl Reward for OutcomeReward<'_> {
    fn name(&self) -> &str {
        "outcome"
    }
    fn kind(&self) -> RewardKind {
        RewardKind::Outcome
    }
    fn rewards(&self, sols: &[Solution]) -> Result<Vec<Vec<f32>>> {
        sols.iter()
            .map(|s| {
                let gold = s
                    .gold_answer
                    .as_deref()
                    .with_context(|| format!("solution {}: field `gold_answer`: missing", s.id))?;
                Ok(vec![f32::from(u8::from(self.task.is_correct(gold, &s.step_strings())))])
            })
            .collect()
    }
}

/// A step scorer's scores as rewards: every step's for a PRM ([`RewardKind::Process`]), the last
/// step's for an ORM ([`RewardKind::Outcome`]).
pub struct ScorerReward<'a> {
    /// Name in logs and reports.
    pub name: String,
    /// The scorer.
    pub scorer: &'a dyn StepScorer,
    /// PRM (every step) or ORM (last step).
    pub kind: RewardKind,
}

impl Reward for ScorerReward<'_> {
    fn name(&self) -> &str {
        &self.name
    }
    fn kind(&self) -> RewardKind {
        self.kind
    }
    fn rewards(&self, sols: &[Solution]) -> Result<Vec<Vec<f32>>> {
        let inputs: Vec<ScoreInput<'_>> = sols.iter().map(ScoreInput::of).collect();
        let scored = self.scorer.score(&inputs)?;
        Ok(scored
            .scores
            .into_iter()
            .map(|s| match self.kind {
                RewardKind::Process => s,
                RewardKind::Outcome => vec![s.last().copied().unwrap_or(0.0)],
            })
            .collect())
    }
}

/// The task's exact step checker: 1 for a correct step, 0 for a wrong one (the ceiling of
/// process rewards; only tasks with an exact checker have it).
pub struct OracleReward<'a> {
    /// Checks the steps.
    pub task: &'a dyn Task,
}

impl Reward for OracleReward<'_> {
    fn name(&self) -> &str {
        "oracle"
    }
    fn kind(&self) -> RewardKind {
        RewardKind::Process
    }
    fn rewards(&self, sols: &[Solution]) -> Result<Vec<Vec<f32>>> {
        let inputs: Vec<ScoreInput<'_>> = sols.iter().map(ScoreInput::of).collect();
        Ok(CheckerScorer { task: self.task }.score(&inputs)?.scores)
    }
}
