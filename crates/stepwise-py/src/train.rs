//! `stepwise.train_prm`: a verifier trained from step-labelled records, as `stepwise train-prm`.

use crate::convert::{records_arg, solutions_of, to_py, without_gil};
use crate::progress::Progress;
use pyo3::prelude::*;
use serde_json::json;
use std::path::PathBuf;
use stepwise_model::train::run::{train_prm as train, TrainPrm};

/// Trains a process (or, with `outcome=True`, outcome) reward model on `records` (step-labelled
/// records in any format `stepwise.read` reads, or a path to a file of them) into the Hugging
/// Face folder `out`, which `stepwise.PRM(out)` and `stepwise score` read back; a folder with a
/// run's state continues it. `base` is the checkpoint to start from (its head replaced by
/// `head`: `classifier`, `value` or `log-ratio`), or `config` a built-in shape (`tiny`, `small`,
/// `base`) with `tokenizer`. `target="progress"` trains an agent's progress head: each action's
/// GAE advantage A from TD labels (`source.progress`) as the soft label (A + 1) / 2, a score s
/// reading as A = 2s − 1. `device` is `auto`, `cpu` or `cuda[:N]`: on a GPU the packed
/// engine trains every head (bf16 products with f32 sums, f32 master weights),
/// batches of at most `max_batch_tokens` tokens; `trainer="packed"` trains on it on the CPU too
/// (activations kept within half the free memory, recomputed past it), `"autograd"` with candle's f32
/// autograd (the CPU only), `"auto"` packed on a GPU and for a pretrained `base` (hidden size 512 or more) on
/// the CPU, autograd for the small shapes. The run ends with its best validation's weights. Progress and the run's last line go to stderr.
/// Returns the run: steps, last loss, tokens and tokens/s in training steps, the device, and the
/// final validation's loss, accuracy and AUROC (`None` without held-out solutions).
/// `valid_records` (records or a path, as `records`) validates on a fixed held-out set instead
/// of `valid_fraction` of `records`. `lr` defaults to 1e-5 to fine-tune a pretrained `base`
/// (hidden size 512 or more: TRL's `PRMConfig` default) and to 1e-3 for a small base or a
/// `config` shape. `lora_rank` trains LoRA adapters (`lora_alpha`, default 2 × rank;
/// `lora_targets`, projections or `"all-linear"`) and the head on the frozen `base` (the packed
/// trainer): `out` holds the merged model and PEFT's adapter files.
///
/// >>> run = stepwise.train_prm(stepwise.read("labelled.jsonl"), "prm/", base="policy/", steps=300)
/// >>> stepwise.PRM("prm/").score(question, steps)
#[pyfunction]
#[pyo3(signature = (records, out, base=None, config=None, tokenizer=None, outcome=false, head=None, target="promise", steps=500, lr=None, batch_size=16, grad_accum=1, valid_fraction=0.1, valid_records=None, patience=0, seed=0, max_len=512, separator="\n", neutral="good", last_step_only=false, stop_at_first_bad=false, beta=1.0, reference_logprob=None, last_tokens=None, device=None, trainer="auto", max_batch_tokens=stepwise_model::DEFAULT_MAX_BATCH_TOKENS, lora_rank=0, lora_alpha=None, lora_targets="all-linear", progress=None))]
#[allow(clippy::too_many_arguments)]
pub fn train_prm<'py>(
    py: Python<'py>,
    records: &Bound<'py, PyAny>,
    out: PathBuf,
    base: Option<PathBuf>,
    config: Option<String>,
    tokenizer: Option<PathBuf>,
    outcome: bool,
    head: Option<String>,
    target: &str,
    steps: usize,
    lr: Option<f64>,
    batch_size: usize,
    grad_accum: usize,
    valid_fraction: f64,
    valid_records: Option<&Bound<'py, PyAny>>,
    patience: usize,
    seed: u64,
    max_len: usize,
    separator: &str,
    neutral: &str,
    last_step_only: bool,
    stop_at_first_bad: bool,
    beta: f32,
    reference_logprob: Option<f32>,
    last_tokens: Option<usize>,
    device: Option<&Bound<'py, PyAny>>,
    trainer: &str,
    max_batch_tokens: usize,
    lora_rank: usize,
    lora_alpha: Option<f32>,
    lora_targets: &str,
    progress: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    if !["promise", "progress"].contains(&target) {
        return Err(crate::convert::value_error(format!(
            "target `{target}`: use promise or progress"
        )));
    }
    let placement = crate::convert::placement_arg(device)?;
    let trainer = crate::convert::trainer_arg(trainer)?;
    let solutions = Given::of(records)?;
    let valid = valid_records.map(Given::of).transpose()?;
    // A model id (`org/name`) is found in, or downloaded into, the Hugging Face cache, as the
    // command line's `--base` is.
    let hub = |p: Option<PathBuf>| {
        p.map(|p| stepwise_model::hub::resolve(&p.to_string_lossy()))
            .transpose()
    };
    let (base, tokenizer) = without_gil(py, || Ok((hub(base)?, hub(tokenizer)?)))?;
    let lr = lr.unwrap_or_else(|| stepwise_model::train::run::default_lr(base.as_deref()).0);
    let mut run = TrainPrm {
        base,
        config,
        tokenizer,
        out,
        outcome,
        head,
        beta,
        reference_logprob,
        last_tokens,
        separator: separator.to_string(),
        neutral: neutral.to_string(),
        last_step_only,
        stop_at_first_bad,
        steps,
        lr,
        batch_size,
        grad_accum,
        valid_fraction,
        valid_solutions: None,
        patience,
        seed,
        max_len,
        placement,
        trainer,
        max_batch_tokens,
        lora: crate::convert::lora_arg(lora_rank, lora_alpha, lora_targets, seed)?,
    };
    run.valid_solutions = without_gil(py, || valid.map(|v| v.read(target)).transpose())?;
    let progress = Progress::start(py, progress, "steps", steps)?;
    let report = without_gil(py, || {
        let solutions = solutions.read(target)?;
        let report = train(
            &run,
            solutions,
            |step, _| progress.done(step),
            |line| progress.say(line),
        )?;
        progress.say(&report.summary(&run.out));
        Ok(report)
    });
    progress.finish();
    to_py(py, &summary(&run, &report?))
}

