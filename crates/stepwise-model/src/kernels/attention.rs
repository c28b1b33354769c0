//! Inference attention in one pass per query row, reading q, k and v where candle stores them.
//!
//! Per query row: scores against the visible keys (eight keys at a time from a transposed copy of
//! K, so the dot products vectorise across keys), the softmax with a vectorised `exp`, and the
//! weighted sum of values. The score matrix is never materialised and the masked half of a causal
//! one is never computed.

use super::simd::{self, Kernel, LANES};
use super::KeyMask;
use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

/// The op: `softmax(scale · q·kᵀ) · v` over the keys `mask` allows.
struct Attention {
    scale: f32,
    mask: KeyMask,
}

/// Everything one query row needs, shared by all rows.
struct Inputs<'a> {
    q: &'a [f32],
    /// K transposed per (sequence, kv head): `[b, kv_heads, d, s_pad]`, zero beyond `s`.
    kt: &'a [f32],
    v: &'a [f32],
    heads: usize,
    kv_heads: usize,
    t: usize,
    s: usize,
    s_pad: usize,
    d: usize,
    scale: f32,
    mask: &'a KeyMask,
}

impl Inputs<'_> {
    /// Writes output row `row` (sequence, query, head) of `[b, t, h, d]` into `y`; `scores` is
    /// scratch space.
    #[inline(always)]
    fn row<const FMA: bool>(&self, row: usize, y: &mut [f32], scores: &mut Vec<f32>) {
        let (h, t, s, d) = (self.heads, self.t, self.s, self.d);
        let (bi, i, hi) = (row / (t * h), (row / h) % t, row % h);
        let kv = bi * self.kv_heads + hi / (h / self.kv_heads);
        let q = &self.q[((bi * h + hi) * t + i) * d..][..d];
        let kt = &self.kt[kv * d * self.s_pad..][..d * self.s_pad];
        let causal = (self.mask.offset + i + 1).min(s);
        scores.clear();
        scores.resize(causal.div_ceil(LANES) * LANES, 0.0);
        key_scores::<FMA>(q, self.scale, kt, self.s_pad, scores);
        scores.truncate(causal);
        let valid = self.mask.valid.as_deref().map(|v| &v[bi * s..][..causal]);
        super::softmax_window::<FMA>(scores, valid);
        simd::weighted_sum::<FMA>(scores, &self.v[kv * s * d..][..causal * d], y);
    }
}

/// Adds `scale · q · keyⱼ` to `scores[j]` for the first `scores.len()` keys of `kt`, which holds
/// component `c` of key `j` at `kt[c · stride + j]`: eight keys at a time, four query components
/// per pass over the scores.
#[inline(always)]
fn key_scores<const FMA: bool>(q: &[f32], scale: f32, kt: &[f32], stride: usize, scores: &mut [f32]) {
    let n = scores.len();
    let key_rows = |k: usize| &kt[k * stride..][..n];
    let mut k = 0;
    while k + 4 <= q.len() {
        let qk = [q[k], q[k + 1], q[k + 2], q[k + 3]].map(|x| x * scale);
        let rows = [key_rows(k), key_rows(k + 1), key_rows(k + 2), key_rows(k + 3)];
        simd::axpy4::<FMA>(qk, rows, scores);
        k += 4;
    }
    for (k, &qk) in q.iter().enumerate().skip(k) {
        simd::axpy::<FMA>(qk * scale, key_rows(k), scores);
    }
}

/// A block of consecutive output rows, starting at row `first`.
struct Rows<'a, 'b> {
    inputs: &'a Inputs<'a>,
    first: usize,
    out: &'b mut [f32],
    scores: &'b mut Vec<f32>,
}

impl Kernel for Rows<'_, '_> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        for (r, y) in self.out.chunks_exact_mut(self.inputs.d).enumerate() {
            self.inputs.row::<FMA>(self.first + r, y, self.scores);
        }
    }
}

/// `[b, kv_heads, s, d]` → `[b, kv_heads, d, s_pad]`, zero-padded to a whole number of lanes.
fn transpose_keys(k: &[f32], s: usize, d: usize, s_pad: usize) -> Vec<f32> {
    let mut kt = vec![0f32; k.len() / s * s_pad];
    kt.par_chunks_mut(d * s_pad)
        .zip(k.par_chunks(s * d))
        .for_each(|(dst, src)| transpose_key_rows(src, d, dst, s_pad));
    kt
}

/// One head's keys `[n, d]` into the layout the kernels read: component `c` of key `j` at
/// `dst[c · stride + j]`.
pub(crate) fn transpose_key_rows(keys: &[f32], d: usize, dst: &mut [f32], stride: usize) {
    for (j, key) in keys.chunks_exact(d).enumerate() {
        for (c, &x) in key.iter().enumerate() {
            dst[c * stride + j] = x;
        }
    }
}

