//! `stepwise.Policy` (a local checkpoint or servers) and Python objects that continue solutions
//! (a vLLM `LLM` wrapped in a class with a `continue_from` method) as the [`Policy`] seam.

use crate::convert::{from_py, interruptible, value_error, without_gil};
use anyhow::{bail, Context, Result};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::Value;
use std::sync::Arc;
use stepwise_core::seams::{continue_each, split_steps_at, Continuation, NextSteps, Policy as PolicySeam, Until};
use stepwise_model::Prompt;
use stepwise_remote::backend::{LocalOptions, PolicyBackend, RemoteOptions, Source};
use stepwise_remote::Client;

/// A policy that writes solutions step by step: a checkpoint folder, a Hugging Face model id
/// found in the local cache, or server URL(s) (vLLM, SGLang, `stepwise serve`). It samples at
/// `temperature` (top-p `top_p`), at most `max_tokens` a continuation; steps are separated by
/// `separator`; `prompt` lays the question out as `text` (question, separator, steps) or `chat`
/// (the tokenizer's chat template). `device` is `auto`, `cpu`, `cuda` or `cuda:N` (on a GPU the
/// KV cache lives on the device); `dtype` how a CPU model holds its weights (`auto`, `f32`, `bf16`).
///
/// >>> policy = stepwise.Policy("Qwen/Qwen2.5-Math-1.5B-Instruct", temperature=0.7)
/// >>> policy.continue_from("What is 2 + 3?", [], n=2, until="end")
#[pyclass(module = "stepwise", name = "Policy", frozen)]
pub struct Policy {
    backend: Arc<PolicyBackend>,
    temperature: f32,
    top_p: f32,
    max_tokens: usize,
    separator: String,
    prompt: Prompt,
    source: String,
    /// The served adapter this view samples with ([`Policy::with_adapter`]); `None`: the base.
    adapter: Option<Arc<ViewAdapter>>,
}

/// A view's adapter: its name and index, held ([`stepwise_model::AdapterLease`]) while the view
/// or a call of it lives, so its index stays its own, unloaded or not.
struct ViewAdapter {
    name: String,
    index: usize,
    _lease: stepwise_model::AdapterLease,
}

/// What a call takes to its thread: the backend, the settings, and the view's adapter (held
/// until the call's thread ends, even where the caller was interrupted).
type CallParts = (
    Arc<PolicyBackend>,
    stepwise_remote::backend::PolicySettings,
    Option<Arc<ViewAdapter>>,
);

/// The policy of a call's parts.
fn policy_of<'a>((backend, settings, adapter): &'a CallParts) -> Box<dyn PolicySeam + 'a> {
    backend.policy_with(settings, index_of(adapter))
}

/// A view's adapter's index (`None`: the base model).
fn index_of(adapter: &Option<Arc<ViewAdapter>>) -> Option<usize> {
    adapter.as_ref().map(|a| a.index)
}

impl Policy {
    /// It as the seam the stages take.
    pub fn seam(&self) -> Box<dyn PolicySeam + '_> {
        self.seam_stopping_at(&[])
    }

    /// It as the seam, continuations also ending at `stop` (code's top-level boundaries).
    pub fn seam_stopping_at(&self, stop: &[String]) -> Box<dyn PolicySeam + '_> {
        (self.backend).policy_with(&self.settings(stop), index_of(&self.adapter))
    }

    /// A call's parts, for its thread.
    fn parts(&self) -> CallParts {
        (self.backend.clone(), self.settings(&[]), self.adapter.clone())
    }

    /// The error for a view of an adapter `name` not served, naming those that are.
    fn not_served(&self, name: &str) -> PyErr {
        let served: Vec<String> = self.adapters().into_keys().collect();
        let served = match served.is_empty() {
            true => "none".to_string(),
            false => served.join(", "),
        };
        value_error(format!(
            "no adapter named {name:?} is served (served: {served}); load it first with load_adapter(name, path)"
        ))
    }

    /// The local model, whose adapters can be changed; servers' cannot from here.
    fn model(&self) -> PyResult<&stepwise_model::Model> {
        match &*self.backend {
            PolicyBackend::Local(p) => Ok(&p.model),
            PolicyBackend::Remote(..) => Err(value_error(
                "a server's adapters are models it serves: load them there (`stepwise serve --lora-modules`, or \
                 POST /v1/load_lora_adapter with --allow-runtime-lora-updating) and name one as \
                 stepwise.Policy(url, served_model=NAME)",
            )),
        }
    }

    fn settings(&self, stop: &[String]) -> stepwise_remote::backend::PolicySettings {
        stepwise_remote::backend::PolicySettings {
            temperature: self.temperature,
            max_tokens: Some(self.max_tokens),
            prompt: self.prompt,
            separator: self.separator.clone(),
            top_p: self.top_p,
            stop: stop.to_vec(),
        }
    }
}

