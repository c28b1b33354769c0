//! Log-ratio verifiers (implicit-PRM parameterisation): token log-probabilities are the LM's own,
//! a verifier equal to its reference scores every step 1/2, batched scoring equals one at a
//! time, every weight gets a gradient, and a verifier fine-tuned from a policy, against the
//! policy or against a constant reference, learns to flag wrong steps and scores identically
//! after a round trip through its folder (reward.json).

use candle_core::{Device, IndexOp, Tensor, D};
use candle_nn::VarMap;
use std::path::PathBuf;
use stepwise_model::layout::RewardSpec;
use stepwise_model::log_ratio::{token_logprobs, LogRatio};
use stepwise_model::model::pad_batch;
use stepwise_model::train::examples::attach_reference;
use stepwise_model::train::examples::{label_examples, LabelOptions};
use stepwise_model::train::{batch_loss, evaluate, train, Objective, TrainConfig};
use stepwise_model::{HeadKind, Model, ModelConfig, PrmScorer, Tokenizer};

mod common;

fn tokenizer_dir() -> PathBuf {
    common::fixtures().join("qwen2-policy")
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_dir(&tokenizer_dir()).unwrap()
}

const SEP: &str = "\n";
const LR: LogRatio = LogRatio {
    beta: 1.0,
    cumulative: false,
    reference_logprob: None,
    last_tokens: None,
};
/// The likelihood head: a constant reference.
const LIKELIHOOD: LogRatio = LogRatio {
    reference_logprob: Some(-0.5),
    ..LR
};
/// The likelihood head over each step's last token and its separator only.
const LIKELIHOOD_OF_RESULTS: LogRatio = LogRatio {
    last_tokens: Some(2),
    ..LIKELIHOOD
};

fn lm(tok: &Tokenizer, varmap: &VarMap, seed: u64) -> Model {
    let cfg = ModelConfig::tiny(tok.vocab_size(), 64, 2, 4, 2, HeadKind::CausalLm);
    Model::fresh(cfg, varmap, &Device::Cpu, seed).unwrap()
}

fn opts(outcome: bool) -> LabelOptions {
    LabelOptions {
        separator: SEP.into(),
        separator_after_problem: true,
        outcome,
        ..Default::default()
    }
}

fn layout(log_ratio: LogRatio) -> stepwise_model::PrmLayout {
    stepwise_model::PrmLayout::LogRatio {
        separator: SEP.into(),
        log_ratio,
    }
}

#[test]
fn token_logprobs_are_the_lms_next_token_log_probabilities() {
    let tok = tokenizer();
    let model = lm(&tok, &VarMap::new(), 1);
    let seqs: Vec<Vec<u32>> = vec![(3..20).collect(), (40..47).collect()];
    let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
    let (ids, mask, t) = pad_batch(&refs, &Device::Cpu).unwrap();
    let lp: Vec<f32> = token_logprobs(&model, &ids, mask.as_ref()).unwrap().to_vec1().unwrap();
    for (b, s) in seqs.iter().enumerate() {
        // Alone, unpadded, through the full logits.
        let one = Tensor::new(s.as_slice(), &Device::Cpu).unwrap().unsqueeze(0).unwrap();
        let logits = model.forward(&one, None).unwrap().i(0).unwrap();
        let logp = candle_nn::ops::log_softmax(&logits, D::Minus1).unwrap();
        assert_eq!(lp[b * t], 0.0);
        for i in 1..s.len() {
            let want: f32 = logp.i((i - 1, s[i] as usize)).unwrap().to_scalar().unwrap();
            assert!(
                (lp[b * t + i] - want).abs() < 1e-5,
                "seq {b} pos {i}: {} vs {want}",
                lp[b * t + i]
            );
        }
    }
}

