//! Training on the packed engine (what a GPU trains with), checked on the CPU through its
//! reference backend: every gradient against candle's autograd through the CPU trainer's loss on
//! the same batch, and a few AdamW steps lowering the loss and moving the scores toward the
//! labels. Only the CUDA kernels' own code is left to the GPU check.

mod common;

use common::{fixtures, lm_examples};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use stepwise_model::packed_engine::{Cpu, PackedTrainer, Reference, Targets, TrainBackend};
use stepwise_model::train::{batch_loss, Example, Objective, VarMap};
use stepwise_model::{Model, ModelConfig, Packed, Tokenizer};

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
    let layout = stepwise_model::layout::detect(&model, &tok).unwrap();
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
                ..Default::default()
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
        let (batch, targets) = packed(&ex);

        let mut trainer = reference_trainer(&dir);
        let loss = trainer.backward(&batch, Targets::Labels(&targets)).unwrap();
        let ours: HashMap<String, Vec<f32>> = trainer.gradients().unwrap().into_iter().collect();
        assert_matches_candle(case, &dir, &ex, Objective::Classify, loss, &ours);
    }
}

/// The packed trainer's loss and gradients (`loss`, `ours`) on `examples` against candle's
/// autograd of the CPU trainer's f32 loss under `objective`, the model read from `dir`.
fn assert_matches_candle(
    case: &str,
    dir: &std::path::Path,
    examples: &[Example],
    objective: Objective,
    loss: f32,
    ours: &HashMap<String, Vec<f32>>,
) {
    let varmap = VarMap::new();
    let config = ModelConfig::from_dir(dir).unwrap();
    let mut model = Model::load_trainable(dir, config, &varmap, &candle_core::Device::Cpu, 0).unwrap();
    model.set_training(true);
    let refs: Vec<&Example> = examples.iter().collect();
    let (candle_loss, _) = batch_loss(&model, &refs, objective).unwrap();
    let grads = candle_loss.backward().unwrap();
    let candle_loss = candle_loss.to_scalar::<f32>().unwrap();
    assert!(
        (loss - candle_loss).abs() < 0.01 * candle_loss.abs().max(0.1),
        "{case}: loss {loss} vs {candle_loss}"
    );
    assert_gradients_match(case, ours, &varmap, &grads);
}

/// Each of candle's variables' gradient (`grads`, autograd of the f32 loss) against the packed
/// trainer's (`ours`, by checkpoint name): bf16 rounding of every product's operands moves them
/// by a few percent (measured: cosine ≥ 0.983, norm ratio 0.95–1.07); a wrong term or factor
/// moves them far more.
fn assert_gradients_match(
    case: &str,
    ours: &HashMap<String, Vec<f32>>,
    varmap: &VarMap,
    grads: &candle_core::backprop::GradStore,
) {
    let vars = varmap.data().lock().unwrap();
    let mut cosines = Vec::new();
    assert_eq!(ours.len(), vars.len(), "{case}: one gradient a variable");
    for (name, var) in vars.iter() {
        let want: Vec<f32> = grads.get(var).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let got = &ours[name];
        assert_eq!(got.len(), want.len(), "{case}: {name}");
        let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
        let (c, ratio) = (cosine(got, &want), norm(got) / norm(&want).max(1e-30));
        assert!(
            c > 0.98 && (0.92..1.08).contains(&ratio),
            "{case}: {name}: cosine {c}, norm ratio {ratio}"
        );
        cosines.push(c);
    }
    let mean = cosines.iter().sum::<f64>() / cosines.len() as f64;
    assert!(mean > 0.99, "{case}: mean cosine {mean}");
}

