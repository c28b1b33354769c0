//! Paged attention of [`super::Cpu`]: a decoding step's rows (a new token of each continuation,
//! or a chunk of a prompt being fed) over the keys and values in the paged KV cache. One task a
//! sequence and key/value head on the thread pool: it widens that sequence's cached keys and
//! values once (every row of the step in the sequence reads them), multiplies the rows' query
//! heads that share the key/value head by them in the CPU's product kernels (on the task's own
//! thread), and takes each row's softmax over the keys up to its own position as
//! [`super::Reference`] does. The reference's own code, a scalar loop a row, a head and a key at
//! a time, took about an eighth of a 0.5B policy's sampling on two cores.

use super::paged::BLOCK;
use super::reference::{round, widen};
use crate::kernels::cpu_inference::product;
use crate::kernels::weights::WeightSlice;
use anyhow::{ensure, Result};
use rayon::prelude::*;
use std::collections::BTreeMap;

/// Where a step's rows are in the paged cache (a [`super::PagedInts`] on the host).
pub(super) struct Places<'a> {
    /// Each row's position in its sequence.
    pub positions: &'a [i32],
    /// Each row's sequence.
    pub seq_of_row: &'a [i32],
    /// Every sequence's blocks, `max_blocks` a sequence.
    pub block_table: &'a [i32],
    pub max_blocks: usize,
}

/// The heads of a layer: query heads, key/value heads, values a head.
#[derive(Clone, Copy)]
pub(super) struct Heads {
    pub heads: usize,
    pub kv_heads: usize,
    pub d: usize,
}

/// `out[row, h]` = attention of row `row`'s query head `h` (in `qkv`, `rows` rows of
/// `[q | k | v]`) over its sequence's cached keys `k` and values `v` (`kv_heads · d` a slot) at
/// positions `0..=position`.
pub(super) fn forward(qkv: &[u16], (k, v): (&[u16], &[u16]), out: &mut [u16], at: &Places, rows: usize, h: Heads) -> Result<()> {
    let Heads { heads, kv_heads, d } = h;
    ensure!(
        kv_heads > 0 && heads.is_multiple_of(kv_heads) && d > 0,
        "{heads} query heads cannot share {kv_heads} key/value heads"
    );
    let width = (heads + 2 * kv_heads) * d;
    ensure!(
        qkv.len() >= rows * width && out.len() >= rows * heads * d,
        "a buffer too short"
    );
    ensure!(
        at.positions.len() >= rows && at.seq_of_row.len() >= rows,
        "fewer positions than rows"
    );
    let mut by_seq: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for row in 0..rows {
        ensure!(at.seq_of_row[row] >= 0 && at.positions[row] >= 0, "row {row}: a negative sequence or position");
        by_seq.entry(at.seq_of_row[row] as usize).or_default().push(row);
    }
    let tasks: Vec<(usize, &[usize], usize)> = by_seq
        .iter()
        .flat_map(|(&seq, rs)| (0..kv_heads).map(move |g| (seq, rs.as_slice(), g)))
        .collect();
    let results: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|&(seq, rs, g)| group(qkv, (k, v), at, h, (seq, rs, g)))
        .collect::<Result<_>>()?;
    let per = heads / kv_heads;
    for ((_, rs, g), o) in tasks.iter().zip(results) {
        for (i, head_out) in o.chunks_exact(d).enumerate() {
            let (row, head) = (rs[i / per], g * per + i % per);
            let dst = &mut out[row * heads * d + head * d..][..d];
            dst.iter_mut().zip(head_out).for_each(|(y, &x)| *y = round(x));
        }
    }
    Ok(())
}

/// The outputs `[rows of rs × query heads of group g, d]` (row-major by row, then head) of the
/// rows `rs` of sequence `seq` for key/value head `g`.
fn group(qkv: &[u16], (k, v): (&[u16], &[u16]), at: &Places, h: Heads, (seq, rs, g): (usize, &[usize], usize)) -> Result<Vec<f32>> {
    let Heads { heads, kv_heads, d } = h;
    let (width, kvw, per) = ((heads + 2 * kv_heads) * d, kv_heads * d, heads / kv_heads);
    let len = rs.iter().map(|&r| at.positions[r] as usize + 1).max().unwrap_or(0);
    let (mut keys, mut values) = (Vec::with_capacity(len * d), Vec::with_capacity(len * d));
    for key in 0..len {
        let entry = seq * at.max_blocks + key / BLOCK;
        let block = at.block_table.get(entry).copied().unwrap_or(-1);
        ensure!(
            block >= 0 && key / BLOCK < at.max_blocks,
            "sequence {seq}: position {key} has no cache block"
        );
        let from = (block as usize * BLOCK + key % BLOCK) * kvw + g * d;
        ensure!(from + d <= k.len() && from + d <= v.len(), "a cache block past the pool's end");
        keys.extend(k[from..from + d].iter().map(|&b| widen(b)));
        values.extend(v[from..from + d].iter().map(|&b| widen(b)));
    }
    let m = rs.len() * per;
    let mut q = Vec::with_capacity(m * d);
    for &r in rs {
        for head in g * per..(g + 1) * per {
            q.extend(qkv[r * width + head * d..][..d].iter().map(|&b| widen(b)));
        }
    }
    let mut p = times_t(&q, &keys, (m, len, d));
    let scale = 1.0 / (d as f32).sqrt();
    for (i, row) in p.chunks_exact_mut(len).enumerate() {
        softmax_prefix(row, at.positions[rs[i / per]] as usize + 1, scale);
    }
    Ok(times_t(&p, &transposed(&values, len, d), (m, d, len)))
}

/// `a [m, k] · bᵀ` for `b` `[n, k]` (f32), on this thread.
fn times_t(a: &[f32], b: &[f32], (m, n, k): (usize, usize, usize)) -> Vec<f32> {
    let mut out = vec![0f32; m * n];
    product(&mut out, a, WeightSlice::F32(b), (m, n, k), false, false);
    out
}

/// A row of scores made the softmax of its first `seen` values scaled by `scale`, zero past
/// them (a causal row: the keys up to its own position), as [`super::Reference`] computes it.
fn softmax_prefix(row: &mut [f32], seen: usize, scale: f32) {
    let (seen, future) = row.split_at_mut(seen);
    seen.iter_mut().for_each(|s| *s *= scale);
    let max = seen.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    seen.iter_mut().for_each(|s| *s = (*s - max).exp());
    let total: f32 = seen.iter().sum();
    seen.iter_mut().for_each(|s| *s /= total);
    future.fill(0.0);
}

/// `src` `[rows, cols]` transposed to `[cols, rows]`, in blocks that stay in cache.
fn transposed(src: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    const B: usize = 32;
    let mut out = vec![0f32; rows * cols];
    if out.is_empty() {
        return out;
    }
    out.par_chunks_mut(B * rows).enumerate().for_each(|(cb, block)| {
        let c0 = cb * B;
        let width = block.len() / rows.max(1);
        for r0 in (0..rows).step_by(B) {
            for c in 0..width {
                for r in r0..(r0 + B).min(rows) {
                    block[c * rows + r] = src[r * cols + c0 + c];
                }
            }
        }
    });
    out
}
