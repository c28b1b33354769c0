//! [`StepScorer`]: one score per step, and the scoring stage written once over it.

use super::Task;
use crate::Solution;
use anyhow::{Context, Result};

/// One solution, partial or finished, as a scorer reads it.
#[derive(Debug, Clone)]
pub struct ScoreInput<'a> {
    /// Its problem's id (scorers that check against the problem, such as an oracle, use it).
    pub problem_id: &'a str,
    /// The question.
    pub question: &'a str,
    /// The steps written so far.
    pub steps: Vec<&'a str>,
    /// The solution may continue (an open beam of a search): exact checkers judge its steps as
    /// a prefix, not as a complete solution that failed to state an answer.
    pub partial: bool,
}

impl<'a> ScoreInput<'a> {
    /// A solution record as scorer input.
    pub fn of(s: &'a Solution) -> Self {
        ScoreInput {
            problem_id: &s.problem_id,
            question: &s.question,
            steps: s.step_texts(),
            partial: false,
        }
    }
}

/// What a scorer returns for a batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scored {
    /// One score per step of each input, in [0, 1] (probability that the step is good).
    pub scores: Vec<Vec<f32>>,
    /// Tokens the scorer encoded for the batch (compute accounting; 0 for scorers without a model).
    pub tokens: usize,
}

/// Scores every step of partial or finished solutions: a PRM of any layout, an ORM (its last
/// step's score is the solution's), an exact oracle, a remote server.
pub trait StepScorer: Sync {
    /// Scores for each input, one per step.
    fn score(&self, batch: &[ScoreInput<'_>]) -> Result<Scored>;
}

/// A task's exact step checker as a scorer: 1 for a correct step, 0 for a wrong one. The
/// ceiling any PRM is measured against, where the task has a checker (the lab's does).
pub struct CheckerScorer<'a> {
    /// The task whose checker scores.
    pub task: &'a dyn Task,
}

impl StepScorer for CheckerScorer<'_> {
    fn score(&self, batch: &[ScoreInput<'_>]) -> Result<Scored> {
        let scores = batch
            .iter()
            .map(|i| {
                let steps: Vec<String> = i.steps.iter().map(|s| s.to_string()).collect();
                let verdicts = if i.partial {
                    self.task.check_prefix(i.problem_id, &steps)
                } else {
                    self.task.check_steps(i.problem_id, &steps)
                };
                let verdicts = verdicts.with_context(|| {
                    format!("problem `{}`: the task has no exact step checker for it", i.problem_id)
                })?;
                Ok(verdicts.into_iter().map(|ok| f32::from(u8::from(ok))).collect())
            })
            .collect::<Result<_>>()?;
        Ok(Scored { scores, tokens: 0 })
    }
}

/// The scoring stage: score `sols` in batches of `batch_size` and record the scores under
/// `verifier` in each solution's [`Solution::scores`]. `progress(done)` reports solutions scored.
/// Returns the tokens encoded.
pub fn score_solutions(
    scorer: &dyn StepScorer,
    verifier: &str,
    sols: &mut [Solution],
    batch_size: usize,
    mut progress: impl FnMut(usize),
) -> Result<usize> {
    let mut tokens = 0;
    let mut done = 0;
    for chunk in sols.chunks_mut(batch_size.max(1)) {
        let inputs: Vec<ScoreInput<'_>> = chunk.iter().map(ScoreInput::of).collect();
        let scored = match scorer.score(&inputs) {
            Ok(scored) => scored,
            // Name the solution that fails, not the batch: each is scored alone until one does.
            Err(batch_error) => {
                for (k, s) in chunk.iter().enumerate() {
                    scorer
                        .score(&[ScoreInput::of(s)])
                        .with_context(|| format!("scoring solution `{}` (record {})", s.id, done + k + 1))?;
                }
                return Err(batch_error.context(format!("scoring records {}-{}", done + 1, done + chunk.len())));
            }
        };
        anyhow::ensure!(
            scored.scores.len() == chunk.len(),
            "the scorer returned {} results for {} solutions",
            scored.scores.len(),
            chunk.len()
        );
        tokens += scored.tokens;
        for (s, sc) in chunk.iter_mut().zip(scored.scores) {
            anyhow::ensure!(
                sc.len() == s.steps.len(),
                "solution {}: {} steps but {} scores",
                s.id,
                s.steps.len(),
                sc.len()
            );
            s.set_scores(verifier, sc);
        }
        done += chunk.len();
        progress(done);
    }
    Ok(tokens)
}
