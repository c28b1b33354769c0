//! Every search method against a brute-force reference on tiny trees, through the seams with no
//! model: beam search as wide as the tree equals exhaustive search, DVTS with one subtree equals
//! greedy search, lookahead escapes the trap greedy search falls into, verify → resample rejects
//! exactly the steps below τ and counts what it spent.

use anyhow::Result;
use std::sync::atomic::{AtomicUsize, Ordering};
use stepwise_core::seams::{Continuation, Policy, ScoreInput, Until};
use stepwise_core::testing::FnScorer;
use stepwise_search::{method, search, Aggregation, SearchConfig};

/// A complete tree of depth `depth` and branching `branch`: the `j`-th continuation of a prefix
/// takes branch `j % branch`. Step texts name their path (`"s 0 1"`: branch 0, then branch 1).
struct Tree {
    depth: usize,
    branch: usize,
}

impl Tree {
    fn step(prefix: &[&str], b: usize) -> String {
        match prefix.last() {
            Some(last) => format!("{last} {b}"),
            None => format!("s {b}"),
        }
    }
}

impl Policy for Tree {
    fn continue_from(
        &self,
        _q: &str,
        prefix: &[&str],
        n: usize,
        until: Until,
        _seed: u64,
    ) -> Result<Vec<Continuation>> {
        Ok((0..n)
            .map(|j| {
                let mut steps: Vec<String> = Vec::new();
                let mut path: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
                while path.len() < self.depth {
                    let refs: Vec<&str> = path.iter().map(String::as_str).collect();
                    let s = Tree::step(&refs, (j + path.len()) % self.branch);
                    steps.push(s.clone());
                    path.push(s);
                    if until == Until::Step {
                        break;
                    }
                }
                Continuation {
                    tokens: steps.len() * 2,
                    text: steps.join("\n"),
                    finished: path.len() >= self.depth,
                    steps,
                    token_ids: Vec::new(),
                }
            })
            .collect())
    }
}

/// A deterministic pseudo-random score in (0, 1) for a step text.
fn hash_score(s: &str) -> f32 {
    let mut h: u64 = 1469598103934665603;
    for b in s.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(1099511628211);
    }
    ((h >> 11) % 1000) as f32 / 1000.0 + 0.0005
}

fn scorer() -> FnScorer<impl Fn(&ScoreInput<'_>) -> Vec<f32> + Sync> {
    FnScorer(|i: &ScoreInput<'_>| i.steps.iter().map(|s| hash_score(s)).collect())
}

/// All leaves of the tree.
fn leaves(t: &Tree) -> Vec<Vec<String>> {
    let mut paths = vec![Vec::<String>::new()];
    for _ in 0..t.depth {
        paths = paths
            .into_iter()
            .flat_map(|p| {
                (0..t.branch).map(move |b| {
                    let refs: Vec<&str> = p.iter().map(String::as_str).collect();
                    let mut q = p.clone();
                    q.push(Tree::step(&refs, b));
                    q
                })
            })
            .collect();
    }
    paths
}

fn value(path: &[String], how: Aggregation) -> f32 {
    let s: Vec<f32> = path.iter().map(|s| hash_score(s)).collect();
    stepwise_search::aggregate(&s, how)
}

#[test]
fn beam_search_as_wide_as_the_tree_is_exhaustive_search() {
    let tree = Tree { depth: 3, branch: 3 };
    for how in Aggregation::ALL {
        let best = leaves(&tree)
            .into_iter()
            .max_by(|a, b| value(a, how).total_cmp(&value(b, how)))
            .unwrap();
        // N / M = 9 beams kept: nothing of the 3 × 3 second level is pruned.
        let config = SearchConfig {
            n: 27,
            width: 3,
            max_steps: 3,
            aggregation: how,
            ..Default::default()
        };
        let got = search(&*method("beam").unwrap(), &config, "p", "q", &tree, &scorer()).unwrap();
        assert_eq!(got.chosen.steps, best, "{how:?}");
        assert!((got.chosen.value(how) - value(&best, how)).abs() < 1e-6);
        assert_eq!(got.compute.generated_tokens, 3 * 27 * 2, "N steps per round");
        assert_eq!(got.compute.scorer_calls, 3);
        assert_eq!(got.candidates, 27);
    }
}

/// Greedy search by hand: at each depth, the best child by the aggregation (ties: the first
/// drawn; the j-th draw takes branch (j + depth) % branch).
fn greedy(t: &Tree, how: Aggregation) -> Vec<String> {
    let mut path: Vec<String> = Vec::new();
    while path.len() < t.depth {
        let refs: Vec<&str> = path.iter().map(String::as_str).collect();
        let mut best: Option<Vec<String>> = None;
        for j in 0..t.branch {
            let mut q = path.clone();
            q.push(Tree::step(&refs, (j + path.len()) % t.branch));
            if best.as_ref().is_none_or(|b| value(&q, how) > value(b, how)) {
                best = Some(q);
            }
        }
        path = best.unwrap();
    }
    path
}

#[test]
fn dvts_with_one_subtree_is_greedy_search_and_more_subtrees_never_do_worse() {
    let tree = Tree { depth: 4, branch: 3 };
    for how in Aggregation::ALL {
        let one = SearchConfig {
            n: 3,
            width: 3,
            max_steps: 4,
            aggregation: how,
            ..Default::default()
        };
        let got = search(&*method("dvts").unwrap(), &one, "p", "q", &tree, &scorer()).unwrap();
        assert_eq!(got.chosen.steps, greedy(&tree, how), "{how:?}");
        assert_eq!(got.compute.generated_tokens, 4 * 3 * 2);
        // With the same draws in every subtree (this policy ignores the seed), four subtrees
        // find the same path: DVTS's diversity comes from the policy's sampling.
        let four = SearchConfig { n: 12, ..one.clone() };
        let got4 = search(&*method("dvts").unwrap(), &four, "p", "q", &tree, &scorer()).unwrap();
        assert_eq!(got4.candidates, 4);
        assert_eq!(got4.chosen.steps, got.chosen.steps);
        assert_eq!(got4.compute.generated_tokens, 4 * got.compute.generated_tokens);
    }
}

/// A trap: branch 0 starts with the best step and leads only to bad ones.
fn trap_scorer() -> FnScorer<impl Fn(&ScoreInput<'_>) -> Vec<f32> + Sync> {
    FnScorer(|i: &ScoreInput<'_>| {
        i.steps
            .iter()
            .map(|s| match *s {
                "s 0" => 0.9,
                "s 1" => 0.6,
                _ if s.starts_with("s 0") => 0.1,
                _ => 0.8,
            })
            .collect()
    })
}

