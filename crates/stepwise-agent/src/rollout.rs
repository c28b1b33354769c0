//! Playing a [`Policy`] in an [`Environment`]: the policy writes one action a step, the
//! environment answers, until the episode ends or runs out of actions. The result is a
//! trajectory: a [`Solution`] whose steps carry their observations.

use anyhow::Result;
use serde_json::json;
use stepwise_core::record::{render_turn, OBSERVATION_MARK};
use stepwise_core::seams::{Continuation, Environment, Episode, NextSteps, Observation, Policy, PolicyBatch, Until};
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
    let one = Continuing::new(question, prefix.to_vec(), episode, budget, seed);
    continue_episodes(policy, vec![one]).remove(0)
}

/// An episode being continued: what the policy has seen (the question and the turns so far),
/// the state, the actions left, and what was played.
pub struct Continuing<'e> {
    question: &'e str,
    turns: Vec<String>,
    episode: &'e mut dyn Episode,
    budget: usize,
    seed: u64,
    played: Played,
    over: bool,
}

impl<'e> Continuing<'e> {
    /// `episode`, the state after `turns`, continued for at most `budget` actions, each turn's
    /// draw seeded from `seed` and the turn's index.
    pub fn new(question: &'e str, turns: Vec<String>, episode: &'e mut dyn Episode, budget: usize, seed: u64) -> Self {
        Continuing {
            question,
            turns,
            episode,
            budget,
            seed,
            played: Played {
                steps: Vec::new(),
                end: End::OutOfActions,
                env_steps: 0,
                tokens: 0,
                outcome: None,
            },
            over: false,
        }
    }

    /// Whether the policy has an action to write.
    fn wants_turn(&self) -> bool {
        !self.over && self.played.steps.len() < self.budget
    }

    /// The seed of the coming turn's draw.
    fn turn_seed(&self) -> u64 {
        let t = self.played.steps.len() as u64;
        self.seed.wrapping_mul(0x9e37_79b9).wrapping_add(t)
    }

    /// The policy's answer for this turn, acted on: its action taken in the environment, or the
    /// episode ended (the policy stopped or failed, the environment failed or ended it).
    fn take(&mut self, answer: Result<Vec<Continuation>>) {
        let c = match answer {
            Ok(mut cs) if !cs.is_empty() => cs.swap_remove(0),
            Ok(_) => return self.fail("policy: it returned no continuation".into()),
            Err(e) => return self.fail(format!("policy: {e:#}")),
        };
        self.played.tokens += c.tokens;
        let action = action_of(&c);
        if action.is_empty() {
            self.played.end = End::Stopped;
            self.over = true;
            return;
        }
        let obs = match step_checked(self.episode, &action) {
            Ok(o) => o,
            Err(e) => {
                self.played.steps.push(Step::turn(action, None));
                return self.fail(format!("environment: {e:#}"));
            }
        };
        self.played.env_steps += 1;
        self.turns.push(render_turn(&action, Some(&obs.text)));
        self.played.steps.push(Step::turn(action, Some(obs.text)));
        if obs.done {
            self.played.end = End::Done { success: obs.success };
            self.over = true;
        }
    }

    fn fail(&mut self, why: String) {
        self.played.end = End::Failed(why);
        self.over = true;
    }

    /// What was played; where the player stopped or ran out of actions, whether the goal held.
    fn finish(mut self) -> Played {
        if matches!(self.played.end, End::Stopped | End::OutOfActions) {
            self.played.outcome = self.episode.outcome();
        }
        self.played
    }
}

/// Episodes continued turn by turn together: each turn, every episode still going asks the
/// policy for its action, all in one [`Policy::batch`] call where the policy batches (a local
/// model on the packed engine decodes them in the same steps and re-reads an episode's history
/// from its cache), else in calls of their own, several at once; then each acts in its world.
/// Each episode plays as it would alone ([`continue_episode`]): its turns draw with their own
/// seeds.
pub fn continue_episodes(policy: &dyn Policy, eps: Vec<Continuing<'_>>) -> Vec<Played> {
    let mut batch = policy.batch();
    continue_episodes_on(policy, batch.as_deref_mut(), eps)
}

