//! The stages as Python functions: annotation, step-level search and the lab, each resumable to
//! an output file as the command line's are.

use crate::convert::{from_py, records_arg, records_of, solutions_of, to_py, value_error, without_gil};
use crate::policy::PolicyArg;
use crate::progress::Progress;
use crate::verifier::Prm;
use anyhow::Result;
use pyo3::prelude::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use stepwise_core::seams::OnError;
use stepwise_core::seams::{MathTask, Task};
use stepwise_core::{Problem, Solution};
use stepwise_label::methods::Settings;
use stepwise_label::{annotate_resumable_with, Annotators, Method, ANNOTATE_ERROR};
use stepwise_search::{method as search_method, Aggregation, Job, SearchConfig, Searcher, SEARCH_ERROR};

/// Runs `f` on a journal at `output` (claimed for these `settings`, as the command line claims
/// its outputs), or on a throw-away one when there is no output.
pub(crate) fn with_journal<T>(
    output: Option<&Path>,
    settings: &Value,
    f: impl FnOnce(&Path) -> Result<T>,
) -> Result<T> {
    match output {
        Some(path) => {
            if path.extension().is_some_and(|e| e != "jsonl") {
                anyhow::bail!(
                    "{}: the output must be a .jsonl file (it is appended to and resumed)",
                    path.display()
                );
            }
            let _claim = stepwise_core::journal::claim(path, settings)?;
            f(path)
        }
        None => {
            let dir = std::env::temp_dir().join(format!(
                "stepwise-py-{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos())
            ));
            std::fs::create_dir_all(&dir)?;
            let out = f(&dir.join("out.jsonl"));
            let _ = std::fs::remove_dir_all(&dir);
            out
        }
    }
}

