//! A labeller's work: the next record from the queue, the record as the page shows it, a
//! rating saved, a record finished. Every call names the user, and touches only their own
//! assignment: two labellers on one record never see or overwrite each other's ratings.

use super::{Project, Store};
use crate::select;
use crate::settings::FINISH_REASONS;
use crate::time::now;
use anyhow::{bail, Result};
use rusqlite::{params, OptionalExtension, TransactionBehavior};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use stepwise_core::record::Solution;

/// A step as the page shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StepView {
    /// The step's text (model-written: the page shows it as text, never as markup).
    pub text: String,
    /// The PRM's (or Monte Carlo's) score, when the project shows suggestions.
    pub suggestion: Option<f32>,
    /// This user's rating, if given.
    pub rating: Option<i64>,
    /// This user's comment.
    pub comment: String,
    /// Other candidate continuations of this step the record carries (PRM800K's completions).
    pub alternatives: Vec<String>,
    /// The step as this user wrote it instead (their correction), if they did.
    pub correction: Option<String>,
}

/// A record as the labelling page shows it to one user.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RecordView {
    /// The record's row id (the API's `{id}`).
    pub id: i64,
    /// The record's own id.
    pub ext_id: String,
    /// The project's name.
    pub project: String,
    /// The question.
    pub question: String,
    /// The reference answer.
    pub gold_answer: Option<String>,
    /// The solution's final answer.
    pub final_answer: Option<String>,
    /// Whether the final answer is right (graded), when known.
    pub correct: Option<bool>,
    /// The steps.
    pub steps: Vec<StepView>,
    /// Whether this user finished it, and why.
    pub finish_reason: Option<String>,
    /// PRM800K phase 2: finish at the first −1.
    pub stop_at_first_bad: bool,
    /// Steps are code (line numbers, no LaTeX).
    pub code: bool,
    /// Whether suggestions are shown.
    pub assist: bool,
}

/// A rating from the page or a script: `rating` −1/0/+1 or null (cleared); a comment and a
/// correction (the step as the labeller would write it: PRM800K's `human_completion`), each
/// kept if absent; an empty correction, or one that is the step's own text, removes it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RatingInput {
    /// −1, 0, +1, or null to clear.
    pub rating: Option<i64>,
    /// A comment on the step.
    #[serde(default)]
    pub comment: Option<String>,
    /// The step written right.
    #[serde(default)]
    pub correction: Option<String>,
}

/// Longest comment kept, and longest correction.
pub const MAX_COMMENT: usize = 4000;

/// A rating saved: when (durable once the call returns), and whether it changed a finished
/// labelling, which is then open again until its labeller finishes it once more.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Saved {
    /// When it was saved (Unix seconds).
    pub saved_at: f64,
    /// The labelling was finished and this rating changed it: it is open again.
    pub reopened: bool,
}

/// One of a labeller's records, as their history lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Labelled {
    /// The record's row id (the API's `{id}`).
    pub record: i64,
    /// The record's own id.
    pub ext_id: String,
    /// When they finished it (`None`: open).
    pub finished: Option<f64>,
    /// Why it ended.
    pub finish_reason: Option<String>,
    /// Steps they rated.
    pub rated: i64,
}

/// Most records a history lists.
pub const HISTORY_LIMIT: usize = 500;

/// Other completions of each step of a PRM800K record (the chosen one left out).
pub(crate) fn alternatives(s: &Solution) -> Vec<Vec<String>> {
    let mut out = vec![Vec::new(); s.steps.len()];
    for (i, r) in stepwise_core::formats::prm800k_written_steps(s).into_iter().enumerate() {
        let texts = r.get("completions").and_then(Value::as_array).into_iter().flatten();
        out[i] = texts
            .filter_map(|c| c.get("text").and_then(Value::as_str))
            .filter(|t| *t != s.steps[i].text)
            .map(str::to_string)
            .collect();
    }
    out
}

