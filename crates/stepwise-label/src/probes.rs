//! The rollouts of the annotators that label a solution by probing its prefixes one after
//! another ([`crate::MonteCarlo`]'s every prefix until the first that no rollout rescues,
//! [`crate::BinarySearch`]'s bisection): each is a `Probe`, which says what prefix to roll out
//! from next and takes what the rollouts found. `Rollouts::one` runs a probe alone, a
//! [`Policy::continue_from`] call a prefix; `Rollouts::together` runs many solutions' probes at
//! once on a policy that batches ([`Policy::batch`]): every prefix asked in one call a round,
//! each solution's rollouts kept in the batch's cache so its next prefix feeds only the new step,
//! a new solution let in as soon as one is labelled. Both draw a prefix's rollouts with the same
//! seed ([`crate::montecarlo::seed_for`]), so both give the same labels.

use anyhow::{Context, Result};
use stepwise_core::seams::{Continuation, NextSteps, Policy, PolicyBatch, Spent, Task, Until};
use stepwise_core::Solution;

/// Solutions labelled at once on a policy that batches: each prefix's rollouts are rows of
/// the same pass (8 rollouts: 256 rows a decoding step).
pub const LABELLED_TOGETHER: usize = 32;

/// How far past the first solution still being labelled a new one may start: results wait to
/// be written in order, so this bounds what an interruption can lose.
const AHEAD: usize = 4 * LABELLED_TOGETHER;

/// One solution's labelling by rollouts from its prefixes.
pub(crate) trait Probe {
    /// The prefix to roll out from next (the index of its last step), `None` once labelled.
    fn next(&mut self) -> Option<usize>;
    /// Of the rollouts from the prefix ending at step `at`, `hits` reached the gold answer.
    fn observe(&mut self, at: usize, hits: usize);
    /// The labelled solution.
    fn finish(self: Box<Self>) -> Solution;
}

/// A solution being labelled: its probe, what it needs to grade rollouts, what it has cost.
pub(crate) struct Probing<'s> {
    sol: &'s Solution,
    texts: Vec<String>,
    gold: &'s str,
    probe: Box<dyn Probe + 's>,
    spent: Spent,
}

impl<'s> Probing<'s> {
    /// `sol`'s labelling, with the probe `start` makes from its steps and its gold answer.
    pub(crate) fn new(sol: &'s Solution, start: impl FnOnce(&[String], &str) -> Box<dyn Probe + 's>) -> Result<Self> {
        let gold = sol
            .gold_answer
            .as_deref()
            .with_context(|| format!("solution {}: field `gold_answer`: missing", sol.id))?;
        let texts = sol.step_strings();
        let probe = start(&texts, gold);
        Ok(Probing {
            sol,
            texts,
            gold,
            probe,
            spent: Spent::default(),
        })
    }

    /// The prefix ending at step `at`, as the policy takes it.
    fn prefix(&self, at: usize) -> Vec<String> {
        self.texts[..=at].to_vec()
    }
}

/// What one round of a labelling asks: rollouts from a prefix.
pub(crate) struct Ask {
    /// What the labelling knows the prefix by.
    pub at: usize,
    /// The prefix's steps.
    pub prefix: Vec<String>,
    /// Rollouts from it.
    pub n: usize,
    /// Their seed.
    pub seed: u64,
}

