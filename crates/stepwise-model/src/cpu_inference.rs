//! The decoder's inference forward on the CPU, one whole sequence per thread.
//!
//! Through candle, a layer is about fifteen tensor ops, and each one allocates its output and
//! forks and joins the thread pool. For the models of the lab and the fixtures that overhead,
//! not arithmetic, was most of a scoring pass: two threads ran only 1.25× as fast as one. Here
//! each thread takes whole sequences through every layer on buffers it reuses:
//! - gemm computes the projections, with each bias preloaded and each residual accumulated in place;
//! - rotary positions are applied in place;
//! - attention runs in register tiles of four queries ([`crate::ops::tiles`]);
//! - the fused norm and SwiGLU kernels run row by row.
//!
//! With fewer sequences than threads (and when not already on a pool thread, as the lab's
//! parallel Monte Carlo rollouts are), the threads share each sequence instead: gemm splits its
//! work and the heads run in parallel.
//!
//! The maths is the candle path's (the same parity tests cover both). It runs
//! when nothing needs a gradient, the weights are f32 on the CPU and no cached positions come
//! first (scoring, and the prefill of generation).

use crate::ops::{simd, tiles, KeyMask, Linear};
use candle_core::{CpuStorage, Layout, Storage, Tensor};
use rayon::prelude::*;
use std::sync::RwLockReadGuard;

/// The sizes of the decoder.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub eps: f32,
}

impl Dims {
    /// Width of a row of the fused q|k|v buffer.
    fn qkv_width(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.head_dim
    }
}

/// The tensors of one layer, as the candle modules hold them.
pub(crate) struct LayerTensors<'t> {
    pub ln1: &'t Tensor,
    pub q: &'t Linear,
    pub k: &'t Linear,
    pub v: &'t Linear,
    pub o: &'t Linear,
    pub ln2: &'t Tensor,
    pub gate: &'t Linear,
    pub up: &'t Linear,
    pub down: &'t Linear,
}

/// A read lock on a tensor's storage.
struct Locked<'t>(RwLockReadGuard<'t, Storage>, &'t Layout);

impl<'t> Locked<'t> {
    /// `None` unless the tensor is contiguous f32 on the CPU.
    fn new(t: &'t Tensor) -> Option<Self> {
        let (guard, layout) = t.storage_and_layout();
        let ok = matches!(&*guard, Storage::Cpu(CpuStorage::F32(_))) && layout.contiguous_offsets().is_some();
        ok.then_some(Locked(guard, layout))
    }

    fn slice(&self) -> &[f32] {
        let Storage::Cpu(CpuStorage::F32(data)) = &*self.0 else {
            unreachable!("checked in Locked::new")
        };
        let (start, end) = self.1.contiguous_offsets().expect("checked in Locked::new");
        &data[start..end]
    }
}

/// One layer's weights as slices (weights `[out, in]`, biases `[out]`).
struct LayerWeights<'a> {
    ln1: &'a [f32],
    /// q, k and v: weight and optional bias.
    qkv: [(&'a [f32], Option<&'a [f32]>); 3],
    o: &'a [f32],
    ln2: &'a [f32],
    gate: &'a [f32],
    up: &'a [f32],
    down: &'a [f32],
}

/// Everything a forward pass reads.
struct Weights<'a> {
    dims: Dims,
    embed: &'a [f32],
    layers: Vec<LayerWeights<'a>>,
    norm: &'a [f32],
    /// Rotary tables `[max_positions, head_dim / 2]`.
    cos: &'a [f32],
    sin: &'a [f32],
}

/// The decoder's tensors, borrowed for one forward pass.
pub(crate) struct Decoder<'t> {
    pub dims: Dims,
    pub embed: &'t Tensor,
    pub layers: Vec<LayerTensors<'t>>,
    pub norm: &'t Tensor,
    pub cos: &'t [f32],
    pub sin: &'t [f32],
}