#[test]
fn lookahead_sees_past_a_step_that_looks_good_and_leads_nowhere() {
    let tree = Tree { depth: 3, branch: 2 };
    let config = SearchConfig {
        n: 2,
        width: 2,
        max_steps: 3,
        aggregation: Aggregation::Min,
        lookahead: 1,
        ..Default::default()
    };
    let beam = search(&*method("beam").unwrap(), &config, "p", "q", &tree, &trap_scorer()).unwrap();
    assert_eq!(beam.chosen.steps[0], "s 0", "one beam follows the best-looking step");
    assert!((beam.chosen.value(Aggregation::Min) - 0.1).abs() < 1e-6);
    let ahead = search(&*method("lookahead").unwrap(), &config, "p", "q", &tree, &trap_scorer()).unwrap();
    assert_eq!(ahead.chosen.steps[0], "s 1");
    assert!((ahead.chosen.value(Aggregation::Min) - 0.6).abs() < 1e-6);
    assert_eq!(ahead.chosen.scores.len(), 3, "scores of its own steps only");
    // Every open candidate's rollout costs one greedy step more than beam search writes.
    assert!(ahead.compute.generated_tokens > beam.compute.generated_tokens);
}

/// A policy that writes step `k` as `"k bad"` on its first `bad_draws` draws of that step, then
/// as `"k"`; three steps make a solution. Each step written costs one token.
struct Flaky {
    bad_draws: usize,
    draws: [AtomicUsize; 3],
}

impl Policy for Flaky {
    fn continue_from(
        &self,
        _q: &str,
        prefix: &[&str],
        n: usize,
        until: Until,
        _seed: u64,
    ) -> Result<Vec<Continuation>> {
        Ok((0..n)
            .map(|_| {
                let last = if until == Until::Step { prefix.len() } else { 2 };
                let steps: Vec<String> = (prefix.len()..=last)
                    .map(|k| {
                        let d = self.draws[k].fetch_add(1, Ordering::SeqCst);
                        if d < self.bad_draws {
                            format!("{k} bad")
                        } else {
                            format!("{k}")
                        }
                    })
                    .collect();
                Continuation {
                    tokens: steps.len(),
                    text: steps.join("\n"),
                    finished: last == 2,
                    steps,
                    token_ids: Vec::new(),
                }
            })
            .collect())
    }
}

fn flaky(bad_draws: usize) -> Flaky {
    Flaky {
        bad_draws,
        draws: Default::default(),
    }
}

