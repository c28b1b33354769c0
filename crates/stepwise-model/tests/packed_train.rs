//! Training on the packed engine (what a GPU trains with), checked on the CPU through its
//! reference backend: every gradient against candle's autograd through the CPU trainer's loss on
//! the same batch, and a few AdamW steps lowering the loss and moving the scores toward the
//! labels. Only the CUDA kernels' own code is left to the GPU check.

mod common;

use common::fixtures;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use stepwise_model::packed_engine::{PackedTrainer, Reference};
use stepwise_model::train::{batch_loss, Example, Objective, VarMap};
use stepwise_model::{Model, ModelConfig, Packed, PrmLayout, Tokenizer};

/// The fixture's solutions encoded for its layout, each step end labelled good or bad in turn.
fn examples(case: &str) -> Vec<Example> {
    let exp: Value = serde_json::from_str(&std::fs::read_to_string(fixtures().join("expected.json")).unwrap()).unwrap();
    examples_in(&fixtures().join(case), exp["cases"][case]["items"].as_array().unwrap())
}

/// `items` (problems and steps) encoded for the layout of the checkpoint in `dir`, each step end
/// labelled good, bad or 0.8 in turn.
fn examples_in(dir: &std::path::Path, items: &[Value]) -> Vec<Example> {
    let tok = Tokenizer::from_dir(dir).unwrap();
    let model = Model::load(dir, &candle_core::Device::Cpu).unwrap();
    let layout = PrmLayout::detect(&model, &tok).unwrap();
    let mut k = 0;
    items
        .iter()
        .map(|it| {
            let steps: Vec<&str> = it["steps"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap())
                .collect();
            let e = layout.encode(&tok, it["problem"].as_str().unwrap(), &steps).unwrap();
            let targets = e
                .positions
                .iter()
                .map(|&p| {
                    k += 1;
                    (p, [0.0, 1.0, 0.8][k % 3])
                })
                .collect();
            Example {
                ids: e.ids,
                targets,
                lm_from: 0,
                ref_logprobs: Vec::new(),
            }
        })
        .collect()
}

/// The examples as one packed batch and its targets.
fn packed(examples: &[Example]) -> (Packed, Vec<(usize, f32)>) {
    let refs: Vec<&Example> = examples.iter().collect();
    stepwise_model::train::packed::packed(&refs)
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let norm = |v: &[f32]| v.iter().map(|x| *x as f64 * *x as f64).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b)).max(1e-30)
}

/// Every trainable tensor's gradient from the packed trainer (bf16 operands, f32 sums) points
/// where candle's autograd of the CPU trainer's f32 loss points, with the same size, for the
/// Qwen2.5-Math-PRM head (bf16 checkpoint), a token classifier with attention biases (f32) and
/// a scalar value head (a sequence classifier with one label, no bias: the ORM's).
#[test]
fn packed_gradients_match_candle_autograd() {
    let value_dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen2-value");
    let value: Value =
        serde_json::from_str(&std::fs::read_to_string(value_dir.join("expected.json")).unwrap()).unwrap();
    let cases = [
        ("qwen2-prm", fixtures().join("qwen2-prm"), examples("qwen2-prm")),
        (
            "qwen2-tokcls",
            fixtures().join("qwen2-tokcls"),
            examples("qwen2-tokcls"),
        ),
        (
            "qwen2-value",
            value_dir.clone(),
            examples_in(&value_dir, value["items"].as_array().unwrap()),
        ),
    ];
    for (case, dir, ex) in cases {
        let config = ModelConfig::from_dir(&dir).unwrap();
        let (batch, targets) = packed(&ex);

        let mut trainer = PackedTrainer::load(&dir, config.clone(), Arc::new(Reference)).unwrap();
        let loss = trainer.backward(&batch, &targets).unwrap();
        let ours: HashMap<String, Vec<f32>> = trainer.gradients().unwrap().into_iter().collect();

        let varmap = VarMap::new();
        let mut model = Model::load_trainable(&dir, config, &varmap, &candle_core::Device::Cpu, 0).unwrap();
        model.set_training(true);
        let refs: Vec<&Example> = ex.iter().collect();
        let (candle_loss, _) = batch_loss(&model, &refs, Objective::Classify).unwrap();
        let grads = candle_loss.backward().unwrap();
        let candle_loss = candle_loss.to_scalar::<f32>().unwrap();
        assert!(
            (loss - candle_loss).abs() < 0.01 * candle_loss.abs().max(0.1),
            "{case}: loss {loss} vs {candle_loss}"
        );

        let vars = varmap.data().lock().unwrap();
        let mut cosines = Vec::new();
        assert_eq!(ours.len(), vars.len(), "{case}: one gradient a variable");
        for (name, var) in vars.iter() {
            let want: Vec<f32> = grads.get(var).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            let got = &ours[name];
            assert_eq!(got.len(), want.len(), "{case}: {name}");
            let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
            let (c, ratio) = (cosine(got, &want), norm(got) / norm(&want).max(1e-30));
            // bf16 rounding of every product's operands moves them by a few percent (measured:
            // cosine ≥ 0.983, norm ratio 0.95–1.07); a wrong term or factor moves them far more.
            assert!(
                c > 0.98 && (0.92..1.08).contains(&ratio),
                "{case}: {name}: cosine {c}, norm ratio {ratio}"
            );
            cosines.push(c);
        }
        let mean = cosines.iter().sum::<f64>() / cosines.len() as f64;
        assert!(mean > 0.99, "{case}: mean cosine {mean}");
    }
}

