//! ProcessBench's metric: identify the earliest wrong step (or that there is none). Accuracy on
//! erroneous solutions, accuracy on correct ones, and their harmonic mean (F1).

use serde::{Deserialize, Serialize};

/// The three numbers ProcessBench reports.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProcessBenchScore {
    /// Exact first-error index found, on solutions that have an error.
    pub error_accuracy: f64,
    /// "No error" predicted, on solutions that have none.
    pub correct_accuracy: f64,
    /// Harmonic mean of the two.
    pub f1: f64,
    /// Solutions with / without an error.
    pub counts: (usize, usize),
}

/// Predicted first error from step scores: the first step scoring below `threshold`.
pub fn predict_first_error(scores: &[f32], threshold: f32) -> Option<usize> {
    scores.iter().position(|&s| s < threshold)
}

/// Score predictions against truth (`None` = no wrong step).
pub fn score(pairs: &[(Option<usize>, Option<usize>)]) -> ProcessBenchScore {
    let (mut e_ok, mut e_n, mut c_ok, mut c_n) = (0, 0, 0, 0);
    for &(pred, truth) in pairs {
        match truth {
            Some(_) => {
                e_n += 1;
                e_ok += usize::from(pred == truth);
            }
            None => {
                c_n += 1;
                c_ok += usize::from(pred.is_none());
            }
        }
    }
    let ea = e_ok as f64 / e_n.max(1) as f64;
    let ca = c_ok as f64 / c_n.max(1) as f64;
    let f1 = if ea + ca > 0.0 { 2.0 * ea * ca / (ea + ca) } else { 0.0 };
    ProcessBenchScore {
        error_accuracy: ea,
        correct_accuracy: ca,
        f1,
        counts: (e_n, c_n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn metric() {
        let s = score(&[(Some(1), Some(1)), (None, Some(2)), (None, None), (Some(0), None)]);
        assert_eq!((s.error_accuracy, s.correct_accuracy), (0.5, 0.5));
        assert!((s.f1 - 0.5).abs() < 1e-12);
        assert_eq!(predict_first_error(&[0.9, 0.4, 0.1], 0.5), Some(1));
    }
}
