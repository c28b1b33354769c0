//! LoRA on the packed trainer: the adapters' gradients are the full gradient's projections
//! (`dA = (α/r)·Bᵀ·G`, `dB = (α/r)·G·Aᵀ` for the gradient `G` of the merged matrix, which the
//! full trainer computes from the same forward), the base stays as it was to the bit, the
//! checkpoint is the merged model beside PEFT's adapter files, and a run killed mid-way resumes
//! to the same adapters.

mod common;

use common::{fixtures, lm_examples};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use stepwise_model::packed_engine::{Cpu, LoraConfig, PackedTrainer, Targets};
use stepwise_model::train::packed::TokenBatch;
use stepwise_model::train::{Example, Objective};
use stepwise_model::ModelConfig;

fn trainer(dir: &Path, lora: Option<LoraConfig>) -> PackedTrainer<Cpu> {
    PackedTrainer::load_with(dir, ModelConfig::from_dir(dir).unwrap(), Arc::new(Cpu), lora).unwrap()
}

/// One backward of next-token prediction on `examples`: the loss and the gradients by name.
fn lm_backward(t: &mut PackedTrainer<Cpu>, examples: &[Example]) -> (f32, HashMap<String, Vec<f32>>) {
    let refs: Vec<&Example> = examples.iter().collect();
    let tokens = TokenBatch::new(&refs, Objective::Lm).unwrap();
    let mut loss = |logp: &[f32]| tokens.loss(Objective::Lm, logp).map(|l| (l.value, l.derivative));
    let targets = Targets::Tokens {
        pairs: &tokens.pairs,
        loss: &mut loss,
    };
    let value = t.backward(&tokens.packed, targets).unwrap();
    (value, t.gradients().unwrap().into_iter().collect())
}

/// `a · b` for row-major `a` `[n, m]` and `b` `[m, k]`, in f64.
fn matmul(a: &[f32], b: &[f32], n: usize, m: usize, k: usize) -> Vec<f64> {
    let mut out = vec![0f64; n * k];
    for i in 0..n {
        for j in 0..m {
            let x = a[i * m + j] as f64;
            for l in 0..k {
                out[i * k + l] += x * b[j * k + l] as f64;
            }
        }
    }
    out
}

fn transpose(a: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..cols)
        .flat_map(|c| (0..rows).map(move |r| a[r * cols + c]))
        .collect()
}

/// `|got − want| / |want|` over all values.
fn relative_error(got: &[f32], want: &[f64]) -> f64 {
    let diff: f64 = got.iter().zip(want).map(|(&g, &w)| (g as f64 - w).powi(2)).sum();
    let norm: f64 = want.iter().map(|w| w * w).sum();
    (diff / norm.max(1e-300)).sqrt()
}

fn module_weight(module: &str, layer: usize) -> String {
    let block = if ["gate_proj", "up_proj", "down_proj"].contains(&module) {
        "mlp"
    } else {
        "self_attn"
    };
    format!("model.layers.{layer}.{block}.{module}.weight")
}

