//! The problems of a run: policy-training, annotation and held-out evaluation splits.

use crate::preset::Preset;
use crate::task::{Domain, LabProblem};
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
    /// Held out for test-time search (ids `t00000`, …).
    pub search: Vec<LabProblem>,
}

/// The splits of a run. Training problems (policy, then annotation) come from the seed's first
/// random stream; held-out problems from a second stream, so the evaluation set does not move when
/// a training budget changes, and without any question a training problem already asked
/// (decontamination, as real benchmarks are screened). Held-out ids are `e00000`, `e00001`, ….
/// Search problems come from a third stream, screened against both.
pub fn splits(p: &Preset, seed: u64) -> Splits {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut policy: Vec<LabProblem> = (0..p.policy.problems + p.annotation.problems)
        .map(|i| p.domain.generate(&mut rng, i))
        .collect();
    let label = policy.split_off(p.policy.problems);
    let seen: HashSet<&str> = policy.iter().chain(&label).map(|q| q.question.as_str()).collect();
    let eval = held_out(p.domain, seed, 1, &seen, p.evaluation.problems, "e");
    let seen: HashSet<&str> = seen
        .into_iter()
        .chain(eval.iter().map(|q| q.question.as_str()))
        .collect();
    let search = held_out(p.domain, seed, 2, &seen, p.search.problems, "t");
    Splits {
        policy,
        label,
        eval,
        search,
    }
}

/// `n` problems from the seed's random stream `stream`, none with a question in `seen`, with ids
/// `{prefix}00000`, `{prefix}00001`, ….
fn held_out(domain: Domain, seed: u64, stream: u64, seen: &HashSet<&str>, n: usize, prefix: &str) -> Vec<LabProblem> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    (0..)
        .map(|i| domain.generate(&mut rng, i))
        .filter(|q| !seen.contains(q.question.as_str()))
        .take(n)
        .enumerate()
        .map(|(i, q)| LabProblem {
            id: format!("{prefix}{i:05}"),
            ..q
        })
        .collect()
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
        assert_eq!(b.eval.len(), big.evaluation.problems);
        let seen: HashSet<&str> = b.policy.iter().chain(&b.label).map(|q| q.question.as_str()).collect();
        assert!(b.eval.iter().all(|q| !seen.contains(q.question.as_str())));
        assert_eq!(b.eval[3].id, "e00003");
        let ids: HashSet<&str> = b.label.iter().chain(&b.eval).map(|q| q.id.as_str()).collect();
        assert_eq!(ids.len(), b.label.len() + b.eval.len(), "problem ids are unique");
        let asked: HashSet<&str> = seen
            .iter()
            .copied()
            .chain(b.eval.iter().map(|q| q.question.as_str()))
            .collect();
        assert_eq!(b.search.len(), big.search.problems);
        assert!(b.search.iter().all(|q| !asked.contains(q.question.as_str())));
    }
}
