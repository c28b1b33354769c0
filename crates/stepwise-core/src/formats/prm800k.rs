//! OpenAI PRM800K, phases 1 and 2. Each record rates, step by step, one or more candidate
//! completions (-1/0/1); the solution follows `chosen_completion` (or the human completion, or,
//! on the step where a phase-2 labeler found the error, the first completion rated -1). The full
//! record, alternatives included, is kept in `meta.prm800k` so that writing back is lossless.

use super::problem_id_for;
use crate::answer::extract_prm800k_answer;
use crate::error::FieldError;
use crate::json::{self, object};
use crate::record::{LabelValue, Provenance, Rating, Solution, Step, StepLabel};
use serde_json::{json, Map, Value};

const ORIGINAL: &str = "prm800k";

/// Which completion of a step the solution follows.
#[derive(Clone, Copy)]
enum Chosen {
    Completion(usize),
    Human,
}

fn chosen_ref(step: &Map<String, Value>, i: usize) -> Result<Chosen, FieldError> {
    let at = |f: &str| format!("label.steps[{i}].{f}");
    let completions = match step.get("completions") {
        None | Some(serde_json::Value::Null) => &[][..],
        Some(_) => json::array_field(step, "completions").map_err(|e| e.within(&format!("label.steps[{i}]")))?,
    };
    match step.get("chosen_completion") {
        Some(Value::Number(n)) => {
            let k = n
                .as_u64()
                .ok_or_else(|| FieldError::new(at("chosen_completion"), "expected an index"))?
                as usize;
            if k >= completions.len() {
                return Err(FieldError::new(
                    at("chosen_completion"),
                    format!("index {k} but only {} completions", completions.len()),
                ));
            }
            Ok(Chosen::Completion(k))
        }
        None | Some(Value::Null) if step.get("human_completion").is_some_and(Value::is_object) => Ok(Chosen::Human),
        None | Some(Value::Null) => completions
            .iter()
            .position(|c| c.get("rating").and_then(Value::as_i64) == Some(-1))
            .or(if completions.is_empty() { None } else { Some(0) })
            .map(Chosen::Completion)
            .ok_or_else(|| FieldError::new(at("completions"), "no completion to follow")),
        Some(other) => Err(FieldError::new(
            at("chosen_completion"),
            format!("expected an index or null, found {}", json::kind(other)),
        )),
    }
}

/// A step with no completion at all (PRM800K's `give_up` records end with one).
fn is_empty_step(step: &Map<String, Value>) -> bool {
    step.get("completions")
        .is_none_or(|c| c.as_array().is_none_or(|a| a.is_empty()))
        && step.get("human_completion").is_none_or(Value::is_null)
}

