//! The studio's labels as records every stepwise format can hold.
//!
//! Per record (stepwise, TRL, Math-Shepherd, …): each step's label is the reviewer's
//! adjudication, else the finished labellings' majority (a tie takes the lower rating), as
//! human labels; `meta.studio` keeps every labeller's ratings, comments, corrections, times,
//! finish reasons, the generation and whether suggestions were shown. Per labelling (PRM800K, one
//! line per labeller and record, as its release is): the labeller's own ratings with `labeler`,
//! `timestamp`, `generation`, `is_quality_control_question`, `finish_reason` and `total_time`,
//! and their corrections as each step's `human_completion`.

use crate::store::{Labelling, Project, Store};
use crate::time::iso8601;
use anyhow::Result;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use stepwise_core::record::{Provenance, Rating, Solution, StepLabel};

/// How the labels are written out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One record per source record, labels agreed.
    PerRecord,
    /// One record per finished labelling (PRM800K's layout).
    PerLabelling,
}

/// Labels `s` with `ratings` (step → rating) as human labels, dropping the unrated steps after
/// the last rated one (a labelling stopped at its first error ends there).
fn labelled(mut s: Solution, ratings: &BTreeMap<usize, i64>) -> Solution {
    let last = ratings.keys().next_back().map_or(0, |i| i + 1);
    s.steps.truncate(last.min(s.steps.len()));
    for (i, st) in s.steps.iter_mut().enumerate() {
        st.label = ratings
            .get(&i)
            .and_then(|&r| Rating::from_i64(r))
            .map(|r| StepLabel::hard(r, Provenance::Human));
    }
    if s.steps.len() < last {
        s.final_answer = None;
    }
    s
}

fn majority(votes: &[i64]) -> Option<i64> {
    let mut count = [0usize; 3];
    for &v in votes {
        count[(v.clamp(-1, 1) + 1) as usize] += 1;
    }
    let best = *count.iter().max()?;
    (best > 0).then(|| (0..3).find(|&c| count[c] == best).map(|c| c as i64 - 1))?
}

fn labelling_json(l: &Labelling, steps: usize) -> Value {
    let ratings: Vec<Value> = (0..steps).map(|i| json!(l.ratings.get(&i).and_then(|r| r.0))).collect();
    let suggestions: Vec<Value> = (0..steps).map(|i| json!(l.ratings.get(&i).and_then(|r| r.3))).collect();
    let comments: BTreeMap<String, &str> = l
        .ratings
        .iter()
        .filter(|(_, r)| !r.1.is_empty())
        .map(|(i, r)| (i.to_string(), r.1.as_str()))
        .collect();
    json!({
        "labeller": l.user, "generation": l.generation, "assist": l.assist, "gold": l.gold,
        "started": iso8601(l.started), "finished": l.finished.map(iso8601),
        "finish_reason": l.finish_reason, "ratings": ratings, "suggestions_shown": suggestions,
        "comments": comments,
        "corrections": l.corrections.iter().map(|(i, t)| (i.to_string(), t.as_str())).collect::<BTreeMap<_, _>>(),
    })
}

/// The PRM800K line of one labelling of `s` (already labelled with its ratings).
fn prm800k_line(s: &Solution, l: &Labelling, original: &Solution) -> Value {
    let alternatives = crate::store::alternatives(original);
    let steps: Vec<Value> = s
        .steps
        .iter()
        .enumerate()
        .map(|(i, st)| {
            let rating = st.label.as_ref().and_then(|x| x.rating()).map(|r| r.as_i64());
            let mut completions = vec![json!({"text": st.text, "rating": rating, "flagged": false})];
            for alt in alternatives.get(i).into_iter().flatten() {
                completions.push(json!({"text": alt, "rating": null, "flagged": false}));
            }
            // The labeller's own writing of the step, beside the model's step they rated (which
            // the solution goes on from, so it stays the chosen completion).
            let human = l.corrections.get(&i).map(
                |t| json!({"text": t, "rating": null, "source": "human", "flagged": false, "corrected_rating": null}),
            );
            json!({"completions": completions, "human_completion": human, "chosen_completion": 0})
        })
        .collect();
    let total_ms = l.finished.map(|f| ((f - l.started) * 1000.0).round() as i64);
    json!({
        "labeler": l.user, "timestamp": l.finished.map(iso8601), "generation": l.generation,
        "is_quality_control_question": l.gold, "is_initial_screening_question": false,
        "question": {"problem": s.question, "ground_truth_answer": s.gold_answer},
        "label": {"steps": steps, "total_time": total_ms, "finish_reason": l.finish_reason},
    })
}