/// Label the steps of `records` (any format stepwise reads; each needs a gold answer) with
/// `policy` (a `stepwise.Policy`, or any object with a `continue_from` method) by `method`:
/// `mc` (Monte Carlo rollouts from every step, Math-Shepherd), `binary_search` (the first error
/// by bisection, OmegaPRM), `omegaprm` (the rollout tree with MCTS), `judge` (a model asked
/// for the first wrong step: `judge=`), or `consensus` (mc labels kept where the judge agrees).
/// `judge_verdict="likelihood"` takes the verdict whose answer the judge gives the highest
/// probability instead of voting over `judge_samples` sampled answers (`judge_format` index or
/// quote; a local checkpoint, or a served one given `server_tokenizer`).
/// With `output` (a `.jsonl` path) each labelled solution is appended as soon as it is done,
/// and a call with the same arguments after an interruption labels only the rest. With
/// `code_problems` (HumanEval's or MBPP's JSONL) the steps are lines of programs and a rollout
/// is right when the problem's tests pass in the sandbox (each record's `gold_answer` is its
/// problem's id; HumanEval's own file labels its reference solutions). A record whose labelling
/// fails (no gold answer, too long for the policy): `on_error="raise"` raises `StepwiseError`
/// naming it, the records labelled before it on the error's `records`; `"skip"` returns it
/// unlabelled with the reason in `meta["annotate_error"]` and warns with the count (a server that
/// still fails after its retries raises either way). Returns the labelled records.
///
/// >>> labelled = stepwise.annotate(recs, policy, method="mc", rollouts=8, output="mc.jsonl")
#[pyfunction]
#[pyo3(signature = (records, policy, method="mc", rollouts=8, seed=0, output=None, judge=None, judge_samples=4, judge_format="critique", judge_verdict="votes", search_limit=0, separator="\n", code_problems=None, code_timeout=10.0, progress=None, on_error="raise"))]
#[allow(clippy::too_many_arguments)]
pub fn annotate<'py>(
    py: Python<'py>,
    records: &Bound<'py, PyAny>,
    policy: &Bound<'py, PyAny>,
    method: &str,
    rollouts: usize,
    seed: u64,
    output: Option<PathBuf>,
    judge: Option<&Bound<'py, PyAny>>,
    judge_samples: usize,
    judge_format: &str,
    judge_verdict: &str,
    search_limit: usize,
    separator: &str,
    code_problems: Option<PathBuf>,
    code_timeout: f64,
    progress: Option<&Bound<'py, PyAny>>,
    on_error: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let method = Method::by_name(method).map_err(|e| value_error(e.to_string()))?;
    let on_error = OnError::by_name(on_error).map_err(|e| value_error(e.to_string()))?;
    let (format, _) = stepwise_label::methods::judge_format(judge_format).map_err(|e| value_error(e.to_string()))?;
    let judge_likelihood = match judge_verdict {
        "votes" => false,
        "likelihood" => true,
        other => return Err(value_error(format!("judge_verdict `{other}`: use votes or likelihood"))),
    };
    if method.needs_judge() && judge.is_none() {
        return Err(value_error(format!("method {method:?} asks a judge: pass judge=")));
    }
    let policy = PolicyArg::of(policy, separator)?;
    let judge = judge.map(|j| PolicyArg::of(j, separator)).transpose()?;
    let given = records_arg(records)?;
    let progress = Progress::start(py, progress, "records", given.len())?;
    let settings = Settings {
        rollouts,
        seed,
        search_limit,
        judge_samples,
        judge_likelihood,
    };
    let claim = json!({
        "method": format!("{method:?}"), "rollouts": rollouts, "seed": seed, "search_limit": search_limit,
        "judge_samples": judge_samples, "judge_format": judge_format, "judge_verdict": judge_verdict, "separator": separator,
        "task": code_identity(code_problems.as_deref(), code_timeout)?,
    });
    let labelled = without_gil(py, || {
        let sols = solutions_of(&given, None)?;
        let missing = sols.iter().enumerate().find(|(_, s)| s.gold_answer.is_none());
        if let (Some((i, s)), OnError::Raise) = (missing, on_error) {
            anyhow::bail!("record {} (`{}`): field `gold_answer`: missing", i + 1, s.id);
        }
        let (task, stop) = task_of(code_problems.as_deref(), code_timeout)?;
        let seam = policy.seam(&stop);
        let judge_seam = judge.as_ref().map(|j| j.seam(&[]));
        let annotators = Annotators::new(
            method,
            &*seam,
            &*task,
            &settings,
            judge_seam.as_deref().map(|j| (j, format)),
        )?;
        let annotator = annotators.get();
        let mut claim = claim;
        claim["input"] = stepwise_core::journal::fingerprint(&sols)?.into();
        let threads = rayon::current_num_threads();
        with_journal(output.as_deref(), &claim, |path| {
            let run = annotate_resumable_with(path, &sols, &*annotator, threads, on_error, |done| progress.done(done));
            let ids: Vec<&str> = sols.iter().map(|s| s.id.as_str()).collect();
            Ok(run
                .map(|(labelled, _)| labelled)
                .map_err(|e| (e, journal_so_far(path, &ids))))
        })
    });
    progress.finish();
    let labelled = match labelled? {
        Ok(labelled) => labelled,
        Err((error, so_far)) => return Err(failure_with_records(py, &error, &so_far, "labelled")),
    };
    warn_skipped(py, &labelled, ANNOTATE_ERROR, "labelled", "left unlabelled")?;
    to_py(py, &Value::Array(without_gil(py, || records_of(&labelled))?))
}

/// The records with these `ids` a journal holds (what a run that stopped had done), in their
/// order.
fn journal_so_far(path: &Path, ids: &[&str]) -> Vec<Solution> {
    let Ok((_, mut kept)) = stepwise_core::journal::Journal::open::<Solution>(path, |s| s.id.clone()) else {
        return Vec::new();
    };
    let given: std::collections::HashSet<&str> = ids.iter().copied().collect();
    kept.retain(|s| given.contains(s.id.as_str()));
    stepwise_core::journal::sort_like(&mut kept, ids.iter().copied(), |s| s.id.as_str());
    kept
}