/// AdamW steps on the packed trainer lower the loss and move its forward's scores toward the
/// labels (the forward reads the bf16 copies each update refreshes from the f32 masters).
#[test]
fn packed_training_lowers_the_loss() {
    let case = "qwen2-prm";
    let dir = fixtures().join(case);
    let (batch, targets) = packed(&examples(case));
    let mut trainer = reference_trainer(&dir);
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
        let step = trainer.step(&batch, Targets::Labels(&targets), 3e-3, 0.0, Some(1.0));
        losses.push(step.unwrap().loss);
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
    let out_tmp = run_folder("train");
    let out = out_tmp.path();
    let cfg = loop_config(out, 12, 4, 6);
    let mut trainer = reference_trainer(&dir);
    let before = evaluate_packed(&trainer, valid, Objective::Classify, 256).unwrap();
    let mut losses = Vec::new();
    let state = train_packed(&mut trainer, train, valid, Objective::Classify, &cfg, 256, |_, l| {
        losses.push(l)
    })
    .unwrap();
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
    let model = Model::load(out, &candle_core::Device::Cpu).unwrap();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let layout = stepwise_model::layout::detect(&model, &tok).unwrap();
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
    let mut resumed = reference_trainer(out);
    let more = TrainConfig { steps: 15, ..cfg };
    let state = train_packed(&mut resumed, train, valid, Objective::Classify, &more, 256, |_, _| {}).unwrap();
    assert_eq!((state.step, state.history.len()), (15, 3));
}

/// With `keep_best`, the packed loop ends with its best validation's weights, in the trainer
/// (without a folder: a copy kept on the device) and in its folder, however far the later steps
/// wander (a learning rate that overshoots); a finished run given more steps continues from its
/// last step's weights, kept beside the best, not from the best.
#[test]
fn the_packed_loop_keeps_the_best_validation_and_continues_from_the_last_step() {
    use stepwise_model::train::packed::{evaluate_packed, train_packed};
    use stepwise_model::train::TrainConfig;
    let dir = fixtures().join("qwen2-prm");
    let ex = examples("qwen2-prm");
    let (valid, train) = ex.split_at(2);
    let out_tmp = run_folder("best");
    let out = out_tmp.path();
    let loss = |t: &PackedTrainer<Reference>| evaluate_packed(t, valid, Objective::Classify, 256).unwrap().loss;
    for out_dir in [None, Some(out.to_path_buf())] {
        let cfg = TrainConfig {
            lr: 0.3,
            warmup: 1,
            keep_best: true,
            out_dir: out_dir.clone(),
            ..loop_config(out, 12, 4, 1)
        };
        let mut trainer = reference_trainer(&dir);
        let state = train_packed(&mut trainer, train, valid, Objective::Classify, &cfg, 256, |_, _| {}).unwrap();
        let (best, best_step) = (state.best_valid_loss.unwrap(), state.best_step.unwrap());
        assert!(
            best_step < state.step,
            "the overshooting run was best at its end: no test"
        );
        assert!(
            (loss(&trainer) - best).abs() < 1e-6,
            "ends at {}, best was {best}",
            loss(&trainer)
        );
        if out_dir.is_none() {
            continue;
        }
        let stored = loss(&reference_trainer(out));
        assert!(
            (stored - best).abs() < 1e-6,
            "the folder holds {stored}, best was {best}"
        );
        let last = state.history.last().unwrap().1.loss;
        assert!(
            (last - best).abs() > 1e-4,
            "the last step was as good as the best: no test"
        );
        // One more step at a learning rate too small to move anything: its validation is the
        // last step's, so the run went on from the last step's weights.
        let more = TrainConfig {
            steps: 13,
            lr: 1e-12,
            ..cfg
        };
        let mut resumed = reference_trainer(out);
        let state = train_packed(&mut resumed, train, valid, Objective::Classify, &more, 256, |_, _| {}).unwrap();
        let (step, went_on) = (state.history.last().unwrap().0, state.history.last().unwrap().1.loss);
        assert_eq!((step, state.history.len()), (13, 13));
        assert!(
            (went_on - last).abs() < 1e-5,
            "continued at {went_on}: the last step was {last}"
        );
        assert_eq!(state.best_step, Some(best_step));
        assert!(
            (loss(&resumed) - best).abs() < 1e-6,
            "the longer run ends with the best weights too"
        );
    }
}

/// With `patience`, a packed run whose validation stops improving stops early, and started
/// again on its folder it stays stopped: no more steps.
#[test]
fn a_packed_run_that_stopped_early_stays_stopped() {
    use stepwise_model::train::packed::train_packed;
    use stepwise_model::train::TrainConfig;
    let dir = fixtures().join("qwen2-prm");
    let ex = examples("qwen2-prm");
    let (valid, train) = ex.split_at(2);
    let out_tmp = run_folder("patience");
    let out = out_tmp.path();
    let cfg = TrainConfig {
        lr: 0.3,
        warmup: 1,
        patience: 2,
        ..loop_config(out, 40, 4, 1)
    };
    let mut trainer = reference_trainer(&dir);
    let state = train_packed(&mut trainer, train, valid, Objective::Classify, &cfg, 256, |_, _| {}).unwrap();
    assert!(
        state.stopped_early && state.step < 40,
        "step {}: no early stop",
        state.step
    );
    let mut again = reference_trainer(out);
    let mut steps = 0;
    let resumed = train_packed(&mut again, train, valid, Objective::Classify, &cfg, 256, |_, _| {
        steps += 1
    })
    .unwrap();
    assert_eq!((steps, resumed.step), (0, state.step), "the stopped run trained on");
    assert_eq!(resumed.history.len(), state.history.len(), "validated again");
}

