//! RL on a tiny policy over a seven-word vocabulary: every weight gets a gradient from the loss,
//! a process reward (steps rewarded for alternating `a`, `b`) is earned more as training goes on,
//! and a run killed after a checkpoint resumes to the weights of an uninterrupted run; PRIME's
//! implicit PRM learns outcomes online, every one of its weights learning, and PRIME raises an
//! outcome reward (`prime.rs`).

#[path = "../common/mod.rs"]
mod common;
mod lora;
mod prime;

use anyhow::Result;
use candle_core::Device;
use common::assert_killed_run_resumes;
use std::path::PathBuf;
use std::sync::Arc;
use stepwise_core::seams::{OutcomeReward, Reward, RewardKind, Task};
use stepwise_core::testing::PlainTask;
use stepwise_core::{Problem, Solution};
use stepwise_model::packed_engine::{PackedTrainer, Reference};
use stepwise_model::train::VarMap;
use stepwise_model::{Model, ModelConfig, Prompt, Tokenizer};
use stepwise_rl::learner::SampleWith;
use stepwise_rl::prime::OnlinePrm;
use stepwise_rl::rollout::{sequence_logprobs, Sequence};
use stepwise_rl::trainer::RlRun;
use stepwise_rl::{
    policy_loss, train_rl, CandleLearner, Credit, ImplicitPrm, Learner, PackedLearner, PrimeConfig, RlConfig,
};

const WORDS: [&str; 7] = ["<pad>", "<unk>", "<eos>", "|", "q", "a", "b"];

fn tokenizer() -> Tokenizer {
    common::word_tokenizer(&WORDS)
}

