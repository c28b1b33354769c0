//! DPO on a tiny policy over a seven-word vocabulary: pairs are laid out as the policy reads
//! its prompts (a step's separator, or the end token where it ended its solution); the loss
//! starts at ln 2 (the policy is its reference) and falls, the chosen step's probability rises
//! and the rejected one's falls, on candle's autograd and on the packed trainer alike; a run
//! killed after a checkpoint resumes to an uninterrupted run's weights and log, and a resume on
//! other settings or other pairs is refused.

#[allow(dead_code)]
mod common;

use candle_core::Device;
use std::path::Path;
use std::sync::Arc;
use stepwise_core::preference::{PairPrompt, PreferencePair};
use stepwise_model::packed_engine::{PackedTrainer, Reference};
use stepwise_model::{Model, ModelConfig, Prompt, Tokenizer};
use stepwise_rl::dpo::{dpo_pair, tokenize_pair};
use stepwise_rl::learner::SampleWith;
use stepwise_rl::rollout::sequence_logprobs;
use stepwise_rl::{train_dpo, CandleLearner, DpoConfig, DpoLog, DpoRun, Frozen, Learner, PackedLearner, TokenPair};

const WORDS: [&str; 7] = ["<pad>", "<unk>", "<eos>", "|", "q", "a", "b"];
const EOS: u32 = 2;

fn tokenizer() -> Tokenizer {
    common::word_tokenizer(&WORDS)
}

fn pair(prefix: &[&str], chosen: &str, rejected: &str, ends: bool) -> PreferencePair {
    PreferencePair {
        id: format!("{prefix:?}"),
        prompt: PairPrompt::Steps {
            question: "q".into(),
            prefix: prefix.iter().map(|s| s.to_string()).collect(),
        },
        chosen: chosen.into(),
        rejected: rejected.into(),
        chosen_ends: ends,
        rejected_ends: false,
    }
}

/// After `q`, the right first step is `a`; after `q a`, `b`, which ends the solution.
fn token_pairs() -> Vec<TokenPair> {
    let tok = tokenizer();
    [pair(&[], "a", "b", false), pair(&["a"], "b", "a", true)]
        .iter()
        .map(|p| tokenize_pair(&tok, Prompt::Pieces, "|", EOS, p).unwrap())
        .collect()
}

#[test]
fn pairs_are_laid_out_as_the_policy_reads_them() {
    let p = token_pairs();
    // q | a |  against  q | b |
    assert_eq!(
        (p[0].chosen.clone(), p[0].rejected.clone(), p[0].from),
        (vec![4, 3, 5, 3], vec![4, 3, 6, 3], 2)
    );
    // q | a | b <eos>  against  q | a | a |
    assert_eq!(p[1].chosen, vec![4, 3, 5, 3, 6, EOS]);
    assert_eq!((p[1].rejected.clone(), p[1].from), (vec![4, 3, 5, 3, 5, 3], 4));
    // A text prompt is taken as it stands.
    let text = PreferencePair {
        prompt: PairPrompt::Text("q | a |".into()),
        ..pair(&[], "b", "a", false)
    };
    let t = tokenize_pair(&tokenizer(), Prompt::Pieces, "|", EOS, &text).unwrap();
    assert_eq!((t.chosen, t.from), (vec![4, 3, 5, 3, 6, 3], 4));
}

#[test]
fn the_pair_loss_and_its_derivatives() {
    let (beta, eps) = (0.5, 0.1);
    // The policy is its reference: ln 2, and the derivatives ∓β/2 (no smoothing).
    let (loss, dc, dr, (rc, rr)) = dpo_pair((-3.0, -4.0), (-3.0, -4.0), beta, 0.0);
    assert!((loss - 2f64.ln()).abs() < 1e-12 && (dc + beta / 2.0).abs() < 1e-12 && (dr - beta / 2.0).abs() < 1e-12);
    assert_eq!((rc, rr), (0.0, 0.0));
    // Derivatives against central differences, with label smoothing, far from 0 too.
    for (c, r) in [(-1.0, -5.0), (-6.0, -0.5), (-30.0, 40.0)] {
        let f = |c: f64, r: f64| dpo_pair((c, r), (-2.0, -3.0), beta, eps).0;
        let (_, dc, dr, _) = dpo_pair((c, r), (-2.0, -3.0), beta, eps);
        let h = 1e-5;
        assert!((dc - (f(c + h, r) - f(c - h, r)) / (2.0 * h)).abs() < 1e-6, "{c} {r}");
        assert!((dr - (f(c, r + h) - f(c, r - h)) / (2.0 * h)).abs() < 1e-6, "{c} {r}");
        assert!(f(c, r).is_finite());
    }
}

