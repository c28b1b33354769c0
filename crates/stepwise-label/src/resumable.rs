//! Running an annotator over many solutions with a journal: each labelled solution is appended
//! as soon as it is done, and a run started again after an interruption (even SIGKILL) labels
//! only the rest.

use anyhow::Result;
use std::path::Path;
use stepwise_core::journal::{sort_like, Journal};
use stepwise_core::seams::{Annotator, OnError, Spent};
use stepwise_core::Solution;

/// Label every solution of `sols` with `annotator`, appending each labelled solution (and any new
/// solution the annotation produced, such as OmegaPRM's completed rollouts) to the JSONL journal
/// at `path` as soon as it is done (what it cost in `meta.rollouts` and
/// `meta.generated_tokens`). Solutions are labelled in parallel, as many at once as rayon's pool
/// has threads ([`annotate_resumable_with`] names the number), each started as soon as a thread
/// is free, or, where the annotator and its policy batch ([`Annotator::annotate_together`]),
/// many at once in one batch; either way written in input order. Started again after an interruption, it
/// keeps what was written, drops a torn last line and labels only the rest; annotators seed per
/// solution, so the records equal an uninterrupted run's. `progress(done)` reports solutions
/// finished. Returns the labelled solutions of `sols`, in input order, and what the whole
/// annotation cost.
pub fn annotate_resumable(
    path: &Path,
    sols: &[Solution],
    annotator: &dyn Annotator,
    progress: impl FnMut(usize),
) -> Result<(Vec<Solution>, Spent)> {
    let threads = rayon::current_num_threads();
    annotate_resumable_with(path, sols, annotator, threads, OnError::Raise, progress)
}

/// The meta key under which [`OnError::Skip`] records why a solution was not labelled.
pub const ANNOTATE_ERROR: &str = "annotate_error";

/// [`annotate_resumable`] with `threads` solutions (or problems) labelled at once (for a policy
/// on servers, as many as keep every server's batch full), and a policy for a solution whose
/// labelling fails: [`OnError::Raise`] stops with an error naming it (record number and id; what
/// was labelled before stays in the journal), [`OnError::Skip`] writes it as it came, the reason
/// under `meta.annotate_error`, and goes on (a server that failed after its retries stops the
/// run either way).
pub fn annotate_resumable_with(
    path: &Path,
    sols: &[Solution],
    annotator: &dyn Annotator,
    threads: usize,
    on_error: OnError,
    mut progress: impl FnMut(usize),
) -> Result<(Vec<Solution>, Spent)> {
    let (mut journal, mut kept) = Journal::open::<Solution>(path, |s| s.id.clone())?;
    let given: std::collections::HashSet<&str> = sols.iter().map(|s| s.id.as_str()).collect();
    let count = |kept: &[Solution]| kept.iter().filter(|s| given.contains(s.id.as_str())).count();
    progress(count(&kept));
    // The units labelled together: one solution, or all of a problem's for an annotator that
    // shares work across them. A unit with any solution missing is labelled again whole (its
    // records are deterministic), and only what the journal lacks is appended.
    let units: Vec<Vec<&Solution>> = if annotator.by_problem() {
        let mut order: Vec<&str> = Vec::new();
        let mut groups: std::collections::HashMap<&str, Vec<&Solution>> = Default::default();
        for s in sols {
            groups
                .entry(s.problem_id.as_str())
                .or_insert_with(|| {
                    order.push(&s.problem_id);
                    Vec::new()
                })
                .push(s);
        }
        order.iter().map(|p| groups.remove(p).unwrap_or_default()).collect()
    } else {
        sols.iter().map(|s| vec![s]).collect()
    };
    let todo: Vec<Vec<Solution>> = units
        .into_iter()
        .filter(|u| u.iter().any(|s| !journal.contains(&s.id)))
        .map(|u| u.into_iter().cloned().collect())
        .collect();
    // What becomes of a unit's labelling: its records appended, or the error named.
    let mut write = |unit: &[Solution], done: Result<Vec<(Solution, Spent)>>| -> Result<()> {
        let done = match done {
            Ok(done) => done,
            Err(e) if on_error.skips(&e) => unit.iter().map(|s| (unlabelled(s, &e), Spent::default())).collect(),
            Err(e) => {
                let first = &unit[0];
                let n = sols.iter().position(|s| s.id == first.id).map_or(0, |p| p + 1);
                return Err(e.context(format!("record {n} (`{}`) could not be labelled", first.id)));
            }
        };
        for (mut l, spent) in done {
            if journal.contains(&l.id) {
                continue;
            }
            l.meta.insert("rollouts".into(), spent.rollouts.into());
            l.meta.insert("generated_tokens".into(), spent.tokens.into());
            if spent.env_steps > 0 {
                l.meta.insert("env_steps".into(), spent.env_steps.into());
            }
            journal.append(l.id.clone(), &l)?;
            kept.push(l);
        }
        progress(count(&kept));
        Ok(())
    };
    // One at a time, many on the policy's batch where the annotator can; else `threads` units
    // on threads. Either way written in input order.
    let singles: Vec<Solution> = match annotator.by_problem() {
        false => todo.iter().flatten().cloned().collect(),
        true => Vec::new(),
    };
    let mut order = stepwise_core::parallel::Reorder::default();
    let together = match annotator.by_problem() {
        false if !singles.is_empty() => annotator.annotate_together(&singles, &mut |i, done| {
            order.put(i, done.map(|d| vec![d]), |i, done| write(&singles[i..=i], done))
        }),
        true if !todo.is_empty() => annotator.annotate_problems_together(&todo, &mut |i, done| {
            order.put(i, done, |i, done| write(&todo[i], done))
        }),
        _ => None,
    };
    match together {
        Some(done) => done?,
        None => stepwise_core::parallel::in_order(
            &todo,
            threads,
            |unit| annotator.annotate_problem(unit),
            |unit, done| write(unit, done),
        )?,
    }
    let read = |s: &Solution, key: &str| s.meta.get(key).and_then(|v| v.as_u64()).unwrap_or(0) as usize;
    let mut spent = Spent::default();
    for s in &kept {
        spent += Spent {
            rollouts: read(s, "rollouts"),
            tokens: read(s, "generated_tokens"),
            env_steps: read(s, "env_steps"),
        };
    }
    // The given solutions, in input order (new solutions an annotation produced stay in the
    // journal only).
    kept.retain(|s| given.contains(s.id.as_str()));
    sort_like(&mut kept, sols.iter().map(|s| s.id.as_str()), |s| s.id.as_str());
    Ok((kept, spent))
}

