//! RL for an agent in a toy world (two `a` actions reach the goal, `b` does nothing): the
//! oracle's per-action reward is earned more as training goes on, and a run killed after a
//! checkpoint resumes to the weights of an uninterrupted run.

mod common;

use anyhow::Result;
use common::assert_killed_run_resumes;
use std::path::PathBuf;
use stepwise_agent::{Games, GoalReward, LabelReward, Oracle};
use stepwise_core::seams::{ActionKind, Environment, Episode, Observation, Reward};
use stepwise_core::Problem;
use stepwise_model::train::VarMap;
use stepwise_model::{Model, Prompt, SamplingParams, Tokenizer};
use stepwise_rl::{
    train_agent_rl, AgentRlRun, CandleLearner, Credit, ImplicitPrm, PrimeConfig, Reference, RlConfig, UpdateLog,
};

const WORDS: [&str; 9] = ["<pad>", "<unk>", "<eos>", "|", "q", "a", "b", "o", "Observation:"];

fn tokenizer() -> Tokenizer {
    common::word_tokenizer(&WORDS)
}

fn fresh(seed: u64) -> (Model, VarMap) {
    common::tiny_policy(WORDS.len(), seed)
}

/// The goal: two `a` actions. `a` is progress, anything else is invalid (nothing changes).
struct Twice;

#[derive(Clone)]
struct TwiceEpisode(usize);

impl Environment for Twice {
    fn reset(&self, _: &Problem) -> Result<(Box<dyn Episode>, String)> {
        Ok((Box::new(TwiceEpisode(0)), "o".into()))
    }
    fn max_actions(&self) -> usize {
        4
    }
}

impl Episode for TwiceEpisode {
    fn step(&mut self, action: &str) -> Result<Observation> {
        self.0 += usize::from(action == "a");
        Ok(Observation {
            text: "o".into(),
            done: self.0 == 2,
            success: self.0 == 2,
        })
    }
    fn fork(&self) -> Result<Box<dyn Episode>> {
        Ok(Box::new(self.clone()))
    }
    fn judge(&self, action: &str) -> Option<ActionKind> {
        Some(if action == "a" {
            ActionKind::Progress
        } else {
            ActionKind::Invalid
        })
    }
}

/// The goal: any action with an `a` in it (a fresh policy's luck now and then).
struct Once;

#[derive(Clone)]
struct OnceEpisode;

impl Environment for Once {
    fn reset(&self, _: &Problem) -> Result<(Box<dyn Episode>, String)> {
        Ok((Box::new(OnceEpisode), "o".into()))
    }
    fn max_actions(&self) -> usize {
        2
    }
}

impl Episode for OnceEpisode {
    fn step(&mut self, action: &str) -> Result<Observation> {
        let won = action.split_whitespace().any(|w| w == "a");
        Ok(Observation {
            text: "o".into(),
            done: won,
            success: won,
        })
    }
    fn fork(&self) -> Result<Box<dyn Episode>> {
        Ok(Box::new(self.clone()))
    }
}

fn worlds() -> Vec<Problem> {
    (0..2)
        .map(|k| Problem {
            id: format!("w{k}"),
            question: "q".into(),
            ..Default::default()
        })
        .collect()
}

fn config(updates: usize) -> RlConfig {
    RlConfig {
        updates,
        prompts_per_update: 2,
        group_size: 4,
        minibatch_size: 8,
        lr: 1e-2,
        kl_coef: 0.0,
        credit: Credit::ReturnToGo,
        max_new_tokens: 3,
        seed: 7,
        checkpoint_every: 2,
        ..Default::default()
    }
}

/// Train from fresh weights against `reward` into `dir` (when given), `on_update` seeing
/// each update; with PRIME's implicit PRM where `cfg` sets PRIME.
fn train(reward: &dyn Reward, cfg: &RlConfig, dir: Option<PathBuf>, on_update: &dyn Fn(usize)) -> Vec<UpdateLog> {
    try_train(&Twice, reward, cfg, dir, on_update).unwrap()
}

