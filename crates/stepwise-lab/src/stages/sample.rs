//! Stage 2, sampling: N solutions per problem from the policy (the prompt encoded once, its KV
//! cache shared), journalled per problem so an interrupted run resumes.

use crate::progress::bar;
use crate::task::{self, LabProblem};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use stepwise_core::journal::{sort_like, Journal};
use stepwise_core::{Policy, Solution};

/// Per-problem sample record (one journal line).
#[derive(Serialize, Deserialize)]
struct Samples {
    problem_id: String,
    solutions: Vec<Solution>,
}

/// Sample `n` solutions of every problem with `policy` (resumable journal at `path`), graded
/// by the current oracle.
pub fn sample_stage(
    path: &Path,
    what: &str,
    problems: &[LabProblem],
    n: usize,
    policy: &dyn Policy,
    seed: u64,
) -> Result<Vec<Solution>> {
    let (mut j, mut kept) = Journal::open::<Samples>(path, |s| s.problem_id.clone())?;
    let todo: Vec<&LabProblem> = problems.iter().filter(|p| !j.contains(&p.id)).collect();
    if !todo.is_empty() {
        let pb = bar(problems.len() as u64, what);
        pb.set_position((problems.len() - todo.len()) as u64);
        for p in todo {
            let s = problem_seed(seed, &p.id);
            let outs = policy.complete(&p.question, &[], n, s)?;
            let solutions = outs
                .into_iter()
                .enumerate()
                .map(|(k, steps)| task::solution(p, format!("{}-s{k}", p.id), steps, "lab-policy"))
                .collect();
            let rec = Samples {
                problem_id: p.id.clone(),
                solutions,
            };
            j.append(p.id.clone(), &rec)?;
            kept.push(rec);
            pb.inc(1);
        }
        pb.finish_and_clear();
    }
    sort_like(&mut kept, problems.iter().map(|p| p.id.as_str()), |s| {
        s.problem_id.as_str()
    });
    // Graded again by the current oracle: samples cached by an earlier version keep their text,
    // not their verdicts.
    let by_id: HashMap<&str, &LabProblem> = problems.iter().map(|p| (p.id.as_str(), p)).collect();
    let mut out = Vec::new();
    for rec in kept {
        let p = by_id
            .get(rec.problem_id.as_str())
            .with_context(|| format!("{}: problem {} is not in this run", path.display(), rec.problem_id))?;
        for s in rec.solutions {
            let steps = s.steps.into_iter().map(|st| st.text).collect();
            out.push(task::solution(p, s.id, steps, "lab-policy"));
        }
    }
    Ok(out)
}

pub(crate) fn problem_seed(seed: u64, id: &str) -> u64 {
    id.bytes().fold(seed ^ 0x9e3779b97f4a7c15, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}