/// A `StepwiseError` for a batch call that stopped (`on_error="raise"`): its message names the
/// record, and what was `done` before it is on the error's `records`.
pub(crate) fn failure_with_records(py: Python<'_>, error: &anyhow::Error, so_far: &[Solution], done: &str) -> PyErr {
    let message = format!(
        "{error:#}; the {} records {done} before it are on this error's `records` (on_error=\"skip\" goes on past it)",
        so_far.len()
    );
    error_with_records(py, message, so_far)
}

/// A `StepwiseError` saying `message`, with the records done before the failure as Python
/// records on its `records` attribute (nothing done is lost with the error).
pub(crate) fn error_with_records(py: Python<'_>, message: String, so_far: &[Solution]) -> PyErr {
    let err = crate::StepwiseError::new_err(message);
    let records = without_gil(py, || records_of(so_far)).and_then(|r| to_py(py, &Value::Array(r)));
    match records {
        Ok(records) => match err.value(py).setattr("records", records) {
            Ok(()) => err,
            Err(e) => e,
        },
        Err(e) => e,
    }
}

/// A `UserWarning` with the count of records a call skipped (`on_error="skip"`): those with the
/// reason under `meta[key]`.
pub(crate) fn warn_skipped(py: Python<'_>, sols: &[Solution], key: &str, what: &str, left: &str) -> PyResult<()> {
    let skipped = sols.iter().filter(|s| s.meta.contains_key(key)).count();
    if skipped > 0 {
        let message = format!(
            "stepwise: {skipped} of {} records could not be {what} and were {left} (the reason in each one's \
             meta[{key:?}])",
            sols.len()
        );
        crate::convert::user_warning(py, message)?;
    }
    Ok(())
}

/// Step-DPO's rectification of `stepwise.step_pairs` (`complete_with=`).
pub struct Rectify<'a, 'py> {
    /// The policy sampling the right steps.
    pub policy: &'a Bound<'py, PyAny>,
    /// Continuations a place.
    pub samples: usize,
    /// The draws' seed.
    pub seed: u64,
    /// Rollouts checking a sampled step, and the value it needs.
    pub check: (usize, f32),
    /// Between steps.
    pub separator: &'a str,
    /// A progress callback or bar, as other stages take it.
    pub progress: Option<&'a Bound<'py, PyAny>>,
}

impl Rectify<'_, '_> {
    /// The pairs `policy` completes of `unpaired` (graded as math answers).
    pub fn run(
        &self,
        py: Python<'_>,
        unpaired: &[stepwise_core::pairs::Unpaired],
    ) -> PyResult<Vec<stepwise_core::pairs::StepPair>> {
        if self.samples == 0 {
            return Err(value_error("samples must be at least 1"));
        }
        let policy = PolicyArg::of(self.policy, self.separator)?;
        let progress = Progress::start(py, self.progress, "places", stepwise_core::pairs::places_of(unpaired))?;
        let options = stepwise_label::RectifyOptions {
            samples: self.samples,
            seed: self.seed,
            together: 32,
            threads: rayon::current_num_threads(),
            check_rollouts: self.check.0,
            check_min: self.check.1,
        };
        let out = without_gil(py, || {
            let (task, stop) = task_of(None, 10.0)?;
            let seam = policy.seam(&stop);
            stepwise_label::rectify(unpaired, &*seam, &*task, options, |n| progress.done(n))
        });
        progress.finish();
        Ok(out?.0)
    }
}

/// The task that grades: math, or the code problems of `code_problems` (with the stop strings
/// its completions end at).
fn task_of(code_problems: Option<&Path>, timeout: f64) -> Result<(Box<dyn Task>, Vec<String>)> {
    Ok(match code_problems {
        None => (Box::new(MathTask::default()), Vec::new()),
        Some(path) => (
            Box::new(crate::code::code_task(path, timeout)?),
            stepwise_code::CODE_STOPS.iter().map(|s| s.to_string()).collect(),
        ),
    })
}

/// What a resumed call must share with the call it resumes: the domain, and the code problems'
/// content.
fn code_identity(code_problems: Option<&Path>, timeout: f64) -> PyResult<Value> {
    let Some(path) = code_problems else {
        return Ok(json!("math"));
    };
    stepwise_code::task::resume_identity(path, timeout).map_err(|e| value_error(format!("{e:#}")))
}

