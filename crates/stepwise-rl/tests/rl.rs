//! RL on a tiny policy over a seven-word vocabulary: every weight gets a gradient from the loss,
//! a process reward (steps rewarded for alternating `a`, `b`) is earned more as training goes on,
//! and a run killed after a checkpoint resumes to the weights of an uninterrupted run; PRIME's
//! implicit PRM learns outcomes online, every one of its weights learning, and PRIME raises an
//! outcome reward.

use anyhow::Result;
use candle_core::Device;
use std::path::PathBuf;
use stepwise_core::seams::{OutcomeReward, Reward, RewardKind, Task};
use stepwise_core::testing::PlainTask;
use stepwise_core::{Problem, Solution};
use stepwise_model::train::VarMap;
use stepwise_model::{HeadKind, Model, ModelConfig, Prompt, Tokenizer};
use stepwise_rl::prime::OnlinePrm;
use stepwise_rl::rollout::{sequence_logprobs, Sequence};
use stepwise_rl::trainer::RlRun;
use stepwise_rl::{rl_loss, train_rl, Credit, ImplicitPrm, PrimeConfig, RlConfig};

const WORDS: [&str; 7] = ["<pad>", "<unk>", "<eos>", "|", "q", "a", "b"];

fn tokenizer() -> Tokenizer {
    let words: Vec<String> = WORDS.iter().map(|w| w.to_string()).collect();
    Tokenizer::word_level(&words, "<unk>", Some("<eos>")).unwrap()
}

fn fresh(seed: u64) -> (Model, VarMap) {
    let varmap = VarMap::new();
    let cfg = ModelConfig::tiny(WORDS.len(), 32, 1, 4, 2, HeadKind::CausalLm);
    let model = Model::fresh(cfg, &varmap, &Device::Cpu, seed).unwrap();
    (model, varmap)
}

/// Steps are rewarded for alternating `a`, `b`, `a`, …: step 0 for being `a`, step 1 for `b`.
struct StepWords;

impl Reward for StepWords {
    fn name(&self) -> &str {
        "step-words"
    }
    fn kind(&self) -> RewardKind {
        RewardKind::Process
    }
    fn rewards(&self, sols: &[Solution]) -> Result<Vec<Vec<f32>>> {
        Ok(sols
            .iter()
            .map(|s| {
                s.steps
                    .iter()
                    .enumerate()
                    .map(|(k, st)| f32::from(u8::from(st.text == ["a", "b"][k % 2])))
                    .collect()
            })
            .collect())
    }
}

fn problems() -> Vec<Problem> {
    vec![Problem {
        id: "p".into(),
        question: "q".into(),
        gold_answer: Some("a".into()),
        ..Default::default()
    }]
}

/// A solution is correct when its first step is the gold answer (`a`).
struct LastStepAnswers;

impl Task for LastStepAnswers {
    fn problems(&self) -> &[Problem] {
        &[]
    }
    fn answer(&self, steps: &[String]) -> Option<String> {
        steps.first().cloned()
    }
    fn grade(&self, answer: &str, gold: &str) -> bool {
        answer == gold
    }
}

fn prime_config(updates: usize) -> RlConfig {
    RlConfig {
        prime: Some(PrimeConfig {
            beta: 0.5,
            lr: 3e-3,
            accuracy_bounds: (0.0, 1.0),
            ..Default::default()
        }),
        ..config(updates)
    }
}

fn config(updates: usize) -> RlConfig {
    RlConfig {
        updates,
        prompts_per_update: 1,
        group_size: 16,
        epochs: 2,
        // Two micro-batches of 8 per optimiser step: the accumulation path runs in every test.
        minibatch_size: 8,
        grad_accum: 2,
        lr: 3e-3,
        max_new_tokens: 6,
        kl_coef: 0.01,
        seed: 3,
        checkpoint_every: 2,
        ..Default::default()
    }
}

