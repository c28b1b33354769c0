//! [`PackedTrainer`]: a model (a reward model with Qwen2.5-Math-PRM's head or a classifier, or a
//! causal LM) trained over packed batches on a [`TrainBackend`], the way the packed engine
//! scores: every product over all the batch's tokens, attention within each sequence, bf16
//! operands with f32 sums (PyTorch's bf16 autocast), f32 master weights and AdamW.
//!
//! A step: the forward keeps each layer's input (f32, `tokens × hidden` a layer) and, when they
//! fit a budget (half the device's free memory unless set:
//! [`PackedTrainer::set_activation_budget`]), each layer's activations; the head is read at the
//! target rows and the loss taken on the host ([`Targets`]: BCE with logits on P(good), as the
//! CPU trainer's `Classify` objective, or any loss of target tokens' log-probabilities); the
//! backward runs each layer's backward kernels on its kept activations, or recomputes them from
//! its kept input first (activation checkpointing, past the budget: memory then grows with the
//! token budget, not with the layers' activations; `backward.rs`, `lm_head.rs`). The update
//! is AdamW on the f32 masters, gradients clipped by their global norm, and each matrix is
//! rounded back to the bf16 copy the forward reads.

use super::backward::{layer_bytes_per_token, layers_backward, reward_head_backward, Keep};
use super::lm_head::{lm_head_backward, TokenLossFn};
use super::train_backend::{AdamW, TrainBackend};
use super::lora::{Adapters, LoraConfig};
use super::{Backend, Head, PackedDecoder};
use crate::checkpoint::to_f32;
use crate::config::{HeadKind, ModelConfig};
use crate::packed::Packed;
use anyhow::{bail, ensure, Context, Result};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// One value per trainable tensor of a model, in the packed engine's layout (stacked q|k|v and
/// gate|up, as the decoder holds them).
pub(super) struct Params<T> {
    pub embed: T,
    pub norm: T,
    pub layers: Vec<LayerParams<T>>,
    /// Qwen2.5-Math-PRM's `score.0.weight, score.0.bias, score.2.weight, score.2.bias`, a
    /// classifier's `score.weight` (and `score.bias`), or a causal LM's `lm_head.weight` (none
    /// when tied to the embeddings).
    pub head: Vec<T>,
    /// LoRA's adapters, each one's `A` then `B` (none without LoRA; `lora.rs`).
    pub lora: Vec<T>,
}

/// One layer's values.
pub(super) struct LayerParams<T> {
    pub ln1: T,
    pub ln2: T,
    pub qkv: T,
    pub qkv_bias: Option<T>,
    pub o: T,
    pub gate_up: T,
    pub down: T,
}

impl<T> Params<T> {
    /// Every value, in one fixed order.
    pub(super) fn all(&self) -> Vec<&T> {
        let mut v = vec![&self.embed, &self.norm];
        for l in &self.layers {
            v.extend([&l.ln1, &l.ln2, &l.qkv]);
            v.extend(l.qkv_bias.as_ref());
            v.extend([&l.o, &l.gate_up, &l.down]);
        }
        v.extend(&self.head);
        v.extend(&self.lora);
        v
    }

    /// Every value, in [`Params::all`]'s order.
    pub(super) fn all_mut(&mut self) -> Vec<&mut T> {
        let mut v = vec![&mut self.embed, &mut self.norm];
        for l in &mut self.layers {
            v.extend([&mut l.ln1, &mut l.ln2, &mut l.qkv]);
            v.extend(l.qkv_bias.as_mut());
            v.extend([&mut l.o, &mut l.gate_up, &mut l.down]);
        }
        v.extend(&mut self.head);
        v.extend(&mut self.lora);
        v
    }

