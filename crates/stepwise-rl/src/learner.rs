//! Where the policy being trained lives ([`Learner`]): candle's autograd on the CPU
//! ([`CandleLearner`]: the CPU trainer's model and AdamW) or the packed engine's trainer
//! ([`PackedLearner`]: a GPU's, the CPU backend's, or the reference backend's in tests). The RL loop
//! ([`crate::train_rl`]) samples from it, asks it for log-probabilities, hands it minibatches and
//! steps it; rewards, advantages and the run's log are the same for both.

use crate::loss::{policy_loss, rl_loss, LossStats};
use crate::rollout::{sequence_logprobs, Sequence};
use anyhow::{Context, Result};
use candle_core::backprop::GradStore;
use candle_core::Var;
use std::borrow::Cow;
use std::path::Path;
use stepwise_model::checkpoint::{load_training_checkpoint, save_training_checkpoint};
use stepwise_model::log_ratio::token_logprobs;
use stepwise_model::model::pad_batch;
use stepwise_model::packed_engine::{
    with_trainer, LoraConfig, PackedTrainer, Targets, TokenLossFn, TrainBackend, WithTrainer,
};
use stepwise_model::train::optim::{accumulate, named_vars, AdamW};
use stepwise_model::train::packed::batches;
use stepwise_model::train::VarMap;
use stepwise_model::{Model, Packed, Placement};

/// The optimiser's state in a checkpoint folder (the CPU trainer's layout, read by both).
pub const OPTIM: &str = "optimizer.safetensors";

/// The policy being trained, wherever it lives.
pub trait Learner {
    /// The policy as it samples now, in inference mode (dropped before the next
    /// [`Learner::backward`]).
    fn sampler(&mut self) -> Result<Cow<'_, Model>>;
    /// Each sequence's token log-probabilities under the policy now (position 0 holds 0),
    /// `minibatch` sequences a pass where passes are counted in sequences.
    fn logprobs(&mut self, seqs: &[&[u32]], minibatch: usize) -> Result<Vec<Vec<f32>>>;
    /// Whether an update that takes its loss once, before any optimiser step, leaves the old
    /// log-probabilities to [`Learner::backward`]'s own forward instead of a pass of
    /// [`Learner::logprobs`] over the batch. The packed trainer does (a sixth of a 0.5B update
    /// on the CPU); candle's CPU learner keeps the pass, whose kernels round differently from its
    /// backward's, so the lab's recorded runs reproduce bit for bit.
    fn old_logprobs_in_backward(&self) -> bool {
        false
    }
    /// Whether the learner trains LoRA's adapters on a frozen causal LM, whose log-probabilities
    /// [`Learner::base_logprobs`] reads: the starting policy without a second copy of it.
    fn has_base(&self) -> bool {
        false
    }
    /// Each sequence's token log-probabilities (as [`Learner::logprobs`]) under the frozen model
    /// the learner's adapters sit on, the adapters off (PEFT's `disable_adapter()`); refused by a
    /// learner without one ([`Learner::has_base`]).
    fn base_logprobs(&mut self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let _ = seqs;
        anyhow::bail!("the learner trains every weight: it has no frozen base (LoRA) to take a reference from")
    }
    /// The gradients of `batch`'s policy loss (PPO-clip `clip` with the k3
    /// KL penalty `kl_coef`) added to the learner's; returns the loss and what it saw.
    fn backward(&mut self, batch: &[&Sequence], clip: f32, kl_coef: f32) -> Result<(f64, LossStats)>;
    /// The gradients of any loss of the learned tokens' log-probabilities added to the
    /// learner's: `seqs` are token ids and where learning starts (at least 1), and `loss` takes
    /// the log-probabilities of each sequence's tokens from there on, one sequence after
    /// another, and returns the loss and its derivative by each. Returns the loss.
    fn backward_tokens(&mut self, seqs: &[(&[u32], usize)], loss: TokenLossFn<'_>) -> Result<f32>;
    /// One AdamW step at learning rate `lr` (decoupled `weight_decay`) with the mean gradient of
    /// the `micro_batches` backward calls since the last step, clipped to global norm
    /// `max_grad_norm` (0: not clipped).
    fn step(&mut self, lr: f64, weight_decay: f64, max_grad_norm: f64, micro_batches: usize) -> Result<()>;
    /// Writes the policy (Hugging Face layout, with its exact f32 weights) and the optimiser's
    /// state into `dir`.
    fn save(&self, dir: &Path) -> Result<()>;
    /// Continues from what [`Learner::save`] wrote in `dir`.
    fn load(&mut self, dir: &Path) -> Result<()>;
}

/// The policy as candle variables on the CPU, trained through candle's autograd.
pub struct CandleLearner<'a> {
    policy: &'a mut Model,
    /// The policy's variables ([`Model::varmap`]).
    varmap: VarMap,
    vars: Vec<Var>,
    opt: AdamW,
    grads: Option<GradStore>,
}

