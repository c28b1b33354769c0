//! PRMBench (Song et al., 2025): `{idx, modified_question, modified_process: [str], error_steps:
//! [1-based], classification, ...}`. The modified process is the solution a verifier is asked
//! about; its error steps (1-based, not necessarily contiguous: a redundant step need not be
//! followed by wrong ones) are bad and every other step good. The original question and process,
//! the reason, the modified steps and the error type (`classification`) are kept in `meta`, so
//! a file comes back as it was.

use super::extend_with_meta;
use crate::error::FieldError;
use crate::json::{self, object};
use crate::record::{Provenance, Solution, Step, StepLabel};
use serde_json::{json, Value};

const KNOWN: &[&str] = &["idx", "modified_question", "modified_process", "error_steps"];

pub(super) fn read(v: &Value, index: usize) -> Result<Solution, FieldError> {
    let o = object(v, "")?;
    let question = json::str_field(o, "modified_question")?.to_string();
    let texts = json::str_array(o, "modified_process")?;
    let mut bad = vec![false; texts.len()];
    for (j, e) in json::array_field(o, "error_steps")?.iter().enumerate() {
        match e.as_u64() {
            Some(k) if k >= 1 && (k as usize) <= texts.len() => bad[k as usize - 1] = true,
            _ => {
                return Err(FieldError::new(
                    format!("error_steps[{j}]"),
                    format!("must be a step number from 1 to {}, found {e}", texts.len()),
                ))
            }
        }
    }
    let steps = texts
        .into_iter()
        .zip(bad)
        .map(|(text, bad)| Step::labelled(text, StepLabel::from_bool(!bad, Provenance::Human)))
        .collect();
    let id = match o.get("idx") {
        None | Some(Value::Null) => index.to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(other) => {
            return Err(FieldError::new(
                "idx",
                format!("expected a string or a number, found {}", json::kind(other)),
            ))
        }
    };
    Ok(Solution {
        id,
        problem_id: super::problem_id_for(&question),
        question,
        steps,
        meta: json::rest(o, KNOWN),
        ..Default::default()
    })
}

pub(super) fn write(s: &Solution) -> Value {
    let error_steps: Vec<usize> = s
        .steps
        .iter()
        .enumerate()
        .filter(|(_, st)| st.label.as_ref().is_some_and(|l| !l.is_good()))
        .map(|(i, _)| i + 1)
        .collect();
    let mut v = json!({
        "idx": s.id,
        "modified_question": s.question,
        "modified_process": s.step_texts(),
        "error_steps": error_steps,
    });
    extend_with_meta(v.as_object_mut().unwrap(), s);
    v
}
