//! The boundary: Rust work without the GIL, errors and panics as Python exceptions, records as
//! Python dicts.

use crate::StepwiseError;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use serde_json::Value;
use std::panic::AssertUnwindSafe;
use stepwise_core::{Format, Solution};

/// An error from Rust as `stepwise.StepwiseError`, with its whole chain of causes.
pub fn error(e: anyhow::Error) -> PyErr {
    StepwiseError::new_err(format!("{e:#}"))
}

/// A bad argument as `ValueError`.
pub fn value_error(message: impl Into<String>) -> PyErr {
    PyValueError::new_err(message.into())
}

/// Runs `f` with the GIL released; its error becomes a `StepwiseError`, and a panic one that
/// says it is a bug (never an abort or a `PanicException`).
pub fn without_gil<T: Send>(py: Python<'_>, f: impl FnOnce() -> anyhow::Result<T> + Send) -> PyResult<T> {
    py.detach(|| std::panic::catch_unwind(AssertUnwindSafe(f)))
        .map_err(|panic| {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown".into());
            StepwiseError::new_err(format!(
                "internal error (a bug in stepwise; please report it): {message}"
            ))
        })?
        .map_err(error)
}

/// A JSON value as the Python object it reads as (dicts, lists, str, int, float, bool, None).
pub fn to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    pythonize::pythonize(py, v).map_err(|e| value_error(e.to_string()))
}

/// A Python object as JSON (dicts with string keys, lists, tuples, scalars).
pub fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    pythonize::depythonize::<Value>(obj).map_err(|e| value_error(format!("not a JSON-like value: {e}")))
}

/// Records in any format stepwise reads as solutions: each record's format detected (or
/// `format`), read as the command line reads files. An error names the record and the field.
pub fn solutions_of(records: &[Value], format: Option<Format>) -> anyhow::Result<Vec<Solution>> {
    let mut out = Vec::with_capacity(records.len());
    for (i, v) in records.iter().enumerate() {
        let format = match format.or_else(|| Format::detect(v)) {
            Some(f) => f,
            None => anyhow::bail!(
                "record {}: not a format stepwise reads (give `format=`, or see `stepwise convert --help`)",
                i + 1
            ),
        };
        // Records made by hand in stepwise's shape may leave the ids out: the position and the
        // question stand in for them, as the file readers' formats derive theirs.
        let patched;
        let v = match (format, v) {
            (Format::Stepwise, Value::Object(o)) if !o.contains_key("id") || !o.contains_key("problem_id") => {
                let mut o = o.clone();
                o.entry("id").or_insert_with(|| Value::from(i.to_string()));
                if let Some(q) = o.get("question").and_then(Value::as_str) {
                    let pid = stepwise_core::formats::problem_id_for(q);
                    o.entry("problem_id").or_insert_with(|| Value::from(pid));
                }
                patched = Value::Object(o);
                &patched
            }
            _ => v,
        };
        out.extend(
            format
                .read(v, i)
                .map_err(|e| anyhow::anyhow!("record {} ({}): {e}", i + 1, format.name()))?,
        );
    }
    Ok(out)
}

/// Solutions as stepwise's own records (the shape `stepwise.read` returns).
pub fn records_of(sols: &[Solution]) -> anyhow::Result<Vec<Value>> {
    in_format(sols, Format::Stepwise)
}

/// Solutions as records of `format` (a format that groups a problem's solutions writes one
/// record a group).
pub fn in_format(sols: &[Solution], format: Format) -> anyhow::Result<Vec<Value>> {
    let groups: Vec<&[Solution]> = if format.groups_by_problem() {
        sols.chunk_by(|a, b| a.problem_id == b.problem_id).collect()
    } else {
        sols.chunks(1).collect()
    };
    let mut out = Vec::with_capacity(sols.len());
    for g in groups {
        out.extend(
            format
                .write(g)
                .map_err(|e| anyhow::anyhow!("solution `{}` as {}: {e}", g[0].id, format.name()))?,
        );
    }
    Ok(out)
}

/// A format by name.
pub fn format_named(name: &str) -> PyResult<Format> {
    name.parse::<Format>().map_err(value_error)
}

/// The records of a Python argument: a list (or iterable) of dicts, or one dict.
pub fn records_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<Value>> {
    match from_py(obj)? {
        Value::Array(items) => Ok(items),
        one @ Value::Object(_) => Ok(vec![one]),
        _ => {
            // An iterable that is not a list (a generator, a datasets.Dataset's rows).
            let items: Vec<Bound<'_, PyAny>> = obj
                .try_iter()
                .map_err(|_| value_error("expected records: a list of dicts"))?
                .collect::<PyResult<_>>()?;
            items.iter().map(from_py).collect()
        }
    }
}
