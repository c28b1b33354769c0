//! Agents in Python: rooms worlds, trajectories played by a policy in an environment (the
//! built-in rooms, or a Python class such as a TextWorld game), and labels for their actions.

use crate::bounded::{call_method_bounded, BoundedError};
use crate::convert::{from_py, records_arg, records_of, solutions_of, to_py, value_error, without_gil};
use crate::policy::PolicyArg;
use crate::progress::Progress;
use anyhow::{anyhow, Result};
use pyo3::prelude::*;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stepwise_agent::{Games, Rooms};
use stepwise_core::seams::{ActionKind, Environment, Episode, Observation};
use stepwise_core::Problem;

/// A Python class (or any callable returning a new environment object) as the environment
/// seam. The object has `reset(problem: dict) -> str` (the first observation) and
/// `step(action: str)` returning `(observation, done, success)` or a dict with those keys; a
/// `fork()` that copies it in its state is used where it has one, else a fork replays the
/// actions on a new object; a `judge(action) -> str` (`progress`, `useless`, `regress`,
/// `invalid`, `ruin`) makes it an oracle.
pub struct PythonEnvironment {
    factory: Py<PyAny>,
    max_actions: usize,
    /// The longest a `reset`, `step` or `fork` may take (`step_timeout`).
    timeout: Option<Duration>,
    /// Held around every call into the environment's objects: Python code of several threads
    /// interleaves even under the GIL, and simulators (TextWorld's grammar parser among them)
    /// keep state that is not safe to share. Taken before the GIL, never while holding it.
    lock: Arc<Mutex<()>>,
}

struct PythonEpisode {
    lock: Arc<Mutex<()>>,
    timeout: Option<Duration>,
    factory: Py<PyAny>,
    object: Py<PyAny>,
    problem: Value,
    actions: Vec<String>,
}

impl Drop for PythonEpisode {
    /// The environment's object let go at once rather than whenever this process next enters
    /// Python from Rust (pyo3 defers a drop made without the interpreter): its `__del__` (an
    /// isolated environment handing its process back for the next object) runs now. Not under
    /// the lock, which is never taken holding the interpreter, and a drop may come holding it.
    fn drop(&mut self) {
        let _ = Python::try_attach(|py| {
            let object = std::mem::replace(&mut self.object, py.None());
            drop(object);
        });
    }
}

fn call_error(what: &str, e: PyErr) -> anyhow::Error {
    anyhow!("the Python environment's {what} raised {e}")
}

/// `object.method(*args)` within `timeout`, its failure named as the environment's `what`.
fn call<'py>(
    py: Python<'py>,
    object: &Py<PyAny>,
    method: &str,
    args: impl pyo3::call::PyCallArgs<'py>,
    timeout: Option<Duration>,
    what: &str,
) -> Result<Py<PyAny>> {
    call_method_bounded(py, object, method, args, timeout).map_err(|e| match e {
        BoundedError::Raised(e) => call_error(what, e),
        BoundedError::TimedOut(t) => anyhow!(
            "the Python environment's {what} did not answer within {} s (step_timeout)",
            t.as_secs_f64()
        ),
    })
}

impl PythonEnvironment {
    fn start(&self, py: Python<'_>, problem: &Value) -> Result<(Py<PyAny>, String)> {
        let object = self.factory.call0(py).map_err(|e| call_error("constructor", e))?;
        let first = call(py, &object, "reset", (to_py(py, problem)?,), self.timeout, "reset")?;
        let first: String = first
            .extract(py)
            .map_err(|_| anyhow!("the Python environment's reset must return the first observation as a str"))?;
        Ok((object, first))
    }
}

impl Environment for PythonEnvironment {
    fn reset(&self, problem: &Problem) -> Result<(Box<dyn Episode>, String)> {
        let problem = serde_json::to_value(problem)?;
        let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        Python::attach(|py| {
            let (object, first) = self.start(py, &problem)?;
            let episode = PythonEpisode {
                lock: self.lock.clone(),
                timeout: self.timeout,
                factory: self.factory.clone_ref(py),
                object,
                problem,
                actions: Vec::new(),
            };
            Ok((Box::new(episode) as Box<dyn Episode>, first))
        })
    }

