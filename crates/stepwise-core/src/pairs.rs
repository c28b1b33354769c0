//! Step-level preference pairs (Step-DPO, Lai et al. 2024) from step-labelled records: at one
//! question and one prefix of steps none of which is wrong, a next step labelled right (chosen)
//! against a next step labelled wrong (rejected). DPO on such pairs trains a policy where it
//! goes wrong, not on whole answers.
//!
//! The candidates for the step after a prefix come from every record of the same question whose
//! steps begin with that prefix (a tree's siblings: OmegaPRM, several samples sharing steps), from
//! PRM800K's other rated `completions` of a step and its `human_completion`, and from the studio's
//! human corrections (`meta.studio`, a labeller's rewrite of a step). A step is *chosen* when it is
//! rated +1, has a soft label (Monte Carlo) of at least `chosen_min`, or was written by a person;
//! *rejected* when it is rated −1 or its soft label is 0 (no rollout from it succeeded). A prefix
//! stops at its first step that is wrong or unlabelled; a 0 (acceptable, no progress) extends it.

use crate::record::{LabelValue, Rating, Solution, StepLabel};
use serde::Serialize;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::hash::Hasher;
use twox_hash::XxHash64;

/// How pairs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// stepwise's own: `{id, problem_id, question, prefix: [steps], chosen, rejected, answer,
    /// chosen_source, rejected_source}`, to template as a model needs.
    #[default]
    Stepwise,
    /// Step-DPO's columns (`xinlai/Math-Step-DPO-10K`): `{dataset, prompt, initial_reason_steps,
    /// chosen, rejected, full_chosen, full_rejected, answer}`, each prefix step followed by the
    /// separator.
    StepDpo,
    /// TRL's `DPOTrainer` standard layout: `{prompt, chosen, rejected}`, the prompt being the
    /// question and the prefix, each followed by the separator.
    Trl,
}

impl std::str::FromStr for Layout {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "stepwise" => Ok(Layout::Stepwise),
            "step-dpo" | "step_dpo" => Ok(Layout::StepDpo),
            "trl" => Ok(Layout::Trl),
            other => Err(format!("unknown pair layout `{other}` (stepwise, step-dpo, trl)")),
        }
    }
}

/// Where a candidate step came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// A record's own step (or the step of another record sharing the prefix).
    Step,
    /// One of PRM800K's other rated completions of the step.
    Completion,
    /// Written by a person: PRM800K's `human_completion`, a studio correction.
    Human,
    /// Sampled from the prefix by a policy and reaching the gold answer (Step-DPO's
    /// rectification: `stepwise pairs --complete-with`).
    Sampled,
}

impl Source {
    /// Its name, as written.
    pub fn name(self) -> &'static str {
        match self {
            Source::Step => "step",
            Source::Completion => "completion",
            Source::Human => "human",
            Source::Sampled => "sampled",
        }
    }
}

/// One pair.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepPair {
    /// The record the rejected step is in and the step's index, `"{id}@{step}"`, with `#k` after
    /// it for the second and later wrong steps at one place.
    pub id: String,
    /// The question's problem id.
    pub problem_id: String,
    /// The question.
    pub question: String,
    /// The steps before, none of them wrong.
    pub prefix: Vec<String>,
    /// A right next step.
    pub chosen: String,
    /// A wrong next step.
    pub rejected: String,
    /// The reference answer, when known.
    pub answer: Option<String>,
    /// Where the chosen step came from.
    pub chosen_source: Source,
    /// Where the rejected step came from.
    pub rejected_source: Source,
    /// Whether the chosen step ended its solution (a model stops after it rather than writing
    /// the separator and another step).
    pub chosen_ends: bool,
    /// Whether the rejected step ended its solution.
    pub rejected_ends: bool,
}

