//! TRL's stepwise supervision layout (`PRMTrainer`): `{prompt, completions: [str], labels: [bool]}`,
//! with `id` and, when known, `generator` and the outcome `correct` as extra columns (TRL
//! ignores columns it does not use), so a ProcessBench record survives a round trip. A record
//! read without `id` is written with its index as its `id`.

use super::{binary_labels, extend_with_meta, problem_id_for};
use crate::error::FieldError;
use crate::json::{self, object};
use crate::record::{Provenance, Solution, Step, StepLabel};
use serde_json::{json, Value};

const KNOWN: &[&str] = &["prompt", "completions", "labels", "id", "generator", "correct"];

pub(super) fn read(v: &Value, index: usize) -> Result<Solution, FieldError> {
    let o = object(v, "")?;
    let question = json::str_field(o, "prompt")?.to_string();
    let texts = json::str_array(o, "completions")?;
    let labels = json::array_field(o, "labels")?;
    if labels.len() != texts.len() {
        return Err(FieldError::new(
            "labels",
            format!("has {} entries but `completions` has {}", labels.len(), texts.len()),
        ));
    }
    let steps = texts
        .into_iter()
        .zip(labels)
        .enumerate()
        .map(|(i, (text, l))| {
            let good = match l {
                Value::Bool(b) => *b,
                Value::Number(n) if n.as_i64() == Some(1) => true,
                Value::Number(n) if n.as_i64() == Some(0) => false,
                other => {
                    return Err(FieldError::new(
                        format!("labels[{i}]"),
                        format!("expected a boolean, found {}", json::kind(other)),
                    ))
                }
            };
            Ok(Step::labelled(text, StepLabel::from_bool(good, Provenance::Unknown)))
        })
        .collect::<Result<_, _>>()?;
    let correct = match o.get("correct") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(other) => {
            return Err(FieldError::new(
                "correct",
                format!("expected a boolean, found {}", json::kind(other)),
            ))
        }
    };
    Ok(Solution {
        id: json::opt_str(o, "id")?.unwrap_or_else(|| index.to_string()),
        problem_id: problem_id_for(&question),
        question,
        steps,
        correct,
        generator: json::opt_str(o, "generator")?,
        meta: json::rest(o, KNOWN),
        ..Default::default()
    })
}

pub(super) fn write(s: &Solution) -> Value {
    let mut v = json!({
        "prompt": s.question,
        "completions": s.step_texts(),
        "labels": binary_labels(s),
        "id": s.id,
    });
    let o = v.as_object_mut().unwrap();
    if let Some(g) = &s.generator {
        o.insert("generator".into(), json!(g));
    }
    if let Some(c) = s.correct {
        o.insert("correct".into(), json!(c));
    }
    extend_with_meta(o, s);
    v
}