fn fresh(seed: u64) -> (Model, VarMap) {
    common::tiny_policy(WORDS.len(), seed)
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

/// Settings under which the process reward rises in 40 updates.
fn process_reward_config() -> RlConfig {
    RlConfig {
        credit: Credit::ReturnToGo,
        lr: 1e-3,
        kl_coef: 0.0,
        ..config(40)
    }
}

/// PRIME's settings under which the outcome reward rises in 40 updates: its β, groups kept
/// from 10% to 90% correct (the policy starts near 4%).
fn rising_prime_config() -> RlConfig {
    RlConfig {
        lr: 1e-3,
        kl_coef: 0.0,
        prime: Some(PrimeConfig {
            beta: 0.05,
            lr: 1e-3,
            accuracy_bounds: (0.1, 0.9),
            ..Default::default()
        }),
        ..config(40)
    }
}

/// The last 10 updates' mean reward beats the first 10's by 0.05.
fn assert_rewards_rise(log: &[stepwise_rl::UpdateLog]) {
    let rewards: Vec<f64> = log.iter().map(|l| l.reward).collect();
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64;
    assert!(mean(&rewards[30..]) > mean(&rewards[..10]) + 0.05, "{rewards:?}");
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
    learner: &'a mut dyn Learner,
    reference: &'a Model,
    tok: &'a Tokenizer,
    problems: &'a [Problem],
    task: &'a dyn Task,
    out: Option<PathBuf>,
) -> RlRun<'a> {
    RlRun {
        learner,
        reference: stepwise_rl::Reference::Model(reference),
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
    let (mut model, _) = fresh(1);
    let (reference, _) = fresh(2);
    let ids: Vec<u32> = vec![4, 3, 5, 3, 6, 2];
    let refs = sequence_logprobs(
        &reference,
        &[ids.as_slice()],
        1,
        stepwise_model::DEFAULT_MAX_BATCH_TOKENS,
    )
    .unwrap()
    .remove(0);
    let seq = Sequence {
        learn_from: 2,
        skip: Vec::new(),
        advantages: vec![0.0, 0.0, 1.0, 1.0, -0.5, -0.5],
        // An older policy than the current one: ratios differ from 1, some clipped.
        old_logprobs: refs.iter().map(|x| x - 0.1).collect(),
        ref_logprobs: refs,
        ids,
    };
    let mut learner = CandleLearner::new(&mut model).unwrap();
    let (_, stats) = learner.backward(&[&seq], 0.2, 0.1).unwrap();
    assert_eq!(stats.tokens, 4);
    let names = learner.weight_names();
    assert!(names.len() > 10, "{names:?}");
    assert_eq!(learner.weights_without_gradient().unwrap(), Vec::<String>::new());
}

#[test]
fn a_process_reward_moves_each_step_toward_what_it_rewards() {
    let tok = tokenizer();
    let (mut model, _) = fresh(7);
    let (reference, _) = fresh(7);
    let (problems, task) = (problems(), PlainTask::default());
    let cfg = process_reward_config();
    let mut learner = CandleLearner::new(&mut model).unwrap();
    let log = train_rl(
        run(&mut learner, &reference, &tok, &problems, &task, None),
        &cfg,
        |_| {},
    )
    .unwrap();
    assert_eq!(log.len(), 40);
    assert!(log
        .iter()
        .all(|l| l.kl.is_some_and(f64::is_finite) && l.loss.is_finite()));
    // Each update's time is split into its phases, which fit in it.
    assert!(log.iter().all(|l| l.logprob_seconds > 0.0
        && l.learn_seconds > 0.0
        && l.sampling_seconds + l.logprob_seconds + l.learn_seconds <= l.seconds));
    // The samples earn more as training goes on; with the advantage's sign flipped they earn less.
    assert_rewards_rise(&log);
}

/// Without a KL penalty (and without PRIME) a run needs no reference: one given none skips the
/// reference's pass and logs no KL, and learns exactly what a run measuring the KL learns; with a
/// penalty, a run given none is refused.
#[test]
fn a_run_without_a_kl_penalty_learns_the_same_without_its_reference() {
    let tok = tokenizer();
    let (reference, _) = fresh(7);
    let (problems, task) = (problems(), PlainTask::default());
    let cfg = RlConfig {
        updates: 6,
        ..process_reward_config()
    };
    assert!(!cfg.needs_reference() && config(6).needs_reference() && rising_prime_config().needs_reference());
    let train = |given: stepwise_rl::Reference<'_>, cfg: &RlConfig| {
        let (mut model, _) = fresh(7);
        let mut learner = CandleLearner::new(&mut model).unwrap();
        let mut r = run(&mut learner, &reference, &tok, &problems, &task, None);
        r.reference = given;
        let log = train_rl(r, cfg, |_| {})?;
        drop(learner);
        let ids: &[u32] = &[4, 3, 5, 3, 6, 2];
        anyhow::Ok((
            log,
            sequence_logprobs(&model, &[ids], 1, stepwise_model::DEFAULT_MAX_BATCH_TOKENS)?,
        ))
    };
    let (measured, weights) = train(stepwise_rl::Reference::Model(&reference), &cfg).unwrap();
    let (blind, blind_weights) = train(stepwise_rl::Reference::None, &cfg).unwrap();
    assert!(measured.iter().all(|l| l.kl.is_some()) && blind.iter().all(|l| l.kl.is_none()));
    let losses = |log: &[stepwise_rl::UpdateLog]| log.iter().map(|l| (l.loss, l.reward)).collect::<Vec<_>>();
    assert_eq!(losses(&measured), losses(&blind));
    assert_eq!(
        weights, blind_weights,
        "the same weights with and without the reference's pass"
    );
    let refused = train(stepwise_rl::Reference::None, &config(6)).unwrap_err().to_string();
    assert!(refused.contains("need the reference policy"), "{refused}");
}

#[test]
fn a_run_killed_after_a_checkpoint_resumes_to_the_same_weights() {
    assert_resumes("plain", &config(4), false);
}

/// On the packed trainer, on the reference backend (sampled by the CPU engine) and on the CPU
/// backend (sampling from its own weights, as `rl --trainer packed` on a CPU).
#[test]
fn a_packed_run_killed_after_a_checkpoint_resumes_to_the_same_weights() {
    let tok = tokenizer();
    let (problems, task) = (problems(), LastStepAnswers);
    let (reference, _) = fresh(5);
    let start_tmp = policy_folder(5, "resume");
    let start = start_tmp.path();
    for backend in ["packed", "packed-cpu"] {
        let train = |dir: &PathBuf, on_update: &dyn Fn(usize)| {
            let mut learner: Box<dyn Learner> = match backend {
                "packed" => Box::new(packed_learner(start, &dir.join("sampler"))),
                _ => stepwise_rl::learner::packed_learner(start, stepwise_model::Placement::Cpu, 4096, None).unwrap(),
            };
            train_rl(
                run(&mut *learner, &reference, &tok, &problems, &task, Some(dir.clone())),
                &config(4),
                |l| on_update(l.update),
            )
            .unwrap()
        };
        assert_killed_run_resumes(backend, false, &train);
    }
}