/// A wrong step after a sound prefix with no right step beside it: a pair waiting for its chosen
/// step, which Step-DPO samples from the prefix ([`Unpaired::with_chosen`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unpaired {
    /// As [`StepPair::id`].
    pub id: String,
    /// The question's problem id.
    pub problem_id: String,
    /// The question.
    pub question: String,
    /// The steps before, none of them wrong.
    pub prefix: Vec<String>,
    /// The wrong step.
    pub rejected: String,
    /// The reference answer, when known.
    pub answer: Option<String>,
    /// Where the wrong step came from.
    pub rejected_source: Source,
    /// Whether the wrong step ended its solution.
    pub rejected_ends: bool,
}

impl Unpaired {
    /// The pair this wrong step makes with `chosen` (`ends`: it ended its solution) from `source`.
    pub fn with_chosen(&self, chosen: String, chosen_source: Source, chosen_ends: bool) -> StepPair {
        StepPair {
            id: self.id.clone(),
            problem_id: self.problem_id.clone(),
            question: self.question.clone(),
            prefix: self.prefix.clone(),
            chosen,
            rejected: self.rejected.clone(),
            answer: self.answer.clone(),
            chosen_source,
            rejected_source: self.rejected_source,
            chosen_ends,
            rejected_ends: self.rejected_ends,
        }
    }

    /// Whether `other` waits at the same question and prefix.
    pub fn same_place(&self, other: &Unpaired) -> bool {
        self.question == other.question && self.prefix == other.prefix
    }
}

/// The places (question and prefix) `unpaired` wait at, those of one place being together as
/// [`step_pairs_and_unpaired`] gives them.
pub fn places_of(unpaired: &[Unpaired]) -> usize {
    unpaired.chunk_by(Unpaired::same_place).count()
}

/// What was found, besides the pairs.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PairStats {
    /// Records read.
    pub records: usize,
    /// Distinct (question, prefix) places with at least one labelled next step.
    pub prefixes: usize,
    /// Distinct wrong steps after a sound prefix.
    pub wrong_steps: usize,
    /// Of those, how many had no right step beside them (no pair: a policy's sampling from the
    /// prefix, as Step-DPO does, would supply one).
    pub without_chosen: usize,
    /// Steps labelled both right and wrong at the same place (left out of both sides).
    pub conflicting: usize,
    /// Pairs, by where their chosen step came from.
    pub chosen_from: std::collections::BTreeMap<String, usize>,
}

#[derive(Clone, Copy, PartialEq)]
enum Verdict {
    Right,
    Wrong,
    /// Neither side: a 0, or a soft label between 0 and `chosen_min`.
    Neutral,
}

fn verdict(label: &StepLabel, chosen_min: f32) -> Verdict {
    match label.value {
        LabelValue::Hard { rating: Rating::Good } => Verdict::Right,
        LabelValue::Hard { rating: Rating::Bad } => Verdict::Wrong,
        LabelValue::Hard {
            rating: Rating::Neutral,
        } => Verdict::Neutral,
        LabelValue::Soft { p } if p <= 0.0 => Verdict::Wrong,
        LabelValue::Soft { p } if p >= chosen_min => Verdict::Right,
        LabelValue::Soft { .. } => Verdict::Neutral,
    }
}

fn rating_verdict(r: Option<i64>) -> Option<Verdict> {
    match r? {
        1 => Some(Verdict::Right),
        -1 => Some(Verdict::Wrong),
        0 => Some(Verdict::Neutral),
        _ => None,
    }
}

