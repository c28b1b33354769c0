//! A fixture policy for rooms worlds, for runs and tests with no model: with probability `skill`
//! it takes an action that brings the goal nearest, otherwise any action the world's words allow
//! (valid or not, useful or ruinous). It reads only what a model would, the question and the
//! turns so far, and finds the world by replaying them.

use super::rules::{apply, candidates, distance, parse, render, Action};
use super::{world_of, State, World};
use anyhow::{Context, Result};
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::sync::Mutex;

/// Distances to the goal found so far in one world.
type Memo = Mutex<super::Distances>;
use stepwise_core::record::OBSERVATION_MARK;
use stepwise_core::seams::{Continuation, Policy, Until};
use stepwise_core::Problem;

/// The noisy expert.
pub struct Expert {
    /// The worlds by question, each with the distances found so far.
    worlds: HashMap<String, Vec<(World, Memo)>>,
    /// Chance of the best action at each turn.
    pub skill: f64,
}

impl Expert {
    /// An expert for the worlds of `problems` (their `meta.world`).
    pub fn new(problems: &[Problem], skill: f64) -> Result<Expert> {
        let mut worlds: HashMap<String, Vec<(World, Memo)>> = HashMap::new();
        for p in problems {
            let w = world_of(p)?;
            let first = super::rules::describe(&w, &w.initial());
            worlds
                .entry(crate::rollout::prompt(&p.question, &first))
                .or_default()
                .push((w, Memo::default()));
        }
        Ok(Expert { worlds, skill })
    }

    /// The world and state a question and its turns so far lead to.
    fn locate(&self, question: &str, prefix: &[&str]) -> Result<(&World, &Memo, State)> {
        let candidates = self
            .worlds
            .get(question)
            .context("the expert knows no world with this question")?;
        'worlds: for (w, memo) in candidates {
            let mut s = w.initial();
            for turn in prefix {
                let (action, seen) = turn.split_once(OBSERVATION_MARK).unwrap_or((turn, ""));
                if let Some(a) = parse(w, action) {
                    let e = apply(w, &s, a);
                    if !seen.starts_with(&e.message) {
                        continue 'worlds;
                    }
                    s = e.state;
                }
            }
            return Ok((w, memo, s));
        }
        anyhow::bail!("no world of this question matches the turns so far")
    }

    /// One action in `s`.
    fn act(&self, w: &World, memo: &Memo, s: &State, rng: &mut ChaCha8Rng) -> String {
        // Only the silent world asks after the goal is reached: the best action is to stop.
        if w.reached(s) && rng.random_bool(self.skill) {
            return String::new();
        }
        if rng.random_bool(self.skill) {
            let mut memo = memo.lock().unwrap_or_else(|e| e.into_inner());
            let relevant = w.relevant_items();
            let best = candidates(w, s, &relevant)
                .into_iter()
                .map(|a| (a, apply(w, s, a)))
                .filter(|(_, e)| e.valid)
                .filter_map(|(a, e)| distance(w, &e.state, &mut memo).map(|d| (d, a)))
                .min_by_key(|(d, _)| *d);
            if let Some((_, a)) = best {
                return render(w, a);
            }
        }
        let (ni, nc) = (w.items.len(), w.containers.len());
        let mut any: Vec<Action> = vec![Action::Look, Action::Inventory];
        any.extend((0..4).map(Action::Go));
        for i in 0..ni {
            any.extend([Action::Take(i), Action::Drop(i), Action::Eat(i)]);
            any.extend((0..nc).flat_map(|c| [Action::Put(i, c), Action::Unlock(c, i)]));
        }
        any.extend((0..nc).flat_map(|c| [Action::Open(c), Action::Close(c)]));
        render(w, *any.choose(rng).unwrap_or(&Action::Look))
    }
}

impl Policy for Expert {
    fn continue_from(
        &self,
        question: &str,
        prefix: &[&str],
        n: usize,
        until: Until,
        seed: u64,
    ) -> Result<Vec<Continuation>> {
        let (w, memo, s) = self.locate(question, prefix)?;
        (0..n)
            .map(|j| {
                let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (j as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                let action = self.act(w, memo, &s, &mut rng);
                if until == Until::End {
                    anyhow::bail!("the expert plays one action at a time (Until::Step)");
                }
                Ok(Continuation {
                    steps: vec![action.clone()],
                    tokens: action.split_whitespace().count().max(1),
                    finished: action.is_empty(),
                    text: action,
                    token_ids: Vec::new(),
                })
            })
            .collect()
    }
}