fn try_train(
    env: &dyn Environment,
    reward: &dyn Reward,
    cfg: &RlConfig,
    dir: Option<PathBuf>,
    on_update: &dyn Fn(usize),
) -> Result<Vec<UpdateLog>> {
    let (mut implicit, _) = fresh(3);
    let tok = tokenizer();
    let (reference, _) = fresh(3);
    let (mut model, _) = fresh(3);
    let problems = worlds();
    let run = AgentRlRun {
        learner: &mut CandleLearner::new(&mut model).unwrap(),
        reference: Reference::Model(&reference),
        tokenizer: &tok,
        prompt: Prompt::Pieces,
        separator: "|".into(),
        // An action ends at the observation mark, the episode at the end token.
        params: SamplingParams {
            max_new_tokens: 3,
            stop_token_ids: vec![2, 8],
            ..Default::default()
        },
        end: "<eos>".into(),
        env,
        problems: &problems,
        reward,
        goal_weight: 0.0,
        watch: vec![&GoalReward],
        out_dir: dir,
        heldout: None,
        implicit_prm: cfg.prime.map(|_| ImplicitPrm::Candle(&mut implicit)),
    };
    train_agent_rl(run, cfg, |l| on_update(l.update))
}

/// `f` of the oracle's verdicts on `Twice` as a reward.
fn with_oracle<R>(f: impl FnOnce(&dyn Reward) -> R) -> R {
    let env = Twice;
    let games = Games::new(&env, worlds());
    let oracle = Oracle(&games);
    f(&LabelReward {
        name: "oracle".into(),
        annotator: &oracle,
        neutral: 0.5,
    })
}

#[test]
fn the_oracles_per_action_reward_rises() {
    let log = with_oracle(|reward| train(reward, &config(30), None, &|_| {}));
    let mean = |xs: &[UpdateLog]| xs.iter().map(|l| l.reward).sum::<f64>() / xs.len() as f64;
    let (first, last) = (mean(&log[..5]), mean(&log[25..]));
    assert!(last > first + 0.2, "reward {first:.3} → {last:.3}");
    assert!(log.iter().all(|l| l.watched.contains_key("outcome")));
}

#[test]
fn an_agent_run_killed_after_a_checkpoint_resumes_to_the_same_weights() {
    let cfg = config(4);
    let run = |dir: &PathBuf, on_update: &dyn Fn(usize)| train(&GoalReward, &cfg, Some(dir.clone()), on_update);
    assert_killed_run_resumes("agent", false, &run);
}

/// PRIME in an environment: the implicit PRM learns from the goal each update (its loss on new
/// episodes falls) and the policy reaches the goal more often.
#[test]
fn prime_learns_from_the_goal_and_the_policy_reaches_it_more() {
    let cfg = RlConfig {
        prime: Some(PrimeConfig {
            lr: 1e-2,
            beta: 0.5,
            ..Default::default()
        }),
        ..config(30)
    };
    let log = try_train(&Once, &GoalReward, &cfg, None, &|_| {}).unwrap();
    let mean = |xs: &[UpdateLog]| xs.iter().map(|l| l.accuracy).sum::<f64>() / xs.len() as f64;
    let (first, last) = (mean(&log[..5]), mean(&log[25..]));
    assert!(last > first + 0.2, "success {first:.3} → {last:.3}");
    let learned: Vec<_> = log.iter().filter_map(|l| l.implicit_prm).collect();
    assert_eq!(learned.len(), log.len(), "the implicit PRM logs every update");
    // Its outcome loss, on each update's episodes before it learns from them, falls.
    let loss = |ps: &[stepwise_rl::PrimeLog]| {
        let kept: Vec<f64> = ps.iter().filter(|p| p.kept_groups > 0.0).map(|p| p.loss).collect();
        kept.iter().sum::<f64>() / kept.len().max(1) as f64
    };
    let (early, late) = (loss(&learned[..5]), loss(&learned[10..]));
    assert!(late < early - 0.1, "implicit PRM loss {early:.3} → {late:.3}");
    // A process reward is refused: PRIME learns from the goal.
    let e = with_oracle(|reward| try_train(&Twice, reward, &cfg, None, &|_| {}))
        .unwrap_err()
        .to_string();
    assert!(e.contains("PRIME learns from an outcome reward"), "{e}");
}