/// The most continuations one call draws: 2^16 (a larger `n` is refused before anything is
/// allocated).
pub const MAX_SAMPLES: usize = 1 << 16;

/// `n` continuations: at least one, at most [`MAX_SAMPLES`].
pub fn check_samples(n: usize) -> PyResult<usize> {
    if n == 0 || n > MAX_SAMPLES {
        return Err(value_error(format!(
            "n={n}: draw between 1 and {MAX_SAMPLES} continuations a call"
        )));
    }
    Ok(n)
}

/// Sampling settings a model can use: a finite temperature ≥ 0 (0: greedy), top-p in (0, 1],
/// at least one new token and at most 2^20.
fn check_sampling(temperature: f32, top_p: f32, max_tokens: usize) -> PyResult<()> {
    if !(temperature.is_finite() && (0.0..=100.0).contains(&temperature)) {
        return Err(value_error(format!(
            "temperature={temperature}: use a number from 0 (greedy) to 100"
        )));
    }
    if !(top_p.is_finite() && top_p > 0.0 && top_p <= 1.0) {
        return Err(value_error(format!(
            "top_p={top_p}: use a number above 0 and at most 1"
        )));
    }
    if max_tokens == 0 || max_tokens > 1 << 20 {
        return Err(value_error(format!(
            "max_tokens={max_tokens}: use 1 to 2^20 new tokens"
        )));
    }
    Ok(())
}

/// A continuation as a dict.
/// Ask `i` of [`Policy::continue_all`]: its question, prefix, `n` and seed.
fn ask_of(i: usize, ask: &Bound<'_, PyDict>) -> PyResult<(String, Vec<String>, usize, u64)> {
    let field = |name: &str| ask.get_item(name);
    let wrong = |name: &str, e: PyErr| value_error(format!("ask {i}: field `{name}`: {e}"));
    let question: String = match field("question")? {
        Some(q) => q.extract().map_err(|e| wrong("question", e))?,
        None => return Err(value_error(format!("ask {i}: field `question` is missing"))),
    };
    let prefix: Vec<String> = match field("prefix")? {
        Some(p) => p.extract().map_err(|e| wrong("prefix", e))?,
        None => Vec::new(),
    };
    let n: usize = match field("n")? {
        Some(n) => n.extract().map_err(|e| wrong("n", e))?,
        None => 1,
    };
    let seed: u64 = match field("seed")? {
        Some(s) => s.extract().map_err(|e| wrong("seed", e))?,
        None => 0,
    };
    if let Some(k) = (ask.keys().iter()).find(|k| {
        !["question", "prefix", "n", "seed"]
            .iter()
            .any(|f| k.eq(*f).unwrap_or(false))
    }) {
        return Err(value_error(format!(
            "ask {i}: unknown field `{k}` (question, prefix, n, seed)"
        )));
    }
    let n = check_samples(n).map_err(|e| wrong("n", e))?;
    Ok((question, prefix, n, seed))
}

