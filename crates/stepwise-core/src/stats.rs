//! Dataset statistics: counts, steps per solution, label balance, first-error histogram.

use crate::record::{LabelValue, Rating, Solution};
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};

/// Summary of a set of solutions.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    /// Number of solutions.
    pub solutions: usize,
    /// Number of distinct problems.
    pub problems: usize,
    /// Number of steps.
    pub steps: usize,
    /// Minimum, mean and maximum steps per solution.
    pub steps_per_solution: (usize, f64, usize),
    /// Steps with a hard label: good, neutral, bad.
    pub hard_labels: (usize, usize, usize),
    /// Steps with a soft label, and their mean value.
    pub soft_labels: (usize, f64),
    /// Steps without a label.
    pub unlabelled_steps: usize,
    /// Solutions whose steps are all good / that contain a bad step.
    pub all_good_solutions: usize,
    /// Solutions with at least one bad step.
    pub solutions_with_error: usize,
    /// Index of the first bad step → number of solutions.
    pub first_error_histogram: BTreeMap<usize, usize>,
    /// Solutions with a known outcome: correct, incorrect.
    pub outcomes: (usize, usize),
}

/// Compute statistics over solutions.
pub fn stats<'a>(sols: impl IntoIterator<Item = &'a Solution>) -> Stats {
    let mut s = Stats::default();
    let mut problems = HashSet::new();
    let (mut min, mut max) = (usize::MAX, 0usize);
    let mut soft_sum = 0.0;
    for sol in sols {
        s.solutions += 1;
        problems.insert(sol.problem_id.clone());
        let n = sol.steps.len();
        s.steps += n;
        min = min.min(n);
        max = max.max(n);
        for st in &sol.steps {
            match st.label.as_ref().map(|l| l.value) {
                None => s.unlabelled_steps += 1,
                Some(LabelValue::Hard { rating: Rating::Good }) => s.hard_labels.0 += 1,
                Some(LabelValue::Hard {
                    rating: Rating::Neutral,
                }) => s.hard_labels.1 += 1,
                Some(LabelValue::Hard { rating: Rating::Bad }) => s.hard_labels.2 += 1,
                Some(LabelValue::Soft { p }) => {
                    s.soft_labels.0 += 1;
                    soft_sum += p as f64;
                }
            }
        }
        match sol.first_error() {
            Some(i) => {
                s.solutions_with_error += 1;
                *s.first_error_histogram.entry(i).or_default() += 1;
            }
            None if sol.fully_labelled() && n > 0 => s.all_good_solutions += 1,
            None => {}
        }
        match sol.correct {
            Some(true) => s.outcomes.0 += 1,
            Some(false) => s.outcomes.1 += 1,
            None => {}
        }
    }
    s.problems = problems.len();
    let mean = if s.solutions > 0 {
        s.steps as f64 / s.solutions as f64
    } else {
        0.0
    };
    s.steps_per_solution = (if s.solutions > 0 { min } else { 0 }, mean, max);
    if s.soft_labels.0 > 0 {
        s.soft_labels.1 = soft_sum / s.soft_labels.0 as f64;
    }
    s
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "solutions           {}", self.solutions)?;
        writeln!(f, "problems            {}", self.problems)?;
        writeln!(f, "steps               {}", self.steps)?;
        let (a, m, b) = self.steps_per_solution;
        writeln!(f, "steps per solution  min {a}, mean {m:.2}, max {b}")?;
        let (g, n, bad) = self.hard_labels;
        writeln!(f, "hard labels         good {g}, neutral {n}, bad {bad}")?;
        writeln!(
            f,
            "soft labels         {} (mean {:.3})",
            self.soft_labels.0, self.soft_labels.1
        )?;
        writeln!(f, "unlabelled steps    {}", self.unlabelled_steps)?;
        writeln!(f, "solutions all good  {}", self.all_good_solutions)?;
        writeln!(f, "with a bad step     {}", self.solutions_with_error)?;
        writeln!(
            f,
            "outcomes            correct {}, incorrect {}",
            self.outcomes.0, self.outcomes.1
        )?;
        write!(f, "first error at step")?;
        for (k, v) in &self.first_error_histogram {
            write!(f, "  {k}:{v}")?;
        }
        writeln!(f)
    }
}

/// Area under the ROC curve (ties counted half); 0.5 when one class is absent.
pub fn auroc(pairs: &[(f32, bool)]) -> f64 {
    let pos = pairs.iter().filter(|p| p.1).count();
    let neg = pairs.len() - pos;
    if pos == 0 || neg == 0 {
        return 0.5;
    }
    let mut v: Vec<(f32, bool)> = pairs.to_vec();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Rank-sum with average ranks for ties.
    let mut rank_sum = 0.0;
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j < v.len() && v[j].0 == v[i].0 {
            j += 1;
        }
        let avg = (i + j + 1) as f64 / 2.0;
        rank_sum += avg * v[i..j].iter().filter(|p| p.1).count() as f64;
        i = j;
    }
    (rank_sum - (pos * (pos + 1)) as f64 / 2.0) / (pos * neg) as f64
}
