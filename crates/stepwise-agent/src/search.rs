//! Step-level search over actions: a beam of episodes, each widened by the policy's sampled
//! actions, the environment stepping every one on a fork, a step scorer (a PRM reading the
//! value of the state each action led to) keeping the best. A beam whose policy stops is
//! finished and competes on its last score; the search ends when every kept beam is finished
//! or the action budget is spent, and returns the best finished one.

use crate::rollout::{action_of, finish, prompt, trajectory, End, Played};
use anyhow::Result;
use stepwise_core::record::render_turn;
use stepwise_core::seams::{Environment, Episode, Policy, ScoreInput, StepScorer, Until};
use stepwise_core::{Problem, Solution, Step};

/// The beam's shape.
#[derive(Debug, Clone, Copy)]
pub struct BeamOptions {
    /// Beams kept after each action.
    pub width: usize,
    /// Actions sampled from each open beam.
    pub expand: usize,
    /// Seed; each depth and beam derives its own.
    pub seed: u64,
}

/// One beam: its steps, its episode, its last score, and whether it is finished.
struct Beam {
    steps: Vec<Step>,
    episode: Box<dyn Episode>,
    score: f32,
    end: Option<End>,
}

impl Beam {
    fn turns(&self) -> Vec<String> {
        self.steps
            .iter()
            .map(|s| render_turn(&s.text, s.observation.as_deref()))
            .collect()
    }
}

/// What a search spent beside its trajectory.
#[derive(Debug, Clone, Copy, Default)]
pub struct SearchCost {
    /// Environment steps taken (every candidate action, kept or not).
    pub env_steps: usize,
    /// Tokens the policy generated.
    pub tokens: usize,
}

/// Widen the open beams by `expand` sampled actions each; finished beams carry over.
fn widen(
    policy: &dyn Policy,
    question: &str,
    beams: Vec<Beam>,
    o: &BeamOptions,
    depth: usize,
    cost: &mut SearchCost,
) -> Result<Vec<Beam>> {
    let mut out = Vec::new();
    for (b, beam) in beams.into_iter().enumerate() {
        if beam.end.is_some() {
            out.push(beam);
            continue;
        }
        let turns = beam.turns();
        let refs: Vec<&str> = turns.iter().map(String::as_str).collect();
        let seed = o.seed ^ ((depth as u64) << 32 | b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut seen: Vec<String> = Vec::new();
        for c in policy.continue_from(question, &refs, o.expand, Until::Step, seed)? {
            cost.tokens += c.tokens;
            let action = action_of(&c);
            if seen.contains(&action) {
                continue;
            }
            seen.push(action.clone());
            let mut episode = beam.episode.fork()?;
            if action.is_empty() {
                out.push(Beam {
                    steps: beam.steps.clone(),
                    episode,
                    score: beam.score,
                    end: Some(End::Stopped),
                });
                continue;
            }
            let obs = episode.step(&action)?;
            cost.env_steps += 1;
            let mut steps = beam.steps.clone();
            steps.push(Step::turn(action, Some(obs.text)));
            out.push(Beam {
                steps,
                episode,
                score: f32::NAN,
                end: obs.done.then_some(End::Done { success: obs.success }),
            });
        }
    }
    Ok(out)
}

/// Beam search on `problem`: returns the trajectory it settles on (`meta.end` and `correct` as
/// a played one's) and what it spent.
pub fn beam_search(
    policy: &dyn Policy,
    env: &dyn Environment,
    scorer: &dyn StepScorer,
    problem: &Problem,
    id: String,
    o: &BeamOptions,
) -> Result<(Solution, SearchCost)> {
    let (episode, first) = env.reset(problem)?;
    let question = prompt(&problem.question, &first);
    let mut cost = SearchCost::default();
    let mut beams = vec![Beam {
        steps: Vec::new(),
        episode,
        score: 0.0,
        end: None,
    }];
    for depth in 0..env.max_actions() {
        let mut cands = widen(policy, &question, beams, o, depth, &mut cost)?;
        // Score the new candidates: the value of the state each reached.
        let fresh: Vec<usize> = (0..cands.len()).filter(|&i| cands[i].score.is_nan()).collect();
        let turns: Vec<Vec<String>> = fresh.iter().map(|&i| cands[i].turns()).collect();
        let inputs: Vec<ScoreInput<'_>> = fresh
            .iter()
            .zip(&turns)
            .map(|(_, t)| ScoreInput {
                problem_id: &problem.id,
                question: &question,
                steps: t.iter().map(String::as_str).collect(),
                partial: true,
            })
            .collect();
        let scored = if inputs.is_empty() {
            Vec::new()
        } else {
            scorer.score(&inputs)?.scores
        };
        for (&i, s) in fresh.iter().zip(scored) {
            cands[i].score = s.last().copied().unwrap_or(0.0);
        }
        cands.sort_by(|a, b| b.score.total_cmp(&a.score));
        cands.truncate(o.width.max(1));
        beams = cands;
        if beams.iter().all(|b| b.end.is_some()) {
            break;
        }
    }
    // The best finished beam; with none finished, the best open one, out of actions.
    let best = beams
        .into_iter()
        .min_by_key(|b| (b.end.is_none(), std::cmp::Reverse(OrdF32(b.score))))
        .expect("a beam search keeps at least one beam");
    let played = Played {
        outcome: best.episode.outcome(),
        end: best.end.unwrap_or(End::OutOfActions),
        steps: best.steps,
        env_steps: cost.env_steps,
        tokens: cost.tokens,
    };
    Ok((finish(trajectory(problem, id, question, Vec::new()), played), cost))
}

/// An `f32` ordered by `total_cmp`.
#[derive(PartialEq)]
struct OrdF32(f32);
impl Eq for OrdF32 {}
impl PartialOrd for OrdF32 {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for OrdF32 {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}
