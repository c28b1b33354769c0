//! Test doubles of the seams, for tests and examples that need no model: a scripted
//! [`Policy`], one that batches ([`Batching`]), a [`StepScorer`] from a function, and a [`Task`]
//! whose answer is written plainly.
//! They drive annotators, search methods and rewards exactly as real backends would.

use crate::seams::{Continuation, NextSteps, Policy, PolicyBatch, ScoreInput, Scored, StepScorer, Task, Until};
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

/// `P` as a policy that batches ([`Policy::batch`]): its batch answers each ask as `P` does alone
/// (greedy asks too), fails the asks `fails` picks (as a server that went away), and records how
/// many asks each of its calls carried.
pub struct Batching<P> {
    /// The policy answering.
    pub inner: P,
    /// Asks to fail.
    pub fails: Box<dyn Fn(&NextSteps<'_>) -> bool + Send + Sync>,
    /// The asks of each batch call, in order.
    pub calls: std::sync::Mutex<Vec<usize>>,
}

impl<P: Policy> Batching<P> {
    /// `inner`, batching, failing no ask.
    pub fn new(inner: P) -> Self {
        Batching {
            inner,
            fails: Box::new(|_| false),
            calls: Default::default(),
        }
    }

    /// The asks of each batch call so far.
    pub fn calls(&self) -> Vec<usize> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl<P: Policy> Policy for Batching<P> {
    fn continue_from(&self, q: &str, prefix: &[&str], n: usize, until: Until, seed: u64) -> Result<Vec<Continuation>> {
        self.inner.continue_from(q, prefix, n, until, seed)
    }

    fn batch(&self) -> Option<Box<dyn PolicyBatch + '_>> {
        Some(Box::new(BatchOf(self)))
    }

    fn logprobs_after(&self, asks: &[crate::seams::NextOptions<'_>], end: bool) -> Result<Option<Vec<Vec<f64>>>> {
        self.inner.logprobs_after(asks, end)
    }
}

/// [`Batching`]'s batch.
struct BatchOf<'a, P>(&'a Batching<P>);

impl<P: Policy> PolicyBatch for BatchOf<'_, P> {
    fn continue_all(&mut self, asks: &[NextSteps<'_>], until: Until) -> Vec<Result<Vec<Continuation>>> {
        self.0.calls.lock().unwrap_or_else(|e| e.into_inner()).push(asks.len());
        (asks.iter())
            .map(|a| match (self.0.fails)(a) {
                true => anyhow::bail!("the server went away"),
                false => self.0.inner.continue_from(a.question, a.prefix, a.n, until, a.seed),
            })
            .collect()
    }

    fn continue_greedy_all(&mut self, asks: &[(&str, &[&str])], until: Until) -> Option<Vec<Result<Continuation>>> {
        self.0.calls.lock().unwrap_or_else(|e| e.into_inner()).push(asks.len());
        Some(
            asks.iter()
                .map(|(q, prefix)| self.0.inner.continue_greedy(q, prefix, until))
                .collect(),
        )
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