#[test]
fn a_verifier_equal_to_its_reference_is_undecided_and_batching_changes_nothing() {
    let tok = tokenizer();
    let reference = lm(&tok, &VarMap::new(), 1);
    let sols = common::counting_solutions(6, 4, 0.5);
    let same = PrmScorer::new(&reference, &tok, layout(LR)).with_reference(Some(&reference));
    for s in &sols {
        for x in same.score(&s.question, &s.step_texts()).unwrap() {
            assert!((x - 0.5).abs() < 1e-6, "{x}");
        }
    }
    let other = lm(&tok, &VarMap::new(), 2);
    let scorer = PrmScorer::new(&other, &tok, layout(LR)).with_reference(Some(&reference));
    let enc: Vec<_> = sols
        .iter()
        .map(|s| scorer.encode(&s.question, &s.step_texts()).unwrap())
        .collect();
    let batched = scorer.score_batch(&enc).unwrap();
    for (s, b) in sols.iter().zip(&batched) {
        let alone = scorer.score(&s.question, &s.step_texts()).unwrap();
        assert_eq!(alone.len(), s.steps.len());
        for (x, y) in alone.iter().zip(b) {
            assert!((x - y).abs() < 1e-5, "{x} vs {y}");
        }
        assert!(
            alone.iter().any(|x| (x - 0.5).abs() > 1e-4),
            "different models disagree"
        );
    }
}

#[test]
fn every_weight_receives_a_gradient() {
    let tok = tokenizer();
    let reference = lm(&tok, &VarMap::new(), 1);
    let varmap = VarMap::new();
    let mut model = lm(&tok, &varmap, 3);
    model.set_training(true);
    for (outcome, lr) in [
        (false, LR),
        (true, LR),
        (false, LIKELIHOOD),
        (false, LIKELIHOOD_OF_RESULTS),
    ] {
        let mut ex = label_examples(&tok, &common::counting_solutions(8, 1, 0.6), &opts(outcome)).unwrap();
        if lr.reference_logprob.is_none() {
            attach_reference(&reference, &mut ex, 4).unwrap();
        }
        let refs: Vec<_> = ex.iter().collect();
        let (loss, _) = batch_loss(&model, &refs, Objective::LogRatio(lr)).unwrap();
        let grads = loss.backward().unwrap();
        let data = varmap.data().lock().unwrap();
        for (name, var) in data.iter() {
            let g = grads
                .get(var.as_tensor())
                .unwrap_or_else(|| panic!("no gradient for {name}"));
            let norm = g.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(norm > 0.0, "zero gradient for {name}");
        }
    }
}

