//! Causal attention of [`super::Cpu`], forward and backward: one task per sequence and query
//! head on the thread pool, its products in the CPU's product kernels ([`product`], on the
//! task's own thread) in bf16 where the CPU can (AMX or AVX512_BF16 tiles): queries, keys,
//! values, the softmax's probabilities and the scores' gradient rounded to bf16, every sum f32,
//! as PyTorch's bf16 attention ([`super::Reference`] keeps the probabilities f32); the softmax
//! in the vector kernels. A head's scores are a `[len, len]` matrix (the causal half used), so a
//! task holds a few of them: 64 MiB each at 4,096 tokens.

use super::cpu::{bf16_weight, transposed};
use super::reference::{round, widen};
use crate::kernels::cpu_inference::product;
use crate::kernels::simd;
use crate::kernels::weights::WeightSlice;
use anyhow::{ensure, Result};
use rayon::prelude::*;

/// A packed batch's attention shape: its sequences (first row, length) and heads.
pub(super) struct Shape {
    seqs: Vec<(usize, usize)>,
    heads: usize,
    kv_heads: usize,
    d: usize,
}

impl Shape {
    /// The shape of `rows` rows in sequences starting at `offsets` (then the end), checked.
    pub(super) fn new(offsets: &[i32], rows: usize, heads: usize, kv_heads: usize, d: usize) -> Result<Self> {
        ensure!(
            kv_heads > 0 && heads.is_multiple_of(kv_heads) && d > 0,
            "{heads} query heads cannot share {kv_heads} key/value heads"
        );
        let mut seqs = Vec::with_capacity(offsets.len().saturating_sub(1));
        for w in offsets.windows(2) {
            let (start, end) = (w[0].max(0) as usize, w[1].max(0) as usize);
            ensure!(start <= end && end <= rows, "sequence offsets {start}..{end} outside {rows} rows");
            if end > start {
                seqs.push((start, end - start));
            }
        }
        Ok(Shape {
            seqs,
            heads,
            kv_heads,
            d,
        })
    }

    /// Values in a q|k|v row.
    fn width(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.d
    }

    /// Where query head `h`'s keys and values start in a q|k|v row.
    fn key_value(&self, h: usize) -> (usize, usize) {
        let g = h / (self.heads / self.kv_heads);
        ((self.heads + g) * self.d, (self.heads + self.kv_heads + g) * self.d)
    }

    /// Every (sequence, query head) pair: the tasks.
    fn tasks(&self) -> Vec<(usize, usize, usize)> {
        let per_seq = |&(start, len): &(usize, usize)| (0..self.heads).map(move |h| (start, len, h));
        self.seqs.iter().flat_map(per_seq).collect()
    }
}

/// Columns `col..col + d` of rows `start..start + len` of `m` (rows of `width`), widened: `[len, d]`.
fn columns(m: &[u16], width: usize, (start, len): (usize, usize), col: usize, d: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(len * d);
    for r in start..start + len {
        out.extend(m[r * width + col..][..d].iter().map(|&b| widen(b)));
    }
    out
}

/// `a [m, k] · bᵀ` for `b` `[n, k]` (f32), on this thread.
pub(super) fn times_t(a: &[f32], b: &[f32], (m, n, k): (usize, usize, usize)) -> Vec<f32> {
    let mut out = vec![0f32; m * n];
    product(&mut out, a, WeightSlice::F32(b), (m, n, k), false, false);
    out
}

/// `a [m, k] · bᵀ` for `b` bf16 `[n, k]`, on this thread, multiplied in bf16 where the CPU can
/// (`a` rounded to bf16, f32 sums: PyTorch's bf16 attention), else in f32.
fn times_t16(a: &[f32], b: &[u16], (m, n, k): (usize, usize, usize)) -> Vec<f32> {
    let mut out = vec![0f32; m * n];
    product(&mut out, a, bf16_weight(b), (m, n, k), false, false);
    out
}