    /// `f` of every value, in the same layout.
    pub(super) fn map<U>(&self, mut f: impl FnMut(&T) -> Result<U>) -> Result<Params<U>> {
        Ok(Params {
            embed: f(&self.embed)?,
            norm: f(&self.norm)?,
            layers: self
                .layers
                .iter()
                .map(|l| {
                    Ok(LayerParams {
                        ln1: f(&l.ln1)?,
                        ln2: f(&l.ln2)?,
                        qkv: f(&l.qkv)?,
                        qkv_bias: l.qkv_bias.as_ref().map(&mut f).transpose()?,
                        o: f(&l.o)?,
                        gate_up: f(&l.gate_up)?,
                        down: f(&l.down)?,
                    })
                })
                .collect::<Result<_>>()?,
            head: self.head.iter().map(&mut f).collect::<Result<_>>()?,
            lora: self.lora.iter().map(f).collect::<Result<_>>()?,
        })
    }
}

/// The checkpoint tensors a value holds, one after another: names and shapes; and whether it
/// is frozen (LoRA's base: no master, moments or gradient, its copy in the decoder all there is).
pub(super) struct Spec {
    pub(super) parts: Vec<(String, Vec<usize>)>,
    pub(super) frozen: bool,
}

impl Spec {
    /// A trained value of these tensors.
    pub(super) fn trained(parts: Vec<(String, Vec<usize>)>) -> Self {
        Spec { parts, frozen: false }
    }

    pub(super) fn len(&self) -> usize {
        self.parts.iter().map(|(_, s)| s.iter().product::<usize>()).sum()
    }

    /// Values of its master and moments: none frozen (one, a placeholder).
    fn held_len(&self) -> usize {
        if self.frozen {
            1
        } else {
            self.len()
        }
    }

    /// Values of its gradient: a frozen vector's is still written (by the norms' backward
    /// kernels, and thrown away), a frozen matrix's never.
    fn grad_len(&self) -> usize {
        if self.frozen && self.parts.iter().any(|(_, s)| s.len() > 1) {
            1
        } else {
            self.len()
        }
    }
}

/// The trainable tensors of a model of `cfg`.
fn specs(cfg: &ModelConfig) -> Result<Params<Spec>> {
    let (h, d, inter) = (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size);
    let (heads, kv, c) = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_labels);
    let one = |name: &str, shape: Vec<usize>| Spec::trained(vec![(name.to_string(), shape)]);
    let layers = (0..cfg.num_hidden_layers)
        .map(|i| {
            let p = |n: &str| format!("model.layers.{i}.{n}");
            let proj = |x: &str, what: &str| p(&format!("self_attn.{x}_proj.{what}"));
            LayerParams {
                ln1: one(&p("input_layernorm.weight"), vec![h]),
                ln2: one(&p("post_attention_layernorm.weight"), vec![h]),
                qkv: Spec::trained(vec![
                    (proj("q", "weight"), vec![heads * d, h]),
                    (proj("k", "weight"), vec![kv * d, h]),
                    (proj("v", "weight"), vec![kv * d, h]),
                ]),
                qkv_bias: cfg.attention_bias.then(|| {
                    Spec::trained(vec![
                        (proj("q", "bias"), vec![heads * d]),
                        (proj("k", "bias"), vec![kv * d]),
                        (proj("v", "bias"), vec![kv * d]),
                    ])
                }),
                o: one(&proj("o", "weight"), vec![h, heads * d]),
                gate_up: Spec::trained(vec![
                    (p("mlp.gate_proj.weight"), vec![inter, h]),
                    (p("mlp.up_proj.weight"), vec![inter, h]),
                ]),
                down: one(&p("mlp.down_proj.weight"), vec![h, inter]),
            }
        })
        .collect();
    let head = match cfg.head {
        HeadKind::ProcessRewardMlp => vec![
            one("score.0.weight", vec![h, h]),
            one("score.0.bias", vec![h]),
            one("score.2.weight", vec![c, h]),
            one("score.2.bias", vec![c]),
        ],
        HeadKind::TokenClassification => vec![
            one("score.weight", vec![c, h]),
            one("score.bias", vec![c]),
        ],
        HeadKind::SequenceClassification => vec![one("score.weight", vec![c, h])],
        // Tied embeddings are the head: their gradient is the embedding table's.
        HeadKind::CausalLm if cfg.tie_word_embeddings => vec![],
        HeadKind::CausalLm => vec![one("lm_head.weight", vec![cfg.vocab_size, h])],
    };
    Ok(Params {
        embed: one("model.embed_tokens.weight", vec![cfg.vocab_size, h]),
        norm: one("model.norm.weight", vec![h]),
        layers,
        head,
        lora: Vec::new(),
    })
}

