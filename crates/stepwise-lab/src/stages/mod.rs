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
use stepwise_core::seams::{apply_outcome, score_in_order, OnError, ScoreOutcome, StepScorer};
use stepwise_core::Solution;
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

/// Every solution's scores by `scorer` (a progress bar named `what`), in order; the first
/// solution it cannot score is the error.
pub(crate) fn outcomes(scorer: &dyn StepScorer, sols: &[Solution], what: &str) -> Result<Vec<ScoreOutcome>> {
    let pb = bar(sols.len() as u64, what);
    let mut outcomes = Vec::with_capacity(sols.len());
    score_in_order(scorer, sols, 64, OnError::Raise, |i, scores| {
        outcomes.push(scores);
        pb.set_position(i as u64 + 1);
        Ok(())
    })?;
    pb.finish_and_clear();
    Ok(outcomes)
}

/// Score `sols` with every item's scorer at once (`outcomes_of(item, sols)`, one thread each:
/// [`all_at_once`]), then record each item's scores under its name (`name_of(item)`) in the
/// items' order: what scoring them one after another records, in a fraction of the time where
/// one scorer alone leaves a core idle (a lab-sized model's forward passes do).
pub(crate) fn score_all_at_once<I: Sync>(
    items: &[I],
    sols: &mut [Solution],
    name_of: impl Fn(&I) -> &str,
    outcomes_of: impl Fn(&I, &[Solution]) -> Result<Vec<ScoreOutcome>> + Sync,
) -> Result<()> {
    let shared: &[Solution] = sols;
    let all = all_at_once(items, "scoring", |item| outcomes_of(item, shared))?;
    for (item, outcomes) in items.iter().zip(all) {
        let name = name_of(item);
        for (s, scores) in sols.iter_mut().zip(outcomes) {
            apply_outcome(s, name, scores);
        }
    }
    Ok(())
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

/// Write `items` as JSONL through a temporary file, so a complete file is never half-written
/// ([`stepwise_core::io::write_jsonl`]).
pub(crate) fn write_jsonl<T: Serialize>(path: &Path, items: &[T]) -> Result<()> {
    Ok(stepwise_core::io::write_jsonl(path, items)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::confidence::PolicyConfidence;
    use stepwise_core::seams::score_solutions;
    use stepwise_core::Step;
    use stepwise_model::{HeadKind, ModelConfig};

    /// Two models scoring at once, one thread each, record what they record one after the other
    /// on the global pool, bit for bit; a solution one of them cannot score is the error.
    #[test]
    fn scoring_at_once_records_what_scoring_in_turn_does() {
        let tok = crate::vocab::tokenizer(Domain::Arithmetic).unwrap();
        let cfg = ModelConfig::tiny(tok.vocab_size(), 32, 1, 4, 2, HeadKind::CausalLm);
        let models: Vec<Model> = (0..2)
            .map(|seed| Model::fresh(cfg.clone(), &VarMap::new(), &Device::Cpu, seed).unwrap())
            .collect();
        let sols: Vec<Solution> = (0..70)
            .map(|i| Solution {
                id: format!("s{i}"),
                question: format!("Ann has {i} bags of 4 coins ."),
                steps: vec![Step::new(format!("{i} * 4 = {}", i * 4)), Step::new("The answer is 7")],
                ..Default::default()
            })
            .collect();
        let names = ["first", "second"];
        let mut in_turn = sols.clone();
        for (model, name) in models.iter().zip(names) {
            score_solutions(&PolicyConfidence { model, tok: &tok }, name, &mut in_turn, 64, |_| {}).unwrap();
        }
        let each: Vec<(&Model, &str)> = models.iter().zip(names).collect();
        let mut at_once = sols.clone();
        let outcomes_of = |&(model, name): &(&Model, &str), sols: &[Solution]| {
            outcomes(&PolicyConfidence { model, tok: &tok }, sols, name)
        };
        score_all_at_once(&each, &mut at_once, |(_, name)| name, outcomes_of).unwrap();
        for (a, b) in in_turn.iter().zip(&at_once) {
            assert_eq!(a.scores, b.scores, "{}", a.id);
            assert_eq!(a.scores.len(), 2);
        }

        // A scorer that cannot score one solution: that solution is the error, nothing recorded.
        struct Refuses;
        impl StepScorer for Refuses {
            fn score(&self, batch: &[stepwise_core::seams::ScoreInput<'_>]) -> Result<stepwise_core::seams::Scored> {
                match batch.iter().any(|i| i.question == "refuse") {
                    true => anyhow::bail!("cannot score it"),
                    false => Ok(stepwise_core::seams::Scored {
                        scores: batch.iter().map(|i| vec![0.5; i.steps.len()]).collect(),
                        tokens: 0,
                    }),
                }
            }
        }
        let mut bad = sols.clone();
        bad[3].question = "refuse".into();
        let err = score_all_at_once(
            &names,
            &mut bad,
            |name| name,
            |_, sols| outcomes(&Refuses, sols, "refusing"),
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("s3"), "{err:#}");
        assert!(bad.iter().all(|s| s.scores.is_empty()));
    }
}
