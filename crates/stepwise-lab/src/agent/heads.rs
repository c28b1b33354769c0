//! Promise and progress heads (Xi et al.'s AgentPRM): a PRM trained on TD labels' promise (the
//! λ-return of the state an action led to: the lab's PRM-TD) and one trained on their progress
//! (each action's GAE advantage `A` as the soft label `(A + 1) / 2`, read back as `2s − 1`: the
//! progress head, what `stepwise train-prm --target progress` trains), from the same records.
//! On the held-out trajectories, each reading's agreement with the oracle: the progress head's
//! advantage, the promise head's change (`s − s_before / γ`) and the promise head's own score.

use super::Ctx;
use anyhow::Result;
use serde::Serialize;
use stepwise_agent::progress_targets;
use stepwise_agent::quality::{agreement_by, Agreement};
use stepwise_core::Solution;
use stepwise_model::Model;

/// The score name under which held-out trajectories carry the progress head's scores.
pub const PROGRESS_HEAD: &str = "prm_progress";

/// How well each reading of the heads tells the oracle's good held-out actions from its bad
/// ones (AUC of the reading, useless actions left out, as the labels' agreement).
#[derive(Debug, Clone, Serialize)]
pub struct HeadsReport {
    /// The progress head's advantage, `2s − 1`.
    pub progress_head: Agreement,
    /// The promise head's change, `s − s_before / γ` (the first action's against the start's
    /// value).
    pub promise_change: Agreement,
    /// The promise head's own score: the value of the state the action led to.
    pub promise: Agreement,
}

impl Ctx<'_> {
    /// The progress head, trained from the policy on the TD labels' progress (`td`: the label
    /// split with TD(λ) labels), in `prm_progress/`.
    pub fn progress_head(&self, td: &[Solution]) -> Result<Model> {
        let data = td.iter().map(progress_targets).collect::<Result<Vec<_>>>()?;
        self.verifiers().train_for(
            PROGRESS_HEAD,
            "training the progress head",
            &data,
            false,
            self.preset.agent.verifier_steps,
        )
    }
}

/// The heads' readings of `scored` (held-out trajectories with the progress head's scores under
/// [`PROGRESS_HEAD`] and the promise head's under `promise`) against `oracle` (the same, labelled
/// by the oracle); `v0` is the start's value, `gamma` the labels' discount.
pub fn heads(scored: &[Solution], oracle: &[Solution], promise: &str, v0: f32, gamma: f32) -> HeadsReport {
    let read = |s: &Solution, name: &str, f: &dyn Fn(f32, f32) -> f32| -> Vec<Option<f32>> {
        let scores = s.scores.get(name).map_or(&[][..], Vec::as_slice);
        let before = std::iter::once(v0).chain(scores.iter().copied());
        scores.iter().zip(before).map(|(&x, b)| Some(f(x, b))).collect()
    };
    HeadsReport {
        progress_head: agreement_by(scored, oracle, |s| read(s, PROGRESS_HEAD, &|x, _| 2.0 * x - 1.0)),
        promise_change: agreement_by(scored, oracle, |s| read(s, promise, &|x, b| x - b / gamma.max(1e-6))),
        promise: agreement_by(scored, oracle, |s| read(s, promise, &|x, _| x)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stepwise_core::{Rating, Step, StepLabel};

    fn trajectory(id: &str, ratings: &[Rating], scores: &[(&str, Vec<f32>)]) -> (Solution, Solution) {
        let mut t = Solution {
            id: id.into(),
            steps: ratings.iter().map(|_| Step::new("go north")).collect(),
            ..Default::default()
        };
        let mut o = t.clone();
        for (st, r) in o.steps.iter_mut().zip(ratings) {
            st.label = Some(StepLabel::hard(*r, Default::default()));
        }
        t.scores = scores.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        (t, o)
    }

    #[test]
    fn each_reading_orders_the_oracles_good_actions_above_its_bad_ones() {
        use Rating::{Bad, Good};
        // The progress head is right about every action; the promise head rises after the good
        // action and falls after the bad one (its change is right), but its level is higher at
        // the bad action than at the good one (its own score is wrong).
        let (t, o) = trajectory(
            "a",
            &[Good, Bad],
            &[(PROGRESS_HEAD, vec![0.9, 0.1]), ("prm_td", vec![0.8, 0.7])],
        );
        let (u, p) = trajectory(
            "b",
            &[Bad, Good],
            &[(PROGRESS_HEAD, vec![0.2, 0.8]), ("prm_td", vec![0.1, 0.3])],
        );
        let h = heads(&[t, u], &[o, p], "prm_td", 0.5, 1.0);
        assert_eq!(h.progress_head.compared, 4);
        assert_eq!(h.progress_head.auc, 1.0);
        assert_eq!(h.promise_change.auc, 1.0);
        // Good actions score 0.8 and 0.3, bad ones 0.7 and 0.1: 3 of 4 pairs ordered.
        assert_eq!(h.promise.auc, 0.75);
    }
}