/// A decoder's copy of a value: what its forward reads (`M`: a reference to its bf16 matrix,
/// `V`: to its f32 vector; shared or not).
#[derive(Clone, Copy)]
pub(super) enum Held<M, V> {
    Matrix(M),
    Vector(V),
}

/// The decoder's copies of every value but LoRA's, in [`Params::all`]'s order (`mut`: lent
/// mutably).
macro_rules! held_copies {
    ($dec:expr, $($m:tt)?) => {{
        let dec = $dec;
        let mut v = vec![Held::Matrix(&$($m)? dec.embed), Held::Vector(&$($m)? dec.norm)];
        for l in &$($m)? dec.layers {
            v.extend([Held::Vector(&$($m)? l.ln1), Held::Vector(&$($m)? l.ln2), Held::Matrix(&$($m)? l.qkv)]);
            if let Some(bias) = &$($m)? l.qkv_bias {
                v.push(Held::Vector(bias));
            }
            v.extend([Held::Matrix(&$($m)? l.o), Held::Matrix(&$($m)? l.gate_up), Held::Matrix(&$($m)? l.down)]);
        }
        match &$($m)? dec.head {
            Head::Mlp { w1, b1, w2, b2 } => {
                v.extend([Held::Matrix(w1), Held::Vector(b1), Held::Matrix(w2), Held::Vector(b2)]);
            }
            Head::Classifier { w, b } => {
                v.push(Held::Matrix(w));
                if let Some(b) = b {
                    v.push(Held::Vector(b));
                }
            }
            Head::Lm(Some(w)) => v.push(Held::Matrix(w)),
            Head::Lm(None) => {}
        }
        v
    }};
}

/// The decoder's copies, lent to be refreshed.
type HeldMut<'a, B> = Held<&'a mut <B as Backend>::Bf16, &'a mut <B as Backend>::F32>;

/// The decoder's copies of every value but LoRA's, in [`Params::all`]'s order.
fn held<B: Backend>(dec: &mut PackedDecoder<B>) -> Vec<HeldMut<'_, B>> {
    held_copies!(dec, mut)
}

/// The decoder's copies of every value but LoRA's, in [`Params::all`]'s order, to be read.
pub(super) fn held_ref<B: Backend>(dec: &PackedDecoder<B>) -> Vec<Held<&B::Bf16, &B::F32>> {
    held_copies!(dec,)
}

/// The decoder's copy of a trainable value refreshed from its master `w` (`n` values): rounded
/// to bf16 for a matrix, copied for a vector.
fn refresh<B: TrainBackend>(b: &B, w: &B::F32, copy: HeldMut<'_, B>, n: usize) -> Result<()> {
    match copy {
        Held::Matrix(dst) => b.round_bf16(w, dst, 0, n),
        Held::Vector(dst) => b.copy_f32(w, dst, n),
    }
}

/// Where each checkpoint tensor lies: its buffer (in [`Params::all`]'s order), offset and shape.
pub(super) type Places<'s> = HashMap<&'s str, (usize, usize, &'s [usize])>;

/// The places of every tensor of `specs` with a master (LoRA's adapters' with `lora`).
pub(super) fn places(specs: &Params<Spec>, lora: bool) -> Places<'_> {
    let mut at = HashMap::new();
    let first_lora = specs.all().len() - specs.lora.len();
    let values = specs.all().into_iter().enumerate();
    for (i, s) in values.filter(|&(i, s)| !s.frozen && (lora || i < first_lora)) {
        let mut offset = 0;
        for (name, shape) in &s.parts {
            at.insert(name.as_str(), (i, offset, shape.as_slice()));
            offset += shape.iter().product::<usize>();
        }
    }
    at
}

