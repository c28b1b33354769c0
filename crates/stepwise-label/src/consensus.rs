//! Consensus filtering (the Qwen2.5-Math-PRM recipe): two annotators label the same solution, and
//! its labels are kept only where both put the first error on the same step (or both find none).
//! The kept labels are the first annotator's (for Monte Carlo × judge: the soft MC values), their
//! source marked `consensus`; a solution the two disagree on keeps no labels and says so in
//! `meta.consensus`, so training skips it and the retained fraction can be counted.

use anyhow::Result;
use stepwise_core::seams::{Annotator, Done, Spent};
use stepwise_core::{Provenance, Solution, StepLabel};

/// Solutions the first annotator labels together before the second checks them (what an
/// interruption can lose).
const CHECKED_TOGETHER: usize = 128;

/// Two annotators that must agree.
pub struct Consensus<'a> {
    /// Its labels are kept where the two agree.
    pub first: &'a dyn Annotator,
    /// The check.
    pub second: &'a dyn Annotator,
}

/// The first error of a fully labelled solution (`Some(None)`: no error), `None` when a step
/// is unlabelled.
fn verdict(s: &Solution) -> Option<Option<usize>> {
    s.steps.iter().all(|st| st.label.is_some()).then(|| s.first_error())
}

impl Annotator for Consensus<'_> {
    fn name(&self) -> &str {
        "consensus"
    }

    fn annotate(&self, sol: &Solution) -> Result<(Solution, Spent)> {
        let (a, mut spent) = self.first.annotate(sol)?;
        let (b, spent_b) = self.second.annotate(sol)?;
        spent += spent_b;
        Ok((keep_if_agreeing(a, &b), spent))
    }

    /// Where the first annotator labels many solutions at once (Monte Carlo on a policy that
    /// batches), `CHECKED_TOGETHER` at a time: the first labels them together, then the second
    /// checks those it labelled (together too where it can, else on rayon's threads, as many
    /// at once as a runner would: a judge's server requests in flight), each result as
    /// [`Annotator::annotate`] gives it.
    fn annotate_together(&self, sols: &[Solution], done: &mut Done<'_>) -> Option<Result<()>> {
        let firsts = labelled_together(self.first, sols.chunks(CHECKED_TOGETHER).next()?)?;
        Some(self.check_all(sols, firsts, done))
    }
}

impl Consensus<'_> {
    /// Every chunk of `sols` labelled by the first annotator (the first chunk's labels given) and
    /// checked by the second, each handed to `done`.
    fn check_all(&self, sols: &[Solution], firsts: Result<Labelled>, done: &mut Done<'_>) -> Result<()> {
        let mut given = Some(firsts?);
        for (k, chunk) in sols.chunks(CHECKED_TOGETHER).enumerate() {
            let firsts = match given.take() {
                Some(firsts) => firsts,
                None => labelled_together(self.first, chunk).unwrap_or_else(|| labelled_alone(self.first, chunk))?,
            };
            self.check(k * CHECKED_TOGETHER, chunk, firsts, done)?;
        }
        Ok(())
    }

    /// The solutions of `chunk` (starting at `at` among all) the first annotator labelled
    /// (`firsts`) checked by the second, which sees only those, as alone; each handed to `done`.
    fn check(&self, at: usize, chunk: &[Solution], firsts: Labelled, done: &mut Done<'_>) -> Result<()> {
        let picked: Vec<Solution> = (chunk.iter().zip(&firsts))
            .filter(|(_, f)| f.is_ok())
            .map(|(s, _)| s.clone())
            .collect();
        let mut seconds =
            labelled_together(self.second, &picked).unwrap_or_else(|| labelled_alone(self.second, &picked))?;
        seconds.reverse();
        for (i, first) in firsts.into_iter().enumerate() {
            let both = first.and_then(|(a, mut spent)| {
                let (b, spent_b) = seconds.pop().expect("one check a labelled solution")?;
                spent += spent_b;
                Ok((keep_if_agreeing(a, &b), spent))
            });
            done(at + i, both)?;
        }
        Ok(())
    }
}

