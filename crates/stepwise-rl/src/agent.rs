//! RL for an agent in an environment (GRPO over trajectories): each update, the policy plays a
//! group of episodes in each of a few worlds, one action a turn; the reward speaks per action
//! (a PRM's scores, the oracle's verdicts: a process reward, with the goal's advantage added
//! at a chosen weight) or per trajectory (the goal: outcome-only RL), group-normalised into
//! each action's advantage. A trajectory trains as one
//! sequence in the policy's layout ([`encode_trajectory`]): each action's tokens (and the end
//! token where the policy stopped) carry that action's advantage, and the environment's
//! observations, which the policy read but did not write, are left out of the loss. The loop,
//! its checkpoints and its resumption are the single-turn trainer's (`updates.rs`).

use crate::advantage::step_advantages;
use crate::learner::Learner;
use crate::prime::{ImplicitPrm, OnlinePrm};
use crate::rollout::Sequence;
use crate::trainer::{Heldout, Reference, RlConfig, UpdateLog};
use crate::updates::{mean_rewards, rng_seed, run_updates, Core, Sampler, Samples};
use anyhow::{bail, Result};
use std::path::PathBuf;
use stepwise_agent::rollout::{fnv, play_all, stopped};
use stepwise_agent::GoalReward;
use stepwise_core::seams::{Environment, Reward, RewardKind};
use stepwise_core::{Problem, Solution};
use stepwise_model::layout::encode_trajectory;
use stepwise_model::{EnginePolicy, Model, Prompt, SamplingParams, Tokenizer};

/// Everything an agent's RL run works on.
pub struct AgentRlRun<'a> {
    /// The policy being trained, where it trains.
    pub learner: &'a mut dyn Learner,
    /// The frozen starting policy ([`crate::trainer::RlRun::reference`]).
    pub reference: Reference<'a>,
    /// The tokenizer.
    pub tokenizer: &'a Tokenizer,
    /// How the task and the turns so far become the prompt.
    pub prompt: Prompt,
    /// Text between turns.
    pub separator: String,
    /// How the policy samples one action (its temperature is the config's): its stop tokens end
    /// an action (the observation mark) or the episode (the end token).
    pub params: SamplingParams,
    /// The end token's text: appended to a trajectory the policy stopped of its own accord.
    pub end: String,
    /// The environment.
    pub env: &'a dyn Environment,
    /// The worlds to train in.
    pub problems: &'a [Problem],
    /// What is optimised.
    pub reward: &'a dyn Reward,
    /// For a process reward: the weight of the goal's group-normalised advantage added to every
    /// action's (as PRIME and PURE mix the verifiable outcome in: the goal says whether, the
    /// actions' rewards say which); 0 optimises the process reward alone. An outcome reward
    /// ignores it.
    pub goal_weight: f32,
    /// Rewards only measured on the samples (logged in [`UpdateLog::watched`]).
    pub watch: Vec<&'a dyn Reward>,
    /// Checkpoint folder (resumed from when it holds one).
    pub out_dir: Option<PathBuf>,
    /// Worlds the policy's success is measured in during training
    /// ([`UpdateLog::heldout_accuracy`]).
    pub heldout: Option<Heldout<'a>>,
    /// PRIME's implicit PRM, trained online from the goal; given exactly when
    /// [`RlConfig::prime`] is set, with the goal as the reward. It scores what the policy wrote
    /// (each action's tokens), never the observations, and is checkpointed in the run folder's
    /// `implicit_prm/`.
    pub implicit_prm: Option<ImplicitPrm<'a>>,
}

