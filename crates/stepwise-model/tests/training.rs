//! Training is real: every weight gets a gradient through the differentiable path; a tiny PRM
//! learns a step rule that needs attention to the previous step and reaches ≥ 95% held-out step
//! accuracy; its checkpoint loads back (as transformers would) and scores identically; an
//! interrupted run resumes to the same weights.

use candle_core::{DType, Device};
use candle_nn::VarMap;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::PathBuf;
use stepwise_core::{Provenance, Solution, Step, StepLabel};
use stepwise_model::train::examples::{label_examples, LabelOptions};
use stepwise_model::train::{batch_loss, evaluate, train, Objective, TrainConfig};
use stepwise_model::{HeadKind, Model, ModelConfig, PrmLayout, PrmScorer, Tokenizer};

fn tokenizer() -> Tokenizer {
    Tokenizer::from_dir(&tokenizer_dir()).unwrap()
}

/// Counting problems: each step must be the previous number + 1; a bad step is off by 2..8.
fn solutions(n: usize, seed: u64) -> Vec<Solution> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let start: u32 = rng.random_range(0..10);
            let len = rng.random_range(3..6);
            let bad_at = if rng.random_bool(0.6) {
                Some(rng.random_range(0..len))
            } else {
                None
            };
            let mut cur = start;
            let mut steps = Vec::new();
            for k in 0..len {
                let good = bad_at.is_none_or(|b| k < b);
                let next = if good {
                    (cur + 1) % 10
                } else {
                    (cur + rng.random_range(2..9)) % 10
                };
                steps.push(Step::labelled(
                    format!("{next}"),
                    StepLabel::from_bool(good, Provenance::Oracle),
                ));
                cur = next;
            }
            Solution {
                id: i.to_string(),
                question: format!("count from {start}"),
                steps,
                ..Default::default()
            }
        })
        .collect()
}

fn tiny_prm(tok: &Tokenizer, varmap: &VarMap) -> Model {
    let cfg = ModelConfig::tiny(tok.vocab_size(), 64, 2, 4, 2, HeadKind::TokenClassification);
    Model::fresh(cfg, varmap, &Device::Cpu, 42).unwrap()
}

#[test]
fn every_weight_receives_a_gradient() {
    let tok = tokenizer();
    let two_class = ModelConfig::tiny(tok.vocab_size(), 64, 2, 4, 2, HeadKind::TokenClassification);
    for cfg in [two_class.clone(), two_class.with_value_head()] {
        let varmap = VarMap::new();
        let mut model = Model::fresh(cfg.clone(), &varmap, &Device::Cpu, 42).unwrap();
        model.set_training(true);
        let ex = label_examples(&tok, &solutions(8, 1), &LabelOptions::default()).unwrap();
        let refs: Vec<_> = ex.iter().collect();
        let (loss, _) = batch_loss(&model, &refs, Objective::Classify).unwrap();
        let grads = loss.backward().unwrap();
        let data = varmap.data().lock().unwrap();
        assert!(data.len() > 10);
        for (name, var) in data.iter() {
            let g = grads
                .get(var.as_tensor())
                .unwrap_or_else(|| panic!("{}: no gradient for {name}", cfg.architecture));
            let norm = g.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(norm > 0.0, "{}: zero gradient for {name}", cfg.architecture);
        }
    }
}

