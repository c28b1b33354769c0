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

use anyhow::{Context, Result};
use stepwise_core::seams::{Annotator, Policy, Spent, Task, Until};
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
    /// Whether any of the rollouts from the prefix ending at step `i` reaches the gold answer.
    fn alive(&self, sol: &Solution, texts: &[String], gold: &str, i: usize, spent: &mut Spent) -> Result<bool> {
        let prefix: Vec<&str> = texts[..=i].iter().map(String::as_str).collect();
        let outs = self.policy.continue_from(
            &sol.question,
            &prefix,
            self.options.rollouts,
            Until::End,
            crate::montecarlo::seed_for(self.options.seed, &sol.id, i),
        )?;
        spent.rollouts += outs.len();
        spent.tokens += outs.iter().map(|c| c.tokens).sum::<usize>();
        Ok(outs.iter().any(|rest| {
            let mut full: Vec<String> = texts[..=i].to_vec();
            full.extend(rest.steps.iter().cloned());
            self.task.is_correct(gold, &full)
        }))
    }

    /// The index of the first error of `sol` (`None` when its answer is correct), and the cost.
    pub fn first_error(&self, sol: &Solution) -> Result<(Option<usize>, Spent)> {
        let gold = sol
            .gold_answer
            .as_deref()
            .with_context(|| format!("solution {}: field `gold_answer`: missing", sol.id))?;
        let texts = sol.step_strings();
        let mut spent = Spent::default();
        if texts.is_empty() || self.task.is_correct(gold, &texts) {
            return Ok((None, spent));
        }
        // Invariant: the prefix of `lo + 1` steps is alive (none: the question), the prefix
        // ending at `hi` is dead (at first the whole, wrong solution).
        let (mut lo, mut hi): (isize, usize) = (-1, texts.len() - 1);
        while hi as isize - lo > 1 {
            let mid = ((lo + hi as isize) / 2) as usize;
            if self.alive(sol, &texts, gold, mid, &mut spent)? {
                lo = mid as isize;
            } else {
                hi = mid;
            }
        }
        Ok((Some(hi), spent))
    }
}

impl Annotator for BinarySearch<'_> {
    fn name(&self) -> &str {
        "binary_search"
    }

    fn annotate(&self, sol: &Solution) -> Result<(Solution, Spent)> {
        let (first, spent) = self.first_error(sol)?;
        let mut out = sol.clone();
        crate::label_by_first_error(&mut out, first, Provenance::BinarySearch);
        Ok((out, spent))
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
