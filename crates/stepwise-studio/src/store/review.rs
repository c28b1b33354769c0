//! What reviewers see: every labeller's ratings of a record, adjudication, and the progress
//! and quality dashboard (agreement with gold records and between labellers).

use super::{Project, Store};
use crate::agreement;
use crate::time::now;
use anyhow::{bail, Result};
use rusqlite::params;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// One labeller's work on one record, as stored.
#[derive(Debug, Clone, Serialize)]
pub struct Labelling {
    /// The assignment's row id.
    pub assignment: i64,
    /// The record's row id.
    pub record: i64,
    /// Who.
    pub user: String,
    /// Whether the record is a gold quality-control record.
    pub gold: bool,
    /// The generation at which it was given.
    pub generation: i64,
    /// Whether suggestions were shown.
    pub assist: bool,
    /// When it was given and finished (Unix seconds).
    pub started: f64,
    /// When finished.
    pub finished: Option<f64>,
    /// PRM800K's finish reason.
    pub finish_reason: Option<String>,
    /// step → (rating, comment, when, suggestion shown).
    pub ratings: BTreeMap<usize, (Option<i64>, String, f64, Option<f64>)>,
    /// step → the step as the labeller wrote it instead (PRM800K's `human_completion`).
    pub corrections: BTreeMap<usize, String>,
}

impl Labelling {
    /// step → rating, for the steps rated.
    pub fn rated(&self) -> BTreeMap<usize, i64> {
        self.ratings.iter().filter_map(|(&i, r)| r.0.map(|x| (i, x))).collect()
    }
}

/// One labeller's line on the dashboard.
#[derive(Debug, Serialize)]
pub struct LabellerStats {
    /// Who.
    pub user: String,
    /// Records finished.
    pub finished: usize,
    /// Steps rated.
    pub steps: usize,
    /// Steps rated per minute of labelling time (from each record's start to its last rating,
    /// at most 30 minutes a record).
    pub steps_per_minute: Option<f64>,
    /// Share of gold steps rated as the gold label says, and how many.
    pub gold_step_agreement: Option<(f64, usize)>,
    /// Share of gold records whose first error they placed on the gold step.
    pub gold_first_error_agreement: Option<(f64, usize)>,
    /// Mean Cohen's κ with the other labellers, over the steps they share.
    pub mean_cohen_kappa: Option<f64>,
}

/// The project's progress and quality.
#[derive(Debug, Serialize)]
pub struct Dashboard {
    /// The project.
    pub project: String,
    /// Records, and gold ones among them.
    pub records: i64,
    /// Gold quality-control records.
    pub gold: i64,
    /// Labellings given, finished.
    pub assigned: usize,
    /// Finished labellings.
    pub finished: usize,
    /// Fleiss' κ over steps rated by two or more labellers, and how many.
    pub fleiss_kappa: Option<(f64, usize)>,
    /// Share of labeller pairs on a record that place the first error on the same step (or
    /// both find none), and how many pairs.
    pub first_error_agreement: Option<(f64, usize)>,
    /// Per labeller.
    pub labellers: Vec<LabellerStats>,
    /// Records whose labellers disagree on some step and no reviewer has settled: (row id, its id).
    pub to_review: Vec<(i64, String)>,
}

/// A record as the reviewer sees it.
#[derive(Debug, Serialize)]
pub struct ReviewView {
    /// Row id.
    pub id: i64,
    /// The question.
    pub question: String,
    /// Gold answer.
    pub gold_answer: Option<String>,
    /// Steps' texts.
    pub steps: Vec<String>,
    /// Each labeller's work.
    pub labellings: Vec<Labelling>,
    /// step → the reviewer's rating.
    pub adjudicated: BTreeMap<usize, i64>,
}

fn gold_ratings(s: &stepwise_core::record::Solution) -> BTreeMap<usize, i64> {
    s.steps
        .iter()
        .enumerate()
        .filter_map(|(i, st)| {
            let l = st.label.as_ref()?;
            Some((i, l.rating().map_or(if l.is_good() { 1 } else { -1 }, |r| r.as_i64())))
        })
        .collect()
}

