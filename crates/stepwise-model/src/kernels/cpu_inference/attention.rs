//! Causal attention of one sequence, four query positions at a time, from its rotated q|k|v rows.
//!
//! A model multiplied in bf16 (see [`crate::kernels::sgemm::bf16_products_available`]) takes its attention
//! products in bf16 too where the head size is a multiple of 32: queries, keys, values and the
//! softmax weights rounded to bf16, every sum in f32 (PyTorch's bf16 attention); the softmax
//! itself stays f32.

use super::Dims;
use crate::kernels::sgemm::amx;
use crate::kernels::{simd, tiles, tiles_amx};
use rayon::prelude::*;

/// One head's attention buffers.
#[derive(Default)]
pub(super) struct HeadScratch {
    /// One tile's scaled queries.
    queries: Vec<f32>,
    scores: Vec<f32>,
    out: Vec<f32>,
    /// In bf16: one tile's queries and softmax weights as pairs.
    query_pairs: Vec<u32>,
    weight_pairs: Vec<u32>,
}

/// A sequence's keys and values as bf16 pairs, per kv head: keys `[d / 2, t_pad]` (pairs of
/// components), values `[t_pad / 2, d]` (pairs of positions), zero past `t`.
#[derive(Default)]
pub(super) struct Bf16Keys {
    keys: Vec<u32>,
    values: Vec<u32>,
}