/// Per layer, the keys (after rotation) and values of every sequence, `[b, kv_heads, t, d]`.
pub(crate) type KvRows = Vec<(Vec<f32>, Vec<f32>)>;

/// Hidden states `[b, t, hidden]` (after the final norm) of token ids `ids` (`b` rows of `t`),
/// and with `want_cache` every layer's keys and values; `None` when a weight is not contiguous
/// f32 on the CPU (the caller takes the candle path).
pub(crate) fn forward(
    decoder: &Decoder,
    ids: &[u32],
    b: usize,
    mask: &KeyMask,
    want_cache: bool,
    read: Option<&[Vec<usize>]>,
) -> Option<(Vec<f32>, KvRows)> {
    // Only q, k and v may have a bias (Qwen2); anything else takes the candle path.
    let other_bias = |l: &LayerTensors| [l.o, l.gate, l.up, l.down].iter().any(|lin| lin.bias().is_some());
    if decoder.layers.iter().any(other_bias) {
        return None;
    }
    let mut locked = vec![Locked::new(decoder.embed)?, Locked::new(decoder.norm)?];
    for l in &decoder.layers {
        for t in [l.ln1, l.ln2] {
            locked.push(Locked::new(t)?);
        }
        for lin in [l.q, l.k, l.v, l.o, l.gate, l.up, l.down] {
            locked.push(Locked::new(lin.weight())?);
            if let Some(bias) = lin.bias() {
                locked.push(Locked::new(bias)?);
            }
        }
    }
    let mut slices = locked.iter().map(Locked::slice);
    let mut next = || slices.next().expect("one slice per locked tensor");
    let (embed, norm) = (next(), next());
    let layers = decoder
        .layers
        .iter()
        .map(|l| {
            let (ln1, ln2) = (next(), next());
            let mut linear = |lin: &Linear| (next(), lin.bias().map(|_| next()));
            let (q, k, v) = (linear(l.q), linear(l.k), linear(l.v));
            let (o, gate, up, down) = (linear(l.o).0, linear(l.gate).0, linear(l.up).0, linear(l.down).0);
            LayerWeights {
                ln1,
                qkv: [q, k, v],
                o,
                ln2,
                gate,
                up,
                down,
            }
        })
        .collect();
    let weights = Weights {
        dims: decoder.dims,
        embed,
        layers,
        norm,
        cos: decoder.cos,
        sin: decoder.sin,
    };
    Some(run(&weights, ids, b, mask, want_cache, read))
}

/// Buffers one thread reuses across layers and sequences.
#[derive(Default)]
struct Scratch {
    /// The residual stream when only some rows are read.
    x: Vec<f32>,
    /// The query rows of a full layer, `0..t`.
    queries: Vec<usize>,
    normed: Vec<f32>,
    qkv: Vec<f32>,
    attn: Vec<f32>,
    mlp: Vec<f32>,
    keys_t: Vec<f32>,
    head: HeadScratch,
}

/// One head's attention buffers.
#[derive(Default)]
struct HeadScratch {
    scores: Vec<f32>,
    out: Vec<f32>,
}

thread_local! {
    /// This thread's buffers, kept between forward passes (fresh ones would be page-faulted in
    /// on every pass).
    static SCRATCH: std::cell::RefCell<Scratch> = Default::default();
}

/// Runs `f` on this thread's scratch buffers, or on fresh ones when they are in use (a thread
/// pool worker waiting inside one forward pass may be handed another).
fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut mine) => f(&mut mine),
        Err(_) => f(&mut Scratch::default()),
    })
}

