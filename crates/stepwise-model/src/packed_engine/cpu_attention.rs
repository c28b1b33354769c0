//! Causal attention of [`super::Cpu`], forward and backward: one task per sequence and query
//! head on the thread pool, each head's rows widened to f32 (exactly: they are bf16), its
//! products in the CPU's product kernels ([`product`], on the task's own thread), the softmax
//! as [`super::Reference`] computes it. A head's scores are a `[len, len]` matrix (the causal
//! half used), so a task holds a few of them: 64 MiB each at 4,096 tokens.

use super::cpu::transposed;
use super::reference::{round, widen};
use crate::kernels::cpu_inference::product;
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

/// The attention probabilities `[len, len]` of queries `q` over keys `k` (`[len, d]` each): row
/// `i` the softmax of its scaled scores over keys `0..=i`, zero past it.
fn probabilities(q: &[f32], k: &[f32], len: usize, d: usize) -> Vec<f32> {
    let scale = 1.0 / (d as f32).sqrt();
    let mut p = times_t(q, k, (len, len, d));
    for (i, row) in p.chunks_exact_mut(len).enumerate() {
        softmax_prefix(row, i + 1, scale);
    }
    p
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
    let results: Vec<Vec<f32>> = shape
        .tasks()
        .into_par_iter()
        .map(|(start, len, h)| {
            let (kc, vc) = shape.key_value(h);
            let q = columns(qkv, width, (start, len), h * d, d);
            let k = columns(qkv, width, (start, len), kc, d);
            let vt = transposed(&columns(qkv, width, (start, len), vc, d), len, d);
            times_t(&probabilities(&q, &k, len, d), &vt, (len, d, len))
        })
        .collect();
    for ((start, _, h), o) in shape.tasks().into_iter().zip(results) {
        for (i, row) in o.chunks_exact(d).enumerate() {
            let dst = &mut out[(start + i) * heads * d + h * d..][..d];
            dst.iter_mut().zip(row).for_each(|(y, &v)| *y = round(v));
        }
    }
    Ok(())
}

/// One head's gradients through its attention: `(dq, dk, dv)`, `[len, d]` each.
fn head_backward(qkv: &[u16], d_out: &[u16], shape: &Shape, (start, len, h): (usize, usize, usize)) -> [Vec<f32>; 3] {
    let (width, d) = (shape.width(), shape.d);
    let scale = 1.0 / (d as f32).sqrt();
    let (kc, vc) = shape.key_value(h);
    let q = columns(qkv, width, (start, len), h * d, d);
    let k = columns(qkv, width, (start, len), kc, d);
    let v = columns(qkv, width, (start, len), vc, d);
    let d_o = columns(d_out, shape.heads * d, (start, len), h * d, d);
    let p = probabilities(&q, &k, len, d);
    // dP = dO · Vᵀ; dS = P ∘ (dP − Σⱼ P·dP) · scale, row by row (zero past the diagonal with P).
    let mut ds = times_t(&d_o, &v, (len, len, d));
    for (prow, dsrow) in p.chunks_exact(len).zip(ds.chunks_exact_mut(len)) {
        let mean: f32 = prow.iter().zip(dsrow.iter()).map(|(a, b)| a * b).sum();
        dsrow.iter_mut().zip(prow).for_each(|(g, &pr)| *g = pr * (*g - mean) * scale);
    }
    let dq = times_t(&ds, &transposed(&k, len, d), (len, d, len));
    let dk = times_t(&transposed(&ds, len, len), &transposed(&q, len, d), (len, d, len));
    let dv = times_t(&transposed(&p, len, len), &transposed(&d_o, len, d), (len, d, len));
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
    for ((start, _, h), [dq, dk, dv]) in shape.tasks().into_iter().zip(results) {
        let (kc, vc) = shape.key_value(h);
        for (col, grad, add) in [(h * d, dq, false), (kc, dk, true), (vc, dv, true)] {
            for (i, row) in grad.chunks_exact(d).enumerate() {
                let dst = &mut d_qkv[(start + i) * width + col..][..d];
                match add {
                    true => dst.iter_mut().zip(row).for_each(|(y, &g)| *y += g),
                    false => dst.copy_from_slice(row),
                }
            }
        }
    }
    Ok(())
}
