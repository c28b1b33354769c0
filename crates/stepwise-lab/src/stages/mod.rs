//! The lab's stages, one file each. Every stage writes its records into the run folder and is
//! skipped when its output is complete; the long ones resume where an interrupted run stopped.

pub mod annotate;
pub mod dpo;
pub mod evaluate;
pub mod judge;
pub mod labels;
pub mod policy;
pub mod rl;
pub mod sample;
pub mod search;
pub mod studio;
pub mod verifiers;
pub mod worked;

use crate::progress::{bar, say};
use crate::task::Domain;
use crate::vocab;
use anyhow::Result;
use candle_core::Device;
use candle_nn::VarMap;
use serde::Serialize;
use std::path::{Path, PathBuf};
use stepwise_model::train::{evaluate, train, Example, Objective, TrainConfig};
use stepwise_model::Model;

/// The file that marks a trained model's folder complete.
pub(crate) fn done_marker(dir: &Path) -> PathBuf {
    dir.join("DONE")
}

/// Train (or resume, or reuse) a model in `dir` (with the tokenizer of `domain` beside it);
/// `build` makes the trainable model in a varmap (fresh, or from another checkpoint's weights).
#[allow(clippy::too_many_arguments)]
pub(crate) fn train_stage(
    dir: &Path,
    domain: Domain,
    what: &str,
    build: impl FnOnce(&VarMap, &Device) -> Result<Model>,
    train_set: &[Example],
    valid: &[Example],
    objective: Objective,
    tc: TrainConfig,
) -> Result<Model> {
    let dev = Device::Cpu;
    if done_marker(dir).exists() {
        say(&format!("{what}: cached in {}", dir.display()));
        return Model::load(dir, &dev);
    }
    std::fs::create_dir_all(dir)?;
    vocab::save(dir, domain)?;
    let varmap = VarMap::new();
    let mut model = build(&varmap, &dev)?;
    if train_set.is_empty() {
        // A label source that labelled no step (a consensus of two annotators that never
        // agreed, on a small preset): its verifier is its starting model, said so.
        stepwise_model::checkpoint::save_checkpoint(dir, &model.config, &varmap)?;
        std::fs::write(done_marker(dir), "")?;
        say(&format!(
            "{what}: no labelled step to train on; it keeps its starting weights"
        ));
        return Ok(model);
    }
    let pb = bar(tc.steps as u64, what);
    let tc = TrainConfig {
        out_dir: Some(dir.to_path_buf()),
        ..tc
    };
    let state = train(&mut model, &varmap, train_set, valid, objective, &tc, |s, l| {
        pb.set_position(s as u64);
        pb.set_prefix(format!("loss {l:.3}"));
    })?;
    pb.finish_and_clear();
    let m = if valid.is_empty() {
        None
    } else {
        Some(evaluate(&model, valid, objective, 64)?)
    };
    std::fs::write(
        dir.join("train_metrics.json"),
        serde_json::to_string_pretty(&(state.history, &m))?,
    )?;
    std::fs::write(done_marker(dir), "")?;
    say(&format!(
        "{what}: trained {} steps{}",
        tc.steps,
        m.map(|m| format!(", validation loss {:.3}", m.loss))
            .unwrap_or_default()
    ));
    Ok(model)
}

/// Run `job` on a rayon pool of its own with one thread. The lab runs several trainings at
/// once, one thread each; inside this pool their parallel kernels (candle's products, the
/// engine's sampling) run on that thread instead of contending for the two-thread global pool,
/// whose hand-offs otherwise cost a quarter of the RL stage's CPU time in system calls.
pub(crate) fn on_own_thread<T: Send>(job: impl FnOnce() -> T + Send) -> T {
    match rayon::ThreadPoolBuilder::new().num_threads(1).build() {
        Ok(pool) => pool.install(job),
        // No thread for a pool: the job runs as before, on the global pool.
        Err(_) => job(),
    }
}

/// Run `job` on every item at once, one thread each, each thread on a one-thread pool of its own
/// ([`on_own_thread`]): the lab's concurrent trainings (the verifiers, the RL runs). The results
/// come in the items' order; a job that panics is an error naming `what`.
pub(crate) fn all_at_once<I: Sync, T: Send>(
    items: &[I],
    what: &str,
    job: impl Fn(&I) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    std::thread::scope(|scope| {
        let job = &job;
        let handles: Vec<_> = items
            .iter()
            .map(|item| scope.spawn(move || on_own_thread(|| job(item))))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| anyhow::anyhow!("{what}: a thread panicked"))?)
            .collect()
    })
}

/// The lab's fine-tuning schedule: `steps` batches of 32 at peak learning rate `lr` after a
/// warm-up of a twentieth of them, no evaluation on the way.
pub(crate) fn fine_tuning(lr: f64, steps: usize, seed: u64) -> TrainConfig {
    TrainConfig {
        lr,
        warmup: steps / 20,
        steps,
        batch_size: 32,
        eval_every: 0,
        seed,
        ..Default::default()
    }
}

/// Write `items` as JSONL through a temporary file, so a complete file is never half-written.
pub(crate) fn write_jsonl<T: Serialize>(path: &Path, items: &[T]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    stepwise_core::io::write_jsonl(&tmp, items)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}
