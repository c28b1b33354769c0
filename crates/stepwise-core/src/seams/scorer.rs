//! [`StepScorer`]: one score per step, and the scoring stage written once over it.

use super::Task;
use crate::Solution;
use anyhow::{Context, Result};

/// One solution, partial or finished, as a scorer reads it.
#[derive(Debug, Clone)]
pub struct ScoreInput<'a> {
    /// Its problem's id (scorers that check against the problem, such as an oracle, use it).
    pub problem_id: &'a str,
    /// The question.
    pub question: &'a str,
    /// The steps written so far.
    pub steps: Vec<&'a str>,
    /// The solution may continue (an open beam of a search): exact checkers judge its steps as
    /// a prefix, not as a complete solution that failed to state an answer.
    pub partial: bool,
}

impl<'a> ScoreInput<'a> {
    /// A solution record as scorer input (its step texts; see [`ScoreInput::read`] for
    /// trajectories).
    pub fn of(s: &'a Solution) -> Self {
        ScoreInput {
            problem_id: &s.problem_id,
            question: &s.question,
            steps: s.step_texts(),
            partial: false,
        }
    }

    /// A solution as a scorer reads it: a trajectory's steps with the observations after them
    /// (`turns` from [`turns_of`]), other solutions' step texts.
    pub fn read(s: &'a Solution, turns: &'a Option<Vec<String>>) -> Self {
        match turns {
            Some(t) => ScoreInput {
                steps: t.iter().map(String::as_str).collect(),
                ..ScoreInput::of(s)
            },
            None => ScoreInput::of(s),
        }
    }
}

/// A trajectory's turns as text ([`Solution::turn_strings`]): what a PRM scores, each action
/// read with the observation it led to (the value of the state after it); `None` for a
/// solution without observations, whose step texts are read as they are.
pub fn turns_of(s: &Solution) -> Option<Vec<String>> {
    s.is_trajectory().then(|| s.turn_strings())
}

/// What a scorer returns for a batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scored {
    /// One score per step of each input, in [0, 1] (probability that the step is good).
    pub scores: Vec<Vec<f32>>,
    /// Tokens the scorer encoded for the batch (compute accounting; 0 for scorers without a model).
    pub tokens: usize,
}

/// Scores every step of partial or finished solutions: a PRM of any layout, an ORM (its last
/// step's score is the solution's), an exact oracle, a remote server.
pub trait StepScorer: Sync {
    /// Scores for each input, one per step.
    fn score(&self, batch: &[ScoreInput<'_>]) -> Result<Scored>;

    /// How many batches [`score_in_order`] keeps in flight at once: 1 for a model that runs
    /// here (it packs a batch into its own forward passes), more for one behind servers (each
    /// server computing a batch while the next waits for it).
    fn in_flight(&self) -> usize {
        1
    }

    /// One batch as one unit of work, for a caller that keeps [`StepScorer::in_flight`] of them
    /// going itself: [`StepScorer::score`] unless the scorer spreads a batch by itself (over a
    /// fleet of servers, one request a server), which a caller running batches side by side
    /// does not want.
    fn score_part(&self, batch: &[ScoreInput<'_>]) -> Result<Scored> {
        self.score(batch)
    }
}

/// A task's exact step checker as a scorer: 1 for a correct step, 0 for a wrong one. The
/// ceiling any PRM is measured against, where the task has a checker (the lab's does).
pub struct CheckerScorer<'a> {
    /// The task whose checker scores.
    pub task: &'a dyn Task,
}

impl StepScorer for CheckerScorer<'_> {
    fn score(&self, batch: &[ScoreInput<'_>]) -> Result<Scored> {
        let scores = batch
            .iter()
            .map(|i| {
                let steps: Vec<String> = i.steps.iter().map(|s| s.to_string()).collect();
                let verdicts = if i.partial {
                    self.task.check_prefix(i.problem_id, &steps)
                } else {
                    self.task.check_steps(i.problem_id, &steps)
                };
                let verdicts = verdicts.with_context(|| {
                    format!("problem `{}`: the task has no exact step checker for it", i.problem_id)
                })?;
                Ok(verdicts.into_iter().map(|ok| f32::from(u8::from(ok))).collect())
            })
            .collect::<Result<_>>()?;
        Ok(Scored { scores, tokens: 0 })
    }
}

/// What a scoring run does with a solution its scorer cannot score (longer than the model
/// reads, say).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnError {
    /// Stop with an error naming the solution; those before it keep their scores.
    #[default]
    Raise,
    /// Leave it unscored, with the reason under `meta.score_errors.<verifier>`, and go on.
    Skip,
}

impl OnError {
    /// `"raise"` or `"skip"`, as Python and the command line spell them.
    pub fn by_name(name: &str) -> Result<Self> {
        match name {
            "raise" => Ok(OnError::Raise),
            "skip" => Ok(OnError::Skip),
            other => anyhow::bail!("on_error must be 'raise' or 'skip', not {other:?}"),
        }
    }

