//! Labels for an agent's actions, each an [`Annotator`] so the resumable runner (`stepwise agent
//! label`) journals them as it does every annotation:
//!
//! - [`Oracle`]: the environment's own verdict, where it knows the distance to the goal.
//! - [`MonteCarlo`] (AgentPRM, Choudhury 2025): from the state after each action the policy plays
//!   on K times; the label is the fraction that reach the goal.
//! - [`TemporalDifference`] (AgentPRM, Xi et al. 2026): the λ-return of each action from a
//!   learned value of the states (a PRM's step scores), with no rollouts: a step's *promise*
//!   as its soft label and its *progress* (GAE advantage) beside it.

use crate::rollout::{continue_episodes, continue_episodes_on, Continuing, Played};
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use stepwise_core::seams::{Annotator, Done, Environment, Episode, Policy, PolicyBatch, Spent};
use stepwise_core::{Problem, Provenance, Solution, StepLabel};

/// The problems trajectories belong to, by id, to replay their episodes.
pub struct Games<'a> {
    /// The environment.
    pub env: &'a dyn Environment,
    problems: HashMap<String, Problem>,
}

impl<'a> Games<'a> {
    /// The problems of `env`.
    pub fn new(env: &'a dyn Environment, problems: impl IntoIterator<Item = Problem>) -> Self {
        Games {
            env,
            problems: problems.into_iter().map(|p| (p.id.clone(), p)).collect(),
        }
    }

    /// The actions a trajectory may still take after its action `i`.
    pub(crate) fn actions_after(&self, i: usize) -> usize {
        self.env.max_actions().saturating_sub(i + 1)
    }

    /// The problem of a trajectory, by its `problem_id`.
    pub fn problem(&self, sol: &Solution) -> Result<&Problem> {
        self.problems.get(&sol.problem_id).with_context(|| {
            format!(
                "trajectory `{}`: field `problem_id`: `{}` is not among the problems given",
                sol.id, sol.problem_id
            )
        })
    }

    /// `sol`'s episode replayed from the start, with a fork of the state before each action.
    pub(crate) fn replay(&self, sol: &Solution) -> Result<Replay> {
        let (mut ep, first) = self.env.reset(self.problem(sol)?)?;
        let (mut before, mut ended) = (Vec::with_capacity(sol.steps.len()), false);
        for (i, st) in sol.steps.iter().enumerate() {
            before.push(ep.fork()?);
            ended = ep
                .step(&st.text)
                .with_context(|| format!("trajectory `{}`: replaying step {i}", sol.id))?
                .done;
        }
        Ok(Replay {
            first,
            before,
            end: ep,
            ended,
        })
    }
}

/// A trajectory replayed ([`Games::replay`]).
pub(crate) struct Replay {
    /// What the environment said first.
    pub first: String,
    /// The state before each action.
    pub before: Vec<Box<dyn Episode>>,
    /// The state after the last action.
    pub end: Box<dyn Episode>,
    /// Whether the last action ended the episode.
    pub ended: bool,
}

impl Replay {
    /// The state after action `i`.
    pub fn after(&self, i: usize) -> &dyn Episode {
        self.before.get(i + 1).unwrap_or(&self.end).as_ref()
    }
}

/// The environment's exact verdicts: each action judged from the state before it
/// ([`stepwise_core::seams::ActionKind`]), a hard label (progress good, useless neutral, the rest
/// bad) with the verdict's name in `meta.actions`.
pub struct Oracle<'a>(pub &'a Games<'a>);

impl Annotator for Oracle<'_> {
    fn name(&self) -> &str {
        "oracle"
    }

    fn annotate(&self, sol: &Solution) -> Result<(Solution, Spent)> {
        let states = self.0.replay(sol)?.before;
        let mut out = sol.clone();
        let mut kinds = Vec::with_capacity(states.len());
        for (st, ep) in out.steps.iter_mut().zip(&states) {
            let Some(kind) = ep.judge(&st.text) else {
                bail!("the environment has no oracle: it cannot judge actions (label with mc or td)");
            };
            st.label = Some(StepLabel::hard(kind.rating(), Provenance::Oracle));
            kinds.push(kind.name());
        }
        out.meta.insert("actions".into(), serde_json::json!(kinds));
        let spent = Spent {
            env_steps: sol.steps.len(),
            ..Default::default()
        };
        Ok((out, spent))
    }
}