/// Causal attention of one sequence from its q|k|v rows (`[t, qkv_width]`, rotated), for the
/// query positions `queries`, into `out` (`[queries.len(), heads · d]`). `keys_t` and `head` are
/// scratch; `shared`: heads run in parallel.
/// `bf16`: the products in bf16 (the caller checked [`crate::kernels::sgemm::bf16_products_available`]);
/// taken where the head size is a multiple of 32, else f32.
#[allow(clippy::too_many_arguments)]
pub(super) fn attention(
    qkv: &[f32],
    t: usize,
    queries: &[usize],
    dims: Dims,
    valid: Option<&[bool]>,
    (keys_t, pairs): (&mut Vec<f32>, &mut Bf16Keys),
    head: &mut HeadScratch,
    out: &mut Vec<f32>,
    shared: bool,
    bf16: bool,
) {
    let Dims {
        heads,
        kv_heads,
        head_dim: d,
        ..
    } = dims;
    let stride = dims.qkv_width();
    let bf16 = bf16 && d.is_multiple_of(tiles::BF16_VALUE_WIDTH);
    // Keys transposed per kv head, `[d, t_pad]` (or in pairs), zero past t.
    let t_pad = t.div_ceil(tiles::TILE_WIDTH) * tiles::TILE_WIDTH;
    if bf16 {
        pair_keys_and_values(qkv, t, dims, t_pad, pairs);
    } else {
        keys_t.clear();
        keys_t.resize(kv_heads * d * t_pad, 0.0);
        for (g, kt) in keys_t.chunks_exact_mut(d * t_pad).enumerate() {
            for (i, row) in qkv.chunks_exact(stride).enumerate() {
                for (c, &k) in row[(heads + g) * d..][..d].iter().enumerate() {
                    kt[c * t_pad + i] = k;
                }
            }
        }
    }
    let (keys_t, pairs) = (&*keys_t, &*pairs);
    let one = |hq: usize, scratch: &mut HeadScratch| {
        let g = hq / (heads / kv_heads);
        let head = HeadAttention {
            qkv,
            stride,
            q_col: hq * d,
            v_col: (heads + kv_heads + g) * d,
            keys_t: if bf16 {
                &[]
            } else {
                &keys_t[g * d * t_pad..][..d * t_pad]
            },
            t_pad,
            t,
            queries,
            d,
            scale: 1.0 / (d as f32).sqrt(),
            valid,
            scratch,
        };
        if bf16 {
            let keys = &pairs.keys[g * d / 2 * t_pad..][..d / 2 * t_pad];
            let values = &pairs.values[g * t_pad / 2 * d..][..t_pad / 2 * d];
            // SAFETY: `bf16` was asked for only where `bf16_products_available()` holds (AVX-512F and
            // AVX512_BF16), and `d` is a multiple of 32; AMX's where `amx::available()` holds.
            unsafe {
                if amx::available() {
                    head.run_bf16::<{ tiles_amx::QUERIES }>(keys, values)
                } else {
                    head.run_bf16::<{ tiles::TILE_ROWS }>(keys, values)
                }
            }
        } else {
            simd::dispatch(head);
        }
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

/// Fills `pairs` with the sequence's keys and values as bf16 pairs (see [`Bf16Keys`]).
fn pair_keys_and_values(qkv: &[f32], t: usize, dims: Dims, t_pad: usize, pairs: &mut Bf16Keys) {
    let (heads, kv_heads, d) = (dims.heads, dims.kv_heads, dims.head_dim);
    let stride = dims.qkv_width();
    pairs.keys.clear();
    pairs.keys.resize(kv_heads * d / 2 * t_pad, 0);
    pairs.values.clear();
    pairs.values.resize(kv_heads * t_pad / 2 * d, 0);
    let mut key = vec![0u32; d / 2];
    let row = |i: usize, col: usize| &qkv[i * stride + col..][..d];
    for g in 0..kv_heads {
        let keys = &mut pairs.keys[g * d / 2 * t_pad..][..d / 2 * t_pad];
        let (k_col, v_col) = ((heads + g) * d, (heads + kv_heads + g) * d);
        for i in 0..t {
            // SAFETY: `bf16_products_available()` holds (see `attention`); `key` holds d / 2 pairs.
            unsafe { tiles::to_bf16_pairs(row(i, k_col), &mut key) };
            for (c, &pair) in key.iter().enumerate() {
                keys[c * t_pad + i] = pair;
            }
        }
        let values = &mut pairs.values[g * t_pad / 2 * d..][..t_pad / 2 * d];
        for (i, dst) in values.chunks_exact_mut(d).take(t.div_ceil(2)).enumerate() {
            let next = if 2 * i + 1 < t { row(2 * i + 1, v_col) } else { &[] };
            // SAFETY: as above; both rows and `dst` hold d values.
            unsafe { tiles::interleave_bf16(row(2 * i, v_col), next, dst) };
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
            ..
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
            scale_rows(&mut out[first * d..][..TILE_ROWS * d], inv);
        }
        out.truncate(m * d);
    }
}

impl HeadAttention<'_> {
    /// [`simd::Kernel::run`] in bf16 products, from the kv head's `keys` (`[d / 2, t_pad]`
    /// pairs) and `values` (`[t_pad / 2, d]` pairs), `R` query positions a tile: four on the
    /// AVX512_BF16 tiles, or sixteen ([`tiles_amx::QUERIES`]) on AMX's.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and AVX512_BF16, and `d` be a multiple of 32; sixteen a tile
    /// needs [`amx::available`].
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[cfg(target_arch = "x86_64")]
    unsafe fn run_bf16<const R: usize>(self, keys: &[u32], values: &[u32]) {
        use tiles::{TILE_ROWS, TILE_WIDTH};
        let on_amx = R == tiles_amx::QUERIES;
        debug_assert!(on_amx || R == TILE_ROWS);
        let (t, d, stride) = (self.t, self.d, self.stride);
        let HeadScratch {
            queries: q,
            scores,
            out,
            query_pairs,
            weight_pairs,
        } = self.scratch;
        let m = self.queries.len();
        out.clear();
        out.resize(m.div_ceil(R) * R * d, 0.0);
        q.resize(d, 0.0);
        query_pairs.resize(R * d / 2, 0);
        if on_amx {
            // SAFETY: AMX is here (this function's condition); released below.
            unsafe { amx::configure() };
        }
        for (tile, positions) in self.queries.chunks(R).enumerate() {
            // A last, partial tile repeats its last query; those rows are dropped.
            let at = |r: usize| positions[r.min(positions.len() - 1)];
            for (r, qp) in query_pairs.chunks_exact_mut(d / 2).enumerate() {
                for (dst, &src) in q.iter_mut().zip(&self.qkv[at(r) * stride + self.q_col..][..d]) {
                    *dst = src * self.scale;
                }
                // SAFETY: this function's features; `qp` holds d / 2 pairs.
                unsafe { tiles::to_bf16_pairs(q, qp) };
            }
            let seen = (0..R).map(|r| at(r) + 1).max().unwrap_or(1).min(t);
            let n = seen.div_ceil(TILE_WIDTH) * TILE_WIDTH;
            scores.resize(R * n, 0.0);
            // SAFETY (both): `keys` holds d / 2 rows of `t_pad ≥ n` pairs; `scores` R · n; the
            // tiles are configured on AMX.
            unsafe {
                if on_amx {
                    tiles_amx::scores(query_pairs, keys, self.t_pad, d, n, scores)
                } else {
                    let rows = std::array::from_fn(|r| &query_pairs[r * d / 2..][..d / 2]);
                    tiles::scores_bf16(rows, keys, self.t_pad, n, scores)
                }
            };
            // Each row's weights as pairs (AMX's rows in whole tiles of pairs, within the
            // `t_pad / 2` rows of values), zero past its keys.
            let pairs = match on_amx {
                true => seen.div_ceil(2).next_multiple_of(16),
                false => seen.div_ceil(2),
            };
            weight_pairs.clear();
            weight_pairs.resize(R * pairs, 0);
            let mut inv = [0f32; R];
            for (r, (row, wp)) in scores
                .chunks_exact_mut(n)
                .zip(weight_pairs.chunks_exact_mut(pairs))
                .enumerate()
            {
                let window = (at(r) + 1).min(t);
                let valid = self.valid.map(|v| &v[..window]);
                inv[r] = 1.0 / crate::kernels::exp_window::<true>(&mut row[..window], valid, true);
                row[window..].fill(0.0);
                // SAFETY: `wp` holds at least ⌈seen / 2⌉ pairs; the row `n ≥ seen` weights.
                unsafe { tiles::to_bf16_pairs(&row[..seen], &mut wp[..seen.div_ceil(2)]) };
            }
            let y = &mut out[tile * R * d..][..R * d];
            // SAFETY (both): `values` holds `t_pad / 2 ≥ pairs` rows of d pairs; d is a
            // multiple of 32; the tiles are configured on AMX.
            unsafe {
                if on_amx {
                    tiles_amx::weighted_values(weight_pairs, pairs, values, d, y)
                } else {
                    let w = std::array::from_fn(|r| &weight_pairs[r * pairs..][..pairs]);
                    tiles::weighted_values_bf16(w, values, pairs, split4(y, d))
                }
            };
            for (y, inv) in y.chunks_exact_mut(d).zip(inv) {
                y.iter_mut().for_each(|y| *y *= inv);
            }
        }
        if on_amx {
            // SAFETY: configured above.
            unsafe { amx::release() };
        }
        out.truncate(m * d);
    }

    /// Never called: bf16 products are never asked for off x86-64.
    #[cfg(not(target_arch = "x86_64"))]
    unsafe fn run_bf16<const R: usize>(self, _: &[u32], _: &[u32]) {
        unreachable!("bf16 attention off x86-64")
    }
}

/// Each of the four rows of `rows` times its `inv` (the softmax's division, applied to the
/// outputs rather than to the weights).
fn scale_rows(rows: &mut [f32], inv: [f32; 4]) {
    for (y, inv) in rows.chunks_exact_mut(rows.len() / 4).zip(inv) {
        y.iter_mut().for_each(|y| *y *= inv);
    }
}

/// Four consecutive rows of `d` values.
fn split4(rows: &mut [f32], d: usize) -> [&mut [f32]; 4] {
    let (a, rest) = rows.split_at_mut(d);
    let (b, rest) = rest.split_at_mut(d);
    let (c, e) = rest.split_at_mut(d);
    [a, b, c, &mut e[..d]]
}