/// A value-head ORM is saved as `*ForSequenceClassification` with one label and scores the same
/// after loading back.
#[test]
fn value_head_checkpoint_round_trips() {
    let tok = tokenizer();
    let cfg = ModelConfig::tiny(tok.vocab_size(), 32, 1, 4, 2, HeadKind::CausalLm).with_value_head();
    let varmap = VarMap::new();
    let model = Model::fresh(cfg.clone(), &varmap, &Device::Cpu, 7).unwrap();
    let out_tmp = tempfile::tempdir().unwrap();
    let out = out_tmp.path().join("stepwise-value");
    stepwise_model::checkpoint::save_checkpoint(&out, &cfg, &varmap).unwrap();
    std::fs::copy(tokenizer_dir().join("tokenizer.json"), out.join("tokenizer.json")).unwrap();
    let loaded = Model::load(&out, &Device::Cpu).unwrap();
    assert_eq!(loaded.config.head, HeadKind::SequenceClassification);
    assert_eq!(loaded.config.num_labels, 1);
    let layout = stepwise_model::layout::detect(&loaded, &tok).unwrap();
    let s = &solutions(1, 9)[0];
    let score = |m: &Model| {
        PrmScorer::new(m, &tok, layout.clone())
            .score(&s.question, &s.step_texts())
            .unwrap()
    };
    assert_eq!(score(&model), score(&loaded));
    // The file carries the metadata transformers writes (and some versions require).
    let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    assert_eq!(header["__metadata__"]["format"], "pt", "{header}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn tiny_prm_learns_detectable_errors_and_round_trips_through_a_checkpoint() {
    let tok = tokenizer();
    let varmap = VarMap::new();
    let mut model = tiny_prm(&tok, &varmap);
    let opts = LabelOptions::default();
    let train_set = label_examples(&tok, &solutions(600, 2), &opts).unwrap();
    let held_out = solutions(150, 3);
    let valid = label_examples(&tok, &held_out, &opts).unwrap();
    let out_tmp = tempfile::tempdir().unwrap();
    let out = out_tmp.path().join("stepwise-train");
    let cfg = TrainConfig {
        lr: 3e-3,
        warmup: 20,
        steps: 400,
        batch_size: 32,
        eval_every: 100,
        out_dir: Some(out.clone()),
        ..Default::default()
    };
    let state = train(
        &mut model,
        &varmap,
        &train_set,
        &valid,
        Objective::Classify,
        &cfg,
        |_, _| {},
    )
    .unwrap();
    let m = evaluate(&model, &valid, Objective::Classify, 64).unwrap();
    println!(
        "held-out step accuracy {:.3}, AUROC {:.3}, loss {:.3} after {} steps",
        m.accuracy, m.auroc, m.loss, state.step
    );
    assert!(m.accuracy >= 0.95, "held-out step accuracy {:.3}", m.accuracy);

    // The checkpoint is a HF folder: load it back and score identically.
    std::fs::copy(tokenizer_dir().join("tokenizer.json"), out.join("tokenizer.json")).unwrap();
    let loaded = Model::load(&out, &Device::Cpu).unwrap();
    let layout = PrmLayout::TokenClassifier { separator: "\n".into() };
    let a = PrmScorer::new(&model, &tok, layout.clone());
    let b = PrmScorer::new(&loaded, &tok, layout);
    common::assert_same_scores(&a, &b, &held_out);
    let _ = std::fs::remove_dir_all(&out);
}

mod common;

fn tokenizer_dir() -> PathBuf {
    common::fixtures().join("qwen2-tokcls")
}

/// Also for a model stored in bf16: its checkpoint is bf16, and the run resumes from the exact
/// f32 weights kept beside it, not from the rounded ones.
#[test]
fn interrupted_training_resumes_to_the_same_weights() {
    let tok = tokenizer();
    let ex = label_examples(&tok, &solutions(64, 4), &LabelOptions::default()).unwrap();
    let run = |steps_first: Option<usize>, dir: &PathBuf, dtype: DType| -> Vec<f32> {
        let _ = std::fs::remove_dir_all(dir);
        let cfg = TrainConfig {
            steps: 20,
            warmup: 5,
            batch_size: 8,
            eval_every: 5,
            out_dir: Some(dir.clone()),
            ..Default::default()
        };
        if let Some(k) = steps_first {
            // First process: stops after k steps (as if killed after its last checkpoint).
            let varmap = VarMap::new();
            let mut m = tiny_prm(&tok, &varmap);
            m.config.dtype = dtype;
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                train(&mut m, &varmap, &ex, &ex[..8], Objective::Classify, &cfg, |s, _| {
                    if s == k {
                        panic!("killed");
                    }
                })
            }));
        }
        let varmap = VarMap::new();
        let mut m = tiny_prm(&tok, &varmap);
        m.config.dtype = dtype;
        train(&mut m, &varmap, &ex, &ex[..8], Objective::Classify, &cfg, |_, _| {}).unwrap();
        let stored = candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap();
        assert_eq!(stored["score.weight"].dtype(), dtype);
        let loaded = Model::load(dir, &Device::Cpu).unwrap();
        assert_eq!(loaded.config.dtype, dtype, "config.json keeps the dtype");
        let data = varmap.data().lock().unwrap();
        data["score.weight"]
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    let base_tmp = tempfile::tempdir().unwrap();
    let base = base_tmp.path().join("stepwise-resume");
    for dtype in [DType::F32, DType::BF16] {
        let a = run(None, &base.join("a"), dtype);
        let b = run(Some(11), &base.join("b"), dtype);
        assert_eq!(
            a, b,
            "{dtype:?}: a run killed at step 11 and resumed must end with the same weights"
        );
    }
    let _ = std::fs::remove_dir_all(&base);
}