/// A problem from Python: a question string, or a dict with `question` (or `problem`), an
/// optional gold `answer` (or `gold_answer`) and `id`.
fn problems_of(values: &[Value]) -> Result<Vec<Problem>> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            match v {
                Value::String(q) => Problem::from_record(&json!({ "question": q })),
                _ => Problem::from_record(v),
            }
            .map_err(|e| anyhow::anyhow!("problem {}: {e}", i + 1))
        })
        .collect()
}

/// Search for solutions to `problems` step by step with `policy`, guided by `prm` (a
/// `stepwise.PRM`): `method` is `bon` (best of `n` whole solutions), `beam` (keep `n/width`
/// beams, extend each `width` ways), `dvts`, `lookahead` or `resample` (verify → resample below
/// `threshold`). Problems are question strings or dicts with `question` and an optional gold
/// `answer` (the chosen solution is then graded), or a path to a file of them (JSONL, JSON or
/// Parquet; GSM8K's and MATH-500's files as they are). With `output` (`.jsonl`) each problem's result
/// is appended as soon as it is done and a repeated call resumes. With `code_problems`
/// (HumanEval's or MBPP's JSONL) `problems` are task ids, the steps lines of code, and `correct`
/// says whether the problem's tests pass. Returns one record a problem: its steps,
/// `scores[name]`, `correct`, and `meta.search` / `meta.compute`. A problem whose search fails:
/// `on_error="raise"` raises naming it (the records before it on the error's `records`);
/// `"skip"` returns a record without steps, the reason in `meta["search_error"]`.
///
/// >>> out = stepwise.search(["What is 2 + 3?"], policy, prm, method="beam", n=8, width=4)
#[pyfunction]
#[pyo3(signature = (problems, policy, prm, method="beam", n=8, width=4, aggregation="min", max_steps=40, lookahead=1, threshold=0.5, max_resamples=4, resample_budget=16, seed=0, name="prm", output=None, threads=2, separator="\n", code_problems=None, code_timeout=10.0, progress=None, on_error="raise"))]
#[allow(clippy::too_many_arguments)]
pub fn search<'py>(
    py: Python<'py>,
    problems: &Bound<'py, PyAny>,
    policy: &Bound<'py, PyAny>,
    prm: &Bound<'py, Prm>,
    method: &str,
    n: usize,
    width: usize,
    aggregation: &str,
    max_steps: usize,
    lookahead: usize,
    threshold: f32,
    max_resamples: usize,
    resample_budget: usize,
    seed: u64,
    name: &str,
    output: Option<PathBuf>,
    threads: usize,
    separator: &str,
    code_problems: Option<PathBuf>,
    code_timeout: f64,
    progress: Option<&Bound<'py, PyAny>>,
    on_error: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let search = search_method(method).map_err(|e| value_error(e.to_string()))?;
    let on_error = OnError::by_name(on_error).map_err(|e| value_error(e.to_string()))?;
    let config = SearchConfig {
        n,
        width,
        max_steps,
        aggregation: Aggregation::by_name(aggregation).map_err(|e| value_error(e.to_string()))?,
        lookahead,
        threshold,
        max_resamples,
        resample_budget,
        seed,
    };
    let code = code_problems
        .as_deref()
        .map(|path| py.detach(|| crate::code::code_task(path, code_timeout)))
        .transpose()
        .map_err(|e| value_error(format!("{e:#}")))?;
    let (code_given, from_file, values) = search_problems(problems, code.as_ref())?;
    let policy = PolicyArg::of(policy, separator)?;
    let count = from_file.as_ref().map_or(values.len(), Vec::len);
    let count = code_given.as_ref().map_or(count, Vec::len);
    let progress = Progress::start(py, progress, "problems", count)?;
    let prm: Py<Prm> = prm.clone().unbind();
    let claim = json!({"method": method, "config": config, "name": name, "separator": separator,
        "task": code_identity(code_problems.as_deref(), code_timeout)?});
    let records = without_gil(py, || {
        let problems = match (code_given, from_file) {
            (Some(p), _) | (None, Some(p)) => p,
            (None, None) => problems_of(&values)?,
        };
        let mut claim = claim;
        claim["input"] = stepwise_core::journal::fingerprint(&problems)?.into();
        let jobs: Vec<Job<'_>> = problems.iter().map(|p| Job::for_problem(p, method)).collect();
        let math = MathTask::default();
        let (task, stop): (&dyn Task, Vec<String>) = match &code {
            Some(t) => (t, stepwise_code::CODE_STOPS.iter().map(|s| s.to_string()).collect()),
            None => (&math, Vec::new()),
        };
        let seam = policy.seam(&stop);
        let scorer = prm.get().search_scorer();
        let searcher = Searcher {
            method: &*search,
            config: &config,
            policy: &*seam,
            scorer: &*scorer,
            verifier: name,
            task,
            threads: threads.max(1),
        };
        with_journal(output.as_deref(), &claim, |path| {
            let run = searcher.run_all_with(path, &jobs, on_error, &|done| progress.done(done));
            let ids: Vec<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
            Ok(run.map_err(|e| (e, journal_so_far(path, &ids))))
        })
    });
    progress.finish();
    let sols = match records? {
        Ok(sols) => sols,
        Err((error, so_far)) => return Err(failure_with_records(py, &error, &so_far, "searched")),
    };
    warn_skipped(py, &sols, SEARCH_ERROR, "searched", "written without steps")?;
    to_py(py, &Value::Array(without_gil(py, || records_of(&sols))?))
}

