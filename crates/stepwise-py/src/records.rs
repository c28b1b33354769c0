//! Records, grading and dense step rewards.

use crate::convert::{
    format_named, in_format, path_of, records_arg, records_of, solutions_of, to_py, value_error, without_gil,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};
use serde_json::Value;
use std::path::PathBuf;
use stepwise_core::grader::GradeMode;
use stepwise_core::SolutionWriter;

/// Read step-labelled records from a file (JSONL, JSON or Parquet, in any format stepwise reads,
/// detected from the first record unless `format` is given) or from records already in memory
/// (dicts in any of those formats). Returns stepwise's own records as dicts: `id`, `question`,
/// `steps` (each `{"text", "label"?, "score"?}`), `gold_answer`, `correct`, `scores`, `meta`...
///
/// >>> recs = stepwise.read("processbench/gsm8k.json")
/// >>> recs[0]["steps"][0]["text"]
#[pyfunction]
#[pyo3(signature = (source, format=None))]
pub fn read<'py>(py: Python<'py>, source: &Bound<'py, PyAny>, format: Option<&str>) -> PyResult<Bound<'py, PyAny>> {
    let format = format.map(format_named).transpose()?;
    let records = match path_of(source) {
        Some(path) => without_gil(py, || {
            let sols = stepwise_core::io::read_solution_set(&path, format)?;
            records_of(&sols)
        })?,
        None => {
            let given = records_arg(source)?;
            without_gil(py, || records_of(&solutions_of(&given, format)?))?
        }
    };
    to_py(py, &Value::Array(records))
}

/// Read problems from a file (JSONL, JSON or Parquet) as `stepwise generate`, `search` and `rl`
/// read them: GSM8K's and MATH-500's files as they are. A record needs `question` (or `problem`);
/// the gold answer is `gold_answer` or `answer` (GSM8K's `#### N` understood); `id` is kept or
/// made from the question. Returns dicts with `id`, `question` and `answer` (None when absent).
///
/// >>> problems = stepwise.read_problems("gsm8k/test.jsonl")
/// >>> problems[0]["answer"]   # '18'
#[pyfunction]
pub fn read_problems<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyAny>> {
    if !path.exists() {
        return Err(pyo3::exceptions::PyFileNotFoundError::new_err(format!(
            "no such file: {}",
            path.display()
        )));
    }
    let problems = without_gil(py, || Ok(stepwise_core::io::read_problems(&path)?))?;
    let rows: Vec<Value> = problems
        .iter()
        .map(|p| serde_json::json!({"id": p.id, "question": p.question, "answer": p.gold_answer}))
        .collect();
    to_py(py, &Value::Array(rows))
}

/// Step-level preference pairs (Step-DPO) from step-labelled records (dicts in any format, or a
/// path), as `stepwise pairs` makes them: at each question and prefix of steps none of which is
/// wrong, a right next step (rated +1, a Monte Carlo value of at least `chosen_min`, or written
/// by a person: PRM800K's `human_completion`, a studio correction) against a wrong one. The
/// steps beside one another come from records sharing the prefix and from PRM800K's rated
/// completions. `layout`: `"stepwise"` (`id, problem_id, question, prefix, chosen, rejected, answer,
/// chosen_source, rejected_source, chosen_ends, rejected_ends`), `"step-dpo"` (Step-DPO's columns) or `"trl"` (TRL
/// `DPOTrainer`'s `prompt, chosen, rejected`).
///
/// With `complete_with` (a `stepwise.Policy`, or an object with `continue_from`), Step-DPO's
/// rectification: a wrong step with no right step beside it is paired with one the policy
/// samples from its prefix, the first step of the first of `samples` continuations whose final
/// answer matches the record's gold answer (`chosen_source` `"sampled"`); with `check_rollouts`,
/// only one whose own continuations reach the answer at least `chosen_min` of the time.
///
/// >>> pairs = stepwise.step_pairs("prm800k/phase1.jsonl", layout="trl")
/// >>> datasets.Dataset.from_list(pairs)    # DPOTrainer(train_dataset=...)
/// >>> pairs = stepwise.step_pairs("mc.jsonl", complete_with=policy, samples=8)
#[pyfunction]
#[pyo3(signature = (records, layout="stepwise", chosen_min=0.5, dataset="", separator="\n", complete_with=None, samples=8, seed=0, check_rollouts=0, progress=None))]
#[allow(clippy::too_many_arguments)]
pub fn step_pairs<'py>(
    py: Python<'py>,
    records: &Bound<'py, PyAny>,
    layout: &str,
    chosen_min: f32,
    dataset: &str,
    separator: &str,
    complete_with: Option<&Bound<'py, PyAny>>,
    samples: usize,
    seed: u64,
    check_rollouts: usize,
    progress: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let layout: stepwise_core::pairs::Layout = layout.parse().map_err(PyValueError::new_err)?;
    stepwise_core::pairs::check_chosen_min("chosen_min", chosen_min).map_err(PyValueError::new_err)?;
    let sols = match path_of(records) {
        Some(path) => without_gil(py, || {
            Ok(stepwise_core::SolutionReader::open(&path, None)?.collect::<Result<Vec<_>, _>>()?)
        })?,
        None => {
            let given = records_arg(records)?;
            without_gil(py, || solutions_of(&given, None))?
        }
    };
    let (mut pairs, unpaired, _) = stepwise_core::pairs::step_pairs_and_unpaired(&sols, chosen_min);
    if let Some(policy) = complete_with {
        let rectify = crate::stages::Rectify {
            policy,
            samples,
            seed,
            check: (check_rollouts, chosen_min),
            separator,
            progress,
        };
        pairs.extend(rectify.run(py, &unpaired)?);
    }
    let rows: Vec<Value> = pairs.iter().map(|p| p.to_json(layout, dataset, separator)).collect();
    to_py(py, &Value::Array(rows))
}