/// Monte Carlo from each state: the policy plays on `rollouts` times from the state after each
/// action; the soft label is the mean discounted return of the rollouts, `gamma^n` for one that
/// reaches the goal after `n` more actions and 0 for one that does not (with `gamma` 1: the
/// fraction that reach the goal, AgentPRM's target). An action that ends the episode is labelled
/// by its outcome, with one "rollout" that cost nothing.
pub struct MonteCarlo<'a> {
    /// The trajectories' problems.
    pub games: &'a Games<'a>,
    /// The policy that plays on.
    pub policy: &'a dyn Policy,
    /// Rollouts per state.
    pub rollouts: usize,
    /// Seed; each trajectory, step and rollout derives its own.
    pub seed: u64,
    /// The discount of later success (1: any success counts fully).
    pub gamma: f32,
}

/// Episodes a batch of Monte Carlo labelling plays together at most: whole trajectories are
/// added (each state's rollouts) until it holds this many.
pub const EPISODES_TOGETHER: usize = 256;

/// A trajectory whose states are forked, to be played on from ([`MonteCarlo::prepare`]).
struct Forked {
    out: Solution,
    question: String,
    turns: Vec<String>,
    key: u64,
    spent: Spent,
    /// The state after each action that did not end the episode.
    states: Vec<ForkedState>,
}

/// The state after action `at`, forked once a rollout, with `budget` actions left.
struct ForkedState {
    at: usize,
    budget: usize,
    forks: Vec<Box<dyn Episode>>,
}

impl MonteCarlo<'_> {
    /// `sol` replayed, its ending action labelled by its outcome, the state after every other
    /// action forked once a rollout.
    fn prepare(&self, sol: &Solution) -> Result<Forked> {
        let problem = self.games.problem(sol)?;
        let (mut ep, first) = self.games.env.reset(problem)?;
        let mut f = Forked {
            out: sol.clone(),
            question: crate::rollout::prompt(&problem.question, &first),
            turns: sol.turn_strings(),
            key: self.seed ^ crate::rollout::fnv(&sol.id),
            spent: Spent {
                env_steps: sol.steps.len(),
                ..Default::default()
            },
            states: Vec::new(),
        };
        for (i, st) in f.out.steps.iter_mut().enumerate() {
            let obs = ep.step(&st.text)?;
            if obs.done {
                let hits = u32::from(obs.success);
                st.label = Some(StepLabel::soft(
                    hits as f32,
                    Provenance::MonteCarlo { rollouts: 1, hits },
                ));
                break;
            }
            let budget = self.games.actions_after(i);
            let forks = (0..self.rollouts).map(|_| ep.fork()).collect::<Result<_>>()?;
            f.states.push(ForkedState { at: i, budget, forks });
        }
        Ok(f)
    }

    /// Every state's rollouts of the trajectories `forked` played together
    /// ([`continue_episodes`]: one batch a turn where the policy batches), each seeded by its
    /// trajectory, action and index as [`roll_out`] seeds it; then their labels.
    fn play(&self, mut forked: Vec<Forked>, batch: Option<&mut (dyn PolicyBatch + '_)>) -> Vec<(Solution, Spent)> {
        let mut counts = Vec::new();
        let mut playing = Vec::new();
        for f in forked.iter_mut() {
            let (question, turns, key) = (f.question.as_str(), &f.turns, f.key);
            for st in f.states.iter_mut() {
                counts.push(st.forks.len());
                for (j, fork) in st.forks.iter_mut().enumerate() {
                    let seed = rollout_seed(key, st.at, j);
                    let turns = turns[..=st.at].to_vec();
                    playing.push(Continuing::new(question, turns, fork.as_mut(), st.budget, seed));
                }
            }
        }
        let mut played = continue_episodes_on(self.policy, batch, playing).into_iter();
        let mut counts = counts.into_iter();
        (forked.into_iter())
            .map(|mut f| {
                for st in &f.states {
                    let n = counts.next().expect("a count a state");
                    let played: Vec<Played> = played.by_ref().take(n).collect();
                    f.out.steps[st.at].label = Some(self.label(&played, &mut f.spent));
                }
                (f.out, f.spent)
            })
            .collect()
    }

    /// The label of a state from the rollouts `played` from it, their cost added to `spent`.
    fn label(&self, played: &[Played], spent: &mut Spent) -> StepLabel {
        let hits = played.iter().filter(|p| p.success()).count() as u32;
        add_played(spent, played);
        let n = played.len().max(1) as u32;
        let value: f32 = (played.iter())
            .filter(|p| p.success())
            .map(|p| self.gamma.powi(p.env_steps as i32))
            .sum();
        StepLabel::soft(value / n as f32, Provenance::MonteCarlo { rollouts: n, hits })
    }
}