/// [`continue_episodes`] on a batch the caller holds (`None`: the policy is asked on its own),
/// which keeps what it cached for the caller's next call: a search's next round of rollouts
/// from a later state of the same trajectories feeds only what its histories add.
pub fn continue_episodes_on(
    policy: &dyn Policy,
    mut batch: Option<&mut (dyn PolicyBatch + '_)>,
    mut eps: Vec<Continuing<'_>>,
) -> Vec<Played> {
    use rayon::prelude::*;
    loop {
        let live: Vec<usize> = (0..eps.len()).filter(|&i| eps[i].wants_turn()).collect();
        if live.is_empty() {
            break;
        }
        let answers = ask_turns(policy, batch.as_deref_mut(), &eps, &live);
        let mut slots: Vec<Option<Result<Vec<Continuation>>>> = (0..eps.len()).map(|_| None).collect();
        for (i, answer) in live.into_iter().zip(answers) {
            slots[i] = Some(answer);
        }
        (eps.par_iter_mut().zip(slots))
            .filter_map(|(e, answer)| Some((e, answer?)))
            .for_each(|(e, answer)| e.take(answer));
    }
    eps.into_iter().map(Continuing::finish).collect()
}

/// The policy's answers for the coming turn of episodes `live`: one batch call, or each asked on
/// its own, several at once.
fn ask_turns(
    policy: &dyn Policy,
    batch: Option<&mut (dyn PolicyBatch + '_)>,
    eps: &[Continuing<'_>],
    live: &[usize],
) -> Vec<Result<Vec<Continuation>>> {
    use rayon::prelude::*;
    let prefixes: Vec<Vec<&str>> = (live.iter())
        .map(|&i| eps[i].turns.iter().map(String::as_str).collect())
        .collect();
    let asks: Vec<NextSteps> = (live.iter().zip(&prefixes))
        .map(|(&i, prefix)| NextSteps {
            question: eps[i].question,
            prefix,
            n: 1,
            seed: eps[i].turn_seed(),
        })
        .collect();
    match batch {
        Some(b) => b.continue_all(&asks, Until::Step),
        None => (asks.par_iter())
            .map(|a| policy.continue_from(a.question, a.prefix, a.n, Until::Step, a.seed))
            .collect(),
    }
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

/// One trajectory of `policy` on `problem`, from the start: the task and first observation as
/// its question, one step per action with the observation after it, the outcome in `correct`
/// (`None` when the episode failed, with the error in `meta.error`), and how it ended in
/// `meta.end`.
pub fn play(policy: &dyn Policy, env: &dyn Environment, problem: &Problem, id: String, seed: u64) -> Solution {
    play_all(policy, env, &[(problem, id, seed)]).remove(0)
}

/// For each `(problem, id, seed)`, the trajectory [`play`] plays, the episodes played together
/// ([`continue_episodes`]: one batch a turn where the policy batches).
pub fn play_all(policy: &dyn Policy, env: &dyn Environment, jobs: &[(&Problem, String, u64)]) -> Vec<Solution> {
    use rayon::prelude::*;
    let started: Vec<Result<(Box<dyn Episode>, String)>> = jobs.par_iter().map(|(p, _, _)| env.reset(p)).collect();
    let mut questions = Vec::new();
    let mut episodes = Vec::new();
    let mut out: Vec<Option<Solution>> = Vec::with_capacity(jobs.len());
    for ((problem, id, _), s) in jobs.iter().zip(started) {
        match s {
            Ok((episode, first)) => {
                questions.push(prompt(&problem.question, &first));
                episodes.push(episode);
                out.push(None);
            }
            Err(e) => {
                let mut s = trajectory(problem, id.clone(), problem.question.clone(), Vec::new());
                s.meta.insert("end".into(), json!("failed"));
                s.meta.insert("error".into(), json!(format!("environment: {e:#}")));
                out.push(Some(s));
            }
        }
    }
    let playing = (jobs.iter().zip(&out))
        .filter(|(_, done)| done.is_none())
        .zip(questions.iter().zip(episodes.iter_mut()))
        .map(|(((_, _, seed), _), (q, e))| Continuing::new(q, Vec::new(), e.as_mut(), env.max_actions(), *seed))
        .collect();
    let mut played = continue_episodes(policy, playing).into_iter().zip(questions);
    (jobs.iter().zip(out))
        .map(|((problem, id, _), done)| {
            done.unwrap_or_else(|| {
                let (played, question) = played.next().expect("one a started episode");
                finish(trajectory(problem, id.clone(), question, Vec::new()), played)
            })
        })
        .collect()
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

/// Episodes [`play_resumable`] plays together (one batch a turn) between journal writes.
pub const PLAYED_TOGETHER: usize = 64;

/// `n` trajectories of each problem, appended to the JSONL journal at `path` as they finish
/// ([`PLAYED_TOGETHER`] at a time, played together: [`play_all`]). Started again after an
/// interruption, it plays only what the journal lacks; trajectories are seeded by their id, so
/// the records equal an uninterrupted run's. `progress(done)` counts trajectories finished.
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
    let play = |jobs: &[(&Problem, String)]| {
        let seeded: Vec<(&Problem, String, u64)> =
            (jobs.iter()).map(|(p, id)| (*p, id.clone(), seed ^ fnv(id))).collect();
        play_all(policy, env, &seeded)
    };
    chunks_resumable(path, problems, n, PLAYED_TOGETHER, play, progress)
}

/// `job(problem, id)` for `n` ids of each problem ([`trajectory_id`]), journalled at `path` as
/// [`play_resumable`] does (a few at a time in parallel, one per thread of rayon's pool, twice
/// over): what the journal holds is not done again, and the records come back problem by
/// problem. A job seeds itself by its id, so a resumed run equals an uninterrupted one.
pub fn each_resumable(
    path: &std::path::Path,
    problems: &[Problem],
    n: usize,
    job: impl Fn(&Problem, &str) -> Solution + Sync,
    progress: impl FnMut(usize),
) -> Result<Vec<Solution>> {
    use rayon::prelude::*;
    let each = |jobs: &[(&Problem, String)]| jobs.par_iter().map(|(p, id)| job(p, id)).collect();
    chunks_resumable(path, problems, n, 2 * rayon::current_num_threads(), each, progress)
}

/// `chunk(jobs)` (a trajectory each) over the `(problem, id)` the journal at `path` lacks, `size`
/// at a time, each chunk's records appended as it finishes; every record, problem by problem.
fn chunks_resumable(
    path: &std::path::Path,
    problems: &[Problem],
    n: usize,
    size: usize,
    chunk: impl Fn(&[(&Problem, String)]) -> Vec<Solution>,
    mut progress: impl FnMut(usize),
) -> Result<Vec<Solution>> {
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
    for jobs in todo.chunks(size.max(1)) {
        for s in chunk(jobs) {
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
