//! ProcessBench: `{id, generator, problem, steps: [str], final_answer_correct, label}` where
//! `label` is the index of the earliest wrong step, or -1 when every step is correct.

use super::{binary_labels, extend_with_meta, problem_id_for};
use crate::error::FieldError;
use crate::json::{self, object};
use crate::record::{Provenance, Solution, Step, StepLabel};
use serde_json::{json, Value};

const KNOWN: &[&str] = &["id", "generator", "problem", "steps", "final_answer_correct", "label"];

pub(super) fn read(v: &Value, index: usize) -> Result<Solution, FieldError> {
    let o = object(v, "")?;
    let question = json::str_field(o, "problem")?.to_string();
    let texts = json::str_array(o, "steps")?;
    let label = json::i64_field(o, "label")?;
    if label < -1 || label >= texts.len() as i64 {
        return Err(FieldError::new(
            "label",
            format!("must be -1 or a step index below {}, found {label}", texts.len()),
        ));
    }
    let correct = match o.get("final_answer_correct") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(other) => {
            return Err(FieldError::new(
                "final_answer_correct",
                format!("expected a boolean, found {}", json::kind(other)),
            ))
        }
    };
    let steps = texts
        .into_iter()
        .enumerate()
        .map(|(i, text)| {
            let label = match label {
                -1 => Some(true),
                k if (i as i64) < k => Some(true),
                k if i as i64 == k => Some(false),
                _ => None,
            };
            Step {
                text,
                label: label.map(|g| StepLabel::from_bool(g, Provenance::Human)),
                ..Default::default()
            }
        })
        .collect();
    Ok(Solution {
        id: json::opt_str(o, "id")?.unwrap_or_else(|| index.to_string()),
        problem_id: problem_id_for(&question),
        question,
        steps,
        final_answer: None,
        gold_answer: None,
        correct,
        generator: json::opt_str(o, "generator")?,
        meta: json::rest(o, KNOWN),
        ..Default::default()
    })
}

pub(super) fn write(s: &Solution) -> Value {
    let first_error = binary_labels(s).iter().position(|g| !g);
    let label = first_error.map_or(-1, |i| i as i64);
    let mut v = json!({
        "id": s.id,
        "generator": s.generator,
        "problem": s.question,
        "steps": s.step_texts(),
        "final_answer_correct": s.correct.unwrap_or(first_error.is_none()),
        "label": label,
    });
    extend_with_meta(v.as_object_mut().unwrap(), s);
    v
}
