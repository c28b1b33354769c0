//! [`Reward`]: what RL optimises, per step or per solution.

use super::{turns_of, CheckerScorer, ScoreInput, StepScorer, Task};
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
/// step's for an ORM ([`RewardKind::Outcome`]). A trajectory's steps are read as the scoring
/// stage and training read them, each action with the observation it led to ([`turns_of`]).
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
        let turns: Vec<Option<Vec<String>>> = sols.iter().map(turns_of).collect();
        let inputs: Vec<ScoreInput<'_>> = sols.iter().zip(&turns).map(|(s, t)| ScoreInput::read(s, t)).collect();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Step;
    use crate::testing::FnScorer;

    /// A PRM reward reads a trajectory's actions with the observations after them, as the PRM
    /// was trained and as `stepwise score` reads them (it once read the actions alone, and a
    /// PRM that tells an invalid action by the world's answer scored every action alike).
    #[test]
    fn a_scorer_reward_reads_each_action_with_its_observation() {
        let mut t = Solution {
            id: "t".into(),
            question: "Put the gem in the case.".into(),
            ..Default::default()
        };
        t.steps = vec![
            Step::turn("eat rope", Some("You cannot eat the rope.".into())),
            Step::turn("take gem", Some("You take the gem.".into())),
        ];
        let plain = Solution {
            steps: vec![Step::new("2 + 2 = 4")],
            ..t.clone()
        };
        let scorer = FnScorer(|i: &ScoreInput<'_>| {
            i.steps
                .iter()
                .map(|s| if s.contains("cannot") { 0.0 } else { 1.0 })
                .collect()
        });
        let reward = ScorerReward {
            name: "prm".into(),
            scorer: &scorer,
            kind: RewardKind::Process,
        };
        assert_eq!(reward.rewards(&[t.clone()]).unwrap(), vec![vec![0.0, 1.0]]);
        let seen = FnScorer(|i: &ScoreInput<'_>| i.steps.iter().map(|s| s.len() as f32).collect());
        let reward = ScorerReward {
            name: "prm".into(),
            scorer: &seen,
            kind: RewardKind::Process,
        };
        let turns = t.turn_strings();
        assert_eq!(
            reward.rewards(&[t, plain]).unwrap(),
            vec![
                turns.iter().map(|s| s.len() as f32).collect::<Vec<_>>(),
                vec!["2 + 2 = 4".len() as f32]
            ]
        );
    }
}
