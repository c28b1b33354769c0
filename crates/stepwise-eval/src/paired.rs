//! Paired differences: two methods measured on the same problems, compared problem by problem.
//! The mean of the per-problem differences with a bootstrap 95% interval over problems is far
//! tighter than two separate intervals when the methods' per-problem results are correlated
//! (the same hard problems are hard for both), which is what lets a lab of a few hundred
//! problems tell close methods apart.

use crate::bon::bootstrap;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// `a − b` over the problems both were measured on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairedDifference {
    /// The first method.
    pub a: String,
    /// The method it is compared with.
    pub b: String,
    /// What is compared (`best-of-32 accuracy`, `accuracy after RL`, ...).
    pub measure: String,
    /// Mean over problems of `a`'s result minus `b`'s.
    pub difference: f64,
    /// Bootstrap 95% interval of the mean difference (problems resampled, pairs kept).
    pub ci95: (f64, f64),
    /// Problems compared.
    pub problems: usize,
}

impl PairedDifference {
    /// Whether the interval excludes 0: `a` better (`Some(true)`), worse (`Some(false)`), or
    /// not told apart (`None`).
    pub fn separates(&self) -> Option<bool> {
        if self.ci95.0 > 0.0 {
            Some(true)
        } else if self.ci95.1 < 0.0 {
            Some(false)
        } else {
            None
        }
    }
}

/// The paired difference of per-problem results `xs` (method `a`) and `ys` (method `b`), the
/// `i`-th of each on the same problem. Panics if the lengths differ (a pairing bug).
pub fn paired_difference(measure: &str, a: &str, xs: &[f64], b: &str, ys: &[f64], seed: u64) -> PairedDifference {
    assert_eq!(
        xs.len(),
        ys.len(),
        "paired results of {a} and {b} must be on the same problems"
    );
    let diffs: Vec<f64> = xs.iter().zip(ys).map(|(x, y)| x - y).collect();
    let difference = diffs.iter().sum::<f64>() / diffs.len().max(1) as f64;
    PairedDifference {
        a: a.into(),
        b: b.into(),
        measure: measure.into(),
        difference,
        ci95: bootstrap(&diffs, 2000, &mut ChaCha8Rng::seed_from_u64(seed)),
        problems: diffs.len(),
    }
}

/// Per-problem results keyed by problem id, paired on the ids both have (sorted).
pub fn paired_by_id(
    measure: &str,
    a: &str,
    xs: &std::collections::BTreeMap<String, f64>,
    b: &str,
    ys: &std::collections::BTreeMap<String, f64>,
    seed: u64,
) -> PairedDifference {
    let (px, py): (Vec<f64>, Vec<f64>) = xs.iter().filter_map(|(k, x)| ys.get(k).map(|y| (*x, *y))).unzip();
    paired_difference(measure, a, &px, b, &py, seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairing_separates_what_two_intervals_cannot() {
        // 200 problems of very different difficulty; b is a little better on a few of them.
        let xs: Vec<f64> = (0..200).map(|i| f64::from(u8::from(i % 2 == 0))).collect();
        let mut ys = xs.clone();
        for y in ys.iter_mut().skip(1).step_by(10) {
            *y = 1.0;
        }
        let d = paired_difference("accuracy", "b", &ys, "a", &xs, 0);
        assert!((d.difference - 0.1).abs() < 1e-12);
        assert_eq!(d.separates(), Some(true), "{d:?}");
        // Unpaired, the two intervals overlap.
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let (ia, ib) = (bootstrap(&xs, 2000, &mut rng), bootstrap(&ys, 2000, &mut rng));
        assert!(ia.1 > ib.0, "separate intervals overlap: {ia:?} {ib:?}");
        // The same method against itself is told apart from nothing.
        let same = paired_difference("accuracy", "a", &xs, "a", &xs, 0);
        assert_eq!((same.difference, same.ci95, same.separates()), (0.0, (0.0, 0.0), None));
    }

    #[test]
    fn pairs_by_id_use_only_shared_problems() {
        let xs = [("p1", 1.0), ("p2", 0.0), ("p3", 1.0)]
            .map(|(k, v)| (k.to_string(), v))
            .into();
        let ys = [("p2", 1.0), ("p3", 1.0), ("p4", 0.0)]
            .map(|(k, v)| (k.to_string(), v))
            .into();
        let d = paired_by_id("accuracy", "x", &xs, "y", &ys, 0);
        assert_eq!(d.problems, 2);
        assert!((d.difference + 0.5).abs() < 1e-12);
    }
}
