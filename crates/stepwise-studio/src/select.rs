//! Queue priorities: which record a labeller is served next. Higher first.

use crate::settings::Policy;
use stepwise_core::record::{LabelValue, Solution};
use twox_hash::XxHash64;

/// The names of a record's step scorers, in the order their scores are read as suggestions.
pub fn scorer_names(s: &Solution) -> Vec<String> {
    s.scores.keys().cloned().collect()
}

/// The suggestion shown beside each step: the named scorer's score, else the record's first
/// scorer (`prm` preferred), else a soft label (Monte Carlo, judge). `None` where there is none.
pub fn suggestions(s: &Solution) -> Vec<Option<f32>> {
    let named = s.scores_of("prm").or_else(|| {
        let first = s.scores.keys().next()?;
        s.scores_of(first)
    });
    match named {
        Some(v) => v.into_iter().map(Some).collect(),
        None => s
            .steps
            .iter()
            .map(|st| match st.label.as_ref().map(|l| l.value) {
                Some(LabelValue::Soft { p }) => Some(p),
                _ => st.score,
            })
            .collect(),
    }
}

/// A number in [0, 1) that depends only on `seed` and `id`: the uniform policy's shuffle.
pub fn shuffle_key(seed: u64, id: &str) -> f64 {
    (XxHash64::oneshot(seed, id.as_bytes()) >> 11) as f64 / (1u64 << 53) as f64
}

/// Whether the record's final answer is known to be wrong: `correct == false`, else a final
/// answer graded against the gold one.
pub fn known_wrong(s: &Solution) -> Option<bool> {
    if let Some(c) = s.correct {
        return Some(!c);
    }
    let (given, gold) = (s.final_answer.as_deref()?, s.gold_answer.as_deref()?);
    Some(!stepwise_core::grader::grade(
        given,
        gold,
        stepwise_core::grader::GradeMode::Lenient,
    ))
}

/// How unsure the scorers are of the record's least certain step, in [0, 1]: the spread of an
/// ensemble (several scorers: twice the largest standard deviation across them), else a single
/// score's closeness to 1/2 (`4 p (1 − p)`). `None` when the record has no scores.
pub fn uncertainty(s: &Solution) -> Option<f64> {
    let per_scorer: Vec<Vec<f32>> = s.scores.keys().filter_map(|k| s.scores_of(k)).collect();
    if per_scorer.len() >= 2 {
        let n = per_scorer.len() as f64;
        return (0..s.steps.len())
            .map(|i| {
                let xs: Vec<f64> = per_scorer.iter().map(|v| v[i] as f64).collect();
                let mean = xs.iter().sum::<f64>() / n;
                let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
                (2.0 * var.sqrt()).min(1.0)
            })
            .reduce(f64::max);
    }
    suggestions(s)
        .into_iter()
        .flatten()
        .map(|p| {
            let p = p.clamp(0.0, 1.0) as f64;
            4.0 * p * (1.0 - p)
        })
        .reduce(f64::max)
}

/// The record's priority under `policy`, and why (shown on the page and exported). A record a
/// policy cannot rank (no scores, no grade) falls behind every ranked one, in shuffled order.
pub fn priority(policy: Policy, seed: u64, s: &Solution) -> (f64, String) {
    let tie = shuffle_key(seed, &s.id);
    match policy {
        Policy::Uniform => (tie, "uniform".into()),
        Policy::ConvincingWrong => {
            let score = suggestions(s)
                .into_iter()
                .flatten()
                .fold(None, |m: Option<f32>, x| Some(m.map_or(x, |m| m.min(x))));
            match (known_wrong(s), score) {
                (Some(true), Some(p)) => (2.0 + p as f64, format!("convincing wrong answer (PRM {p:.2})")),
                (Some(true), None) => (1.0 + tie * 1e-3, "wrong answer, no PRM score".into()),
                _ => (tie * 1e-3, "right or ungraded answer".into()),
            }
        }
        Policy::Uncertainty => match uncertainty(s) {
            Some(u) => (1.0 + u, format!("uncertainty {u:.2}")),
            None => (tie * 1e-3, "no scores".into()),
        },
    }
}