/// With `keep_best`, a run ends with its best validation's weights, in memory and in its folder,
/// however far the later steps wander (here a learning rate that overshoots), and a resumed run
/// continues from its last step's weights, not the best ones.
#[test]
fn keep_best_ends_with_the_best_validation_and_resumes_from_the_last_step() {
    let tok = tokenizer();
    let ex = label_examples(&tok, &solutions(64, 5), &LabelOptions::default()).unwrap();
    let (train_set, valid) = ex.split_at(48);
    let dir_tmp = tempfile::tempdir().unwrap();
    let dir = dir_tmp.path().join("stepwise-keep-best");
    for out_dir in [None, Some(dir.clone())] {
        let _ = std::fs::remove_dir_all(&dir);
        let cfg = TrainConfig {
            lr: 0.3,
            warmup: 1,
            steps: 12,
            batch_size: 8,
            eval_every: 1,
            out_dir: out_dir.clone(),
            keep_best: true,
            ..Default::default()
        };
        let varmap = VarMap::new();
        let mut m = tiny_prm(&tok, &varmap);
        let state = train(&mut m, &varmap, train_set, valid, Objective::Classify, &cfg, |_, _| {}).unwrap();
        let best = state.best_valid_loss.unwrap();
        let best_step = state.best_step.unwrap();
        assert!(
            best_step < state.step,
            "the overshooting run was best at its end: no test"
        );
        let now = evaluate(&m, valid, Objective::Classify, 64).unwrap().loss;
        assert!((now - best).abs() < 1e-6, "ends at loss {now}, best was {best}");
        if out_dir.is_some() {
            std::fs::copy(tokenizer_dir().join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
            let loaded = Model::load(&dir, &Device::Cpu).unwrap();
            let stored = evaluate(&loaded, valid, Objective::Classify, 64).unwrap().loss;
            assert!(
                (stored - best).abs() < 1e-4,
                "the folder holds loss {stored}, best was {best}"
            );
            // Resumed for more steps: from the last step's weights, which differ from the best.
            let more = TrainConfig {
                steps: 13,
                ..cfg.clone()
            };
            let varmap2 = VarMap::new();
            let mut m2 = tiny_prm(&tok, &varmap2);
            stepwise_model::checkpoint::load_training_checkpoint(&varmap2, &dir).unwrap();
            let last = evaluate(&m2, valid, Objective::Classify, 64).unwrap().loss;
            assert!((last - best).abs() > 1e-6, "resuming would start from the best weights");
            train(
                &mut m2,
                &varmap2,
                train_set,
                valid,
                Objective::Classify,
                &more,
                |_, _| {},
            )
            .unwrap();
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// With `patience`, a run whose validation stops improving (a learning rate that overshoots)
/// stops early, and started again on its folder it stays stopped: no more steps.
#[test]
fn a_run_that_stopped_early_stays_stopped() {
    let tok = tokenizer();
    let ex = label_examples(&tok, &solutions(64, 5), &LabelOptions::default()).unwrap();
    let (train_set, valid) = ex.split_at(48);
    let dir_tmp = tempfile::tempdir().unwrap();
    let dir = dir_tmp.path().join("stepwise-patience");
    let cfg = TrainConfig {
        lr: 0.3,
        warmup: 1,
        steps: 40,
        batch_size: 8,
        eval_every: 1,
        patience: 2,
        out_dir: Some(dir.clone()),
        ..Default::default()
    };
    let varmap = VarMap::new();
    let mut m = tiny_prm(&tok, &varmap);
    let state = train(&mut m, &varmap, train_set, valid, Objective::Classify, &cfg, |_, _| {}).unwrap();
    assert!(
        state.stopped_early && state.step < 40,
        "step {}: no early stop",
        state.step
    );
    let varmap = VarMap::new();
    let mut m = tiny_prm(&tok, &varmap);
    let mut steps = 0;
    let again = train(&mut m, &varmap, train_set, valid, Objective::Classify, &cfg, |_, _| {
        steps += 1
    })
    .unwrap();
    assert_eq!((steps, again.step), (0, state.step), "the stopped run trained on");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A verifier started from a checkpoint with the same head keeps that head (weights and biases);
/// one with another head starts its head fresh and drops the old one.
#[test]
fn a_checkpoint_keeps_its_own_head_and_drops_another() {
    use stepwise_model::train::verifier::{Start, VerifierHead, VerifierSpec};
    let spec = |dir: &str, head| VerifierSpec {
        head,
        start: Start::Checkpoint(common::fixtures().join(dir)),
        extra_layers: 0,
        labels: LabelOptions::default(),
    };
    let stored =
        candle_core::safetensors::load(common::fixtures().join("qwen2-tokcls/model.safetensors"), &Device::Cpu)
            .unwrap();
    let varmap = VarMap::new();
    spec("qwen2-tokcls", VerifierHead::Classifier)
        .build(&varmap, &Device::Cpu, 1)
        .unwrap();
    let data = varmap.data().lock().unwrap();
    for name in ["score.weight", "score.bias"] {
        let kept: Vec<f32> = data[name].as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        let want: Vec<f32> = stored[name]
            .to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(kept, want, "{name} was not kept");
    }
    drop(data);
    let varmap = VarMap::new();
    spec("qwen2-prm", VerifierHead::Classifier)
        .build(&varmap, &Device::Cpu, 1)
        .unwrap();
    let names: Vec<String> = varmap.data().lock().unwrap().keys().cloned().collect();
    assert!(
        names
            .iter()
            .all(|n| n.starts_with("model.") || n == "score.weight" || n == "score.bias"),
        "{names:?}"
    );
}

#[test]
fn targets_can_stop_at_the_first_bad_step() {
    let tok = tokenizer();
    let labelled = |labels: &[StepLabel]| Solution {
        question: "count from 1".into(),
        steps: labels
            .iter()
            .enumerate()
            .map(|(k, l)| Step::labelled(format!("{}", k + 2), l.clone()))
            .collect(),
        correct: Some(false),
        ..Default::default()
    };
    let hard = |good| StepLabel::from_bool(good, Provenance::Oracle);
    let soft = |p| StepLabel::soft(p, Provenance::Oracle);
    let sols = [
        labelled(&[hard(true), hard(false), hard(false), hard(true)]),
        labelled(&[soft(1.0), soft(0.6), soft(0.25), soft(0.0)]),
        labelled(&[hard(true), hard(true)]),
    ];
    let targets = |o: &LabelOptions| -> Vec<Vec<f32>> {
        label_examples(&tok, &sols, o)
            .unwrap()
            .iter()
            .map(|e| e.targets.iter().map(|t| t.1).collect())
            .collect()
    };
    let every = LabelOptions::default();
    assert_eq!(
        targets(&every),
        [vec![1.0, 0.0, 0.0, 1.0], vec![1.0, 0.6, 0.25, 0.0], vec![1.0, 1.0]]
    );
    let stop = LabelOptions {
        stop_at_first_bad: true,
        ..Default::default()
    };
    assert_eq!(targets(&stop), [vec![1.0, 0.0], vec![1.0, 0.6, 0.25], vec![1.0, 1.0]]);
    // An outcome label is one target, whatever the steps say.
    let outcome = LabelOptions { outcome: true, ..stop };
    assert_eq!(targets(&outcome), [vec![0.0], vec![0.0], vec![0.0]]);
}

/// The learning rate a run gets unless told: 1e-5 to fine-tune a pretrained base (TRL's
/// PRMConfig default), 1e-3 for the small shapes trained nearly from nothing.
#[test]
fn the_default_learning_rate_follows_the_base() {
    use stepwise_model::train::run::default_lr;
    let small = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hf-tiny/qwen2-prm");
    assert_eq!(default_lr(Some(&small)).0, 1e-3);
    assert_eq!(default_lr(None).0, 1e-3);
    // Qwen2.5-0.5B's shape (only config.json is read).
    let dir_tmp = tempfile::tempdir().unwrap();
    let dir = dir_tmp.path().join("stepwise-lr");
    std::fs::create_dir_all(&dir).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(small.join("config.json")).unwrap()).unwrap();
    config["hidden_size"] = 896.into();
    config["intermediate_size"] = 4864.into();
    config["num_attention_heads"] = 14.into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let (lr, why) = default_lr(Some(&dir));
    assert_eq!(lr, 1e-5, "{why}");
    assert!(why.contains("hidden size 896"), "{why}");
    std::fs::remove_dir_all(&dir).unwrap();
}