/// Each tensor of the mapped `file` (`map`) named `prefix` + a checkpoint name written as f32 into
/// its place in `bufs` (its pages then let go), its shape checked; returns the checkpoint names it held.
pub(super) fn read_named<'s, B: Backend>(
    b: &B,
    at: &Places<'s>,
    bufs: &mut [&mut B::F32],
    map: &crate::checkpoint::Mapped,
    prefix: &str,
    file: &Path,
) -> Result<Vec<&'s str>> {
    let st = safetensors::SafeTensors::deserialize(map).with_context(|| format!("reading {}", file.display()))?;
    let mut found = Vec::new();
    for (stored, view) in st.tensors() {
        let Some((&name, &(i, offset, shape))) = stored.strip_prefix(prefix).and_then(|n| at.get_key_value(n)) else {
            continue;
        };
        let what = || format!("{}: tensor `{stored}`", file.display());
        if view.shape() != shape {
            bail!("{}: shape {:?}, the model's is {shape:?}", what(), view.shape());
        }
        let host = to_f32(&view).with_context(what)?;
        b.write_f32(bufs[i], offset, &host)?;
        map.let_go(view.data());
        found.push(name);
    }
    Ok(found)
}

/// The files a checkpoint folder `dir`'s f32 masters are read from, in order: its weights as
/// stored, then the exact f32 weights a checkpoint of a narrower dtype keeps beside them (what a
/// resumed run continues from, with LoRA's adapters).
fn master_files(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let mut files = crate::checkpoint::weight_files(dir)?;
    let exact = dir.join(crate::checkpoint::TRAINING_WEIGHTS);
    if exact.exists() {
        files.push(exact);
    }
    Ok(files)
}

/// The f32 masters `master` (laid out as `specs`; LoRA's adapters with `lora`, else not) read
/// from `files` in order, a later file's tensor over an earlier one's; every tensor must be in
/// one of them (`what` names them).
pub(super) fn read_master_files<B: Backend>(
    b: &B,
    specs: &Params<Spec>,
    master: &mut Params<B::F32>,
    files: &[std::path::PathBuf],
    what: &Path,
    lora: bool,
) -> Result<()> {
    let at = places(specs, lora);
    let mut missing: std::collections::HashSet<&str> = at.keys().copied().collect();
    let mut bufs = master.all_mut();
    for file in files {
        let map = crate::checkpoint::Mapped::open(file)?;
        for name in read_named(b, &at, &mut bufs, &map, "", file)? {
            missing.remove(name);
        }
    }
    if let Some(name) = missing.iter().min() {
        bail!("{}: tensor `{name}` is missing", what.display());
    }
    Ok(())
}

/// What a training step learns from its packed batch (rows counted over all its tokens).
pub enum Targets<'a> {
    /// A reward head's: `(row, label)`, the probability that the row's step is good, learned by
    /// BCE with logits on P(good) (the CPU trainer's `Classify`).
    Labels(&'a [(usize, f32)]),
    /// A causal LM's: `(row, token)`, the token each row predicts, and the loss of their
    /// log-probabilities (with its derivative by each; see `lm_head.rs`).
    Tokens {
        /// The rows and the tokens they predict.
        pairs: &'a [(usize, u32)],
        /// The loss.
        loss: TokenLossFn<'a>,
    },
}

/// What one training step did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrainStep {
    /// The batch's mean loss before the update.
    pub loss: f32,
    /// The gradients' global norm before clipping.
    pub grad_norm: f32,
}

/// A reward model trained on a [`TrainBackend`] (see the module's documentation).
pub struct PackedTrainer<B: TrainBackend> {
    /// The model being trained: its forward ([`PackedDecoder::head_at`]) scores with the weights
    /// of the last update.
    pub decoder: Arc<PackedDecoder<B>>,
    pub(super) specs: Params<Spec>,
    pub(super) master: Params<B::F32>,
    grad: Params<B::F32>,
    pub(super) m: Params<B::F32>,
    pub(super) v: Params<B::F32>,
    pub(super) updates: u32,
    /// The most bytes a batch's kept layer activations may take (`None`: half the device's
    /// free memory at each step); past it the backward recomputes each layer.
    activation_budget: Option<usize>,
    /// LoRA's adapters, when the base is frozen (`lora.rs`).
    pub(super) adapters: Option<Adapters<B>>,
}

