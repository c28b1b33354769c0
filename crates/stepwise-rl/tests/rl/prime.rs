//! PRIME (Cui et al. 2025): its implicit PRM learns outcomes online, every one of its weights
//! learning, PRIME raises an outcome reward on both trainers and resumes, and what it refuses.

use super::*;

#[test]
fn a_prime_run_killed_after_a_checkpoint_resumes_to_the_same_weights() {
    assert_resumes("prime", &prime_config(4), true);
}

/// `q | a | <eos>` (correct) and `q | b | <eos>` (wrong), as PRIME's samples.
fn labelled_samples(reference: &Model) -> (Vec<Sequence>, Vec<f32>) {
    let seqs: Vec<Sequence> = [[4u32, 3, 5, 3, 2], [4, 3, 6, 3, 2]]
        .iter()
        .map(|ids| Sequence {
            ids: ids.to_vec(),
            learn_from: 2,
            ref_logprobs: sequence_logprobs(
                reference,
                &[ids.as_slice()],
                1,
                stepwise_model::DEFAULT_MAX_BATCH_TOKENS,
            )
            .unwrap()
            .remove(0),
            ..Default::default()
        })
        .collect();
    (seqs, vec![1.0, 0.0])
}

#[test]
fn every_weight_of_the_implicit_prm_learns_from_outcomes() {
    let (reference, _) = fresh(2);
    let (mut prm, varmap) = fresh(2);
    let before: Vec<(String, Vec<f32>)> = stepwise_model::train::optim::named_vars(&varmap)
        .into_iter()
        .map(|(n, v)| (n, v.as_tensor().flatten_all().unwrap().to_vec1().unwrap()))
        .collect();
    let (seqs, outcomes) = labelled_samples(&reference);
    let cfg = PrimeConfig {
        beta: 0.5,
        lr: 1e-2,
        ..Default::default()
    };
    let one_group = std::iter::once(0..seqs.len()).collect::<Vec<_>>();
    let mut online = OnlinePrm::new(ImplicitPrm::Candle(&mut prm), cfg).unwrap();
    // Started from the reference: every token's implicit reward is 0, and half the outcomes
    // (the sum 0 is not above 0) are right.
    let (rewards, first) = online.score_and_learn(&seqs, &outcomes, &one_group, 1, 1.0).unwrap();
    assert!(rewards.iter().flatten().all(|r| r.abs() < 1e-6), "{rewards:?}");
    assert!((first.loss - std::f64::consts::LN_2).abs() < 1e-4, "{first:?}");
    for (name, var) in stepwise_model::train::optim::named_vars(&varmap) {
        let now: Vec<f32> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        let was = &before.iter().find(|(n, _)| *n == name).unwrap().1;
        assert!(now != *was, "{name}: no gradient from the implicit PRM's loss");
    }
    let mut last = first;
    for _ in 0..30 {
        last = online.score_and_learn(&seqs, &outcomes, &one_group, 2, 1.0).unwrap().1;
    }
    assert!(last.loss < 0.2 && last.accuracy == 1.0, "{last:?}");
    let (rewards, _) = online.score_and_learn(&seqs, &outcomes, &one_group, 2, 1.0).unwrap();
    // The correct completion's tokens are rewarded above the wrong one's, on the token where
    // they differ.
    assert!(rewards[0][2] > 0.0 && rewards[1][2] < 0.0, "{rewards:?}");
    assert_eq!(&rewards[0][..2], &[0.0, 0.0], "the prompt gets no reward");
}

#[test]
fn prime_raises_the_outcome_reward() {
    let tok = tokenizer();
    let (mut model, _) = fresh(7);
    let (reference, _) = fresh(7);
    let (mut prm, _) = fresh(7);
    let (problems, task) = (problems(), LastStepAnswers);
    let outcome = OutcomeReward { task: &task };
    let cfg = rising_prime_config();
    let mut learner = CandleLearner::new(&mut model).unwrap();
    let log = train_rl(
        RlRun {
            reward: &outcome,
            implicit_prm: Some(ImplicitPrm::Candle(&mut prm)),
            ..run(&mut learner, &reference, &tok, &problems, &task, None)
        },
        &cfg,
        |_| {},
    )
    .unwrap();
    assert!(log.iter().all(|l| l.implicit_prm.is_some_and(|p| p.loss.is_finite())));
    assert_rewards_rise(&log);
}

/// PRIME with the policy and its implicit PRM both on the packed engine's trainer (reference
/// backend): the implicit PRM learns outcomes from its tokens' log-probabilities through the
/// host's BCE, and the outcome reward rises as on the CPU; a run killed after a checkpoint
/// resumes both to the same weights.
#[test]
fn prime_on_the_packed_trainer_raises_the_outcome_reward_and_resumes() {
    let tok = tokenizer();
    let (reference, _) = fresh(7);
    let start_tmp = policy_folder(7, "prime");
    let start = start_tmp.path();
    let (problems, task) = (problems(), LastStepAnswers);
    let outcome = OutcomeReward { task: &task };
    let cfg = rising_prime_config();
    let train = |dir: Option<PathBuf>, cfg: &RlConfig, on_update: &dyn Fn(usize)| {
        let scratch = dir.clone().unwrap_or_else(|| start.to_path_buf());
        let mut learner = packed_learner(start, &scratch.join("sampler"));
        let mut prm = packed_learner(start, &scratch.join("prm-sampler"));
        let run = RlRun {
            reward: &outcome,
            implicit_prm: Some(ImplicitPrm::Learner(&mut prm)),
            ..run(&mut learner, &reference, &tok, &problems, &task, dir)
        };
        train_rl(run, cfg, |l| on_update(l.update)).unwrap()
    };
    let log = train(None, &cfg, &|_| {});
    assert!(log.iter().all(|l| l.implicit_prm.is_some_and(|p| p.loss.is_finite())));
    assert_rewards_rise(&log);
    let short = prime_config(4);
    assert_killed_run_resumes("packed-prime", true, &|dir, on_update| {
        train(Some(dir.clone()), &short, on_update)
    });
}

#[test]
fn prime_refuses_a_process_reward_and_a_missing_implicit_prm() {
    let tok = tokenizer();
    let (mut model, _) = fresh(7);
    let (reference, _) = fresh(7);
    let (mut prm, _) = fresh(7);
    let (problems, task) = (problems(), LastStepAnswers);
    let cfg = prime_config(1);
    let mut learner = CandleLearner::new(&mut model).unwrap();
    let process = RlRun {
        implicit_prm: Some(ImplicitPrm::Candle(&mut prm)),
        ..run(&mut learner, &reference, &tok, &problems, &task, None)
    };
    let err = train_rl(process, &cfg, |_| {}).unwrap_err().to_string();
    assert!(err.contains("outcome reward"), "{err}");
    let outcome = OutcomeReward { task: &task };
    let missing = RlRun {
        reward: &outcome,
        ..run(&mut learner, &reference, &tok, &problems, &task, None)
    };
    let err = train_rl(missing, &cfg, |_| {}).unwrap_err().to_string();
    assert!(err.contains("no implicit PRM"), "{err}");
}
