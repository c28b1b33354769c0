//! A training step's passes over a packed batch: the forward keeping each layer's input (and its
//! activations, within the trainer's budget), the reward head's backward, and each layer's
//! backward on its kept activations or on activations recomputed from its kept input
//! (activation checkpointing). The LM head's are in `lm_head.rs`.

use super::layer::{AttentionBuffers, MlpBuffers};
use super::lora::{Adapters, Matrix, WeightGrads};
use super::train::{bce, good_logit, Params};
use super::train_backend::TrainBackend;
use super::{batch_ints, Attend, Backend, BatchInts, Head, Out, PackedDecoder};
use crate::packed::Packed;
use anyhow::{bail, ensure, Context, Result};

/// What a forward pass keeps for the backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Keep {
    /// Nothing: a forward only.
    Nothing,
    /// Each layer's input: the backward recomputes each layer's activations from it
    /// (activation checkpointing: memory holds one layer's activations).
    Inputs,
    /// Each layer's input and activations: the backward recomputes nothing.
    Layers,
}

/// Bytes a layer's kept activations take a token ([`Keep::Layers`]): the bf16 buffers of
/// [`Activations`] and the attention block's f32 output.
pub(super) fn layer_bytes_per_token(cfg: &crate::ModelConfig) -> usize {
    let (h, d, inter) = (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size);
    let (heads, kv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let bf16 = (heads + 2 * kv) * d + heads * d + 2 * inter;
    2 * bf16 + 4 * h
}

/// A forward pass kept for the backward.
pub(super) struct Pass<B: TrainBackend> {
    /// The batch's integers (rows read: the targets').
    pub ints: BatchInts<B>,
    /// Its token ids.
    pub ids: B::I32,
    /// The last layer's output (the final norm's input), `tokens × hidden`.
    pub x: B::F32,
    /// Each layer's input (none when not kept).
    pub kept: Vec<B::F32>,
    /// Each layer's activations and attention block output ([`Keep::Layers`]; else none).
    layers: Vec<(Activations<B>, B::F32)>,
    /// One layer's activations, reused by every layer that keeps none (none with [`Keep::Layers`]).
    acts: Option<Activations<B>>,
    /// The activations no layer keeps, one layer's at a time.
    redone: Redone<B>,
    /// The q|k|v product before the bias and rotation (scratch of every layer).
    y: B::F32,
    /// Tokens in the batch.
    pub tokens: usize,
}

/// One layer's activations that its backward reads and cannot cheaply redo, `tokens` rows each.
struct Activations<B: Backend> {
    qkv: B::Bf16,
    attn: B::Bf16,
    gate_up: B::Bf16,
}

/// One layer's activations that its backward redoes from what the layer keeps, bit for bit and
/// in one pass over each (the norms from the layer's input and the attention block's output,
/// the SwiGLU from gate|up): a third of the bf16 a token a layer would keep, one layer's worth
/// held instead of every layer's. `tokens` rows each.
struct Redone<B: Backend> {
    normed1: B::Bf16,
    normed2: B::Bf16,
    act: B::Bf16,
}

impl<B: TrainBackend> Redone<B> {
    /// Buffers for `t` rows of `dec`'s layers.
    fn new(dec: &PackedDecoder<B>, t: usize) -> Result<Self> {
        let (b, cfg) = (&*dec.backend, &dec.config);
        let (h, inter) = (cfg.hidden_size, cfg.intermediate_size);
        Ok(Redone {
            normed1: b.zeros_bf16(t * h)?,
            normed2: b.zeros_bf16(t * h)?,
            act: b.zeros_bf16(t * inter)?,
        })
    }

    /// Layer `li`'s, from its input `input`, its attention block's output `h1` and its `kept`
    /// activations, as its forward computed them.
    fn redo(&mut self, dec: &PackedDecoder<B>, li: usize, input: &B::F32, h1: &B::F32, kept: &Activations<B>, t: usize) -> Result<()> {
        let (b, cfg, l) = (&*dec.backend, &dec.config, &dec.layers[li]);
        let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps as f32);
        b.rms_norm(input, None, &l.ln1, &mut self.normed1, t, h, eps)?;
        b.rms_norm(h1, None, &l.ln2, &mut self.normed2, t, h, eps)?;
        b.swiglu(&kept.gate_up, &mut self.act, t, cfg.intermediate_size)
    }
}

