//! How well labels for actions tell the oracle's good actions from its bad ones.
//!
//! A label's *progress* is what the action gained: TD labels carry it (their GAE advantage);
//! for other soft labels it is `p_t - p_(t-1) / gamma` (the promise of the action against the
//! value of the state before it; `p_(-1)` is the start's value). The agreement is the AUC of
//! progress between actions the oracle calls progress and actions it calls regress, invalid or
//! ruin (useless ones are left out): the chance that a random good action shows more progress
//! than a random bad one, ties counting half. 0.5 is chance, 1 a perfect ordering.

use serde::Serialize;
use stepwise_core::{LabelValue, Provenance, Rating, Solution};

/// The agreement of a set of labels with the oracle's.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Agreement {
    /// Actions compared (good and bad by the oracle, with a label on both sides).
    pub compared: usize,
    /// Of them, the oracle's good ones.
    pub good: usize,
    /// AUC of progress (good against bad).
    pub auc: f64,
}

/// Each step's progress under its label (`None` where unlabelled or hard-labelled).
pub fn progress(sol: &Solution, v0: f32, gamma: f32) -> Vec<Option<f32>> {
    let mut before = Some(v0);
    sol.steps
        .iter()
        .map(|st| {
            let label = st.label.as_ref()?;
            let p = match label.value {
                LabelValue::Soft { p } => p,
                LabelValue::Hard { .. } => {
                    before = None;
                    return None;
                }
            };
            let gained = match label.source {
                Provenance::TemporalDifference { progress, .. } => Some(progress),
                _ => before.map(|b| p - b / gamma.max(1e-6)),
            };
            before = Some(p);
            gained
        })
        .collect()
}

/// The agreement of `labelled` with `oracle` (the same trajectories, in any order, labelled by
/// the oracle).
pub fn agreement(labelled: &[Solution], oracle: &[Solution], v0: f32, gamma: f32) -> Agreement {
    agreement_by(labelled, oracle, |s| progress(s, v0, gamma))
}

/// The agreement of any reading of each action of `sols` with `oracle` (the same trajectories
/// labelled by the oracle): `read` gives a trajectory's value for each step, or `None` where it
/// has none (a verifier's score, a head's advantage). The AUC is the same as [`agreement`]'s.
pub fn agreement_by(sols: &[Solution], oracle: &[Solution], read: impl Fn(&Solution) -> Vec<Option<f32>>) -> Agreement {
    let by_id: std::collections::HashMap<&str, &Solution> = oracle.iter().map(|s| (s.id.as_str(), s)).collect();
    let (mut good, mut bad) = (Vec::new(), Vec::new());
    for s in sols {
        let Some(o) = by_id.get(s.id.as_str()) else { continue };
        for (gained, reference) in read(s).into_iter().zip(&o.steps) {
            match (gained, reference.label.as_ref().and_then(|l| l.rating())) {
                (Some(g), Some(Rating::Good)) => good.push(g),
                (Some(g), Some(Rating::Bad)) => bad.push(g),
                _ => {}
            }
        }
    }
    let mut wins = 0.0;
    for g in &good {
        for b in &bad {
            wins += if g > b {
                1.0
            } else if g == b {
                0.5
            } else {
                0.0
            };
        }
    }
    let pairs = (good.len() * bad.len()).max(1) as f64;
    Agreement {
        compared: good.len() + bad.len(),
        good: good.len(),
        auc: wins / pairs,
    }
}
