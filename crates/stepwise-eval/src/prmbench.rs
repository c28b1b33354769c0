//! PRMBench's metric (Song et al., 2025, "PRMBench: A Fine-grained and Challenging Benchmark for
//! Process-Level Reward Models"): every step is predicted correct when its score reaches the
//! threshold, else erroneous. The F1 of the correct steps (positive class) and the F1 of the
//! erroneous ones (negative class) are averaged with equal weights into the PRMScore, over all
//! steps of an error type's solutions, and over every step of the benchmark for the overall
//! score. The nine error types fall in three groups (simplicity, soundness, sensitivity), each
//! reported as the mean PRMScore of its types, as the paper's tables do.

use serde::Serialize;
use std::collections::BTreeMap;

/// The error types, as PRMBench's `classification` spells them, with the paper's names and
/// groups.
pub const ERROR_TYPES: [(&str, &str, &str); 9] = [
    ("redundency", "Non-Redundancy (NR)", "simplicity"),
    ("circular", "Non-Circular Logic (NCL)", "simplicity"),
    ("counterfactual", "Empirical Soundness (ES)", "soundness"),
    ("step_contradiction", "Step Consistency (SC)", "soundness"),
    ("domain_inconsistency", "Domain Consistency (DC)", "soundness"),
    ("confidence", "Confidence Invariance (CI)", "soundness"),
    ("missing_condition", "Prerequisite Sensitivity (PS)", "sensitivity"),
    ("deception", "Deception Resistance (DR)", "sensitivity"),
    ("multi_solution", "Multi-Solution Consistency (MS)", "sensitivity"),
];

/// Step counts of predicted against true verdicts (correct steps are the positive class).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Confusion {
    /// Correct steps predicted correct.
    pub true_positive: usize,
    /// Erroneous steps predicted correct.
    pub false_positive: usize,
    /// Erroneous steps predicted erroneous.
    pub true_negative: usize,
    /// Correct steps predicted erroneous.
    pub false_negative: usize,
}

impl Confusion {
    /// Count one step.
    pub fn add(&mut self, predicted_correct: bool, truly_correct: bool) {
        match (predicted_correct, truly_correct) {
            (true, true) => self.true_positive += 1,
            (true, false) => self.false_positive += 1,
            (false, false) => self.true_negative += 1,
            (false, true) => self.false_negative += 1,
        }
    }

    fn merge(&mut self, o: &Confusion) {
        self.true_positive += o.true_positive;
        self.false_positive += o.false_positive;
        self.true_negative += o.true_negative;
        self.false_negative += o.false_negative;
    }

    /// The F1 of one class from its hits, its false alarms and its misses (`None` when there is
    /// nothing to measure: neither predicted nor present).
    fn f1(hits: usize, false_alarms: usize, misses: usize) -> Option<f64> {
        let denominator = 2 * hits + false_alarms + misses;
        (denominator > 0).then(|| 2.0 * hits as f64 / denominator as f64)
    }
}

/// The metric of a set of steps.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PrmScore {
    /// Solutions counted.
    pub solutions: usize,
    /// Steps counted, and of them erroneous.
    pub steps: usize,
    /// Erroneous steps.
    pub error_steps: usize,
    /// The counts.
    pub confusion: Confusion,
    /// F1 of the correct steps.
    pub f1: Option<f64>,
    /// F1 of the erroneous steps.
    pub negative_f1: Option<f64>,
    /// (F1 + negative F1) / 2: PRMBench's PRMScore.
    pub prm_score: Option<f64>,
    /// Steps whose verdict is right.
    pub accuracy: Option<f64>,
}

impl PrmScore {
    fn of(solutions: usize, c: Confusion) -> Self {
        let steps = c.true_positive + c.false_positive + c.true_negative + c.false_negative;
        let f1 = Confusion::f1(c.true_positive, c.false_positive, c.false_negative);
        let negative_f1 = Confusion::f1(c.true_negative, c.false_negative, c.false_positive);
        PrmScore {
            solutions,
            steps,
            error_steps: c.true_negative + c.false_positive,
            confusion: c,
            f1,
            negative_f1,
            prm_score: f1.zip(negative_f1).map(|(a, b)| 0.5 * a + 0.5 * b),
            accuracy: (steps > 0).then(|| (c.true_positive + c.true_negative) as f64 / steps as f64),
        }
    }
}