impl<B: TrainBackend> Activations<B> {
    /// Buffers for `t` rows of `dec`'s layers.
    fn new(dec: &PackedDecoder<B>, t: usize) -> Result<Self> {
        let (b, cfg) = (&*dec.backend, &dec.config);
        let (d, inter) = (cfg.head_dim, cfg.intermediate_size);
        let (heads, kv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        let h16 = |n: usize| b.zeros_bf16(n);
        Ok(Activations {
            qkv: h16(t * (heads + 2 * kv) * d)?,
            attn: h16(t * heads * d)?,
            gate_up: h16(t * 2 * inter)?,
        })
    }

    /// Layer `li` of `dec` over the `t` rows of `x` (its input, replaced by its output), these
    /// activations and `redo`'s filled (`y`: scratch) and the attention block's output (the
    /// MLP's input) copied to `h1`.
    #[allow(clippy::too_many_arguments)]
    fn layer(
        &mut self,
        dec: &PackedDecoder<B>,
        li: usize,
        redo: &mut Redone<B>,
        y: &mut B::F32,
        x: &mut B::F32,
        h1: Option<&mut B::F32>,
        attend: &mut Attend<'_, B>,
        t: usize,
    ) -> Result<()> {
        let bufs = AttentionBuffers {
            normed: &mut redo.normed1,
            y,
            qkv: &mut self.qkv,
            attn: &mut self.attn,
            lora: None,
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
            normed: &mut redo.normed2,
            gate_up: &mut self.gate_up,
            act: &mut redo.act,
            lora: None,
        };
        dec.mlp_block(li, x, bufs, t)
    }
}

impl<B: TrainBackend> PackedDecoder<B> {
    /// Every layer over `batch` (rows `read` are the targets'), keeping what `keep` says for
    /// [`layers_backward`].
    pub(super) fn forward(&self, batch: &Packed, read: &[usize], keep: Keep) -> Result<Pass<B>> {
        let (b, cfg) = (&*self.backend, &self.config);
        let t = batch.tokens();
        ensure!(t > 0, "an empty training batch");
        if let Some(&bad) = batch.ids().iter().find(|&&id| id as usize >= cfg.vocab_size) {
            bail!("token id {bad} is outside the model's vocabulary of {}", cfg.vocab_size);
        }
        ensure!(
            batch.longest() <= self.max_positions,
            "a sequence of {} tokens exceeds the model's {} positions",
            batch.longest(),
            self.max_positions
        );
        if let Some(row) = read.iter().find(|&&r| r >= t) {
            bail!("target row {row} is past the end of a batch of {t} tokens");
        }
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        let width = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * d;
        let ints = batch_ints(b, batch, read)?;
        let ids = b.upload_i32(&batch.ids().iter().map(|&i| i as i32).collect::<Vec<_>>())?;
        let mut x = b.zeros_f32(t * h)?;
        b.embed(&self.embed, &ids, &mut x, t, h)?;
        let mut acts = match keep {
            Keep::Layers => None,
            _ => Some(Activations::new(self, t)?),
        };
        let (mut y, mut redone) = (b.zeros_f32(t * width)?, Redone::new(self, t)?);
        let (mut kept, mut layers) = (Vec::new(), Vec::new());
        for li in 0..self.layers.len() {
            if keep != Keep::Nothing {
                let mut input = b.zeros_f32(t * h)?;
                b.copy_f32(&x, &mut input, t * h)?;
                kept.push(input);
            }
            let attend = &mut Attend::Packed(&ints);
            match acts.as_mut() {
                Some(acts) => acts.layer(self, li, &mut redone, &mut y, &mut x, None, attend, t)?,
                None => {
                    let (mut own, mut h1) = (Activations::new(self, t)?, b.zeros_f32(t * h)?);
                    own.layer(self, li, &mut redone, &mut y, &mut x, Some(&mut h1), attend, t)?;
                    layers.push((own, h1));
                }
            }
        }
        Ok(Pass {
            ints,
            ids,
            x,
            kept,
            layers,
            acts,
            redone,
            y,
            tokens: t,
        })
    }
}

/// The reward head at the `labels`' rows (BCE with logits on P(good), on the host) and its
/// backward: the head's gradients added to `g`'s, and the last layer's output's gradient.
pub(super) fn reward_head_backward<B: TrainBackend>(
    dec: &PackedDecoder<B>,
    g: &mut Params<B::F32>,
    pass: &Pass<B>,
    labels: &[(usize, f32)],
) -> Result<(f32, B::F32)> {
    let (b, cfg) = (&*dec.backend, &dec.config);
    let (h, c, eps) = (cfg.hidden_size, cfg.num_labels, cfg.rms_norm_eps as f32);
    let (f, h16) = (|n: usize| b.zeros_f32(n), |n: usize| b.zeros_bf16(n));
    let r = labels.len();
    let mut head_in = h16(r * h)?;
    b.rms_norm(&pass.x, Some(&pass.ints.read), &dec.norm, &mut head_in, r, h, eps)?;
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
        Head::Lm(_) => bail!("{} is a causal LM: it learns from target tokens, not labels", cfg.architecture),
    }
    let (loss, d_logits) = good_logit_bce(&b.read_f32(&out, r * c)?, c, labels);
    let d_out = b.upload_f32(&d_logits)?;
    let mut d_out16 = h16(r * c)?;
    b.round_bf16(&d_out, &mut d_out16, 0, r * c)?;
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
    let mut dx = f(pass.tokens * h)?;
    b.rms_norm_backward(&pass.x, Some(&pass.ints.read), &dec.norm, &d_head_in, &mut dx, &mut g.norm, r, h, eps)?;
    Ok((loss, dx))
}