    /// Whether a record whose work failed with `error` is skipped (the reason recorded on it)
    /// rather than the run stopped: only under [`OnError::Skip`], and never for an
    /// [`Unavailable`] server, so that an outage cannot turn a run's records into skipped ones.
    pub fn skips(self, error: &anyhow::Error) -> bool {
        self == OnError::Skip && !error.chain().any(|c| c.is::<Unavailable>())
    }
}

/// A failure of what serves the work (a server that still failed after its retries), not of the
/// record at hand: [`OnError::skips`] never skips it.
#[derive(Debug)]
pub struct Unavailable(pub String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unavailable {}

/// The meta key under which [`OnError::Skip`] records why a solution was not scored.
pub const SCORE_ERRORS: &str = "score_errors";

/// What a scoring run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScoreRun {
    /// Tokens encoded.
    pub tokens: usize,
    /// Solutions scored.
    pub scored: usize,
    /// Indices of the solutions left unscored ([`OnError::Skip`]).
    pub skipped: Vec<usize>,
}

/// An [`OnError::Raise`] run's error: the solution that failed and how many before it were
/// scored (they keep their scores).
#[derive(Debug)]
pub struct ScoreFailure {
    /// Index of the solution that could not be scored.
    pub index: usize,
    /// Its id.
    pub id: String,
    /// Solutions scored before it, `sols[..scored]`.
    pub scored: usize,
}

impl std::fmt::Display for ScoreFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "scoring stopped at solution `{}` (record {}); the {} before it are scored",
            self.id,
            self.index + 1,
            self.scored
        )
    }
}

impl std::error::Error for ScoreFailure {}

/// The scoring stage: score `sols` in batches of `batch_size` and record the scores under
/// `verifier` in each solution's [`Solution::scores`]. `progress(done)` reports solutions scored.
/// Returns the tokens encoded; a solution that cannot be scored stops it ([`OnError::Raise`]).
pub fn score_solutions(
    scorer: &dyn StepScorer,
    verifier: &str,
    sols: &mut [Solution],
    batch_size: usize,
    progress: impl FnMut(usize),
) -> Result<usize> {
    score_solutions_with(scorer, verifier, sols, batch_size, OnError::Raise, progress).map(|run| run.tokens)
}

/// [`score_solutions`] with a policy for a solution the scorer cannot score. A batch that fails
/// is scored again one solution at a time, so one bad solution never costs the others; with
/// [`OnError::Raise`] the error names it (by id and record number) and carries a
/// [`ScoreFailure`] saying how many before it were scored (they keep their scores).
pub fn score_solutions_with(
    scorer: &dyn StepScorer,
    verifier: &str,
    sols: &mut [Solution],
    batch_size: usize,
    on_error: OnError,
    mut progress: impl FnMut(usize),
) -> Result<ScoreRun> {
    let mut outcomes = Vec::with_capacity(sols.len());
    let run = score_in_order(scorer, sols, batch_size, on_error, |i, outcome| {
        outcomes.push(outcome);
        if (i + 1) % batch_size.max(1) == 0 || i + 1 == sols.len() {
            progress(i + 1);
        }
        Ok(())
    });
    for (s, outcome) in sols.iter_mut().zip(outcomes) {
        apply_outcome(s, verifier, outcome);
    }
    run
}

/// What scoring one solution came to: its step scores, or why it was left unscored
/// ([`OnError::Skip`]).
pub type ScoreOutcome = std::result::Result<Vec<f32>, anyhow::Error>;

/// Put a solution's [`ScoreOutcome`] on it: the scores under `verifier`, or the reason under
/// `meta.score_errors.VERIFIER`.
pub fn apply_outcome(s: &mut Solution, verifier: &str, outcome: ScoreOutcome) {
    match outcome {
        Ok(scores) => s.set_scores(verifier, scores),
        Err(e) => skip(s, verifier, &e),
    }
}