/// The problems `search` was given, each way they may come: a code task's ids (`code_given`), a
/// file of problems (`from_file`), or Python values (read once the GIL is released).
#[allow(clippy::type_complexity)]
fn search_problems(
    problems: &Bound<'_, PyAny>,
    code: Option<&stepwise_code::CodeTask>,
) -> PyResult<(
    Option<Vec<stepwise_core::Problem>>,
    Option<Vec<stepwise_core::Problem>>,
    Vec<Value>,
)> {
    let code_given = code
        .map(|t| crate::code::code_search_problems(t, problems))
        .transpose()?;
    let from_file = match code_given {
        Some(_) => None,
        None => crate::convert::problems_file(problems)?,
    };
    let values = match from_file {
        Some(_) => Vec::new(),
        None => match from_py(problems)? {
            Value::Array(v) => v,
            one => vec![one],
        },
    };
    Ok((code_given, from_file, values))
}

/// Run the built-in lab (`stepwise lab`): the whole process-supervision loop on one of its
/// synthetic domains (`arithmetic`, `code`, or `agent`: actions in a text world), cached and resumable in `out` (default `runs/PRESET-seedSEED`), with preset fields
/// overridden by `sets` (`["eval_samples=64"]`). Returns `metrics.json` as a dict.
///
/// >>> metrics = stepwise.lab.run(preset="quick", seed=1)
#[pyfunction]
#[pyo3(signature = (preset="quick", seed=1, out=None, sets=Vec::new(), domain=None))]
pub fn lab_run<'py>(
    py: Python<'py>,
    preset: &str,
    seed: u64,
    out: Option<PathBuf>,
    sets: Vec<String>,
    domain: Option<&str>,
) -> PyResult<Bound<'py, PyAny>> {
    let mut preset = stepwise_lab::Preset::by_name(preset)
        .and_then(|p| p.with_overrides(&sets))
        .map_err(|e| value_error(format!("{e:#}")))?;
    if let Some(domain) = domain {
        preset.domain = domain.parse().map_err(|e| value_error(format!("{e:#}")))?;
    }
    let out = out.unwrap_or_else(|| stepwise_lab::run::default_run_folder(&preset, seed));
    let metrics = without_gil(py, || {
        stepwise_lab::run::run_domain(&stepwise_lab::LabOptions {
            preset,
            seed,
            out: out.clone(),
        })?;
        let path = out.join("metrics.json");
        let text = std::fs::read_to_string(&path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        Ok(serde_json::from_str::<Value>(&text)?)
    })?;
    to_py(py, &metrics)
}