/// Each layer's backward from the last (its activations kept by the forward, or recomputed
/// from its kept input), for the gradient `dx` of the last layer's output; every weight's
/// gradient added to `g`'s, or with LoRA's `adapters` (the base frozen) only theirs.
pub(super) fn layers_backward<B: TrainBackend>(
    dec: &PackedDecoder<B>,
    g: &mut Params<B::F32>,
    pass: &mut Pass<B>,
    mut dx: B::F32,
    adapters: Option<&mut Adapters<B>>,
) -> Result<()> {
    let (b, cfg) = (&*dec.backend, &dec.config);
    let (h, d, inter, eps) = (
        cfg.hidden_size,
        cfg.head_dim,
        cfg.intermediate_size,
        cfg.rms_norm_eps as f32,
    );
    let (heads, kv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let width = (heads + 2 * kv) * d;
    let t = pass.tokens;
    ensure!(pass.kept.len() == dec.layers.len(), "a backward needs a forward that kept each layer's input");
    let (f, h16) = (|n: usize| b.zeros_f32(n), |n: usize| b.zeros_bf16(n));
    let (mut dx16, mut h1_buf, mut d_normed) = (h16(t * h)?, f(t * h)?, f(t * h)?);
    let (mut d_act, mut d_gate_up) = (f(t * inter)?, h16(t * 2 * inter)?);
    let (mut d_attn, mut d_qkv, mut d_y) = (h16(t * heads * d)?, f(t * width)?, h16(t * width)?);
    let Pass {
        ints,
        ids,
        x,
        kept,
        layers,
        acts,
        redone,
        y,
        ..
    } = pass;
    let frozen = adapters.is_some();
    let mut wg = match adapters {
        Some(adapters) => WeightGrads::Lora {
            scratch: adapters.scratch(b, t)?,
            adapters,
            grads: &mut g.lora,
        },
        None => WeightGrads::Full,
    };
    for li in (0..dec.layers.len()).rev() {
        // The layer's own activations (freed after its backward), or the shared ones recomputed.
        let stored = layers.pop();
        let (a, h1) = match &stored {
            Some((own, h1)) => {
                redone.redo(dec, li, &kept[li], h1, own, t)?;
                (own, h1)
            }
            None => {
                let acts = acts.as_mut().context("a forward that kept neither a layer's activations nor buffers for them")?;
                b.copy_f32(&kept[li], x, t * h)?;
                acts.layer(dec, li, redone, y, x, Some(&mut h1_buf), &mut Attend::Packed(ints), t)?;
                (&*acts, &h1_buf)
            }
        };
        let r = &*redone;
        let (l, lg) = (&dec.layers[li], &mut g.layers[li]);
        // x = h1 + swiglu(norm(h1) · [gate|up]ᵀ) · downᵀ
        b.round_bf16(&dx, &mut dx16, 0, t * h)?;
        wg.add(b, (li, Matrix::Down), &dx16, &r.act, &mut lg.down, t, h, inter)?;
        b.gemm_nn(&dx16, &l.down, Out::F32(&mut d_act), t, h, inter, false)?;
        b.swiglu_backward(&a.gate_up, &d_act, &mut d_gate_up, t, inter)?;
        wg.add(b, (li, Matrix::GateUp), &d_gate_up, &r.normed2, &mut lg.gate_up, t, 2 * inter, h)?;
        b.gemm_nn(&d_gate_up, &l.gate_up, Out::F32(&mut d_normed), t, 2 * inter, h, false)?;
        b.rms_norm_backward(h1, None, &l.ln2, &d_normed, &mut dx, &mut lg.ln2, t, h, eps)?;
        // h1 = input + attention(rope(norm(input) · [q|k|v]ᵀ + bias)) · oᵀ
        b.round_bf16(&dx, &mut dx16, 0, t * h)?;
        wg.add(b, (li, Matrix::O), &dx16, &a.attn, &mut lg.o, t, h, heads * d)?;
        b.gemm_nn(&dx16, &l.o, Out::Bf16(&mut d_attn), t, h, heads * d, false)?;
        b.attention_backward(&a.qkv, &d_attn, &mut d_qkv, ints, t, heads, kv, d)?;
        // A frozen bias (LoRA's base) takes no gradient.
        let bias = lg.qkv_bias.as_mut().filter(|_| !frozen);
        b.rope_backward(&d_qkv, &dec.cos, &dec.sin, &ints.positions, &mut d_y, bias, t, heads, kv, d)?;
        wg.add(b, (li, Matrix::Qkv), &d_y, &r.normed1, &mut lg.qkv, t, width, h)?;
        b.gemm_nn(&d_y, &l.qkv, Out::F32(&mut d_normed), t, width, h, false)?;
        b.rms_norm_backward(&kept[li], None, &l.ln1, &d_normed, &mut dx, &mut lg.ln1, t, h, eps)?;
    }
    if frozen {
        return Ok(());
    }
    b.embed_backward(ids, &dx, &mut g.embed, t, h)
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