/// Columns `col..col + d` of rows `start..start + len` of `m` (rows of `width`): `[len, d]`.
fn columns16(m: &[u16], width: usize, (start, len): (usize, usize), col: usize, d: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(len * d);
    for r in start..start + len {
        out.extend_from_slice(&m[r * width + col..][..d]);
    }
    out
}

/// `v` rounded to bf16.
fn rounded(v: &[f32]) -> Vec<u16> {
    v.iter().map(|&x| round(x)).collect()
}

/// The attention probabilities `[len, len]` of queries `q` over keys `k` (`[len, d]` each): row
/// `i` the softmax of its scaled scores over keys `0..=i`, zero past it.
fn probabilities(q: &[f32], k: &[u16], len: usize, d: usize) -> Vec<f32> {
    let scale = 1.0 / (d as f32).sqrt();
    let mut p = times_t16(q, k, (len, len, d));
    simd::dispatch(CausalSoftmax { p: &mut p, len, scale });
    p
}

/// Each row `i` of `[len, len]` scores made the softmax of its first `i + 1` values scaled by
/// `scale`, zero past them, in the vector kernels ([`simd::dispatch`]).
struct CausalSoftmax<'a> {
    p: &'a mut [f32],
    len: usize,
    scale: f32,
}

impl simd::Kernel for CausalSoftmax<'_> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        for (i, row) in self.p.chunks_exact_mut(self.len).enumerate() {
            let (seen, future) = row.split_at_mut(i + 1);
            seen.iter_mut().for_each(|s| *s *= self.scale);
            let inv = 1.0 / simd::exp_sub_sum_one_pass::<FMA>(seen, simd::max(seen));
            seen.iter_mut().for_each(|s| *s *= inv);
            future.fill(0.0);
        }
    }
}

/// The scores' gradient from the probabilities `p` and their gradient `dp` (`[len, len]`, in
/// place): `dS = P ∘ (dP − Σⱼ P·dP) · scale`, row by row, zero past the diagonal.
struct ScoresGradient<'a> {
    p: &'a [f32],
    dp: &'a mut [f32],
    len: usize,
    scale: f32,
}

impl simd::Kernel for ScoresGradient<'_> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        let rows = self.p.chunks_exact(self.len).zip(self.dp.chunks_exact_mut(self.len));
        for (i, (p, dp)) in rows.enumerate() {
            let (p, (seen, future)) = (&p[..=i], dp.split_at_mut(i + 1));
            let mean = simd::dot::<FMA>(p, seen);
            seen.iter_mut().zip(p).for_each(|(g, &pr)| *g = pr * (*g - mean) * self.scale);
            future.fill(0.0);
        }
    }
}

/// A row of scores made the softmax of its first `seen` values scaled by `scale`, zero past
/// them (a causal row: the keys up to its own position), as [`super::Reference`] computes it.
pub(super) fn softmax_prefix(row: &mut [f32], seen: usize, scale: f32) {
    let (seen, future) = row.split_at_mut(seen);
    seen.iter_mut().for_each(|s| *s *= scale);
    let max = seen.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    seen.iter_mut().for_each(|s| *s = (*s - max).exp());
    let total: f32 = seen.iter().sum();
    seen.iter_mut().for_each(|s| *s /= total);
    future.fill(0.0);
}