fn continuation_dict<'py>(py: Python<'py>, c: &Continuation) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("text", &c.text)?;
    d.set_item("steps", &c.steps)?;
    d.set_item("finished", c.finished)?;
    d.set_item("tokens", c.tokens)?;
    d.set_item("token_ids", &c.token_ids)?;
    Ok(d)
}

/// `"step"` or `"end"`.
pub fn until_of(name: &str) -> PyResult<Until> {
    match name {
        "step" => Ok(Until::Step),
        "end" => Ok(Until::End),
        other => Err(value_error(format!("until={other:?}: use \"step\" or \"end\""))),
    }
}

#[pymethods]
impl Policy {
    #[new]
    #[pyo3(signature = (source, temperature=0.7, top_p=1.0, max_tokens=512, separator="\n", prompt="text", device=None, dtype=None, api_key=None, served_model=None, server_tokenizer=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        source: &Bound<'_, PyAny>,
        temperature: f32,
        top_p: f32,
        max_tokens: usize,
        separator: &str,
        prompt: &str,
        device: Option<&Bound<'_, PyAny>>,
        dtype: Option<&Bound<'_, PyAny>>,
        api_key: Option<String>,
        served_model: Option<String>,
        server_tokenizer: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        let source = crate::convert::source_arg(source)?;
        check_sampling(temperature, top_p, max_tokens)?;
        let prompt = match prompt {
            "text" => Prompt::Text,
            "chat" => Prompt::Chat,
            "pieces" => Prompt::Pieces,
            other => {
                return Err(value_error(format!(
                    "prompt={other:?}: use \"text\", \"chat\" or \"pieces\""
                )))
            }
        };
        if separator.is_empty() {
            return Err(value_error(
                "separator must not be empty (steps could not be told apart)",
            ));
        }
        let options = RemoteOptions {
            api_key: api_key.or_else(|| std::env::var("OPENAI_API_KEY").ok()),
            served_model,
            server_tokenizer,
            ..Default::default()
        };
        let local = LocalOptions {
            placement: crate::convert::placement_arg(device)?,
            precision: crate::convert::precision_arg(dtype)?,
            ..Default::default()
        };
        let src = source.to_string();
        let backend = without_gil(py, move || PolicyBackend::open(&Source::parse(&src)?, &options, &local))?;
        Ok(Policy {
            backend: Arc::new(backend),
            temperature,
            top_p,
            max_tokens,
            separator: separator.to_string(),
            prompt,
            source,
            adapter: None,
        })
    }

    /// Serves the PEFT LoRA adapter in `path` (a folder, or a Hugging Face id found in the cache
    /// or downloaded) as `name` on this local policy,
    /// unmerged beside the others on the same base weights (what `stepwise serve
    /// --lora-modules` serves; a CPU model only). `replace=True` puts new weights under a name
    /// served already (a trainer's latest save): its views sample with them from their next
    /// decoding step. Sample with it through `with_adapter(name)`.
    ///
    /// >>> policy.load_adapter("math", "runs/lora/step-200")
    /// >>> policy.with_adapter("math").generate("What is 2 + 3?")
    #[pyo3(signature = (name, path, replace=false))]
    fn load_adapter(&self, py: Python<'_>, name: &str, path: &Bound<'_, PyAny>, replace: bool) -> PyResult<()> {
        let model = self.model()?;
        if !replace && self.adapters().contains_key(name) {
            return Err(value_error(format!(
                "an adapter named {name:?} is already served: load_adapter({name:?}, path, replace=True) puts new weights in its place"
            )));
        }
        let path = crate::convert::source_arg(path)?;
        without_gil(py, || {
            let dir =
                stepwise_model::hub::resolve_folder(&path).with_context(|| format!("no adapter found at `{path}`"))?;
            model.load_adapter(name, &dir, replace)
        })
    }

    /// Stops serving the adapter `name`: it cannot be named again; views made with it before
    /// keep sampling with it until they are let go.
    fn unload_adapter(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        let model = self.model()?;
        without_gil(py, || model.unload_adapter(name))
    }

    /// The adapters served on this policy's model, `{name: folder}` (a server's: none here).
    #[getter]
    fn adapters(&self) -> std::collections::BTreeMap<String, std::path::PathBuf> {
        let PolicyBackend::Local(p) = &*self.backend else {
            return Default::default();
        };
        let served = p.model.adapters();
        (served.iter().flat_map(|s| s.served()))
            .map(|(_, name, folder)| (name.to_string(), folder.to_path_buf()))
            .collect()
    }

    /// The adapter this view samples with (`None`: the base model).
    #[getter]
    fn adapter(&self) -> Option<String> {
        self.adapter.as_ref().map(|a| a.name.clone())
    }

    /// This policy sampling and weighing with its served adapter `name` (`None`: the base
    /// model), the same model and settings: continuations, `loglikelihood` and every stage it is
    /// given to. The view holds the adapter while it lives: unloaded meanwhile, it still samples
    /// with it; replaced (`load_adapter(..., replace=True)`), with the new weights.
    ///
    /// >>> tuned = policy.with_adapter("math")
    #[pyo3(signature = (name))]
    fn with_adapter(&self, name: Option<&str>) -> PyResult<Policy> {
        let adapter = match name {
            None => None,
            Some(name) => {
                let model = self.model()?;
                let (index, lease) = model.lease_adapter(name).ok_or_else(|| self.not_served(name))?;
                Some(Arc::new(ViewAdapter {
                    name: name.to_string(),
                    index,
                    _lease: lease,
                }))
            }
        };
        Ok(Policy {
            backend: self.backend.clone(),
            separator: self.separator.clone(),
            source: self.source.clone(),
            adapter,
            ..*self
        })
    }

    /// `n` continuations of `question` after the steps `prefix`, by one step (`until="step"`,
    /// stopped at the separator) or to the end (`"end"`); `seed` makes the draw reproducible.
    /// Each is a dict: `text`, `steps`, `finished`, `tokens`, `token_ids`.
    #[pyo3(signature = (question, prefix=Vec::new(), n=1, until="end", seed=0))]
    fn continue_from<'py>(
        &self,
        py: Python<'py>,
        question: &str,
        prefix: Vec<String>,
        n: usize,
        until: &str,
        seed: u64,
    ) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let until = until_of(until)?;
        let n = check_samples(n)?;
        let (parts, question) = (self.parts(), question.to_string());
        let conts = interruptible(py, move || {
            let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
            policy_of(&parts).continue_from(&question, &prefix, n, until, seed)
        })?;
        conts.iter().map(|c| continuation_dict(py, c)).collect()
    }

    /// Many continuations in one call: each ask a dict with `question` and, optionally, `prefix`
    /// (the steps written so far; none), `n` (1) and `seed` (0). A local engine that batches (a
    /// GPU; the CPU for a pretrained policy held in bf16) decodes every ask's rows together, the
    /// weights read once a token for all of them; servers are asked concurrently; else one ask
    /// after another. Returns, ask by ask, the continuations `continue_from` gives it alone.
    ///
    /// >>> policy.continue_all([{"question": q, "n": 8, "seed": i} for i, q in enumerate(questions)])
    #[pyo3(signature = (asks, until="end"))]
    fn continue_all<'py>(
        &self,
        py: Python<'py>,
        asks: Vec<Bound<'py, PyDict>>,
        until: &str,
    ) -> PyResult<Vec<Vec<Bound<'py, PyDict>>>> {
        let until = until_of(until)?;
        let asks: Vec<(String, Vec<String>, usize, u64)> = (asks.iter().enumerate())
            .map(|(i, a)| ask_of(i, a))
            .collect::<PyResult<_>>()?;
        let parts = self.parts();
        let outs = interruptible(py, move || {
            let policy = policy_of(&parts);
            let prefixes: Vec<Vec<&str>> = (asks.iter())
                .map(|(_, p, ..)| p.iter().map(String::as_str).collect())
                .collect();
            let asks: Vec<NextSteps> = (asks.iter().zip(&prefixes))
                .map(|((question, _, n, seed), prefix)| NextSteps {
                    question,
                    prefix,
                    n: *n,
                    seed: *seed,
                })
                .collect();
            let threads = parts.0.client().map_or(1, Client::concurrency);
            let mut outs = Vec::with_capacity(asks.len());
            continue_each(&*policy, &asks, until, (asks.len(), threads), |_, got| {
                outs.push(got?);
                Ok(())
            })?;
            Ok(outs)
        })?;
        (outs.iter())
            .map(|conts| conts.iter().map(|c| continuation_dict(py, c)).collect())
            .collect()
    }

    /// `n` whole solutions of `question`, each as its list of steps.
    #[pyo3(signature = (question, n=1, seed=0))]
    fn generate(&self, py: Python<'_>, question: &str, n: usize, seed: u64) -> PyResult<Vec<Vec<String>>> {
        let n = check_samples(n)?;
        let (parts, question) = (self.parts(), question.to_string());
        interruptible(py, move || policy_of(&parts).complete(&question, &[], n, seed))
    }

    /// Each of `options`' log-probability as the text that follows `question` and the steps
    /// `prefix`, laid out as this policy lays a solution out, summed over the option's tokens
    /// (with `end`, the end token after it too, so `1` and `10` are told apart): how a judge's
    /// verdicts or a multiple-choice answer are weighed. A local model packs every option into
    /// one forward pass; a server echoes the log-probabilities of each option after its prompt
    /// (vLLM, `stepwise serve`; `end` and the `pieces` layout need `server_tokenizer`).
    ///
    /// >>> policy.loglikelihood("What is 2 + 3?", ["The answer is 5", "The answer is 6"], end=True)
    #[pyo3(signature = (question, options, prefix=Vec::new(), end=false))]
    fn loglikelihood(
        &self,
        py: Python<'_>,
        question: &str,
        options: Vec<String>,
        prefix: Vec<String>,
        end: bool,
    ) -> PyResult<Vec<f64>> {
        if options.is_empty() {
            return Ok(Vec::new());
        }
        let (parts, question) = (self.parts(), question.to_string());
        interruptible(py, move || {
            let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
            let options: Vec<&str> = options.iter().map(String::as_str).collect();
            let ask = stepwise_core::seams::NextOptions {
                question: &question,
                prefix: &prefix,
                options: &options,
            };
            let mut weighed = policy_of(&parts)
                .logprobs_after(&[ask], end)?
                .context("this policy gives no log-probabilities of given texts (a chat prompt served without `server_tokenizer`)")?;
            weighed.pop().context("the policy weighed no options")
        })
    }

    fn __repr__(&self) -> String {
        let adapter = match &self.adapter {
            Some(a) => format!(", adapter={:?}", a.name),
            None => String::new(),
        };
        format!(
            "stepwise.Policy({:?}, temperature={}{adapter})",
            self.source, self.temperature
        )
    }
}