fn run<'a>(
    policy: &'a mut Model,
    varmap: &'a VarMap,
    reference: &'a Model,
    tok: &'a Tokenizer,
    problems: &'a [Problem],
    task: &'a dyn Task,
    out: Option<PathBuf>,
) -> RlRun<'a> {
    RlRun {
        policy,
        varmap,
        reference,
        tokenizer: tok,
        prompt: Prompt::Pieces,
        separator: "|".into(),
        stop_token_ids: vec![2],
        problems,
        task,
        reward: &StepWords,
        watch: Vec::new(),
        out_dir: out,
        heldout: None,
        implicit_prm: None,
    }
}

#[test]
fn every_trainable_weight_receives_a_gradient_from_the_rl_loss() {
    let (mut model, varmap) = fresh(1);
    let (reference, _) = fresh(2);
    model.set_training(true);
    let ids: Vec<u32> = vec![4, 3, 5, 3, 6, 2];
    let refs = sequence_logprobs(&reference, &[ids.as_slice()], 1).unwrap().remove(0);
    let seq = Sequence {
        learn_from: 2,
        advantages: vec![0.0, 0.0, 1.0, 1.0, -0.5, -0.5],
        // An older policy than the current one: ratios differ from 1, some clipped.
        old_logprobs: refs.iter().map(|x| x - 0.1).collect(),
        ref_logprobs: refs,
        ids,
    };
    let (loss, stats) = rl_loss(&model, &[&seq], 0.2, 0.1).unwrap();
    assert_eq!(stats.tokens, 4);
    let grads = loss.backward().unwrap();
    for (name, var) in stepwise_model::train::optim::named_vars(&varmap) {
        let g = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("{name}: no gradient"));
        let norm = g.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(norm > 0.0, "{name}: zero gradient");
    }
}

#[test]
fn a_process_reward_moves_each_step_toward_what_it_rewards() {
    let tok = tokenizer();
    let (mut model, varmap) = fresh(7);
    let (reference, _) = fresh(7);
    let (problems, task) = (problems(), PlainTask::default());
    let cfg = RlConfig {
        credit: Credit::ReturnToGo,
        lr: 1e-3,
        kl_coef: 0.0,
        ..config(40)
    };
    let log = train_rl(
        run(&mut model, &varmap, &reference, &tok, &problems, &task, None),
        &cfg,
        |_| {},
    )
    .unwrap();
    assert_eq!(log.len(), 40);
    assert!(log.iter().all(|l| l.kl.is_finite() && l.loss.is_finite()));
    let rewards: Vec<f64> = log.iter().map(|l| l.reward).collect();
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64;
    // The samples earn more as training goes on; with the advantage's sign flipped they earn less.
    assert!(mean(&rewards[30..]) > mean(&rewards[..10]) + 0.05, "{rewards:?}");
}

#[test]
fn a_run_killed_after_a_checkpoint_resumes_to_the_same_weights() {
    assert_resumes("plain", &config(4), false);
}

#[test]
fn a_prime_run_killed_after_a_checkpoint_resumes_to_the_same_weights() {
    assert_resumes("prime", &prime_config(4), true);
}

/// Train 4 updates whole, and again killed in update 3 then resumed: the policy's weights (and
/// the implicit PRM's, with `prime`) and the logs are the same.
fn assert_resumes(name: &str, cfg: &RlConfig, prime: bool) {
    let tok = tokenizer();
    let (problems, task) = (problems(), LastStepAnswers);
    let outcome = OutcomeReward { task: &task };
    let (reference, _) = fresh(5);
    let root = std::env::temp_dir().join(format!("stepwise-rl-resume-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let weights = |dir: &PathBuf| {
        let mut w = vec![std::fs::read(dir.join("model.safetensors")).unwrap()];
        if prime {
            w.push(std::fs::read(OnlinePrm::dir(dir).join("model.safetensors")).unwrap());
        }
        w
    };
    // One run into `dir`, from fresh weights; `on_update` may kill it.
    let train = |dir: &PathBuf, on_update: &dyn Fn(usize)| {
        let (mut m, v) = fresh(5);
        let (mut prm, prm_vars) = fresh(5);
        let mut run = run(&mut m, &v, &reference, &tok, &problems, &task, Some(dir.clone()));
        if prime {
            run.reward = &outcome;
            run.implicit_prm = Some(ImplicitPrm {
                model: &mut prm,
                varmap: &prm_vars,
            });
        }
        train_rl(run, cfg, |l| on_update(l.update)).unwrap()
    };
    let whole = root.join("whole");
    let full_log = train(&whole, &|_| {});
    let cut = root.join("cut");
    let crashed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        train(&cut, &|update| assert!(update < 3, "killed during update 3"))
    }));
    assert!(crashed.is_err(), "the run was to die in update 3");
    let resumed = train(&cut, &|_| {});
    assert!(
        weights(&whole) == weights(&cut),
        "resumed weights differ from the uninterrupted run's"
    );
    let summary = |log: &[stepwise_rl::UpdateLog]| {
        log.iter()
            .map(|l| (l.reward, l.sampled_tokens, l.implicit_prm.map(|p| p.loss)))
            .collect::<Vec<_>>()
    };
    assert_eq!(summary(&full_log), summary(&resumed));
    assert_eq!(resumed.iter().all(|l| l.implicit_prm.is_some()), prime);
    std::fs::remove_dir_all(&root).unwrap();
}

