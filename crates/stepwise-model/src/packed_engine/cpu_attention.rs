//! Causal attention of [`super::Cpu`], forward and backward: one task per sequence and query
//! head on the thread pool, its products those of the CPU backend's ([`product_into`]) in
//! bf16 where the CPU can (AMX or AVX512_BF16 tiles), each operand read where it lies (as rows,
//! or transposed): queries, keys, values, the softmax's probabilities and the scores' gradient
//! in bf16, every sum f32, as PyTorch's bf16 attention ([`super::Reference`] keeps the
//! probabilities f32); the softmax in the vector kernels. A head's scores are a `[len, len]` matrix (the causal half used), so a
//! task holds a few of them: 64 MiB each at 4,096 tokens.

use super::cpu::product_into;
use super::Out;
use crate::kernels::sgemm::{transposed_u16, Bf16Rows};
use super::reference::round;
use crate::kernels::simd;
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

/// `a [m, k] · wᵀ` for bf16 `a` (as [`Bf16Rows`] says where it lies) and `w` `[n, k]`, in
/// bf16 products where the CPU can (f32 sums: PyTorch's bf16 attention), else in f32.
fn times16(a: Bf16Rows, w: &[u16], (m, n, k): (usize, usize, usize)) -> Result<Vec<f32>> {
    let mut out = vec![0f32; m * n];
    product_into(Out::F32(&mut out), a, w, (m, n, k), false)?;
    Ok(out)
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
fn probabilities(q: &[u16], k: &[u16], len: usize, d: usize) -> Result<Vec<f32>> {
    let scale = 1.0 / (d as f32).sqrt();
    let mut p = times16(Bf16Rows::Rows(q, d), k, (len, len, d))?;
    simd::dispatch(CausalSoftmax { p: &mut p, len, scale });
    Ok(p)
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
            let q = columns16(qkv, width, (start, len), h * d, d);
            let k = columns16(qkv, width, (start, len), kc, d);
            let vt = transposed_u16(&columns16(qkv, width, (start, len), vc, d), len, d);
            let p = rounded(&probabilities(&q, &k, len, d)?);
            times16(Bf16Rows::Rows(&p, len), &vt, (len, d, len))
        })
        .collect::<Result<_>>()?;
    for ((start, _, h), o) in shape.tasks().into_iter().zip(results) {
        for (i, row) in o.chunks_exact(d).enumerate() {
            let dst = &mut out[(start + i) * heads * d + h * d..][..d];
            dst.iter_mut().zip(row).for_each(|(y, &v)| *y = round(v));
        }
    }
    Ok(())
}

/// One head's gradients through its attention: `(dq, dk, dv)`, `[len, d]` each. The `[len,
/// len]` operands (the probabilities and the scores' gradient, rounded to bf16) are read where
/// they lie, as rows or (for `dk` and `dv`) transposed; only the `[len, d]` ones are transposed.
fn head_backward(
    qkv: &[u16],
    d_out: &[u16],
    shape: &Shape,
    (start, len, h): (usize, usize, usize),
) -> Result<[Vec<f32>; 3]> {
    let (width, d) = (shape.width(), shape.d);
    let scale = 1.0 / (d as f32).sqrt();
    let (kc, vc) = shape.key_value(h);
    let q = columns16(qkv, width, (start, len), h * d, d);
    let k = columns16(qkv, width, (start, len), kc, d);
    let v = columns16(qkv, width, (start, len), vc, d);
    let d_o = columns16(d_out, shape.heads * d, (start, len), h * d, d);
    let p = probabilities(&q, &k, len, d)?;
    // dP = dO · Vᵀ; dS = P ∘ (dP − Σⱼ P·dP) · scale, row by row (zero past the diagonal with P).
    let mut ds = times16(Bf16Rows::Rows(&d_o, d), &v, (len, len, d))?;
    simd::dispatch(ScoresGradient { p: &p, dp: &mut ds, len, scale });
    let (ds, p) = (rounded(&ds), rounded(&p));
    // dQ = dS · K, dK = dSᵀ · Q, dV = Pᵀ · dO.
    let dims = (len, d, len);
    let dq = times16(Bf16Rows::Rows(&ds, len), &transposed_u16(&k, len, d), dims)?;
    let dk = times16(Bf16Rows::Columns(&ds, len), &transposed_u16(&q, len, d), dims)?;
    let dv = times16(Bf16Rows::Columns(&p, len), &transposed_u16(&d_o, len, d), dims)?;
    Ok([dq, dk, dv])
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
        .collect::<Result<_>>()?;
    d_qkv[..rows * width].fill(0.0);
    for ((start, _, h), [dq, dk, dv]) in shape.tasks().into_iter().zip(results) {
        let (kc, vc) = shape.key_value(h);
        for (col, grad) in [(h * d, dq), (kc, dk), (vc, dv)] {
            for (i, row) in grad.chunks_exact(d).enumerate() {
                let dst = &mut d_qkv[(start + i) * width + col..][..d];
                dst.iter_mut().zip(row).for_each(|(y, &g)| *y += g);
            }
        }
    }
    Ok(())
}