/// A Python object with a `continue_from(question, prefix, n, until, seed)` method as a policy.
/// The method returns `n` items, each the generated text (`str`) or a dict with `text` and
/// optionally `finished` (whether the solution ended, rather than stopping at the separator
/// after one step), `tokens` and `token_ids`. Steps are split from the text at `separator`.
pub struct PythonPolicy {
    object: Py<PyAny>,
    separator: String,
}

impl PythonPolicy {
    /// `object`, whose continuations are split at `separator`.
    pub fn new(object: Py<PyAny>, separator: &str) -> Self {
        PythonPolicy {
            object,
            separator: separator.to_string(),
        }
    }

    fn continuation(&self, v: Value, until: Until) -> Result<Continuation> {
        let (text, finished, tokens, token_ids) = match v {
            Value::String(t) => (t, None, None, Vec::new()),
            Value::Object(o) => {
                let text = o
                    .get("text")
                    .and_then(Value::as_str)
                    .context("a continuation dict needs `text`")?
                    .to_string();
                let ids: Vec<u32> = o
                    .get("token_ids")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(|x| x.as_u64().map(|x| x as u32)).collect())
                    .unwrap_or_default();
                (
                    text,
                    o.get("finished").and_then(Value::as_bool),
                    o.get("tokens").and_then(Value::as_u64).map(|t| t as usize),
                    ids,
                )
            }
            other => bail!("a continuation must be a str or a dict with `text`, not {other}"),
        };
        let mut steps = split_steps_at(&text, &self.separator);
        if until == Until::Step {
            steps.truncate(1);
        }
        Ok(Continuation {
            finished: finished.unwrap_or(until == Until::End || steps.is_empty()),
            tokens: tokens.unwrap_or(token_ids.len()),
            steps,
            text,
            token_ids,
        })
    }
}