/// Run RL in the environment; `on_update` sees each update's log. Returns the log of every
/// update (a resumed run's earlier part included). [`UpdateLog::accuracy`] is the share of
/// the update's episodes that reached the goal.
pub fn train_agent_rl(
    run: AgentRlRun<'_>,
    cfg: &RlConfig,
    on_update: impl FnMut(&UpdateLog),
) -> Result<Vec<UpdateLog>> {
    if run.problems.is_empty() || cfg.group_size < 2 || cfg.prompts_per_update == 0 {
        bail!("RL needs worlds, a group of at least 2 episodes per world and at least one world per update");
    }
    cfg.check()?;
    let prime = OnlinePrm::for_run(cfg.prime, run.implicit_prm, run.reward)?;
    let mut sampler = Episodes {
        tokenizer: run.tokenizer,
        prompt: run.prompt,
        separator: run.separator,
        params: SamplingParams {
            temperature: cfg.temperature,
            ..run.params
        },
        end: run.end,
        env: run.env,
        reward: run.reward,
        goal_weight: run.goal_weight,
        watch: run.watch,
        heldout: run.heldout,
        cfg,
    };
    let core = Core {
        learner: run.learner,
        reference: run.reference,
        problems: run.problems,
        out_dir: run.out_dir,
        prime,
    };
    run_updates(core, cfg, &mut sampler, on_update)
}

/// Episodes as samples.
struct Episodes<'a> {
    tokenizer: &'a Tokenizer,
    prompt: Prompt,
    separator: String,
    params: SamplingParams,
    end: String,
    env: &'a dyn Environment,
    reward: &'a dyn Reward,
    goal_weight: f32,
    watch: Vec<&'a dyn Reward>,
    heldout: Option<Heldout<'a>>,
    cfg: &'a RlConfig,
}

impl Episodes<'_> {
    fn policy<'m>(&'m self, model: &'m Model) -> EnginePolicy<'m> {
        EnginePolicy {
            model,
            tokenizer: self.tokenizer,
            params: self.params.clone(),
            prompt: self.prompt,
            separator: self.separator.clone(),
            adapter: None,
        }
    }

    /// `n` episodes of `policy` in each world, ids `<world>-<tag>-<j>`, seeded by the world's
    /// seed (`seed(k)` for world `k`) and the id: every world's episodes played together (one
    /// batch a turn on the packed engine), each world's group in order.
    fn play(
        &self,
        policy: &EnginePolicy<'_>,
        worlds: &[&Problem],
        n: usize,
        tag: &str,
        seed: impl Fn(usize) -> u64,
    ) -> Vec<Vec<Solution>> {
        let jobs: Vec<(&Problem, String, u64)> = (worlds.iter().enumerate())
            .flat_map(|(k, p)| {
                let world_seed = seed(k);
                (0..n).map(move |j| {
                    let id = format!("{}-{tag}-{j}", p.id);
                    let s = world_seed ^ fnv(&id);
                    (*p, id, s)
                })
            })
            .collect();
        let mut played = play_all(policy, self.env, &jobs).into_iter();
        (0..worlds.len()).map(|_| played.by_ref().take(n).collect()).collect()
    }

    /// `t` as a training sequence whose actions carry `advantages` (one per action).
    fn sequence(&self, t: &Solution, advantages: &[f32]) -> Result<Sequence> {
        let end = stopped(t).then_some(self.end.as_str());
        let e = encode_trajectory(self.tokenizer, t, &self.separator, end)?;
        // The end token (the decision to stop) carries the last action's advantage.
        let last = advantages.last().copied().unwrap_or(0.0);
        let mut adv = vec![last; e.ids.len()];
        adv[..e.steps_from].fill(0.0);
        for (&(from, to), &a) in e.turns.iter().zip(advantages) {
            adv[from..=to].fill(a);
        }
        Ok(Sequence {
            learn_from: e.steps_from,
            skip: e.read,
            ids: e.ids,
            advantages: adv,
            ..Default::default()
        })
    }
}