#[test]
fn lora_gradients_are_the_full_gradients_projections() {
    let dir = fixtures().join("qwen2-policy");
    let cfg = ModelConfig::from_dir(&dir).unwrap();
    let examples = lm_examples(6, 3);
    for targets in [
        None,
        Some(vec![
            "q_proj".to_string(),
            "v_proj".to_string(),
            "down_proj".to_string(),
        ]),
    ] {
        let mut lora = LoraConfig::new(4);
        lora.alpha = 8.0;
        if let Some(t) = &targets {
            lora.targets = t.clone();
        }
        let mut t = trainer(&dir, Some(lora.clone()));
        // A step first, so that B is not zero and dA not either.
        lm_backward(&mut t, &examples);
        t.update(0.05, 0.0, None, 1).unwrap();
        let (loss, grads) = lm_backward(&mut t, &examples);
        let saved = tempfile::tempdir().unwrap();
        t.save_checkpoint(saved.path()).unwrap();
        let mut full = trainer(saved.path(), None);
        let (full_loss, full_grads) = lm_backward(&mut full, &examples);
        assert_eq!(loss, full_loss, "the merged model's forward is the adapted one's");
        let weights: HashMap<String, Vec<f32>> = t.weights().unwrap().into_iter().collect();
        let mut checked = 0;
        for layer in 0..cfg.num_hidden_layers {
            for module in stepwise_model::packed_engine::LORA_MODULES {
                let a_name = format!(
                    "base_model.model.{}",
                    module_weight(module, layer).replace(".weight", ".lora_A.weight")
                );
                let b_name = a_name.replace("lora_A", "lora_B");
                let Some(a) = weights.get(&a_name) else {
                    assert!(!lora.targets.iter().any(|t| t == module), "{a_name} is missing");
                    continue;
                };
                let (b, g) = (&weights[&b_name], &full_grads[&module_weight(module, layer)]);
                let (r, k) = (lora.rank, a.len() / lora.rank);
                let n = g.len() / k;
                let s = (lora.alpha / r as f32) as f64;
                assert!(b.iter().any(|&x| x != 0.0), "{b_name} did not move");
                // dA = s·Bᵀ·G ([r, n]·[n, k]); dB = s·G·Aᵀ ([n, k]·[k, r]).
                let want_a: Vec<f64> = matmul(&transpose(b, n, r), g, r, n, k).iter().map(|x| s * x).collect();
                let want_b: Vec<f64> = matmul(g, &transpose(a, r, k), n, k, r).iter().map(|x| s * x).collect();
                let (ea, eb) = (
                    relative_error(&grads[&a_name], &want_a),
                    relative_error(&grads[&b_name], &want_b),
                );
                assert!(ea < 0.03 && eb < 0.03, "{a_name}: dA off by {ea:.4}, dB by {eb:.4}");
                checked += 1;
            }
        }
        let per_layer = lora.targets.len();
        assert_eq!(checked, per_layer * cfg.num_hidden_layers, "{targets:?}");
        // The frozen base has no gradient of its own.
        assert!(!grads.contains_key("model.embed_tokens.weight") && !grads.contains_key("model.norm.weight"));
    }
}

#[test]
fn lora_training_keeps_the_base_and_writes_the_merged_model_beside_peft_adapters() {
    let dir = fixtures().join("qwen2-policy");
    let examples = lm_examples(12, 5);
    let mut t = trainer(&dir, Some(LoraConfig::new(8)));
    let first = lm_backward(&mut t, &examples).0;
    t.update(0.02, 0.0, Some(1.0), 1).unwrap();
    for _ in 0..6 {
        lm_backward(&mut t, &examples);
        t.update(0.02, 0.0, Some(1.0), 1).unwrap();
    }
    let last = lm_backward(&mut t, &examples).0;
    assert!(last < 0.9 * first, "loss {first} → {last}");
    let out = tempfile::tempdir().unwrap();
    t.save_checkpoint(out.path()).unwrap();
    let read = |p: &Path| std::fs::read(p).unwrap();
    let (base_bytes, merged_bytes) = (
        read(&dir.join("model.safetensors")),
        read(&out.path().join("model.safetensors")),
    );
    let base = safetensors::SafeTensors::deserialize(&base_bytes).unwrap();
    let merged = safetensors::SafeTensors::deserialize(&merged_bytes).unwrap();
    // Every frozen tensor as the base stores it (the fixture: f32), the adapted ones merged.
    let (mut same, mut moved) = (0, 0);
    for (name, view) in base.tensors() {
        let got = merged.tensor(&name).unwrap();
        assert_eq!(got.shape(), view.shape(), "{name}");
        if got.data() == view.data() {
            same += 1;
        } else {
            assert!(name.contains("_proj.weight"), "{name}: a frozen tensor changed");
            moved += 1;
        }
    }
    assert!(same > 0 && moved > 0, "{same} unchanged, {moved} adapted");
    let adapter_bytes = read(&out.path().join("adapter_model.safetensors"));
    let adapter = safetensors::SafeTensors::deserialize(&adapter_bytes).unwrap();
    let a = adapter
        .tensor("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight")
        .unwrap();
    let b = adapter
        .tensor("base_model.model.model.layers.0.mlp.up_proj.lora_B.weight")
        .unwrap();
    let cfg = ModelConfig::from_dir(&dir).unwrap();
    assert_eq!(a.shape(), [8, cfg.hidden_size]);
    assert_eq!(b.shape(), [cfg.intermediate_size, 8]);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!(
        (
            json["peft_type"].as_str(),
            json["r"].as_u64(),
            json["lora_alpha"].as_f64()
        ),
        (Some("LORA"), Some(8), Some(16.0))
    );
    // The merged folder is a model as any other: the CPU engine reads it, and gives what the
    // adapted trainer gives.
    let seqs: Vec<&[u32]> = examples.iter().take(3).map(|e| e.ids.as_slice()).collect();
    let ours = stepwise_model::train::packed::sequence_logprobs(&t.decoder, &seqs, 512).unwrap();
    let reloaded = trainer(out.path(), None);
    let theirs = stepwise_model::train::packed::sequence_logprobs(&reloaded.decoder, &seqs, 512).unwrap();
    assert_eq!(ours, theirs);
}

