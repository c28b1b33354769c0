//! The packed engine (what the CUDA engine runs) checked on the CPU through its reference backend:
//! the load plan, the buffers, every kernel's arguments and the head give transformers' step
//! rewards on the fixture checkpoints, and a solution gets the same rewards whatever it is packed
//! with. Only the CUDA kernels' own code is left to the GPU check (bench/gpu_check.sh).

mod common;

use common::fixtures;
use serde_json::Value;
use std::sync::Arc;
use stepwise_model::packed_engine::{PackedDecoder, Reference};
use stepwise_model::{ModelConfig, Packed, Tokenizer};

fn expected() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join("expected.json")).unwrap()).unwrap()
}

/// P(good) from head outputs `[rows, classes]` (softmax class 1, or the sigmoid of one value).
fn good(values: &[f32], width: usize) -> Vec<f32> {
    values
        .chunks(width)
        .map(|row| match row {
            [v] => 1.0 / (1.0 + (-v).exp()),
            _ => 1.0 / (1.0 + (row[0] - row[1]).exp()),
        })
        .collect()
}

#[test]
fn the_packed_engine_gives_transformers_rewards_packed_or_alone() {
    let exp = expected();
    for case in ["qwen2-prm", "qwen2-tokcls", "llama-shepherd"] {
        let dir = fixtures().join(case);
        let config = ModelConfig::from_dir(&dir).unwrap();
        let engine = PackedDecoder::load(&dir, config, Arc::new(Reference)).unwrap();
        let tok = Tokenizer::from_dir(&dir).unwrap();
        let model = stepwise_model::Model::load(&dir, &candle_core::Device::Cpu).unwrap();
        let layout = stepwise_model::layout::detect(&model, &tok).unwrap();
        let columns = layout.head_columns(&tok).unwrap();
        let columns = columns.as_ref().map(|c| c.as_slice());
        let items = exp["cases"][case]["items"].as_array().unwrap();
        let encoded: Vec<_> = items
            .iter()
            .map(|it| {
                let steps: Vec<&str> = it["steps"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s.as_str().unwrap())
                    .collect();
                layout.encode(&tok, it["problem"].as_str().unwrap(), &steps).unwrap()
            })
            .collect();
        // All items in one packed batch.
        let seqs: Vec<&[u32]> = encoded.iter().map(|e| e.ids.as_slice()).collect();
        let packed = Packed::new(&seqs);
        let read: Vec<usize> = encoded
            .iter()
            .enumerate()
            .flat_map(|(i, e)| e.positions.iter().map(move |&p| (i, p)))
            .map(|(i, p)| packed.row(i, p))
            .collect();
        let (values, width) = engine.head_at(&packed, &read, columns).unwrap();
        let together = good(&values, width);
        let mut at = 0;
        for (it, e) in items.iter().zip(&encoded) {
            let want: Vec<f32> = it["step_rewards"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            let mine = &together[at..at + e.positions.len()];
            at += e.positions.len();
            // bf16 weights and activations (as on the GPU): within 0.02 of transformers' f32, as
            // the CPU engine holding these fixtures in bf16 is (0.003, 0.016 and 0.004 off).
            for (g, w) in mine.iter().zip(&want) {
                assert!((g - w).abs() < 0.02, "{case}: {g} vs transformers {w}");
            }
            // The same solution alone: the same numbers (packing changes nothing).
            let alone = Packed::new(&[e.ids.as_slice()]);
            let (values, width) = engine.head_at(&alone, &e.positions, columns).unwrap();
            assert_eq!(good(&values, width), mine, "{case}: alone vs packed");
        }
    }
}

#[test]
fn bad_batches_are_errors_not_panics() {
    let dir = fixtures().join("qwen2-prm");
    let engine = PackedDecoder::load(&dir, ModelConfig::from_dir(&dir).unwrap(), Arc::new(Reference)).unwrap();
    let e = |r: anyhow::Result<(Vec<f32>, usize)>| r.unwrap_err().to_string();
    assert!(e(engine.head_at(&Packed::new(&[&[1, 2]]), &[2], None)).contains("past the end"));
    assert!(e(engine.head_at(&Packed::new(&[&[1, 99_999]]), &[0], None)).contains("vocabulary"));
    // A verifier reads up to four times its trained context (512 here).
    let long = vec![1u32; 2049];
    assert!(e(engine.head_at(&Packed::new(&[&long]), &[0], None)).contains("max_position_embeddings"));
    // A checkpoint with a tensor missing is refused naming it.
    let d_tmp = tempfile::tempdir().unwrap();
    let d = d_tmp.path().join("stepwise-packed-missing");
    std::fs::create_dir_all(&d).unwrap();
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    config["num_hidden_layers"] = 3.into();
    std::fs::write(d.join("config.json"), config.to_string()).unwrap();
    std::fs::copy(dir.join("model.safetensors"), d.join("model.safetensors")).unwrap();
    let err = PackedDecoder::load(&d, ModelConfig::from_dir(&d).unwrap(), Arc::new(Reference)).unwrap_err();
    assert!(err.to_string().contains("model.layers.2"), "{err}");
    // So is one whose layer count would size buffers far past the checkpoint, before any is made.
    config["num_hidden_layers"] = 1_000_000_000.into();
    std::fs::write(d.join("config.json"), config.to_string()).unwrap();
    let err = PackedDecoder::load(&d, ModelConfig::from_dir(&d).unwrap(), Arc::new(Reference)).unwrap_err();
    assert!(err.to_string().contains("holds 2 layers"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}

/// A solution longer than the trained context (512 positions here) is scored past it, as
/// transformers scores it (ProcessBench's MATH split has such solutions for Qwen2.5-Math-PRM-7B):
/// the packed engine and the CPU engine give it the same rewards, and one past four times the
/// context is refused naming the limit.
#[test]
fn a_solution_past_the_trained_context_scores_the_same_on_both_engines() {
    let dir = fixtures().join("qwen2-prm");
    let config = ModelConfig::from_dir(&dir).unwrap();
    assert_eq!(config.max_position_embeddings, 512);
    let engine = PackedDecoder::load(&dir, config, Arc::new(Reference)).unwrap();
    let verifier = stepwise_model::scoring::LoadedVerifier::load(&dir, "auto", &candle_core::Device::Cpu).unwrap();
    let scorer = verifier.scorer();
    let problem = "Add the numbers one after another. ".repeat(40);
    let steps: Vec<String> = (0..30)
        .map(|i| format!("{i} + {i} = {}, so we go on.", 2 * i))
        .collect();
    let steps: Vec<&str> = steps.iter().map(String::as_str).collect();
    let e = scorer.encode(&problem, &steps).unwrap();
    assert!(e.ids.len() > 700 && e.ids.len() < 2048, "{} tokens", e.ids.len());
    let cpu = scorer.score(&problem, &steps).unwrap();
    let (values, width) = engine
        .head_at(&Packed::new(&[e.ids.as_slice()]), &e.positions, None)
        .unwrap();
    let packed = good(&values, width);
    assert_eq!(packed.len(), steps.len());
    for (p, c) in packed.iter().zip(&cpu) {
        assert!((p - c).abs() < 0.02, "packed {p} vs CPU {c}");
    }
    let too_long = "q ".repeat(5000);
    let err = scorer.score(&too_long, &["a"]).unwrap_err().to_string();
    assert!(
        err.contains("2048 positions") && err.contains("max_position_embeddings of 512"),
        "{err}"
    );
}
