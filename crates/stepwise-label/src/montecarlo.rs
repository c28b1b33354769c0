//! Monte Carlo step labels (Math-Shepherd): from the prefix ending at step i, sample K
//! completions with the policy; the soft label is the fraction that reach the gold answer, the
//! hard label is "any did". Annotation of a wrong solution stops at the first step no rollout can
//! rescue: every later step is labelled bad without spending rollouts (an error cannot be
//! undone). A correct solution is its own proof that every prefix can be completed, so all of its
//! prefixes are rolled out, however few rollouts succeed.

use anyhow::{Context, Result};
use stepwise_core::seams::{Annotator, Continuation, Policy, Spent, Task, Until};
use stepwise_core::{Provenance, Solution, StepLabel};

/// Options of Monte Carlo annotation.
#[derive(Debug, Clone)]
pub struct McOptions {
    /// Rollouts per step prefix.
    pub rollouts: usize,
    /// Base seed; each (solution, step) gets its own seed derived from it.
    pub seed: u64,
}

/// The seed of the rollouts from the prefix ending at step `step` of solution `id`.
pub fn seed_for(base: u64, id: &str, step: usize) -> u64 {
    let mut h = 0xcbf29ce484222325u64 ^ base;
    for b in id.bytes().chain(step.to_le_bytes()) {
        h = (h ^ b as u64).wrapping_mul(0x100000001b3);
    }
    h
}

/// The Monte Carlo annotator: a policy to roll out with, a task to grade the rollouts.
pub struct MonteCarlo<'a> {
    /// Completes the prefixes.
    pub policy: &'a dyn Policy,
    /// Grades a completed solution against its gold answer.
    pub task: &'a dyn Task,
    /// Rollouts and seed.
    pub options: McOptions,
}

impl Annotator for MonteCarlo<'_> {
    fn name(&self) -> &str {
        "mc"
    }

    /// Label every step of `sol` by rollouts; returns the labelled solution and the rollouts
    /// and tokens spent.
    fn annotate(&self, sol: &Solution) -> Result<(Solution, Spent)> {
        let o = &self.options;
        let gold = sol
            .gold_answer
            .as_deref()
            .with_context(|| format!("solution {}: field `gold_answer`: missing", sol.id))?;
        let mut out = sol.clone();
        let texts = sol.step_strings();
        let mut spent = Spent::default();
        let mut dead = false;
        let reaches_gold = self.task.is_correct(gold, &texts);
        for i in 0..texts.len() {
            if dead {
                out.steps[i].label = Some(StepLabel::soft(0.0, Provenance::MonteCarlo { rollouts: 0, hits: 0 }));
                continue;
            }
            let prefix: Vec<&str> = texts[..=i].iter().map(String::as_str).collect();
            // The last step: the solution itself is its only completion (one "rollout", no cost).
            let (n, hits) = if i + 1 == texts.len() {
                (1, usize::from(reaches_gold))
            } else {
                let outs: Vec<Continuation> = self.policy.continue_from(
                    &sol.question,
                    &prefix,
                    o.rollouts,
                    Until::End,
                    seed_for(o.seed, &sol.id, i),
                )?;
                spent.rollouts += outs.len();
                spent.tokens += outs.iter().map(|c| c.tokens).sum::<usize>();
                let hits = outs
                    .into_iter()
                    .filter(|rest| {
                        let mut full: Vec<String> = texts[..=i].to_vec();
                        full.extend(rest.steps.iter().cloned());
                        self.task.is_correct(gold, &full)
                    })
                    .count();
                (o.rollouts.max(1), hits)
            };
            let p = hits as f32 / n as f32;
            out.steps[i].label = Some(StepLabel::soft(
                p,
                Provenance::MonteCarlo {
                    rollouts: n as u32,
                    hits: hits as u32,
                },
            ));
            dead = hits == 0 && !reaches_gold;
        }
        Ok((out, spent))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::annotate_resumable;
    use stepwise_core::testing::{PlainTask, ScriptedPolicy};

    use crate::test_support::{solution, toy};

    /// The toy policy's Monte Carlo labels (4 rollouts a prefix) of a solution of `steps`:
    /// the labelled solution, each step's label, and what it cost.
    fn labels_of(steps: &[&str]) -> (Solution, Vec<f32>, Spent) {
        let mc = MonteCarlo {
            policy: &ScriptedPolicy(toy),
            task: &PlainTask::default(),
            options: McOptions { rollouts: 4, seed: 0 },
        };
        let (l, spent) = mc.annotate(&solution("s", steps)).unwrap();
        let p = l.steps.iter().map(|s| s.label.as_ref().unwrap().prob(1.0)).collect();
        (l, p, spent)
    }

    #[test]
    fn labels_stop_at_the_first_unrescuable_step() {
        let (l, p, spent) = labels_of(&["good", "bad", "after", "answer 2"]);
        assert_eq!(p, vec![0.5, 0.0, 0.0, 0.0]);
        assert_eq!(spent.rollouts, 8, "no rollouts after the first dead step");
        assert_eq!(spent.tokens, 16, "two words per scripted rollout");
        assert_eq!(l.first_error(), Some(1));
    }

    #[test]
    fn a_correct_solution_is_rolled_out_at_every_prefix_and_ends_good() {
        // "bad" makes every rollout fail, but the solution still reaches the gold answer: its
        // prefixes are not dead, and its last step is good.
        let (_, p, spent) = labels_of(&["good", "bad", "after", "answer 1"]);
        assert_eq!(p, vec![0.5, 0.0, 0.0, 1.0]);
        assert_eq!(spent.rollouts, 12, "every prefix but the whole solution is rolled out");
    }

    #[test]
    fn parallel_annotation_keeps_input_order_and_equals_one_at_a_time() {
        let sols: Vec<Solution> = (0..11)
            .map(|i| {
                let steps: Vec<&str> = (0..4).map(|j| if j == i % 4 { "bad" } else { "good" }).collect();
                solution(&format!("s{i}"), &steps)
            })
            .collect();
        let mc = MonteCarlo {
            policy: &ScriptedPolicy(toy),
            task: &PlainTask::default(),
            options: McOptions { rollouts: 4, seed: 3 },
        };
        let path = std::env::temp_dir().join(format!("stepwise-mc-order-{}.jsonl", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let (all, spent) = annotate_resumable(&path, &sols, &mc, |_| {}).unwrap();
        let one_by_one: Vec<(Solution, Spent)> = sols.iter().map(|s| mc.annotate(s).unwrap()).collect();
        assert_eq!(
            spent.rollouts,
            one_by_one.iter().map(|(_, n)| n.rollouts).sum::<usize>()
        );
        for (got, (want, _)) in all.iter().zip(&one_by_one) {
            assert_eq!((&got.id, &got.steps), (&want.id, &want.steps));
        }
        let journal_ids: Vec<String> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Solution>(l).unwrap().id)
            .collect();
        assert_eq!(journal_ids, sols.iter().map(|s| s.id.clone()).collect::<Vec<_>>());
        std::fs::remove_file(&path).unwrap();
    }
}