impl<B: TrainBackend> PackedTrainer<B> {
    /// The reward model in the checkpoint folder `dir` (config `config`) on `backend`: f32
    /// masters read from the checkpoint as stored (the exact f32 weights kept beside a narrower
    /// checkpoint), and the decoder's copies made from them.
    pub fn load(dir: &Path, config: ModelConfig, backend: Arc<B>) -> Result<Self> {
        Self::load_with(dir, config, backend, None)
    }

    /// [`PackedTrainer::load`], or with `lora` the base frozen and LoRA's adapters trained
    /// (with a reward model's head; `lora.rs`): no master, gradient or moments for the base.
    pub fn load_with(dir: &Path, config: ModelConfig, backend: Arc<B>, lora: Option<LoraConfig>) -> Result<Self> {
        let mut specs = specs(&config)?;
        let decoder = PackedDecoder::load(dir, config, backend)?;
        let adapters = match lora {
            Some(lora) => {
                let (adapters, lora_specs) = Adapters::new(&decoder, lora, dir)?;
                // Every value frozen but a reward model's head (the last values).
                let head = if matches!(decoder.head, Head::Lm(_)) { 0 } else { specs.head.len() };
                let all = specs.all_mut();
                let base = all.len() - head;
                for s in all.into_iter().take(base) {
                    s.frozen = true;
                }
                specs.lora = lora_specs;
                Some(adapters)
            }
            None => None,
        };
        let b = &*decoder.backend;
        let mut master = specs.map(|s| b.zeros_f32(s.held_len()))?;
        // The adapters start afresh (a checkpoint's own adapters are in its merged weights).
        read_master_files(b, &specs, &mut master, &master_files(dir)?, dir, false)?;
        if let Some(a) = &adapters {
            a.init(b, &mut master.lora)?;
        }
        // Zeros written, not only allocated: the first step would otherwise fault in these pages
        // (the gradients and AdamW's state: four times the masters) one by one.
        let zeros = |n: usize| {
            let mut buf = b.zeros_f32(n)?;
            b.zero_f32(&mut buf, n)?;
            Ok(buf)
        };
        let grad = specs.map(|s| zeros(s.grad_len()))?;
        let (m, v) = (specs.map(|s| zeros(s.held_len()))?, specs.map(|s| zeros(s.held_len()))?);
        let mut trainer = PackedTrainer {
            specs,
            master,
            grad,
            m,
            v,
            updates: 0,
            activation_budget: None,
            adapters,
            decoder: Arc::new(decoder),
        };
        // The copies made from the masters, as every update makes them: a checkpoint stored in
        // bf16 held its vectors (norms, biases) rounded, and a resumed run's first step read them.
        trainer.refresh_copies()?;
        Ok(trainer)
    }

    /// The adapters' configuration, when the trainer trains LoRA's.
    pub fn lora(&self) -> Option<&LoraConfig> {
        self.adapters.as_ref().map(|a| a.config())
    }

    /// The weights of the checkpoint folder `dir` (a model of the same shape: a run's own
    /// checkpoint) read over the masters, and the decoder's copies refreshed from them.
    pub fn load_weights(&mut self, dir: &Path) -> Result<()> {
        let b = Arc::clone(&self.decoder.backend);
        let lora = self.adapters.is_some();
        read_master_files(&*b, &self.specs, &mut self.master, &master_files(dir)?, dir, lora)?;
        self.refresh_copies()
    }

    /// The decoder's copies refreshed from the masters.
    pub(super) fn refresh_copies(&mut self) -> Result<()> {
        let b = Arc::clone(&self.decoder.backend);
        let decoder = Arc::get_mut(&mut self.decoder).context("the trainer's model is lent (to a sampler)")?;
        for ((s, w), copy) in self.specs.all().into_iter().zip(self.master.all()).zip(held(decoder)) {
            if !s.frozen {
                refresh(&*b, w, copy, s.len())?;
            }
        }
        match &mut self.adapters {
            Some(a) => a.merge(decoder, &self.master.lora),
            None => Ok(()),
        }
    }

