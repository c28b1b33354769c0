//! `stepwise.PRM`: a verifier (PRM of any layout, ORM, log-ratio or likelihood verifier), local
//! or behind servers, scoring every step.

use crate::convert::{from_py, records_arg, records_of, solutions_of, to_py, value_error, without_gil};
use crate::progress::Progress;
use pyo3::prelude::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use stepwise_core::seams::{
    apply_outcome, score_in_order, OnError, ScoreFailure, ScoreInput, StepScorer, SCORE_ERRORS,
};
use stepwise_core::Solution;
use stepwise_remote::backend::{LocalOptions, RemoteOptions, ScorerBackend, Source};

/// A process reward model (or ORM, or log-ratio verifier) that scores every step.
///
/// `source` is a checkpoint folder, a Hugging Face model id found in the local cache, or server
/// URL(s) (`stepwise serve --prm`, or vLLM's `/pooling` with `protocol="pooling"`). `layout` is
/// `auto` (from `reward.json`, else the head and tokenizer), `qwen-prm`, `step-tag`,
/// `token-cls` or `log-ratio`. `device` is `auto` (a CUDA GPU when this build has CUDA and one
/// answers, else the CPU), `cpu`, `cuda` or `cuda:N`; `max_batch_tokens` bounds one forward pass.
/// `dtype` is how a CPU model holds its weight matrices: `auto` (as stored: bf16 stays bf16 and
/// multiplies in bf16 where the CPU can), `f32` (widened: f32 arithmetic throughout) or `bf16`.
///
/// >>> prm = stepwise.PRM("Qwen/Qwen2.5-Math-PRM-7B")
/// >>> prm.score("What is 2 + 3?", ["2 + 3 = 5.", "The answer is 5."])
/// [0.98, 0.97]
#[pyclass(module = "stepwise", name = "PRM", frozen)]
pub struct Prm {
    backend: ScorerBackend,
    source: String,
}

/// A Python list of items (see [`item_of`]) as `(question, steps)` pairs.
fn items_arg(items: &Bound<'_, PyAny>) -> PyResult<Vec<(String, Vec<String>)>> {
    match from_py(items)? {
        Value::Array(values) => values.iter().enumerate().map(|(i, v)| item_of(v, i)).collect(),
        _ => Err(value_error("items must be a list")),
    }
}

/// `(question, steps)` pairs as scorer inputs.
fn inputs_of(items: &[(String, Vec<String>)]) -> Vec<ScoreInput<'_>> {
    items
        .iter()
        .map(|(q, steps)| ScoreInput {
            problem_id: "",
            question: q,
            steps: steps.iter().map(String::as_str).collect(),
            partial: false,
        })
        .collect()
}

/// A scoring item from Python: a dict with `question` (or `problem`/`prompt`) and `steps` (or
/// `completions`), or a `(question, steps)` pair.
fn item_of(v: &Value, i: usize) -> PyResult<(String, Vec<String>)> {
    let bad = |what: &str| value_error(format!("item {i}: {what}"));
    match v {
        Value::Array(pair) if pair.len() == 2 => {
            let q = pair[0].as_str().ok_or_else(|| bad("the question must be a string"))?;
            Ok((
                q.to_string(),
                steps_of(&pair[1]).ok_or_else(|| bad("steps must be a list of strings"))?,
            ))
        }
        Value::Object(o) => {
            let q = ["question", "problem", "prompt"]
                .iter()
                .find_map(|k| o.get(*k).and_then(Value::as_str))
                .ok_or_else(|| bad("no `question` (or `problem`, `prompt`)"))?;
            let steps = ["steps", "completions"]
                .iter()
                .find_map(|k| o.get(*k))
                .ok_or_else(|| bad("no `steps` (or `completions`)"))?;
            Ok((
                q.to_string(),
                steps_of(steps).ok_or_else(|| bad("`steps` must be a list of strings (or of {\"text\"} dicts)"))?,
            ))
        }
        _ => Err(bad(
            "expected a dict with `question` and `steps`, or a (question, steps) pair",
        )),
    }
}

/// Step texts: strings, or stepwise's `{"text": ...}` steps.
fn steps_of(v: &Value) -> Option<Vec<String>> {
    v.as_array()?
        .iter()
        .map(|s| s.as_str().or_else(|| s.get("text")?.as_str()).map(str::to_string))
        .collect()
}