/// AdamW steps on the packed trainer lower the loss and move its forward's scores toward the
/// labels (the forward reads the bf16 copies each update refreshes from the f32 masters).
#[test]
fn packed_training_lowers_the_loss() {
    let case = "qwen2-prm";
    let dir = fixtures().join(case);
    let config = ModelConfig::from_dir(&dir).unwrap();
    let (batch, targets) = packed(&examples(case));
    let mut trainer = PackedTrainer::load(&dir, config, Arc::new(Reference)).unwrap();
    let error = |trainer: &PackedTrainer<Reference>| -> f32 {
        let rows: Vec<usize> = targets.iter().map(|&(r, _)| r).collect();
        let (values, width) = trainer.decoder.head_at(&batch, &rows, None).unwrap();
        values
            .chunks(width)
            .zip(&targets)
            .map(|(v, &(_, y))| (1.0 / (1.0 + (v[0] - v[1]).exp()) - y).abs())
            .sum::<f32>()
            / targets.len() as f32
    };
    let before = error(&trainer);
    let mut losses = Vec::new();
    for _ in 0..20 {
        losses.push(trainer.step(&batch, &targets, 3e-3, 0.0, Some(1.0)).unwrap().loss);
    }
    let after = error(&trainer);
    assert!(losses[19] < 0.7 * losses[0], "loss {losses:?}");
    assert!(after < 0.8 * before, "mean |P(good) − label| {before} → {after}");
}

/// The packed training loop (what `train-prm --device cuda` runs) with the CPU trainer's
/// settings: the validation loss falls, the checkpoint it writes scores in the CPU engine as the
/// trained model scored, and a run started again on its folder continues from its step.
#[test]
fn the_packed_training_loop_checkpoints_and_resumes() {
    use stepwise_model::train::packed::{evaluate_packed, train_packed};
    use stepwise_model::train::TrainConfig;
    let case = "qwen2-prm";
    let dir = fixtures().join(case);
    let ex = examples(case);
    let (valid, train) = ex.split_at(2);
    let out = std::env::temp_dir().join(format!("stepwise-packed-train-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let cfg = TrainConfig {
        lr: 3e-3,
        warmup: 2,
        steps: 12,
        batch_size: 4,
        eval_every: 6,
        out_dir: Some(out.clone()),
        ..Default::default()
    };
    let load = |from: &std::path::Path| {
        PackedTrainer::load(from, ModelConfig::from_dir(from).unwrap(), Arc::new(Reference)).unwrap()
    };
    let mut trainer = load(&dir);
    let before = evaluate_packed(&trainer, valid, 256).unwrap();
    let mut losses = Vec::new();
    let state = train_packed(&mut trainer, train, valid, &cfg, 256, |_, l| losses.push(l)).unwrap();
    assert_eq!((state.step, losses.len(), state.history.len()), (12, 12, 2));
    let after = &state.history.last().unwrap().1;
    assert!(
        after.loss < before.loss,
        "validation loss {} → {}",
        before.loss,
        after.loss
    );

    // The checkpoint in the CPU engine: the same step rewards as the trained model's forward.
    let (batch, targets) = packed(valid);
    let rows: Vec<usize> = targets.iter().map(|&(r, _)| r).collect();
    let (values, width) = trainer.decoder.head_at(&batch, &rows, None).unwrap();
    let model = Model::load(&out, &candle_core::Device::Cpu).unwrap();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let layout = PrmLayout::detect(&model, &tok).unwrap();
    let scorer = stepwise_model::PrmScorer::new(&model, &tok, layout);
    let encoded: Vec<stepwise_model::layout::Encoded> = valid
        .iter()
        .map(|e| stepwise_model::layout::Encoded {
            ids: e.ids.clone(),
            positions: e.targets.iter().map(|&(p, _)| p).collect(),
            steps_from: 0,
        })
        .collect();
    let mut k = 0;
    for got in scorer.score_batch(&encoded).unwrap() {
        for g in got {
            let v = &values[k * width..][..width];
            let want = 1.0 / (1.0 + (v[0] - v[1]).exp());
            assert!((g - want).abs() < 0.02, "step {k}: {g} vs {want}");
            k += 1;
        }
    }

    // Started again with more steps on the same folder, it continues from step 12.
    let mut resumed = load(&out);
    let more = TrainConfig { steps: 15, ..cfg };
    let state = train_packed(&mut resumed, train, valid, &more, 256, |_, _| {}).unwrap();
    assert_eq!((state.step, state.history.len()), (15, 3));
    let _ = std::fs::remove_dir_all(&out);
}