#[test]
fn a_lora_run_saved_and_resumed_continues_to_the_same_adapters() {
    let dir = fixtures().join("qwen2-policy");
    let examples = lm_examples(8, 9);
    let step = |t: &mut PackedTrainer<Cpu>| {
        lm_backward(t, &examples);
        t.update(0.01, 0.01, Some(1.0), 1).unwrap();
    };
    let mut whole = trainer(&dir, Some(LoraConfig::new(4)));
    for _ in 0..4 {
        step(&mut whole);
    }
    let mut first = trainer(&dir, Some(LoraConfig::new(4)));
    for _ in 0..2 {
        step(&mut first);
    }
    let saved = tempfile::tempdir().unwrap();
    first.save_checkpoint(saved.path()).unwrap();
    first.save_optimizer(&saved.path().join("optim.safetensors")).unwrap();
    drop(first);
    // As `stepwise rl` and `dpo` resume: the policy loaded from its own folder, the run's
    // checkpoint read over it.
    let mut resumed = trainer(&dir, Some(LoraConfig::new(4)));
    resumed.load_weights(saved.path()).unwrap();
    resumed.load_optimizer(&saved.path().join("optim.safetensors")).unwrap();
    for _ in 0..2 {
        step(&mut resumed);
    }
    assert!(
        whole.weights().unwrap() == resumed.weights().unwrap(),
        "resumed adapters differ"
    );
    let seqs: Vec<&[u32]> = examples.iter().map(|e| e.ids.as_slice()).collect();
    let logp =
        |t: &PackedTrainer<Cpu>| stepwise_model::train::packed::sequence_logprobs(&t.decoder, &seqs, 512).unwrap();
    assert_eq!(logp(&whole), logp(&resumed));
}

#[test]
fn lora_settings_are_checked() {
    assert!(LoraConfig::parse_targets("q,v_proj").unwrap() == ["q_proj", "v_proj"]);
    assert_eq!(LoraConfig::parse_targets("all-linear").unwrap().len(), 7);
    let err = LoraConfig::parse_targets("q,lm_head").unwrap_err().to_string();
    assert!(err.contains("lm_head_proj") || err.contains("lm_head"), "{err}");
    let dir = fixtures().join("qwen2-policy");
    let load =
        |l: LoraConfig| PackedTrainer::load_with(&dir, ModelConfig::from_dir(&dir).unwrap(), Arc::new(Cpu), Some(l));
    let mut zero = LoraConfig::new(4);
    zero.rank = 0;
    assert!(load(zero).err().unwrap().to_string().contains("rank"));
}