impl<'a> CandleLearner<'a> {
    /// `policy`, made trainable ([`Model::fresh`], [`Model::load_trainable`]).
    pub fn new(policy: &'a mut Model) -> Result<Self> {
        let varmap = policy
            .varmap()
            .context("the CPU learner trains a model made trainable (Model::load_trainable or Model::fresh)")?
            .clone();
        let named = named_vars(&varmap);
        let vars = named.iter().map(|(_, v)| v.clone()).collect();
        // The learning rate and weight decay are set at each step.
        let opt = AdamW::new(named, 0.0, 0.0)?;
        Ok(CandleLearner {
            policy,
            varmap,
            vars,
            opt,
            grads: None,
        })
    }
}

impl CandleLearner<'_> {
    /// The names of the policy's trainable weights, in order.
    pub fn weight_names(&self) -> Vec<String> {
        named_vars(&self.varmap).into_iter().map(|(name, _)| name).collect()
    }

    /// The trainable weights whose gradient since the last optimiser step is missing or zero
    /// (after a backward pass, none should be: a weight a fused kernel without a backward pass
    /// cut off from the loss would be listed).
    pub fn weights_without_gradient(&self) -> Result<Vec<String>> {
        let mut missing = Vec::new();
        for (name, var) in named_vars(&self.varmap) {
            let norm = match self.grads.as_ref().and_then(|g| g.get(var.as_tensor())) {
                Some(g) => g.sqr()?.sum_all()?.to_scalar::<f32>()?,
                None => 0.0,
            };
            if norm <= 0.0 || !norm.is_finite() {
                missing.push(name);
            }
        }
        Ok(missing)
    }
}

impl Drop for CandleLearner<'_> {
    /// The policy is handed back in inference mode, as it samples.
    fn drop(&mut self) {
        self.policy.set_training(false);
    }
}

impl Learner for CandleLearner<'_> {
    fn sampler(&mut self) -> Result<Cow<'_, Model>> {
        self.policy.set_training(false);
        Ok(Cow::Borrowed(&*self.policy))
    }

    fn logprobs(&mut self, seqs: &[&[u32]], minibatch: usize) -> Result<Vec<Vec<f32>>> {
        self.policy.set_training(false);
        sequence_logprobs(self.policy, seqs, minibatch, stepwise_model::DEFAULT_MAX_BATCH_TOKENS)
    }

    fn backward(&mut self, batch: &[&Sequence], clip: f32, kl_coef: f32) -> Result<(f64, LossStats)> {
        self.policy.set_training(true);
        let (loss, stats) = rl_loss(self.policy, batch, clip, kl_coef)?;
        let value = loss.to_scalar::<f32>()? as f64;
        let g = loss.backward()?;
        match self.grads.as_mut() {
            None => self.grads = Some(g),
            Some(acc) => accumulate(acc, g, &self.vars)?,
        }
        Ok((value, stats))
    }

    fn backward_tokens(&mut self, seqs: &[(&[u32], usize)], loss: TokenLossFn<'_>) -> Result<f32> {
        self.policy.set_training(true);
        let ids: Vec<&[u32]> = seqs.iter().map(|&(s, _)| s).collect();
        let (padded, mask, t) = pad_batch(&ids, &self.policy.device)?;
        let logp = token_logprobs(self.policy, &padded, mask.as_ref())?;
        let all: Vec<f32> = logp.to_vec1()?;
        let rows: Vec<usize> = learned_positions(seqs).map(|(b, p)| b * t + p).collect();
        let (value, derivative) = loss(&rows.iter().map(|&r| all[r]).collect::<Vec<_>>())?;
        anyhow::ensure!(derivative.len() == rows.len(), "one derivative a learned token");
        // Σ c·log p with the derivatives c held constant: its gradient is the loss's.
        let mut coef = vec![0f32; all.len()];
        for (&r, c) in rows.iter().zip(derivative) {
            coef[r] = c;
        }
        let surrogate = (logp * candle_core::Tensor::new(coef.as_slice(), &self.policy.device)?)?.sum_all()?;
        let g = surrogate.backward()?;
        match self.grads.as_mut() {
            None => self.grads = Some(g),
            Some(acc) => accumulate(acc, g, &self.vars)?,
        }
        Ok(value)
    }

    fn step(&mut self, lr: f64, weight_decay: f64, max_grad_norm: f64, micro_batches: usize) -> Result<()> {
        let grads = self.grads.take().context("an optimiser step without gradients")?;
        let mut scale = 1.0 / micro_batches.max(1) as f64;
        if max_grad_norm > 0.0 {
            let norm = self.opt.grad_norm(&grads)? * scale;
            if norm > max_grad_norm {
                scale *= max_grad_norm / norm;
            }
        }
        (self.opt.lr, self.opt.weight_decay) = (lr, weight_decay);
        self.opt.step(&grads, scale)
    }

    fn save(&self, dir: &Path) -> Result<()> {
        save_training_checkpoint(dir, &self.policy.config, &self.varmap)?;
        self.opt.save(&dir.join(OPTIM))
    }

    fn load(&mut self, dir: &Path) -> Result<()> {
        load_training_checkpoint(&self.varmap, dir)?;
        self.opt.load(&dir.join(OPTIM))
    }
}