fn run(
    w: &Weights,
    ids: &[u32],
    b: usize,
    mask: &KeyMask,
    want_cache: bool,
    read: Option<&[Vec<usize>]>,
) -> (Vec<f32>, KvRows) {
    let t = ids.len() / b;
    let Dims {
        hidden,
        kv_heads,
        head_dim,
        ..
    } = w.dims;
    // Each sequence's output: all its positions, or the rows it reads.
    let out_rows: Vec<usize> = (0..b).map(|bi| read.map_or(t, |r| r[bi].len())).collect();
    let mut out = vec![0f32; out_rows.iter().sum::<usize>() * hidden];
    let mut outs: Vec<&mut [f32]> = Vec::with_capacity(b);
    let mut rest = out.as_mut_slice();
    for &n in &out_rows {
        let (mine, tail) = rest.split_at_mut(n * hidden);
        outs.push(mine);
        rest = tail;
    }
    let kv_len = kv_heads * t * head_dim;
    let mut cache: KvRows = if want_cache {
        (0..w.layers.len())
            .map(|_| (vec![0f32; b * kv_len], vec![0f32; b * kv_len]))
            .collect()
    } else {
        Vec::new()
    };
    // Each sequence's share of every layer's keys and values.
    let mut shares: Vec<Vec<(&mut [f32], &mut [f32])>> = (0..b).map(|_| Vec::new()).collect();
    for (k, v) in cache.iter_mut() {
        for (share, kv) in shares.iter_mut().zip(k.chunks_mut(kv_len).zip(v.chunks_mut(kv_len))) {
            share.push(kv);
        }
    }
    let job = |bi: usize, out: &mut [f32], share, shared: bool| {
        let valid = mask.valid.as_deref().map(|v| &v[bi * t..][..t]);
        let ids = &ids[bi * t..][..t];
        let read = read.map(|r| r[bi].as_slice());
        with_scratch(|scratch| sequence(w, ids, valid, read, out, share, scratch, shared))
    };
    // One sequence per thread when there are enough of them, or when this pass already runs on
    // a pool thread (its siblings are busy with passes of their own); else the threads share
    // each sequence.
    if b >= rayon::current_num_threads() || rayon::current_thread_index().is_some() {
        outs.into_par_iter()
            .zip(shares)
            .enumerate()
            .for_each(|(bi, (out, share))| job(bi, out, share, false));
    } else {
        for (bi, (out, share)) in outs.into_iter().zip(shares).enumerate() {
            job(bi, out, share, true);
        }
    }
    (out, cache)
}

