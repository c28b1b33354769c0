//! The judge on a policy that decodes many rows in one pass ([`Policy::batch`]): the answers on
//! [`JUDGED_TOGETHER`] solutions sampled in one batch call, each solution's with the seed it has
//! alone, so each solution's labels are those [`Judge`] gives it alone. Verdicts weighed by
//! likelihood are left to the runner's threads: each solution's every verdict is already one
//! pass of the options packed end to end, and weighing 16 solutions' in one pass on two cores
//! took as long (91.9 s against 92.4 s) at 0.9 GB more memory.
//!
//! [`Policy::batch`]: stepwise_core::seams::Policy::batch

use super::{labelled, vote, Judge};
use anyhow::Result;
use stepwise_core::seams::{Done, NextSteps, PolicyBatch, Spent, Until};
use stepwise_core::Solution;

/// Solutions judged in one call.
pub const JUDGED_TOGETHER: usize = 64;

impl Judge<'_> {
    /// [`stepwise_core::seams::Annotator::annotate_together`] for the judge: `None` where the
    /// policy does not batch, or the verdicts are weighed by likelihood.
    pub(super) fn judge_together(&self, sols: &[Solution], done: &mut Done<'_>) -> Option<Result<()>> {
        if self.likelihood {
            return None;
        }
        let mut batch = self.policy.batch()?;
        let mut run = || -> Result<()> {
            for (k, chunk) in sols.chunks(JUDGED_TOGETHER).enumerate() {
                for (i, r) in self.sampled(batch.as_mut(), chunk).into_iter().enumerate() {
                    done(k * JUDGED_TOGETHER + i, r)?;
                }
            }
            Ok(())
        };
        Some(run())
    }

    /// `chunk` labelled by the vote of answers sampled for all of it in one batch call.
    fn sampled(&self, batch: &mut dyn PolicyBatch, chunk: &[Solution]) -> Vec<Result<(Solution, Spent)>> {
        let steps: Vec<Vec<String>> = chunk.iter().map(Solution::step_strings).collect();
        let asked: Vec<(String, Vec<String>)> = (chunk.iter().zip(&steps))
            .map(|(s, st)| self.format.ask(&s.question, st))
            .collect();
        let pieces: Vec<Vec<&str>> = (asked.iter())
            .map(|(_, p)| p.iter().map(String::as_str).collect())
            .collect();
        let asks: Vec<NextSteps> = (chunk.iter().zip(&asked).zip(&pieces))
            .map(|((s, (prompt, _)), prefix)| NextSteps {
                question: prompt,
                prefix,
                n: self.samples.max(1),
                seed: self.seed_of(&s.id),
            })
            .collect();
        let answers = batch.continue_all(&asks, Until::End);
        (chunk.iter().zip(&steps).zip(answers))
            .map(|((s, st), answers)| {
                let (verdicts, spent) = self.read_answers(&answers?, st);
                let (best, given) = vote(verdicts);
                Ok(labelled(s, best, given, spent))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::JUDGED_TOGETHER;
    use crate::judge::{IndexAnswer, Judge, ProcessBenchCritique};
    use stepwise_core::seams::{Annotator, Spent};
    use stepwise_core::testing::{Batching, ScriptedPolicy};
    use stepwise_core::Solution;

    /// Answers that differ by solution and sample: some readable, some not.
    fn answers(q: &str, p: &[&str], j: usize) -> Vec<String> {
        let k = (q.len() + p.len() + j) % 5;
        vec![["\\boxed{1}", "\\boxed{-1}", "\\boxed{0}", "no idea", "\\boxed{2}"][k].to_string()]
    }

    /// Solutions judged together on a batching policy get the labels, verdict counts and costs
    /// each gets alone, in one call per [`JUDGED_TOGETHER`]; a failed ask fails its solution only.
    #[test]
    fn solutions_judged_together_are_judged_as_each_alone() {
        let sols: Vec<Solution> = (0..JUDGED_TOGETHER + 9)
            .map(|i| Solution {
                id: format!("s{i}"),
                question: if i == 5 { "fail".into() } else { "q".repeat(1 + i % 7) },
                steps: (0..1 + i % 4)
                    .map(|k| stepwise_core::Step::new(format!("step {k}")))
                    .collect(),
                ..Default::default()
            })
            .collect();
        let policy = Batching {
            fails: Box::new(|a| a.prefix.iter().any(|p| p.contains("fail"))),
            ..Batching::new(ScriptedPolicy(answers))
        };
        let judge = |policy| Judge {
            policy,
            samples: 3,
            seed: 4,
            format: &ProcessBenchCritique,
            likelihood: false,
        };
        let mut got: Vec<Option<anyhow::Result<(Solution, Spent)>>> = sols.iter().map(|_| None).collect();
        judge(&policy)
            .annotate_together(&sols, &mut |i, r| {
                assert!(got[i].replace(r).is_none(), "solution {i} handed on twice");
                Ok(())
            })
            .expect("the policy batches")
            .unwrap();
        let alone = judge(&policy.inner);
        for (i, (s, got)) in sols.iter().zip(got).enumerate() {
            match got.unwrap_or_else(|| panic!("solution {i} never handed on")) {
                Err(e) => assert!(i == 5 && e.to_string().contains("went away"), "{i}: {e}"),
                Ok(got) => assert_eq!(got, alone.annotate(s).unwrap(), "solution {i}"),
            }
        }
        assert_eq!(policy.calls(), [JUDGED_TOGETHER, 9]);
        // A policy that does not batch is left to the runner's threads.
        assert!(alone.annotate_together(&sols, &mut |_, _| Ok(())).is_none());
    }

    /// Verdicts weighed by likelihood are left to the runner's threads.
    #[test]
    fn verdicts_weighed_by_likelihood_are_left_to_the_runner() {
        let policy = Batching::new(crate::judge::tests::Weights);
        let judge = Judge {
            policy: &policy,
            samples: 1,
            seed: 0,
            format: &IndexAnswer,
            likelihood: true,
        };
        assert!(judge.annotate_together(&[], &mut |_, _| Ok(())).is_none());
    }
}