/// A packed run killed after a checkpoint (of a bf16 model: its exact f32 weights kept beside
/// it) and started again ends with the weights of the run that was never interrupted: the same
/// batches, the same AdamW state, the same copies of the weights.
#[test]
fn a_killed_packed_run_resumes_to_the_same_weights() {
    use stepwise_model::train::packed::train_packed;
    let dir = fixtures().join("qwen2-prm");
    let items: Vec<Value> = (0..12)
        .map(|i| serde_json::json!({"problem": format!("count from {i}"), "steps": [format!("{}", i + 1), format!("{}", i + 2 + i % 3)]}))
        .collect();
    let ex = examples_in(&dir, &items);
    let (valid, train) = ex.split_at(2);
    let run = |name: &str, killed_at: Option<usize>| {
        let out_tmp = run_folder(name);
        let out = out_tmp.path();
        let cfg = loop_config(out, 8, 4, 2);
        if let Some(k) = killed_at {
            let mut trainer = reference_trainer(&dir);
            let killed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                train_packed(&mut trainer, train, valid, Objective::Classify, &cfg, 256, |s, _| {
                    assert_ne!(s, k, "killed");
                })
            }));
            assert!(killed.is_err());
        }
        let start = if killed_at.is_some() { out } else { &dir };
        let mut trainer = reference_trainer(start);
        train_packed(&mut trainer, train, valid, Objective::Classify, &cfg, 256, |_, _| {}).unwrap();
        let _ = std::fs::remove_dir_all(out);
        trainer.weights().unwrap()
    };
    let whole = run("whole", None);
    assert!(
        whole != reference_trainer(&dir).weights().unwrap(),
        "training moved nothing"
    );
    assert!(
        whole == run("killed", Some(5)),
        "killed at step 5 and resumed, the weights differ"
    );
}

/// The loss of `objective` on `examples` and its gradients by checkpoint name from the packed
/// trainer (the tokens' log-probabilities through the loss written for the packed engine).
fn packed_token_gradients<B: TrainBackend>(
    trainer: &mut PackedTrainer<B>,
    examples: &[Example],
    objective: Objective,
) -> (f32, HashMap<String, Vec<f32>>) {
    use stepwise_model::train::packed::TokenBatch;
    let refs: Vec<&Example> = examples.iter().collect();
    let tokens = TokenBatch::new(&refs, objective).unwrap();
    let mut loss = |logp: &[f32]| tokens.loss(objective, logp).map(|l| (l.value, l.derivative));
    let targets = Targets::Tokens {
        pairs: &tokens.pairs,
        loss: &mut loss,
    };
    let value = trainer.backward(&tokens.packed, targets).unwrap();
    (value, trainer.gradients().unwrap().into_iter().collect())
}

