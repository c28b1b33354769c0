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
}

impl std::ops::AddAssign for Spent {
    fn add_assign(&mut self, o: Spent) {
        self.rollouts += o.rollouts;
        self.tokens += o.tokens;
    }
}

/// Labels the steps of solutions: Monte Carlo rollouts, binary search, a judge, a consensus.
pub trait Annotator: Sync {
    /// A short name for records and reports (`mc`, `binary_search`, …).
    fn name(&self) -> &str;

    /// The solution with its steps labelled, and what labelling it cost.
    fn annotate(&self, sol: &Solution) -> Result<(Solution, Spent)>;
}