#[test]
fn a_log_ratio_prm_from_a_policy_learns_wrong_steps_and_round_trips() {
    let tok = tokenizer();
    let dir_tmp = tempfile::tempdir().unwrap();
    let dir = dir_tmp.path().join("stepwise-logratio");
    let policy_dir = dir.join("policy");

    // A policy that counts, trained on the solutions' own layout (slips included, as a policy
    // learns from imperfect data).
    let varmap = VarMap::new();
    let mut policy = lm(&tok, &varmap, 5);
    let mut lm_set = label_examples(&tok, &common::counting_solutions(600, 6, 0.3), &opts(false)).unwrap();
    for e in &mut lm_set {
        e.targets.clear();
    }
    let tc = |steps, lr, out: &PathBuf| TrainConfig {
        lr,
        warmup: 10,
        steps,
        batch_size: 32,
        eval_every: 0,
        out_dir: Some(out.clone()),
        ..Default::default()
    };
    train(
        &mut policy,
        &varmap,
        &lm_set,
        &[],
        Objective::Lm,
        &tc(150, 3e-3, &policy_dir),
        |_, _| {},
    )
    .unwrap();
    std::fs::copy(
        tokenizer_dir().join("tokenizer.json"),
        policy_dir.join("tokenizer.json"),
    )
    .unwrap();

    // The PRM: the policy itself, fine-tuned on step labels against a frozen copy of it, or
    // against a constant reference (its own likelihood).
    for lr in [LR, LIKELIHOOD, LIKELIHOOD_OF_RESULTS] {
        fine_tune_and_round_trip(&tok, &policy_dir, &dir.join("prm"), lr, &tc);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Fine-tune a PRM from the policy in `policy_dir` into `prm_dir`, check it flags held-out wrong
/// steps, and that its folder scores identically.
fn fine_tune_and_round_trip(
    tok: &Tokenizer,
    policy_dir: &std::path::Path,
    prm_dir: &PathBuf,
    lr: LogRatio,
    tc: &dyn Fn(usize, f64, &PathBuf) -> TrainConfig,
) {
    let _ = std::fs::remove_dir_all(prm_dir);
    let reference = Model::load(policy_dir, &Device::Cpu).unwrap();
    let varmap = VarMap::new();
    let mut prm = Model::load_trainable(policy_dir, reference.config.clone(), &varmap, &Device::Cpu, 0).unwrap();
    let mut train_set = label_examples(tok, &common::counting_solutions(600, 7, 0.6), &opts(false)).unwrap();
    let held_out = common::counting_solutions(150, 8, 0.6);
    let mut valid = label_examples(tok, &held_out, &opts(false)).unwrap();
    if lr.reference_logprob.is_none() {
        attach_reference(&reference, &mut train_set, 64).unwrap();
        attach_reference(&reference, &mut valid, 64).unwrap();
    }
    let objective = Objective::LogRatio(lr);
    let before = evaluate(&prm, &valid, objective, 64).unwrap();
    train(
        &mut prm,
        &varmap,
        &train_set,
        &[],
        objective,
        &tc(250, 1e-3, prm_dir),
        |_, _| {},
    )
    .unwrap();
    let after = evaluate(&prm, &valid, objective, 64).unwrap();
    println!(
        "reference {:?}: held-out step AUROC {:.3} → {:.3}, accuracy {:.3} → {:.3}",
        lr.reference_logprob, before.auroc, after.auroc, before.accuracy, after.accuracy
    );
    assert!(after.accuracy >= 0.95, "held-out step accuracy {:.3}", after.accuracy);

    // The folder names its reference; loading it back scores identically.
    let reference_dir = lr.reference_logprob.is_none().then(|| PathBuf::from("../policy"));
    RewardSpec::log_ratio(reference_dir, SEP, lr).save(prm_dir).unwrap();
    std::fs::copy(tokenizer_dir().join("tokenizer.json"), prm_dir.join("tokenizer.json")).unwrap();
    let spec = RewardSpec::load(prm_dir).unwrap().expect("reward.json");
    assert_eq!(spec.log_ratio, Some(lr));
    let loaded = Model::load(prm_dir, &Device::Cpu).unwrap();
    let loaded_ref = spec
        .reference_dir(prm_dir)
        .map(|d| Model::load(&d, &Device::Cpu).unwrap());
    assert_eq!(loaded_ref.is_some(), lr.reference_logprob.is_none());
    let a = PrmScorer::new(&prm, tok, layout(lr)).with_reference(Some(&reference));
    let b = PrmScorer::new(&loaded, tok, spec.layout()).with_reference(loaded_ref.as_ref());
    common::assert_same_scores(&a, &b, &held_out);
}

#[test]
fn a_folder_with_a_bad_reward_file_is_a_clear_error() {
    let dir_tmp = tempfile::tempdir().unwrap();
    let dir = dir_tmp.path().join("stepwise-reward");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("reward.json"),
        r#"{"kind": "magic", "reference": "x", "separator": "|", "beta": 1.0, "cumulative": false}"#,
    )
    .unwrap();
    let err = format!("{:#}", RewardSpec::load(&dir).unwrap_err());
    assert!(err.contains("reward.json") && err.contains("kind"), "{err}");
    for (body, field) in [
        (r#"{"kind": "log_likelihood_ratio"}"#, "reward.json"),
        (
            r#"{"kind": "log_likelihood_ratio", "separator": "|", "beta": 1.0, "cumulative": false}"#,
            "reference",
        ),
        (
            r#"{"kind": "log_likelihood_ratio", "reference": "x", "reference_logprob": -1.0, "separator": "|", "beta": 1.0, "cumulative": false}"#,
            "give one reference",
        ),
        (
            r#"{"kind": "log_likelihood_ratio", "reference_logprob": 2.0, "separator": "|", "beta": 1.0, "cumulative": false}"#,
            "reference_logprob",
        ),
        (r#"{"kind": "step_classifier", "separator": ""}"#, "separator"),
        (
            r#"{"kind": "step_classifier", "separator": "|", "reference": "x"}"#,
            "a step classifier has no reference",
        ),
    ] {
        std::fs::write(dir.join("reward.json"), body).unwrap();
        let err = format!("{:#}", RewardSpec::load(&dir).unwrap_err());
        assert!(err.contains("reward.json") && err.contains(field), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