impl Annotator for MonteCarlo<'_> {
    fn name(&self) -> &str {
        "mc"
    }

    /// Every state's rollouts played together.
    fn annotate(&self, sol: &Solution) -> Result<(Solution, Spent)> {
        let f = self.prepare(sol)?;
        let mut batch = self.policy.batch();
        Ok(self
            .play(vec![f], batch.as_deref_mut())
            .pop()
            .expect("one trajectory played"))
    }

    /// Whole trajectories' rollouts played together, [`EPISODES_TOGETHER`] at most a batch,
    /// where the policy batches.
    fn annotate_together(&self, sols: &[Solution], done: &mut Done<'_>) -> Option<Result<()>> {
        let mut batch = self.policy.batch()?;
        let mut run = || -> Result<()> {
            let (mut forked, mut which, mut episodes) = (Vec::new(), Vec::new(), 0);
            for (i, sol) in sols.iter().enumerate() {
                match self.prepare(sol) {
                    Ok(f) => {
                        episodes += f.states.len() * self.rollouts;
                        forked.push(f);
                        which.push(i);
                    }
                    Err(e) => done(i, Err(e))?,
                }
                if episodes >= EPISODES_TOGETHER || i + 1 == sols.len() {
                    let played = self.play(std::mem::take(&mut forked), Some(batch.as_mut()));
                    for (i, labelled) in which.drain(..).zip(played) {
                        done(i, Ok(labelled))?;
                    }
                    episodes = 0;
                }
            }
            Ok(())
        };
        Some(run())
    }
}

/// What the rollouts `played` cost (rollouts, tokens, environment steps) added to `spent`.
pub(crate) fn add_played(spent: &mut Spent, played: &[Played]) {
    spent.rollouts += played.len();
    spent.tokens += played.iter().map(|p| p.tokens).sum::<usize>();
    spent.env_steps += played.iter().map(|p| p.env_steps).sum::<usize>();
}

