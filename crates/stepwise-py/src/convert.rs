//! The boundary: Rust work without the GIL, errors and panics as Python exceptions, records as
//! Python dicts.

use crate::StepwiseError;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use serde_json::Value;
use std::panic::AssertUnwindSafe;
use stepwise_core::{Format, Solution};
use stepwise_model::packed_engine::LoraConfig;

/// The path in a `str` or `os.PathLike` argument, if it is one (a `str` that is not UTF-8, as
/// `os.fsdecode` gives for such a name, is a path too).
pub fn path_of(obj: &Bound<'_, PyAny>) -> Option<std::path::PathBuf> {
    if obj.is_instance_of::<pyo3::types::PyString>() || obj.hasattr("__fspath__").unwrap_or(false) {
        return obj.extract::<std::path::PathBuf>().ok();
    }
    None
}

/// An error from Rust as `stepwise.StepwiseError`, with its whole chain of causes (a cause its
/// outer message already says is not said twice).
pub fn error(e: anyhow::Error) -> PyErr {
    StepwiseError::new_err(chain_message(&e))
}

/// `e`'s causes joined by `: `, each left out when the text so far already ends with it.
pub fn chain_message(e: &anyhow::Error) -> String {
    let mut message = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if message.is_empty() {
            message = text;
        } else if !message.ends_with(&text) {
            message = format!("{message}: {text}");
        }
    }
    message
}

/// A bad argument as `ValueError`.
pub fn value_error(message: impl Into<String>) -> PyErr {
    PyValueError::new_err(message.into())
}

/// A panic's message as the `StepwiseError` that says it is a bug.
fn panic_error(panic: Box<dyn std::any::Any + Send>) -> PyErr {
    let message = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown".into());
    StepwiseError::new_err(format!(
        "internal error (a bug in stepwise; please report it): {message}"
    ))
}

/// Runs `f` with the GIL released; its error becomes a `StepwiseError`, and a panic one that
/// says it is a bug (never an abort or a `PanicException`).
pub fn without_gil<T: Send>(py: Python<'_>, f: impl FnOnce() -> anyhow::Result<T> + Send) -> PyResult<T> {
    py.detach(|| std::panic::catch_unwind(AssertUnwindSafe(f)))
        .map_err(panic_error)?
        .map_err(error)
}

/// Runs `f` on a thread of its own while this one waits without the GIL and runs Python's
/// signal handlers every 50 ms: Ctrl-C raises `KeyboardInterrupt` at once (the abandoned work
/// ends on its own and its result is dropped). For calls that cannot be cut into batches
/// without changing what they give (a policy's `n` samples are drawn by index).
pub fn interruptible<T: Send + 'static>(
    py: Python<'_>,
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> PyResult<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("stepwise-call".into())
        .spawn(move || {
            let _ = tx.send(std::panic::catch_unwind(AssertUnwindSafe(f)));
        })
        .map_err(|e| error(anyhow::anyhow!("starting a thread: {e}")))?;
    let mut rx = rx;
    loop {
        let got;
        (rx, got) = py.detach(move || {
            let got = rx.recv_timeout(std::time::Duration::from_millis(50));
            (rx, got)
        });
        match got {
            Ok(result) => return result.map_err(panic_error)?.map_err(error),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => py.check_signals()?,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(error(anyhow::anyhow!("the call's thread ended without an answer")))
            }
        }
    }
}

/// A JSON value as the Python object it reads as (dicts, lists, str, int, float, bool, None).
pub fn to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    pythonize::pythonize(py, v).map_err(|e| value_error(e.to_string()))
}

/// A Python object as JSON (dicts with string keys, lists, tuples, scalars). A NaN or infinite
/// float is refused, naming where it is: JSON cannot hold it, and dropping it would lose it.
pub fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    let v = pythonize::depythonize::<Strict>(obj).map_err(|e| {
        let m = e.to_string();
        match m.strip_prefix('.').unwrap_or(&m).split_once(": ") {
            Some((at, why)) if m.starts_with(['.', '[']) => value_error(format!("{at}: {why}")),
            _ => value_error(format!(
                "not a JSON-like value{}",
                if m.starts_with(':') { m } else { format!(": {m}") }
            )),
        }
    })?;
    Ok(v.0)
}