impl Sampler for Episodes<'_> {
    fn sample(&mut self, model: &Model, chosen: &[&Problem], u: usize) -> Result<Samples> {
        let (cfg, reward) = (self.cfg, self.reward);
        let policy = self.policy(model);
        let mut out = Samples::default();
        let groups = self.play(&policy, chosen, cfg.group_size, &format!("u{u}"), |k| {
            rng_seed(cfg.seed, u, k)
        });
        for ts in groups {
            out.correct += ts.iter().filter(|t| t.correct == Some(true)).count();
            out.tokens += ts
                .iter()
                .map(|t| t.meta.get("tokens").and_then(|x| x.as_u64()).unwrap_or(0) as usize)
                .sum::<usize>();
            let rewards = reward.rewards(&ts)?;
            out.reward_sum += mean_rewards(&rewards);
            for w in &self.watch {
                *out.watched.entry(w.name().to_string()).or_insert(0.0) += mean_rewards(&w.rewards(&ts)?);
            }
            out.outcomes
                .extend(rewards.iter().map(|r| r.last().copied().unwrap_or(0.0)));
            out.groups.push(out.seqs.len()..out.seqs.len() + ts.len());
            let steps: Vec<usize> = ts.iter().map(|t| t.steps.len()).collect();
            let mut advantages = step_advantages(&rewards, &steps, reward.kind(), cfg.credit);
            if reward.kind() == RewardKind::Process && self.goal_weight != 0.0 {
                let goal = GoalReward.rewards(&ts)?;
                let goal = step_advantages(&goal, &steps, RewardKind::Outcome, cfg.credit);
                for (a, g) in advantages.iter_mut().zip(goal) {
                    a.resize(g.len().max(a.len()), 0.0);
                    a.iter_mut().zip(g).for_each(|(x, y)| *x += self.goal_weight * y);
                }
            }
            for (t, a) in ts.iter().zip(advantages) {
                out.seqs.push(self.sequence(t, &a)?);
            }
        }
        Ok(out)
    }

    fn heldout_due(&self, u: usize, last: bool) -> bool {
        self.heldout.as_ref().is_some_and(|h| h.due(u, last))
    }

    fn heldout(&mut self, model: &Model) -> Result<f64> {
        let Some(h) = &self.heldout else { return Ok(0.0) };
        let policy = self.policy(model);
        let worlds: Vec<&Problem> = h.problems.iter().collect();
        let seed = |k| rng_seed(self.cfg.seed ^ 0xe7a1, 0, k);
        let (mut won, mut total) = (0usize, 0usize);
        for ts in self.play(&policy, &worlds, h.samples, "heldout", seed) {
            won += ts.iter().filter(|t| t.correct == Some(true)).count();
            total += ts.len();
        }
        Ok(won as f64 / total.max(1) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stepwise_core::Step;

    struct NoWorld;

    impl Environment for NoWorld {
        fn reset(&self, _: &Problem) -> Result<(Box<dyn stepwise_core::seams::Episode>, String)> {
            bail!("not played")
        }
    }

    /// A trajectory trains on what the policy wrote (each action, the mark that ends it, the
    /// end token), each action's tokens with its advantage, never on the world's answers.
    #[test]
    fn a_trajectory_learns_its_actions_with_their_advantages() {
        let words: Vec<String> = ["<pad>", "<unk>", "<eos>", "|", "q", "a", "b", "o", "Observation:"]
            .iter()
            .map(|w| w.to_string())
            .collect();
        let tok = Tokenizer::word_level(&words, "<unk>", Some("<eos>")).unwrap();
        let cfg = RlConfig::default();
        let episodes = Episodes {
            tokenizer: &tok,
            prompt: Prompt::Pieces,
            separator: "|".into(),
            params: SamplingParams::default(),
            end: "<eos>".into(),
            env: &NoWorld,
            reward: &stepwise_agent::GoalReward,
            goal_weight: 0.0,
            watch: Vec::new(),
            heldout: None,
            cfg: &cfg,
        };
        let mut t = Solution {
            question: "q\nObservation: o".into(),
            steps: vec![
                Step::turn("a", Some("o o".to_string())),
                Step::turn("b a", Some("o".to_string())),
            ],
            ..Default::default()
        };
        t.meta.insert("end".into(), serde_json::json!("stopped"));
        let s = episodes.sequence(&t, &[0.5, -1.0]).unwrap();
        let learned: Vec<(String, f32)> = (0..s.ids.len())
            .filter(|&i| s.learns(i))
            .map(|i| (tok.decode(&s.ids[i..=i]).unwrap(), s.advantages[i]))
            .collect();
        let expect = [
            ("a", 0.5),
            ("Observation:", 0.5),
            ("b", -1.0),
            ("a", -1.0),
            ("Observation:", -1.0),
            ("<eos>", -1.0),
        ];
        let expect: Vec<(String, f32)> = expect.iter().map(|(w, a)| (w.to_string(), *a)).collect();
        assert_eq!(learned, expect);
        assert!(s.advantages[..s.learn_from].iter().all(|&a| a == 0.0));
    }
}