/// Convert records (dicts in any format stepwise reads) to `format`'s records, in memory.
///
/// >>> stepwise.convert(recs, "trl")[0].keys()   # prompt, completions, labels
#[pyfunction]
#[pyo3(signature = (records, format))]
pub fn convert<'py>(py: Python<'py>, records: &Bound<'py, PyAny>, format: &str) -> PyResult<Bound<'py, PyAny>> {
    let to = format_named(format)?;
    let given = records_arg(records)?;
    let out = without_gil(py, || in_format(&solutions_of(&given, None)?, to))?;
    to_py(py, &Value::Array(out))
}

/// Write records (dicts in any format stepwise reads) to `path` as `format` (default: stepwise's
/// own): JSONL, a JSON array (`.json`) or Parquet (`.parquet`), by the name's extension.
/// Returns the number of records written.
#[pyfunction]
#[pyo3(signature = (records, path, format="stepwise"))]
pub fn write(py: Python<'_>, records: &Bound<'_, PyAny>, path: PathBuf, format: &str) -> PyResult<usize> {
    let to = format_named(format)?;
    let given = records_arg(records)?;
    without_gil(py, || {
        let sols = solutions_of(&given, None)?;
        let mut w = SolutionWriter::create(&path, to)?;
        for s in &sols {
            w.write(s)?;
        }
        w.finish()?;
        Ok(sols.len())
    })
}

/// Records as an Arrow IPC stream (the bytes `pyarrow.ipc.open_stream` reads) in `format`'s
/// columns, the schema inferred from every record: what `stepwise.to_hf` builds a
/// `datasets.Dataset` from (TRL's layout: `prompt` string, `completions` list of strings,
/// `labels` list of booleans).
#[pyfunction]
#[pyo3(signature = (records, format="trl"))]
pub fn to_arrow_ipc<'py>(py: Python<'py>, records: &Bound<'py, PyAny>, format: &str) -> PyResult<Bound<'py, PyBytes>> {
    let to = format_named(format)?;
    let given = records_arg(records)?;
    let bytes = without_gil(py, || {
        let rows = in_format(&solutions_of(&given, None)?, to)?;
        anyhow::ensure!(!rows.is_empty(), "no records to convert");
        let (schema, batches) = stepwise_core::parquet_io::records_to_batches(&rows).map_err(anyhow::Error::msg)?;
        let mut out = Vec::new();
        let mut w = arrow_ipc::writer::StreamWriter::try_new(&mut out, &schema)?;
        for b in &batches {
            w.write(b)?;
        }
        w.finish()?;
        drop(w);
        Ok(out)
    })?;
    Ok(PyBytes::new(py, &bytes))
}

/// The records of an Arrow IPC stream (`pyarrow` table bytes, as `stepwise.from_hf` sends a
/// `datasets.Dataset`), read in their detected format (or `format`), as stepwise's records.
#[pyfunction]
#[pyo3(signature = (data, format=None))]
pub fn from_arrow_ipc<'py>(py: Python<'py>, data: &[u8], format: Option<&str>) -> PyResult<Bound<'py, PyAny>> {
    let format = format.map(format_named).transpose()?;
    let data = data.to_vec();
    let records = without_gil(py, || {
        let reader = arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(data), None)?;
        let mut rows = Vec::new();
        for batch in reader {
            rows.extend(stepwise_core::parquet_io::batch_to_json(&batch?).map_err(anyhow::Error::msg)?);
        }
        records_of(&solutions_of(&rows, format)?)
    })?;
    to_py(py, &Value::Array(records))
}

