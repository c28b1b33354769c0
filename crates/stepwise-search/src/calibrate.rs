//! Calibrating the verify → resample threshold `τ` on labelled data: a step scored below `τ` is
//! called bad; `τ` is the largest threshold whose "bad" calls reach a target precision, so users
//! do not hand-pick it. Read left to right as verification does: each solution's steps up to and
//! including its first bad one (later steps' labels say nothing about a verifier that stops there).

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;
use stepwise_core::Solution;

/// The file in a verifier's folder holding its calibrated threshold.
pub const THRESHOLD_FILE: &str = "threshold.json";

/// A calibrated threshold and how it does on the data it was calibrated on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Threshold {
    /// `τ`: a step scored below it is rejected.
    pub tau: f32,
    /// The precision asked for.
    pub target_precision: f64,
    /// Precision of "bad" calls at `τ`: bad steps among the steps scored below it.
    pub precision: f64,
    /// Recall of bad steps at `τ`.
    pub recall: f64,
    /// Steps read.
    pub steps: usize,
    /// Bad steps among them.
    pub bad_steps: usize,
    /// The verifier name the scores were read under.
    pub verifier: String,
}

/// The (score, bad) pairs of `sols` under `verifier`, each solution read up to its first bad step.
pub fn scored_steps(sols: &[Solution], verifier: &str) -> Result<Vec<(f32, bool)>> {
    let mut out = Vec::new();
    for (i, s) in sols.iter().enumerate() {
        let scores = s.scores_of(verifier).with_context(|| {
            format!(
                "record {} (`{}`): field `scores.{verifier}`: missing or not one per step",
                i + 1,
                s.id
            )
        })?;
        for (step, score) in s.steps.iter().zip(scores) {
            let Some(label) = &step.label else {
                bail!(
                    "record {} (`{}`): field `steps[].label`: missing (calibration needs labelled steps)",
                    i + 1,
                    s.id
                );
            };
            let bad = !label.is_good();
            out.push((score, bad));
            if bad {
                break;
            }
        }
    }
    Ok(out)
}

/// The largest `τ` (a midpoint between two distinct scores) at which the steps scored below it
/// are bad with at least `target_precision`; `None` when no threshold reaches it.
pub fn calibrate(steps: &[(f32, bool)], target_precision: f64, verifier: &str) -> Option<Threshold> {
    let mut sorted: Vec<(f32, bool)> = steps.iter().copied().filter(|(s, _)| s.is_finite()).collect();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total_bad = sorted.iter().filter(|(_, b)| *b).count();
    let mut best = None;
    let mut bad = 0;
    for k in 0..sorted.len() {
        bad += usize::from(sorted[k].1);
        // τ between this score and the next distinct one flags the first k + 1 steps.
        let next = sorted.get(k + 1).map(|n| n.0);
        if next == Some(sorted[k].0) {
            continue;
        }
        let precision = bad as f64 / (k + 1) as f64;
        if precision >= target_precision && bad > 0 {
            let tau = match next {
                Some(n) => (sorted[k].0 + n) / 2.0,
                None => f32::INFINITY.min(sorted[k].0 + 1e-6),
            };
            best = Some(Threshold {
                tau,
                target_precision,
                precision,
                recall: bad as f64 / total_bad.max(1) as f64,
                steps: sorted.len(),
                bad_steps: total_bad,
                verifier: verifier.to_string(),
            });
        }
    }
    best
}

impl Threshold {
    /// Write it into the verifier folder `dir`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join(THRESHOLD_FILE);
        std::fs::write(&path, serde_json::to_string_pretty(self)?)
            .with_context(|| format!("writing {}", path.display()))
    }

    /// The threshold calibrated for the verifier in `dir`, if any.
    pub fn load(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join(THRESHOLD_FILE);
        if !path.exists() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let t: Threshold = serde_json::from_str(&text).with_context(|| format!("{}: invalid", path.display()))?;
        if !t.tau.is_finite() {
            bail!("{}: field `tau`: {} is not a finite number", path.display(), t.tau);
        }
        Ok(Some(t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_threshold_that_keeps_the_precision() {
        // Scores of bad steps: 0.1, 0.2, 0.45; good steps: 0.3, 0.6, 0.9.
        let steps = [
            (0.1, true),
            (0.2, true),
            (0.3, false),
            (0.45, true),
            (0.6, false),
            (0.9, false),
        ];
        let t = calibrate(&steps, 1.0, "prm").unwrap();
        assert!((t.tau - 0.25).abs() < 1e-6, "{t:?}");
        assert!((t.recall - 2.0 / 3.0).abs() < 1e-9);
        let t = calibrate(&steps, 0.75, "prm").unwrap();
        assert!((t.tau - 0.525).abs() < 1e-6, "{t:?}");
        assert!((t.precision - 0.75).abs() < 1e-9 && t.recall == 1.0);
        assert!(calibrate(&[(0.1, false), (0.2, true)], 0.9, "prm").is_none());
    }
}
