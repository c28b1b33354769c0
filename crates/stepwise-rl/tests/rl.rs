//! RL on a tiny policy over a seven-word vocabulary: every weight gets a gradient from the loss,
//! a process reward (steps rewarded for alternating `a`, `b`) is earned more as training goes on,
//! and a run killed after a checkpoint resumes to the weights of an uninterrupted run.

use anyhow::Result;
use candle_core::Device;
use std::path::PathBuf;
use stepwise_core::seams::{Reward, RewardKind};
use stepwise_core::testing::PlainTask;
use stepwise_core::{Problem, Solution};
use stepwise_model::train::VarMap;
use stepwise_model::{HeadKind, Model, ModelConfig, Prompt, Tokenizer};
use stepwise_rl::rollout::{sequence_logprobs, Sequence};
use stepwise_rl::trainer::RlRun;
use stepwise_rl::{rl_loss, train_rl, Credit, RlConfig};

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
    task: &'a PlainTask,
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
    let tok = tokenizer();
    let (problems, task) = (problems(), PlainTask::default());
    let (reference, _) = fresh(5);
    let root = std::env::temp_dir().join(format!("stepwise-rl-resume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let cfg = config(4);
    let weights = |dir: &PathBuf| std::fs::read(dir.join("model.safetensors")).unwrap();

    let whole = root.join("whole");
    let (mut m, v) = fresh(5);
    let full_log = train_rl(
        run(&mut m, &v, &reference, &tok, &problems, &task, Some(whole.clone())),
        &cfg,
        |_| {},
    )
    .unwrap();

    let cut = root.join("cut");
    let (mut m, v) = fresh(5);
    let crashed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        train_rl(
            run(&mut m, &v, &reference, &tok, &problems, &task, Some(cut.clone())),
            &cfg,
            |l| {
                assert!(l.update < 3, "killed during update 3");
            },
        )
    }));
    assert!(crashed.is_err(), "the run was to die in update 3");
    let (mut m, v) = fresh(5);
    let resumed = train_rl(
        run(&mut m, &v, &reference, &tok, &problems, &task, Some(cut.clone())),
        &cfg,
        |_| {},
    )
    .unwrap();
    assert_eq!(
        weights(&whole),
        weights(&cut),
        "resumed weights differ from the uninterrupted run's"
    );
    assert_eq!(
        full_log
            .iter()
            .map(|l| (l.reward, l.sampled_tokens))
            .collect::<Vec<_>>(),
        resumed.iter().map(|l| (l.reward, l.sampled_tokens)).collect::<Vec<_>>()
    );
    std::fs::remove_dir_all(&root).unwrap();
}
