//! Running an annotator over many solutions with a journal: each labelled solution is appended
//! as soon as it is done, and a run started again after an interruption (even SIGKILL) labels
//! only the rest.

use anyhow::Result;
use rayon::prelude::*;
use std::path::Path;
use stepwise_core::journal::{sort_like, Journal};
use stepwise_core::seams::{Annotator, Spent};
use stepwise_core::Solution;

/// Label every solution of `sols` with `annotator`, appending each labelled solution to the
/// JSONL journal at `path` as soon as it is done (what it cost in `meta.rollouts` and
/// `meta.generated_tokens`). Solutions are labelled a few at a time in parallel (one per thread of
/// rayon's pool, twice over) and written in input order. Started again after an interruption, it
/// keeps what was written, drops a torn last line and labels only the rest; annotators seed per
/// solution, so the records equal an uninterrupted run's. `progress(done)` reports solutions
/// finished. Returns all labelled solutions, in input order, and what they cost in total.
pub fn annotate_resumable(
    path: &Path,
    sols: &[Solution],
    annotator: &dyn Annotator,
    mut progress: impl FnMut(usize),
) -> Result<(Vec<Solution>, Spent)> {
    let (mut journal, mut kept) = Journal::open::<Solution>(path, |s| s.id.clone())?;
    progress(kept.len());
    let todo: Vec<&Solution> = sols.iter().filter(|s| !journal.contains(&s.id)).collect();
    for batch in todo.chunks(2 * rayon::current_num_threads()) {
        let done: Vec<(Solution, Spent)> = batch.par_iter().map(|s| annotator.annotate(s)).collect::<Result<_>>()?;
        for (mut l, spent) in done {
            l.meta.insert("rollouts".into(), spent.rollouts.into());
            l.meta.insert("generated_tokens".into(), spent.tokens.into());
            journal.append(l.id.clone(), &l)?;
            kept.push(l);
        }
        progress(kept.len());
    }
    sort_like(&mut kept, sols.iter().map(|s| s.id.as_str()), |s| s.id.as_str());
    let read = |s: &Solution, key: &str| s.meta.get(key).and_then(|v| v.as_u64()).unwrap_or(0) as usize;
    let mut spent = Spent::default();
    for s in &kept {
        spent += Spent {
            rollouts: read(s, "rollouts"),
            tokens: read(s, "generated_tokens"),
        };
    }
    Ok((kept, spent))
}