/// A run checkpointed by the CPU's trainer continues on the packed trainer (the GPU's): the
/// same checkpoint and optimiser layout, read by either.
#[test]
fn a_run_checkpointed_on_the_cpu_continues_on_the_packed_trainer() {
    let tok = tokenizer();
    let (problems, task) = (problems(), LastStepAnswers);
    let (reference, _) = fresh(5);
    let start_tmp = policy_folder(5, "switch");
    let start = start_tmp.path();
    let dir = start.join("run");
    let cfg = config(4);
    let cut = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let (mut m, _) = fresh(5);
        let mut learner = CandleLearner::new(&mut m).unwrap();
        let run = run(&mut learner, &reference, &tok, &problems, &task, Some(dir.clone()));
        train_rl(run, &cfg, |l| assert!(l.update < 3, "killed during update 3")).unwrap()
    }));
    assert!(cut.is_err(), "the CPU run was to die in update 3");
    // The packed trainer reads the CPU's checkpoint exactly (its f32 weights, not the start's).
    let mut learner = packed_learner(start, &start.join("sampler"));
    learner.load(&dir).unwrap();
    let saved = candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap();
    let initial = candle_core::safetensors::load(start.join("model.safetensors"), &Device::Cpu).unwrap();
    let mut moved = false;
    for (name, values) in learner.trainer().weights().unwrap() {
        let want: Vec<f32> = saved[&name].flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(values, want, "{name}");
        moved |= values != initial[&name].flatten_all().unwrap().to_vec1::<f32>().unwrap();
    }
    assert!(moved, "two updates moved no weight");
    let log = train_rl(
        run(&mut learner, &reference, &tok, &problems, &task, Some(dir)),
        &cfg,
        |_| {},
    )
    .unwrap();
    assert_eq!(log.len(), 4);
    assert!(log
        .iter()
        .all(|l| l.loss.is_finite() && l.kl.is_some_and(f64::is_finite)));
}

/// The policy `fresh(seed)` in a folder of its own (what the packed trainer loads; dropped: removed).
fn policy_folder(seed: u64, name: &str) -> tempfile::TempDir {
    let dir = tempfile::TempDir::with_prefix(format!("stepwise-rl-policy-{name}-")).unwrap();
    let (model, varmap) = fresh(seed);
    stepwise_model::checkpoint::save_checkpoint(dir.path(), &model.config, &varmap).unwrap();
    dir
}

/// The policy in `start` on the packed engine's trainer (reference backend: the GPU's
/// specification), sampled by the CPU engine from its weights written to `scratch`.
fn packed_learner(start: &std::path::Path, scratch: &std::path::Path) -> PackedLearner<Reference> {
    let trainer = PackedTrainer::load(start, ModelConfig::from_dir(start).unwrap(), Arc::new(Reference)).unwrap();
    let scratch = scratch.to_path_buf();
    let sample_with: SampleWith<Reference> = Box::new(move |t| {
        stepwise_model::checkpoint::save_checkpoint(&scratch, &t.decoder.config, &t.varmap()?)?;
        Model::load(&scratch, &Device::Cpu)
    });
    PackedLearner::new(trainer, 4096, sample_with)
}

/// The packed trainer's update (its loss's derivative by each token's log-probability taken on
/// the host, the backward on the engine's kernels) raises a process reward as candle's does: on
/// the reference backend sampled by the CPU engine, and on the CPU backend sampling from its own
/// weights on the packed engine (what `rl --trainer packed` runs on a CPU).
#[test]
fn the_packed_learner_raises_a_process_reward() {
    let tok = tokenizer();
    let (reference, _) = fresh(7);
    let start_tmp = policy_folder(7, "raise");
    let start = start_tmp.path();
    let on_reference = packed_learner(start, &start.join("sampler"));
    let on_cpu = stepwise_rl::learner::packed_learner(start, stepwise_model::Placement::Cpu, 4096, None).unwrap();
    for mut learner in [Box::new(on_reference) as Box<dyn Learner>, on_cpu] {
        let (problems, task) = (problems(), PlainTask::default());
        let cfg = process_reward_config();
        let log = train_rl(
            run(&mut *learner, &reference, &tok, &problems, &task, None),
            &cfg,
            |_| {},
        )
        .unwrap();
        assert!(log
            .iter()
            .all(|l| l.kl.is_some_and(f64::is_finite) && l.loss.is_finite()));
        assert_rewards_rise(&log);
    }
}

/// A learner that counts its passes of [`Learner::logprobs`].
struct Counting<'a> {
    inner: Box<dyn Learner + 'a>,
    passes: usize,
}