impl Prm {
    fn scorer(&self) -> Box<dyn StepScorer + '_> {
        self.backend.scorer()
    }

    /// The turns of its tokenizer's chat template, when the tokenizer is known here.
    pub fn chat_turns(&self) -> Option<stepwise_model::chat_turns::ChatTurns> {
        self.backend
            .tokenizer()
            .and_then(|t| stepwise_model::chat_turns::ChatTurns::of(t).ok())
    }

    /// Every step's score of each input.
    pub fn score_inputs(&self, inputs: &[ScoreInput]) -> anyhow::Result<Vec<Vec<f32>>> {
        Ok(self.scorer().score(inputs)?.scores)
    }

    /// It as step-level search scores with it (incrementally on a local CPU checkpoint).
    pub fn search_scorer(&self) -> Box<dyn StepScorer + '_> {
        self.backend.search_scorer()
    }
}

#[pymethods]
impl Prm {
    #[new]
    #[pyo3(signature = (source, layout="auto", device=None, max_batch_tokens=stepwise_model::DEFAULT_MAX_BATCH_TOKENS, dtype=None, api_key=None, served_model=None, protocol="stepwise", server_tokenizer=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        source: &Bound<'_, PyAny>,
        layout: &str,
        device: Option<&Bound<'_, PyAny>>,
        max_batch_tokens: usize,
        dtype: Option<&Bound<'_, PyAny>>,
        api_key: Option<String>,
        served_model: Option<String>,
        protocol: &str,
        server_tokenizer: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        let source = crate::convert::source_arg(source)?;
        let local = LocalOptions {
            placement: crate::convert::placement_arg(device)?,
            precision: crate::convert::precision_arg(dtype)?,
            max_batch_tokens: max_batch_tokens.max(1),
        };
        let options = RemoteOptions {
            api_key: api_key.or_else(|| std::env::var("OPENAI_API_KEY").ok()),
            served_model,
            protocol: protocol.to_string(),
            server_tokenizer,
            ..Default::default()
        };
        let (layout, src) = (layout.to_string(), source.to_string());
        let backend = without_gil(py, move || {
            let source = Source::parse(&src)?;
            ScorerBackend::open(&source, &layout, &options, &local)
        })?;
        Ok(Prm { backend, source })
    }

    /// Every step's score (probability the step is good) of one solution.
    fn score(&self, py: Python<'_>, question: &str, steps: Vec<String>) -> PyResult<Vec<f64>> {
        let scores = without_gil(py, || {
            let input = ScoreInput {
                problem_id: "",
                question,
                steps: steps.iter().map(String::as_str).collect(),
                partial: false,
            };
            Ok(self.scorer().score(&[input])?.scores.remove(0))
        })?;
        Ok(scores.into_iter().map(crate::convert::as_written).collect())
    }

    /// Every step's score of each item: dicts with `question` and `steps` (stepwise's, TRL's
    /// `prompt`/`completions` and ProcessBench's `problem` are read too) or `(question, steps)`
    /// pairs. Items are packed into forward passes of at most `max_batch_tokens` tokens.
    fn score_batch(&self, py: Python<'_>, items: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<f64>>> {
        let items = items_arg(items)?;
        let scores = without_gil(py, || Ok(self.scorer().score(&inputs_of(&items))?.scores))?;
        Ok(crate::convert::all_as_written(scores))
    }

    /// Records (any format stepwise reads, or a path to a file of them) with every step scored
    /// under `scores[name]`, as `stepwise score` writes them. Solutions are handed to the scorer
    /// `batch_size` at a time (against servers, two batches in flight a server). A record it
    /// cannot score (longer than the model reads, say): `on_error="raise"` raises
    /// `StepwiseError` naming it, the records scored before it on the error's `records`;
    /// `"skip"` leaves it unscored, the reason in its `meta["score_errors"][name]`, and warns
    /// once with the count. `output` (a `.jsonl` path): each scored record is appended as it
    /// comes, and a call cut off (Ctrl-C, a crash, `kill -9`) and made again scores only the
    /// rest (one with another PRM, name or records is refused). `progress`: None or False
    /// (silent), True (a tqdm bar, or lines on the `stepwise` logger) or a callable
    /// `f(done, total)`. Ctrl-C stops it between batches.
    #[pyo3(signature = (records, name="prm", batch_size=64, on_error="raise", progress=None, output=None))]
    #[allow(clippy::too_many_arguments)]
    fn score_records<'py>(
        &self,
        py: Python<'py>,
        records: &Bound<'py, PyAny>,
        name: &str,
        batch_size: usize,
        on_error: &str,
        progress: Option<&Bound<'py, PyAny>>,
        output: Option<PathBuf>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if batch_size == 0 {
            return Err(value_error("batch_size must be at least 1"));
        }
        let on_error = OnError::by_name(on_error).map_err(|e| value_error(e.to_string()))?;
        let given = records_arg(records)?;
        let sols = without_gil(py, || solutions_of(&given, None))?;
        let (mut journal, mut done) = match &output {
            Some(path) => without_gil(py, || self.resume(path, name, &sols))?,
            None => (None, Vec::new()),
        };
        let off = pyo3::types::PyBool::new(py, false);
        let bar = Progress::start(py, Some(progress.unwrap_or(off.as_any())), "records", sols.len())?;
        let resumed = done.len();
        let todo = &sols[resumed..];
        let mut interrupted = None;
        let run = without_gil(py, || {
            Ok(score_in_order(
                &*self.scorer(),
                todo,
                batch_size,
                on_error,
                |i, outcome| {
                    let mut s = todo[i].clone();
                    apply_outcome(&mut s, name, outcome);
                    if let Some((journal, _)) = journal.as_mut() {
                        journal.append(s.id.clone(), &s)?;
                    }
                    done.push(s);
                    if (i + 1) % batch_size == 0 {
                        bar.done(done.len());
                        // Ctrl-C between batches.
                        if let Err(e) = Python::attach(|py| py.check_signals()) {
                            interrupted = Some(e);
                            anyhow::bail!("interrupted");
                        }
                    }
                    Ok(())
                },
            ))
        })?;
        bar.done(done.len());
        bar.finish();
        drop(journal);
        if let Some(e) = interrupted {
            return Err(e);
        }
        let run = match run {
            Ok(run) => run,
            Err(e) => {
                let Some(f) = e.downcast_ref::<ScoreFailure>() else {
                    return Err(crate::convert::error(e));
                };
                let cause: Vec<String> = e.chain().skip(1).map(|c| c.to_string()).collect();
                return Err(partial_failure(py, &done, done.len(), &f.id, &cause.join(": ")));
            }
        };
        let skipped = run.skipped.len()
            + done[..resumed]
                .iter()
                .filter(|s| s.meta.get(SCORE_ERRORS).and_then(|e| e.get(name)).is_some())
                .count();
        if skipped > 0 {
            let message = format!(
                "stepwise: {skipped} of {} records could not be scored and were left unscored \
                 (the reason in each one's meta['score_errors'][{name:?}])",
                sols.len()
            );
            crate::convert::user_warning(py, message)?;
        }
        let out = without_gil(py, || records_of(&done))?;
        to_py(py, &Value::Array(out))
    }

    /// Where it runs: `cpu`, the GPU's name, or the server URL(s).
    #[getter]
    fn device(&self) -> String {
        match &self.backend {
            ScorerBackend::Local(v) => v.model.placement_name(),
            ScorerBackend::Remote(_) => self.source.clone(),
        }
    }

    /// How solutions are laid out for it (`qwen-prm`, `step-tag`, `token-cls`, `log-ratio`), or
    /// `remote`.
    #[getter]
    fn layout(&self) -> String {
        match &self.backend {
            ScorerBackend::Local(v) => v.layout.name().to_string(),
            ScorerBackend::Remote(_) => "remote".into(),
        }
    }

    fn __repr__(&self) -> String {
        format!("stepwise.PRM({:?}, device={:?})", self.source, self.device())
    }
}

