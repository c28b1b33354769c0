//! Playing a [`Policy`] in an [`Environment`]: the policy writes one action a step, the
//! environment answers, until the episode ends or runs out of actions. The result is a
//! trajectory: a [`Solution`] whose steps carry their observations.

use anyhow::Result;
use serde_json::json;
use stepwise_core::record::{render_turn, OBSERVATION_MARK};
use stepwise_core::seams::{Continuation, Environment, Episode, Observation, Policy, Until};
use stepwise_core::{Problem, Solution, Step};

/// The text a policy's turn stands for as an action: up to where it starts writing the
/// environment's answer itself (the observation mark, or a new line), trimmed.
pub fn action_of(c: &Continuation) -> String {
    let text = c.steps.first().map_or(c.text.as_str(), String::as_str);
    let text = text.split(OBSERVATION_MARK.trim()).next().unwrap_or_default();
    text.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The question a policy is shown: the task, then the first observation.
pub fn prompt(task: &str, first: &str) -> String {
    render_turn(task, Some(first))
}

/// How an episode ended.
#[derive(Debug, Clone, PartialEq)]
pub enum End {
    /// The environment said it is over: with success or without.
    Done {
        /// Whether the goal was reached.
        success: bool,
    },
    /// The policy stopped writing actions (end of sequence with nothing to do).
    Stopped,
    /// The action budget ran out.
    OutOfActions,
    /// The environment or the policy failed; the message names which and why.
    Failed(String),
}

/// What a rollout produced and spent.
pub struct Played {
    /// The steps taken after the prefix.
    pub steps: Vec<Step>,
    /// How it ended.
    pub end: End,
    /// Environment steps taken.
    pub env_steps: usize,
    /// Tokens the policy generated.
    pub tokens: usize,
    /// Where the policy stopped or ran out of actions: whether the goal held then
    /// ([`Episode::outcome`]; `None` where the environment does not judge the final state).
    pub outcome: Option<bool>,
}

impl Played {
    /// Whether the goal was reached: announced by the environment, or holding where the
    /// episode ended.
    pub fn success(&self) -> bool {
        match self.end {
            End::Done { success } => success,
            End::Stopped | End::OutOfActions => self.outcome == Some(true),
            End::Failed(_) => false,
        }
    }
}

/// Continue an episode: `question` and `prefix` are what the policy has seen so far, `episode`
/// is the state after the prefix, and at most `budget` more actions are taken.
pub fn continue_episode(
    policy: &dyn Policy,
    question: &str,
    prefix: &[String],
    episode: &mut dyn Episode,
    budget: usize,
    seed: u64,
) -> Played {
    let mut turns: Vec<String> = prefix.to_vec();
    let mut played = Played {
        steps: Vec::new(),
        end: End::OutOfActions,
        env_steps: 0,
        tokens: 0,
        outcome: None,
    };
    for t in 0..budget {
        let refs: Vec<&str> = turns.iter().map(String::as_str).collect();
        let turn_seed = seed.wrapping_mul(0x9e37_79b9).wrapping_add(t as u64);
        let c = match policy.continue_from(question, &refs, 1, Until::Step, turn_seed) {
            Ok(mut cs) if !cs.is_empty() => cs.swap_remove(0),
            Ok(_) => return fail(played, "policy: it returned no continuation".into()),
            Err(e) => return fail(played, format!("policy: {e:#}")),
        };
        played.tokens += c.tokens;
        let action = action_of(&c);
        if action.is_empty() {
            played.end = End::Stopped;
            played.outcome = episode.outcome();
            return played;
        }
        let obs = match step_checked(episode, &action) {
            Ok(o) => o,
            Err(e) => {
                played.steps.push(Step::turn(action, None));
                return fail(played, format!("environment: {e:#}"));
            }
        };
        played.env_steps += 1;
        turns.push(render_turn(&action, Some(&obs.text)));
        played.steps.push(Step::turn(action, Some(obs.text)));
        if obs.done {
            played.end = End::Done { success: obs.success };
            return played;
        }
    }
    played.outcome = episode.outcome();
    played
}

/// One environment step, with its answer checked: an observation must be text a policy can be
/// shown (bounded, no NUL).
fn step_checked(episode: &mut dyn Episode, action: &str) -> Result<Observation> {
    let obs = episode.step(action)?;
    if obs.text.len() > 64 * 1024 || obs.text.contains('\0') {
        anyhow::bail!(
            "a malformed observation ({} bytes{}) after `{action}`",
            obs.text.len(),
            if obs.text.contains('\0') { ", with a NUL" } else { "" }
        );
    }
    Ok(obs)
}

fn fail(mut played: Played, why: String) -> Played {
    played.end = End::Failed(why);
    played
}

/// One trajectory of `policy` on `problem`, from the start: the task and first observation as
/// its question, one step per action with the observation after it, the outcome in `correct`
/// (`None` when the episode failed, with the error in `meta.error`), and how it ended in
/// `meta.end`.
pub fn play(policy: &dyn Policy, env: &dyn Environment, problem: &Problem, id: String, seed: u64) -> Solution {
    let (mut episode, first) = match env.reset(problem) {
        Ok(x) => x,
        Err(e) => {
            let mut s = trajectory(problem, id, problem.question.clone(), Vec::new());
            s.meta.insert("end".into(), json!("failed"));
            s.meta.insert("error".into(), json!(format!("environment: {e:#}")));
            return s;
        }
    };
    let question = prompt(&problem.question, &first);
    let played = continue_episode(policy, &question, &[], episode.as_mut(), env.max_actions(), seed);
    finish(trajectory(problem, id, question, Vec::new()), played)
}

/// An empty trajectory of `problem`.
pub fn trajectory(problem: &Problem, id: String, question: String, steps: Vec<Step>) -> Solution {
    Solution {
        id,
        problem_id: problem.id.clone(),
        question,
        steps,
        ..Default::default()
    }
}

/// `sol` with `played`'s steps appended and its ending recorded.
pub fn finish(mut sol: Solution, played: Played) -> Solution {
    sol.correct = match &played.end {
        End::Failed(_) => None,
        _ => Some(played.success()),
    };
    sol.final_answer = sol.correct.map(|c| if c { "success" } else { "failure" }.to_string());
    let end = match &played.end {
        End::Done { success: true } => "success",
        End::Done { success: false } => "lost",
        End::Stopped => "stopped",
        End::OutOfActions => "out_of_actions",
        End::Failed(why) => {
            sol.meta.insert("error".into(), json!(why));
            "failed"
        }
    };
    sol.meta.insert("end".into(), json!(end));
    sol.meta.insert("tokens".into(), json!(played.tokens));
    sol.steps.extend(played.steps);
    sol
}

/// Whether a trajectory ended with the player stopping of its own accord (`meta.end`).
pub fn stopped(t: &Solution) -> bool {
    t.meta.get("end").and_then(|e| e.as_str()) == Some("stopped")
}

/// The id of trajectory `j` of a problem.
pub fn trajectory_id(problem: &Problem, j: usize) -> String {
    format!("{}-{j}", problem.id)
}

/// FNV-1a of `s`: a seed per trajectory id.
pub fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// `n` trajectories of each problem, appended to the JSONL journal at `path` as they finish (a
/// few at a time in parallel, one per thread of rayon's pool, twice over). Started again after
/// an interruption, it plays only what the journal lacks; trajectories are seeded by their id,
/// so the records equal an uninterrupted run's. `progress(done)` counts trajectories finished.
/// Returns every trajectory, problem by problem.
pub fn play_resumable(
    path: &std::path::Path,
    problems: &[Problem],
    n: usize,
    policy: &dyn Policy,
    env: &dyn Environment,
    seed: u64,
    progress: impl FnMut(usize),
) -> Result<Vec<Solution>> {
    each_resumable(
        path,
        problems,
        n,
        |p, id| play(policy, env, p, id.to_string(), seed ^ fnv(id)),
        progress,
    )
}

/// `job(problem, id)` for `n` ids of each problem ([`trajectory_id`]), journalled at `path` as
/// [`play_resumable`] does: what the journal holds is not done again, and the records come back
/// problem by problem. A job seeds itself by its id, so a resumed run equals an uninterrupted one.
pub fn each_resumable(
    path: &std::path::Path,
    problems: &[Problem],
    n: usize,
    job: impl Fn(&Problem, &str) -> Solution + Sync,
    mut progress: impl FnMut(usize),
) -> Result<Vec<Solution>> {
    use rayon::prelude::*;
    let (mut journal, mut kept) = stepwise_core::journal::Journal::open::<Solution>(path, |s| s.id.clone())?;
    let order: Vec<String> = problems
        .iter()
        .flat_map(|p| (0..n).map(move |j| trajectory_id(p, j)))
        .collect();
    let todo: Vec<(&Problem, String)> = problems
        .iter()
        .flat_map(|p| (0..n).map(move |j| (p, trajectory_id(p, j))))
        .filter(|(_, id)| !journal.contains(id))
        .collect();
    progress(order.len() - todo.len());
    for batch in todo.chunks(2 * rayon::current_num_threads()) {
        let done: Vec<Solution> = batch.par_iter().map(|(p, id)| job(p, id)).collect();
        for s in done {
            journal.append(s.id.clone(), &s)?;
            kept.push(s);
        }
        progress(kept.len().min(order.len()));
    }
    let wanted: std::collections::HashSet<&str> = order.iter().map(String::as_str).collect();
    kept.retain(|s| wanted.contains(s.id.as_str()));
    stepwise_core::journal::sort_like(&mut kept, order.iter().map(String::as_str), |s| s.id.as_str());
    Ok(kept)
}