    /// One step: the gradients of `targets` on the packed `batch` and an AdamW update at
    /// learning rate `lr`, gradients clipped to global norm `clip` when given.
    pub fn step(
        &mut self,
        batch: &Packed,
        targets: Targets<'_>,
        lr: f32,
        weight_decay: f32,
        clip: Option<f32>,
    ) -> Result<TrainStep> {
        let loss = self.backward(batch, targets)?;
        let grad_norm = self.update(lr, weight_decay, clip, 1)?;
        Ok(TrainStep { loss, grad_norm })
    }

    /// Bounds the memory of the layer activations a step keeps from its forward for its
    /// backward (`None`: half the device's free memory at each step; `Some(0)`: each
    /// layer recomputed in the backward from its input, activation checkpointing).
    pub fn set_activation_budget(&mut self, bytes: Option<usize>) {
        self.activation_budget = bytes;
    }

    /// What a forward of `tokens` tokens keeps: every layer's activations when they fit the
    /// budget, else each layer's input.
    fn keep(&self, tokens: usize) -> Result<Keep> {
        let dec = &self.decoder;
        let bytes = tokens * layer_bytes_per_token(&dec.config) * dec.layers.len();
        let budget = match self.activation_budget {
            Some(budget) => budget,
            None => dec.backend.memory()?.0 / 2,
        };
        Ok(if bytes <= budget { Keep::Layers } else { Keep::Inputs })
    }

    /// Bounds a chunk of the LM head's logits ([`PackedDecoder::set_logits_budget`]).
    pub fn set_logits_budget(&mut self, bytes: usize) -> Result<()> {
        Arc::get_mut(&mut self.decoder)
            .context("the trainer's model is lent (to a sampler)")?
            .set_logits_budget(bytes);
        Ok(())
    }

    /// The gradients by checkpoint tensor name (f32, the checkpoint's shapes flattened) after
    /// [`PackedTrainer::backward`].
    pub fn gradients(&self) -> Result<Vec<(String, Vec<f32>)>> {
        self.named(&self.grad)
    }

    /// The f32 master weights by checkpoint tensor name.
    pub fn weights(&self) -> Result<Vec<(String, Vec<f32>)>> {
        self.named(&self.master)
    }

    /// The f32 master weights as candle variables by checkpoint name and shape (what
    /// [`crate::checkpoint::save_training_checkpoint`] writes).
    pub fn varmap(&self) -> Result<candle_nn::VarMap> {
        let varmap = candle_nn::VarMap::new();
        let shapes = self.shapes();
        {
            let mut data = varmap.data().lock().unwrap_or_else(|e| e.into_inner());
            for (name, values) in self.weights()? {
                let t = candle_core::Tensor::from_vec(values, shapes[name.as_str()].as_slice(), &candle_core::Device::Cpu)?;
                data.insert(name, candle_core::Var::from_tensor(&t)?);
            }
        }
        Ok(varmap)
    }

    /// Each checkpoint tensor's shape by name.
    fn shapes(&self) -> HashMap<&str, &Vec<usize>> {
        self.specs
            .all()
            .into_iter()
            .flat_map(|s| s.parts.iter().map(|(n, shape)| (n.as_str(), shape)))
            .collect()
    }

    fn named(&self, values: &Params<B::F32>) -> Result<Vec<(String, Vec<f32>)>> {
        let b = &*self.decoder.backend;
        let mut out = Vec::new();
        for (s, buf) in self.specs.all().into_iter().zip(values.all()).filter(|(s, _)| !s.frozen) {
            let all = b.read_f32(buf, s.len())?;
            let mut rest = all.as_slice();
            for (name, shape) in &s.parts {
                let (mine, tail) = rest.split_at(shape.iter().product());
                out.push((name.clone(), mine.to_vec()));
                rest = tail;
            }
        }
        Ok(out)
    }