/// A causal LM's gradients on the packed trainer (the LM head tied to the embeddings, every
/// token's log-probability through the vocabulary logits' kernels) against candle's autograd of
/// the CPU trainer's loss, for next-token prediction and for a log-ratio verifier against a
/// constant reference and against the policy itself (the reference's log-probabilities attached
/// by the CPU engine).
#[test]
fn packed_lm_gradients_match_candle_autograd() {
    use stepwise_model::log_ratio::LogRatio;
    use stepwise_model::train::examples::attach_reference;
    let dir = fixtures().join("qwen2-policy");
    let config = ModelConfig::from_dir(&dir).unwrap();
    assert!(
        config.tie_word_embeddings,
        "the fixture ties its LM head to the embeddings"
    );
    // Against the policy itself, each engine takes the reference's log-probabilities from its
    // own forward (as `train-prm` does where it trains), so each starts at log-ratio 0.
    let mut examples = lm_examples(6, 3);
    let mut packed_examples = examples.clone();
    let reference = Model::load(&dir, &candle_core::Device::Cpu).unwrap();
    attach_reference(&reference, &mut examples, 8).unwrap();
    let start = reference_trainer(&dir);
    let seqs: Vec<&[u32]> = examples.iter().map(|e| e.ids.as_slice()).collect();
    let own = stepwise_model::train::packed::sequence_logprobs(&start.decoder, &seqs, 512).unwrap();
    for (e, lp) in packed_examples.iter_mut().zip(own) {
        e.ref_logprobs = lp;
    }
    let constant = LogRatio {
        beta: 1.0,
        cumulative: false,
        reference_logprob: Some(-0.5),
        last_tokens: None,
    };
    let cases = [
        ("next token", Objective::Lm, None),
        // Logits of 7 rows at a time: the chunked head (a real vocabulary's path).
        ("next token, logits in chunks", Objective::Lm, Some(6 * 601 * 7)),
        ("log-ratio, constant reference", Objective::LogRatio(constant), None),
        (
            "log-ratio, the policy as reference, last 2 tokens",
            Objective::LogRatio(LogRatio {
                reference_logprob: None,
                last_tokens: Some(2),
                ..constant
            }),
            Some(6 * 601 * 5),
        ),
    ];
    for (case, objective, budget) in cases {
        let mut trainer = reference_trainer(&dir);
        if let Some(bytes) = budget {
            trainer.set_logits_budget(bytes).unwrap();
        }
        let (loss, ours) = packed_token_gradients(&mut trainer, &packed_examples, objective);
        assert_matches_candle(case, &dir, &examples, objective, loss, &ours);
    }
}

/// The packed forward's token log-probabilities (bf16 weights, the vocabulary logits in row
/// chunks) are the CPU engine's (f32 weights) within bf16 rounding, sequence by sequence.
#[test]
fn packed_token_logprobs_match_the_cpu_engine() {
    let dir = fixtures().join("qwen2-policy");
    let examples = lm_examples(5, 9);
    let seqs: Vec<&[u32]> = examples.iter().map(|e| e.ids.as_slice()).collect();
    let trainer = reference_trainer(&dir);
    // A budget smaller than the batch: several packed passes.
    let ours = stepwise_model::train::packed::sequence_logprobs(&trainer.decoder, &seqs, 64).unwrap();
    let model = Model::load(&dir, &candle_core::Device::Cpu).unwrap();
    let want = stepwise_model::log_ratio::sequence_logprobs(&model, &seqs, 8, 512).unwrap();
    for (a, b) in ours.iter().zip(&want) {
        assert_eq!(a.len(), b.len());
        assert_eq!(a[0], 0.0);
        assert_close_logprobs(a, b);
    }
}

/// bf16 weights and activations against f32: the random fixture's log-probabilities are large
/// (a mean of −26), and bf16's relative rounding (2⁻⁹) of the weights and of the normed hidden
/// state moves them by up to 1.6% (measured: mean 0.095, largest 0.43); after training, by up to
/// 0.08 at −1.2. Training moves them by tens.
fn assert_close_logprobs(ours: &[f32], want: &[f32]) {
    for (x, y) in ours.iter().zip(want) {
        assert!((x - y).abs() <= 0.02 * y.abs() + 0.1, "{x} vs {y}");
    }
}

/// Next-token training on the packed trainer: the validation loss falls, and the checkpoint it
/// writes (tied embeddings, no `lm_head`) gives the CPU engine the log-probabilities the trained
/// model gives.
#[test]
fn packed_lm_training_lowers_the_loss_and_checkpoints() {
    use stepwise_model::train::packed::{evaluate_packed, sequence_logprobs, train_packed};
    let dir = fixtures().join("qwen2-policy");
    let examples = lm_examples(24, 5);
    let (valid, train) = examples.split_at(4);
    let out_tmp = run_folder("lm");
    let out = out_tmp.path();
    let cfg = loop_config(out, 10, 8, 5);
    let mut trainer = reference_trainer(&dir);
    let before = evaluate_packed(&trainer, valid, Objective::Lm, 512).unwrap();
    let state = train_packed(&mut trainer, train, valid, Objective::Lm, &cfg, 512, |_, _| {}).unwrap();
    let after = &state.history.last().unwrap().1;
    assert!(
        after.loss < 0.9 * before.loss,
        "validation loss {} → {}",
        before.loss,
        after.loss
    );
    let seqs: Vec<&[u32]> = valid.iter().map(|e| e.ids.as_slice()).collect();
    let ours = sequence_logprobs(&trainer.decoder, &seqs, 512).unwrap();
    let model = Model::load(out, &candle_core::Device::Cpu).unwrap();
    let theirs = stepwise_model::log_ratio::sequence_logprobs(&model, &seqs, 8, 512).unwrap();
    for (a, b) in ours.iter().zip(&theirs) {
        assert_close_logprobs(a, b);
    }
}

