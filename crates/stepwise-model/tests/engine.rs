//! A [`Model`] whose weights are on a packed engine (the code path a GPU model takes) checked on
//! the CPU through the reference backend: the same scorer, log-probabilities and generation as
//! the CPU decoder, with no device named by the caller. Before the engine was chosen once in the
//! model, a log-ratio verifier on a GPU reached the CPU decoder and failed.

mod common;

use common::fixtures;
use std::sync::Arc;
use stepwise_model::engine::PackedEngine;
use stepwise_model::log_ratio::{sequence_logprobs, LogRatio};
use stepwise_model::packed_engine::{PackedDecoder, Reference};
use stepwise_model::{Decoding, Model, ModelConfig, PrmLayout, PrmScorer, SamplingParams, Tokenizer};

fn on_reference(dir: &std::path::Path) -> Model {
    let engine = PackedDecoder::load(dir, ModelConfig::from_dir(dir).unwrap(), Arc::new(Reference)).unwrap();
    Model::on_packed(Arc::new(engine) as Arc<dyn PackedEngine>).unwrap()
}

fn on_cpu(dir: &std::path::Path) -> Model {
    Model::load(dir, &candle_core::Device::Cpu).unwrap()
}

const PROBLEM: &str = "Tom has 3 boxes of 4 pens and gives away 5. How many are left?";
const STEPS: [&str; 3] = ["3 * 4 = 12 pens in all.", "12 - 5 = 7.", "The answer is 7."];

/// The CPU and the packed engine (bf16 products) within `tol` of each other (relative to
/// values past 1), value by value.
fn assert_close(cpu: &[f32], packed: &[f32], tol: f32, what: &str) {
    assert_eq!(cpu.len(), packed.len(), "{what}");
    for (c, p) in cpu.iter().zip(packed) {
        assert!((c - p).abs() < tol * c.abs().max(1.0), "{what}: CPU {c} vs packed {p}");
    }
}

#[test]
fn every_classifier_layout_scores_through_the_same_scorer_on_a_packed_model() {
    for case in ["qwen2-prm", "qwen2-tokcls", "llama-shepherd"] {
        let dir = fixtures().join(case);
        let tok = Tokenizer::from_dir(&dir).unwrap();
        let cpu = on_cpu(&dir);
        let packed = on_reference(&dir);
        assert!(packed.is_on_gpu() && packed.placement_name().contains("reference"));
        let layout = stepwise_model::layout::detect(&cpu, &tok).unwrap();
        let want = PrmScorer::new(&cpu, &tok, layout.clone())
            .score(PROBLEM, &STEPS)
            .unwrap();
        let got = PrmScorer::new(&packed, &tok, layout).score(PROBLEM, &STEPS).unwrap();
        assert_close(&want, &got, 0.02, case);
    }
}

/// The likelihood head (a constant reference) and a reference model, on a packed model: the
/// scores the CPU decoder gives, whatever the token budget of a pass.
#[test]
fn a_log_ratio_verifier_scores_on_a_packed_model_as_on_the_cpu() {
    let dir = fixtures().join("qwen2-policy");
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let (cpu, packed) = (on_cpu(&dir), on_reference(&dir));
    let layout = |reference_logprob| PrmLayout::LogRatio {
        separator: "\n".into(),
        log_ratio: LogRatio {
            beta: 0.05,
            cumulative: false,
            reference_logprob,
            last_tokens: None,
        },
    };
    let want = PrmScorer::new(&cpu, &tok, layout(Some(-8.0)))
        .score(PROBLEM, &STEPS)
        .unwrap();
    assert!(
        want.iter().any(|&p| (p - want[0]).abs() > 1e-3),
        "steps of different likelihoods score apart: {want:?}"
    );
    for budget in [stepwise_model::DEFAULT_MAX_BATCH_TOKENS, 1] {
        let scorer = PrmScorer::new(&packed, &tok, layout(Some(-8.0))).with_max_batch_tokens(budget);
        let got = scorer.score(PROBLEM, &STEPS).unwrap();
        assert_close(
            &want,
            &got,
            0.02,
            &format!("constant reference, {budget} tokens a pass"),
        );
    }
    // Against a reference model: the verifier on the packed engine, its reference on the CPU.
    let same = PrmScorer::new(&packed, &tok, layout(None)).with_reference(Some(&cpu));
    for p in same.score(PROBLEM, &STEPS).unwrap() {
        assert!((p - 0.5).abs() < 0.02, "a model against itself scores 1/2, got {p}");
    }
    let err = PrmScorer::new(&packed, &tok, layout(None))
        .score(PROBLEM, &STEPS)
        .unwrap_err()
        .to_string();
    assert!(err.contains("reference model"), "{err}");
}

#[test]
fn token_logprobs_and_generation_go_to_the_packed_engine() {
    let dir = fixtures().join("qwen2-policy");
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let (cpu, packed) = (on_cpu(&dir), on_reference(&dir));
    let ids = tok.encode(PROBLEM, false).unwrap();
    let seqs = [ids.as_slice(), &ids[..7]];
    let want = sequence_logprobs(&cpu, &seqs, 2, 64).unwrap();
    let got = sequence_logprobs(&packed, &seqs, 2, 8).unwrap();
    // bf16 rounding moves this random fixture's large log-probabilities by up to 1.6%
    // (tests/packed_train.rs).
    for (w, g) in want.iter().zip(&got) {
        assert_close(w, g, 0.02, "token log-probabilities");
    }
    assert_eq!(got, packed.packed().unwrap().sequence_logprobs(&seqs, 8).unwrap());
    let greedy = SamplingParams {
        temperature: 0.0,
        max_new_tokens: 6,
        ..Default::default()
    };
    let decode = |model: &Model| {
        let mut batch = Decoding::new(model, None);
        batch.add(&ids, 2, greedy.clone()).unwrap();
        let mut done = Vec::new();
        while !batch.is_idle() {
            done.extend(batch.step().unwrap());
        }
        done
    };
    let (a, b) = (decode(&cpu), decode(&packed));
    assert_eq!(a.len(), 1);
    assert_eq!(b[0].1.len(), 2, "both continuations of the request");
    // bf16 products may part from f32 greedy decoding only where two tokens nearly tie: the
    // first token, decided by a whole prompt's pass, agrees.
    assert_eq!(a[0].1[0][0], b[0].1[0][0], "greedy first token, CPU against packed");
    assert!(packed.encoded_tokens() > 0, "the packed engine counted what it encoded");
}

/// The vocabulary's log-probabilities handed out a slice of rows at a time (what `stepwise
/// serve` echoes a long prompt with) are those computed at once, on the CPU and on the packed
/// engine.
#[test]
fn vocabulary_rows_a_slice_at_a_time_are_the_rows_at_once() {
    let dir = fixtures().join("qwen2-policy");
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let ids = tok.encode(&format!("{PROBLEM}\n{}", STEPS.join("\n")), false).unwrap();
    let rows: Vec<usize> = (0..ids.len() - 1).collect();
    for model in [on_cpu(&dir), on_reference(&dir)] {
        let whole: Vec<f32> = model.vocab_logprobs(&ids, &rows).unwrap().concat();
        let mut sliced = Vec::new();
        let mut firsts = Vec::new();
        model
            .vocab_logprobs_each(&ids, &rows, 3, |first, slice| {
                assert!(slice.len() <= 3);
                firsts.push(first);
                sliced.extend(slice.concat());
                Ok(())
            })
            .unwrap();
        assert_eq!(firsts, (0..rows.len()).step_by(3).collect::<Vec<_>>());
        assert_close(&whole, &sliced, 1e-4, "sliced rows");
    }
}
