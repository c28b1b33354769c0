//! Monte Carlo step labels (Math-Shepherd): from the prefix ending at step i, sample K
//! completions with the policy; the soft label is the fraction that reach the gold answer, the
//! hard label is "any did". Annotation stops at the first step no rollout can rescue: every
//! later step is labelled bad without spending rollouts (an error cannot be undone).

use anyhow::Result;
use rayon::prelude::*;
use std::path::Path;
use stepwise_core::journal::{sort_like, Journal};
use stepwise_core::{Provenance, Solution, StepLabel};

/// Anything that can continue a partial solution: the local engine, a remote server, …
/// `Sync`, so several solutions are annotated at once.
pub trait Policy: Sync {
    /// `k` completions of `question` after `prefix` steps; each completion is the list of the
    /// remaining steps. `seed` makes the draw reproducible.
    fn complete(&self, question: &str, prefix: &[&str], k: usize, seed: u64) -> Result<Vec<Vec<String>>>;
}

/// Options of Monte Carlo annotation.
#[derive(Debug, Clone)]
pub struct McOptions {
    /// Rollouts per step prefix.
    pub rollouts: usize,
    /// Base seed; each (solution, step) gets its own seed derived from it.
    pub seed: u64,
}

fn seed_for(base: u64, id: &str, step: usize) -> u64 {
    let mut h = 0xcbf29ce484222325u64 ^ base;
    for b in id.bytes().chain(step.to_le_bytes()) {
        h = (h ^ b as u64).wrapping_mul(0x100000001b3);
    }
    h
}

/// Label every step of `sol` by rollouts. `is_correct(question_gold, completed_steps)` says
/// whether a full solution reaches the gold answer. Returns the labelled solution and the
/// number of rollouts spent.
pub fn annotate(
    sol: &Solution,
    policy: &dyn Policy,
    is_correct: &(dyn Fn(&Solution, &[String]) -> bool + Sync),
    o: &McOptions,
) -> Result<(Solution, usize)> {
    let mut out = sol.clone();
    let texts: Vec<String> = sol.steps.iter().map(|s| s.text.clone()).collect();
    let mut spent = 0;
    let mut dead = false;
    for i in 0..texts.len() {
        if dead {
            out.steps[i].label = Some(StepLabel::soft(0.0, Provenance::MonteCarlo { rollouts: 0, hits: 0 }));
            continue;
        }
        let prefix: Vec<&str> = texts[..=i].iter().map(String::as_str).collect();
        // The last step: the solution itself is its only completion (one "rollout", no cost).
        let (n, hits) = if i + 1 == texts.len() {
            (1, usize::from(is_correct(sol, &texts)))
        } else {
            let outs = policy.complete(&sol.question, &prefix, o.rollouts, seed_for(o.seed, &sol.id, i))?;
            spent += outs.len();
            let hits = outs
                .into_iter()
                .filter(|rest| {
                    let mut full: Vec<String> = texts[..=i].to_vec();
                    full.extend(rest.iter().cloned());
                    is_correct(sol, &full)
                })
                .count();
            (o.rollouts.max(1), hits)
        };
        let p = hits as f32 / n as f32;
        out.steps[i].label = Some(StepLabel::soft(
            p,
            Provenance::MonteCarlo {
                rollouts: n as u32,
                hits: hits as u32,
            },
        ));
        dead = hits == 0;
    }
    Ok((out, spent))
}

