//! Stage 3, annotation: Monte Carlo step labels (Math-Shepherd) and binary search for the first
//! error (OmegaPRM) through the annotator seam, and the hard estimate PRM-MC learns by default.

use crate::oracle::LabTask;
use crate::progress::bar;
use anyhow::Result;
use std::path::Path;
use stepwise_core::seams::Spent;
use stepwise_core::{Policy, Solution, StepLabel};
use stepwise_label::{annotate_resumable, BinarySearch, McOptions, MonteCarlo};

/// Monte Carlo annotation of `sols`, resumable; returns labelled solutions and rollouts spent.
pub fn annotate_stage(
    path: &Path,
    sols: &[Solution],
    policy: &dyn Policy,
    task: &LabTask,
    rollouts: usize,
    seed: u64,
) -> Result<(Vec<Solution>, Spent)> {
    let pb = bar(sols.len() as u64, "annotating (MC)");
    let mc = MonteCarlo {
        policy,
        task,
        options: McOptions { rollouts, seed },
    };
    let out = annotate_resumable(path, sols, &mc, |done| pb.set_position(done as u64))?;
    pb.finish_and_clear();
    Ok(out)
}

/// Binary search for the first error (OmegaPRM) on `sols`, resumable, with the rollout seeds of
/// [`annotate_stage`] (a prefix both probe gets the same rollouts); returns labelled solutions
/// and rollouts spent.
pub fn binary_search_stage(
    path: &Path,
    sols: &[Solution],
    policy: &dyn Policy,
    task: &LabTask,
    rollouts: usize,
    seed: u64,
) -> Result<(Vec<Solution>, Spent)> {
    let pb = bar(sols.len() as u64, "annotating (binary search)");
    let bs = BinarySearch {
        policy,
        task,
        options: McOptions { rollouts, seed },
    };
    let out = annotate_resumable(path, sols, &bs, |done| pb.set_position(done as u64))?;
    pb.finish_and_clear();
    Ok(out)
}

/// Hard Monte Carlo labels (Math-Shepherd hard estimation: good when any rollout succeeded).
pub fn hard_mc(s: &Solution) -> Solution {
    let mut s = s.clone();
    for st in &mut s.steps {
        if let Some(l) = &st.label {
            st.label = Some(StepLabel::from_bool(l.is_good(), l.source.clone()));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use stepwise_core::{Provenance, Step};

    #[test]
    fn hard_estimation_is_any_rollout_succeeded() {
        let soft = |hits| StepLabel::soft(hits as f32 / 8.0, Provenance::MonteCarlo { rollouts: 8, hits });
        let s = Solution {
            steps: vec![Step::labelled("a", soft(1)), Step::labelled("b", soft(0))],
            ..Default::default()
        };
        let hard: Vec<f32> = hard_mc(&s)
            .steps
            .iter()
            .map(|st| st.label.as_ref().unwrap().prob(0.5))
            .collect();
        assert_eq!(hard, [1.0, 0.0]);
    }
}