/// The raw steps of the PRM800K record kept in `s.meta.prm800k` that `s`'s steps were read
/// from, in order: a step where nothing was written (a give-up) is skipped, as the reader skips
/// it. Empty when `s` was not read from PRM800K.
pub fn written_steps(s: &Solution) -> Vec<&Map<String, Value>> {
    s.meta
        .get(ORIGINAL)
        .and_then(|v| v.pointer("/label/steps"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
        .filter(|o| !is_empty_step(o))
        .take(s.steps.len())
        .collect()
}

fn chosen_mut(step: &mut Value, which: Chosen) -> Option<&mut Value> {
    match which {
        Chosen::Completion(k) => step.get_mut("completions")?.get_mut(k),
        Chosen::Human => step.get_mut("human_completion"),
    }
}

fn chosen(step: &Map<String, Value>, i: usize) -> Result<&Map<String, Value>, FieldError> {
    let pick = match chosen_ref(step, i)? {
        Chosen::Completion(k) => &step["completions"][k],
        Chosen::Human => &step["human_completion"],
    };
    object(pick, &format!("label.steps[{i}].completions"))
}

pub(super) fn read(v: &Value, index: usize) -> Result<Solution, FieldError> {
    let o = object(v, "")?;
    let q = object(json::field(o, "question")?, "question")?;
    let question = json::str_field(q, "problem")
        .map_err(|e| e.within("question"))?
        .to_string();
    let gold = json::opt_str(q, "ground_truth_answer").map_err(|e| e.within("question"))?;
    let label = object(json::field(o, "label")?, "label")?;
    let raw_steps = json::array_field(label, "steps").map_err(|e| e.within("label"))?;
    let mut steps = Vec::with_capacity(raw_steps.len());
    for (i, st) in raw_steps.iter().enumerate() {
        let st = object(st, &format!("label.steps[{i}]"))?;
        if is_empty_step(st) {
            continue; // a labeler gave up here: nothing was written
        }
        let c = chosen(st, i)?;
        let text = json::str_field(c, "text").map_err(|e| e.within(&format!("label.steps[{i}].completion")))?;
        let rating = match c.get("rating") {
            None | Some(Value::Null) => None,
            Some(r) => Some(r.as_i64().and_then(Rating::from_i64).ok_or_else(|| {
                FieldError::new(
                    format!("label.steps[{i}].rating"),
                    format!("expected -1, 0 or 1, found {r}"),
                )
            })?),
        };
        steps.push(Step {
            text: text.to_string(),
            label: rating.map(|r| StepLabel::hard(r, Provenance::Human)),
            ..Default::default()
        });
    }
    let finish = json::opt_str(label, "finish_reason").map_err(|e| e.within("label"))?;
    let final_answer = match finish.as_deref() {
        Some("solution") => steps.last().and_then(|s| extract_prm800k_answer(&s.text)),
        _ => None,
    };
    let mut meta = Map::new();
    meta.insert(ORIGINAL.into(), v.clone());
    Ok(Solution {
        id: json::opt_str(o, "id")?.unwrap_or_else(|| index.to_string()),
        problem_id: problem_id_for(&question),
        question,
        steps,
        final_answer,
        gold_answer: gold,
        correct: None,
        generator: None,
        meta,
        ..Default::default()
    })
}

fn rating_of(step: &Step) -> Value {
    match step.label.as_ref().map(|l| l.value) {
        None => Value::Null,
        Some(LabelValue::Hard { rating }) => json!(rating.as_i64()),
        Some(LabelValue::Soft { p }) => json!(if p > 0.0 { 1 } else { -1 }),
    }
}

/// Whether the kept original still describes these steps (same chosen texts).
fn original_matches(orig: &Value, s: &Solution) -> bool {
    let Some(raw) = orig.pointer("/label/steps").and_then(Value::as_array) else {
        return false;
    };
    let raw: Vec<(usize, &Value)> = raw
        .iter()
        .enumerate()
        .filter(|(_, r)| r.as_object().is_some_and(|o| !is_empty_step(o)))
        .collect();
    raw.len() == s.steps.len()
        && raw.iter().zip(&s.steps).all(|((i, r), st)| {
            let i = *i;
            r.as_object()
                .and_then(|r| chosen(r, i).ok())
                .and_then(|c| c.get("text").and_then(Value::as_str))
                == Some(st.text.as_str())
        })
}

pub(super) fn write(s: &Solution) -> Value {
    let mut out = match s.meta.get(ORIGINAL) {
        Some(orig) if original_matches(orig, s) => {
            let mut o = orig.clone();
            // Update the chosen completions' ratings from the (possibly edited) labels.
            let steps = o.pointer_mut("/label/steps").and_then(Value::as_array_mut).unwrap();
            let non_empty = steps
                .iter_mut()
                .enumerate()
                .filter(|(_, r)| r.as_object().is_some_and(|o| !is_empty_step(o)));
            for ((i, raw), st) in non_empty.zip(&s.steps) {
                let which = raw.as_object().and_then(|r| chosen_ref(r, i).ok());
                if let Some(t) = which.and_then(|w| chosen_mut(raw, w)) {
                    t["rating"] = rating_of(st);
                }
            }
            o
        }
        _ => {
            let steps: Vec<Value> = s
                .steps
                .iter()
                .map(|st| json!({"completions": [{"text": st.text, "rating": rating_of(st), "flagged": false}], "human_completion": null, "chosen_completion": 0}))
                .collect();
            let finish = if s.first_error().is_some() {
                "found_error"
            } else {
                "solution"
            };
            json!({"labeler": null, "timestamp": null, "generation": null, "is_quality_control_question": false,
                   "is_initial_screening_question": false, "question": {}, "label": {"steps": steps, "total_time": null, "finish_reason": finish}})
        }
    };
    out["question"]["problem"] = json!(s.question);
    if let Some(g) = &s.gold_answer {
        out["question"]["ground_truth_answer"] = json!(g);
    }
    out
}
