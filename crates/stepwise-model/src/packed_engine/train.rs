//! [`PackedTrainer`]: a reward model (Qwen2.5-Math-PRM's head or a classifier) trained over
//! packed batches on a [`TrainBackend`], the way the packed engine scores: every product over all
//! the batch's tokens, attention within each sequence, bf16 operands with f32 sums (PyTorch's
//! bf16 autocast), f32 master weights and AdamW.
//!
//! A step: the forward keeps each layer's input (f32, `tokens × hidden` a layer) and nothing
//! else; the head is read at the target rows and the loss (BCE with logits on P(good), as the
//! CPU trainer's `Classify` objective) taken on the host; the backward recomputes each layer's
//! activations from its kept input, then runs the layer's backward kernels (activation
//! checkpointing: memory grows with the token budget, not with the layers' activations). The
//! update is AdamW on the f32 masters, gradients clipped by their global norm, and each matrix is
//! rounded back to the bf16 copy the forward reads.

use super::layer::{AttentionBuffers, MlpBuffers};
use super::train_backend::{AdamW, TrainBackend};
use super::{batch_ints, to_f32, Attend, Backend, Head, Out, PackedDecoder};
use crate::config::{HeadKind, ModelConfig};
use crate::packed::Packed;
use anyhow::{bail, ensure, Context, Result};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// One value per trainable tensor of a model, in the packed engine's layout (stacked q|k|v and
/// gate|up, as the decoder holds them).
struct Params<T> {
    embed: T,
    norm: T,
    layers: Vec<LayerParams<T>>,
    /// Qwen2.5-Math-PRM's `score.0.weight, score.0.bias, score.2.weight, score.2.bias`, or a
    /// classifier's `score.weight` (and `score.bias`).
    head: Vec<T>,
}

struct LayerParams<T> {
    ln1: T,
    ln2: T,
    qkv: T,
    qkv_bias: Option<T>,
    o: T,
    gate_up: T,
    down: T,
}

impl<T> Params<T> {
    /// Every value, in one fixed order.
    fn all(&self) -> Vec<&T> {
        let mut v = vec![&self.embed, &self.norm];
        for l in &self.layers {
            v.extend([&l.ln1, &l.ln2, &l.qkv]);
            v.extend(l.qkv_bias.as_ref());
            v.extend([&l.o, &l.gate_up, &l.down]);
        }
        v.extend(&self.head);
        v
    }

    /// Every value, in [`Params::all`]'s order.
    fn all_mut(&mut self) -> Vec<&mut T> {
        let mut v = vec![&mut self.embed, &mut self.norm];
        for l in &mut self.layers {
            v.extend([&mut l.ln1, &mut l.ln2, &mut l.qkv]);
            v.extend(l.qkv_bias.as_mut());
            v.extend([&mut l.o, &mut l.gate_up, &mut l.down]);
        }
        v.extend(&mut self.head);
        v
    }

    /// `f` of every value, in the same layout.
    fn map<U>(&self, mut f: impl FnMut(&T) -> Result<U>) -> Result<Params<U>> {
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
            head: self.head.iter().map(f).collect::<Result<_>>()?,
        })
    }
}

/// The checkpoint tensors a trainable value holds, one after another: names and shapes.
struct Spec {
    parts: Vec<(String, Vec<usize>)>,
}

impl Spec {
    fn len(&self) -> usize {
        self.parts.iter().map(|(_, s)| s.iter().product::<usize>()).sum()
    }
}