/// Solutions' labels (or the error each met), in input order.
type Labelled = Vec<Result<(Solution, Spent)>>;

/// Each of `sols` labelled by `a` together ([`Annotator::annotate_together`]), in input order;
/// `None` where it labels one at a time.
fn labelled_together(a: &dyn Annotator, sols: &[Solution]) -> Option<Result<Labelled>> {
    let mut got: Vec<Option<Result<(Solution, Spent)>>> = sols.iter().map(|_| None).collect();
    let run = a.annotate_together(sols, &mut |i, r| {
        got[i] = Some(r);
        Ok(())
    })?;
    Some(run.map(|()| {
        (got.into_iter())
            .map(|r| r.unwrap_or_else(|| Err(anyhow::anyhow!("the annotator skipped a solution"))))
            .collect()
    }))
}

/// Each of `sols` labelled by `a` alone, as many at once as rayon's pool has threads.
fn labelled_alone(a: &dyn Annotator, sols: &[Solution]) -> Result<Labelled> {
    let mut got = Vec::with_capacity(sols.len());
    stepwise_core::parallel::in_order(
        sols,
        rayon::current_num_threads(),
        |s| a.annotate(s),
        |_, r| {
            got.push(r);
            Ok(())
        },
    )?;
    Ok(got)
}

/// `first`'s labels, kept (their source marked `consensus`) when `second` puts the first error
/// on the same step (or both find none), else dropped; `meta.consensus` says which. For two
/// annotations already made (the lab filters its Monte Carlo labels by binary search's).
pub fn keep_if_agreeing(mut first: Solution, second: &Solution) -> Solution {
    let agree = matches!((verdict(&first), verdict(second)), (Some(x), Some(y)) if x == y);
    for st in &mut first.steps {
        st.label = match (&st.label, agree) {
            (Some(l), true) => Some(StepLabel {
                source: Provenance::Consensus,
                ..l.clone()
            }),
            _ => None,
        };
    }
    first.meta.insert("consensus".into(), agree.into());
    first
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::solution;

    /// Labels every step good before `first` (from the solution's id) and bad from it on.
    struct Fixed(fn(&str) -> Option<usize>);

    impl Annotator for Fixed {
        fn name(&self) -> &str {
            "fixed"
        }
        fn annotate(&self, sol: &Solution) -> Result<(Solution, Spent)> {
            let mut out = sol.clone();
            crate::label_by_first_error(&mut out, (self.0)(&sol.id), Provenance::Human);
            Ok((
                out,
                Spent {
                    rollouts: 1,
                    tokens: 2,
                    env_steps: 0,
                },
            ))
        }
    }

    #[test]
    fn keeps_exactly_the_solutions_whose_first_errors_agree() {
        let a = Fixed(|id| match id {
            "agree" => Some(1),
            "none" => None,
            _ => Some(0),
        });
        let b = Fixed(|id| match id {
            "agree" => Some(1),
            "none" => None,
            _ => Some(2),
        });
        let c = Consensus { first: &a, second: &b };
        for (id, kept) in [("agree", true), ("none", true), ("differ", false)] {
            let (l, spent) = c.annotate(&solution(id, &["x", "y", "z"])).unwrap();
            assert_eq!(l.meta["consensus"], kept, "{id}");
            assert_eq!(l.steps.iter().all(|s| s.label.is_some()), kept, "{id}");
            assert!(l
                .steps
                .iter()
                .all(|s| s.label.is_none() || s.label.as_ref().unwrap().source == Provenance::Consensus));
            assert_eq!(
                spent,
                Spent {
                    rollouts: 2,
                    tokens: 4,
                    env_steps: 0
                }
            );
        }
    }
}