/// The candidates a record carries beside its own step `i`: PRM800K's other rated completions
/// and human completion of that step, and studio corrections of it.
fn extra_candidates(s: &Solution) -> Vec<Vec<(String, Verdict, Source)>> {
    let mut out = vec![Vec::new(); s.steps.len()];
    for (slot, r) in out.iter_mut().zip(crate::formats::prm800k_written_steps(s)) {
        for c in r.get("completions").and_then(Value::as_array).into_iter().flatten() {
            if let (Some(t), Some(v)) = (
                c.get("text").and_then(Value::as_str),
                rating_verdict(c.get("rating").and_then(Value::as_i64)),
            ) {
                slot.push((t.to_string(), v, Source::Completion));
            }
        }
        if let Some(t) = r
            .get("human_completion")
            .and_then(|h| h.get("text"))
            .and_then(Value::as_str)
        {
            slot.push((t.to_string(), Verdict::Right, Source::Human));
        }
    }
    let studio = s.meta.get("studio");
    let labellings = studio
        .and_then(|m| m.get("labellings"))
        .and_then(Value::as_array)
        .map(|a| a.iter().collect::<Vec<_>>())
        .unwrap_or_else(|| studio.into_iter().collect());
    for l in labellings {
        for (k, t) in l.get("corrections").and_then(Value::as_object).into_iter().flatten() {
            if let (Ok(i), Some(t)) = (k.parse::<usize>(), t.as_str()) {
                if let Some(slot) = out.get_mut(i) {
                    slot.push((t.to_string(), Verdict::Right, Source::Human));
                }
            }
        }
    }
    out
}

/// A (question, prefix) place: a 128-bit hash chained step by step, so that a record's places
/// cost no copies of its prefixes.
type Place = (u64, u64);

fn extend(place: Place, text: &str) -> Place {
    let h = |seed: u64, prev: u64| {
        let mut x = XxHash64::with_seed(seed);
        x.write_u64(prev);
        x.write_usize(text.len());
        x.write(text.as_bytes());
        x.finish()
    };
    (h(1, place.0), h(2, place.1))
}

struct Group {
    /// The record and step that first reached this place (its question and prefix).
    at: (usize, usize),
    /// Text, verdict, source, record, and whether it ended the record (it sits at the record's
    /// last step).
    candidates: Vec<(String, Verdict, Source, usize, bool)>,
}

/// Refuse a `chosen_min` outside (0, 1], the error naming the setting as the caller spells it
/// (`--chosen-min`, `chosen_min`).
pub fn check_chosen_min(name: &str, chosen_min: f32) -> Result<(), String> {
    if chosen_min > 0.0 && chosen_min <= 1.0 {
        Ok(())
    } else {
        Err(format!("{name} must be in (0, 1], not {chosen_min}"))
    }
}

/// Every pair the records hold (module docs), the places in the order first met; each wrong
/// step is paired once, the right steps taken in turn (written by a person first).
pub fn step_pairs(records: &[Solution], chosen_min: f32) -> (Vec<StepPair>, PairStats) {
    let (pairs, _, stats) = step_pairs_and_unpaired(records, chosen_min);
    (pairs, stats)
}

/// [`step_pairs`], and the wrong steps left without a pair (`stats.without_chosen` of them), the
/// places in the order first met, those of one place together.
pub fn step_pairs_and_unpaired(records: &[Solution], chosen_min: f32) -> (Vec<StepPair>, Vec<Unpaired>, PairStats) {
    let mut groups: Vec<Group> = Vec::new();
    let mut index: HashMap<Place, usize> = HashMap::new();
    for (r, s) in records.iter().enumerate() {
        let extra = extra_candidates(s);
        let mut place = extend((0, 0), &s.question);
        for (i, step) in s.steps.iter().enumerate() {
            // A step a person wrote (PRM800K's chosen human completion) is right unrated.
            let written = || {
                extra[i]
                    .iter()
                    .any(|(t, _, src)| *src == Source::Human && *t == step.text)
            };
            let own = match &step.label {
                Some(l) => Some(verdict(l, chosen_min)),
                None => written().then_some(Verdict::Right),
            };
            let g = *index.entry(place).or_insert_with(|| {
                groups.push(Group {
                    at: (r, i),
                    candidates: Vec::new(),
                });
                groups.len() - 1
            });
            let ends = i + 1 == s.steps.len();
            if let Some(v) = own {
                groups[g].candidates.push((step.text.clone(), v, Source::Step, r, ends));
            }
            for (t, v, src) in &extra[i] {
                groups[g].candidates.push((t.clone(), *v, *src, r, ends));
            }
            if !matches!(own, Some(Verdict::Right | Verdict::Neutral)) {
                break;
            }
            place = extend(place, &step.text);
        }
    }
    let mut stats = PairStats {
        records: records.len(),
        ..Default::default()
    };
    let (mut pairs, mut unpaired) = (Vec::new(), Vec::new());
    for g in groups.into_iter().filter(|g| !g.candidates.is_empty()) {
        stats.prefixes += 1;
        pairs_at(records, g, &mut stats, &mut pairs, &mut unpaired);
    }
    (pairs, unpaired, stats)
}