/// Each sequence's learned positions, `(sequence, position)`, in order: from where learning
/// starts (at least the second token) to the end.
fn learned_positions<'s>(seqs: &'s [(&[u32], usize)]) -> impl Iterator<Item = (usize, usize)> + 's {
    seqs.iter()
        .enumerate()
        .flat_map(|(i, &(s, from))| (from.max(1)..s.len()).map(move |p| (i, p)))
}

/// How a packed learner's policy samples: the model over the trainer's weights (on a GPU,
/// `Model::on_packed` of the trainer's decoder, sharing its weights).
pub type SampleWith<B> = Box<dyn Fn(&PackedTrainer<B>) -> Result<Model>>;

/// The policy on the packed engine's trainer (bf16 copies, f32 masters, AdamW on the device),
/// its loss taken on the host from the learned tokens' log-probabilities ([`policy_loss`]).
pub struct PackedLearner<B: TrainBackend> {
    trainer: PackedTrainer<B>,
    sample_with: SampleWith<B>,
    max_tokens: usize,
}

impl<B: TrainBackend> PackedLearner<B> {
    /// `trainer`'s policy, sampled through `sample_with`; log-probabilities and gradients in
    /// packed passes of at most `max_tokens` tokens (a longer sequence alone).
    pub fn new(trainer: PackedTrainer<B>, max_tokens: usize, sample_with: SampleWith<B>) -> Self {
        PackedLearner {
            trainer,
            sample_with,
            max_tokens,
        }
    }

    /// The trainer.
    pub fn trainer(&self) -> &PackedTrainer<B> {
        &self.trainer
    }
}