#[test]
fn a_killed_lora_training_run_resumes_to_the_same_adapters() {
    use stepwise_model::train::packed::train_packed;
    let dir = fixtures().join("qwen2-policy");
    let examples = lm_examples(16, 11);
    let (valid, train) = examples.split_at(4);
    let lora = || Some(LoraConfig::new(4));
    let run = |killed_at: Option<usize>| {
        let out = tempfile::tempdir().unwrap();
        let cfg = stepwise_model::train::TrainConfig {
            lr: 1e-2,
            warmup: 1,
            steps: 6,
            batch_size: 4,
            eval_every: 2,
            out_dir: Some(out.path().to_path_buf()),
            keep_best: true,
            ..Default::default()
        };
        if let Some(k) = killed_at {
            let mut t = trainer(&dir, lora());
            let killed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                train_packed(&mut t, train, valid, Objective::Lm, &cfg, 512, |s, _| {
                    assert_ne!(s, k, "killed")
                })
            }));
            assert!(killed.is_err());
        }
        // As `train-prm --lora-rank` resumes: the trainer from the frozen base, the run's
        // adapters read from its folder.
        let mut t = trainer(&dir, lora());
        train_packed(&mut t, train, valid, Objective::Lm, &cfg, 512, |_, _| {}).unwrap();
        t.weights().unwrap()
    };
    let whole = run(None);
    assert!(
        whole == run(Some(3)),
        "killed at step 3 and resumed, the adapters differ"
    );
    assert!(
        whole == run(Some(5)),
        "killed at step 5 and resumed, the adapters differ"
    );
}

/// With the adapters off the decoder is the frozen base to the bit (an RL or DPO run's reference
/// without a second copy), and on again after: the trained policy's log-probabilities as before.
/// A reward model's head trains in full, so its base is not the adapted model's: refused.
#[test]
fn with_the_adapters_off_the_decoder_is_the_base() {
    use stepwise_model::train::packed::sequence_logprobs;
    let dir = fixtures().join("qwen2-policy");
    let seqs: Vec<Vec<u32>> = lm_examples(3, 5).iter().map(|e| e.ids.clone()).collect();
    let seqs: Vec<&[u32]> = seqs.iter().map(|s| s.as_slice()).collect();
    let base = sequence_logprobs(&trainer(&dir, None).decoder, &seqs, 4096).unwrap();
    let mut t = trainer(&dir, Some(LoraConfig::new(8)));
    assert!(t.has_frozen_base());
    for _ in 0..3 {
        lm_backward(&mut t, &lm_examples(8, 3));
        t.update(1e-2, 0.0, None, 1).unwrap();
    }
    let trained = sequence_logprobs(&t.decoder, &seqs, 4096).unwrap();
    assert_ne!(trained, base, "the adapters moved the policy");
    let off = t.with_adapters_off(|dec| sequence_logprobs(dec, &seqs, 4096)).unwrap();
    assert_eq!(off, base);
    assert_eq!(sequence_logprobs(&t.decoder, &seqs, 4096).unwrap(), trained);

    let lent = std::sync::Arc::clone(&t.decoder);
    let err = t.with_adapters_off(|_| Ok(())).unwrap_err().to_string();
    assert!(err.contains("lent"), "{err}");
    drop(lent);
    let full = &mut trainer(&dir, None);
    assert!(!full.has_frozen_base() && full.with_adapters_off(|_| Ok(())).is_err());
    let prm = fixtures().join("qwen2-prm");
    let mut head = trainer(&prm, Some(LoraConfig::new(4)));
    assert!(!head.has_frozen_base());
    let err = head.with_adapters_off(|_| Ok(())).unwrap_err().to_string();
    assert!(err.contains("head trains in full"), "{err}");
}