/// The packed trainer on the CPU backend (what `train-prm --trainer packed` runs on a CPU) gives
/// the reference backend's loss and gradients on the same batch, for classifier heads and for a
/// causal LM's next-token and log-ratio objectives (the vocabulary logits in chunks too), and
/// its AdamW steps lower the loss as the reference's do. The two differ in the order of their
/// f32 sums (and so in a bf16 rounding here and there) and in attention, whose probabilities
/// and scores' gradient the CPU multiplies in bf16 (PyTorch's bf16 attention): the losses agree
/// within half a percent, every gradient within 2% in norm (a bias whose rows cancel moves most).
#[test]
fn the_cpu_backend_trains_as_the_reference() {
    let close = |case: &str, (la, ga): (f32, HashMap<String, Vec<f32>>), (lb, gb): (f32, HashMap<String, Vec<f32>>)| {
        assert!((la - lb).abs() <= 5e-3 * lb.abs().max(0.1), "{case}: loss {la} vs {lb}");
        assert_eq!(ga.len(), gb.len(), "{case}");
        for (name, want) in &gb {
            let got = &ga[name];
            let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
            let (c, ratio) = (cosine(got, want), norm(got) / norm(want).max(1e-30));
            assert!(
                c > 0.999 && (0.98..1.02).contains(&ratio),
                "{case}: {name}: cosine {c}, norm ratio {ratio}"
            );
        }
    };
    for case in ["qwen2-prm", "qwen2-tokcls"] {
        let dir = fixtures().join(case);
        let (batch, targets) = packed(&examples(case));
        let (mut a, mut b) = (cpu_trainer(&dir), reference_trainer(&dir));
        let la = a.backward(&batch, Targets::Labels(&targets)).unwrap();
        let lb = b.backward(&batch, Targets::Labels(&targets)).unwrap();
        let (ga, gb) = (a.gradients().unwrap(), b.gradients().unwrap());
        close(case, (la, ga.into_iter().collect()), (lb, gb.into_iter().collect()));
        let mut losses = Vec::new();
        for _ in 0..5 {
            let (x, y) = (
                a.step(&batch, Targets::Labels(&targets), 1e-3, 0.0, Some(1.0))
                    .unwrap()
                    .loss,
                b.step(&batch, Targets::Labels(&targets), 1e-3, 0.0, Some(1.0))
                    .unwrap()
                    .loss,
            );
            losses.push((x, y));
        }
        let ((first, _), (last_cpu, last_ref)) = (losses[0], losses[4]);
        assert!(
            last_cpu < 0.9 * first && (last_cpu - last_ref).abs() < 0.05 * last_ref,
            "{case}: {losses:?}"
        );
    }
    let dir = fixtures().join("qwen2-policy");
    let examples = lm_examples(6, 3);
    let constant = stepwise_model::log_ratio::LogRatio {
        beta: 1.0,
        cumulative: false,
        reference_logprob: Some(-0.5),
        last_tokens: None,
    };
    for (case, objective, budget) in [
        ("next token", Objective::Lm, None),
        (
            "log-ratio, logits in chunks",
            Objective::LogRatio(constant),
            Some(6 * 601 * 7),
        ),
    ] {
        let (mut a, mut b) = (cpu_trainer(&dir), reference_trainer(&dir));
        if let Some(bytes) = budget {
            a.set_logits_budget(bytes).unwrap();
            b.set_logits_budget(bytes).unwrap();
        }
        let ours = packed_token_gradients(&mut a, &examples, objective);
        close(case, ours, packed_token_gradients(&mut b, &examples, objective));
    }
}