/// A labelling that rolls out from one prefix at a time until it is done: a solution's
/// [`Probing`] (Monte Carlo, binary search), a problem's OmegaPRM tree search.
pub(crate) trait Rounds {
    /// What it gives once done.
    type Out;
    /// The question the prefixes continue.
    fn question(&self) -> &str;
    /// The next prefix to roll out from (`r`: the rollouts' settings), `None` once done.
    fn next(&mut self, r: &Rollouts<'_>) -> Option<Ask>;
    /// The rollouts `outs` from the prefix `at` (as [`Rounds::next`] named it).
    fn observe(&mut self, r: &Rollouts<'_>, at: usize, outs: Vec<Continuation>);
    /// The result.
    fn finish(self) -> Self::Out;
}

impl Rounds for Probing<'_> {
    type Out = (Solution, Spent);

    fn question(&self) -> &str {
        &self.sol.question
    }

    fn next(&mut self, r: &Rollouts<'_>) -> Option<Ask> {
        let at = self.probe.next()?;
        Some(Ask {
            at,
            prefix: self.prefix(at),
            n: r.options.rollouts,
            seed: crate::montecarlo::seed_for(r.options.seed, &self.sol.id, at),
        })
    }

    /// Grade the rollouts `outs` from the prefix ending at step `at` and tell the probe.
    fn observe(&mut self, r: &Rollouts<'_>, at: usize, outs: Vec<Continuation>) {
        self.spent.rollouts += outs.len();
        self.spent.tokens += outs.iter().map(|c| c.tokens).sum::<usize>();
        let hits = (outs.into_iter())
            .filter(|rest| {
                let mut full: Vec<String> = self.texts[..=at].to_vec();
                full.extend(rest.steps.iter().cloned());
                r.task.is_correct(self.gold, &full)
            })
            .count();
        self.probe.observe(at, hits);
    }

    fn finish(self) -> (Solution, Spent) {
        (self.probe.finish(), self.spent)
    }
}

/// Where [`Rollouts::together`] hands each item's result: its index, and what its labelling
/// gave (or the error it met).
pub(crate) type Handed<'a, O> = dyn FnMut(usize, Result<O>) -> Result<()> + 'a;

/// A policy to roll out with, a task to grade with, how many rollouts a prefix and their seed.
pub(crate) struct Rollouts<'a> {
    policy: &'a dyn Policy,
    pub(crate) task: &'a dyn Task,
    pub(crate) options: &'a crate::McOptions,
}

impl<'a> Rollouts<'a> {
    pub(crate) fn new(policy: &'a dyn Policy, task: &'a dyn Task, options: &'a crate::McOptions) -> Self {
        Rollouts { policy, task, options }
    }

    /// Run one labelling: a [`Policy::continue_from`] call a prefix.
    pub(crate) fn one<L: Rounds>(&self, mut l: L) -> Result<L::Out> {
        while let Some(ask) = l.next(self) {
            let prefix: Vec<&str> = ask.prefix.iter().map(String::as_str).collect();
            let outs = (self.policy).continue_from(l.question(), &prefix, ask.n, Until::End, ask.seed)?;
            l.observe(self, ask.at, outs);
        }
        Ok(l.finish())
    }

    /// Run the labellings `start` makes of `items` on the policy's batch, [`LABELLED_TOGETHER`]
    /// at a time, each result handed to `done` as it is ready (`None`: the policy does not
    /// batch).
    pub(crate) fn together<'s, T, L: Rounds>(
        &self,
        items: &'s [T],
        start: impl Fn(&'s T) -> Result<L>,
        done: &mut Handed<'_, L::Out>,
    ) -> Option<Result<()>> {
        let mut batch = self.policy.batch()?;
        Some(self.drive(batch.as_mut(), items, start, done))
    }

