//! Monte Carlo step labels (Math-Shepherd): from the prefix ending at step i, sample K
//! completions with the policy; the soft label is the fraction that reach the gold answer, the
//! hard label is "any did". Annotation of a wrong solution stops at the first step no rollout can
//! rescue: every later step is labelled bad without spending rollouts (an error cannot be
//! undone). A correct solution is its own proof that every prefix can be completed, so all of its
//! prefixes are rolled out, however few rollouts succeed.

use crate::probes::{Probe, Probing, Rollouts};
use anyhow::Result;
use stepwise_core::seams::{Annotator, Done, Policy, Spent, Task};
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

impl MonteCarlo<'_> {
    fn rollouts(&self) -> Rollouts<'_> {
        Rollouts::new(self.policy, self.task, &self.options)
    }

    /// `sol`'s labelling: every prefix in turn, until one no rollout rescues.
    fn probing<'s>(&self, sol: &'s Solution) -> Result<Probing<'s>> {
        Probing::new(sol, |texts, gold| {
            Box::new(EveryPrefix {
                out: sol.clone(),
                reaches_gold: self.task.is_correct(gold, texts),
                rollouts: self.options.rollouts.max(1),
                at: 0,
                dead: false,
            })
        })
    }
}

impl Annotator for MonteCarlo<'_> {
    fn name(&self) -> &str {
        "mc"
    }

    /// Label every step of `sol` by rollouts; returns the labelled solution and the rollouts
    /// and tokens spent.
    fn annotate(&self, sol: &Solution) -> Result<(Solution, Spent)> {
        self.rollouts().one(self.probing(sol)?)
    }

    /// Many solutions' prefixes rolled out in one batch a round, where the policy batches.
    fn annotate_together(&self, sols: &[Solution], done: &mut Done<'_>) -> Option<Result<()>> {
        self.rollouts().together(sols, |s| self.probing(s), done)
    }
}

/// Monte Carlo's probe: every prefix in turn; a prefix no rollout rescues (of a solution that
/// does not reach the gold answer) makes every later step bad without rollouts; the last step's
/// only completion is the solution itself.
struct EveryPrefix {
    out: Solution,
    reaches_gold: bool,
    /// Rollouts a prefix (the labels' denominator).
    rollouts: usize,
    /// The next step to label.
    at: usize,
    dead: bool,
}

impl EveryPrefix {
    fn label(&mut self, p: f32, rollouts: usize, hits: usize) {
        let source = Provenance::MonteCarlo {
            rollouts: rollouts as u32,
            hits: hits as u32,
        };
        self.out.steps[self.at].label = Some(StepLabel::soft(p, source));
        self.at += 1;
    }
}

impl Probe for EveryPrefix {
    fn next(&mut self) -> Option<usize> {
        let last = self.out.steps.len().checked_sub(1)?;
        while self.at <= last {
            if self.dead {
                self.label(0.0, 0, 0);
            } else if self.at == last {
                // The solution itself is its only completion (one "rollout", no cost).
                let hits = usize::from(self.reaches_gold);
                self.label(hits as f32, 1, hits);
            } else {
                return Some(self.at);
            }
        }
        None
    }

    fn observe(&mut self, at: usize, hits: usize) {
        debug_assert_eq!(at, self.at);
        self.dead = hits == 0 && !self.reaches_gold;
        self.label(hits as f32 / self.rollouts as f32, self.rollouts, hits);
    }

    fn finish(self: Box<Self>) -> Solution {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::annotate_resumable;
    use stepwise_core::testing::{Batching, PlainTask, ScriptedPolicy};

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

    /// Labelled by the runner, on threads or on a policy's batch, the solutions come out in
    /// input order with the labels each gets alone; cut off, the run resumes to the same file.
    #[test]
    fn parallel_annotation_keeps_input_order_and_equals_one_at_a_time() {
        let sols: Vec<Solution> = (0..75)
            .map(|i| {
                let steps: Vec<&str> = (0..4).map(|j| if j == i % 4 { "bad" } else { "good" }).collect();
                solution(&format!("s{i}"), &steps)
            })
            .collect();
        let batching = Batching::new(ScriptedPolicy(toy));
        for policy in [&ScriptedPolicy(toy) as &dyn Policy, &batching] {
            let mc = MonteCarlo {
                policy,
                task: &PlainTask::default(),
                options: McOptions { rollouts: 4, seed: 3 },
            };
            let path_tmp = tempfile::tempdir().unwrap();
            let path = path_tmp.path().join("stepwise-mc-order.jsonl");
            let (all, spent) = annotate_resumable(&path, &sols, &mc, |_| {}).unwrap();
            let one_by_one: Vec<(Solution, Spent)> = sols.iter().map(|s| mc.annotate(s).unwrap()).collect();
            assert_eq!(
                spent.rollouts,
                one_by_one.iter().map(|(_, n)| n.rollouts).sum::<usize>()
            );
            for (got, (want, _)) in all.iter().zip(&one_by_one) {
                assert_eq!((&got.id, &got.steps), (&want.id, &want.steps));
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let journal_ids: Vec<String> = (text.lines())
                .map(|l| serde_json::from_str::<Solution>(l).unwrap().id)
                .collect();
            assert_eq!(journal_ids, sols.iter().map(|s| s.id.clone()).collect::<Vec<_>>());
            // Cut off after 40 records, the last torn: resumed, the same file.
            let cut: String = text.lines().take(40).map(|l| format!("{l}\n")).collect();
            std::fs::write(&path, format!("{cut}{{\"id\": \"s4")).unwrap();
            let (again, spent_again) = annotate_resumable(&path, &sols, &mc, |_| {}).unwrap();
            assert_eq!((std::fs::read_to_string(&path).unwrap(), spent_again), (text, spent));
            assert_eq!(again.len(), sols.len());
            std::fs::remove_file(&path).unwrap();
        }
        assert!(!batching.calls().is_empty(), "the batching policy was asked in batches");
    }
}
