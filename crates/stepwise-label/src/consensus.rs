//! Consensus filtering (the Qwen2.5-Math-PRM recipe): two annotators label the same solution, and
//! its labels are kept only where both put the first error on the same step (or both find none).
//! The kept labels are the first annotator's (for Monte Carlo × judge: the soft MC values), their
//! source marked `consensus`; a solution the two disagree on keeps no labels and says so in
//! `meta.consensus`, so training skips it and the retained fraction can be counted.

use anyhow::Result;
use stepwise_core::seams::{Annotator, Spent};
use stepwise_core::{Provenance, Solution, StepLabel};

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