/// [`annotate`] every solution of `sols`, appending each labelled solution to the JSONL journal
/// at `path` as soon as it is done (with its rollouts in `meta.rollouts`). Solutions are labelled
/// a few at a time in parallel (one per thread of rayon's pool, twice over) and written in input
/// order. Started again after an interruption (even SIGKILL), it keeps what was written, drops a
/// torn last line and labels only the rest; seeds are per solution and step, so the records
/// equal an uninterrupted run's. `progress(done)` reports solutions finished. Returns all
/// labelled solutions, in input order, and the rollouts spent on them.
pub fn annotate_resumable(
    path: &Path,
    sols: &[Solution],
    policy: &dyn Policy,
    is_correct: &(dyn Fn(&Solution, &[String]) -> bool + Sync),
    o: &McOptions,
    mut progress: impl FnMut(usize),
) -> Result<(Vec<Solution>, usize)> {
    let (mut journal, mut kept) = Journal::open::<Solution>(path, |s| s.id.clone())?;
    progress(kept.len());
    let todo: Vec<&Solution> = sols.iter().filter(|s| !journal.contains(&s.id)).collect();
    for batch in todo.chunks(2 * rayon::current_num_threads()) {
        let done: Vec<(Solution, usize)> = batch
            .par_iter()
            .map(|s| annotate(s, policy, is_correct, o))
            .collect::<Result<_>>()?;
        for (mut l, spent) in done {
            l.meta.insert("rollouts".into(), spent.into());
            journal.append(l.id.clone(), &l)?;
            kept.push(l);
        }
        progress(kept.len());
    }
    sort_like(&mut kept, sols.iter().map(|s| s.id.as_str()), |s| s.id.as_str());
    let spent = kept
        .iter()
        .filter_map(|s| s.meta.get("rollouts").and_then(|v| v.as_u64()))
        .sum::<u64>() as usize;
    Ok((kept, spent))
}

#[cfg(test)]
mod tests {
    use super::*;
    use stepwise_core::Step;

    /// A policy that finishes correctly only while the prefix has no "bad" step.
    struct Toy;
    impl Policy for Toy {
        fn complete(&self, _q: &str, prefix: &[&str], k: usize, _seed: u64) -> Result<Vec<Vec<String>>> {
            let ok = !prefix.contains(&"bad");
            Ok((0..k)
                .map(|j| {
                    vec![if ok && j % 2 == 0 {
                        "answer 1".into()
                    } else {
                        "answer 2".into()
                    }]
                })
                .collect())
        }
    }

    #[test]
    fn labels_stop_at_the_first_unrescuable_step() {
        let sol = Solution {
            id: "s".into(),
            steps: ["good", "bad", "after", "answer 2"]
                .iter()
                .map(|t| Step::new(*t))
                .collect(),
            ..Default::default()
        };
        let correct = |_: &Solution, full: &[String]| full.last().is_some_and(|l| l == "answer 1");
        let (l, spent) = annotate(&sol, &Toy, &correct, &McOptions { rollouts: 4, seed: 0 }).unwrap();
        let p: Vec<f32> = l.steps.iter().map(|s| s.label.as_ref().unwrap().prob(1.0)).collect();
        assert_eq!(p, vec![0.5, 0.0, 0.0, 0.0]);
        assert_eq!(spent, 8, "no rollouts after the first dead step");
        assert_eq!(l.first_error(), Some(1));
    }

    #[test]
    fn parallel_annotation_keeps_input_order_and_equals_one_at_a_time() {
        let sols: Vec<Solution> = (0..11)
            .map(|i| Solution {
                id: format!("s{i}"),
                steps: (0..4)
                    .map(|j| Step::new(if j == i % 4 { "bad" } else { "good" }))
                    .collect(),
                ..Default::default()
            })
            .collect();
        let correct = |_: &Solution, full: &[String]| full.last().is_some_and(|l| l == "answer 1");
        let o = McOptions { rollouts: 4, seed: 3 };
        let path = std::env::temp_dir().join(format!("stepwise-mc-order-{}.jsonl", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let (all, spent) = annotate_resumable(&path, &sols, &Toy, &correct, &o, |_| {}).unwrap();
        let one_by_one: Vec<(Solution, usize)> =
            sols.iter().map(|s| annotate(s, &Toy, &correct, &o).unwrap()).collect();
        assert_eq!(spent, one_by_one.iter().map(|(_, n)| n).sum::<usize>());
        for (got, (want, _)) in all.iter().zip(&one_by_one) {
            assert_eq!((&got.id, &got.steps), (&want.id, &want.steps));
        }
        let journal_ids: Vec<String> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Solution>(l).unwrap().id)
            .collect();
        assert_eq!(journal_ids, sols.iter().map(|s| s.id.clone()).collect::<Vec<_>>());
        std::fs::remove_file(&path).unwrap();
    }
}