/// Records as the caller gave them: a path, read without the GIL, or records.
enum Given {
    Path(PathBuf),
    Records(Vec<serde_json::Value>),
}

impl Given {
    fn of(records: &Bound<'_, PyAny>) -> PyResult<Given> {
        Ok(match records.extract::<PathBuf>() {
            Ok(p) => Given::Path(p),
            Err(_) => Given::Records(records_arg(records)?),
        })
    }

    /// The solutions, with the labels `target` trains on.
    fn read(&self, target: &str) -> anyhow::Result<Vec<stepwise_core::Solution>> {
        let solutions = match self {
            Given::Path(p) => stepwise_core::SolutionReader::open(p, None)?.collect::<Result<Vec<_>, _>>()?,
            Given::Records(given) => solutions_of(given, None)?,
        };
        stepwise_agent::training_targets(target, solutions)
    }
}

/// What `train_prm` returns: where the verifier is, its steps, loss, speed and metrics.
fn summary(run: &TrainPrm, report: &stepwise_model::train::run::TrainReport) -> serde_json::Value {
    let s = &report.state;
    json!({
        "out": run.out,
        "device": report.device,
        "steps": s.step,
        "loss": s.last_loss,
        "tokens": s.tokens,
        "seconds": s.seconds,
        "tokens_per_s": s.tokens as f64 / s.seconds.max(1e-9),
        "stopped_early": s.stopped_early,
        "train_sequences": report.sequences.0,
        "valid_sequences": report.sequences.1,
        "metrics": report.metrics,
    })
}