impl<B: TrainBackend> Learner for PackedLearner<B> {
    fn sampler(&mut self) -> Result<Cow<'_, Model>> {
        Ok(Cow::Owned((self.sample_with)(&self.trainer)?))
    }

    fn logprobs(&mut self, seqs: &[&[u32]], _minibatch: usize) -> Result<Vec<Vec<f32>>> {
        stepwise_model::train::packed::sequence_logprobs(&self.trainer.decoder, seqs, self.max_tokens)
    }

    fn old_logprobs_in_backward(&self) -> bool {
        true
    }

    fn has_base(&self) -> bool {
        self.trainer.has_frozen_base()
    }

    fn base_logprobs(&mut self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let max_tokens = self.max_tokens;
        self.trainer
            .with_adapters_off(|dec| stepwise_model::train::packed::sequence_logprobs(dec, seqs, max_tokens))
    }

    fn backward(&mut self, batch: &[&Sequence], clip: f32, kl_coef: f32) -> Result<(f64, LossStats)> {
        let seqs: Vec<(&[u32], usize)> = batch.iter().map(|s| (s.ids.as_slice(), s.learn_from)).collect();
        let mut stats = LossStats::default();
        let mut loss = |logp: &[f32]| {
            let (value, coef, seen) = policy_loss(logp, batch, clip, kl_coef)?;
            stats = seen;
            Ok((value, coef))
        };
        let value = self.backward_tokens(&seqs, &mut loss)?;
        Ok((value as f64, stats))
    }

    /// Sequences within the token budget run as one packed pass. More are split into passes
    /// of at most the budget: every pass's log-probabilities first (forward only), the loss on
    /// the host over all of them, then each pass's backward with its share of the derivative
    /// (one more forward a pass), so memory follows the budget whatever the minibatch.
    fn backward_tokens(&mut self, seqs: &[(&[u32], usize)], loss: TokenLossFn<'_>) -> Result<f32> {
        let lens: Vec<usize> = seqs.iter().map(|(s, _)| s.len()).collect();
        let order: Vec<usize> = (0..seqs.len()).collect();
        let parts: Vec<(Packed, Vec<(usize, u32)>)> = batches(&lens, &order, usize::MAX, self.max_tokens)
            .into_iter()
            .map(|part| {
                let ids: Vec<&[u32]> = part.iter().map(|&i| seqs[i].0).collect();
                let packed = Packed::new(&ids);
                let pairs = packed.next_tokens(|k| seqs[part[k]].1);
                (packed, pairs)
            })
            .collect();
        if let [(packed, pairs)] = parts.as_slice() {
            return self.trainer.backward(packed, Targets::Tokens { pairs, loss });
        }
        let mut logp = Vec::new();
        for (packed, pairs) in &parts {
            logp.extend(self.trainer.decoder.token_logprobs(packed, pairs)?);
        }
        let (value, derivative) = loss(&logp)?;
        anyhow::ensure!(derivative.len() == logp.len(), "one derivative a learned token");
        let mut at = 0;
        for (packed, pairs) in &parts {
            let share = derivative[at..at + pairs.len()].to_vec();
            at += pairs.len();
            let mut part_loss = |_: &[f32]| Ok((value, share.clone()));
            self.trainer.backward(
                packed,
                Targets::Tokens {
                    pairs,
                    loss: &mut part_loss,
                },
            )?;
        }
        Ok(value)
    }

    fn step(&mut self, lr: f64, weight_decay: f64, max_grad_norm: f64, micro_batches: usize) -> Result<()> {
        let clip = (max_grad_norm > 0.0).then_some(max_grad_norm as f32);
        self.trainer
            .update(lr as f32, weight_decay as f32, clip, micro_batches)?;
        Ok(())
    }

    fn save(&self, dir: &Path) -> Result<()> {
        self.trainer.save_checkpoint(dir)?;
        self.trainer.save_optimizer(&dir.join(OPTIM))
    }

    fn load(&mut self, dir: &Path) -> Result<()> {
        self.trainer.load_weights(dir)?;
        self.trainer.load_optimizer(&dir.join(OPTIM))
    }
}

/// The policy in the checkpoint folder `dir` trained at `placement` by the packed engine's
/// trainer (bf16 copies and f32 masters: on CUDA GPU `n`, or on the CPU backend,
/// [`stepwise_model::packed_engine::Cpu`]; [`with_trainer`] opens the device), sampled by the
/// packed engine from the trainer's own weights; log-probabilities in packed batches of at most
/// `max_tokens` tokens; with `lora`, the base frozen and LoRA's adapters trained. A build
/// without the `cuda` feature refuses a GPU.
pub fn packed_learner(
    dir: &Path,
    placement: Placement,
    max_tokens: usize,
    lora: Option<LoraConfig>,
) -> Result<Box<dyn Learner>> {
    with_trainer(dir, placement, lora, Boxed { max_tokens })
}

/// A boxed [`PackedLearner`] sampling itself, for whichever backend [`with_trainer`] opened.
struct Boxed {
    max_tokens: usize,
}

impl WithTrainer for Boxed {
    type Output = Box<dyn Learner>;

    fn run<B: TrainBackend + 'static>(self, trainer: PackedTrainer<B>) -> Result<Box<dyn Learner>> {
        Ok(Box::new(PackedLearner::new(
            trainer,
            self.max_tokens,
            sampling_itself(),
        )))
    }
}

/// Sampling from the trainer's own weights: its decoder as the model's packed engine.
pub fn sampling_itself<B: TrainBackend + 'static>() -> SampleWith<B> {
    Box::new(|t| {
        Model::on_packed(std::sync::Arc::clone(&t.decoder) as std::sync::Arc<dyn stepwise_model::engine::PackedEngine>)
    })
}
