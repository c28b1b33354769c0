//! Binary search for the first dead action: Luo et al.'s (2024) binary search for a solution's
//! first error, on an agent's actions. A state is *alive* when any of K rollouts of the policy
//! from it reaches the goal; taking the start to be alive and a dead state to stay dead, the
//! first action after which the state is dead is found in ⌈log2(n + 1)⌉ probes instead of Monte
//! Carlo's n. Every action before it is labelled 1 (the goal was still within the policy's
//! reach), the first dead one 0, and the actions after it are left unlabelled (as Math-Shepherd's
//! and OmegaPRM's labels stop at the first error). A trajectory that reached the goal is its own
//! successful continuation from every state: every action is labelled 1 with no rollouts, lucky
//! successes included (binary search cannot see a bad action that was repaired).

use crate::labels::{add_played, roll_out, rollout_seed, Games, Replay, EPISODES_TOGETHER};
use crate::rollout::{continue_episodes_on, Continuing, Played};
use anyhow::Result;
use stepwise_core::seams::{Annotator, Done, Episode, Policy, PolicyBatch, Spent};
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

/// One trajectory's search: the actions `lo..hi` hold its first dead one (`n`: none).
struct Search<'s> {
    sol: &'s Solution,
    /// Its replay (`None`: it reached the goal, and every action is alive).
    replay: Option<Replay>,
    question: String,
    turns: Vec<String>,
    key: u64,
    lo: usize,
    hi: usize,
    spent: Spent,
}

impl BinarySearch<'_> {
    /// `sol`'s search, replayed unless it reached the goal.
    fn start<'s>(&self, sol: &'s Solution) -> Result<Search<'s>> {
        let n = sol.steps.len();
        let mut s = Search {
            sol,
            replay: None,
            question: String::new(),
            turns: sol.turn_strings(),
            key: self.seed ^ crate::rollout::fnv(&sol.id),
            lo: n,
            hi: n,
            spent: Spent::default(),
        };
        if sol.correct != Some(true) {
            let r = self.games.replay(sol)?;
            s.spent.env_steps += n;
            s.question = crate::rollout::prompt(&self.games.problem(sol)?.question, &r.first);
            s.lo = 0;
            s.replay = Some(r);
        }
        Ok(s)
    }
}

impl Search<'_> {
    /// The action after which to probe by rollouts next (`None`: the search is over); the state
    /// the replay ended in (a failure: a success never gets here) is dead without rollouts.
    fn next(&mut self) -> Option<usize> {
        while self.lo < self.hi {
            let mid = (self.lo + self.hi) / 2;
            if mid + 1 == self.sol.steps.len() && self.replay.as_ref().is_some_and(|r| r.ended) {
                self.hi = mid;
                continue;
            }
            return Some(mid);
        }
        None
    }

    /// The rollouts `played` from the state after action `mid`: alive where any reached the goal.
    fn observe(&mut self, mid: usize, played: &[Played]) {
        add_played(&mut self.spent, played);
        if played.iter().any(Played::success) {
            self.lo = mid + 1;
        } else {
            self.hi = mid;
        }
    }

    /// The trajectory labelled: 1 before the first dead action, 0 on it, none after.
    fn finish(self) -> (Solution, Spent) {
        let dead = (self.lo < self.sol.steps.len()).then_some(self.lo);
        let mut out = self.sol.clone();
        for (i, st) in out.steps.iter_mut().enumerate() {
            st.label = match dead {
                Some(d) if i > d => None,
                Some(d) if i == d => Some(StepLabel::soft(0.0, Provenance::BinarySearch)),
                _ => Some(StepLabel::soft(1.0, Provenance::BinarySearch)),
            };
        }
        out.meta.insert("first_dead".into(), serde_json::json!(dead));
        (out, self.spent)
    }

    /// The state after action `i`.
    fn state(&self, i: usize) -> &dyn Episode {
        self.replay
            .as_ref()
            .expect("a search that probes was replayed")
            .after(i)
    }
}

impl Annotator for BinarySearch<'_> {
    fn name(&self) -> &str {
        "binary"
    }

    fn annotate(&self, sol: &Solution) -> Result<(Solution, Spent)> {
        let mut s = self.start(sol)?;
        while let Some(mid) = s.next() {
            let turns = &s.turns[..=mid];
            let played = roll_out(
                self.policy,
                &s.question,
                turns,
                s.state(mid),
                (mid, self.rollouts),
                self.games.actions_after(mid),
                s.key,
            )?;
            s.observe(mid, &played);
        }
        Ok(s.finish())
    }

    /// Many trajectories searched at once where the policy batches: a round probes every live
    /// trajectory's next state, all their rollouts played together
    /// ([`crate::rollout::continue_episodes`]), at most [`EPISODES_TOGETHER`] episodes, on one
    /// batch; a new trajectory starts as soon as one is labelled. Each rollout is seeded as
    /// alone, so the labels are the same.
    fn annotate_together(&self, sols: &[Solution], done: &mut Done<'_>) -> Option<Result<()>> {
        let mut batch = self.policy.batch()?;
        Some(self.search_together(batch.as_mut(), sols, done))
    }
}

/// A trajectory probed this round: its index, its search, the action after which it is probed,
/// and that state forked once a rollout.
type Probing<'s> = (usize, Search<'s>, usize, Vec<Box<dyn Episode>>);

impl BinarySearch<'_> {
    /// The rounds of [`Annotator::annotate_together`], all on `batch`: a trajectory's next probe
    /// starts from what its last one cached.
    fn search_together(&self, batch: &mut dyn PolicyBatch, sols: &[Solution], done: &mut Done<'_>) -> Result<()> {
        let at_once = (EPISODES_TOGETHER / self.rollouts.max(1)).max(1);
        let (mut live, mut next): (Vec<(usize, Search)>, usize) = (Vec::new(), 0);
        loop {
            while live.len() < at_once && next < sols.len() {
                match self.start(&sols[next]) {
                    Ok(s) => live.push((next, s)),
                    Err(e) => done(next, Err(e))?,
                }
                next += 1;
            }
            // Each probes its next state (its forks made), or is labelled.
            let mut probing: Vec<Probing> = Vec::new();
            for (i, mut s) in live.drain(..) {
                let Some(mid) = s.next() else {
                    done(i, Ok(s.finish()))?;
                    continue;
                };
                match (0..self.rollouts)
                    .map(|_| s.state(mid).fork())
                    .collect::<Result<Vec<_>>>()
                {
                    Ok(forks) => probing.push((i, s, mid, forks)),
                    Err(e) => done(i, Err(e))?,
                }
            }
            if probing.is_empty() {
                if next < sols.len() {
                    continue;
                }
                return Ok(());
            }
            let playing = (probing.iter_mut())
                .flat_map(|(_, s, mid, forks)| {
                    let (question, turns, key, mid) = (s.question.as_str(), &s.turns[..=*mid], s.key, *mid);
                    let budget = self.games.actions_after(mid);
                    (forks.iter_mut().enumerate()).map(move |(j, f)| {
                        Continuing::new(question, turns.to_vec(), f.as_mut(), budget, rollout_seed(key, mid, j))
                    })
                })
                .collect();
            let mut played = continue_episodes_on(self.policy, Some(&mut *batch), playing).into_iter();
            for (i, mut s, mid, forks) in probing {
                let played: Vec<Played> = played.by_ref().take(forks.len()).collect();
                s.observe(mid, &played);
                live.push((i, s));
            }
        }
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