impl Store {
    /// Every labelling of `project` (or of one record).
    pub fn labellings(&self, project: &Project, record: Option<i64>) -> Result<Vec<Labelling>> {
        let mut q = self.db.prepare(
            "SELECT a.id, a.record_id, u.name, r.gold, a.generation, a.assist, a.started, a.finished, a.finish_reason
             FROM assignments a JOIN records r ON r.id = a.record_id JOIN users u ON u.id = a.user_id
             WHERE r.project_id = ?1 AND (?2 IS NULL OR a.record_id = ?2) ORDER BY a.id",
        )?;
        let rows = q.query_map(params![project.id, record], |r| {
            Ok(Labelling {
                assignment: r.get(0)?,
                record: r.get(1)?,
                user: r.get(2)?,
                gold: r.get(3)?,
                generation: r.get(4)?,
                assist: r.get(5)?,
                started: r.get(6)?,
                finished: r.get(7)?,
                finish_reason: r.get(8)?,
                ratings: BTreeMap::new(),
                corrections: BTreeMap::new(),
            })
        })?;
        let mut out: Vec<Labelling> = rows.collect::<rusqlite::Result<_>>()?;
        let index: HashMap<i64, usize> = out.iter().enumerate().map(|(i, l)| (l.assignment, i)).collect();
        let mut q = self.db.prepare(
            "SELECT t.assignment_id, t.step, t.rating, t.comment, t.at, t.suggestion
             FROM ratings t JOIN assignments a ON a.id = t.assignment_id JOIN records r ON r.id = a.record_id
             WHERE r.project_id = ?1 AND (?2 IS NULL OR a.record_id = ?2)",
        )?;
        let rows = q.query_map(params![project.id, record], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                (r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?),
            ))
        })?;
        for row in rows {
            let (a, step, rating) = row?;
            if let Some(&i) = index.get(&a) {
                out[i].ratings.insert(step as usize, rating);
            }
        }
        let mut q = self.db.prepare(
            "SELECT t.assignment_id, t.step, t.text
             FROM corrections t JOIN assignments a ON a.id = t.assignment_id JOIN records r ON r.id = a.record_id
             WHERE r.project_id = ?1 AND (?2 IS NULL OR a.record_id = ?2)",
        )?;
        let rows = q.query_map(params![project.id, record], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, String>(2)?))
        })?;
        for row in rows {
            let (a, step, text) = row?;
            if let Some(&i) = index.get(&a) {
                out[i].corrections.insert(step as usize, text);
            }
        }
        Ok(out)
    }

    /// A reviewer's rating of `step` of `record`, which export takes over the labellers'.
    pub fn adjudicate(&mut self, reviewer: i64, record: i64, step: usize, rating: i64) -> Result<Option<()>> {
        if !(-1..=1).contains(&rating) {
            bail!("rating must be -1, 0 or 1");
        }
        let Some((_, _, s)) = self.solution(record)? else {
            return Ok(None);
        };
        if step >= s.steps.len() {
            bail!("step {step} is past the record's {} steps", s.steps.len());
        }
        self.db.execute(
            "INSERT INTO adjudications (record_id, step, rating, reviewer_id, at) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (record_id, step) DO UPDATE SET rating = excluded.rating, reviewer_id = excluded.reviewer_id, at = excluded.at",
            params![record, step as i64, rating, reviewer, now()],
        )?;
        Ok(Some(()))
    }

    /// step → adjudicated rating, for every record of `project` that has any.
    pub fn adjudications(&self, project: &Project) -> Result<HashMap<i64, BTreeMap<usize, i64>>> {
        let mut q = self.db.prepare(
            "SELECT d.record_id, d.step, d.rating FROM adjudications d JOIN records r ON r.id = d.record_id WHERE r.project_id = ?1",
        )?;
        let mut out: HashMap<i64, BTreeMap<usize, i64>> = HashMap::new();
        for row in q.query_map([project.id], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get(2)?))
        })? {
            let (rec, step, rating) = row?;
            out.entry(rec).or_default().insert(step as usize, rating);
        }
        Ok(out)
    }

    /// `record` with every labeller's work, for a reviewer.
    pub fn review(&self, record: i64) -> Result<Option<ReviewView>> {
        let Some((project, _, s)) = self.solution(record)? else {
            return Ok(None);
        };
        let project = self.project_by_id(project)?;
        let adjudicated = self.adjudications(&project)?.remove(&record).unwrap_or_default();
        Ok(Some(ReviewView {
            id: record,
            question: s.question.clone(),
            gold_answer: s.gold_answer.clone(),
            steps: s.step_strings(),
            labellings: self.labellings(&project, Some(record))?,
            adjudicated,
        }))
    }

    /// The progress and quality dashboard of `project`.
    pub fn dashboard(&self, project: &Project) -> Result<Dashboard> {
        let all = self.labellings(project, None)?;
        let (records, gold) = self.count_records(project)?;
        let adjudicated = self.adjudications(project)?;
        let mut gold_labels: HashMap<i64, BTreeMap<usize, i64>> = HashMap::new();
        for l in all.iter().filter(|l| l.gold) {
            if let std::collections::hash_map::Entry::Vacant(e) = gold_labels.entry(l.record) {
                if let Some((_, _, s)) = self.solution(l.record)? {
                    e.insert(gold_ratings(&s));
                }
            }
        }
        let finished: Vec<&Labelling> = all.iter().filter(|l| l.finished.is_some()).collect();
        let mut by_user: BTreeMap<&str, Vec<&Labelling>> = BTreeMap::new();
        for l in &finished {
            by_user.entry(&l.user).or_default().push(l);
        }
        // Steps of non-gold records, per user, for κ.
        let keyed: BTreeMap<&str, HashMap<(i64, usize), i64>> = by_user
            .iter()
            .map(|(u, ls)| {
                let m = ls
                    .iter()
                    .filter(|l| !l.gold)
                    .flat_map(|l| l.rated().into_iter().map(move |(i, r)| ((l.record, i), r)))
                    .collect();
                (*u, m)
            })
            .collect();
        let labellers = by_user
            .iter()
            .map(|(u, ls)| labeller_stats(u, ls, &gold_labels, &keyed))
            .collect();
        let mut items: BTreeMap<(i64, usize), Vec<i64>> = BTreeMap::new();
        let mut per_record: BTreeMap<i64, Vec<Option<usize>>> = BTreeMap::new();
        for l in finished.iter().filter(|l| !l.gold) {
            let rated = l.rated();
            per_record
                .entry(l.record)
                .or_default()
                .push(agreement::first_error(&rated));
            for (i, r) in rated {
                items.entry((l.record, i)).or_default().push(r);
            }
        }
        let (mut same, mut pairs) = (0usize, 0usize);
        for v in per_record.values() {
            for a in 0..v.len() {
                for b in a + 1..v.len() {
                    pairs += 1;
                    same += usize::from(v[a] == v[b]);
                }
            }
        }
        let mut to_review: Vec<i64> = items
            .iter()
            .filter(|((rec, step), v)| {
                v.len() >= 2
                    && v.iter().any(|r| *r != v[0])
                    && !adjudicated.get(rec).is_some_and(|a| a.contains_key(step))
            })
            .map(|((rec, _), _)| *rec)
            .collect();
        to_review.dedup();
        let to_review = to_review
            .into_iter()
            .take(200)
            .map(|r| Ok((r, self.solution(r)?.map(|s| s.1).unwrap_or_default())))
            .collect::<Result<_>>()?;
        Ok(Dashboard {
            project: project.name.clone(),
            records,
            gold,
            assigned: all.len(),
            finished: finished.len(),
            fleiss_kappa: agreement::fleiss(&items),
            first_error_agreement: (pairs > 0).then(|| (same as f64 / pairs as f64, pairs)),
            labellers,
            to_review,
        })
    }
}

