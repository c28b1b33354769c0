//! Quality of automatic step labels against reference labels, and calibration of scores.

use serde::{Deserialize, Serialize};

/// Agreement of predicted labels with reference labels.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LabelQuality {
    /// Steps compared.
    pub steps: usize,
    /// Hard-label accuracy (predicted good ⇔ reference good).
    pub hard_accuracy: f64,
    /// Of the steps the reference calls bad, the fraction predicted bad.
    pub bad_recall: f64,
    /// Of the steps predicted bad, the fraction the reference calls bad.
    pub bad_precision: f64,
    /// Brier score of soft labels against the reference (lower is better).
    pub soft_brier: f64,
}

/// Compare (predicted P(good), reference good) pairs; hard prediction is `p > threshold`.
pub fn label_quality(pairs: &[(f32, bool)], threshold: f32) -> LabelQuality {
    let n = pairs.len();
    let (mut ok, mut bad_ref, mut bad_pred, mut bad_both, mut brier) = (0, 0, 0, 0, 0.0);
    for &(p, good) in pairs {
        let pred_good = p > threshold;
        ok += usize::from(pred_good == good);
        bad_ref += usize::from(!good);
        bad_pred += usize::from(!pred_good);
        bad_both += usize::from(!good && !pred_good);
        let y = if good { 1.0 } else { 0.0 };
        brier += (p as f64 - y).powi(2);
    }
    LabelQuality {
        steps: n,
        hard_accuracy: ok as f64 / n.max(1) as f64,
        bad_recall: bad_both as f64 / bad_ref.max(1) as f64,
        bad_precision: bad_both as f64 / bad_pred.max(1) as f64,
        soft_brier: brier / n.max(1) as f64,
    }
}

/// One reliability-diagram bin: (mean predicted, observed frequency, count).
pub type Bin = (f64, f64, usize);

/// A named series of reliability bins (one per scorer).
pub type CalibrationSeries = (String, Vec<Bin>);

/// Reliability diagram bins for `bins` equal-width bins (empty ones left out).
pub fn calibration(pairs: &[(f32, bool)], bins: usize) -> Vec<Bin> {
    let mut acc = vec![(0.0, 0.0, 0usize); bins];
    for &(p, y) in pairs {
        let b = ((p.clamp(0.0, 1.0) * bins as f32) as usize).min(bins - 1);
        acc[b].0 += p as f64;
        acc[b].1 += if y { 1.0 } else { 0.0 };
        acc[b].2 += 1;
    }
    acc.into_iter()
        .filter(|b| b.2 > 0)
        .map(|(s, y, c)| (s / c as f64, y / c as f64, c))
        .collect()
}