/// Whether `given` is the same answer as `gold`. Both scalars (`str`, numbers) or lists of equal
/// length (one gold for many answers too); lists are graded in parallel. `mode="lenient"`
/// (default) is mathematically right (fractions, decimals, LaTeX, units); `"prm800k"` is
/// OpenAI's PRM800K grader exactly.
///
/// >>> stepwise.grade("\\frac{1}{2}", "0.5")
/// True
/// >>> stepwise.grade(["4", "5"], "4")
/// [True, False]
#[pyfunction]
#[pyo3(signature = (given, gold, mode="lenient"))]
pub fn grade<'py>(
    py: Python<'py>,
    given: &Bound<'py, PyAny>,
    gold: &Bound<'py, PyAny>,
    mode: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let mode: GradeMode = mode.parse().map_err(value_error)?;
    let (given, gold) = (answers_arg(given)?, answers_arg(gold)?);
    match (given, gold) {
        (Err(g), Err(t)) => Ok(
            pyo3::types::PyBool::new(py, grade_one(g.as_deref(), t.as_deref(), mode))
                .to_owned()
                .into_any(),
        ),
        (Ok(gs), gold) => {
            let golds: Vec<Option<String>> = match gold {
                Ok(ts) if ts.len() == gs.len() => ts,
                Ok(ts) => {
                    return Err(value_error(format!(
                        "{} answers but {} gold answers",
                        gs.len(),
                        ts.len()
                    )))
                }
                Err(t) => vec![t; gs.len()],
            };
            let verdicts = without_gil(py, || {
                use rayon::prelude::*;
                Ok(gs
                    .par_iter()
                    .zip(&golds)
                    .map(|(g, t)| grade_one(g.as_deref(), t.as_deref(), mode))
                    .collect::<Vec<bool>>())
            })?;
            Ok(PyList::new(py, verdicts)?.into_any())
        }
        (Err(_), Ok(_)) => Err(value_error(
            "one answer against a list of gold answers: pass a list of answers",
        )),
    }
}

/// No answer (None, NaN) is never right, not even against no gold answer.
fn grade_one(given: Option<&str>, gold: Option<&str>, mode: GradeMode) -> bool {
    match (given, gold) {
        (Some(g), Some(t)) => stepwise_core::grader::grade(g, t, mode),
        _ => false,
    }
}

/// An answer argument: one answer (`Err`, as the single case) or a list of them; each a string,
/// an int, a float (NaN: no answer; ±inf: `inf`, `-inf`) or None (no answer).
#[allow(clippy::type_complexity)]
fn answers_arg(obj: &Bound<'_, PyAny>) -> PyResult<Result<Vec<Option<String>>, Option<String>>> {
    use pyo3::types::{PyBool, PyFloat, PyInt, PyTuple};
    let one = |v: &Bound<'_, PyAny>| -> PyResult<Option<String>> {
        if v.is_none() {
            Ok(None)
        } else if v.is_instance_of::<PyString>() {
            Ok(Some(v.extract::<String>()?))
        } else if v.is_instance_of::<PyBool>() {
            Err(value_error(format!("an answer must be a string or a number, not {v}")))
        } else if v.is_instance_of::<PyInt>() {
            Ok(Some(v.str()?.to_string()))
        } else if v.is_instance_of::<PyFloat>() {
            let x: f64 = v.extract()?;
            Ok((!x.is_nan()).then(|| {
                if x.is_infinite() {
                    format!("{}inf", if x < 0.0 { "-" } else { "" })
                } else {
                    x.to_string()
                }
            }))
        } else {
            Err(value_error(format!(
                "an answer must be a string or a number, not {}",
                v.get_type().name()?
            )))
        }
    };
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        return Ok(Ok(obj.try_iter()?.map(|v| one(&v?)).collect::<PyResult<_>>()?));
    }
    Ok(Err(one(obj)?))
}

/// The final answer in a solution's text (`\boxed{}`, "The answer is", GSM8K's `####`), or None.
#[pyfunction]
pub fn extract_answer(text: &str) -> Option<String> {
    stepwise_core::answer::extract_answer(text)
}

/// A solution's text split into steps at `separator` (each trimmed, empty ones dropped).
#[pyfunction]
#[pyo3(signature = (text, separator="\n"))]
pub fn split_steps(text: &str, separator: &str) -> Vec<String> {
    stepwise_core::seams::split_steps_at(text, separator)
}
