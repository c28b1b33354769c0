//! The judge on a policy that decodes many rows in one pass ([`Policy::batch`]): the answers on
//! [`JUDGED_TOGETHER`] solutions sampled in one batch call, each solution's with the seed it has
//! alone, so each solution's labels are those [`Judge`] gives it alone. Verdicts weighed by
//! likelihood are weighed for [`JUDGED_TOGETHER`] solutions in one
//! [`Policy::logprobs_after`] call (on the packed engine each prompt fed once, its verdicts
//! going on from its cache); where one solution cannot be weighed (a prompt past the model's
//! context), the chunk's solutions are weighed each alone, so only that one fails.
//!
//! [`Policy::batch`]: stepwise_core::seams::Policy::batch
//! [`Policy::logprobs_after`]: stepwise_core::seams::Policy::logprobs_after

use super::{by_likelihood, labelled, vote, Judge};
use anyhow::Result;
use stepwise_core::seams::{Annotator, Done, NextSteps, PolicyBatch, Spent, Until};
use stepwise_core::Solution;

/// Solutions judged in one call.
pub const JUDGED_TOGETHER: usize = 64;

impl Judge<'_> {
    /// [`stepwise_core::seams::Annotator::annotate_together`] for the judge: `None` where the
    /// policy does not batch.
    pub(super) fn judge_together(&self, sols: &[Solution], done: &mut Done<'_>) -> Option<Result<()>> {
        let mut batch = self.policy.batch()?;
        if self.likelihood {
            drop(batch);
            return Some(self.weighed_together(sols, done));
        }
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

    /// Each chunk of [`JUDGED_TOGETHER`] solutions labelled by its likeliest verdicts, weighed in
    /// one call; a chunk that fails is weighed a solution at a time.
    fn weighed_together(&self, sols: &[Solution], done: &mut Done<'_>) -> Result<()> {
        for (k, chunk) in sols.chunks(JUDGED_TOGETHER).enumerate() {
            let steps: Vec<Vec<String>> = chunk.iter().map(Solution::step_strings).collect();
            let asked: Vec<(&str, &[String])> = (chunk.iter().zip(&steps))
                .map(|(s, st)| (s.question.as_str(), st.as_slice()))
                .collect();
            let labels: Vec<Result<(Solution, Spent)>> = match self.verdict_probabilities(&asked) {
                Ok(weighed) => (chunk.iter().zip(weighed))
                    .map(|(s, w)| {
                        let (best, given, spent) = by_likelihood(w);
                        Ok(labelled(s, best, given, spent))
                    })
                    .collect(),
                Err(_) => chunk.iter().map(|s| self.annotate(s)).collect(),
            };
            for (i, r) in labels.into_iter().enumerate() {
                done(k * JUDGED_TOGETHER + i, r)?;
            }
        }
        Ok(())
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
    use stepwise_core::seams::{Annotator, Continuation, NextOptions, Policy, Spent, Until};
    use stepwise_core::testing::{Batching, ScriptedPolicy};
    use stepwise_core::Solution;

    /// Answers that differ by solution and sample: some readable, some not.
    fn answers(q: &str, p: &[&str], j: usize) -> Vec<String> {
        let k = (q.len() + p.len() + j) % 5;
        vec![["\\boxed{1}", "\\boxed{-1}", "\\boxed{0}", "no idea", "\\boxed{2}"][k].to_string()]
    }

    /// 73 solutions of 1 to 4 steps; the sixth's question says `fail`.
    fn solutions() -> Vec<Solution> {
        (0..JUDGED_TOGETHER + 9)
            .map(|i| Solution {
                id: format!("s{i}"),
                question: if i == 5 { "fail".into() } else { "q".repeat(1 + i % 7) },
                steps: (0..1 + i % 4)
                    .map(|k| stepwise_core::Step::new(format!("step {k} of {i}")))
                    .collect(),
                ..Default::default()
            })
            .collect()
    }

    /// What `judge` hands on for each of `sols` labelled together, each handed on once.
    fn together(judge: &Judge, sols: &[Solution]) -> Vec<anyhow::Result<(Solution, Spent)>> {
        let mut got: Vec<Option<anyhow::Result<(Solution, Spent)>>> = sols.iter().map(|_| None).collect();
        judge
            .annotate_together(sols, &mut |i, r| {
                assert!(got[i].replace(r).is_none(), "solution {i} handed on twice");
                Ok(())
            })
            .expect("the policy batches")
            .unwrap();
        (got.into_iter().enumerate())
            .map(|(i, r)| r.unwrap_or_else(|| panic!("solution {i} never handed on")))
            .collect()
    }

    /// Solutions judged together on a batching policy get the labels, verdict counts and costs
    /// each gets alone, in one call per [`JUDGED_TOGETHER`]; a failed ask fails its solution only.
    #[test]
    fn solutions_judged_together_are_judged_as_each_alone() {
        let sols = solutions();
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
        let got = together(&judge(&policy), &sols);
        let alone = judge(&policy.inner);
        for (i, (s, got)) in sols.iter().zip(got).enumerate() {
            match got {
                Err(e) => assert!(i == 5 && e.to_string().contains("went away"), "{i}: {e}"),
                Ok(got) => assert_eq!(got, alone.annotate(s).unwrap(), "solution {i}"),
            }
        }
        assert_eq!(policy.calls(), [JUDGED_TOGETHER, 9]);
        // A policy that does not batch is left to the runner's threads.
        assert!(alone.annotate_together(&sols, &mut |_, _| Ok(())).is_none());
    }

    /// A judge's answers weighed by a made-up rule of the ask's text; a call with an ask whose
    /// question says `fail` fails whole. Counts the asks of each call.
    #[derive(Default)]
    struct Weighs(std::sync::Mutex<Vec<usize>>);

    impl Policy for Weighs {
        fn continue_from(&self, _: &str, _: &[&str], _: usize, _: Until, _: u64) -> anyhow::Result<Vec<Continuation>> {
            panic!("weighing samples nothing")
        }

        fn logprobs_after(&self, asks: &[NextOptions<'_>], end: bool) -> anyhow::Result<Option<Vec<Vec<f64>>>> {
            assert!(end, "each answer ends");
            self.0.lock().unwrap().push(asks.len());
            if asks.iter().any(|a| a.question.contains("fail")) {
                anyhow::bail!("a prompt past the model's context");
            }
            let text = |a: &NextOptions| a.question.len() + a.prefix.concat().len();
            let weigh = |a: &NextOptions| {
                (a.options.iter().enumerate())
                    .map(|(k, o)| -(((text(a) * 7 + o.len() * 3 + k) % 11) as f64))
                    .collect()
            };
            Ok(Some(asks.iter().map(weigh).collect()))
        }
    }

    /// Verdicts weighed by likelihood are weighed for many solutions in one call and label each
    /// as it is labelled alone; a chunk with a solution that cannot be weighed is weighed a
    /// solution at a time, so only that one fails.
    #[test]
    fn verdicts_weighed_together_label_as_each_alone() {
        let sols = solutions();
        let policy = Batching::new(Weighs::default());
        let judge = |policy| Judge {
            policy,
            samples: 1,
            seed: 0,
            format: &IndexAnswer,
            likelihood: true,
        };
        let got = together(&judge(&policy), &sols);
        let calls = std::mem::take(&mut *policy.inner.0.lock().unwrap());
        let alone = judge(&policy.inner);
        let mut labels = std::collections::BTreeSet::new();
        for (i, (s, got)) in sols.iter().zip(got).enumerate() {
            match got {
                Err(e) => assert!(i == 5 && e.to_string().contains("past the model's context"), "{i}: {e}"),
                Ok(got) => {
                    assert_eq!(got, alone.annotate(s).unwrap(), "solution {i}");
                    labels.insert(format!(
                        "{:?}",
                        got.0.steps.iter().map(|st| st.label.clone()).collect::<Vec<_>>()
                    ));
                }
            }
        }
        assert!(labels.len() > 3, "the labels vary: {labels:?}");
        // The first chunk in one call that failed, then a solution at a time; the rest at once.
        let mut want = vec![JUDGED_TOGETHER];
        want.extend([1; JUDGED_TOGETHER]);
        want.push(9);
        assert_eq!(calls, want);
        // A policy that does not batch is left to the runner's threads.
        assert!(alone.annotate_together(&sols, &mut |_, _| Ok(())).is_none());
    }
}