/// PRMBench's results: overall, by error type and by group.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PrmBenchScore {
    /// Every step of every solution.
    pub overall: PrmScore,
    /// By `classification` (types PRMBench does not name are reported under their own name).
    pub by_type: BTreeMap<String, PrmScore>,
    /// By group: the mean PRMScore of the group's types present.
    pub by_group: BTreeMap<String, f64>,
}

/// One solution as the metric sees it: its error type, and per step the predicted and the true
/// verdict (correct or not).
pub struct Judged<'a> {
    /// PRMBench's `classification`.
    pub error_type: &'a str,
    /// Per step: (predicted correct, truly correct).
    pub steps: Vec<(bool, bool)>,
}

/// Steps are predicted correct when their score is at least `threshold`.
pub fn predict(scores: &[f32], threshold: f32) -> Vec<bool> {
    scores.iter().map(|&s| s >= threshold).collect()
}

/// The metric over `solutions`.
pub fn score(solutions: &[Judged<'_>]) -> PrmBenchScore {
    let mut by_type: BTreeMap<String, (usize, Confusion)> = BTreeMap::new();
    for s in solutions {
        let entry = by_type.entry(s.error_type.to_string()).or_default();
        entry.0 += 1;
        for &(predicted, truth) in &s.steps {
            entry.1.add(predicted, truth);
        }
    }
    let mut all = Confusion::default();
    for (_, c) in by_type.values() {
        all.merge(c);
    }
    let by_type: BTreeMap<String, PrmScore> = by_type.into_iter().map(|(t, (n, c))| (t, PrmScore::of(n, c))).collect();
    let mut by_group: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (name, _, group) in ERROR_TYPES {
        if let Some(s) = by_type.get(name).and_then(|s| s.prm_score) {
            by_group.entry(group.to_string()).or_default().push(s);
        }
    }
    PrmBenchScore {
        overall: PrmScore::of(solutions.len(), all),
        by_type,
        by_group: by_group
            .into_iter()
            .map(|(g, v)| (g, v.iter().sum::<f64>() / v.len() as f64))
            .collect(),
    }
}

/// The paper's name of an error type (`classification` as spelled in the data), or the type
/// itself.
pub fn display_name(error_type: &str) -> &str {
    ERROR_TYPES
        .iter()
        .find(|(t, _, _)| *t == error_type)
        .map_or(error_type, |(_, name, _)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prm_score_averages_the_two_classes_f1() {
        // Type A: 4 correct steps (3 predicted correct), 2 erroneous (1 caught).
        // TP 3, FN 1, TN 1, FP 1: F1 = 6/8, negative F1 = 2/4, PRMScore = 0.625.
        let a = Judged {
            error_type: "circular",
            steps: vec![
                (true, true),
                (true, true),
                (true, true),
                (false, true),
                (false, false),
                (true, false),
            ],
        };
        // Type B: every step right.
        let b = Judged {
            error_type: "deception",
            steps: vec![(true, true), (false, false)],
        };
        let r = score(&[a, b]);
        let circular = &r.by_type["circular"];
        assert_eq!(circular.f1, Some(0.75));
        assert_eq!(circular.negative_f1, Some(0.5));
        assert_eq!(circular.prm_score, Some(0.625));
        assert_eq!(circular.error_steps, 2);
        assert_eq!(r.by_type["deception"].prm_score, Some(1.0));
        // Overall over every step: TP 4, FN 1, TN 2, FP 1: F1 = 8/10, negative F1 = 4/6.
        let o = &r.overall;
        assert!((o.f1.unwrap() - 0.8).abs() < 1e-12);
        assert!((o.negative_f1.unwrap() - 4.0 / 6.0).abs() < 1e-12);
        assert_eq!(o.steps, 8);
        assert_eq!(r.by_group["simplicity"], 0.625);
        assert_eq!(r.by_group["sensitivity"], 1.0);
        // A verifier that calls everything correct has no negative F1 worth the name: 0.
        let lazy = score(&[Judged {
            error_type: "confidence",
            steps: vec![(true, true), (true, false)],
        }]);
        assert_eq!(lazy.overall.negative_f1, Some(0.0));
        assert_eq!(display_name("confidence"), "Confidence Invariance (CI)");
    }
}
