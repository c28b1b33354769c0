//! Binary search for the first dead action: Luo et al.'s (2024) binary search for a solution's
//! first error, on an agent's actions. A state is *alive* when any of K rollouts of the policy
//! from it reaches the goal; taking the start to be alive and a dead state to stay dead, the
//! first action after which the state is dead is found in ⌈log2(n + 1)⌉ probes instead of Monte
//! Carlo's n. Every action before it is labelled 1 (the goal was still within the policy's
//! reach), the first dead one 0, and the actions after it are left unlabelled (as Math-Shepherd's
//! and OmegaPRM's labels stop at the first error). A trajectory that reached the goal is its own
//! successful continuation from every state: every action is labelled 1 with no rollouts, lucky
//! successes included (binary search cannot see a bad action that was repaired).

use crate::labels::{roll_out, Games, Replay};
use anyhow::Result;
use stepwise_core::seams::{Annotator, Policy, Spent};
use stepwise_core::{Provenance, Solution, StepLabel};

/// The binary-search annotator (`stepwise agent label --method binary`).
pub struct BinarySearch<'a> {
    /// The trajectories' problems.
    pub games: &'a Games<'a>,
    /// The policy that plays on.
    pub policy: &'a dyn Policy,
    /// Rollouts per probed state.
    pub rollouts: usize,
    /// Seed; each trajectory, step and rollout derives its own as Monte Carlo's do, so both probe
    /// a state with the same draws.
    pub seed: u64,
}

impl BinarySearch<'_> {
    /// The first action after which no rollout reaches the goal (`None`: none), and the cost.
    fn first_dead(&self, sol: &Solution, r: &Replay, spent: &mut Spent) -> Result<Option<usize>> {
        let question = crate::rollout::prompt(&self.games.problem(sol)?.question, &r.first);
        let turns = sol.turn_strings();
        let key = self.seed ^ crate::rollout::fnv(&sol.id);
        let n = sol.steps.len();
        let mut alive = |i: usize| -> Result<bool> {
            // An episode the last action ended (it failed: a success never gets here) is dead.
            if i + 1 == n && r.ended {
                return Ok(false);
            }
            let budget = self.games.env.max_actions().saturating_sub(i + 1);
            let played = roll_out(
                self.policy,
                &question,
                &turns[..=i],
                r.after(i),
                (i, self.rollouts),
                budget,
                key,
            )?;
            spent.rollouts += played.len();
            spent.tokens += played.iter().map(|p| p.tokens).sum::<usize>();
            spent.env_steps += played.iter().map(|p| p.env_steps).sum::<usize>();
            Ok(played.iter().any(|p| p.success()))
        };
        let (mut lo, mut hi) = (0usize, n);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if alive(mid)? {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Ok((lo < n).then_some(lo))
    }
}

impl Annotator for BinarySearch<'_> {
    fn name(&self) -> &str {
        "binary"
    }

    fn annotate(&self, sol: &Solution) -> Result<(Solution, Spent)> {
        let mut spent = Spent::default();
        let dead = if sol.correct == Some(true) {
            None
        } else {
            let r = self.games.replay(sol)?;
            spent.env_steps += sol.steps.len();
            self.first_dead(sol, &r, &mut spent)?
        };
        let mut out = sol.clone();
        for (i, st) in out.steps.iter_mut().enumerate() {
            st.label = match dead {
                Some(d) if i > d => None,
                Some(d) if i == d => Some(StepLabel::soft(0.0, Provenance::BinarySearch)),
                _ => Some(StepLabel::soft(1.0, Provenance::BinarySearch)),
            };
        }
        out.meta.insert("first_dead".into(), serde_json::json!(dead));
        Ok((out, spent))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rooms::{problem, Expert, Rooms};
    use crate::{play, MonteCarlo};

    /// A few of the rooms world's problems, two trajectories of each by a poor expert, and a
    /// better expert to roll out.
    fn setup(env: &Rooms) -> (Games<'_>, Expert, Vec<Solution>) {
        let problems: Vec<_> = (0..8).map(|i| problem(3, i)).collect();
        let expert = Expert::new(&problems, 0.3).unwrap();
        let trajs = problems
            .iter()
            .flat_map(|p| (0..2).map(move |j| (p, j)))
            .map(|(p, j)| play(&expert, env, p, format!("{}-{j}", p.id), j as u64 * 7 + 1))
            .collect();
        let roller = Expert::new(&problems, 0.6).unwrap();
        (Games::new(env, problems), roller, trajs)
    }

    fn search<'a>(games: &'a Games<'a>, roller: &'a Expert, seed: u64) -> BinarySearch<'a> {
        BinarySearch {
            games,
            policy: roller,
            rollouts: 2,
            seed,
        }
    }

    #[test]
    fn labels_stop_at_the_first_dead_action_and_cost_fewer_rollouts_than_monte_carlo() {
        let env = Rooms::new(12);
        let (games, roller, trajs) = setup(&env);
        let bs = search(&games, &roller, 1);
        let mc = MonteCarlo {
            games: &games,
            policy: &roller,
            rollouts: 2,
            seed: 1,
            gamma: 1.0,
        };
        let (mut bs_rollouts, mut mc_rollouts, mut cut) = (0, 0, 0);
        for t in &trajs {
            let (b, spent) = bs.annotate(t).unwrap();
            bs_rollouts += spent.rollouts;
            mc_rollouts += mc.annotate(t).unwrap().1.rollouts;
            let labels: Vec<Option<f32>> = b
                .steps
                .iter()
                .map(|s| match s.label.as_ref().map(|l| &l.value) {
                    Some(stepwise_core::LabelValue::Soft { p }) => Some(*p),
                    _ => None,
                })
                .collect();
            match b.meta["first_dead"].as_u64() {
                None => assert!(labels.iter().all(|l| *l == Some(1.0)), "{labels:?}"),
                Some(d) => {
                    let d = d as usize;
                    cut += 1;
                    assert!(labels[..d].iter().all(|l| *l == Some(1.0)), "{labels:?}");
                    assert_eq!(labels[d], Some(0.0));
                    assert!(labels[d + 1..].iter().all(Option::is_none), "{labels:?}");
                }
            }
            if t.correct == Some(true) {
                assert_eq!(spent.rollouts, 0);
                assert!(b.meta["first_dead"].is_null());
            }
        }
        assert!(cut > 0, "no trajectory had a dead action");
        assert!(bs_rollouts < mc_rollouts, "{bs_rollouts} against {mc_rollouts}");
    }

    #[test]
    fn the_same_seed_gives_the_same_labels() {
        let env = Rooms::new(12);
        let (games, roller, trajs) = setup(&env);
        let bs = search(&games, &roller, 4);
        for t in &trajs {
            assert_eq!(bs.annotate(t).unwrap().0, bs.annotate(t).unwrap().0);
        }
    }
}
