//! Stage 3, annotation: Monte Carlo step labels (Math-Shepherd) and binary search for the first
//! error (OmegaPRM) through the annotator seam, and the hard estimate PRM-MC learns by default.

use crate::progress::bar;
use anyhow::Result;
use std::path::Path;
use stepwise_core::seams::{Annotator, Spent};
use stepwise_core::{Solution, StepLabel};
use stepwise_label::annotate_resumable;

/// Label `sols` with `annotator`, resumable (the journal at `path`), showing `what` on the
/// progress bar; returns labelled solutions and rollouts spent.
pub fn label_stage(
    path: &Path,
    sols: &[Solution],
    annotator: &dyn Annotator,
    what: &str,
) -> Result<(Vec<Solution>, Spent)> {
    let pb = bar(sols.len() as u64, what);
    let out = annotate_resumable(path, sols, annotator, |done| pb.set_position(done as u64))?;
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
