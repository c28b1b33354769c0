//! Where a packed trainer's device is opened: [`with_trainer`] loads a checkpoint onto the
//! backend a [`Placement`] names and hands the trainer, generic over its backend, to the
//! caller's work ([`WithTrainer`]). Reward-model training (`train-prm`) and the RL learners
//! (`rl`, PRIME's implicit PRM) all start here, so a new backend is one arm in one place.

use super::{Cpu, LoraConfig, PackedTrainer, TrainBackend};
use crate::{ModelConfig, Placement};
use anyhow::{Context, Result};
use std::path::Path;
use std::sync::Arc;

/// What to do with a packed trainer once it is loaded: a caller's work, written once for every
/// backend and run by [`with_trainer`] on the one `placement` chose.
pub trait WithTrainer {
    /// What the work gives back (a training run's state, a boxed learner).
    type Output;
    /// Do the work with `trainer`.
    fn run<B: TrainBackend + 'static>(self, trainer: PackedTrainer<B>) -> Result<Self::Output>;
}

/// Load the checkpoint folder `dir` into a packed trainer (bf16 copies, f32 masters) at
/// `placement` and run `work` with it: on CUDA GPU `n` (a build without the `cuda` feature
/// refuses), or on the CPU backend ([`Cpu`]) for `cpu` and `auto` (resolve `auto` first to
/// prefer a GPU). With `lora` the base is frozen and LoRA's adapters train
/// ([`PackedTrainer::load_with`]). The one place a packed trainer's device is opened.
pub fn with_trainer<W: WithTrainer>(dir: &Path, placement: Placement, lora: Option<LoraConfig>, work: W) -> Result<W::Output> {
    let config = ModelConfig::from_dir(dir)?;
    match placement {
        Placement::Cuda(ordinal) => on_gpu(dir, config, ordinal, lora, work),
        Placement::Cpu | Placement::Auto => {
            let trainer = PackedTrainer::load_with(dir, config, Arc::new(Cpu), lora)
                .with_context(|| format!("loading {} to train on the CPU", dir.display()))?;
            work.run(trainer)
        }
    }
}

#[cfg(feature = "cuda")]
fn on_gpu<W: WithTrainer>(dir: &Path, config: ModelConfig, ordinal: usize, lora: Option<LoraConfig>, work: W) -> Result<W::Output> {
    let gpu = crate::cuda::open(ordinal)?;
    let trainer = PackedTrainer::load_with(dir, config, gpu, lora)
        .with_context(|| format!("loading {} onto cuda:{ordinal} to train", dir.display()))?;
    work.run(trainer)
}

#[cfg(not(feature = "cuda"))]
fn on_gpu<W: WithTrainer>(_: &Path, _: ModelConfig, ordinal: usize, _: Option<LoraConfig>, _: W) -> Result<W::Output> {
    anyhow::bail!("cuda:{ordinal}: this stepwise was built without CUDA")
}