impl Learner for Counting<'_> {
    fn sampler(&mut self) -> Result<std::borrow::Cow<'_, Model>> {
        self.inner.sampler()
    }
    fn logprobs(&mut self, seqs: &[&[u32]], minibatch: usize) -> Result<Vec<Vec<f32>>> {
        self.passes += 1;
        self.inner.logprobs(seqs, minibatch)
    }
    fn old_logprobs_in_backward(&self) -> bool {
        self.inner.old_logprobs_in_backward()
    }
    fn backward(
        &mut self,
        batch: &[&Sequence],
        clip: f32,
        kl_coef: f32,
    ) -> Result<(f64, stepwise_rl::loss::LossStats)> {
        self.inner.backward(batch, clip, kl_coef)
    }
    fn backward_tokens(
        &mut self,
        seqs: &[(&[u32], usize)],
        loss: stepwise_model::packed_engine::TokenLossFn<'_>,
    ) -> Result<f32> {
        self.inner.backward_tokens(seqs, loss)
    }
    fn step(&mut self, lr: f64, weight_decay: f64, max_grad_norm: f64, micro_batches: usize) -> Result<()> {
        self.inner.step(lr, weight_decay, max_grad_norm, micro_batches)
    }
    fn save(&self, dir: &std::path::Path) -> Result<()> {
        self.inner.save(dir)
    }
    fn load(&mut self, dir: &std::path::Path) -> Result<()> {
        self.inner.load(dir)
    }
}

/// An update whose loss is taken once before the policy moves (one epoch, one optimiser step)
/// leaves the packed trainer's old log-probabilities to its backward: no pass of their own, a
/// ratio of 1. Two epochs, or a candle learner, keep the pass.
#[test]
fn an_on_policy_update_takes_its_old_log_probabilities_from_the_backward() {
    let tok = tokenizer();
    let (reference, _) = fresh(9);
    let start_tmp = policy_folder(9, "on-policy");
    let start = start_tmp.path();
    let (problems, task) = (problems(), PlainTask::default());
    let one_step = RlConfig {
        epochs: 1,
        updates: 3,
        kl_coef: 0.01,
        ..process_reward_config()
    }
    .one_step_per_update();
    let two_epochs = RlConfig {
        epochs: 2,
        ..one_step.clone()
    };
    for (cfg, packed, passes) in [(&one_step, true, 0), (&two_epochs, true, 3), (&one_step, false, 3)] {
        let (mut model, _) = fresh(9);
        let inner: Box<dyn Learner + '_> = match packed {
            true => stepwise_rl::learner::packed_learner(start, stepwise_model::Placement::Cpu, 4096, None).unwrap(),
            false => Box::new(CandleLearner::new(&mut model).unwrap()),
        };
        let mut learner = Counting { inner, passes: 0 };
        let log = train_rl(run(&mut learner, &reference, &tok, &problems, &task, None), cfg, |_| {}).unwrap();
        assert_eq!(learner.passes, passes, "epochs {} packed {packed}", cfg.epochs);
        assert!(log
            .iter()
            .all(|l| l.kl.is_some_and(f64::is_finite) && l.loss.is_finite() && l.updated_tokens > 0));
        let clipped = log.iter().any(|l| l.clip_fraction > 0.0);
        assert!(passes > 0 || !clipped, "a ratio of 1 is never clipped");
    }
}

/// Three samples of 5 to 9 tokens after a 2-token prompt, with advantages of both signs and a
/// sampling policy 0.2 away from the reference in places (ratios clipped either side).
fn sampled_sequences(reference: &Model) -> Vec<Sequence> {
    let ids: Vec<Vec<u32>> = vec![
        vec![4, 3, 5, 3, 6, 3, 2],
        vec![4, 3, 6, 3, 2],
        vec![4, 3, 5, 3, 5, 3, 6, 3, 2],
    ];
    ids.iter()
        .enumerate()
        .map(|(k, ids)| {
            let refs = sequence_logprobs(
                reference,
                &[ids.as_slice()],
                1,
                stepwise_model::DEFAULT_MAX_BATCH_TOKENS,
            )
            .unwrap()
            .remove(0);
            Sequence {
                learn_from: 2,
                skip: Vec::new(),
                advantages: (0..ids.len()).map(|i| [0.5, -1.0, 1.5][(i + k) % 3]).collect(),
                old_logprobs: refs
                    .iter()
                    .enumerate()
                    .map(|(i, x)| x + 0.2 * ((i + k) % 3) as f32 - 0.2)
                    .collect(),
                ref_logprobs: refs,
                ids: ids.clone(),
            }
        })
        .collect()
}