impl PolicySeam for PythonPolicy {
    fn continue_from(
        &self,
        question: &str,
        prefix: &[&str],
        n: usize,
        until: Until,
        seed: u64,
    ) -> Result<Vec<Continuation>> {
        let got: Value = Python::attach(|py| -> Result<Value> {
            let until_name = if until == Until::Step { "step" } else { "end" };
            let out = self
                .object
                .call_method1(py, "continue_from", (question, prefix.to_vec(), n, until_name, seed))
                .map_err(|e| anyhow::anyhow!("the Python policy's continue_from failed: {e}"))?;
            from_py(out.bind(py)).map_err(|e| anyhow::anyhow!("the Python policy's continue_from returned {e}"))
        })?;
        let Value::Array(items) = got else {
            bail!("the Python policy's continue_from must return a list of {n} continuations");
        };
        if items.len() != n {
            bail!(
                "the Python policy's continue_from returned {} continuations for n = {n}",
                items.len()
            );
        }
        items.into_iter().map(|v| self.continuation(v, until)).collect()
    }
}

/// A policy argument: a `stepwise.Policy`, or any object with a `continue_from` method.
pub enum PolicyArg {
    /// A `stepwise.Policy`.
    Native(Py<Policy>),
    /// A Python object.
    Python(PythonPolicy),
}

