//! Incremental scoring on the fixture checkpoints: a beam that grows step by step scores exactly
//! as scoring the whole text at once (≤ 1e-5) for every PRM layout, while encoding only the new
//! tokens.

use candle_core::Device;
use candle_nn::VarMap;
use stepwise_core::seams::{ScoreInput, StepScorer};
use stepwise_model::incremental::IncrementalScorer;
use stepwise_model::log_ratio::LogRatio;
use stepwise_model::scoring::LoadedVerifier;
use stepwise_model::{Model, PrmLayout, PrmScorer, Tokenizer};

mod common;
use common::fixtures;

const QUESTION: &str = "Tom has 12 apples and buys 30 more. How many apples does he have?";

/// Three candidate texts for step `depth` after choosing `path`.
fn candidates(depth: usize, path: usize) -> Vec<String> {
    (0..3)
        .map(|k| {
            format!(
                "Step {}: we add {} and {} to get {}.",
                depth + 1,
                path + k,
                depth * 7,
                path * 3 + k
            )
        })
        .collect()
}

/// Grow one beam for eight steps: at each step score three candidate continuations together
/// (they share the beam's prefix), compare each with scoring its whole text alone, and continue
/// with the best. Returns (tokens encoded incrementally, tokens a full re-encoding would take).
fn grow(full: &PrmScorer, name: &str) -> (usize, usize) {
    let inc = IncrementalScorer::new(clone(full));
    let mut beam: Vec<String> = Vec::new();
    let (mut encoded, mut whole) = (0, 0);
    for depth in 0..8 {
        let kids: Vec<Vec<String>> = candidates(depth, beam.len() * 3)
            .into_iter()
            .map(|c| beam.iter().cloned().chain([c]).collect())
            .collect();
        let inputs: Vec<ScoreInput<'_>> = kids
            .iter()
            .map(|k| ScoreInput {
                problem_id: "p",
                question: QUESTION,
                steps: k.iter().map(String::as_str).collect(),
                partial: true,
            })
            .collect();
        let got = inc.score(&inputs).unwrap();
        encoded += got.tokens;
        let mut best = (f32::NEG_INFINITY, 0);
        for (k, (input, scores)) in inputs.iter().zip(&got.scores).enumerate() {
            let reference = full.score(QUESTION, &input.steps).unwrap();
            whole += full.encode(QUESTION, &input.steps).unwrap().ids.len();
            assert_eq!(scores.len(), depth + 1, "{name}");
            for (a, b) in scores.iter().zip(&reference) {
                assert!(
                    (a - b).abs() <= 1e-5,
                    "{name}, depth {depth}: {a} incrementally vs {b} at once"
                );
            }
            if scores[depth] > best.0 {
                best = (scores[depth], k);
            }
        }
        beam = kids[best.1].clone();
    }
    eprintln!(
        "{name}: {encoded} tokens encoded incrementally, {whole} re-encoding ({:.1}x)",
        whole as f64 / encoded as f64
    );
    (encoded, whole)
}

fn clone<'a>(s: &PrmScorer<'a>) -> PrmScorer<'a> {
    PrmScorer::new(s.model, s.tokenizer, s.layout.clone()).with_reference(s.reference)
}

#[test]
fn a_growing_beam_scores_as_the_whole_text_for_every_layout() {
    let dev = Device::Cpu;
    for name in ["qwen2-prm", "llama-shepherd", "qwen2-tokcls"] {
        let v = LoadedVerifier::load(&fixtures().join(name), "auto", &dev).unwrap();
        let (encoded, whole) = grow(&v.scorer(), name);
        assert!(
            encoded * 5 < whole,
            "{name}: {encoded} tokens encoded incrementally vs {whole} at once"
        );
    }
    // The policy as a log-ratio verifier, against a constant and against another model (the
    // same shape, other weights).
    let dir = fixtures().join("qwen2-policy");
    let policy = Model::load(&dir, &dev).unwrap();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let varmap = VarMap::new();
    let other = Model::fresh(policy.config.clone(), &varmap, &dev, 7).unwrap();
    for (reference, constant) in [(None, Some(-2.0)), (Some(&other), None)] {
        for (cumulative, last_tokens) in [(false, None), (true, None), (false, Some(2))] {
            let scorer = PrmScorer::new(
                &policy,
                &tok,
                PrmLayout::LogRatio {
                    separator: "\n".into(),
                    log_ratio: LogRatio {
                        beta: 0.5,
                        cumulative,
                        reference_logprob: constant,
                        last_tokens,
                    },
                },
            )
            .with_reference(reference);
            let (encoded, whole) = grow(&scorer, "log-ratio");
            assert!(encoded * 5 < whole, "log-ratio: {encoded} vs {whole}");
        }
    }
}

/// Forgetting is safe: with room for almost nothing, every input is encoded from scratch and the
/// scores do not change.
#[test]
fn a_tiny_capacity_only_costs_tokens() {
    let dev = Device::Cpu;
    let v = LoadedVerifier::load(&fixtures().join("qwen2-tokcls"), "auto", &dev).unwrap();
    let full = v.scorer();
    let tiny = IncrementalScorer::with_capacity(v.scorer(), 1);
    let steps = ["Step 1: 12 + 30 = 42.", "The answer is 42."];
    let input = |n: usize| ScoreInput {
        problem_id: "p",
        question: QUESTION,
        steps: steps[..n].to_vec(),
        partial: n < steps.len(),
    };
    for n in [1, 2, 2] {
        let got = tiny.score(&[input(n)]).unwrap();
        assert_eq!(got.tokens, full.encode(QUESTION, &steps[..n]).unwrap().ids.len());
        let reference = full.score(QUESTION, &steps[..n]).unwrap();
        for (a, b) in got.scores[0].iter().zip(&reference) {
            assert!((a - b).abs() <= 1e-5);
        }
    }
}