impl CustomOp3 for Attention {
    fn name(&self) -> &'static str {
        "attention"
    }

    fn cpu_fwd(
        &self,
        qs: &CpuStorage,
        ql: &Layout,
        ks: &CpuStorage,
        kl: &Layout,
        vs: &CpuStorage,
        vl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (q, k, v) = (
            super::f32_slice(qs, ql, "attention")?,
            super::f32_slice(ks, kl, "attention")?,
            super::f32_slice(vs, vl, "attention")?,
        );
        let (b, h, t, d) = ql.shape().dims4()?;
        let (_, kv_heads, s, _) = kl.shape().dims4()?;
        let s_pad = s.div_ceil(LANES) * LANES;
        let kt = transpose_keys(k, s, d, s_pad);
        let inputs = Inputs {
            q,
            kt: &kt,
            v,
            heads: h,
            kv_heads,
            t,
            s,
            s_pad,
            d,
            scale: self.scale,
            mask: &self.mask,
        };
        // Blocks of rows (one query, every head) keep each task long enough to amortise the
        // scheduling and the CPU-feature switch.
        let block = h * d;
        let mut out = vec![0f32; b * t * h * d];
        let run = |n: usize, out: &mut [f32], scores: &mut Vec<f32>| {
            simd::dispatch(Rows {
                inputs: &inputs,
                first: n * h,
                out,
                scores,
            })
        };
        if b * t * h * s * d < super::PARALLEL_MIN_WORK {
            // A decoding step of a small model: less work than waking the thread pool.
            let mut scores = Vec::with_capacity(s_pad);
            for (n, out) in out.chunks_mut(block).enumerate() {
                run(n, out, &mut scores);
            }
        } else {
            out.par_chunks_mut(block)
                .enumerate()
                .for_each_init(|| Vec::with_capacity(s_pad), |scores, (n, out)| run(n, out, scores));
        }
        Ok((CpuStorage::F32(out), Shape::from((b, t, h * d))))
    }
}

/// Inference attention: `softmax(scale · q·kᵀ)` over the keys `mask` allows, times `v`. `q`
/// `[b, h, t, d]`, `k`/`v` `[b, kv_heads, s, d]` (each key/value head serves `h / kv_heads` query
/// heads), f32 on the CPU. Returns `[b, t, h · d]`, the layout the output projection reads. No
/// gradient (asking for one is an error): the training path uses
/// [`masked_softmax`](super::masked_softmax) between two matmuls.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64, mask: &KeyMask) -> candle_core::Result<Tensor> {
    q.contiguous()?.apply_op3(
        &k.contiguous()?,
        &v.contiguous()?,
        Attention {
            scale: scale as f32,
            mask: mask.clone(),
        },
    )
}

/// One sequence's cached keys and values, as [`attention_rows`] reads them
/// ([`crate::kv_rows::RowsCache`] keeps them so).
pub(crate) struct RowKeys<'a> {
    /// `[kv_heads, d, stride]`: component `c` of head `h`'s key at position `j` is at
    /// `(h · d + c) · stride + j` (only the first `len` positions are read).
    pub kt: &'a [f32],
    /// `[kv_heads, stride, d]`: each head's values by position.
    pub v: &'a [f32],
    /// Positions a key row has room for.
    pub stride: usize,
    /// Positions cached, the step's new one included.
    pub len: usize,
}

/// Inference attention of a decoding step whose sequences keep caches of their own: `q`
/// `[b, heads, d]` (one new token a sequence, rotary applied), sequence `r` attending to
/// `rows[r]`. Returns `[b, heads · d]`: bit for bit what [`attention`] gives the same rows in one
/// cache of `s` positions shared with left padding (row `r`'s first `s − rows[r].len` positions
/// padding). The scores are laid out as the padded row's (the padding masked first), so the
/// softmax sums in the same order. The weighted sum skips the padding, whose weights and values
/// are zero: its two running sums (even and odd positions) swap roles when the padding is odd,
/// and their total is the same.
pub(crate) fn attention_rows(
    q: &[f32],
    rows: &[RowKeys],
    (heads, kv_heads, d): (usize, usize, usize),
    s: usize,
    scale: f32,
) -> Vec<f32> {
    /// One sequence's heads, written into `out` (`[heads, d]`); `group` query heads a key head.
    struct Sequence<'a, 'b> {
        q: &'a [f32],
        keys: &'a RowKeys<'a>,
        d: usize,
        group: usize,
        s: usize,
        scale: f32,
        out: &'b mut [f32],
        scores: &'b mut Vec<f32>,
    }
    impl Kernel for Sequence<'_, '_> {
        #[inline(always)]
        fn run<const FMA: bool>(self) {
            let Sequence {
                q,
                keys,
                d,
                group,
                s,
                scale,
                out,
                scores,
            } = self;
            let pad = s - keys.len;
            for (hi, (q, y)) in q.chunks_exact(d).zip(out.chunks_exact_mut(d)).enumerate() {
                let kv = hi / group;
                scores.clear();
                scores.resize(s, 0.0);
                let kt = &keys.kt[kv * d * keys.stride..];
                key_scores::<FMA>(q, scale, kt, keys.stride, &mut scores[pad..]);
                scores[..pad].fill(f32::NEG_INFINITY);
                super::softmax_window::<FMA>(scores, None);
                let v = &keys.v[kv * keys.stride * d..][..keys.len * d];
                simd::weighted_sum::<FMA>(&scores[pad..], v, y);
            }
        }
    }
    let b = rows.len();
    let mut out = vec![0f32; b * heads * d];
    let run = |r: usize, out: &mut [f32], scores: &mut Vec<f32>| {
        simd::dispatch(Sequence {
            q: &q[r * heads * d..][..heads * d],
            keys: &rows[r],
            d,
            group: heads / kv_heads,
            s,
            scale,
            out,
            scores,
        })
    };
    if b * heads * s * d < super::PARALLEL_MIN_WORK {
        let mut scores = Vec::with_capacity(s);
        for (r, out) in out.chunks_mut(heads * d).enumerate() {
            run(r, out, &mut scores);
        }
    } else {
        out.par_chunks_mut(heads * d)
            .enumerate()
            .for_each_init(|| Vec::with_capacity(s), |scores, (r, out)| run(r, out, scores));
    }
    out
}
