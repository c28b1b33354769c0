//! [`Annotator`]: anything that labels the steps of a solution.

use crate::Solution;
use anyhow::Result;

/// What an annotation cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spent {
    /// Rollouts (continuations to the end) sampled.
    pub rollouts: usize,
    /// Tokens generated.
    pub tokens: usize,
    /// Environment steps taken (agents: each action a rollout or a replay takes).
    pub env_steps: usize,
}

impl std::ops::AddAssign for Spent {
    fn add_assign(&mut self, o: Spent) {
        self.rollouts += o.rollouts;
        self.tokens += o.tokens;
        self.env_steps += o.env_steps;
    }
}

/// Labels the steps of solutions: Monte Carlo rollouts, binary search, a judge, a consensus.
pub trait Annotator: Sync {
    /// A short name for records and reports (`mc`, `binary_search`, …).
    fn name(&self) -> &str;

    /// The solution with its steps labelled, and what labelling it cost.
    fn annotate(&self, sol: &Solution) -> Result<(Solution, Spent)>;

    /// Label the solutions of one problem together: each labelled with what it cost, in the
    /// order given, then any new solutions the annotation produced (OmegaPRM's completed
    /// rollouts, marked in `meta`). An annotator that shares work across a problem's solutions
    /// (a rollout tree) overrides it; the default labels each on its own.
    fn annotate_problem(&self, sols: &[Solution]) -> Result<Vec<(Solution, Spent)>> {
        sols.iter().map(|s| self.annotate(s)).collect()
    }

    /// Whether [`Annotator::annotate_problem`] must see all of a problem's solutions at once
    /// (runners then group them by `problem_id`); `false` lets them label one at a time.
    fn by_problem(&self) -> bool {
        false
    }

    /// Label `sols` many at a time on a policy that decodes many rows in one pass
    /// ([`crate::seams::Policy::batch`]), each as [`Annotator::annotate`] labels it alone, each
    /// handed to `done` with its index in `sols` as soon as it is labelled (in any order; an
    /// error from `done` stops the rest and is returned). `None`: this annotator, or its policy,
    /// labels one solution at a time (runners then label several at once on threads); the
    /// default.
    fn annotate_together(&self, sols: &[Solution], done: &mut Done<'_>) -> Option<Result<()>> {
        let _ = (sols, done);
        None
    }

    /// [`Annotator::annotate_problem`] for many problems at once (`problems`: each one's
    /// solutions) on a policy that decodes many rows in one pass, each problem's result handed
    /// to `done` with its index as soon as it is ready (in any order; an error from `done` stops
    /// the rest and is returned). `None`: one problem at a time (runners then label several on
    /// threads); the default.
    fn annotate_problems_together(&self, problems: &[Vec<Solution>], done: &mut ProblemDone<'_>) -> Option<Result<()>> {
        let _ = (problems, done);
        None
    }
}

/// Where [`Annotator::annotate_problems_together`] hands each problem's labelled solutions: its
/// index among those given, and what [`Annotator::annotate_problem`] gives it.
pub type ProblemDone<'a> = dyn FnMut(usize, Result<Vec<(Solution, Spent)>>) -> Result<()> + 'a;

/// Where [`Annotator::annotate_together`] hands each labelled solution: its index among those
/// given, and the solution labelled with what it cost, or why it could not be.
pub type Done<'a> = dyn FnMut(usize, Result<(Solution, Spent)>) -> Result<()> + 'a;

/// An annotator behind a reference is one too.
impl<A: Annotator + ?Sized> Annotator for &A {
    fn name(&self) -> &str {
        (**self).name()
    }

    fn annotate(&self, sol: &Solution) -> Result<(Solution, Spent)> {
        (**self).annotate(sol)
    }

    fn annotate_problem(&self, sols: &[Solution]) -> Result<Vec<(Solution, Spent)>> {
        (**self).annotate_problem(sols)
    }

    fn by_problem(&self) -> bool {
        (**self).by_problem()
    }

    fn annotate_together(&self, sols: &[Solution], done: &mut Done<'_>) -> Option<Result<()>> {
        (**self).annotate_together(sols, done)
    }

    fn annotate_problems_together(&self, problems: &[Vec<Solution>], done: &mut ProblemDone<'_>) -> Option<Result<()>> {
        (**self).annotate_problems_together(problems, done)
    }
}