/// `q | a | <eos>` (correct) and `q | b | <eos>` (wrong), as PRIME's samples.
fn labelled_samples(reference: &Model) -> (Vec<Sequence>, Vec<f32>) {
    let seqs: Vec<Sequence> = [[4u32, 3, 5, 3, 2], [4, 3, 6, 3, 2]]
        .iter()
        .map(|ids| Sequence {
            ids: ids.to_vec(),
            learn_from: 2,
            ref_logprobs: sequence_logprobs(reference, &[ids.as_slice()], 1).unwrap().remove(0),
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
    let mut online = OnlinePrm::new(
        ImplicitPrm {
            model: &mut prm,
            varmap: &varmap,
        },
        cfg,
    )
    .unwrap();
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
    let (mut model, varmap) = fresh(7);
    let (reference, _) = fresh(7);
    let (mut prm, prm_vars) = fresh(7);
    let (problems, task) = (problems(), LastStepAnswers);
    let outcome = OutcomeReward { task: &task };
    // PRIME's β; groups kept from 10% to 90% correct (this policy starts near 4%).
    let cfg = RlConfig {
        lr: 1e-3,
        kl_coef: 0.0,
        prime: Some(PrimeConfig {
            beta: 0.05,
            lr: 1e-3,
            accuracy_bounds: (0.1, 0.9),
            ..Default::default()
        }),
        ..config(40)
    };
    let log = train_rl(
        RlRun {
            reward: &outcome,
            implicit_prm: Some(ImplicitPrm {
                model: &mut prm,
                varmap: &prm_vars,
            }),
            ..run(&mut model, &varmap, &reference, &tok, &problems, &task, None)
        },
        &cfg,
        |_| {},
    )
    .unwrap();
    assert!(log.iter().all(|l| l.implicit_prm.is_some_and(|p| p.loss.is_finite())));
    let rewards: Vec<f64> = log.iter().map(|l| l.reward).collect();
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64;
    assert!(mean(&rewards[30..]) > mean(&rewards[..10]) + 0.05, "{rewards:?}");
}

#[test]
fn prime_refuses_a_process_reward_and_a_missing_implicit_prm() {
    let tok = tokenizer();
    let (mut model, varmap) = fresh(7);
    let (reference, _) = fresh(7);
    let (mut prm, prm_vars) = fresh(7);
    let (problems, task) = (problems(), LastStepAnswers);
    let cfg = prime_config(1);
    let process = RlRun {
        implicit_prm: Some(ImplicitPrm {
            model: &mut prm,
            varmap: &prm_vars,
        }),
        ..run(&mut model, &varmap, &reference, &tok, &problems, &task, None)
    };
    let err = train_rl(process, &cfg, |_| {}).unwrap_err().to_string();
    assert!(err.contains("outcome reward"), "{err}");
    let outcome = OutcomeReward { task: &task };
    let missing = RlRun {
        reward: &outcome,
        ..run(&mut model, &varmap, &reference, &tok, &problems, &task, None)
    };
    let err = train_rl(missing, &cfg, |_| {}).unwrap_err().to_string();
    assert!(err.contains("no implicit PRM"), "{err}");
}
