//! Searching many problems: each result becomes a solution record (its steps, every step's score
//! under the verifier's name, the method and its compute in `meta`), graded by the task and
//! appended to a JSONL journal as soon as it is done, so an interrupted run (even `kill -9`)
//! resumes where it stopped; a finished run leaves the records in input order. Problems are searched on several threads; the result of each does
//! not depend on the threads (its draws are seeded by the problem).

use crate::method::{search, Compute, SearchConfig, SearchMethod};
use anyhow::{Context, Result};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use stepwise_core::journal::{sort_like, Journal};
use stepwise_core::seams::{OnError, Policy, StepScorer};
use stepwise_core::{Solution, Step, Task};

/// One problem to search.
#[derive(Debug, Clone)]
pub struct Job<'a> {
    /// The id of the solution record it becomes (unique in the journal).
    pub id: String,
    /// The problem's id.
    pub problem_id: &'a str,
    /// Its question.
    pub question: &'a str,
    /// Its gold answer, when known (the record is graded).
    pub gold_answer: Option<&'a str>,
}

impl<'a> Job<'a> {
    /// Problem `p` searched by `method`: its record's id is the problem's id and the method's.
    pub fn for_problem(p: &'a stepwise_core::Problem, method: &str) -> Self {
        Job {
            id: format!("{}-{method}", p.id),
            problem_id: &p.id,
            question: &p.question,
            gold_answer: p.gold_answer.as_deref(),
        }
    }
}

/// Everything a batch of searches shares.
pub struct Searcher<'a> {
    /// The method.
    pub method: &'a dyn SearchMethod,
    /// Its settings.
    pub config: &'a SearchConfig,
    /// The policy.
    pub policy: &'a dyn Policy,
    /// The scorer guiding the search.
    pub scorer: &'a dyn StepScorer,
    /// The name the step scores are recorded under (`scores.<verifier>`).
    pub verifier: &'a str,
    /// Grades the chosen solutions.
    pub task: &'a dyn Task,
    /// Problems searched at once.
    pub threads: usize,
}

/// The meta key under which [`OnError::Skip`] records why a problem's search failed.
pub const SEARCH_ERROR: &str = "search_error";

/// The compute a searched record spent (`meta.compute`).
pub fn compute_of(s: &Solution) -> Option<Compute> {
    serde_json::from_value(s.meta.get("compute")?.clone()).ok()
}

impl Searcher<'_> {
    /// Search one problem and make its record.
    pub fn record(&self, job: &Job<'_>) -> Result<Solution> {
        let found = search(
            self.method,
            self.config,
            job.problem_id,
            job.question,
            self.policy,
            self.scorer,
        )
        .with_context(|| format!("searching problem `{}`", job.problem_id))?;
        let mut s = Solution {
            id: job.id.clone(),
            problem_id: job.problem_id.to_string(),
            question: job.question.to_string(),
            steps: found.chosen.steps.iter().map(Step::new).collect(),
            gold_answer: job.gold_answer.map(str::to_string),
            generator: Some(self.method.name().to_string()),
            ..Default::default()
        };
        s.set_scores(self.verifier, found.chosen.scores.clone());
        self.task.grade_solution(&mut s);
        let c = self.config;
        s.meta.insert(
            "search".into(),
            serde_json::json!({
                "method": self.method.name(),
                "verifier": self.verifier,
                "n": c.n,
                "width": c.width,
                "aggregation": c.aggregation,
                "lookahead": c.lookahead,
                "threshold": c.threshold,
                "candidates": found.candidates,
                "finished": found.chosen.finished,
            }),
        );
        s.meta.insert("compute".into(), serde_json::to_value(found.compute)?);
        Ok(s)
    }

    /// Search every job, resuming from the journal at `path` (jobs whose id it holds are not
    /// searched again); `progress(done)` counts finished jobs. Returns the records in job order.
    pub fn run_all(&self, path: &Path, jobs: &[Job<'_>], progress: &(dyn Fn(usize) + Sync)) -> Result<Vec<Solution>> {
        self.run_all_with(path, jobs, OnError::Raise, progress)
    }

    /// A problem's record when its search failed: its question and gold answer, no steps, the
    /// reason under `meta.search_error`.
    fn failed(&self, job: &Job<'_>, error: &anyhow::Error) -> Solution {
        let mut s = Solution {
            id: job.id.clone(),
            problem_id: job.problem_id.to_string(),
            question: job.question.to_string(),
            gold_answer: job.gold_answer.map(str::to_string),
            generator: Some(self.method.name().to_string()),
            ..Default::default()
        };
        s.meta.insert(SEARCH_ERROR.into(), format!("{error:#}").into());
        s
    }

    /// [`Searcher::run_all`] with a policy for a problem whose search fails: [`OnError::Raise`]
    /// stops with the error (the records before it stay in the journal), [`OnError::Skip`]
    /// writes a record without steps, the reason under `meta.search_error`, and goes on (a server
    /// that still fails after its retries stops the run either way).
    pub fn run_all_with(
        &self,
        path: &Path,
        jobs: &[Job<'_>],
        on_error: OnError,
        progress: &(dyn Fn(usize) + Sync),
    ) -> Result<Vec<Solution>> {
        let (journal, kept) = Journal::open::<Solution>(path, |s| s.id.clone())?;
        let todo: Vec<&Job<'_>> = jobs.iter().filter(|j| !journal.contains(&j.id)).collect();
        let done = AtomicUsize::new(jobs.len() - todo.len());
        progress(done.load(Ordering::Relaxed));
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let out = Mutex::new((journal, kept));
        let worker = || -> Result<()> {
            loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= todo.len() || failed.load(Ordering::Relaxed) {
                    return Ok(());
                }
                let rec = match self.record(todo[k]) {
                    Ok(rec) => rec,
                    Err(e) if on_error.skips(&e) => self.failed(todo[k], &e),
                    Err(e) => {
                        failed.store(true, Ordering::Relaxed);
                        return Err(e);
                    }
                };
                let mut guard = out.lock().unwrap_or_else(|p| p.into_inner());
                guard.0.append(rec.id.clone(), &rec)?;
                guard.1.push(rec);
                drop(guard);
                progress(done.fetch_add(1, Ordering::Relaxed) + 1);
            }
        };
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..self.threads.clamp(1, todo.len().max(1)))
                .map(|_| scope.spawn(worker))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().map_err(|_| anyhow::anyhow!("a search thread panicked"))?)
                .collect::<Result<Vec<()>>>()
        })?;
        let (_, kept) = out.into_inner().unwrap_or_else(|p| p.into_inner());
        let wanted: std::collections::HashSet<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
        let (mut mine, others): (Vec<Solution>, Vec<Solution>) =
            kept.into_iter().partition(|s| wanted.contains(s.id.as_str()));
        sort_like(&mut mine, jobs.iter().map(|j| j.id.as_str()), |s| s.id.as_str());
        if !todo.is_empty() {
            // The journal holds the records in the order they finished; the finished file
            // holds them in input order, the same whatever the threads did (records of other
            // problems a earlier run left there stay, after them).
            let tmp = path.with_extension("jsonl.tmp");
            let all: Vec<&Solution> = mine.iter().chain(&others).collect();
            stepwise_core::io::write_jsonl(&tmp, &all)?;
            std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(mine)
    }
}
