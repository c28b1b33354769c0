//! Test doubles of the seams, for tests and examples that need no model: a scripted
//! [`Policy`], a [`StepScorer`] from a function, and a [`Task`] whose answer is written plainly.
//! They drive annotators, search methods and rewards exactly as real backends would.

use crate::seams::{Continuation, Policy, ScoreInput, Scored, StepScorer, Task, Until};
use crate::Problem;
use anyhow::Result;

/// A policy whose `j`-th continuation of a prefix is `script(question, prefix, j)`: the rest of
/// the solution, one step per string.
pub struct ScriptedPolicy<F>(pub F);

impl<F> Policy for ScriptedPolicy<F>
where
    F: Fn(&str, &[&str], usize) -> Vec<String> + Sync,
{
    fn continue_from(
        &self,
        question: &str,
        prefix: &[&str],
        n: usize,
        until: Until,
        _seed: u64,
    ) -> Result<Vec<Continuation>> {
        Ok((0..n)
            .map(|j| {
                let mut steps = (self.0)(question, prefix, j);
                let finished = until == Until::End || steps.len() <= 1;
                if until == Until::Step {
                    steps.truncate(1);
                }
                Continuation {
                    text: steps.join("\n"),
                    tokens: steps.iter().map(|s| s.split_whitespace().count()).sum(),
                    steps,
                    finished,
                    token_ids: Vec::new(),
                }
            })
            .collect())
    }
}

/// A scorer whose scores for one input are `f(input)`; it encodes one "token" per step.
pub struct FnScorer<F>(pub F);

impl<F> StepScorer for FnScorer<F>
where
    F: Fn(&ScoreInput<'_>) -> Vec<f32> + Sync,
{
    fn score(&self, batch: &[ScoreInput<'_>]) -> Result<Scored> {
        Ok(Scored {
            scores: batch.iter().map(|i| (self.0)(i)).collect(),
            tokens: batch.iter().map(|i| i.steps.len()).sum(),
        })
    }
}

/// A task whose answer is the last step's text after `answer ` (`"answer 42"` states 42),
/// graded by string equality; a step is correct when it does not contain `bad`.
#[derive(Default)]
pub struct PlainTask {
    /// Its problems.
    pub problems: Vec<Problem>,
}

impl Task for PlainTask {
    fn problems(&self) -> &[Problem] {
        &self.problems
    }
    fn answer(&self, steps: &[String]) -> Option<String> {
        steps.last()?.strip_prefix("answer ").map(str::to_string)
    }
    fn grade(&self, answer: &str, gold: &str) -> bool {
        answer == gold
    }
    fn check_steps(&self, _problem_id: &str, steps: &[String]) -> Option<Vec<bool>> {
        Some(steps.iter().map(|s| !s.contains("bad")).collect())
    }
}
