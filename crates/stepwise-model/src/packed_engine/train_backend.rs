//! The kernels a [`Backend`] adds to train ([`TrainBackend`]): each layer's backward pass, the
//! weight gradients, and AdamW on f32 master weights. [`super::Reference`] specifies each one in
//! plain Rust (`reference_train.rs`); [`super::PackedTrainer`] runs them.
//!
//! Precision is PyTorch's bf16 autocast: the forward's products take bf16 operands, and so do
//! the backward's (an activation's gradient is rounded to bf16 before it feeds a product), with
//! f32 sums; weight gradients, norms' gradients and the optimiser's state are f32.

use super::{Backend, BatchInts, Out};
use anyhow::Result;

/// AdamW's settings for one update.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    /// Learning rate of this step.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Added to the second moment's root.
    pub eps: f32,
    /// Decoupled weight decay.
    pub weight_decay: f32,
    /// The update's number, from 1 (bias correction).
    pub step: u32,
    /// What every gradient is multiplied by first (clipping).
    pub grad_scale: f32,
}

/// The kernels of training on a device. Matrices are `[out, in]` bf16 (as in [`Backend::gemm`]).
#[allow(clippy::too_many_arguments)]
pub trait TrainBackend: Backend {
    /// `dst[i] = src[i]`, `n` values.
    fn copy_f32(&self, src: &Self::F32, dst: &mut Self::F32, n: usize) -> Result<()>;
    /// `dst[at + i] = bf16(src[i])`, `n` values.
    fn round_bf16(&self, src: &Self::F32, dst: &mut Self::Bf16, at: usize, n: usize) -> Result<()>;
    /// `n` zeros written over `buf`'s first values.
    fn zero_f32(&self, buf: &mut Self::F32, n: usize) -> Result<()>;
    /// `dx[rows, k] (+)= dy[rows, n] · w[n, k]`: an input's gradient through `y = x · wᵀ`.
    fn gemm_nn(
        &self,
        dy: &Self::Bf16,
        w: &Self::Bf16,
        dx: Out<'_, Self>,
        rows: usize,
        n: usize,
        k: usize,
        accumulate: bool,
    ) -> Result<()>;
    /// `dw[n, k] += Σ_r dy[r, n] · x[r, k]`: a weight's gradient through `y = x · wᵀ`.
    fn gemm_weight_grad(
        &self,
        dy: &Self::Bf16,
        x: &Self::Bf16,
        dw: &mut Self::F32,
        rows: usize,
        n: usize,
        k: usize,
    ) -> Result<()>;
    /// `db[c] += Σ_r dy[r, c]`: a bias's gradient.
    fn column_sums(&self, dy: &Self::F32, db: &mut Self::F32, rows: usize, width: usize) -> Result<()>;
    /// Through `out = x / rms(x) · w` (at rows `rows[i]` of `x`, or `i`): `dx[r] += ∂/∂x`,
    /// `dw += ∂/∂w`, for the gradient `dy` `[n, hidden]` of `out`.
    fn rms_norm_backward(
        &self,
        x: &Self::F32,
        rows: Option<&Self::I32>,
        w: &Self::F32,
        dy: &Self::F32,
        dx: &mut Self::F32,
        dw: &mut Self::F32,
        n: usize,
        hidden: usize,
        eps: f32,
    ) -> Result<()>;
    /// Through `act = silu(gate) · up`: `d_gate_up = bf16([∂/∂gate | ∂/∂up])` for `d_act`.
    fn swiglu_backward(
        &self,
        gate_up: &Self::Bf16,
        d_act: &Self::F32,
        d_gate_up: &mut Self::Bf16,
        rows: usize,
        inter: usize,
    ) -> Result<()>;
    /// Through `out = bf16(relu(y + b))`: `d[i] = 0` where `out[i]` is not positive (`d`, the
    /// gradient of `out` on entry, is `y`'s after).
    fn relu_backward(&self, out: &Self::Bf16, d: &mut Self::F32, n: usize) -> Result<()>;
    /// Through [`Backend::bias_rope`]: `dy = bf16(rope⁻¹(d_qkv))` (q and k turned back, v as it
    /// is) and `d_bias += Σ_rows` of it (before rounding).
    fn rope_backward(
        &self,
        d_qkv: &Self::F32,
        cos: &Self::F32,
        sin: &Self::F32,
        positions: &Self::I32,
        dy: &mut Self::Bf16,
        d_bias: Option<&mut Self::F32>,
        rows: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<()>;
    /// Through [`Backend::attention`]: `d_qkv = [dq | dk | dv]` (f32, written) for the gradient
    /// `d_out` of its output, the softmax recomputed from `qkv`.
    fn attention_backward(
        &self,
        qkv: &Self::Bf16,
        d_out: &Self::Bf16,
        d_qkv: &mut Self::F32,
        batch: &BatchInts<Self>,
        rows: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<()>;
    /// Through [`Backend::embed`]: `d_table[ids[r]] += dx[r]`.
    fn embed_backward(
        &self,
        ids: &Self::I32,
        dx: &Self::F32,
        d_table: &mut Self::F32,
        rows: usize,
        hidden: usize,
    ) -> Result<()>;
    /// Per row `r` of `logits` (`[rows, vocab]`, f32): `lse[r] = log Σⱼ exp(logits[r, j])` and
    /// `logp[r] = logits[r, targets[r]] − lse[r]`, the log-probability of the row's target token.
    fn token_logprobs(
        &self,
        logits: &Self::F32,
        targets: &Self::I32,
        logp: &mut Self::F32,
        lse: &mut Self::F32,
        rows: usize,
        vocab: usize,
    ) -> Result<()>;
    /// Through [`TrainBackend::token_logprobs`] for `∂loss/∂logp[r] = coef[r]`: the logits'
    /// gradient `d[r, j] = bf16(coef[r] · ([j = targets[r]] − exp(logits[r, j] − lse[r])))`.
    fn token_logprobs_backward(
        &self,
        logits: &Self::F32,
        targets: &Self::I32,
        lse: &Self::F32,
        coef: &Self::F32,
        d: &mut Self::Bf16,
        rows: usize,
        vocab: usize,
    ) -> Result<()>;
    /// `Σ g²` over `n` values.
    fn sum_squares(&self, g: &Self::F32, n: usize) -> Result<f64>;
    /// One AdamW update of `w` by the gradient `g` (times `opt.grad_scale`), its moments `m`
    /// and `v` updated in place.
    fn adamw(
        &self,
        w: &mut Self::F32,
        g: &Self::F32,
        m: &mut Self::F32,
        v: &mut Self::F32,
        n: usize,
        opt: AdamW,
    ) -> Result<()>;
}