    fn max_actions(&self) -> usize {
        self.max_actions
    }
}

/// What `step` returned, read as an observation.
fn observation_of(v: Value) -> Result<Observation> {
    let bad = |v: &Value| anyhow!("the Python environment's step returned {v}: expected (observation, done, success)");
    let (text, done, success) = match &v {
        Value::Array(t) if t.len() == 3 => (t[0].as_str(), t[1].as_bool(), t[2].as_bool()),
        Value::Object(o) => (
            o.get("observation").and_then(Value::as_str),
            o.get("done").and_then(Value::as_bool),
            Some(o.get("success").and_then(Value::as_bool).unwrap_or(false)),
        ),
        _ => return Err(bad(&v)),
    };
    match (text, done, success) {
        (Some(t), Some(done), Some(success)) => Ok(Observation {
            text: t.to_string(),
            done,
            success: done && success,
        }),
        _ => Err(bad(&v)),
    }
}

impl Episode for PythonEpisode {
    fn step(&mut self, action: &str) -> Result<Observation> {
        let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let got = Python::attach(|py| -> Result<Value> {
            let out = call(py, &self.object, "step", (action,), self.timeout, "step")?;
            from_py(out.bind(py)).map_err(|e| anyhow!("the Python environment's step returned {e}"))
        })?;
        self.actions.push(action.to_string());
        observation_of(got)
    }

    fn fork(&self) -> Result<Box<dyn Episode>> {
        let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        Python::attach(|py| {
            let object = if self.object.bind(py).hasattr("fork")? {
                call(py, &self.object, "fork", (), self.timeout, "fork")?
            } else {
                let env = PythonEnvironment {
                    factory: self.factory.clone_ref(py),
                    max_actions: 0,
                    timeout: self.timeout,
                    lock: self.lock.clone(),
                };
                let (object, _) = env.start(py, &self.problem)?;
                for a in &self.actions {
                    call(
                        py,
                        &object,
                        "step",
                        (a.as_str(),),
                        self.timeout,
                        "step (replaying to fork)",
                    )?;
                }
                object
            };
            Ok(Box::new(PythonEpisode {
                lock: self.lock.clone(),
                timeout: self.timeout,
                factory: self.factory.clone_ref(py),
                object,
                problem: self.problem.clone(),
                actions: self.actions.clone(),
            }) as Box<dyn Episode>)
        })
    }

    fn judge(&self, action: &str) -> Option<ActionKind> {
        let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        Python::attach(|py| {
            let verdict = self.object.call_method1(py, "judge", (action,)).ok()?;
            let name: String = verdict.extract(py).ok()?;
            [
                ActionKind::Progress,
                ActionKind::Useless,
                ActionKind::Regress,
                ActionKind::Invalid,
                ActionKind::Ruin,
            ]
            .into_iter()
            .find(|k| k.name() == name)
        })
    }
}

/// The environment of an `env=` argument: `"rooms"` (or None) or a class / callable making
/// environments.
pub(crate) fn environment_of(
    env: Option<&Bound<'_, PyAny>>,
    max_actions: usize,
    step_timeout: f64,
) -> PyResult<Box<dyn Environment>> {
    let timeout = match step_timeout {
        t if t == f64::INFINITY => None,
        t if t.is_finite() && t > 0.0 => Some(Duration::from_secs_f64(t)),
        t => {
            return Err(value_error(format!(
                "step_timeout={t}: a positive number of seconds (float(\"inf\") waits forever)"
            )))
        }
    };
    let rooms = Rooms::new(max_actions);
    let Some(env) = env else {
        return Ok(Box::new(rooms));
    };
    if let Ok(name) = env.extract::<String>() {
        return match name.as_str() {
            "rooms" => Ok(Box::new(rooms)),
            other => Err(value_error(format!(
                "env={other:?}: the built-in environment is \"rooms\"; else pass a class whose objects have reset and step"
            ))),
        };
    }
    if !env.is_callable() {
        return Err(value_error(
            "env: expected \"rooms\" or a class (a callable) whose objects have reset(problem) and step(action)",
        ));
    }
    Ok(Box::new(PythonEnvironment {
        factory: env.clone().unbind(),
        max_actions,
        timeout,
        lock: Arc::new(Mutex::new(())),
    }))
}