/// The trainable tensors of a reward model of `cfg`.
fn specs(cfg: &ModelConfig) -> Result<Params<Spec>> {
    let (h, d, inter) = (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size);
    let (heads, kv, c) = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_labels);
    let one = |name: &str, shape: Vec<usize>| Spec {
        parts: vec![(name.to_string(), shape)],
    };
    let layers = (0..cfg.num_hidden_layers)
        .map(|i| {
            let p = |n: &str| format!("model.layers.{i}.{n}");
            let proj = |x: &str, what: &str| p(&format!("self_attn.{x}_proj.{what}"));
            LayerParams {
                ln1: one(&p("input_layernorm.weight"), vec![h]),
                ln2: one(&p("post_attention_layernorm.weight"), vec![h]),
                qkv: Spec {
                    parts: vec![
                        (proj("q", "weight"), vec![heads * d, h]),
                        (proj("k", "weight"), vec![kv * d, h]),
                        (proj("v", "weight"), vec![kv * d, h]),
                    ],
                },
                qkv_bias: cfg.attention_bias.then(|| Spec {
                    parts: vec![
                        (proj("q", "bias"), vec![heads * d]),
                        (proj("k", "bias"), vec![kv * d]),
                        (proj("v", "bias"), vec![kv * d]),
                    ],
                }),
                o: one(&proj("o", "weight"), vec![h, heads * d]),
                gate_up: Spec {
                    parts: vec![
                        (p("mlp.gate_proj.weight"), vec![inter, h]),
                        (p("mlp.up_proj.weight"), vec![inter, h]),
                    ],
                },
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
        HeadKind::CausalLm => bail!(
            "the packed trainer trains reward models (a classifier or Qwen2.5-Math-PRM's head); {} is a causal LM",
            cfg.architecture
        ),
    };
    Ok(Params {
        embed: one("model.embed_tokens.weight", vec![cfg.vocab_size, h]),
        norm: one("model.norm.weight", vec![h]),
        layers,
        head,
    })
}

/// A decoder's copy of a trainable value: what its forward reads.
enum Held<'a, B: Backend> {
    Matrix(&'a mut B::Bf16),
    Vector(&'a mut B::F32),
}

/// The decoder's copies of every trainable value, in [`Params::all`]'s order.
fn held<B: Backend>(dec: &mut PackedDecoder<B>) -> Vec<Held<'_, B>> {
    let mut v = vec![Held::Matrix(&mut dec.embed), Held::Vector(&mut dec.norm)];
    for l in &mut dec.layers {
        v.extend([Held::Vector(&mut l.ln1), Held::Vector(&mut l.ln2), Held::Matrix(&mut l.qkv)]);
        v.extend(l.qkv_bias.as_mut().map(Held::Vector));
        v.extend([Held::Matrix(&mut l.o), Held::Matrix(&mut l.gate_up), Held::Matrix(&mut l.down)]);
    }
    match &mut dec.head {
        Head::Mlp { w1, b1, w2, b2 } => {
            v.extend([Held::Matrix(w1), Held::Vector(b1), Held::Matrix(w2), Held::Vector(b2)]);
        }
        Head::Classifier { w, b } => {
            v.push(Held::Matrix(w));
            v.extend(b.as_mut().map(Held::Vector));
        }
        Head::Lm(_) => {}
    }
    v
}

/// One layer's activations that its backward reads, `tokens` rows each.
struct Activations<B: Backend> {
    normed1: B::Bf16,
    y: B::F32,
    qkv: B::Bf16,
    attn: B::Bf16,
    normed2: B::Bf16,
    gate_up: B::Bf16,
    act: B::Bf16,
}

impl<B: TrainBackend> Activations<B> {
    /// Layer `li` of `dec` over the `t` rows of `x` (its input, replaced by its output), these
    /// activations filled and the attention block's output (the MLP's input) copied to `h1`.
    fn layer(
        &mut self,
        dec: &PackedDecoder<B>,
        li: usize,
        x: &mut B::F32,
        h1: Option<&mut B::F32>,
        attend: &mut Attend<'_, B>,
        t: usize,
    ) -> Result<()> {
        let bufs = AttentionBuffers {
            normed: &mut self.normed1,
            y: &mut self.y,
            qkv: &mut self.qkv,
            attn: &mut self.attn,
        };
        let positions = match attend {
            Attend::Packed(ints) => &ints.positions,
            Attend::Paged { .. } => bail!("training attends within packed sequences"),
        };
        dec.attention_block(li, x, bufs, positions, attend, t)?;
        if let Some(h1) = h1 {
            dec.backend.copy_f32(x, h1, t * dec.config.hidden_size)?;
        }
        let bufs = MlpBuffers {
            normed: &mut self.normed2,
            gate_up: &mut self.gate_up,
            act: &mut self.act,
        };
        dec.mlp_block(li, x, bufs, t)
    }
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
    pub decoder: PackedDecoder<B>,
    specs: Params<Spec>,
    master: Params<B::F32>,
    grad: Params<B::F32>,
    m: Params<B::F32>,
    v: Params<B::F32>,
    updates: u32,
}

impl<B: TrainBackend> PackedTrainer<B> {
    /// The reward model in the checkpoint folder `dir` (config `config`) on `backend`: the
    /// decoder's bf16 copies as [`PackedDecoder::load`] makes them, and f32 masters read from the
    /// checkpoint as stored (an f32 checkpoint's exact values).
    pub fn load(dir: &Path, config: ModelConfig, backend: Arc<B>) -> Result<Self> {
        let specs = specs(&config)?;
        let decoder = PackedDecoder::load(dir, config, backend)?;
        let b = &*decoder.backend;
        let mut master = specs.map(|s| b.zeros_f32(s.len()))?;
        let mut at: HashMap<&str, (usize, usize)> = HashMap::new();
        for (i, s) in specs.all().into_iter().enumerate() {
            let mut offset = 0;
            for (name, shape) in &s.parts {
                at.insert(name, (i, offset));
                offset += shape.iter().product::<usize>();
            }
        }
        let mut missing: std::collections::HashSet<&str> = at.keys().copied().collect();
        {
            let mut bufs = master.all_mut();
            // The exact f32 weights a checkpoint of a narrower dtype keeps beside it (what a
            // resumed run continues from) are read last, over the rounded ones.
            let mut files = crate::model::weight_files(dir)?;
            let exact = dir.join(crate::model::TRAINING_WEIGHTS);
            if exact.exists() {
                files.push(exact);
            }
            for file in files {
                let handle = std::fs::File::open(&file).with_context(|| format!("reading {}", file.display()))?;
                // SAFETY: a read-only mapping that lives only for this loop (as in the loader).
                let map = unsafe { memmap2::Mmap::map(&handle) }
                    .with_context(|| format!("mapping {}", file.display()))?;
                let st = safetensors::SafeTensors::deserialize(&map)
                    .with_context(|| format!("reading {}", file.display()))?;
                for (name, view) in st.tensors() {
                    if let Some(&(i, offset)) = at.get(name.as_str()) {
                        let host = to_f32(&view).with_context(|| format!("{}: tensor `{name}`", file.display()))?;
                        b.write_f32(bufs[i], offset, &host)?;
                        missing.remove(name.as_str());
                    }
                }
            }
        }
        if let Some(name) = missing.iter().min() {
            bail!("{}: tensor `{name}` is missing", dir.display());
        }
        let zeros = |s: &Spec| b.zeros_f32(s.len());
        let (grad, m, v) = (specs.map(zeros)?, specs.map(zeros)?, specs.map(zeros)?);
        Ok(PackedTrainer {
            specs,
            master,
            grad,
            m,
            v,
            updates: 0,
            decoder,
        })
    }

    /// One step: the gradients of `targets` (`(row, label)`: a row of the packed `batch`, counted
    /// over all its tokens, and the probability it is good) and an AdamW update at learning rate
    /// `lr`, gradients clipped to global norm `clip` when given.
    pub fn step(
        &mut self,
        batch: &Packed,
        targets: &[(usize, f32)],
        lr: f32,
        weight_decay: f32,
        clip: Option<f32>,
    ) -> Result<TrainStep> {
        let loss = self.backward(batch, targets)?;
        let grad_norm = self.update(lr, weight_decay, clip, 1)?;
        Ok(TrainStep { loss, grad_norm })
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
    /// [`crate::model::save_training_checkpoint`] writes).
    pub fn varmap(&self) -> Result<candle_nn::VarMap> {
        let varmap = candle_nn::VarMap::new();
        let shapes: HashMap<&str, &Vec<usize>> = self
            .specs
            .all()
            .into_iter()
            .flat_map(|s| s.parts.iter().map(|(n, shape)| (n.as_str(), shape)))
            .collect();
        {
            let mut data = varmap.data().lock().unwrap_or_else(|e| e.into_inner());
            for (name, values) in self.weights()? {
                let t = candle_core::Tensor::from_vec(values, shapes[name.as_str()].as_slice(), &candle_core::Device::Cpu)?;
                data.insert(name, candle_core::Var::from_tensor(&t)?);
            }
        }
        Ok(varmap)
    }

    fn named(&self, values: &Params<B::F32>) -> Result<Vec<(String, Vec<f32>)>> {
        let b = &*self.decoder.backend;
        let mut out = Vec::new();
        for (s, buf) in self.specs.all().into_iter().zip(values.all()) {
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

    /// The loss of `targets` on `batch` (mean BCE with logits on P(good)), its gradients added to
    /// the trainer's (zeroed by each update).
    pub fn backward(&mut self, batch: &Packed, targets: &[(usize, f32)]) -> Result<f32> {
        let dec = &self.decoder;
        let (b, cfg) = (&*dec.backend, &dec.config);
        let t = batch.tokens();
        ensure!(!targets.is_empty(), "a training batch without targets");
        if let Some(&bad) = batch.ids().iter().find(|&&id| id as usize >= cfg.vocab_size) {
            bail!("token id {bad} is outside the model's vocabulary of {}", cfg.vocab_size);
        }
        ensure!(
            batch.longest() <= dec.max_positions,
            "a sequence of {} tokens exceeds the model's {} positions",
            batch.longest(),
            dec.max_positions
        );
        if let Some((row, y)) = targets.iter().find(|(r, y)| *r >= t || !(0.0..=1.0).contains(y)) {
            bail!("target ({row}, {y}): rows are below {t} tokens and labels within [0, 1]");
        }
        let (h, d, inter, eps) = (
            cfg.hidden_size,
            cfg.head_dim,
            cfg.intermediate_size,
            cfg.rms_norm_eps as f32,
        );
        let (heads, kv, c) = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_labels);
        let width = (heads + 2 * kv) * d;
        let read: Vec<usize> = targets.iter().map(|&(r, _)| r).collect();
        let r = read.len();
        let ints = batch_ints(b, batch, &read)?;
        let ids = b.upload_i32(&batch.ids().iter().map(|&i| i as i32).collect::<Vec<_>>())?;
        let (f, h16) = (|n: usize| b.zeros_f32(n), |n: usize| b.zeros_bf16(n));

        // The forward, keeping each layer's input.
        let mut x = f(t * h)?;
        b.embed(&dec.embed, &ids, &mut x, t, h)?;
        let mut acts = Activations::<B> {
            normed1: h16(t * h)?,
            y: f(t * width)?,
            qkv: h16(t * width)?,
            attn: h16(t * heads * d)?,
            normed2: h16(t * h)?,
            gate_up: h16(t * 2 * inter)?,
            act: h16(t * inter)?,
        };
        let mut attend = Attend::Packed(&ints);
        let mut kept = Vec::with_capacity(dec.layers.len());
        for li in 0..dec.layers.len() {
            let mut input = f(t * h)?;
            b.copy_f32(&x, &mut input, t * h)?;
            kept.push(input);
            acts.layer(dec, li, &mut x, None, &mut attend, t)?;
        }

        // The head at the target rows, and the loss on the host.
        let mut head_in = h16(r * h)?;
        b.rms_norm(&x, Some(&ints.read), &dec.norm, &mut head_in, r, h, eps)?;
        let (mut out, mut mid, mut relu) = (f(r * c)?, f(r * h)?, h16(r * h)?);
        match &dec.head {
            Head::Mlp { w1, b1, w2, b2 } => {
                b.gemm(&head_in, w1, Out::F32(&mut mid), r, h, h, false)?;
                b.bias_relu(&mid, b1, &mut relu, r, h)?;
                b.gemm(&relu, w2, Out::F32(&mut out), r, c, h, false)?;
                b.add_bias(&mut out, b2, r, c)?;
            }
            Head::Classifier { w, b: bias } => {
                b.gemm(&head_in, w, Out::F32(&mut out), r, c, h, false)?;
                if let Some(bias) = bias {
                    b.add_bias(&mut out, bias, r, c)?;
                }
            }
            Head::Lm(_) => bail!("the packed trainer trains reward heads"),
        }
        let (loss, d_logits) = good_logit_bce(&b.read_f32(&out, r * c)?, c, targets);
        let d_out = b.upload_f32(&d_logits)?;
        let mut d_out16 = h16(r * c)?;
        b.round_bf16(&d_out, &mut d_out16, 0, r * c)?;

        // The head's backward.
        let g = &mut self.grad;
        let mut d_head_in = f(r * h)?;
        match &dec.head {
            Head::Mlp { w1, w2, .. } => {
                b.gemm_weight_grad(&d_out16, &relu, &mut g.head[2], r, c, h)?;
                b.column_sums(&d_out, &mut g.head[3], r, c)?;
                b.gemm_nn(&d_out16, w2, Out::F32(&mut mid), r, c, h, false)?;
                b.relu_backward(&relu, &mut mid, r * h)?;
                b.column_sums(&mid, &mut g.head[1], r, h)?;
                b.round_bf16(&mid, &mut relu, 0, r * h)?;
                b.gemm_weight_grad(&relu, &head_in, &mut g.head[0], r, h, h)?;
                b.gemm_nn(&relu, w1, Out::F32(&mut d_head_in), r, h, h, false)?;
            }
            Head::Classifier { w, b: bias } => {
                b.gemm_weight_grad(&d_out16, &head_in, &mut g.head[0], r, c, h)?;
                if bias.is_some() {
                    b.column_sums(&d_out, &mut g.head[1], r, c)?;
                }
                b.gemm_nn(&d_out16, w, Out::F32(&mut d_head_in), r, c, h, false)?;
            }
            Head::Lm(_) => unreachable!("refused above"),
        }
        let mut dx = f(t * h)?;
        b.rms_norm_backward(&x, Some(&ints.read), &dec.norm, &d_head_in, &mut dx, &mut g.norm, r, h, eps)?;

        // Each layer's backward, its activations recomputed from its input.
        let (mut dx16, mut h1, mut d_normed) = (h16(t * h)?, f(t * h)?, f(t * h)?);
        let (mut d_act, mut d_gate_up) = (f(t * inter)?, h16(t * 2 * inter)?);
        let (mut d_attn, mut d_qkv, mut d_y) = (h16(t * heads * d)?, f(t * width)?, h16(t * width)?);
        for li in (0..dec.layers.len()).rev() {
            b.copy_f32(&kept[li], &mut x, t * h)?;
            acts.layer(dec, li, &mut x, Some(&mut h1), &mut attend, t)?;
            let a = &acts;
            let (l, lg) = (&dec.layers[li], &mut g.layers[li]);
            // x = h1 + swiglu(norm(h1) · [gate|up]ᵀ) · downᵀ
            b.round_bf16(&dx, &mut dx16, 0, t * h)?;
            b.gemm_weight_grad(&dx16, &a.act, &mut lg.down, t, h, inter)?;
            b.gemm_nn(&dx16, &l.down, Out::F32(&mut d_act), t, h, inter, false)?;
            b.swiglu_backward(&a.gate_up, &d_act, &mut d_gate_up, t, inter)?;
            b.gemm_weight_grad(&d_gate_up, &a.normed2, &mut lg.gate_up, t, 2 * inter, h)?;
            b.gemm_nn(&d_gate_up, &l.gate_up, Out::F32(&mut d_normed), t, 2 * inter, h, false)?;
            b.rms_norm_backward(&h1, None, &l.ln2, &d_normed, &mut dx, &mut lg.ln2, t, h, eps)?;
            // h1 = input + attention(rope(norm(input) · [q|k|v]ᵀ + bias)) · oᵀ
            b.round_bf16(&dx, &mut dx16, 0, t * h)?;
            b.gemm_weight_grad(&dx16, &a.attn, &mut lg.o, t, h, heads * d)?;
            b.gemm_nn(&dx16, &l.o, Out::Bf16(&mut d_attn), t, h, heads * d, false)?;
            b.attention_backward(&a.qkv, &d_attn, &mut d_qkv, &ints, t, heads, kv, d)?;
            let bias = lg.qkv_bias.as_mut();
            b.rope_backward(&d_qkv, &dec.cos, &dec.sin, &ints.positions, &mut d_y, bias, t, heads, kv, d)?;
            b.gemm_weight_grad(&d_y, &a.normed1, &mut lg.qkv, t, width, h)?;
            b.gemm_nn(&d_y, &l.qkv, Out::F32(&mut d_normed), t, width, h, false)?;
            b.rms_norm_backward(&kept[li], None, &l.ln1, &d_normed, &mut dx, &mut lg.ln1, t, h, eps)?;
        }
        b.embed_backward(&ids, &dx, &mut g.embed, t, h)?;
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
            squares += b.sum_squares(g, s.len())?;
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
        let held = held(&mut self.decoder);
        for (((((s, w), g), m), v), copy) in specs.into_iter().zip(masters).zip(grads).zip(ms).zip(vs).zip(held) {
            let n = s.len();
            b.adamw(w, g, m, v, n, opt)?;
            match copy {
                Held::Matrix(dst) => b.round_bf16(w, dst, 0, n)?,
                Held::Vector(dst) => b.copy_f32(w, dst, n)?,
            }
            b.zero_f32(g, n)?;
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

/// Mean BCE with logits of P(good) ([`good_logit`]) against each target's label, and its
/// gradient with respect to the head's outputs (`values`: `width` a row).
fn good_logit_bce(values: &[f32], width: usize, targets: &[(usize, f32)]) -> (f32, Vec<f32>) {
    let n = targets.len() as f32;
    let mut grad = vec![0f32; values.len()];
    let mut loss = 0.0;
    for (i, &(_, y)) in targets.iter().enumerate() {
        let z = good_logit(&values[i * width..][..width]);
        loss += bce(z, y);
        let dz = (1.0 / (1.0 + (-z).exp()) - y) / n;
        if width == 1 {
            grad[i] = dz;
        } else {
            grad[i * width + 1] = dz;
            grad[i * width] = -dz;
        }
    }
    (loss / n, grad)
}
