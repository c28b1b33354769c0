//! The problems of a run: policy-training, annotation and held-out evaluation splits.

use crate::preset::Preset;
use crate::task::{self, LabProblem};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::HashSet;

/// The problems of a run: policy-training, annotation and evaluation splits.
pub struct Splits {
    /// For training the policy.
    pub policy: Vec<LabProblem>,
    /// For annotation (verifier training).
    pub label: Vec<LabProblem>,
    /// Held out for evaluation.
    pub eval: Vec<LabProblem>,
}

/// The splits of a run. Training problems (policy, then annotation) come from the seed's first
/// random stream; held-out problems from a second stream, so the evaluation set does not move when
/// a training budget changes, and without any question a training problem already asked
/// (decontamination, as real benchmarks are screened). Held-out ids are `e00000`, `e00001`, ….
pub fn splits(p: &Preset, seed: u64) -> Splits {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut policy: Vec<LabProblem> = (0..p.policy_problems + p.label_problems)
        .map(|i| task::generate(&mut rng, i))
        .collect();
    let label = policy.split_off(p.policy_problems);
    let seen: HashSet<&str> = policy.iter().chain(&label).map(|q| q.question.as_str()).collect();
    let mut eval_rng = ChaCha8Rng::seed_from_u64(seed);
    eval_rng.set_stream(1);
    let eval = (0..)
        .map(|i| task::generate(&mut eval_rng, i))
        .filter(|q| !seen.contains(q.question.as_str()))
        .take(p.eval_problems)
        .enumerate()
        .map(|(i, q)| LabProblem {
            id: format!("e{i:05}"),
            ..q
        })
        .collect();
    Splits { policy, label, eval }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_out_problems_ignore_training_budgets_and_never_repeat_a_training_question() {
        let small = Preset::quick();
        let big = Preset::quick()
            .with_overrides(&["label_problems=300".into(), "policy_problems=2000".into()])
            .unwrap();
        let (a, b) = (splits(&small, 7), splits(&big, 7));
        let questions = |s: &Splits| s.eval.iter().map(|q| q.question.clone()).collect::<Vec<_>>();
        assert_eq!(
            questions(&a),
            questions(&b),
            "the held-out set must not move with the budgets"
        );
        assert_eq!(b.eval.len(), big.eval_problems);
        let seen: HashSet<&str> = b.policy.iter().chain(&b.label).map(|q| q.question.as_str()).collect();
        assert!(b.eval.iter().all(|q| !seen.contains(q.question.as_str())));
        assert_eq!(b.eval[3].id, "e00003");
        let ids: HashSet<&str> = b.label.iter().chain(&b.eval).map(|q| q.id.as_str()).collect();
        assert_eq!(ids.len(), b.label.len() + b.eval.len(), "problem ids are unique");
    }
}