/// A `problems=` argument: dicts with `id`, `question`, a gold answer and `meta` kept whole (as
/// agents play them and RL grades them), or a path to a file of problems.
pub(crate) fn problems_arg(problems: &Bound<'_, PyAny>) -> PyResult<Vec<Problem>> {
    if let Some(ps) = crate::convert::problems_file(problems)? {
        return Ok(ps);
    }
    let values = records_arg(problems)?;
    values
        .iter()
        .enumerate()
        .map(|(i, v)| Problem::from_record(v).map_err(|e| value_error(format!("problem {}: {e}", i + 1))))
        .collect()
}

/// `count` rooms worlds of stream `seed` as problems (the world in `meta.world`): the agent
/// domain's environment, with an exact oracle.
///
/// >>> games = stepwise.rooms(100, seed=1)
#[pyfunction]
#[pyo3(signature = (count, seed=0))]
pub fn rooms<'py>(py: Python<'py>, count: usize, seed: u64) -> PyResult<Bound<'py, PyAny>> {
    if count > 1_000_000 {
        return Err(value_error(format!("count={count}: at most 1,000,000 worlds a call")));
    }
    let ps: Vec<Value> = (0..count)
        .map(|i| serde_json::to_value(stepwise_agent::rooms::problem(seed, i)))
        .collect::<Result<_, _>>()
        .map_err(|e| value_error(e.to_string()))?;
    to_py(py, &Value::Array(ps))
}

/// Play each of `problems` `n` times with `policy` (a `stepwise.Policy` or an object with
/// `continue_from`) in `env` (`"rooms"`, or a class whose objects have `reset(problem)` and
/// `step(action)`, such as `stepwise.textworld.Game`): one action a step, the environment's
/// answer in the step's `observation`, the outcome in `correct`, how it ended in `meta.end`
/// (`success`, `lost`, `stopped`, `out_of_actions`, or `failed` with `meta.error`: an
/// environment that raises or answers nonsense ends that trajectory, never the call; so does a
/// `reset`, `step` or `fork` that runs past `step_timeout` seconds, stopped by a `TimeoutError`
/// raised in it; `float("inf")` waits forever). With `output` (`.jsonl`) trajectories are appended
/// as they finish and a repeated call resumes.
///
/// >>> trajs = stepwise.play(stepwise.rooms(10), policy, n=4)
#[pyfunction]
#[pyo3(signature = (problems, policy, env=None, n=1, max_actions=30, seed=0, output=None, separator="\n", progress=None, step_timeout=60.0))]
#[allow(clippy::too_many_arguments)]
pub fn play<'py>(
    py: Python<'py>,
    problems: &Bound<'py, PyAny>,
    policy: &Bound<'py, PyAny>,
    env: Option<&Bound<'py, PyAny>>,
    n: usize,
    max_actions: usize,
    seed: u64,
    output: Option<PathBuf>,
    separator: &str,
    progress: Option<&Bound<'py, PyAny>>,
    step_timeout: f64,
) -> PyResult<Bound<'py, PyAny>> {
    let problems = problems_arg(problems)?;
    let policy = PolicyArg::of(policy, separator)?;
    let env = environment_of(env, max_actions, step_timeout)?;
    let progress = Progress::start(py, progress, "trajectories", problems.len() * n)?;
    let claim = json!({"problems": stepwise_core::journal::fingerprint(&problems).map_err(|e| value_error(e.to_string()))?,
        "n": n, "max_actions": max_actions, "seed": seed, "separator": separator});
    let played = without_gil(py, || {
        let seam = policy.seam(&["Observation:".to_string()]);
        let sols = crate::stages::with_journal(output.as_deref(), &claim, |path| {
            stepwise_agent::rollout::play_resumable(path, &problems, n, &*seam, &*env, seed, |d| progress.done(d))
        })?;
        records_of(&sols)
    });
    progress.finish();
    to_py(py, &Value::Array(played?))
}