/// The seed of rollout `j` from the state after action `i` of the trajectory keyed `key`.
pub(crate) fn rollout_seed(key: u64, i: usize, j: usize) -> u64 {
    key ^ ((i as u64) << 32 | j as u64).wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// `n` episodes played on by `policy` from `ep`, the state after action `i` of a trajectory whose
/// turns so far are `turns` (`(i, n)`), each with at most `budget` more actions and its own seed
/// from `key`, `i` and its index, so Monte Carlo and binary search probe a state with the same
/// draws; played together ([`continue_episodes`]: one batch a turn where the policy batches).
pub(crate) fn roll_out(
    policy: &dyn Policy,
    question: &str,
    turns: &[String],
    ep: &dyn Episode,
    (i, n): (usize, usize),
    budget: usize,
    key: u64,
) -> Result<Vec<Played>> {
    let mut forks: Vec<Box<dyn Episode>> = (0..n).map(|_| ep.fork()).collect::<Result<_>>()?;
    let playing = (forks.iter_mut().enumerate())
        .map(|(j, f)| Continuing::new(question, turns.to_vec(), f.as_mut(), budget, rollout_seed(key, i, j)))
        .collect();
    Ok(continue_episodes(policy, playing))
}

/// TD(λ)/GAE labels from a learned value: `values[i]` is V of the state after step `i` (a PRM's
/// score at step `i` is the chance of success from there), `v0` the value of the start. The
/// episode's outcome is the only reward (1 for success, at its last step); a trajectory that
/// ended without an outcome (it failed) bootstraps from its last value. Returns each step's
/// promise Q (its λ-return) and progress A = Q - V(state before it).
pub fn td_targets(values: &[f32], v0: f32, outcome: Option<bool>, gamma: f32, lambda: f32) -> Vec<(f32, f32)> {
    let t = values.len();
    let mut q = vec![0f32; t];
    for i in (0..t).rev() {
        q[i] = if i + 1 == t {
            match outcome {
                Some(success) => f32::from(u8::from(success)),
                None => gamma * values[i],
            }
        } else {
            gamma * ((1.0 - lambda) * values[i] + lambda * q[i + 1])
        };
    }
    (0..t)
        .map(|i| {
            let before = if i == 0 { v0 } else { values[i - 1] };
            (q[i].clamp(0.0, 1.0), q[i] - before)
        })
        .collect()
}

/// [`td_targets`] as an annotator: the values are the trajectory's `scores[values]` (score the
/// trajectories with a PRM first), the start's value `v0` (the mean outcome is a fair choice).
pub struct TemporalDifference {
    /// Which of the trajectory's scores are the values.
    pub values: String,
    /// The value of an episode's first state.
    pub v0: f32,
    /// The discount.
    pub gamma: f32,
    /// TD(λ)'s λ: 0 bootstraps from the next state, 1 is the Monte Carlo return.
    pub lambda: f32,
}

impl Annotator for TemporalDifference {
    fn name(&self) -> &str {
        "td"
    }

    fn annotate(&self, sol: &Solution) -> Result<(Solution, Spent)> {
        // λ = 1 reads no value but a truncated trajectory's last: each action's discounted
        // return in its own trajectory (the targets a value model learns from).
        let values = match sol.scores_of(&self.values) {
            Some(v) => v,
            None if self.lambda == 1.0 && sol.correct.is_some() => {
                // The state after step i is worth the next step's return: the progress of any
                // step past the first is then 0, which is all one trajectory can say.
                let n = sol.steps.len();
                let returns = td_targets(&vec![0.0; n], self.v0, sol.correct, self.gamma, 1.0);
                (0..n).map(|i| returns.get(i + 1).map_or(0.0, |r| r.0)).collect()
            }
            None => bail!(
                "trajectory `{}`: field `scores.{}`: missing (score the trajectories with `stepwise score` first; \
                 with lambda 1 only trajectories with an outcome need none)",
                sol.id,
                self.values
            ),
        };
        let mut out = sol.clone();
        for (st, (promise, progress)) in
            out.steps
                .iter_mut()
                .zip(td_targets(&values, self.v0, sol.correct, self.gamma, self.lambda))
        {
            let source = Provenance::TemporalDifference {
                gamma: self.gamma,
                lambda: self.lambda,
                progress,
            };
            st.label = Some(StepLabel::soft(promise, source));
        }
        Ok((out, Spent::default()))
    }
}

/// `sol` with each action's *progress* as its soft label: the GAE advantage that TD labels keep
/// in `source.progress` (A = Q − V, in [−1, 1]) mapped to `(A + 1) / 2`, the targets of a
/// progress head, which `train-prm --target progress` trains as it trains any PRM (read its
/// score `s` as `A = 2s − 1`). A step without a TD label is refused, naming the trajectory and
/// the step.
pub fn progress_targets(sol: &Solution) -> Result<Solution> {
    let mut out = sol.clone();
    for (i, st) in out.steps.iter_mut().enumerate() {
        let Some(label) = &st.label else { continue };
        let Provenance::TemporalDifference { progress, .. } = label.source else {
            bail!(
                "trajectory `{}`: step {i}: field `label.source.progress`: missing (not a TD label; label the \
                 trajectories with `stepwise agent label --method td` first)",
                sol.id
            );
        };
        let source = label.source.clone();
        st.label = Some(StepLabel::soft(((progress + 1.0) / 2.0).clamp(0.0, 1.0), source));
    }
    Ok(out)
}

/// The labels `train-prm` learns for `target`: `promise` (each step's label as it is) or
/// `progress` ([`progress_targets`]).
pub fn training_targets(target: &str, solutions: Vec<Solution>) -> Result<Vec<Solution>> {
    match target {
        "promise" => Ok(solutions),
        "progress" => solutions.iter().map(progress_targets).collect(),
        other => bail!("target `{other}`: use promise or progress"),
    }
}

/// The settings of [`by_name`]'s methods.
#[derive(Debug, Clone)]
pub struct How {
    /// `mc`: rollouts from each state; `binary`: from each probed state.
    pub rollouts: usize,
    /// `td`: which scores are the values.
    pub values: String,
    /// `td` and `mc`: the discount.
    pub gamma: f32,
    /// `td`: λ.
    pub lambda: f32,
    /// `mc` and `binary`: the seed.
    pub seed: u64,
}

/// The annotator `method` names (`oracle`, `mc` or `binary` with `policy`, `td`) over `games`; `td` takes
/// the start's value to be the mean outcome of `sols`.
pub fn by_name<'a>(
    method: &str,
    games: &'a Games<'a>,
    policy: Option<&'a dyn Policy>,
    sols: &[Solution],
    how: &How,
) -> Result<Box<dyn Annotator + 'a>> {
    Ok(match (method, policy) {
        ("oracle", _) => Box::new(Oracle(games)),
        ("mc", Some(policy)) => Box::new(MonteCarlo {
            games,
            policy,
            rollouts: how.rollouts,
            seed: how.seed,
            gamma: how.gamma,
        }),
        ("binary", Some(policy)) => Box::new(crate::BinarySearch {
            games,
            policy,
            rollouts: how.rollouts,
            seed: how.seed,
        }),
        (m @ ("mc" | "binary"), None) => bail!("labelling by {m} rolls out with a policy: give one"),
        ("td", _) => {
            let outcomes: Vec<f32> = sols
                .iter()
                .filter_map(|s| s.correct)
                .map(|c| f32::from(u8::from(c)))
                .collect();
            Box::new(TemporalDifference {
                values: how.values.clone(),
                v0: outcomes.iter().sum::<f32>() / outcomes.len().max(1) as f32,
                gamma: how.gamma,
                lambda: how.lambda,
            })
        }
        (m, _) => bail!("unknown labelling method `{m}` (oracle, mc, binary or td)"),
    })
}

