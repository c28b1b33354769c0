//! Step-DPO's rectification (Lai et al. 2024, §3.2): a wrong step with no right step beside it
//! gets one sampled. From the question and the sound prefix before the wrong step, a policy
//! writes `samples` continuations to the end; those whose final answer the task grades correct
//! are kept, and the first step of the first of them is the chosen step, paired with the wrong
//! one. The paper samples with the policy being trained (in-distribution data beat corrections by
//! a stronger model); any [`Policy`] does here.
//!
//! A continuation reaching the gold answer can still begin with a wrong step (a lucky answer), as
//! an outcome check cannot see; the lab measures how often, against its exact step checker.

use anyhow::Result;
use serde::Serialize;
use stepwise_core::pairs::{Source, StepPair, Unpaired};
use stepwise_core::seams::{continue_each, NextSteps, Policy, Task, Until};

/// How many continuations a place gets, and their seed.
#[derive(Debug, Clone, Copy)]
pub struct RectifyOptions {
    /// Continuations sampled from each place (question and prefix).
    pub samples: usize,
    /// Base seed; each place's draw derives its own from it and the first wrong step's id.
    pub seed: u64,
    /// Places asked of a batching policy in one call.
    pub together: usize,
    /// [`Policy::continue_from`] calls at once, where the policy does not batch.
    pub threads: usize,
    /// A sampled right step is kept only when this many further continuations from the prefix
    /// and it reach the gold answer at least `check_min` of the time (Math-Shepherd's value of the
    /// step, as `stepwise pairs` reads a Monte Carlo label); 0 keeps every one.
    pub check_rollouts: usize,
    /// The least value a checked step keeps.
    pub check_min: f32,
}

/// What rectification found.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RectifyStats {
    /// Wrong steps that waited for a chosen step.
    pub unpaired: usize,
    /// Of them, paired with a sampled step.
    pub paired: usize,
    /// Left unpaired: their question has no gold answer to grade against.
    pub without_answer: usize,
    /// Left unpaired: no continuation from their place reached the gold answer with a first step
    /// other than a wrong one (that passed the check, with `check_rollouts`).
    pub none_reached: usize,
    /// Places sampled from.
    pub places: usize,
    /// Continuations that reached the gold answer, of all sampled.
    pub reached: usize,
    /// Continuations sampled (the check's included).
    pub sampled: usize,
    /// Right steps found that the check turned away.
    pub checked_out: usize,
    /// Tokens generated.
    pub tokens: usize,
}

/// A place: its wrong steps (consecutive in `unpaired`, as `step_pairs_and_unpaired` gives them).
type Place<'a> = &'a [Unpaired];

/// A right first step found at a place, and whether it ended its solution.
type Found = (String, bool);

/// Pair each of `unpaired` with a sampled right step where one is found (the pairs in the order
/// of `unpaired`), `on_place` told after each place with the number done.
pub fn rectify(
    unpaired: &[Unpaired],
    policy: &dyn Policy,
    task: &dyn Task,
    o: RectifyOptions,
    mut on_place: impl FnMut(usize),
) -> Result<(Vec<StepPair>, RectifyStats)> {
    let mut stats = RectifyStats {
        unpaired: unpaired.len(),
        ..Default::default()
    };
    // Only the places whose answer can be graded.
    let mut places: Vec<Place<'_>> = Vec::new();
    for here in unpaired.chunk_by(Unpaired::same_place) {
        if here[0].answer.is_some() {
            places.push(here);
        } else {
            stats.without_answer += here.len();
        }
    }
    stats.places = places.len();
    let mut found = first_steps_reaching(&places, policy, task, o, &mut stats, &mut on_place)?;
    if o.check_rollouts > 0 {
        check(&places, &mut found, policy, task, o, &mut stats)?;
    }
    let mut pairs = Vec::new();
    for (here, right) in places.iter().zip(found) {
        if right.is_empty() {
            stats.none_reached += here.len();
            continue;
        }
        for (k, u) in here.iter().enumerate() {
            let (chosen, ends) = right[k % right.len()].clone();
            pairs.push(u.with_chosen(chosen, Source::Sampled, ends));
        }
        stats.paired += here.len();
    }
    Ok((pairs, stats))
}