/// Every step's score of each item by a generative verifier: `policy` (a `stepwise.Policy`, or
/// any object with a `continue_from` method, such as `integrations.vllm.VllmPolicy`) writes
/// `samples` verification chains per item, a `\boxed{correct}` or `\boxed{incorrect}` verdict
/// per step (ThinkPRM's format); a step's score is the mean over the chains of its verdict —
/// with `likelihood` and a policy that gives log-probabilities (a local `stepwise.Policy`), the
/// verdict word's probability P(correct) / (P(correct) + P(incorrect)), else 1 or 0 as sampled —
/// every step after a chain's first incorrect one counting as incorrect, 0.5 where no chain
/// judges it. Items as for `PRM.score_batch`. With `tools="python"` (a local `stepwise.Policy`
/// or a served one) a chain may check a step by writing a ```python block: it runs in the
/// sandbox of the code task and its output is put in the chain before it goes on, as GenPRM
/// verifies; verdicts may then also be GenPRM's `\boxed{Yes}` / `\boxed{No}`.
///
/// >>> stepwise.generative_scores(policy, [("What is 2 + 3?", ["2 + 3 = 5", "The answer is 5."])], samples=8)
#[pyfunction]
#[pyo3(signature = (policy, items, samples=4, seed=0, likelihood=true, tools=None))]
pub fn generative_scores(
    py: Python<'_>,
    policy: &Bound<'_, PyAny>,
    items: &Bound<'_, PyAny>,
    samples: usize,
    seed: u64,
    likelihood: bool,
    tools: Option<&str>,
) -> PyResult<Vec<Vec<f32>>> {
    if samples == 0 {
        return Err(value_error("samples must be at least 1"));
    }
    let sandbox = match tools {
        None => None,
        Some("python") => Some(stepwise_code::Sandbox::new().map_err(crate::convert::error)?),
        Some(other) => return Err(value_error(format!("tools: `{other}`; expected None or \"python\""))),
    };
    let items = items_arg(items)?;
    let policy = crate::policy::PolicyArg::of(policy, "\n")?;
    without_gil(py, || {
        let seam = policy.seam(&[]);
        let verifier = stepwise_label::GenerativeVerifier {
            policy: &*seam,
            samples,
            seed,
            likelihood,
            tools: sandbox.as_ref().map(|s| s as &dyn stepwise_core::seams::CodeRunner),
        };
        Ok(verifier.score(&inputs_of(&items))?.scores)
    })
}

