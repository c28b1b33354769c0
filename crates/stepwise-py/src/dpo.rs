//! `stepwise.dpo`: DPO and Step-DPO on preference pairs, as `stepwise dpo` ([`run_dpo`]).

use crate::convert::{existing_path, rows_arg, solutions_of, to_py, value_error, without_gil};
use crate::progress::Progress;
use pyo3::prelude::*;
use std::path::{Path, PathBuf};
use stepwise_core::preference::{pair_layout, pairs_of_records, read_preference_pairs, PreferencePair};
use stepwise_rl::{run_dpo, DpoConfig, DpoJob};

/// The pairs of a Python argument: a path to a file `stepwise dpo --pairs` reads, or rows in
/// memory (pairs in a layout of `stepwise.step_pairs`, or step-labelled records, mined).
fn pairs_arg(obj: &Bound<'_, PyAny>, chosen_min: f32, separator: &str) -> PyResult<Vec<PreferencePair>> {
    let py = obj.py();
    if let Some(path) = existing_path(obj)? {
        return without_gil(py, || Ok(read_preference_pairs(&path, chosen_min, separator)?.0));
    }
    let rows = rows_arg(obj)?;
    without_gil(py, || match rows.first().and_then(pair_layout) {
        Some(_) => {
            let numbered = rows.into_iter().enumerate().map(|(i, v)| (i + 1, Ok(v)));
            Ok(pairs_of_records(numbered, Path::new("pairs"), separator)?)
        }
        None => {
            let sols = solutions_of(&rows, None)?;
            let (pairs, _) = stepwise_core::pairs::step_pairs(&sols, chosen_min);
            Ok(pairs.into_iter().map(PreferencePair::from).collect())
        }
    })
}

/// DPO for a policy (a checkpoint folder or cached Hugging Face model id) on preference
/// `pairs`: a path or rows of `stepwise.step_pairs` in any layout (its step pairs make this
/// Step-DPO), or step-labelled records, mined for step pairs here. Each pair's loss is
/// `−(1−ε)·log σ(βΔ) − ε·log σ(−βΔ)`, `Δ` the chosen completion's log-ratio to the reference (the
/// starting policy) minus the rejected one's; `label_smoothing` is `ε` (conservative DPO).
/// Every `batch_size` pairs make one optimiser step, in passes of `minibatch_size`.
/// `eval_pairs` (same forms) are measured at the end of each epoch. Pairs are laid out as
/// `stepwise.rl` lays out prompts (`chat`, `separator`); `device` and `trainer` as for
/// `stepwise.rl`. The policy, optimiser and `dpo_log.jsonl` are written to `out` every
/// `checkpoint_every` steps and at the end; a call on the same `out` resumes. `lora_rank` trains
/// LoRA adapters on the frozen policy, as `stepwise.rl`. Returns each
/// step's log (`step`, `epoch`, `lr`, `train` and `eval`: `loss`, `accuracy`, `margin`,
/// `chosen_reward`, `rejected_reward`, `chosen_logp`, `rejected_logp`).
///
/// >>> log = stepwise.dpo("policy/", stepwise.step_pairs("labels.jsonl"), "dpo-run/", epochs=2)
#[pyfunction]
#[pyo3(signature = (policy, pairs, out, beta=0.1, label_smoothing=0.0, rpo_alpha=0.0, epochs=1, batch_size=16, minibatch_size=8, lr=1e-6, warmup_ratio=0.1, weight_decay=0.0, max_grad_norm=1.0, eval_pairs=None, chosen_min=0.5, separator="\n", chat=false, checkpoint_every=50, seed=0, device=None, trainer="auto", max_batch_tokens=stepwise_model::DEFAULT_MAX_BATCH_TOKENS, lora_rank=0, lora_alpha=None, lora_targets="all-linear", progress=None))]
#[allow(clippy::too_many_arguments)]
pub fn dpo<'py>(
    py: Python<'py>,
    policy: PathBuf,
    pairs: &Bound<'py, PyAny>,
    out: PathBuf,
    beta: f32,
    label_smoothing: f32,
    rpo_alpha: f32,
    epochs: usize,
    batch_size: usize,
    minibatch_size: usize,
    lr: f64,
    warmup_ratio: f64,
    weight_decay: f64,
    max_grad_norm: f64,
    eval_pairs: Option<&Bound<'py, PyAny>>,
    chosen_min: f32,
    separator: &str,
    chat: bool,
    checkpoint_every: usize,
    seed: u64,
    device: Option<&Bound<'py, PyAny>>,
    trainer: &str,
    max_batch_tokens: usize,
    lora_rank: usize,
    lora_alpha: Option<f32>,
    lora_targets: &str,
    progress: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let lora = crate::convert::lora_arg(lora_rank, lora_alpha, lora_targets, seed)?;
    let cfg = DpoConfig {
        beta,
        label_smoothing,
        rpo_alpha,
        epochs,
        batch_size,
        minibatch_size,
        lr,
        warmup_ratio,
        weight_decay,
        max_grad_norm,
        seed,
        checkpoint_every,
        lora,
    };
    cfg.check().map_err(|e| value_error(e.to_string()))?;
    stepwise_core::pairs::check_chosen_min("chosen_min", chosen_min).map_err(value_error)?;
    let placement = crate::convert::placement_arg(device)?;
    let trainer = crate::convert::trainer_arg(trainer)?;
    let pairs = pairs_arg(pairs, chosen_min, separator)?;
    if pairs.is_empty() {
        return Err(value_error("pairs: no preference pairs".to_string()));
    }
    let eval = eval_pairs
        .map(|e| pairs_arg(e, chosen_min, separator))
        .transpose()?
        .unwrap_or_default();
    let progress = Progress::start(py, progress, "steps", cfg.steps_per_epoch(pairs.len()) * epochs)?;
    let log = without_gil(py, || {
        let policy = stepwise_model::hub::resolve(&policy.to_string_lossy())?;
        let job = DpoJob {
            policy: &policy,
            pairs: &pairs,
            eval: &eval,
            chat,
            separator: separator.to_string(),
            out: &out,
            placement,
            trainer,
            max_batch_tokens,
        };
        let log = run_dpo(job, &cfg, |l| {
            progress.set_total(l.steps);
            progress.done(l.step)
        })?;
        Ok(serde_json::to_value(log)?)
    });
    progress.finish();
    to_py(py, &log?)
}