/// Causal attention of every row over its own sequence's rows, into `out` (`[rows, heads · d]`).
pub(super) fn forward(qkv: &[u16], out: &mut [u16], shape: &Shape) -> Result<()> {
    let (width, d, heads) = (shape.width(), shape.d, shape.heads);
    let rows = shape.seqs.last().map_or(0, |&(s, l)| s + l);
    ensure!(qkv.len() >= rows * width && out.len() >= rows * heads * d, "a buffer too short");
    // Each task's output transposed, `[d, len]`: the probabilities are the product's bf16
    // weight, so that it reads them where they lie.
    let results: Vec<Vec<f32>> = shape
        .tasks()
        .into_par_iter()
        .map(|(start, len, h)| {
            let (kc, vc) = shape.key_value(h);
            let q = columns(qkv, width, (start, len), h * d, d);
            let k = columns16(qkv, width, (start, len), kc, d);
            let vt = transposed(&columns(qkv, width, (start, len), vc, d), len, d);
            times_t16(&vt, &rounded(&probabilities(&q, &k, len, d)), (d, len, len))
        })
        .collect();
    for ((start, len, h), ot) in shape.tasks().into_iter().zip(results) {
        for i in 0..len {
            let dst = &mut out[(start + i) * heads * d + h * d..][..d];
            dst.iter_mut().enumerate().for_each(|(c, y)| *y = round(ot[c * len + i]));
        }
    }
    Ok(())
}

/// One head's gradients through its attention, transposed: `(dqᵀ, dkᵀ, dvᵀ)`, `[d, len]` each.
/// Each product takes the `[len, len]` operand (the probabilities or the scores' gradient,
/// rounded to bf16) as its weight, where it lies or transposed once.
fn head_backward(qkv: &[u16], d_out: &[u16], shape: &Shape, (start, len, h): (usize, usize, usize)) -> [Vec<f32>; 3] {
    let (width, d) = (shape.width(), shape.d);
    let scale = 1.0 / (d as f32).sqrt();
    let (kc, vc) = shape.key_value(h);
    let q = columns(qkv, width, (start, len), h * d, d);
    let k = columns16(qkv, width, (start, len), kc, d);
    let v = columns16(qkv, width, (start, len), vc, d);
    let d_o = columns(d_out, shape.heads * d, (start, len), h * d, d);
    let p = probabilities(&q, &k, len, d);
    // dP = dO · Vᵀ; dS = P ∘ (dP − Σⱼ P·dP) · scale, row by row (zero past the diagonal with P).
    let mut ds = times_t16(&d_o, &v, (len, len, d));
    simd::dispatch(ScoresGradient { p: &p, dp: &mut ds, len, scale });
    let ds = rounded(&ds);
    // dQᵀ = Kᵀ · dSᵀ, dKᵀ = Qᵀ · dS, dVᵀ = dOᵀ · P.
    let kt = transposed(&k.iter().map(|&b| widen(b)).collect::<Vec<_>>(), len, d);
    let dq = times_t16(&kt, &ds, (d, len, len));
    let dk = times_t16(&transposed(&q, len, d), &transposed(&ds, len, len), (d, len, len));
    let dv = times_t16(&transposed(&d_o, len, d), &transposed(&rounded(&p), len, len), (d, len, len));
    [dq, dk, dv]
}

/// Through [`forward`]: `d_qkv = [dq | dk | dv]` (written; a key/value head's gradients summed
/// over the query heads that share it) for the gradient `d_out` of its output.
pub(super) fn backward(qkv: &[u16], d_out: &[u16], d_qkv: &mut [f32], shape: &Shape) -> Result<()> {
    let (width, d, heads) = (shape.width(), shape.d, shape.heads);
    let rows = shape.seqs.last().map_or(0, |&(s, l)| s + l);
    ensure!(
        qkv.len() >= rows * width && d_out.len() >= rows * heads * d && d_qkv.len() >= rows * width,
        "a buffer too short"
    );
    let results: Vec<[Vec<f32>; 3]> = shape
        .tasks()
        .into_par_iter()
        .map(|task| head_backward(qkv, d_out, shape, task))
        .collect();
    d_qkv[..rows * width].fill(0.0);
    for ((start, len, h), [dq, dk, dv]) in shape.tasks().into_iter().zip(results) {
        let (kc, vc) = shape.key_value(h);
        for (col, grad) in [(h * d, dq), (kc, dk), (vc, dv)] {
            for i in 0..len {
                let dst = &mut d_qkv[(start + i) * width + col..][..d];
                dst.iter_mut().enumerate().for_each(|(c, y)| *y += grad[c * len + i]);
            }
        }
    }
    Ok(())
}
