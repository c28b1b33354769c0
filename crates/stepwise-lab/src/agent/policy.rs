//! The agent's policy: a small causal LM trained from scratch on the noisy expert's
//! demonstrations (`question | action Observation: … | … | <eos>`, ending where the expert
//! stopped), then playing one action a turn behind the [`stepwise_core::Policy`] seam.

use crate::preset::Preset;
use crate::stages::policy::shape;
use crate::stages::train_stage;
use crate::task::Domain;
use crate::vocab::{EOS, SEP};
use anyhow::Result;
use std::path::Path;
use stepwise_agent::rollout::play_resumable;
use stepwise_agent::{Expert, Rooms};
use stepwise_core::record::OBSERVATION_MARK;
use stepwise_core::{Problem, Solution};
use stepwise_model::layout::encode_trajectory;
use stepwise_model::train::{Example, Objective, TrainConfig};
use stepwise_model::{EnginePolicy, HeadKind, Model, Prompt, SamplingParams, Tokenizer};

/// The expert's demonstrations: `demos` trajectories of each world (resumable journal at
/// `path`).
pub fn demonstrations(path: &Path, p: &Preset, seed: u64, games: &[Problem]) -> Result<Vec<Solution>> {
    let a = &p.agent;
    let expert = Expert::new(games, a.demo_skill)?;
    let env = Rooms::silent(a.max_actions);
    let pb = crate::progress::bar((games.len() * a.demos) as u64, "expert demonstrations");
    let demos = play_resumable(path, games, a.demos, &expert, &env, seed ^ 0xde, |d| {
        pb.set_position(d as u64)
    })?;
    pb.finish_and_clear();
    Ok(demos)
}

/// A next-token example of a trajectory: the loss covers what the player wrote (each action
/// and the observation mark that ends it, and the end token where it stopped of its own
/// accord), not the world's answers, which it only reads.
pub fn trajectory_example(tok: &Tokenizer, t: &Solution) -> Result<Example> {
    let e = encode_trajectory(tok, t, SEP, stopped(t).then_some(EOS))?;
    Ok(Example {
        ids: e.ids,
        lm_from: e.steps_from,
        lm_skip: e.read,
        ..Default::default()
    })
}

/// Train (or reuse) the policy in `dir` on `demos`, a twentieth held out for validation.
pub fn train_policy(dir: &Path, p: &Preset, seed: u64, demos: &[Solution], tok: &Tokenizer) -> Result<Model> {
    let examples: Vec<Example> = demos
        .iter()
        .map(|t| trajectory_example(tok, t))
        .collect::<Result<_>>()?;
    let (valid, train) = examples.split_at(examples.len() / 20);
    let steps = p.agent.policy_steps;
    let tc = TrainConfig {
        lr: 3e-3,
        warmup: steps / 20,
        steps,
        batch_size: 32,
        eval_every: steps / 4,
        seed,
        ..Default::default()
    };
    let cfg = shape(tok.vocab_size(), p.policy.shape, HeadKind::CausalLm);
    train_stage(
        dir,
        Domain::Agent,
        "training the agent policy",
        |varmap, dev| Model::fresh(cfg, varmap, dev, seed),
        train,
        valid,
        Objective::Lm,
        tc,
    )
}

/// The trained policy: one action a turn (it stops at the separator, at the observation mark
/// where it starts writing the world's answer itself, or at `<eos>` when it judges the task
/// done), sampled at `temperature`.
pub fn agent_policy<'a>(model: &'a Model, tok: &'a Tokenizer, temperature: f32) -> EnginePolicy<'a> {
    let mark = OBSERVATION_MARK.trim();
    EnginePolicy {
        model,
        tokenizer: tok,
        params: SamplingParams {
            temperature,
            max_new_tokens: 12,
            stop_token_ids: [tok.token_id(EOS), tok.token_id(mark)].into_iter().flatten().collect(),
            ..Default::default()
        },
        prompt: Prompt::Pieces,
        separator: SEP.into(),
        adapter: None,
    }
}

pub use stepwise_agent::rollout::stopped;

/// How trajectories ended, for the log: `(succeeded, stopped, out of actions, failed)`.
pub fn endings(ts: &[Solution]) -> (usize, usize, usize, usize) {
    let end = |t: &Solution, e: &str| t.meta.get("end").and_then(|x| x.as_str()) == Some(e);
    (
        ts.iter().filter(|t| t.correct == Some(true)).count(),
        ts.iter().filter(|t| stopped(t)).count(),
        ts.iter().filter(|t| end(t, "out_of_actions")).count(),
        ts.iter().filter(|t| end(t, "failed")).count(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use stepwise_core::Step;

    /// The loss covers the player's words (each action, the mark that ends it, the end token),
    /// never the world's answers.
    #[test]
    fn the_policy_learns_its_actions_not_the_worlds_answers() {
        let tok = crate::vocab::tokenizer(Domain::Agent).unwrap();
        let mut t = Solution {
            question: "Put the gem in the case.\nObservation: You are in the hall.".into(),
            steps: vec![
                Step::turn("go north", Some("You are in the kitchen.".to_string())),
                Step::turn("take gem", Some("You take the gem.".to_string())),
            ],
            ..Default::default()
        };
        t.meta.insert("end".to_string(), serde_json::json!("stopped"));
        let e = trajectory_example(&tok, &t).unwrap();
        let learned: Vec<u32> = (e.lm_from..e.ids.len())
            .filter(|&i| e.learns(i))
            .map(|i| e.ids[i])
            .collect();
        assert_eq!(
            tok.decode(&learned).unwrap(),
            "go north Observation: take gem Observation: <eos>"
        );
    }
}
