//! Binary search for the first error (OmegaPRM, Luo et al. 2024): a step prefix is *alive* when
//! some rollout from it reaches the gold answer. A correct solution has no dead prefix. In a wrong
//! one the whole solution is dead, and — an error cannot be undone — every prefix after a dead
//! one is dead too, so the first dead prefix is found by bisection: roll out from the middle of
//! the interval still in doubt; if any rollout succeeds the first error lies after it, else at or
//! before it. That takes ⌈log₂ T⌉ rollout batches for T steps where per-step Monte Carlo takes up
//! to T. Steps before the first error are labelled good, it and every later step bad.
//!
//! This bisects each solution on its own; [`crate::OmegaPrm`] runs the same bisection over a
//! tree of rollouts shared by a problem's solutions, with MCTS choosing what to search.

use crate::probes::{Probe, Probing, Rollouts};
use anyhow::Result;
use stepwise_core::seams::{Annotator, Done, Policy, Spent, Task};
use stepwise_core::{Provenance, Solution};

/// The binary-search annotator.
pub struct BinarySearch<'a> {
    /// Completes the prefixes.
    pub policy: &'a dyn Policy,
    /// Grades a completed solution against its gold answer.
    pub task: &'a dyn Task,
    /// Rollouts per probed prefix, and the base seed (each solution and step derives its own,
    /// as Monte Carlo's do, so both probe a prefix with the same draws).
    pub options: crate::McOptions,
}

impl BinarySearch<'_> {
    fn rollouts(&self) -> Rollouts<'_> {
        Rollouts::new(self.policy, self.task, &self.options)
    }

    /// `sol`'s bisection (nothing to probe when its answer is correct).
    fn probing<'s>(&self, sol: &'s Solution) -> Result<Probing<'s>> {
        Probing::new(sol, |texts, gold| {
            // Invariant: the prefix of `lo + 1` steps is alive (none: the question), the prefix
            // ending at `hi` is dead (at first the whole, wrong solution).
            let wrong = !texts.is_empty() && !self.task.is_correct(gold, texts);
            Box::new(Bisection {
                out: sol.clone(),
                lo: -1,
                hi: wrong.then(|| texts.len() - 1),
            })
        })
    }

    /// The index of the first error of `sol` (`None` when its answer is correct), and the cost.
    pub fn first_error(&self, sol: &Solution) -> Result<(Option<usize>, Spent)> {
        let (labelled, spent) = self.annotate(sol)?;
        Ok((labelled.first_error(), spent))
    }
}

/// Binary search's probe: the middle of the steps still in doubt.
struct Bisection {
    out: Solution,
    /// The prefix of `lo + 1` steps is alive.
    lo: isize,
    /// The prefix ending at `hi` is dead (`None`: the solution is correct).
    hi: Option<usize>,
}

impl Probe for Bisection {
    fn next(&mut self) -> Option<usize> {
        let hi = self.hi?;
        (hi as isize - self.lo > 1).then(|| ((self.lo + hi as isize) / 2) as usize)
    }

    fn observe(&mut self, at: usize, hits: usize) {
        if hits > 0 {
            self.lo = at as isize;
        } else {
            self.hi = Some(at);
        }
    }

    fn finish(mut self: Box<Self>) -> Solution {
        crate::label_by_first_error(&mut self.out, self.hi, Provenance::BinarySearch);
        self.out
    }
}

impl Annotator for BinarySearch<'_> {
    fn name(&self) -> &str {
        "binary_search"
    }

    fn annotate(&self, sol: &Solution) -> Result<(Solution, Spent)> {
        self.rollouts().one(self.probing(sol)?)
    }

    /// Many solutions' probes rolled out in one batch a round, where the policy batches.
    fn annotate_together(&self, sols: &[Solution], done: &mut Done<'_>) -> Option<Result<()>> {
        self.rollouts().together(sols, |s| self.probing(s), done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::McOptions;
    use stepwise_core::testing::{PlainTask, ScriptedPolicy};

    use crate::test_support::{solution, toy};

    /// For every length and every position of the first error, bisection finds it with
    /// ⌊log₂ T⌋ to ⌈log₂ T⌉ batches of rollouts.
    #[test]
    fn finds_the_known_first_error_in_log_many_batches() {
        let bs = BinarySearch {
            policy: &ScriptedPolicy(toy),
            task: &PlainTask::default(),
            options: McOptions { rollouts: 4, seed: 0 },
        };
        for t in 1..=17usize {
            for first in 0..t {
                let mut steps: Vec<&str> = vec!["good"; t];
                steps[first] = "bad";
                steps[t - 1] = if first == t - 1 { "answer 2" } else { "bad" };
                let (found, spent) = bs.first_error(&solution("s", &steps)).unwrap();
                assert_eq!(found, Some(first), "T = {t}, first error {first}");
                let (least, most) = ((t as f64).log2().floor() as usize, (t as f64).log2().ceil() as usize);
                assert!(
                    (4 * least..=4 * most).contains(&spent.rollouts),
                    "T = {t}, first error {first}: {} rollouts",
                    spent.rollouts
                );
            }
        }
        let (labelled, spent) = bs.annotate(&solution("s", &["good", "good", "answer 1"])).unwrap();
        assert_eq!(spent.rollouts, 0, "a correct solution needs no rollout");
        assert!(labelled.steps.iter().all(|s| s.label.as_ref().unwrap().is_good()));
        let (labelled, _) = bs.annotate(&solution("s", &["good", "bad", "x", "answer 2"])).unwrap();
        let good: Vec<bool> = labelled
            .steps
            .iter()
            .map(|s| s.label.as_ref().unwrap().is_good())
            .collect();
        assert_eq!(good, [true, false, false, false]);
        assert_eq!(labelled.first_error(), Some(1));
    }
}