/// The labelled records of `project`; with `include_unlabelled`, the records nobody finished
/// too, as they were imported.
pub fn export(store: &Store, project: &Project, shape: Shape, include_unlabelled: bool) -> Result<Vec<Solution>> {
    let all = store.labellings(project, None)?;
    let adjudicated = store.adjudications(project)?;
    let mut by_record: BTreeMap<i64, Vec<&Labelling>> = BTreeMap::new();
    for l in all.iter().filter(|l| l.finished.is_some()) {
        by_record.entry(l.record).or_default().push(l);
    }
    let mut out = Vec::new();
    for (id, (_, s)) in store.records_of(project)? {
        let done = by_record.get(&id).map(Vec::as_slice).unwrap_or(&[]);
        if done.is_empty() {
            if include_unlabelled {
                out.push(s);
            }
            continue;
        }
        match shape {
            Shape::PerLabelling => {
                for l in done {
                    let mut one = labelled(s.clone(), &l.rated());
                    one.meta.insert("prm800k".into(), prm800k_line(&one, l, &s));
                    one.meta.insert("studio".into(), labelling_json(l, s.steps.len()));
                    one.id = format!("{}#{}", s.id, l.user);
                    out.push(one);
                }
            }
            Shape::PerRecord => out.push(agreed(s, done, adjudicated.get(&id))),
        }
    }
    Ok(out)
}

fn agreed(s: Solution, done: &[&Labelling], adjudicated: Option<&BTreeMap<usize, i64>>) -> Solution {
    let mut votes: HashMap<usize, Vec<i64>> = HashMap::new();
    for l in done {
        for (i, r) in l.rated() {
            votes.entry(i).or_default().push(r);
        }
    }
    let mut ratings: BTreeMap<usize, i64> = votes.iter().filter_map(|(&i, v)| Some((i, majority(v)?))).collect();
    for (&i, &r) in adjudicated.into_iter().flatten() {
        ratings.insert(i, r);
    }
    let n = s.steps.len();
    let studio = json!({
        "labellings": done.iter().map(|l| labelling_json(l, n)).collect::<Vec<_>>(),
        "adjudicated": adjudicated.map(|a| a.iter().map(|(i, r)| (i.to_string(), *r)).collect::<BTreeMap<_, _>>()),
        "gold": done.iter().any(|l| l.gold),
    });
    let mut s = labelled(s, &ratings);
    s.meta.remove("prm800k");
    s.meta.insert("studio".into(), studio);
    s
}

/// `records` as JSON lines of `format` (grouped formats take each problem's records together).
pub fn to_jsonl(records: &[Solution], format: stepwise_core::formats::Format) -> Result<String> {
    let mut out = String::new();
    for v in format
        .write_all(records)
        .map_err(|e| anyhow::anyhow!("writing {format}: {e}"))?
    {
        out.push_str(&serde_json::to_string(&v)?);
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn majority_takes_the_lower_rating_on_a_tie() {
        assert_eq!(super::majority(&[1, 1, -1]), Some(1));
        assert_eq!(super::majority(&[1, -1]), Some(-1));
        assert_eq!(super::majority(&[0, 1]), Some(0));
        assert_eq!(super::majority(&[]), None);
    }
}