/// An error inside a list or dict, with where it is put before it (`.steps[0].score: ...`).
fn inside<E: serde::de::Error>(at: String, e: E) -> E {
    let m = e.to_string();
    if m.starts_with(['.', '[', ':']) {
        E::custom(format!("{at}{m}"))
    } else {
        E::custom(format!("{at}: {m}"))
    }
}

/// A JSON value that refuses non-finite numbers while it is built.
struct Strict(Value);

impl<'de> serde::Deserialize<'de> for Strict {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = Value;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON-like value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(v).map(Value::Number).ok_or_else(|| {
            E::custom(format!(
                ": {v} is not a finite number (give None, or leave the field out)"
            ))
        })
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(Strict(v)) = seq.next_element().map_err(|e| inside(format!("[{}]", out.len()), e))? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(k) = map.next_key::<String>()? {
            let Strict(v) = map.next_value().map_err(|e| inside(format!(".{k}"), e))?;
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
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
    format.write_all(sols).map_err(|e| anyhow::anyhow!("{e}"))
}

/// A format by name.
pub fn format_named(name: &str) -> PyResult<Format> {
    name.parse::<Format>().map_err(value_error)
}

/// The records of a Python argument: a list (or any iterable: a generator, a
/// `datasets.Dataset`) of dicts, one dict, or a path (`str` or `os.PathLike`) to a file of them in
/// any format stepwise reads. A bad record is named by its position.
pub fn records_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<Value>> {
    match existing_path(obj)? {
        // A file of records in any format stepwise reads, as `stepwise.read` gives them.
        Some(path) => without_gil(obj.py(), || {
            records_of(&stepwise_core::io::read_solution_set(&path, None)?)
        }),
        None => rows_in_memory(obj),
    }
}

/// JSON rows of a Python argument as they are (no format read into them): a list or iterable of
/// dicts, one dict, or a path to a JSONL, JSON array or Parquet file of them. A bad row is named
/// by its file and line.
pub fn rows_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<Value>> {
    match existing_path(obj)? {
        Some(path) => without_gil(obj.py(), || {
            stepwise_core::io::raw_records(&path)?
                .map(|(line, row)| row.map_err(|e| anyhow::anyhow!("{}:{line}: {e}", path.display())))
                .collect()
        }),
        None => rows_in_memory(obj),
    }
}

/// Problems from a Python argument: a path (`os.PathLike`, or a `str` naming a file or ending in
/// `.jsonl`, `.json` or `.parquet`) to a file of them, read as the command line reads them
/// (GSM8K's and MATH-500's files as they are); else None, and the argument is the problems
/// themselves (question strings or dicts).
pub fn problems_file(obj: &Bound<'_, PyAny>) -> PyResult<Option<Vec<stepwise_core::Problem>>> {
    let Some(path) = path_of(obj) else { return Ok(None) };
    let named = [".jsonl", ".json", ".parquet"]
        .iter()
        .any(|ext| path.to_string_lossy().ends_with(ext));
    let is_str = obj.is_instance_of::<pyo3::types::PyString>();
    if is_str && !named && !path.is_file() {
        return Ok(None); // a question
    }
    let path = existing_path(obj)?.expect("a path");
    Ok(Some(without_gil(obj.py(), || {
        Ok(stepwise_core::io::read_problems(&path)?)
    })?))
}

/// The path in `obj`, which must name a file that exists; None when `obj` is not a path.
pub fn existing_path(obj: &Bound<'_, PyAny>) -> PyResult<Option<std::path::PathBuf>> {
    let Some(path) = path_of(obj) else { return Ok(None) };
    if !path.exists() {
        return Err(pyo3::exceptions::PyFileNotFoundError::new_err(format!(
            "no such file: {} (records are a list of dicts, or a path to a file of them)",
            path.display()
        )));
    }
    Ok(Some(path))
}

/// A list or iterable of dicts, or one dict.
fn rows_in_memory(obj: &Bound<'_, PyAny>) -> PyResult<Vec<Value>> {
    use pyo3::types::PyDict;
    if obj.is_instance_of::<PyDict>() {
        return Ok(vec![from_py(obj)?]);
    }
    if obj.is_instance_of::<pyo3::types::PyBytes>() {
        return Err(value_error("expected records: a list of dicts or a path, not bytes"));
    }
    let items = obj
        .try_iter()
        .map_err(|_| value_error("expected records: a list (or iterable) of dicts"))?;
    items
        .enumerate()
        .map(|(i, item)| from_py(&item?).map_err(|e| value_error(format!("record {}: {}", i + 1, e.value(obj.py())))))
        .collect()
}

/// A model's `source=`: a checkpoint folder (a `str` or any `os.PathLike`), a cached Hugging
/// Face model id, or server URLs, as text.
pub fn source_arg(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(s) = obj.extract::<String>() {
        return Ok(s);
    }
    match obj.extract::<std::path::PathBuf>() {
        Ok(p) => Ok(p.to_string_lossy().into_owned()),
        Err(_) => Err(value_error(
            "source: a checkpoint folder (str or path), a Hugging Face model id or server URLs",
        )),
    }
}

/// A `device=` argument as PyTorch spells it: `"auto"`, `"cpu"`, `"cuda"`, `"cuda:1"`, a CUDA
/// index (`0`), or a `torch.device`.
/// None is `"auto"`.
pub fn placement_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<stepwise_model::Placement> {
    let Some(obj) = obj else {
        return Ok(stepwise_model::Placement::Auto);
    };
    if !obj.is_instance_of::<pyo3::types::PyBool>() {
        if let Ok(n) = obj.extract::<usize>() {
            return Ok(stepwise_model::Placement::Cuda(n));
        }
    }
    let name = obj.str()?.to_string();
    name.parse()
        .map_err(|e: anyhow::Error| value_error(format!("device={name:?}: {e}, or a CUDA index")))
}

/// LoRA's arguments (`lora_rank=0`: none; `lora_alpha` defaults to 2 × rank; `lora_targets` a
/// comma-separated list of projections or `"all-linear"`), initialised from `seed`.
pub fn lora_arg(rank: usize, alpha: Option<f32>, targets: &str, seed: u64) -> PyResult<Option<LoraConfig>> {
    if rank == 0 {
        return Ok(None);
    }
    let mut c = LoraConfig::new(rank);
    c.alpha = alpha.unwrap_or(c.alpha);
    c.targets = LoraConfig::parse_targets(targets).map_err(|e| value_error(format!("lora_targets: {e}")))?;
    c.seed = seed;
    c.check().map_err(|e| value_error(e.to_string()))?;
    Ok(Some(c))
}

/// A `trainer=` argument: `"auto"`, `"packed"` or `"autograd"`.
pub fn trainer_arg(name: &str) -> PyResult<stepwise_model::train::run::Trainer> {
    name.parse()
        .map_err(|e: anyhow::Error| value_error(format!("trainer: {e}")))
}

/// A `dtype=` argument as PyTorch spells it (`torch.bfloat16`, `"bfloat16"`, `"float32"`,
/// `"fp32"`) or as stepwise does (`"auto"`, `"f32"`, `"bf16"`, `"bf16-weights"`).
/// None is `"auto"`.
pub fn precision_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<stepwise_model::Precision> {
    let Some(obj) = obj else {
        return "auto".parse().map_err(|e: anyhow::Error| value_error(e.to_string()));
    };
    let given = obj.str()?.to_string();
    let name = given.strip_prefix("torch.").unwrap_or(&given);
    let name = match name {
        "float32" | "float" | "fp32" => "f32",
        "bfloat16" => "bf16",
        "float16" | "half" | "fp16" | "f16" => {
            return Err(value_error(format!(
                "dtype={given:?}: float16 is not a compute type here; bfloat16 (\"bf16\") holds weights in the \
                 same memory with float32's range, float16 checkpoints are read into it"
            )))
        }
        other => other,
    };
    name.parse()
        .map_err(|e: anyhow::Error| value_error(format!("dtype={given:?}: {e}")))
}

/// An `f32` as the Python float that prints as it does (`0.9`, not `0.8999999761581421`): the
/// shortest decimal that reads back as the same `f32`, as the records' JSON writes it.
pub fn as_written(x: f32) -> f64 {
    format!("{x}").parse().unwrap_or(f64::from(x))
}

/// [`as_written`] over a list of lists.
pub fn all_as_written(rows: Vec<Vec<f32>>) -> Vec<Vec<f64>> {
    rows.into_iter()
        .map(|r| r.into_iter().map(as_written).collect())
        .collect()
}

/// A `UserWarning` through Python's `warnings` (filterable, shown once per place by default),
/// pointing at the caller's line.
pub(crate) fn user_warning(py: Python<'_>, message: String) -> PyResult<()> {
    let category = py.get_type::<pyo3::exceptions::PyUserWarning>();
    py.import("warnings")?.call_method1("warn", (message, category, 2))?;
    Ok(())
}