fn pairs_at(
    records: &[Solution],
    g: Group,
    stats: &mut PairStats,
    pairs: &mut Vec<StepPair>,
    unpaired: &mut Vec<Unpaired>,
) {
    let mut right: Vec<(String, Source, bool)> = Vec::new();
    let mut wrong: Vec<(String, Source, usize, bool)> = Vec::new();
    for (t, v, src, r, ends) in g.candidates {
        match v {
            Verdict::Right if !right.iter().any(|(x, ..)| *x == t) => right.push((t, src, ends)),
            Verdict::Wrong if !wrong.iter().any(|(x, ..)| *x == t) => wrong.push((t, src, r, ends)),
            _ => {}
        }
    }
    let before = right.len() + wrong.len();
    let both: Vec<String> = right
        .iter()
        .filter(|(t, ..)| wrong.iter().any(|(w, ..)| w == t))
        .map(|(t, ..)| t.clone())
        .collect();
    right.retain(|(t, ..)| !both.contains(t));
    wrong.retain(|(t, ..)| !both.contains(t));
    stats.conflicting += (before - right.len() - wrong.len()) / 2;
    stats.wrong_steps += wrong.len();
    let (r0, i0) = g.at;
    let prefix: Vec<String> = records[r0].steps[..i0].iter().map(|s| s.text.clone()).collect();
    let waiting = wrong
        .into_iter()
        .enumerate()
        .map(|(k, (rejected, rejected_source, r, rejected_ends))| {
            let s = &records[r];
            Unpaired {
                id: if k == 0 {
                    format!("{}@{}", s.id, i0)
                } else {
                    format!("{}@{}#{k}", s.id, i0)
                },
                problem_id: s.problem_id.clone(),
                question: s.question.clone(),
                prefix: prefix.clone(),
                rejected,
                answer: s.gold_answer.clone(),
                rejected_source,
                rejected_ends,
            }
        });
    if right.is_empty() {
        let before = unpaired.len();
        unpaired.extend(waiting);
        stats.without_chosen += unpaired.len() - before;
        return;
    }
    right.sort_by_key(|(_, src, _)| *src != Source::Human);
    for (k, w) in waiting.enumerate() {
        let (chosen, chosen_source, chosen_ends) = right[k % right.len()].clone();
        *stats.chosen_from.entry(chosen_source.name().to_string()).or_default() += 1;
        pairs.push(w.with_chosen(chosen, chosen_source, chosen_ends));
    }
}

impl StepPair {
    /// This pair as a record of `layout`: the steps joined by `separator` (after each step of
    /// the prefix, and after the question in TRL's prompt); `dataset` fills Step-DPO's column.
    pub fn to_json(&self, layout: Layout, dataset: &str, separator: &str) -> Value {
        let steps: String = self.prefix.iter().map(|s| format!("{s}{separator}")).collect();
        match layout {
            Layout::Stepwise => json!(self),
            Layout::StepDpo => json!({
                "dataset": dataset, "prompt": self.question, "initial_reason_steps": steps,
                "chosen": self.chosen, "rejected": self.rejected,
                "full_chosen": format!("{steps}{}", self.chosen), "full_rejected": format!("{steps}{}", self.rejected),
                "answer": self.answer.clone().unwrap_or_default(),
            }),
            Layout::Trl => {
                let mut m = Map::new();
                m.insert("prompt".into(), json!(format!("{}{separator}{steps}", self.question)));
                m.insert("chosen".into(), json!(self.chosen));
                m.insert("rejected".into(), json!(self.rejected));
                Value::Object(m)
            }
        }
    }
}