/// One sequence through every layer. `out` receives the hidden states of every position
/// (`[t, hidden]`), or with `read` those of the positions listed (`[read.len(), hidden]`: the
/// last layer then runs its queries, MLP and norm for those rows only). `cache` (empty, or one
/// `([kv, t, d], [kv, t, d])` pair per layer) receives the keys and values. `shared`: the threads
/// work on this sequence together.
#[allow(clippy::too_many_arguments)]
fn sequence(
    w: &Weights,
    ids: &[u32],
    valid: Option<&[bool]>,
    read: Option<&[usize]>,
    out: &mut [f32],
    mut cache: Vec<(&mut [f32], &mut [f32])>,
    s: &mut Scratch,
    shared: bool,
) {
    let dims = w.dims;
    let Dims {
        hidden: h,
        heads,
        kv_heads,
        head_dim: d,
        eps,
        ..
    } = dims;
    let t = ids.len();
    let qkv_w = dims.qkv_width();
    // The residual stream of every position: `out` itself unless only some rows are read.
    let mut all_rows = std::mem::take(&mut s.x);
    let (x, mut selected): (&mut [f32], Option<&mut [f32]>) = match read {
        Some(_) => {
            all_rows.resize(t * h, 0.0);
            (&mut all_rows, Some(out))
        }
        None => (out, None),
    };
    for (row, &id) in x.chunks_exact_mut(h).zip(ids) {
        row.copy_from_slice(&w.embed[id as usize * h..][..h]);
    }
    let parallelism = if shared {
        gemm::Parallelism::Rayon(rayon::current_num_threads())
    } else {
        gemm::Parallelism::None
    };
    s.normed.resize(t * h, 0.0);
    s.qkv.resize(t * qkv_w, 0.0);
    s.mlp.resize(t * 2 * dims.intermediate, 0.0);
    s.queries.clear();
    s.queries.extend(0..t);
    let last = w.layers.len() - 1;
    for (li, l) in w.layers.iter().enumerate() {
        rms_norm_rows(x, l.ln1, eps, &mut s.normed);
        let mut col = 0;
        for (weight, bias) in l.qkv {
            let n = weight.len() / h;
            if let Some(bias) = bias {
                for row in s.qkv.chunks_exact_mut(qkv_w) {
                    row[col..col + n].copy_from_slice(bias);
                }
            }
            let dst = Rows::new(&mut s.qkv[col..], qkv_w, n);
            matmul_t(dst, &s.normed, h, weight, bias.is_some(), parallelism);
            col += n;
        }
        rotate(&mut s.qkv, qkv_w, (heads + kv_heads) * d, d, w.cos, w.sin);
        if let Some((k, v)) = cache.get_mut(li) {
            for (c, dst) in [(heads * d, &mut **k), ((heads + kv_heads) * d, &mut **v)] {
                for (g, head) in dst.chunks_exact_mut(t * d).enumerate() {
                    for (i, row) in head.chunks_exact_mut(d).enumerate() {
                        row.copy_from_slice(&s.qkv[i * qkv_w + c + g * d..][..d]);
                    }
                }
            }
        }
        let attend = |queries: &[usize], s: &mut Scratch| {
            let (keys_t, head, attn) = (&mut s.keys_t, &mut s.head, &mut s.attn);
            attention(&s.qkv, t, queries, dims, valid, keys_t, head, attn, shared);
        };
        match (read, selected.as_deref_mut()) {
            (Some(rows), Some(sel)) if li == last => {
                // Only the rows read go on: their residuals move to `out`.
                attend(rows, s);
                for (dst, &i) in sel.chunks_exact_mut(h).zip(rows) {
                    dst.copy_from_slice(&x[i * h..][..h]);
                }
                finish_block(l, dims, sel, s, parallelism);
            }
            _ => {
                let queries = std::mem::take(&mut s.queries);
                attend(&queries, s);
                s.queries = queries;
                finish_block(l, dims, x, s, parallelism);
            }
        }
    }
    let result: &mut [f32] = match selected {
        Some(sel) => sel,
        None => x,
    };
    let n = result.len();
    rms_norm_rows(result, w.norm, eps, &mut s.normed[..n]);
    result.copy_from_slice(&s.normed[..n]);
    s.x = all_rows;
}

/// The rest of a block after attention, for the rows of `x` (`[rows, hidden]`, whose attention
/// outputs are in `s.attn`): output projection into the residual, then the MLP.
fn finish_block(l: &LayerWeights, dims: Dims, x: &mut [f32], s: &mut Scratch, parallelism: gemm::Parallelism) {
    let (h, inter) = (dims.hidden, dims.intermediate);
    let rows = x.len() / h;
    if rows == 0 {
        return;
    }
    let (normed, mlp) = (&mut s.normed[..rows * h], &mut s.mlp[..rows * 2 * inter]);
    matmul_t(
        Rows::new(x, h, h),
        &s.attn,
        dims.heads * dims.head_dim,
        l.o,
        true,
        parallelism,
    );
    rms_norm_rows(x, l.ln2, dims.eps, normed);
    matmul_t(Rows::new(mlp, 2 * inter, inter), normed, h, l.gate, false, parallelism);
    matmul_t(
        Rows::new(&mut mlp[inter..], 2 * inter, inter),
        normed,
        h,
        l.up,
        false,
        parallelism,
    );
    simd::dispatch(SwiGluRows {
        rows: mlp,
        width: inter,
    });
    matmul_t(Rows::new(x, h, h), mlp, 2 * inter, l.down, true, parallelism);
}

/// Rows of `width` values, `stride` apart, at the start of `data`.
struct Rows<'a> {
    data: &'a mut [f32],
    stride: usize,
    width: usize,
}

