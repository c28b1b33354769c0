//! What RL optimises in an environment, behind the [`Reward`] seam: the goal alone
//! ([`GoalReward`], outcome-only RL) or a label for every action from any [`Annotator`]
//! ([`LabelReward`]: the oracle's verdicts, Monte Carlo values; a trained PRM is a
//! [`stepwise_core::seams::ScorerReward`] as in every domain).

use anyhow::{Context, Result};
use rayon::prelude::*;
use stepwise_core::seams::{Annotator, Reward, RewardKind};
use stepwise_core::Solution;

/// 1 for a trajectory that reached the goal, else 0 (a failed episode included).
pub struct GoalReward;

impl Reward for GoalReward {
    fn name(&self) -> &str {
        "outcome"
    }
    fn kind(&self) -> RewardKind {
        RewardKind::Outcome
    }
    fn rewards(&self, sols: &[Solution]) -> Result<Vec<Vec<f32>>> {
        Ok(sols
            .iter()
            .map(|s| vec![f32::from(u8::from(s.correct == Some(true)))])
            .collect())
    }
}

/// Each action's label from `annotator` as its reward: the label's probability of a good action
/// (a neutral hard label, valid but useless, counts `neutral`).
pub struct LabelReward<'a> {
    /// Name in logs and reports.
    pub name: String,
    /// Labels the actions.
    pub annotator: &'a dyn Annotator,
    /// The reward of a neutral hard label.
    pub neutral: f32,
}

impl Reward for LabelReward<'_> {
    fn name(&self) -> &str {
        &self.name
    }
    fn kind(&self) -> RewardKind {
        RewardKind::Process
    }
    fn rewards(&self, sols: &[Solution]) -> Result<Vec<Vec<f32>>> {
        sols.par_iter()
            .map(|s| {
                let (labelled, _) = self
                    .annotator
                    .annotate(s)
                    .with_context(|| format!("trajectory `{}`: labelling for `{}`", s.id, self.name))?;
                Ok(labelled
                    .steps
                    .iter()
                    .map(|st| st.label.as_ref().map_or(self.neutral, |l| l.prob(self.neutral)))
                    .collect())
            })
            .collect()
    }
}