/// A solution whose labelling failed, as it came, with the reason.
fn unlabelled(s: &Solution, error: &anyhow::Error) -> Solution {
    let mut s = s.clone();
    s.meta.insert(ANNOTATE_ERROR.into(), format!("{error:#}").into());
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{solution, toy};
    use crate::{OmegaOptions, OmegaPrm};
    use stepwise_core::seams::Policy;
    use stepwise_core::testing::{Batching, PlainTask, ScriptedPolicy};

    /// An annotator that labels a problem's solutions together is run per problem (many problems
    /// at once on a policy that batches, to the same records); a problem cut off after some of
    /// its records is labelled again whole, and the journal ends up with the same records as an
    /// uninterrupted run's, the new solutions included.
    #[test]
    fn a_problem_cut_off_midway_resumes_to_the_same_records() {
        let task = PlainTask::default();
        let mut sols = Vec::new();
        for (p, first) in [("p1", 1), ("p2", 2), ("p1", 0)] {
            let mut steps = vec!["good"; 4];
            steps[first] = "bad";
            steps[3] = "answer 2";
            let mut s = solution(&format!("{p}-{first}"), &steps);
            s.problem_id = p.into();
            sols.push(s);
        }
        let dir_tmp = tempfile::tempdir().unwrap();
        let dir = dir_tmp.path().join("stepwise-resume-tree");
        std::fs::create_dir_all(&dir).unwrap();
        let plain = ScriptedPolicy(toy);
        let batching = Batching::new(ScriptedPolicy(toy));
        let mut texts = Vec::new();
        for (name, policy) in [("plain", &plain as &dyn Policy), ("batching", &batching)] {
            let omega = OmegaPrm {
                policy,
                task: &task,
                options: OmegaOptions {
                    rollouts: 2,
                    ..Default::default()
                },
            };
            let (whole, cut) = (dir.join(format!("{name}.jsonl")), dir.join(format!("{name}-cut.jsonl")));
            let (labelled, spent) = annotate_resumable(&whole, &sols, &omega, |_| {}).unwrap();
            let ids: Vec<&str> = labelled.iter().map(|s| s.id.as_str()).collect();
            assert_eq!(ids, ["p1-1", "p2-2", "p1-0"], "the given solutions, in input order");
            let text = std::fs::read_to_string(&whole).unwrap();
            assert!(
                text.contains("p1-omegaprm-0") && text.contains("p2-omegaprm-0"),
                "new solutions kept"
            );
            assert!(spent.rollouts > 0);
            // Cut off after the first record of p1 (p1's other solution and its tree missing).
            let first_line = text.lines().next().unwrap();
            std::fs::write(&cut, format!("{first_line}\n")).unwrap();
            let (again, spent_again) = annotate_resumable(&cut, &sols, &omega, |_| {}).unwrap();
            assert_eq!(std::fs::read_to_string(&cut).unwrap(), text);
            assert_eq!(spent_again, spent);
            assert_eq!(
                serde_json::to_string(&again).unwrap(),
                serde_json::to_string(&labelled).unwrap()
            );
            texts.push(text);
        }
        assert_eq!(texts[0], texts[1], "problems searched together write the same records");
        assert!(batching.calls().iter().any(|&n| n > 1), "{:?}", batching.calls());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
