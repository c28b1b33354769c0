//! Helpers shared by the engine's integration tests.
#![allow(dead_code)] // each test file uses its own subset

use candle_core::{DType, Device};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;
use std::path::{Path, PathBuf};
use stepwise_core::{Provenance, Solution, Step, StepLabel};
use stepwise_model::{HeadKind, Model, ModelConfig, PrmScorer, Tokenizer};

/// The Hugging Face fixture folders (the repository's `fixtures/hf-tiny`).
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hf-tiny")
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

/// Each fixture item's step rewards from `model` and transformers' (`expected.json`).
pub fn rewards(case: &str, model: &Model) -> Vec<(f32, f32)> {
    let dir = fixtures().join(case);
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let scorer = PrmScorer::new(model, &tok, stepwise_model::layout::detect(model, &tok).unwrap());
    let exp: Value = serde_json::from_str(&std::fs::read_to_string(fixtures().join("expected.json")).unwrap()).unwrap();
    let mut out = Vec::new();
    for it in exp["cases"][case]["items"].as_array().unwrap() {
        let steps: Vec<&str> = it["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        let got = scorer.score(it["problem"].as_str().unwrap(), &steps).unwrap();
        let want = it["step_rewards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32);
        out.extend(got.into_iter().zip(want));
    }
    out
}

/// A random bf16 checkpoint 512 wide (the AVX-512 tiles' depth), saved and loaded both ways.
pub fn wide_checkpoint(dir: &Path) {
    let mut cfg = ModelConfig::tiny(1000, 512, 2, 8, 2, HeadKind::CausalLm);
    cfg.intermediate_size = 1024;
    cfg.head_dim = 64;
    cfg.dtype = DType::BF16;
    let varmap = candle_nn::VarMap::new();
    Model::fresh(cfg.clone(), &varmap, &Device::Cpu, 3).unwrap();
    stepwise_model::checkpoint::save_checkpoint(dir, &cfg, &varmap).unwrap();
}

/// Counting problems: each step must be the previous number + 1; a bad step is off by 2..8 and
/// the rest of the solution counts on from it.
pub fn counting_solutions(n: usize, seed: u64, p_bad: f64) -> Vec<Solution> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let start: u32 = rng.random_range(0..10);
            let len = rng.random_range(3..6);
            let bad_at = rng.random_bool(p_bad).then(|| rng.random_range(0..len));
            let mut cur = start;
            let steps = (0..len)
                .map(|k| {
                    let good = bad_at != Some(k);
                    cur = if good {
                        (cur + 1) % 10
                    } else {
                        (cur + rng.random_range(2..9)) % 10
                    };
                    Step::labelled(format!("{cur}"), StepLabel::from_bool(good, Provenance::Oracle))
                })
                .collect();
            Solution {
                id: i.to_string(),
                question: format!("count from {start}"),
                steps,
                correct: Some(bad_at.is_none()),
                ..Default::default()
            }
        })
        .collect()
}

/// Counting solutions as a policy writes them (the log-ratio layout), for the policy fixture.
pub fn lm_examples(n: usize, seed: u64) -> Vec<stepwise_model::train::Example> {
    use stepwise_model::train::examples::{label_examples, LabelOptions};
    let tok = Tokenizer::from_dir(&fixtures().join("qwen2-policy")).unwrap();
    let opts = LabelOptions {
        separator: "\n".into(),
        separator_after_problem: true,
        ..Default::default()
    };
    label_examples(&tok, &counting_solutions(n, seed, 0.5), &opts).unwrap()
}

/// A PEFT LoRA adapter folder on `base`: `config` (merged over LoRA defaults) and f32 `tensors`
/// (named under the model, `base_model.model.` added).
pub fn write_adapter(dir: &Path, base: &Path, config: serde_json::Value, tensors: &[(&str, Vec<usize>, Vec<f32>)]) {
    std::fs::create_dir_all(dir).unwrap();
    let mut c = serde_json::json!({
        "peft_type": "LORA", "r": 2, "lora_alpha": 8, "base_model_name_or_path": base,
        "task_type": "CAUSAL_LM", "use_rslora": false, "use_dora": false, "fan_in_fan_out": false,
    });
    for (k, v) in config.as_object().unwrap() {
        c[k] = v.clone();
    }
    std::fs::write(dir.join("adapter_config.json"), c.to_string()).unwrap();
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|t| t.2.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .zip(&bytes)
        .map(|(t, b)| {
            (
                format!("base_model.model.{}", t.0),
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, t.1.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("adapter_model.safetensors")).unwrap();
}