impl Store {
    /// The record `user` should label next in `project`: their unfinished one, else a gold
    /// record at the quality-control rate, else the queue's first open record they have not
    /// had. `None` when there is nothing left for them.
    pub fn next_for(&mut self, user: i64, project: &Project) -> Result<Option<i64>> {
        let tx = self.db.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let open: Option<i64> = tx
            .query_row(
                "SELECT a.record_id FROM assignments a JOIN records r ON r.id = a.record_id
                 WHERE a.user_id = ?1 AND a.finished IS NULL AND r.project_id = ?2 ORDER BY a.id LIMIT 1",
                params![user, project.id],
                |r| r.get(0),
            )
            .optional()?;
        if open.is_some() {
            return Ok(open);
        }
        let done: i64 = tx.query_row(
            "SELECT COUNT(*) FROM assignments a JOIN records r ON r.id = a.record_id WHERE a.user_id = ?1 AND r.project_id = ?2",
            params![user, project.id],
            |r| r.get(0),
        )?;
        let every = project.settings.qc_every as i64;
        let gold_turn = every > 0 && (done + 1) % every == 0;
        let pick = |gold: bool| -> rusqlite::Result<Option<i64>> {
            let sql = if gold {
                "SELECT id FROM records WHERE project_id = ?1 AND gold = 1
                 AND NOT EXISTS (SELECT 1 FROM assignments a WHERE a.record_id = records.id AND a.user_id = ?2)
                 ORDER BY priority DESC LIMIT 1"
            } else {
                "SELECT id FROM records WHERE project_id = ?1 AND gold = 0 AND open = 1
                 AND NOT EXISTS (SELECT 1 FROM assignments a WHERE a.record_id = records.id AND a.user_id = ?2)
                 ORDER BY priority DESC LIMIT 1"
            };
            tx.query_row(sql, params![project.id, user], |r| r.get(0)).optional()
        };
        let chosen = if gold_turn {
            pick(true)?.or(pick(false)?)
        } else {
            pick(false)?
        };
        let Some(record) = chosen else {
            return Ok(None);
        };
        tx.execute(
            "INSERT INTO assignments (record_id, user_id, generation, assist, started) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![record, user, project.generation, project.settings.assist, now()],
        )?;
        tx.execute(
            "UPDATE records SET n_assigned = n_assigned + 1,
             open = CASE WHEN gold = 1 THEN open ELSE (n_assigned + 1 < ?2) END WHERE id = ?1",
            params![record, project.settings.overlap.max(1)],
        )?;
        tx.commit()?;
        Ok(Some(record))
    }