#[test]
fn verify_then_resample_rejects_the_steps_below_tau_within_its_budget() {
    let checker = FnScorer(|i: &ScoreInput<'_>| {
        i.steps
            .iter()
            .map(|s| if s.contains("bad") { 0.2 } else { 0.9 })
            .collect()
    });
    let resample = method("resample").unwrap();
    let config = SearchConfig {
        threshold: 0.5,
        max_resamples: 4,
        resample_budget: 16,
        max_steps: 10,
        ..Default::default()
    };
    // Two bad draws per step: each step is resampled twice, then accepted.
    let got = search(&*resample, &config, "p", "q", &flaky(2), &checker).unwrap();
    assert_eq!(got.chosen.steps, ["0", "1", "2"]);
    assert_eq!(got.compute.rejected_steps, 6);
    assert_eq!(got.compute.generated_tokens, 9);
    assert_eq!(got.candidates, 1);
    // At most one resample per step: both attempts fail, the first (as good as the second) is
    // kept and the rest is written in one go, unverified.
    let one = SearchConfig {
        max_resamples: 1,
        ..config.clone()
    };
    let got = search(&*resample, &one, "p", "q", &flaky(2), &checker).unwrap();
    assert_eq!(got.chosen.steps, ["0 bad", "1 bad", "2 bad"]);
    assert_eq!(got.compute.rejected_steps, 1);
    assert_eq!(got.compute.generated_tokens, 4);
    assert_eq!(got.chosen.scores, [0.2, 0.2, 0.2]);
    // A budget of three resamples for the whole problem: the first step uses two, the second one
    // and gives up.
    let budget = SearchConfig {
        resample_budget: 3,
        ..config.clone()
    };
    let got = search(&*resample, &budget, "p", "q", &flaky(2), &checker).unwrap();
    assert_eq!(got.chosen.steps, ["0", "1 bad", "2 bad"]);
    assert_eq!(got.compute.rejected_steps, 3);
    // τ = 0 accepts every step: a single sample.
    let accept = SearchConfig {
        threshold: 0.0,
        ..config
    };
    let got = search(&*resample, &accept, "p", "q", &flaky(2), &checker).unwrap();
    assert_eq!(got.chosen.steps, ["0 bad", "1 bad", "2 bad"]);
    assert_eq!(got.compute.rejected_steps, 0);
}

#[test]
fn best_of_n_picks_what_the_selector_picks() {
    let tree = Tree { depth: 3, branch: 3 };
    for how in Aggregation::ALL {
        let config = SearchConfig {
            n: 3,
            aggregation: how,
            max_steps: 3,
            ..Default::default()
        };
        let got = search(&*method("bon").unwrap(), &config, "p", "q", &tree, &scorer()).unwrap();
        // The j-th sample takes branches j, j + 1, j + 2 (mod 3).
        let samples: Vec<Vec<String>> = (0..3)
            .map(|j| {
                let c = tree.continue_from("q", &[], j + 1, Until::End, 0).unwrap();
                c[j].steps.clone()
            })
            .collect();
        let best = samples
            .iter()
            .max_by(|a, b| {
                value(a, how)
                    .total_cmp(&value(b, how))
                    .then(std::cmp::Ordering::Greater)
            })
            .unwrap();
        assert_eq!(&got.chosen.steps, best, "{how:?}");
        assert_eq!(got.compute.policy_calls, 1);
        assert_eq!(got.compute.generated_tokens, 3 * 3 * 2);
    }
    assert!(method("mcts").is_err());
}

/// Beam search and DVTS through a policy that batches: every round's beams in one call, and the
/// same search as one call a beam.
#[test]
fn a_rounds_beams_are_expanded_in_one_batch_call() {
    for (name, beams) in [("beam", 3), ("dvts", 3)] {
        let config = SearchConfig {
            n: 9,
            width: 3,
            max_steps: 3,
            ..Default::default()
        };
        let tree = || Tree { depth: 3, branch: 3 };
        let batching = stepwise_core::testing::Batching::new(tree());
        let m = method(name).unwrap();
        let alone = search(&*m, &config, "p", "q", &tree(), &scorer()).unwrap();
        let together = search(&*m, &config, "p", "q", &batching, &scorer()).unwrap();
        assert_eq!(together.chosen.steps, alone.chosen.steps, "{name}");
        assert_eq!(together.compute.generated_tokens, alone.compute.generated_tokens);
        assert_eq!(together.compute.policy_calls, alone.compute.policy_calls);
        // The first round asks before the batch is opened (a method that calls the policy once
        // keeps no cache); the two after it ask for their `beams` beams at once.
        let calls = batching.calls();
        assert_eq!(calls, [beams, beams], "{name}: one call a round");
    }
}

/// Lookahead through a policy that batches: a round's greedy rollouts step together, one call
/// a step for all of them, and the search is the one made a call a rollout step.
#[test]
fn a_rounds_lookahead_rollouts_step_in_one_batch_call() {
    let config = SearchConfig {
        n: 9,
        width: 3,
        max_steps: 3,
        lookahead: 2,
        ..Default::default()
    };
    let tree = || Tree { depth: 3, branch: 3 };
    let batching = stepwise_core::testing::Batching::new(tree());
    let m = method("lookahead").unwrap();
    let alone = search(&*m, &config, "p", "q", &tree(), &scorer()).unwrap();
    let together = search(&*m, &config, "p", "q", &batching, &scorer()).unwrap();
    assert_eq!(together.chosen.steps, alone.chosen.steps);
    assert_eq!(together.compute.generated_tokens, alone.compute.generated_tokens);
    assert_eq!(together.compute.policy_calls, alone.compute.policy_calls);
    // Every ask after the first round's expansion went through the batch, many a call.
    let calls = batching.calls();
    assert_eq!(calls.iter().sum::<usize>(), alone.compute.policy_calls - 1, "{calls:?}");
    assert!(calls.len() * 3 <= alone.compute.policy_calls, "{calls:?}");
}