/// Label the actions of trajectories (records from `play`, or any file of them) by `method`:
/// `oracle` (the environment's exact verdicts: rooms, or a Python environment with `judge`),
/// `mc` (from the state after each action, `policy` plays on `rollouts` times: the fraction
/// that reach the goal, AgentPRM), `binary` (binary search for the first action after which no
/// rollout reaches the goal, Luo et al.: log2(n) probed states; later actions unlabelled) or
/// `td` (the λ-return from the records' `scores[values]`,
/// no rollouts: Xi et al.'s promise, with the progress beside it). `problems` are those the
/// trajectories play. With `output` (`.jsonl`) the run is journalled and resumes.
///
/// >>> labelled = stepwise.label_actions(trajs, games, method="mc", policy=policy, rollouts=8)
#[pyfunction]
#[pyo3(signature = (records, problems, method="oracle", env=None, policy=None, rollouts=8, values="prm", gamma=1.0, lam=0.5, max_actions=30, seed=0, output=None, separator="\n", progress=None, step_timeout=60.0))]
#[allow(clippy::too_many_arguments)]
pub fn label_actions<'py>(
    py: Python<'py>,
    records: &Bound<'py, PyAny>,
    problems: &Bound<'py, PyAny>,
    method: &str,
    env: Option<&Bound<'py, PyAny>>,
    policy: Option<&Bound<'py, PyAny>>,
    rollouts: usize,
    values: &str,
    gamma: f32,
    lam: f32,
    max_actions: usize,
    seed: u64,
    output: Option<PathBuf>,
    separator: &str,
    progress: Option<&Bound<'py, PyAny>>,
    step_timeout: f64,
) -> PyResult<Bound<'py, PyAny>> {
    if !["oracle", "mc", "binary", "td"].contains(&method) {
        return Err(value_error(format!(
            "method={method:?}: use \"oracle\", \"mc\", \"binary\" or \"td\""
        )));
    }
    if !(0.0..=1.0).contains(&gamma) || !(0.0..=1.0).contains(&lam) {
        return Err(value_error(format!(
            "gamma={gamma}, lam={lam}: both must lie in [0, 1]"
        )));
    }
    let problems = problems_arg(problems)?;
    let policy = policy.map(|p| PolicyArg::of(p, separator)).transpose()?;
    if (method == "mc" || method == "binary") && policy.is_none() {
        return Err(value_error(format!(
            "method={method:?} rolls out with a policy: pass policy="
        )));
    }
    let env = environment_of(env, max_actions, step_timeout)?;
    let given = records_arg(records)?;
    let progress = Progress::start(py, progress, "trajectories", given.len())?;
    let labelled = without_gil(py, || {
        let sols = solutions_of(&given, None)?;
        let claim = json!({"input": stepwise_core::journal::fingerprint(&sols)?, "method": method,
            "rollouts": rollouts, "values": values, "gamma": gamma, "lam": lam, "max_actions": max_actions, "seed": seed});
        let games = Games::new(&*env, problems.clone());
        let seam = policy.as_ref().map(|p| p.seam(&["Observation:".to_string()]));
        let how = stepwise_agent::labels::How {
            rollouts,
            values: values.to_string(),
            gamma,
            lambda: lam,
            seed,
        };
        let annotator = stepwise_agent::labels::by_name(method, &games, seam.as_deref(), &sols, &how)?;
        let (labelled, _) = crate::stages::with_journal(output.as_deref(), &claim, |path| {
            stepwise_label::annotate_resumable(path, &sols, &*annotator, |d| progress.done(d))
        })?;
        records_of(&labelled)
    });
    progress.finish();
    to_py(py, &Value::Array(labelled?))
}