/// Every step's score of each item by a judge fine-tuned to answer right after a solution with
/// its first wrong step (the lab's generative verifier, `RUN/judge`): `policy` (a
/// `stepwise.Policy` over the judge's checkpoint, its separator the one the judge reads) is
/// asked after the question and the steps, and writes the first wrong step's index (`format=
/// "index"`, -1 for none) or the step copied out (`"quote"`). A step's score is the
/// probability of the verdicts that put the first error after it: with `likelihood` the
/// probability the judge gives each verdict's answer, read in one forward pass (nothing
/// sampled; a local `stepwise.Policy`, or a served one given `server_tokenizer`, whose answers'
/// log-probabilities come back echoed), else the share of `samples` sampled answers. Items as
/// for `PRM.score_batch`.
///
/// >>> judge = stepwise.Policy("runs/standard-seed1/judge", separator="|", prompt="pieces")
/// >>> stepwise.judge_scores(judge, [(question, steps)])
#[pyfunction]
#[pyo3(signature = (policy, items, format="index", likelihood=true, samples=4, seed=0))]
pub fn judge_scores(
    py: Python<'_>,
    policy: &Bound<'_, PyAny>,
    items: &Bound<'_, PyAny>,
    format: &str,
    likelihood: bool,
    samples: usize,
    seed: u64,
) -> PyResult<Vec<Vec<f32>>> {
    if samples == 0 && !likelihood {
        return Err(value_error("samples must be at least 1 to vote"));
    }
    let format = match format {
        "index" | "quote" => {
            stepwise_label::methods::judge_format(format)
                .map_err(crate::convert::error)?
                .0
        }
        other => return Err(value_error(format!("format `{other}`: use \"index\" or \"quote\""))),
    };
    let items = items_arg(items)?;
    let policy = crate::policy::PolicyArg::of(policy, "\n")?;
    without_gil(py, || {
        let seam = policy.seam(&[]);
        let judge = stepwise_label::Judge {
            policy: &*seam,
            samples,
            seed,
            format,
            likelihood,
        };
        Ok(judge.score(&inputs_of(&items))?.scores)
    })
}

/// How one chunk of `score_records` went.
impl Prm {
    /// `score_records`' output claimed for these records and this PRM, and the records an
    /// earlier call wrote there.
    fn resume(&self, path: &Path, name: &str, sols: &[Solution]) -> anyhow::Result<(Option<Resumed>, Vec<Solution>)> {
        if path.extension().is_none_or(|e| e != "jsonl") {
            anyhow::bail!(
                "{}: the output must be a .jsonl file (it is appended to and resumed)",
                path.display()
            );
        }
        let claim = stepwise_core::journal::claim(
            path,
            &serde_json::json!({
                "input": stepwise_core::journal::fingerprint(sols)?, "name": name,
                "prm": Source::parse(&self.source)?.identity()?,
            }),
        )?;
        let (journal, kept) = stepwise_core::journal::open_in_order(path, sols)?;
        Ok((Some((journal, claim)), kept))
    }
}

/// An output being written, and the claim on it.
type Resumed = (stepwise_core::journal::Journal, stepwise_core::journal::Claim);

/// The `StepwiseError` of a record `score_records` could not score (`on_error="raise"`): it names
/// the record, and the records scored before it are on its `records`.
fn partial_failure(py: Python<'_>, sols: &[stepwise_core::Solution], index: usize, id: &str, cause: &str) -> PyErr {
    let message = format!(
        "record {} (`{id}`) could not be scored: {cause}; the {index} records before it are scored, on this \
         error's `records` (on_error=\"skip\" scores the rest)",
        index + 1
    );
    crate::stages::error_with_records(py, message, &sols[..index])
}