impl PolicyArg {
    /// From a Python argument; `separator` splits a Python object's text into steps.
    pub fn of(obj: &Bound<'_, PyAny>, separator: &str) -> PyResult<Self> {
        if let Ok(p) = obj.cast::<Policy>() {
            return Ok(PolicyArg::Native(p.clone().unbind()));
        }
        if obj.hasattr("continue_from")? {
            return Ok(PolicyArg::Python(PythonPolicy::new(obj.clone().unbind(), separator)));
        }
        Err(value_error(
            "policy: expected a stepwise.Policy or an object with a continue_from(question, prefix, n, until, seed) method",
        ))
    }

    /// It as the seam; a `stepwise.Policy` also stops at `stop` (a Python object stops as it
    /// likes).
    pub fn seam(&self, stop: &[String]) -> Box<dyn PolicySeam + '_> {
        match self {
            PolicyArg::Native(p) => p.get().seam_stopping_at(stop),
            PolicyArg::Python(p) => Box::new(PythonPolicyRef(p)),
        }
    }
}

/// A borrowed [`PythonPolicy`] as the seam.
struct PythonPolicyRef<'a>(&'a PythonPolicy);

impl PolicySeam for PythonPolicyRef<'_> {
    fn continue_from(
        &self,
        question: &str,
        prefix: &[&str],
        n: usize,
        until: Until,
        seed: u64,
    ) -> Result<Vec<Continuation>> {
        self.0.continue_from(question, prefix, n, until, seed)
    }
}