fn labeller_stats(
    user: &str,
    ls: &[&Labelling],
    gold_labels: &HashMap<i64, BTreeMap<usize, i64>>,
    keyed: &BTreeMap<&str, HashMap<(i64, usize), i64>>,
) -> LabellerStats {
    let steps: usize = ls.iter().map(|l| l.rated().len()).sum();
    let minutes: f64 = ls
        .iter()
        .filter_map(|l| {
            let last = l.ratings.values().map(|r| r.2).fold(f64::NAN, f64::max);
            last.is_finite().then(|| ((last - l.started) / 60.0).clamp(0.0, 30.0))
        })
        .sum();
    let (mut gold_same, mut gold_steps, mut fe_same, mut fe_n) = (0usize, 0usize, 0usize, 0usize);
    for l in ls.iter().filter(|l| l.gold) {
        let Some(g) = gold_labels.get(&l.record) else { continue };
        let mine = l.rated();
        for (i, r) in &mine {
            if let Some(gr) = g.get(i) {
                gold_steps += 1;
                gold_same += usize::from(gr == r);
            }
        }
        fe_n += 1;
        fe_same += usize::from(agreement::first_error(&mine) == agreement::first_error(g));
    }
    let kappas: Vec<f64> = keyed
        .iter()
        .filter(|(other, _)| **other != user)
        .filter_map(|(_, theirs)| agreement::cohen(&keyed[user], theirs).map(|k| k.0))
        .collect();
    LabellerStats {
        user: user.to_string(),
        finished: ls.len(),
        steps,
        steps_per_minute: (minutes > 0.0).then(|| steps as f64 / minutes),
        gold_step_agreement: (gold_steps > 0).then(|| (gold_same as f64 / gold_steps as f64, gold_steps)),
        gold_first_error_agreement: (fe_n > 0).then(|| (fe_same as f64 / fe_n as f64, fe_n)),
        mean_cohen_kappa: (!kappas.is_empty()).then(|| kappas.iter().sum::<f64>() / kappas.len() as f64),
    }
}
