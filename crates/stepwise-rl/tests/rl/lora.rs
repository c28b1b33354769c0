//! RL with LoRA's adapters: the KL penalty's reference read from the learner's own frozen base
//! (the adapters switched off for the pass, as TRL with PEFT does) instead of a second copy of
//! the starting policy.

use super::*;
use stepwise_model::packed_engine::LoraConfig;
use stepwise_model::Placement;
use stepwise_rl::Reference as Frozen;

fn lora_learner(start: &std::path::Path, lora: Option<LoraConfig>) -> Box<dyn Learner> {
    stepwise_rl::learner::packed_learner(start, Placement::Cpu, 4096, lora).unwrap()
}

/// A run whose reference is the learner's frozen base logs what the same run with the starting
/// policy loaded a second time logs (the same KL, loss and rewards, update by update), and the
/// base it reads is the starting policy still after the adapters have moved the policy away.
#[test]
fn a_lora_run_reads_its_reference_from_its_frozen_base() {
    let tok = tokenizer();
    let start_tmp = policy_folder(7, "lora-reference");
    let start = start_tmp.path();
    let second_copy = Model::load_packed(start, Placement::Cpu).unwrap();
    let (problems, task) = (problems(), PlainTask::default());
    let mut cfg = config(3);
    cfg.lora = Some(LoraConfig::new(4));
    let mut logs = Vec::new();
    let mut learners = Vec::new();
    for reference in [Frozen::Model(&second_copy), Frozen::Base] {
        let mut learner = lora_learner(start, cfg.lora.clone());
        assert!(learner.has_base());
        let mut r = run(&mut *learner, &second_copy, &tok, &problems, &task, None);
        r.reference = reference;
        logs.push(train_rl(r, &cfg, |_| {}).unwrap());
        learners.push(learner);
    }
    let summary = |log: &[stepwise_rl::UpdateLog]| -> Vec<(Option<f64>, f64, f64)> {
        log.iter().map(|l| (l.kl, l.loss, l.reward)).collect()
    };
    assert_eq!(summary(&logs[0]), summary(&logs[1]));
    assert!(logs[1].iter().all(|l| l.kl.is_some_and(f64::is_finite)));
    assert!(
        logs[1].last().unwrap().kl.unwrap() > 0.0,
        "the policy moved from its reference"
    );

    let ids: &[u32] = &[4, 3, 5, 3, 6, 2];
    let base = learners[1].base_logprobs(&[ids]).unwrap();
    let copy = sequence_logprobs(&second_copy, &[ids], 1, 4096).unwrap();
    assert_eq!(base, copy, "the frozen base is the starting policy");
    let now = learners[1].logprobs(&[ids], 1).unwrap();
    assert_ne!(now, base, "the adapters are on again after the reference's pass");
    assert_eq!(learners[1].logprobs(&[ids], 1).unwrap(), now);
}

/// A learner that trains every weight has no base to read: a run told to read it is refused
/// before it samples, and the job loads a second copy for it instead.
#[test]
fn a_full_learner_has_no_frozen_base() {
    let tok = tokenizer();
    let start_tmp = policy_folder(7, "full-reference");
    let start = start_tmp.path();
    let (reference, _) = fresh(7);
    let (problems, task) = (problems(), PlainTask::default());
    let mut learner = lora_learner(start, None);
    assert!(!learner.has_base());
    let err = learner.base_logprobs(&[&[4, 3]]).unwrap_err().to_string();
    assert!(err.contains("no frozen base"), "{err}");
    let mut r = run(&mut *learner, &reference, &tok, &problems, &task, None);
    r.reference = Frozen::Base;
    let err = train_rl(r, &config(1), |_| {}).unwrap_err().to_string();
    assert!(err.contains("trains every weight"), "{err}");
}