    /// The loss of `targets` on `batch`, its gradients added to the trainer's (zeroed by each
    /// update).
    pub fn backward(&mut self, batch: &Packed, targets: Targets<'_>) -> Result<f32> {
        let dec = &*self.decoder;
        let read: Vec<usize> = match &targets {
            Targets::Labels(labels) => {
                ensure!(!labels.is_empty(), "a training batch without targets");
                if let Some((row, y)) = labels.iter().find(|(_, y)| !(0.0..=1.0).contains(y)) {
                    bail!("target ({row}, {y}): labels are probabilities, within [0, 1]");
                }
                labels.iter().map(|&(r, _)| r).collect()
            }
            Targets::Tokens { pairs, .. } => {
                ensure!(!pairs.is_empty(), "a training batch without target tokens");
                dec.check_tokens(pairs)?;
                pairs.iter().map(|&(r, _)| r).collect()
            }
        };
        let keep = self.keep(batch.tokens())?;
        let mut pass = dec.forward(batch, &read, keep)?;
        let g = &mut self.grad;
        let (loss, dx) = match targets {
            Targets::Labels(labels) => reward_head_backward(dec, g, &pass, labels)?,
            Targets::Tokens { pairs, loss } => lm_head_backward(dec, g, &pass, pairs, loss, self.adapters.is_none())?,
        };
        layers_backward(dec, g, &mut pass, dx, self.adapters.as_mut())?;
        if let Some(a) = &mut self.adapters {
            a.gather(&dec.backend, &mut g.lora)?;
        }
        Ok(loss)
    }

    /// AdamW on the masters with the mean of the gradients of the `micro_batches`
    /// [`PackedTrainer::backward`] calls since the last update (clipped to global norm `clip`),
    /// the decoder's copies refreshed and the gradients zeroed. Returns the mean gradient's norm
    /// before clipping.
    pub fn update(&mut self, lr: f32, weight_decay: f32, clip: Option<f32>, micro_batches: usize) -> Result<f32> {
        let b = Arc::clone(&self.decoder.backend);
        let mut squares = 0.0;
        for (s, g) in self.specs.all().into_iter().zip(self.grad.all()) {
            if !s.frozen {
                squares += b.sum_squares(g, s.len())?;
            }
        }
        let mean = 1.0 / micro_batches.max(1) as f32;
        let norm = squares.sqrt() as f32 * mean;
        ensure!(norm.is_finite(), "the gradients are not finite (norm {norm})");
        self.updates += 1;
        let opt = AdamW {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
            step: self.updates,
            grad_scale: mean * clip.map_or(1.0, |c| if norm > c { c / norm } else { 1.0 }),
        };
        let specs = self.specs.all();
        let (masters, grads) = (self.master.all_mut(), self.grad.all_mut());
        let (ms, vs) = (self.m.all_mut(), self.v.all_mut());
        let decoder = Arc::get_mut(&mut self.decoder)
            .context("the trainer's model is still lent (to a sampler) while it is updated")?;
        // LoRA's values have no copy of their own: they are merged below.
        let held = held(decoder).into_iter().map(Some).chain(std::iter::repeat_with(|| None));
        for (((((s, w), g), m), v), copy) in specs.into_iter().zip(masters).zip(grads).zip(ms).zip(vs).zip(held) {
            if s.frozen {
                continue;
            }
            let n = s.len();
            b.adamw(w, g, m, v, n, opt)?;
            if let Some(copy) = copy {
                refresh(&*b, w, copy, n)?;
            }
            b.zero_f32(g, n)?;
        }
        if let Some(a) = &mut self.adapters {
            a.merge(decoder, &self.master.lora)?;
        }
        Ok(norm)
    }
}

/// The logit of P(good) in a head's output row: the one output, or output 1 minus output 0.
pub(crate) fn good_logit(row: &[f32]) -> f32 {
    match row {
        [z] => *z,
        _ => row[1] - row[0],
    }
}

/// Stable BCE with logits of `z` against label `y`.
pub(crate) fn bce(z: f32, y: f32) -> f32 {
    z.max(0.0) - z * y + (-z.abs()).exp().ln_1p()
}

