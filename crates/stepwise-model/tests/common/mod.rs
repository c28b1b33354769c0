//! Helpers shared by the engine's integration tests.
#![allow(dead_code)] // each test file uses its own subset

use std::path::PathBuf;
use stepwise_core::Solution;
use stepwise_model::PrmScorer;

/// The Hugging Face fixture folders (`../shared/fixtures/hf-tiny`, or `$STEPWISE_SHARED`).
pub fn fixtures() -> PathBuf {
    std::env::var_os("STEPWISE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
        .join("fixtures/hf-tiny")
}

/// The largest absolute difference of two tensors.
pub fn max_diff(a: &candle_core::Tensor, b: &candle_core::Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// Two scorers give the same step scores (within 1e-6) on the first ten solutions.
pub fn assert_same_scores(a: &PrmScorer, b: &PrmScorer, sols: &[Solution]) {
    for s in sols.iter().take(10) {
        let texts = s.step_texts();
        let (x, y) = (
            a.score(&s.question, &texts).unwrap(),
            b.score(&s.question, &texts).unwrap(),
        );
        assert_eq!(x.len(), y.len());
        for (u, v) in x.iter().zip(&y) {
            assert!((u - v).abs() < 1e-6, "{u} vs {v}");
        }
    }
}
