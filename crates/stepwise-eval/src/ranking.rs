//! How well a verifier ranks what it scores: step-level AUROC against reference step labels, and
//! within-problem AUROC — the chance that a correct sample outscores a wrong sample of the same
//! problem, which is what best-of-N selection depends on (a verifier can separate easy problems
//! from hard ones, and so have a high pooled AUROC, while ranking one problem's samples at random).

use serde::{Deserialize, Serialize};
use stepwise_core::stats::auroc;

/// A verifier's ranking quality.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Discrimination {
    /// AUROC of step scores against the reference step labels (`None` for outcome verifiers).
    pub step_auroc: Option<f64>,
    /// Mean over problems with both correct and wrong samples of the AUROC of solution scores
    /// against correctness (`None` when no problem has both).
    pub within_problem_auroc: Option<f64>,
    /// Problems that entered `within_problem_auroc`.
    pub problems: usize,
}

/// Mean within-group AUROC of `(score, correct)` pairs, over the groups holding both classes, and
/// how many groups that was.
pub fn within_group_auroc(groups: &[Vec<(f32, bool)>]) -> (Option<f64>, usize) {
    let mixed: Vec<f64> = groups
        .iter()
        .filter(|g| g.iter().any(|p| p.1) && g.iter().any(|p| !p.1))
        .map(|g| auroc(g))
        .collect();
    let n = mixed.len();
    ((n > 0).then(|| mixed.iter().sum::<f64>() / n as f64), n)
}

/// Step scores per solution, with the reference label of each step (`None` = unlabelled, skipped).
pub type ScoredSteps<'a> = (&'a [Vec<f32>], &'a [Vec<Option<bool>>]);

/// Step AUROC of `scores` against their labels (for step verifiers), plus within-problem AUROC of
/// the solution scores in `groups`.
pub fn discrimination(scores: Option<ScoredSteps>, groups: &[Vec<(f32, bool)>]) -> Discrimination {
    let step_auroc = scores.map(|(scores, labels)| {
        let pairs: Vec<(f32, bool)> = scores
            .iter()
            .zip(labels)
            .flat_map(|(s, l)| s.iter().zip(l).filter_map(|(x, y)| y.map(|y| (*x, y))))
            .collect();
        auroc(&pairs)
    });
    let (within_problem_auroc, problems) = within_group_auroc(groups);
    Discrimination {
        step_auroc,
        within_problem_auroc,
        problems,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn within_problem_ignores_between_problem_separation() {
        // Problem A: everything scores high; problem B: everything low. Pooled, the correct
        // samples (mostly A's) look separable; within each problem the ranking is inverted.
        let groups = vec![
            vec![
                (0.9, false),
                (0.8, true),
                (0.8, true),
                (0.8, true),
                (0.8, true),
                (0.8, true),
            ],
            vec![(0.2, false), (0.15, false), (0.12, false), (0.1, true)],
            vec![(0.5, true)],
        ];
        let (w, n) = within_group_auroc(&groups);
        assert_eq!(n, 2);
        assert!((w.unwrap() - 0.0).abs() < 1e-12);
        let pooled: Vec<(f32, bool)> = groups.iter().flatten().copied().collect();
        assert!(auroc(&pooled) > 0.5);
    }

    #[test]
    fn step_auroc_skips_unlabelled_steps() {
        let scores = vec![vec![0.9, 0.1, 0.5], vec![0.8]];
        let labels = vec![vec![Some(true), Some(false), None], vec![Some(true)]];
        let d = discrimination(Some((&scores, &labels)), &[]);
        assert_eq!(d.step_auroc, Some(1.0));
        assert_eq!(d.within_problem_auroc, None);
    }
}