fn config() -> DpoConfig {
    DpoConfig {
        beta: 0.5,
        epochs: 8,
        batch_size: 2,
        minibatch_size: 1,
        lr: 2e-2,
        warmup_ratio: 0.0,
        checkpoint_every: 2,
        ..Default::default()
    }
}

/// Each pair's (chosen, rejected) summed completion log-probability under `model`.
fn completion_logps(model: &Model, pairs: &[TokenPair]) -> Vec<(f64, f64)> {
    let sum = |ids: &[u32], from: usize| -> f64 {
        sequence_logprobs(model, &[ids], 1, 4096).unwrap()[0][from..]
            .iter()
            .map(|&x| x as f64)
            .sum()
    };
    pairs
        .iter()
        .map(|p| (sum(&p.chosen, p.from), sum(&p.rejected, p.from)))
        .collect()
}

/// `log` starts at ln 2 (within `tol`: the policy is its reference, up to its kernels' rounding)
/// and ends low, every chosen completion more likely and every rejected one less.
fn assert_learned(log: &[DpoLog], tol: f64, before: &[(f64, f64)], after: &[(f64, f64)]) {
    assert!(
        (log[0].train.loss - 2f64.ln()).abs() < tol,
        "first loss {}",
        log[0].train.loss
    );
    let last = log.last().unwrap();
    assert!(
        last.train.loss < 0.3,
        "loss {} after {} steps",
        last.train.loss,
        log.len()
    );
    assert_eq!(last.train.accuracy, 1.0);
    assert!(
        last.train.chosen_reward > 0.0 && last.train.rejected_reward < 0.0,
        "{:?}",
        last.train
    );
    for ((b, a), k) in before.iter().zip(after).zip(0..) {
        assert!(
            a.0 > b.0 && a.1 < b.1,
            "pair {k}: chosen {} -> {}, rejected {} -> {}",
            b.0,
            a.0,
            b.1,
            a.1
        );
    }
}

#[test]
fn dpo_raises_the_chosen_step_on_candle_and_on_the_packed_trainer() {
    let pairs = token_pairs();
    let (reference, _) = common::tiny_policy(WORDS.len(), 3);
    let before = completion_logps(&reference, &pairs);
    let (mut model, _varmap) = common::tiny_policy(WORDS.len(), 3);
    let log = {
        let mut learner = CandleLearner::new(&mut model).unwrap();
        let run = DpoRun {
            learner: &mut learner,
            reference: Frozen::Shared(&reference),
            pairs: &pairs,
            eval: &pairs,
            out_dir: None,
        };
        train_dpo(run, &config(), |_| {}).unwrap()
    };
    assert_eq!(log.len(), 8, "one step an epoch of two pairs");
    assert_learned(&log, 1e-5, &before, &completion_logps(&model, &pairs));
    let eval = log.last().unwrap().eval.expect("held-out pairs at each epoch's end");
    assert!(eval.loss < log[0].train.loss);

    // The packed trainer (reference backend: the GPU's specification) from the same weights.
    let start = tempfile::tempdir().unwrap();
    let (start_model, varmap) = common::tiny_policy(WORDS.len(), 3);
    stepwise_model::checkpoint::save_checkpoint(start.path(), &start_model.config, &varmap).unwrap();
    let trainer = PackedTrainer::load(
        start.path(),
        ModelConfig::from_dir(start.path()).unwrap(),
        Arc::new(Reference),
    )
    .unwrap();
    let no_sampling: SampleWith<Reference> = Box::new(|_| anyhow::bail!("DPO does not sample"));
    let mut packed = PackedLearner::new(trainer, 4096, no_sampling);
    let run = DpoRun {
        learner: &mut packed,
        reference: Frozen::Shared(&reference),
        pairs: &pairs,
        eval: &[],
        out_dir: None,
    };
    let packed_log = train_dpo(run, &config(), |_| {}).unwrap();
    let out = tempfile::tempdir().unwrap();
    packed.save(out.path()).unwrap();
    let trained = Model::load(out.path(), &Device::Cpu).unwrap();
    // bf16 products against the f32 reference: a first Δ of about 1e-3.
    assert_learned(&packed_log, 2e-3, &before, &completion_logps(&trained, &pairs));
}