/// The CPU learner trains a loss given on the host (its derivative by each token's
/// log-probability) as its own autograd of the same loss does: the policy loss both ways, one
/// AdamW step each, the same weights.
#[test]
fn the_cpu_learner_trains_a_host_loss_as_its_autograd_does() {
    let (reference, _) = fresh(3);
    let seqs = sampled_sequences(&reference);
    let batch: Vec<&Sequence> = seqs.iter().collect();
    let step = |host: bool| {
        let (mut model, varmap) = fresh(3);
        {
            let mut learner = CandleLearner::new(&mut model).unwrap();
            if host {
                let pairs: Vec<(&[u32], usize)> = seqs.iter().map(|s| (s.ids.as_slice(), s.learn_from)).collect();
                let mut loss = |logp: &[f32]| policy_loss(logp, &batch, 0.2, 0.1).map(|(l, c, _)| (l, c));
                learner.backward_tokens(&pairs, &mut loss).unwrap();
            } else {
                learner.backward(&batch, 0.2, 0.1).unwrap();
            }
            learner.step(1e-2, 0.0, 0.0, 1).unwrap();
        }
        stepwise_model::train::optim::named_vars(&varmap)
            .into_iter()
            .map(|(n, v)| (n, v.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap()))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let (autograd, host) = (step(false), step(true));
    for (name, a) in &autograd {
        let worst = a
            .iter()
            .zip(&host[name])
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max);
        assert!(worst < 1e-5, "{name}: {worst}");
    }
}

/// A minibatch past the packed learner's token budget trains in passes of at most the budget
/// (every pass's log-probabilities, the loss over all of them, each pass's backward with its
/// share): the same loss, statistics and gradients as one pass.
#[test]
fn a_minibatch_past_the_token_budget_trains_in_passes_with_the_same_gradients() {
    let (reference, _) = fresh(3);
    let start_tmp = policy_folder(3, "split");
    let start = start_tmp.path();
    let seqs = sampled_sequences(&reference);
    let batch: Vec<&Sequence> = seqs.iter().collect();
    let run = |max_tokens: usize| {
        let trainer = PackedTrainer::load(start, ModelConfig::from_dir(start).unwrap(), Arc::new(Reference)).unwrap();
        let no_sampling: SampleWith<Reference> = Box::new(|_| anyhow::bail!("not sampled from"));
        let mut learner = PackedLearner::new(trainer, max_tokens, no_sampling);
        let (loss, stats) = learner.backward(&batch, 0.2, 0.1).unwrap();
        (loss, stats, learner.trainer().gradients().unwrap())
    };
    let (one_loss, one_stats, one) = run(4096);
    // 8 tokens: each sequence its own pass.
    let (split_loss, split_stats, split) = run(8);
    assert!((one_loss - split_loss).abs() < 1e-6, "{one_loss} vs {split_loss}");
    assert_eq!(
        (one_stats.tokens, one_stats.clip_fraction),
        (split_stats.tokens, split_stats.clip_fraction)
    );
    assert!(one_stats.clip_fraction > 0.0, "{one_stats:?}");
    for ((name, a), (_, b)) in one.iter().zip(&split) {
        let scale = a.iter().map(|x| x.abs()).fold(1e-6, f32::max);
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max);
        assert!(worst <= 1e-4 * scale, "{name}: {worst} (largest |gradient| {scale})");
        assert!(a.iter().any(|&x| x != 0.0), "{name}: no gradient");
    }
}

/// Train 4 updates whole, and again killed in update 3 then resumed: the policy's weights (and
/// the implicit PRM's, with `prime`) and the logs are the same.
fn assert_resumes(name: &str, cfg: &RlConfig, prime: bool) {
    let tok = tokenizer();
    let (problems, task) = (problems(), LastStepAnswers);
    let outcome = OutcomeReward { task: &task };
    let (reference, _) = fresh(5);
    // One run into `dir`, from fresh weights; `on_update` may kill it.
    let train = |dir: &PathBuf, on_update: &dyn Fn(usize)| {
        let (mut m, _) = fresh(5);
        let (mut prm, _) = fresh(5);
        let mut learner = CandleLearner::new(&mut m).unwrap();
        let mut run = run(&mut learner, &reference, &tok, &problems, &task, Some(dir.clone()));
        if prime {
            run.reward = &outcome;
            run.implicit_prm = Some(ImplicitPrm::Candle(&mut prm));
        }
        train_rl(run, cfg, |l| on_update(l.update)).unwrap()
    };
    assert_killed_run_resumes(name, prime, &train);
}