#[cfg(test)]
mod tests {
    use super::{progress_targets, td_targets};

    #[test]
    fn td_lambda_spans_one_step_bootstrap_to_the_monte_carlo_return() {
        let v = [0.2, 0.6, 0.9];
        // λ = 1: the discounted outcome, whatever the values say.
        let mc = td_targets(&v, 0.5, Some(true), 0.9, 1.0);
        let want = [0.81f32, 0.9, 1.0];
        for ((q, _), w) in mc.iter().zip(want) {
            assert!((q - w).abs() < 1e-6, "{q} vs {w}");
        }
        // λ = 0: one step, then the value of the next state.
        let td0 = td_targets(&v, 0.5, Some(false), 1.0, 0.0);
        assert_eq!(td0.iter().map(|x| x.0).collect::<Vec<_>>(), [0.2, 0.6, 0.0]);
        // Progress is the promise gained over the state before.
        assert!((td0[0].1 - (0.2 - 0.5)).abs() < 1e-6);
        assert!((td0[2].1 - (0.0 - 0.6)).abs() < 1e-6);
        // No outcome: the last step bootstraps from its own value.
        assert!((td_targets(&v, 0.5, None, 1.0, 0.5)[2].0 - 0.9).abs() < 1e-6);
    }

    #[test]
    fn progress_targets_map_the_advantage_into_a_soft_label() {
        use stepwise_core::{Provenance, Solution, Step, StepLabel};
        let td = |progress: f32| {
            let source = Provenance::TemporalDifference {
                gamma: 0.9,
                lambda: 0.5,
                progress,
            };
            Step {
                label: Some(StepLabel::soft(0.7, source)),
                ..Default::default()
            }
        };
        let sol = Solution {
            id: "t1".into(),
            steps: vec![td(0.4), td(-1.0), Step::default()],
            ..Default::default()
        };
        let got = progress_targets(&sol).unwrap();
        let p: Vec<Option<f32>> = got
            .steps
            .iter()
            .map(|s| s.label.as_ref().map(|l| l.prob(0.5)))
            .collect();
        assert_eq!(
            p,
            [Some(0.7), Some(0.0), None],
            "(A + 1) / 2; an unlabelled step stays so"
        );
        let mut oracle = sol.clone();
        oracle.steps[1].label = Some(StepLabel::soft(0.5, Provenance::default()));
        let e = progress_targets(&oracle).unwrap_err().to_string();
        assert!(
            e.contains("trajectory `t1`: step 1: field `label.source.progress`"),
            "{e}"
        );
    }
}