impl<'a> Rows<'a> {
    fn new(data: &'a mut [f32], stride: usize, width: usize) -> Self {
        Rows { data, stride, width }
    }
}

/// `dst = a · wᵀ` (or `dst += a · wᵀ` when `accumulate`) for `a` rows of `k` values `a_stride`
/// apart and `w` `[dst.width, k]`: one row of `dst` per row of `a`.
fn matmul_t(dst: Rows, a: &[f32], a_stride: usize, w: &[f32], accumulate: bool, parallelism: gemm::Parallelism) {
    let n = dst.width;
    let k = w.len() / n;
    let m = dst.data.len().checked_sub(n).map_or(0, |rest| rest / dst.stride + 1);
    assert!(m == 0 || (a.len() >= (m - 1) * a_stride + k && dst.data.len() >= (m - 1) * dst.stride + n));
    if m == 0 {
        return;
    }
    // SAFETY: the asserted bounds keep every access inside `dst`, `a` and `w`; `dst` is borrowed
    // mutably, so it overlaps neither input.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.data.as_mut_ptr(),
            1,
            dst.stride as isize,
            accumulate,
            a.as_ptr(),
            1,
            a_stride as isize,
            w.as_ptr(),
            k as isize,
            1,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        )
    }
}

/// RMSNorm of every row of `x` (rows of `w.len()`) into `y`.
fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    simd::dispatch(RmsNormRows { x, w, eps, y });
}

struct RmsNormRows<'a> {
    x: &'a [f32],
    w: &'a [f32],
    eps: f32,
    y: &'a mut [f32],
}

impl simd::Kernel for RmsNormRows<'_> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        let n = self.w.len();
        for (y, x) in self.y.chunks_exact_mut(n).zip(self.x.chunks_exact(n)) {
            let r = 1.0 / (simd::sum_of_squares::<FMA>(x) / n as f32 + self.eps).sqrt();
            for ((y, x), w) in y.iter_mut().zip(x).zip(self.w) {
                *y = x * r * w;
            }
        }
    }
}

/// `silu(gate) · up` for rows `[gate | up]` of `2 · width`, written over the gate half.
struct SwiGluRows<'a> {
    rows: &'a mut [f32],
    width: usize,
}

impl simd::Kernel for SwiGluRows<'_> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        for row in self.rows.chunks_exact_mut(2 * self.width) {
            let (gate, up) = row.split_at_mut(self.width);
            crate::ops::swiglu_into::<FMA>(gate, up);
        }
    }
}

/// Rotary positions on the first `width` values (the q and k heads) of every row, row `i` at
/// position `i`, heads of `d` values in the half-split layout of Qwen2/Llama.
fn rotate(rows: &mut [f32], stride: usize, width: usize, d: usize, cos: &[f32], sin: &[f32]) {
    let half = d / 2;
    for (p, row) in rows.chunks_exact_mut(stride).enumerate() {
        let (cos, sin) = (&cos[p * half..][..half], &sin[p * half..][..half]);
        for head in row[..width].chunks_exact_mut(d) {
            let (a, b) = head.split_at_mut(half);
            for j in 0..half {
                let (x, y) = (a[j], b[j]);
                a[j] = x * cos[j] - y * sin[j];
                b[j] = y * cos[j] + x * sin[j];
            }
        }
    }
}