/// A step that keeps every layer's activations from its forward and one that recomputes each
/// layer in its backward (a budget of 0) give the same loss and gradients, bit for bit, on both
/// backends, for a reward head and for next-token prediction.
#[test]
fn kept_and_recomputed_activations_give_the_same_gradients() {
    fn both<B: TrainBackend>(mut t: PackedTrainer<B>, step: &dyn Fn(&mut PackedTrainer<B>) -> f32) {
        let (mut keep, mut recompute) = (Vec::new(), Vec::new());
        for (budget, out) in [(None, &mut keep), (Some(0), &mut recompute)] {
            t.set_activation_budget(budget);
            let loss = step(&mut t);
            out.push((String::new(), vec![loss]));
            out.extend(t.gradients().unwrap());
            t.update(0.0, 0.0, None, 1).unwrap();
        }
        assert!(
            keep.len() > 2 && keep == recompute,
            "kept and recomputed activations differ"
        );
    }
    let dir = fixtures().join("qwen2-prm");
    let (batch, targets) = packed(&examples("qwen2-prm"));
    let labels = |t: &mut PackedTrainer<Cpu>| t.backward(&batch, Targets::Labels(&targets)).unwrap();
    both(cpu_trainer(&dir), &labels);
    let labels = |t: &mut PackedTrainer<Reference>| t.backward(&batch, Targets::Labels(&targets)).unwrap();
    both(reference_trainer(&dir), &labels);
    let (dir, lm) = (fixtures().join("qwen2-policy"), lm_examples(4, 5));
    both(cpu_trainer(&dir), &|t| packed_token_gradients(t, &lm, Objective::Lm).0);
}

/// A classifier's step reads each example through its last target only (the tokens after it,
/// say the unlabelled steps past the first bad one, cannot move what a causal model reads
/// there): the batch leaves them out, with the loss and gradients of the whole sequences.
#[test]
fn a_classifier_step_leaves_out_the_tokens_past_its_last_target() {
    let (dir, mut ex) = (fixtures().join("qwen2-prm"), examples("qwen2-prm"));
    ex.iter_mut().for_each(|e| e.ids.extend_from_slice(&e.ids.clone()[..5]));
    let (batch, targets) = packed(&ex);
    let whole = Packed::new(&ex.iter().map(|e| e.ids.as_slice()).collect::<Vec<_>>());
    assert!(batch.tokens() + 5 * ex.len() <= whole.tokens());
    let rows = ex
        .iter()
        .enumerate()
        .flat_map(|(i, e)| e.targets.iter().map(move |&(p, y)| (i, p, y)));
    let whole_targets: Vec<(usize, f32)> = rows.map(|(i, p, y)| (whole.row(i, p), y)).collect();
    let (mut a, mut b) = (reference_trainer(&dir), reference_trainer(&dir));
    let la = a.backward(&batch, Targets::Labels(&targets)).unwrap();
    assert_eq!(la, b.backward(&whole, Targets::Labels(&whole_targets)).unwrap());
    assert!(a.gradients().unwrap() == b.gradients().unwrap(), "gradients differ");
}

/// The checkpoint folder `dir`'s model on the packed trainer, on the CPU backend.
fn cpu_trainer(dir: &std::path::Path) -> PackedTrainer<Cpu> {
    PackedTrainer::load(dir, ModelConfig::from_dir(dir).unwrap(), Arc::new(Cpu)).unwrap()
}

/// The checkpoint folder `dir`'s model on the packed trainer, on the reference backend.
fn reference_trainer(dir: &std::path::Path) -> PackedTrainer<Reference> {
    PackedTrainer::load(dir, ModelConfig::from_dir(dir).unwrap(), Arc::new(Reference)).unwrap()
}

/// An empty folder for a training run named `name`, removed when dropped.
fn run_folder(name: &str) -> tempfile::TempDir {
    tempfile::TempDir::with_prefix(format!("stepwise-packed-{name}-")).unwrap()
}

/// The training loop's settings for the tests: `steps` steps of `batch_size` examples,
/// validating every `eval_every`, checkpoints in `out`.
fn loop_config(
    out: &std::path::Path,
    steps: usize,
    batch_size: usize,
    eval_every: usize,
) -> stepwise_model::train::TrainConfig {
    stepwise_model::train::TrainConfig {
        lr: 3e-3,
        warmup: 2,
        steps,
        batch_size,
        eval_every,
        out_dir: Some(out.to_path_buf()),
        ..Default::default()
    }
}