/// The scoring loop under [`score_solutions_with`], for callers that write as they go (a
/// journal): `sols` in batches of `batch_size` (smaller where that is needed to have
/// [`StepScorer::in_flight`] batches), that many batches at once, each
/// solution's outcome handed to `sink(index, outcome)` in input order as soon as those before
/// it are. A batch that fails is scored again one solution at a time; a solution that cannot be
/// scored stops the run under [`OnError::Raise`] (every solution before it has been handed on;
/// batches already started finish and are dropped) and is handed on as an error under
/// [`OnError::Skip`]. An error from `sink` stops the run and is returned.
pub fn score_in_order(
    scorer: &dyn StepScorer,
    sols: &[Solution],
    batch_size: usize,
    on_error: OnError,
    mut sink: impl FnMut(usize, ScoreOutcome) -> Result<()>,
) -> Result<ScoreRun> {
    // Batches of `batch_size`, smaller when there are too few to fill the scorer's slots (a
    // shard of 64 over eight servers goes out as sixteen requests of four, not one of 64).
    let in_flight = scorer.in_flight().max(1);
    let size = batch_size.max(1).min(sols.len().div_ceil(in_flight).max(1));
    let batches: Vec<(usize, &[Solution])> = sols.chunks(size).enumerate().map(|(k, b)| (k * size, b)).collect();
    let mut run = ScoreRun::default();
    crate::parallel::in_order(
        &batches,
        in_flight,
        |(_, batch)| score_batch(scorer, batch),
        |&(start, batch), scored| {
            let (tokens, outcomes) = scored?;
            run.tokens += tokens;
            for (k, (s, outcome)) in batch.iter().zip(outcomes).enumerate() {
                let index = start + k;
                match outcome {
                    Ok(scores) => {
                        anyhow::ensure!(
                            scores.len() == s.steps.len(),
                            "solution {}: {} steps but {} scores",
                            s.id,
                            s.steps.len(),
                            scores.len()
                        );
                        run.scored += 1;
                        sink(index, Ok(scores))?;
                    }
                    Err(error) if on_error.skips(&error) => {
                        run.skipped.push(index);
                        sink(index, Err(error))?;
                    }
                    Err(error) => {
                        let failure = ScoreFailure {
                            index,
                            id: s.id.clone(),
                            scored: run.scored,
                        };
                        return Err(error.context(failure));
                    }
                }
            }
            Ok(())
        },
    )?;
    Ok(run)
}

/// One batch: the tokens encoded and each solution's outcome. A batch the scorer refuses is
/// scored again one solution at a time, so each error belongs to its solution; an answer of the
/// wrong length is the scorer's fault and fails the run.
fn score_batch(scorer: &dyn StepScorer, batch: &[Solution]) -> Result<(usize, Vec<ScoreOutcome>)> {
    let turns: Vec<Option<Vec<String>>> = batch.iter().map(turns_of).collect();
    let inputs: Vec<ScoreInput<'_>> = batch.iter().zip(&turns).map(|(s, t)| ScoreInput::read(s, t)).collect();
    if let Ok(scored) = scorer.score_part(&inputs) {
        anyhow::ensure!(
            scored.scores.len() == batch.len(),
            "the scorer returned {} results for {} solutions",
            scored.scores.len(),
            batch.len()
        );
        return Ok((scored.tokens, scored.scores.into_iter().map(Ok).collect()));
    }
    let mut tokens = 0;
    let outcomes = inputs
        .iter()
        .map(|input| match scorer.score_part(std::slice::from_ref(input)) {
            Ok(mut one) if one.scores.len() == 1 => {
                tokens += one.tokens;
                Ok(one.scores.remove(0))
            }
            Ok(one) => Err(anyhow::anyhow!(
                "the scorer returned {} results for 1 solution",
                one.scores.len()
            )),
            Err(e) => Err(e),
        })
        .collect();
    Ok((tokens, outcomes))
}

/// Why `s` was not scored by `verifier`, in its meta.
fn skip(s: &mut Solution, verifier: &str, error: &anyhow::Error) {
    let errors = s
        .meta
        .entry(SCORE_ERRORS)
        .or_insert_with(|| serde_json::Value::Object(Default::default()));
    if !errors.is_object() {
        *errors = serde_json::Value::Object(Default::default());
    }
    if let Some(map) = errors.as_object_mut() {
        map.insert(verifier.to_string(), serde_json::Value::String(format!("{error:#}")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Skip skips what a record caused, never a server that stopped answering (wherever it sits
    /// in the error's chain), and raise skips nothing.
    #[test]
    fn skip_never_skips_an_unavailable_server() {
        let of_record = anyhow::anyhow!("2080 tokens: longer than the model reads");
        let outage = anyhow::Error::new(Unavailable("http://gpu1:8000/v1/completions: 503".into()))
            .context("record 3 (`x`) could not be labelled");
        assert!(OnError::Skip.skips(&of_record));
        assert!(!OnError::Skip.skips(&outage));
        assert!(!OnError::Raise.skips(&of_record));
        assert_eq!(OnError::by_name("skip").unwrap(), OnError::Skip);
        assert!(OnError::by_name("ignore").is_err());
    }
}