/// Causal attention of one sequence from its q|k|v rows (`[t, qkv_width]`, rotated), for the
/// query positions `queries`, into `out` (`[queries.len(), heads · d]`). `keys_t` and `head` are
/// scratch; `shared`: heads run in parallel.
#[allow(clippy::too_many_arguments)]
fn attention(
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
        let HeadScratch { scores, out } = self.scratch;
        let m = self.queries.len();
        out.clear();
        out.resize(m.div_ceil(TILE_ROWS) * TILE_ROWS * d, 0.0);
        let mut q = vec![0f32; TILE_ROWS * d];
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
                inv[r] = 1.0 / crate::ops::exp_window::<FMA>(&mut row[..window], valid, true);
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

#[cfg(test)]
mod tests {
    use crate::config::{HeadKind, ModelConfig};
    use crate::transformer::KvCache;
    use crate::Model;
    use candle_core::{Device, Tensor};
    use candle_nn::VarMap;

    /// A random model whose every weight (biases included) is non-trivial.
    fn model(hidden: usize, heads: usize, kv_heads: usize) -> Model {
        let cfg = ModelConfig::tiny(50, hidden, 2, heads, kv_heads, HeadKind::CausalLm);
        let varmap = VarMap::new();
        let m = Model::fresh(cfg, &varmap, &Device::Cpu, 3).unwrap();
        for (name, var) in varmap.data().lock().unwrap().iter() {
            let base = if name.contains("norm") { 1.0 } else { 0.0 };
            let noise = Tensor::randn(base, 0.3f32, var.shape(), &Device::Cpu).unwrap();
            var.set(&noise).unwrap();
        }
        m
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar().unwrap()
    }

    /// The fast path (whole sequences per thread, or threads sharing one sequence) gives the
    /// hidden states and the prefill cache of the candle path, with padding, grouped-query
    /// heads, q/k/v biases, and head sizes on and off the vector tiles.
    #[test]
    fn the_cpu_path_matches_the_candle_path() {
        for (hidden, heads, kv_heads) in [(64, 4, 2), (48, 4, 1)] {
            let mut m = model(hidden, heads, kv_heads);
            for (b, t) in [(1, 21), (3, 37)] {
                let ids: Vec<u32> = (0..b * t).map(|i| ((i * 17) % 49) as u32 + 1).collect();
                let ids = Tensor::from_vec(ids, (b, t), &Device::Cpu).unwrap();
                // The last sequence is left-padded by five positions.
                let pad: Vec<f32> = (0..b * t)
                    .map(|i| if i / t == b - 1 && i % t < 5 { 0.0 } else { 1.0 })
                    .collect();
                let pad = Tensor::from_vec(pad, (b, t), &Device::Cpu).unwrap();
                let mut run = |training: bool| {
                    m.set_training(training);
                    let mut cache = KvCache::default();
                    let h = m.hidden(&ids, Some(&pad), Some(&mut cache)).unwrap();
                    (h, cache)
                };
                let (fast, fast_cache) = run(false);
                let (slow, slow_cache) = run(true);
                let case = format!("hidden {hidden}, heads {heads}/{kv_heads}, batch {b}");
                assert!(max_diff(&fast, &slow) < 1e-4, "{case}: {}", max_diff(&fast, &slow));
                for (f, s) in fast_cache.layers.iter().zip(&slow_cache.layers) {
                    let ((fk, fv), (sk, sv)) = (f.as_ref().unwrap(), s.as_ref().unwrap());
                    assert!(max_diff(fk, sk) < 1e-4 && max_diff(fv, sv) < 1e-4, "{case}: cache");
                }
                // Reading some rows (in any order, none for one sequence) gives those rows.
                let rows: Vec<Vec<usize>> = (0..b)
                    .map(|i| match i {
                        1 => Vec::new(),
                        _ => vec![t - 1, 0, 7, 7, t / 2, 3, 9],
                    })
                    .collect();
                m.set_training(false);
                let read = m.hidden_rows(&ids, Some(&pad), &rows).unwrap();
                let picked: Vec<Tensor> = rows
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        let idx = Tensor::new(r.iter().map(|&p| p as u32).collect::<Vec<_>>(), &Device::Cpu).unwrap();
                        slow.get(i).unwrap().index_select(&idx, 0).unwrap()
                    })
                    .collect();
                let want = Tensor::cat(&picked, 0).unwrap();
                assert!(max_diff(&read, &want) < 1e-4, "{case}: rows {}", max_diff(&read, &want));
            }
        }
    }
}