    /// The assignment of `record` to `user`, if there is one: (assignment id, project id).
    fn assignment(&self, user: i64, record: i64) -> Result<Option<(i64, i64)>> {
        Ok(self
            .db
            .query_row(
                "SELECT a.id, r.project_id FROM assignments a JOIN records r ON r.id = a.record_id
                 WHERE a.record_id = ?1 AND a.user_id = ?2",
                params![record, user],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?)
    }

    /// The record and solution of row `record`: (project id, solution).
    pub(crate) fn solution(&self, record: i64) -> Result<Option<(i64, String, Solution)>> {
        let row: Option<(i64, String, String)> = self
            .db
            .query_row(
                "SELECT project_id, ext_id, solution FROM records WHERE id = ?1",
                [record],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        row.map(|(p, ext, text)| Ok((p, ext, serde_json::from_str(&text)?)))
            .transpose()
    }

    /// `record` as `user` labels it; `None` unless it is assigned to them.
    pub fn view(&self, user: i64, record: i64) -> Result<Option<RecordView>> {
        let Some((assignment, project)) = self.assignment(user, record)? else {
            return Ok(None);
        };
        let project = self.project_by_id(project)?;
        let Some((_, ext_id, s)) = self.solution(record)? else {
            return Ok(None);
        };
        let (assist, finish_reason): (bool, Option<String>) = self.db.query_row(
            "SELECT assist, finish_reason FROM assignments WHERE id = ?1",
            [assignment],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let mut mine = vec![(None, String::new()); s.steps.len()];
        let mut q = self
            .db
            .prepare("SELECT step, rating, comment FROM ratings WHERE assignment_id = ?1")?;
        for row in q.query_map([assignment], |r| Ok((r.get::<_, i64>(0)?, r.get(1)?, r.get(2)?)))? {
            let (i, rating, comment) = row?;
            if let Some(slot) = mine.get_mut(i as usize) {
                *slot = (rating, comment);
            }
        }
        let mut corrections = vec![None; s.steps.len()];
        let mut q = self
            .db
            .prepare("SELECT step, text FROM corrections WHERE assignment_id = ?1")?;
        for row in q.query_map([assignment], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))? {
            let (i, text) = row?;
            if let Some(slot) = corrections.get_mut(i as usize) {
                *slot = Some(text);
            }
        }
        let suggestions = select::suggestions(&s);
        let alternatives = alternatives(&s);
        let steps = s
            .steps
            .iter()
            .zip(mine)
            .zip(alternatives)
            .zip(corrections)
            .enumerate()
            .map(|(i, (((st, (rating, comment)), alternatives), correction))| StepView {
                text: st.text.clone(),
                suggestion: if assist {
                    suggestions.get(i).copied().flatten()
                } else {
                    None
                },
                rating,
                comment,
                alternatives,
                correction,
            })
            .collect();
        Ok(Some(RecordView {
            id: record,
            ext_id,
            project: project.name,
            correct: select::known_wrong(&s).map(|w| !w),
            question: s.question,
            gold_answer: s.gold_answer,
            final_answer: s.final_answer,
            steps,
            finish_reason,
            stop_at_first_bad: project.settings.stop_at_first_bad,
            code: project.settings.code,
            assist,
        }))
    }

    /// Saves `user`'s rating of `step` of `record`; `Ok(None)` when the record is not
    /// assigned to them. A finished labelling stays theirs to correct: a rating that changes it
    /// opens it again (its finish reason may no longer hold) until they finish it once more;
    /// a comment or a correction alone does not.
    pub fn rate(&mut self, user: i64, record: i64, step: usize, input: &RatingInput) -> Result<Option<Saved>> {
        let Some((assignment, _)) = self.assignment(user, record)? else {
            return Ok(None);
        };
        if input.rating.is_some_and(|r| !(-1..=1).contains(&r)) {
            bail!("rating must be -1, 0, 1 or null");
        }
        if input.comment.as_ref().is_some_and(|c| c.chars().count() > MAX_COMMENT) {
            bail!("a comment has at most {MAX_COMMENT} characters");
        }
        if input
            .correction
            .as_ref()
            .is_some_and(|c| c.chars().count() > MAX_COMMENT)
        {
            bail!("a correction has at most {MAX_COMMENT} characters");
        }
        let Some((_, _, s)) = self.solution(record)? else {
            return Ok(None);
        };
        if step >= s.steps.len() {
            bail!("step {step} is past the record's {} steps", s.steps.len());
        }
        let assist: bool = self
            .db
            .query_row("SELECT assist FROM assignments WHERE id = ?1", [assignment], |r| {
                r.get(0)
            })?;
        let suggestion = if assist { select::suggestions(&s)[step] } else { None };
        let t = now();
        let tx = self.db.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let before: Option<Option<i64>> = tx
            .query_row(
                "SELECT rating FROM ratings WHERE assignment_id = ?1 AND step = ?2",
                params![assignment, step as i64],
                |r| r.get(0),
            )
            .optional()?;
        tx.execute(
            "INSERT INTO ratings (assignment_id, step, rating, comment, at, suggestion) VALUES (?1, ?2, ?3, COALESCE(?4, ''), ?5, ?6)
             ON CONFLICT (assignment_id, step) DO UPDATE SET rating = excluded.rating,
             comment = COALESCE(?4, ratings.comment), at = excluded.at, suggestion = excluded.suggestion",
            params![assignment, step as i64, input.rating, input.comment, t, suggestion],
        )?;
        // A correction that is the step as it stands (the page's box starts from it) is none.
        let unchanged = |c: &str| c.is_empty() || c == s.steps[step].text.trim();
        match input.correction.as_deref().map(str::trim) {
            None => {}
            Some(c) if unchanged(c) => {
                tx.execute(
                    "DELETE FROM corrections WHERE assignment_id = ?1 AND step = ?2",
                    params![assignment, step as i64],
                )?;
            }
            Some(text) => {
                tx.execute(
                    "INSERT INTO corrections (assignment_id, step, text, at) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (assignment_id, step) DO UPDATE SET text = excluded.text, at = excluded.at",
                    params![assignment, step as i64, text, t],
                )?;
            }
        }
        let reopened = before.flatten() != input.rating
            && tx.execute(
                "UPDATE assignments SET finished = NULL, finish_reason = NULL WHERE id = ?1 AND finished IS NOT NULL",
                [assignment],
            )? > 0;
        tx.commit()?;
        Ok(Some(Saved { saved_at: t, reopened }))
    }

    /// The records `user` has been given in `project`, the latest first (at most
    /// [`HISTORY_LIMIT`]): what the page's history lists and `p` walks back through.
    pub fn history(&self, user: i64, project: &Project) -> Result<Vec<Labelled>> {
        let mut q = self.db.prepare(
            "SELECT r.id, r.ext_id, a.finished, a.finish_reason,
                    (SELECT COUNT(rating) FROM ratings WHERE assignment_id = a.id)
             FROM assignments a JOIN records r ON r.id = a.record_id
             WHERE a.user_id = ?1 AND r.project_id = ?2 ORDER BY a.id DESC LIMIT ?3",
        )?;
        let rows = q.query_map(params![user, project.id, HISTORY_LIMIT as i64], |r| {
            Ok(Labelled {
                record: r.get(0)?,
                ext_id: r.get(1)?,
                finished: r.get(2)?,
                finish_reason: r.get(3)?,
                rated: r.get(4)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Finishes `user`'s labelling of `record` with one of PRM800K's reasons; `Ok(None)` when it
    /// is not theirs. `found_error` needs a −1; `solution` needs every step rated.
    pub fn finish(&mut self, user: i64, record: i64, reason: &str) -> Result<Option<()>> {
        if !FINISH_REASONS.contains(&reason) {
            bail!("finish_reason must be one of {}", FINISH_REASONS.join(", "));
        }
        let Some((assignment, _)) = self.assignment(user, record)? else {
            return Ok(None);
        };
        let (rated, bad): (i64, i64) = self.db.query_row(
            "SELECT COUNT(rating), COALESCE(SUM(rating = -1), 0) FROM ratings WHERE assignment_id = ?1",
            [assignment],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let steps: i64 = self
            .db
            .query_row("SELECT n_steps FROM records WHERE id = ?1", [record], |r| r.get(0))?;
        match reason {
            "found_error" if bad == 0 => bail!("found_error needs a step rated -1"),
            "solution" if rated < steps => bail!("solution needs every step rated ({rated} of {steps} are)"),
            _ => {}
        }
        self.db.execute(
            "UPDATE assignments SET finished = ?2, finish_reason = ?3 WHERE id = ?1",
            params![assignment, now(), reason],
        )?;
        Ok(Some(()))
    }
}