/// At each place, the distinct first steps of the continuations that reach the gold answer, in
/// the order sampled, none of them one of the place's wrong steps.
fn first_steps_reaching(
    places: &[Place<'_>],
    policy: &dyn Policy,
    task: &dyn Task,
    o: RectifyOptions,
    stats: &mut RectifyStats,
    on_place: &mut impl FnMut(usize),
) -> Result<Vec<Vec<Found>>> {
    let prefixes: Vec<Vec<&str>> = (places.iter())
        .map(|p| p[0].prefix.iter().map(String::as_str).collect())
        .collect();
    let asks: Vec<NextSteps<'_>> = (places.iter().zip(&prefixes))
        .map(|(p, prefix)| NextSteps {
            question: &p[0].question,
            prefix,
            n: o.samples.max(1),
            seed: crate::montecarlo::seed_for(o.seed, &p[0].id, p[0].prefix.len()),
        })
        .collect();
    let mut found = Vec::with_capacity(places.len());
    continue_each(policy, &asks, Until::End, (o.together, o.threads), |i, outs| {
        let here = places[i];
        let (gold, prefix) = (here[0].answer.as_deref().unwrap_or_default(), &here[0].prefix);
        let mut right: Vec<Found> = Vec::new();
        for c in outs? {
            stats.sampled += 1;
            stats.tokens += c.tokens;
            let whole: Vec<String> = prefix.iter().chain(&c.steps).cloned().collect();
            let Some(first) = c.steps.first() else { continue };
            if !task.is_correct(gold, &whole) {
                continue;
            }
            stats.reached += 1;
            let wrong = here.iter().any(|u| u.rejected == *first);
            if !wrong && !right.iter().any(|(t, _)| t == first) {
                right.push((first.clone(), c.steps.len() == 1 && c.finished));
            }
        }
        found.push(right);
        on_place(i + 1);
        Ok(())
    })?;
    Ok(found)
}

/// Keep the found steps whose own rollouts reach the gold answer at least `o.check_min` of the
/// time (a step that ended its solution was graded whole already).
fn check(
    places: &[Place<'_>],
    found: &mut [Vec<Found>],
    policy: &dyn Policy,
    task: &dyn Task,
    o: RectifyOptions,
    stats: &mut RectifyStats,
) -> Result<()> {
    let mut prefixes: Vec<(usize, usize, Vec<String>)> = Vec::new();
    for (p, (here, right)) in places.iter().zip(found.iter()).enumerate() {
        for (k, (step, ends)) in right.iter().enumerate() {
            if !ends {
                let prefix = here[0].prefix.iter().chain([step]).cloned().collect();
                prefixes.push((p, k, prefix));
            }
        }
    }
    let refs: Vec<Vec<&str>> = (prefixes.iter())
        .map(|(_, _, prefix)| prefix.iter().map(String::as_str).collect())
        .collect();
    let asks: Vec<NextSteps<'_>> = (prefixes.iter().zip(&refs))
        .map(|((p, _, _), prefix)| NextSteps {
            question: &places[*p][0].question,
            prefix,
            n: o.check_rollouts,
            seed: crate::montecarlo::seed_for(o.seed ^ 1, &places[*p][0].id, prefix.len()),
        })
        .collect();
    let mut kept = vec![true; prefixes.len()];
    continue_each(policy, &asks, Until::End, (o.together, o.threads), |i, outs| {
        let (p, _, prefix) = &prefixes[i];
        let gold = places[*p][0].answer.as_deref().unwrap_or_default();
        let mut hits = 0usize;
        for c in outs? {
            stats.sampled += 1;
            stats.tokens += c.tokens;
            let whole: Vec<String> = prefix.iter().cloned().chain(c.steps).collect();
            hits += usize::from(task.is_correct(gold, &whole));
        }
        stats.reached += hits;
        kept[i] = hits as f32 >= o.check_min * o.check_rollouts as f32;
        Ok(())
    })?;
    for ((p, k, _), keep) in prefixes.iter().zip(kept).rev() {
        if !keep {
            found[*p].remove(*k);
            stats.checked_out += 1;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use stepwise_core::pairs::step_pairs_and_unpaired;
    use stepwise_core::testing::{Batching, PlainTask, ScriptedPolicy};
    use stepwise_core::{Provenance, Rating, Solution, Step, StepLabel};

    fn record(id: &str, steps: &[(&str, Rating)]) -> Solution {
        Solution {
            id: id.into(),
            problem_id: "p".into(),
            question: "2 + 3 * 4 = ?".into(),
            gold_answer: Some("14".into()),
            steps: (steps.iter())
                .map(|(t, r)| Step::labelled(*t, StepLabel::hard(*r, Provenance::Human)))
                .collect(),
            ..Default::default()
        }
    }

    fn options() -> RectifyOptions {
        RectifyOptions {
            samples: 4,
            seed: 7,
            together: 8,
            threads: 2,
            check_rollouts: 0,
            check_min: 0.5,
        }
    }

    fn task() -> PlainTask {
        PlainTask { problems: Vec::new() }
    }

    /// From any prefix: the wrong step again (reaching 15), a right one reaching 14, the answer
    /// at once, and a wrong step that lands on 14 anyway.
    fn script(_: &str, _: &[&str], j: usize) -> Vec<String> {
        let s: &[&str] = match j % 4 {
            0 => &["2 + 12 = 15", "answer 15"],
            1 => &["2 + 12 = 14", "answer 14"],
            2 => &["answer 14"],
            _ => &["2 + 12 = 15", "answer 14"],
        };
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn a_lone_wrong_step_is_paired_with_the_first_step_of_a_continuation_reaching_the_answer() {
        let recs = vec![record(
            "a",
            &[
                ("3 * 4 = 12", Rating::Good),
                ("2 + 12 = 15", Rating::Bad),
                ("answer 15", Rating::Bad),
            ],
        )];
        let (pairs, unpaired, stats) = step_pairs_and_unpaired(&recs, 0.5);
        assert_eq!((pairs.len(), unpaired.len(), stats.without_chosen), (0, 1, 1));
        for policy in [
            &ScriptedPolicy(script) as &dyn Policy,
            &Batching::new(ScriptedPolicy(script)),
        ] {
            let mut told = Vec::new();
            let (got, s) = rectify(&unpaired, policy, &task(), options(), |n| told.push(n)).unwrap();
            assert_eq!(got.len(), 1);
            let p = &got[0];
            assert_eq!((p.chosen.as_str(), p.rejected.as_str()), ("2 + 12 = 14", "2 + 12 = 15"));
            assert_eq!(
                (p.chosen_source, p.chosen_ends, p.rejected_ends),
                (Source::Sampled, false, false)
            );
            assert_eq!(
                (p.prefix.clone(), p.id.as_str()),
                (vec!["3 * 4 = 12".to_string()], "a@1")
            );
            // Three of four reach 14; the lucky one begins with the wrong step itself.
            assert_eq!((s.unpaired, s.paired, s.places, s.none_reached), (1, 1, 1, 0));
            assert_eq!((s.reached, s.sampled), (3, 4));
            assert_eq!(told, vec![1]);
        }
    }

    #[test]
    fn wrong_steps_at_one_place_share_its_draw_and_take_the_right_steps_in_turn() {
        let recs = vec![
            record("a", &[("2 + 12 = 15", Rating::Bad)]),
            record("b", &[("2 + 3 = 5", Rating::Bad)]),
        ];
        let (_, unpaired, _) = step_pairs_and_unpaired(&recs, 0.5);
        assert_eq!(unpaired.len(), 2);
        let (got, s) = rectify(&unpaired, &ScriptedPolicy(script), &task(), options(), |_| {}).unwrap();
        let chosen: Vec<&str> = got.iter().map(|p| p.chosen.as_str()).collect();
        assert_eq!(chosen, vec!["2 + 12 = 14", "answer 14"]);
        assert!(got[1].chosen_ends);
        assert_eq!((s.places, s.sampled, s.paired), (1, 4, 2));
    }

    #[test]
    fn no_continuation_reaching_the_answer_or_no_gold_answer_leaves_the_step_unpaired() {
        let mut recs = vec![record("a", &[("2 + 3 = 5", Rating::Bad)])];
        let (_, unpaired, _) = step_pairs_and_unpaired(&recs, 0.5);
        let wrong = ScriptedPolicy(|_: &str, _: &[&str], _| vec!["answer 20".to_string()]);
        let (got, s) = rectify(&unpaired, &wrong, &task(), options(), |_| {}).unwrap();
        assert!(got.is_empty());
        assert_eq!((s.none_reached, s.reached, s.sampled), (1, 0, 4));
        recs[0].gold_answer = None;
        let (_, unpaired, _) = step_pairs_and_unpaired(&recs, 0.5);
        let (got, s) = rectify(&unpaired, &wrong, &task(), options(), |_| {}).unwrap();
        assert!(got.is_empty());
        assert_eq!((s.without_answer, s.places, s.sampled), (1, 0, 0));
    }

    #[test]
    fn the_check_turns_away_a_step_whose_own_rollouts_miss_the_answer() {
        let recs = vec![record(
            "a",
            &[("3 * 4 = 12", Rating::Good), ("2 + 12 = 15", Rating::Bad)],
        )];
        let (_, unpaired, _) = step_pairs_and_unpaired(&recs, 0.5);
        // From the prefix, a lucky slip first ("2 + 12 = 13", then "answer 14"), then the right
        // step; from after the slip the answer is 13 three times in four, from after the right
        // step it is always 14.
        let policy = ScriptedPolicy(|_: &str, prefix: &[&str], j: usize| -> Vec<String> {
            let s: &[&str] = match (prefix.last().copied(), j % 4) {
                (Some("2 + 12 = 13"), 0) => &["answer 14"],
                (Some("2 + 12 = 13"), _) => &["answer 13"],
                (Some("2 + 12 = 14"), _) => &["answer 14"],
                (_, 0) => &["2 + 12 = 13", "answer 14"],
                _ => &["2 + 12 = 14", "answer 14"],
            };
            s.iter().map(|x| x.to_string()).collect()
        });
        let unchecked = rectify(&unpaired, &policy, &task(), options(), |_| {}).unwrap().0;
        assert_eq!(unchecked[0].chosen, "2 + 12 = 13");
        let checked = RectifyOptions {
            check_rollouts: 4,
            ..options()
        };
        let (got, s) = rectify(&unpaired, &policy, &task(), checked, |_| {}).unwrap();
        assert_eq!(got[0].chosen, "2 + 12 = 14");
        assert_eq!(
            (s.checked_out, s.paired, s.sampled, s.reached),
            (1, 1, 4 + 4 + 4, 4 + 1 + 4)
        );
    }
}
