//! Causal attention of one sequence, four query positions at a time, from its rotated q|k|v rows.

use super::Dims;
use crate::kernels::{simd, tiles};
use rayon::prelude::*;

/// One head's attention buffers.
#[derive(Default)]
pub(super) struct HeadScratch {
    /// One tile's scaled queries.
    queries: Vec<f32>,
    scores: Vec<f32>,
    out: Vec<f32>,
}

/// Causal attention of one sequence from its q|k|v rows (`[t, qkv_width]`, rotated), for the
/// query positions `queries`, into `out` (`[queries.len(), heads · d]`). `keys_t` and `head` are
/// scratch; `shared`: heads run in parallel.
#[allow(clippy::too_many_arguments)]
pub(super) fn attention(
    qkv: &[f32],
    t: usize,
    queries: &[usize],
    dims: Dims,
    valid: Option<&[bool]>,
    keys_t: &mut Vec<f32>,
    head: &mut HeadScratch,
    out: &mut Vec<f32>,
    shared: bool,
) {
    let Dims {
        heads,
        kv_heads,
        head_dim: d,
        ..
    } = dims;
    let stride = dims.qkv_width();
    // Keys transposed per kv head, `[d, t_pad]`, zero past t.
    let t_pad = t.div_ceil(tiles::TILE_WIDTH) * tiles::TILE_WIDTH;
    keys_t.clear();
    keys_t.resize(kv_heads * d * t_pad, 0.0);
    for (g, kt) in keys_t.chunks_exact_mut(d * t_pad).enumerate() {
        for (i, row) in qkv.chunks_exact(stride).enumerate() {
            for (c, &k) in row[(heads + g) * d..][..d].iter().enumerate() {
                kt[c * t_pad + i] = k;
            }
        }
    }
    let keys_t = &*keys_t;
    let one = |hq: usize, scratch: &mut HeadScratch| {
        let g = hq / (heads / kv_heads);
        simd::dispatch(HeadAttention {
            qkv,
            stride,
            q_col: hq * d,
            v_col: (heads + kv_heads + g) * d,
            keys_t: &keys_t[g * d * t_pad..][..d * t_pad],
            t_pad,
            t,
            queries,
            d,
            scale: 1.0 / (d as f32).sqrt(),
            valid,
            scratch,
        });
    };
    out.resize(queries.len() * heads * d, 0.0);
    let scatter = |hq: usize, y: &[f32], out: &mut [f32]| {
        for (dst, src) in out.chunks_exact_mut(heads * d).zip(y.chunks_exact(d)) {
            dst[hq * d..][..d].copy_from_slice(src);
        }
    };
    if shared {
        let ys: Vec<Vec<f32>> = (0..heads)
            .into_par_iter()
            .map(|hq| {
                let mut scratch = HeadScratch::default();
                one(hq, &mut scratch);
                scratch.out
            })
            .collect();
        for (hq, y) in ys.iter().enumerate() {
            scatter(hq, y, out);
        }
    } else {
        for hq in 0..heads {
            one(hq, head);
            scatter(hq, &head.out, out);
        }
    }
}

/// One query head over one sequence, four query positions at a time.
struct HeadAttention<'a> {
    qkv: &'a [f32],
    stride: usize,
    q_col: usize,
    v_col: usize,
    keys_t: &'a [f32],
    t_pad: usize,
    t: usize,
    /// The query positions (any order); output row `k` is position `queries[k]`.
    queries: &'a [usize],
    d: usize,
    scale: f32,
    valid: Option<&'a [bool]>,
    scratch: &'a mut HeadScratch,
}

impl simd::Kernel for HeadAttention<'_> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        use tiles::{TILE_ROWS, TILE_WIDTH};
        let (t, d, stride) = (self.t, self.d, self.stride);
        let HeadScratch {
            queries: q,
            scores,
            out,
        } = self.scratch;
        let m = self.queries.len();
        out.clear();
        out.resize(m.div_ceil(TILE_ROWS) * TILE_ROWS * d, 0.0);
        q.clear();
        q.resize(TILE_ROWS * d, 0.0);
        for (tile, positions) in self.queries.chunks(TILE_ROWS).enumerate() {
            // A last, partial tile repeats its last query; those rows are dropped.
            let at = |r: usize| positions[r.min(positions.len() - 1)];
            for (r, qr) in q.chunks_exact_mut(d).enumerate() {
                for (dst, &src) in qr.iter_mut().zip(&self.qkv[at(r) * stride + self.q_col..][..d]) {
                    *dst = src * self.scale;
                }
            }
            // Keys visible to the tile's latest query, rounded up to whole tiles.
            let seen = (0..TILE_ROWS).map(|r| at(r) + 1).max().unwrap_or(1).min(t);
            let n = seen.div_ceil(TILE_WIDTH) * TILE_WIDTH;
            scores.resize(TILE_ROWS * n, 0.0);
            let rows = std::array::from_fn(|r| &q[r * d..][..d]);
            tiles::scores::<FMA>(rows, self.keys_t, self.t_pad, n, scores);
            // Softmax weights before the division, which is applied to the d outputs instead.
            let mut inv = [0f32; TILE_ROWS];
            for (r, row) in scores.chunks_exact_mut(n).enumerate() {
                let window = (at(r) + 1).min(t);
                let valid = self.valid.map(|v| &v[..window]);
                inv[r] = 1.0 / crate::kernels::exp_window::<FMA>(&mut row[..window], valid, true);
                row[window..].fill(0.0);
            }
            let first = tile * TILE_ROWS;
            let y = split4(&mut out[first * d..][..TILE_ROWS * d], d);
            let v = &self.qkv[self.v_col..];
            tiles::weighted_values::<FMA>(scores, n, v, stride, seen, y);
            for (y, inv) in out[first * d..][..TILE_ROWS * d].chunks_exact_mut(d).zip(inv) {
                for y in y {
                    *y *= inv;
                }
            }
        }
        out.truncate(m * d);
    }
}

/// Four consecutive rows of `d` values.
fn split4(rows: &mut [f32], d: usize) -> [&mut [f32]; 4] {
    let (a, rest) = rows.split_at_mut(d);
    let (b, rest) = rest.split_at_mut(d);
    let (c, e) = rest.split_at_mut(d);
    [a, b, c, &mut e[..d]]
}