    fn drive<'s, T, L: Rounds>(
        &self,
        batch: &mut dyn PolicyBatch,
        items: &'s [T],
        start: impl Fn(&'s T) -> Result<L>,
        done: &mut Handed<'_, L::Out>,
    ) -> Result<()> {
        // The labellings in progress, by index.
        let mut live: Vec<(usize, L)> = Vec::new();
        let mut next = 0;
        loop {
            let oldest = live.first().map_or(next, |(i, _)| *i);
            while live.len() < LABELLED_TOGETHER && next < items.len() && next < oldest + AHEAD {
                match start(&items[next]) {
                    Ok(l) => live.push((next, l)),
                    Err(e) => done(next, Err(e))?,
                }
                next += 1;
            }
            // Each asks for its next prefix; one with none left is done.
            let mut asking = Vec::with_capacity(live.len());
            for (i, mut l) in live.drain(..) {
                match l.next(self) {
                    Some(ask) => asking.push((i, l, ask)),
                    None => done(i, Ok(l.finish()))?,
                }
            }
            if asking.is_empty() {
                if next < items.len() {
                    continue;
                }
                return Ok(());
            }
            let outs = {
                let prefixes: Vec<Vec<&str>> = (asking.iter())
                    .map(|(_, _, ask)| ask.prefix.iter().map(String::as_str).collect())
                    .collect();
                let asks: Vec<NextSteps> = (asking.iter().zip(&prefixes))
                    .map(|((_, l, ask), prefix)| NextSteps {
                        question: l.question(),
                        prefix,
                        n: ask.n,
                        seed: ask.seed,
                    })
                    .collect();
                batch.continue_all(&asks, Until::End)
            };
            for ((i, mut l, ask), out) in asking.into_iter().zip(outs) {
                match out {
                    Ok(outs) => {
                        l.observe(self, ask.at, outs);
                        live.push((i, l));
                    }
                    Err(e) => done(i, Err(e))?,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LABELLED_TOGETHER;
    use crate::test_support::{solution, toy};
    use crate::{BinarySearch, McOptions, MonteCarlo};
    use stepwise_core::seams::{Annotator, Policy, Spent};
    use stepwise_core::testing::{Batching, PlainTask, ScriptedPolicy};
    use stepwise_core::Solution;

    /// Solutions of 1 to 6 steps with the first error anywhere (or none), more than are labelled
    /// at once; one lacks its gold answer and one's question makes the server fail.
    fn solutions() -> Vec<Solution> {
        let mut sols: Vec<Solution> = (0..3 * LABELLED_TOGETHER)
            .map(|i| {
                let t = 1 + i % 6;
                let mut steps = vec!["good"; t];
                if i % 7 != 0 {
                    steps[i % t] = "bad";
                }
                steps[t - 1] = if i % 3 == 0 { "answer 1" } else { "answer 2" };
                solution(&format!("s{i}"), &steps)
            })
            .collect();
        sols[5].gold_answer = None;
        sols[9].question = "fail".into();
        sols
    }

    /// The toy policy batching, failing the asks of the question "fail".
    fn failing_policy() -> Batching<impl Policy> {
        Batching {
            fails: Box::new(|a| a.question == "fail"),
            ..Batching::new(ScriptedPolicy(toy))
        }
    }

    /// Monte Carlo with 4 rollouts a prefix on `policy`.
    fn monte_carlo<'a>(policy: &'a dyn Policy, task: &'a PlainTask) -> MonteCarlo<'a> {
        MonteCarlo {
            policy,
            task,
            options: McOptions { rollouts: 4, seed: 7 },
        }
    }

    /// Labelled on a batching policy, every solution gets the labels and cost it gets alone
    /// (the failed one its error), in far fewer calls than prefixes rolled out, never more than
    /// [`LABELLED_TOGETHER`] asks a call.
    #[test]
    fn solutions_labelled_together_are_labelled_as_each_alone() {
        let (policy, task) = (failing_policy(), PlainTask::default());
        let mc = monte_carlo(&policy, &task);
        let bs = BinarySearch {
            policy: &policy,
            task: &task,
            options: mc.options.clone(),
        };
        let sols = solutions();
        for annotator in [&mc as &dyn Annotator, &bs] {
            let before = policy.calls().len();
            let mut got: Vec<Option<anyhow::Result<(Solution, Spent)>>> = sols.iter().map(|_| None).collect();
            annotator
                .annotate_together(&sols, &mut |i, done| {
                    assert!(got[i].replace(done).is_none(), "solution {i} handed on twice");
                    Ok(())
                })
                .expect("the policy batches")
                .unwrap();
            let calls = policy.calls()[before..].to_vec();
            let mut prefixes = 0;
            for (i, (s, got)) in sols.iter().zip(got).enumerate() {
                let got = got.unwrap_or_else(|| panic!("solution {i} never handed on"));
                match (i, got) {
                    (5, Err(e)) => assert!(e.to_string().contains("gold_answer"), "{e}"),
                    (9, Err(e)) => assert!(e.to_string().contains("went away"), "{e}"),
                    (_, Ok((l, spent))) => {
                        let (want, want_spent) = annotator.annotate(s).unwrap();
                        assert_eq!((&l.steps, spent), (&want.steps, want_spent), "{}", annotator.name());
                        prefixes += spent.rollouts / 4;
                    }
                    (_, Err(e)) => panic!("solution {i}: {e}"),
                }
            }
            assert!(calls.iter().all(|&n| n <= LABELLED_TOGETHER), "{calls:?}");
            assert!(
                calls.len() * 4 < prefixes,
                "{} calls for {prefixes} prefixes",
                calls.len()
            );
        }
    }

    /// Consensus of Monte Carlo and binary search (both batching) and of Monte Carlo and an
    /// annotator that labels one at a time, labelled together, gives each solution what
    /// `annotate` gives it alone: the labels kept or dropped, both costs, the errors.
    #[test]
    fn consensus_labelled_together_is_labelled_as_alone() {
        let (policy, task) = (failing_policy(), PlainTask::default());
        let mc = monte_carlo(&policy, &task);
        let bs = BinarySearch {
            policy: &policy,
            task: &task,
            options: McOptions { rollouts: 2, seed: 3 },
        };
        let alone = MonteCarlo {
            policy: &ScriptedPolicy(toy),
            task: &task,
            options: McOptions { rollouts: 2, seed: 5 },
        };
        // More solutions than are checked together.
        let sols: Vec<Solution> = (0..3).flat_map(|_| solutions()).collect();
        for second in [&bs as &dyn Annotator, &alone] {
            let c = crate::Consensus { first: &mc, second };
            let mut got: Vec<Option<anyhow::Result<(Solution, Spent)>>> = sols.iter().map(|_| None).collect();
            c.annotate_together(&sols, &mut |i, done| {
                assert!(got[i].replace(done).is_none(), "solution {i} handed on twice");
                Ok(())
            })
            .expect("the first annotator batches")
            .unwrap();
            let mut kept = 0;
            for (i, (s, got)) in sols.iter().zip(got).enumerate() {
                let got = got.unwrap_or_else(|| panic!("solution {i} never handed on"));
                match (c.annotate(s), got) {
                    // The batch fails this one's asks (asked alone, it is answered).
                    (_, Err(got)) if s.question == "fail" => assert!(got.to_string().contains("went away"), "{got}"),
                    (Ok(want), Ok(got)) => {
                        assert_eq!(
                            (&got.0.steps, &got.0.meta, got.1),
                            (&want.0.steps, &want.0.meta, want.1),
                            "{i}"
                        );
                        kept += usize::from(got.0.meta["consensus"] == true);
                    }
                    (Err(want), Err(got)) => assert_eq!(want.to_string(), got.to_string()),
                    (want, got) => panic!("solution {i}: {:?} alone, {:?} together", want.is_ok(), got.is_ok()),
                }
            }
            assert!(kept > 0 && kept < sols.len(), "{kept} of {} kept", sols.len());
        }
    }

    /// An error from where the solutions go stops the labelling and is returned.
    #[test]
    fn an_error_where_the_labels_go_stops_the_rest() {
        let policy = Batching::new(ScriptedPolicy(toy));
        let mc = MonteCarlo {
            policy: &policy,
            task: &PlainTask::default(),
            options: McOptions { rollouts: 2, seed: 0 },
        };
        let mut handed = 0;
        let e = mc
            .annotate_together(&solutions(), &mut |_, _| {
                handed += 1;
                anyhow::ensure!(handed < 3, "full disk");
                Ok(())
            })
            .unwrap()
            .unwrap_err();
        assert_eq!((e.to_string().as_str(), handed), ("full disk", 3));
    }

    /// A policy that does not batch leaves the solutions to the runner's threads.
    #[test]
    fn a_policy_that_does_not_batch_labels_one_at_a_time() {
        let mc = MonteCarlo {
            policy: &ScriptedPolicy(toy),
            task: &PlainTask::default(),
            options: McOptions { rollouts: 2, seed: 0 },
        };
        assert!(mc.annotate_together(&solutions(), &mut |_, _| Ok(())).is_none());
    }
}