/// One run into `dir` with `cfg` on `pairs`; `on_step` sees each step.
fn run_into(dir: &Path, cfg: &DpoConfig, pairs: &[TokenPair], on_step: &dyn Fn(usize)) -> anyhow::Result<Vec<DpoLog>> {
    let (reference, _) = common::tiny_policy(WORDS.len(), 5);
    let (mut model, _varmap) = common::tiny_policy(WORDS.len(), 5);
    let mut learner = CandleLearner::new(&mut model)?;
    let run = DpoRun {
        learner: &mut learner,
        reference: Frozen::Shared(&reference),
        pairs,
        eval: &[],
        out_dir: Some(dir.to_path_buf()),
    };
    train_dpo(run, cfg, |l| on_step(l.step))
}

#[test]
fn a_killed_run_resumes_to_the_uninterrupted_runs_weights() {
    let root = tempfile::tempdir().unwrap();
    let pairs = token_pairs();
    let cfg = DpoConfig { epochs: 3, ..config() };
    let whole = root.path().join("whole");
    let full = run_into(&whole, &cfg, &pairs, &|_| {}).unwrap();
    let cut = root.path().join("cut");
    let crashed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_into(&cut, &cfg, &pairs, &|step| assert!(step < 3, "killed in step 3"))
    }));
    assert!(crashed.is_err(), "the run was to die in step 3");
    let resumed = run_into(&cut, &cfg, &pairs, &|step| assert!(step > 2, "step {step} done again")).unwrap();
    let weights = |d: &Path| std::fs::read(d.join("model.safetensors")).unwrap();
    assert!(weights(&whole) == weights(&cut), "resumed weights differ");
    let losses = |l: &[DpoLog]| l.iter().map(|x| (x.step, x.train.loss, x.tokens)).collect::<Vec<_>>();
    assert_eq!(losses(&full), losses(&resumed));
    // The folder belongs to its settings and its pairs.
    let other = DpoConfig {
        beta: 0.2,
        ..cfg.clone()
    };
    let e = run_into(&cut, &other, &pairs, &|_| {}).unwrap_err().to_string();
    assert!(e.contains("other DPO settings"), "{e}");
    let e = run_into(&cut, &cfg, &pairs[..1], &|_| {}).unwrap_err().to_string();
    assert!(e.contains("other pairs"), "{e}");
}

/// With LoRA the reference is the learner's own frozen base (its adapters off for the pass):
/// the run logs what the same run beside a second copy of the starting policy logs, step by
/// step, and a learner training every weight is refused it.
#[test]
fn a_lora_run_takes_its_reference_from_its_frozen_base() {
    let pairs = token_pairs();
    let start = tempfile::tempdir().unwrap();
    let (start_model, varmap) = common::tiny_policy(WORDS.len(), 3);
    stepwise_model::checkpoint::save_checkpoint(start.path(), &start_model.config, &varmap).unwrap();
    let second_copy = Model::load_packed(start.path(), stepwise_model::Placement::Cpu).unwrap();
    let cfg = DpoConfig {
        lora: Some(stepwise_model::packed_engine::LoraConfig::new(4)),
        ..config()
    };
    let learner = || {
        stepwise_rl::learner::packed_learner(start.path(), stepwise_model::Placement::Cpu, 4096, cfg.lora.clone())
            .unwrap()
    };
    let mut logs = Vec::new();
    for reference in [Frozen::Shared(&second_copy), Frozen::Base] {
        let mut learner = learner();
        let run = DpoRun {
            learner: &mut *learner,
            reference,
            pairs: &pairs,
            eval: &pairs,
            out_dir: None,
        };
        logs.push(train_dpo(run, &cfg, |_| {}).unwrap());
    }
    let losses = |log: &[DpoLog]| -> Vec<(f64, f64)> { log.iter().map(|l| (l.train.loss, l.train.margin)).collect() };
    assert_eq!(losses(&logs[0]), losses(&logs[1]));
    assert!(logs[1].last().unwrap().train.loss < logs[1][0].train.loss);

    let mut full =
        stepwise_rl::learner::packed_learner(start.path(), stepwise_model::Placement::Cpu, 4096, None).unwrap();
    let run = DpoRun {
        learner: &mut *full,
        reference: Frozen::Base,
        pairs: &pairs,
        eval: &[],
        out_dir: None,
    };
    let err = train_dpo(run, &config(), |_| {}).unwrap_err().to_string();
    assert!(err.contains("no frozen base"), "{err}");
}
