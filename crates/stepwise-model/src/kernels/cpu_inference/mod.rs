//! The decoder's inference forward on the CPU, one whole sequence per thread.
//!
//! Through candle, a layer is about fifteen tensor ops, and each one allocates its output and
//! forks and joins the thread pool. For the models of the lab and the fixtures that overhead,
//! not arithmetic, was most of a scoring pass: two threads ran only 1.25× as fast as one. Here
//! each thread takes whole sequences through every layer on buffers it reuses:
//! - the projections run in AVX-512 tiles ([`crate::kernels::sgemm`]) for real-size models and in
//!   gemm's kernels otherwise, with each bias preloaded and each residual accumulated in place;
//! - rotary positions are applied in place;
//! - attention runs in register tiles of four queries ([`crate::kernels::tiles`]);
//! - the fused norm and SwiGLU kernels run row by row.
//!
//! With fewer sequences than threads (and when not already on a pool thread, as the lab's
//! parallel Monte Carlo rollouts are), the threads share each sequence instead: each takes a
//! block of rows of every product (or gemm splits a short one) and the heads run in parallel.
//! A packed pass of many short sequences runs them joined ([`joined`]): every product over all
//! their rows at once, attention per sequence.
//!
//! The maths is the candle path's (the same parity tests cover both). It runs
//! when nothing needs a gradient, the weights are f32 on the CPU and no cached positions come
//! first (scoring, and the prefill of generation).

mod attention;
mod joined;
mod rows;
mod shared;
#[cfg(test)]
mod tests;

use crate::kernels::weights::WeightSlice;
use crate::kernels::{sgemm, simd, KeyMask, Linear};
use crate::packed::Packed;
use attention::{attention, HeadScratch};
use candle_core::{CpuStorage, Layout, Storage, Tensor};
use rows::{matmul_t, rms_norm_rows, rotate, Rows, SwiGluRows};
use std::sync::RwLockReadGuard;

/// `dst = a · wᵀ` (or `+=` with `accumulate`) for `a` `[m, k]` and `w` `[n, k]`, both
/// contiguous, `dst` `[m, n]`: the kernels of the inference forward (AVX-512 tiles, bf16
/// products where `w` asks for them and the CPU can, else gemm's), on the whole thread pool when
/// `threads`, else on this thread. For the packed engine's CPU backend.
pub(crate) fn product(
    dst: &mut [f32],
    a: &[f32],
    w: WeightSlice,
    (m, n, k): (usize, usize, usize),
    accumulate: bool,
    threads: bool,
) {
    assert!(dst.len() >= m * n && a.len() >= m * k && w.len() >= n * k, "product of [{m}, {k}] by [{n}, {k}]");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            dst[..m * n].fill(0.0);
        }
        return;
    }
    let parallelism = match threads {
        true => gemm::Parallelism::Rayon(rayon::current_num_threads()),
        false => gemm::Parallelism::None,
    };
    matmul_t(Rows::new(&mut dst[..m * n], n, n), &a[..m * k], k, w.slice(0..n * k), accumulate, parallelism);
}

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

/// A read lock on a tensor's storage (and, for a weight, whether a bf16 one multiplies in bf16).
struct Locked<'t>(RwLockReadGuard<'t, Storage>, &'t Layout, bool);

impl<'t> Locked<'t> {
    /// `None` unless the tensor is contiguous f32 on the CPU.
    fn new(t: &'t Tensor) -> Option<Self> {
        let (guard, layout) = t.storage_and_layout();
        let ok = matches!(&*guard, Storage::Cpu(CpuStorage::F32(_))) && layout.contiguous_offsets().is_some();
        ok.then_some(Locked(guard, layout, false))
    }

    /// A weight matrix: `None` unless contiguous f32, bf16 or f16 on the CPU; a bf16 one
    /// multiplies in bf16 when `bf16_products` and the CPU can.
    fn weight(t: &'t Tensor, bf16_products: bool) -> Option<Self> {
        let (guard, layout) = t.storage_and_layout();
        let ok = matches!(&*guard, Storage::Cpu(s) if WeightSlice::from_storage(s, layout, bf16_products).is_some());
        ok.then_some(Locked(guard, layout, bf16_products))
    }

    fn weights(&self) -> WeightSlice<'_> {
        let Storage::Cpu(s) = &*self.0 else {
            unreachable!("checked in Locked::weight")
        };
        WeightSlice::from_storage(s, self.1, self.2).expect("checked in Locked::weight")
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
    qkv: [(WeightSlice<'a>, Option<&'a [f32]>); 3],
    o: WeightSlice<'a>,
    ln2: &'a [f32],
    gate: WeightSlice<'a>,
    up: WeightSlice<'a>,
    down: WeightSlice<'a>,
}

/// Everything a forward pass reads.
struct Weights<'a> {
    dims: Dims,
    embed: WeightSlice<'a>,
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

/// The keys and values of positions already encoded, which the new tokens continue: per layer,
/// `[b, kv_heads, len, d]` each.
pub(crate) struct Prefix {
    /// Cached positions.
    pub len: usize,
    /// Per layer, keys and values.
    pub layers: KvRows,
}

/// Hidden states `[b, t, hidden]` (after the final norm) of token ids `ids` (`b` rows of `t`),
/// or with `read` only those at positions `read[i]` of each sequence `i`, stacked
/// `[Σ read, hidden]`; with `want_cache` also every layer's keys and values (of the prefix and
/// the new tokens). The new tokens continue `prefix` when given (`mask` then covers both).
/// `None` when a weight is not contiguous f32 on the CPU (the caller takes the candle path).
pub(crate) fn forward(
    decoder: &Decoder,
    ids: &[u32],
    b: usize,
    mask: &KeyMask,
    want_cache: bool,
    read: Option<&[Vec<usize>]>,
    prefix: Option<&Prefix>,
) -> Option<(Vec<f32>, KvRows)> {
    with_weights(decoder, |weights| run(weights, ids, b, mask, want_cache, read, prefix))
}

/// The hidden states (after the final norm) at positions `read[i]` of each sequence `i` of a
/// packed batch, stacked `[Σ read, hidden]`: each sequence runs alone on its own tokens, with no
/// padding to skip. `None` when a weight is not contiguous on the CPU.
pub(crate) fn forward_packed(decoder: &Decoder, batch: &Packed, read: &[Vec<usize>]) -> Option<Vec<f32>> {
    with_weights(decoder, |w| {
        let hidden = w.dims.hidden;
        let mut out = vec![0f32; read.iter().map(Vec::len).sum::<usize>() * hidden];
        if let Some(groups) = joined::plan(batch, hidden) {
            joined::forward(w, &groups, read, &mut out);
            return out;
        }
        let mut rest = out.as_mut_slice();
        let work = batch
            .sequences()
            .zip(read)
            .map(|(ids, r)| {
                let (mine, tail) = std::mem::take(&mut rest).split_at_mut(r.len() * hidden);
                rest = tail;
                Work {
                    ids,
                    valid: None,
                    read: Some(r.as_slice()),
                    before: Vec::new(),
                    out: mine,
                    cache: Vec::new(),
                }
            })
            .collect();
        run_sequences(w, 0, work);
        out
    })
}

/// `f` over the decoder's weights, each locked and borrowed as a slice; `None` (without calling
/// `f`) when one is not contiguous f32 (or, for matrices, bf16 or f16) on the CPU, or a product
/// other than q, k and v has a bias.
fn with_weights<R>(decoder: &Decoder, f: impl FnOnce(&Weights) -> R) -> Option<R> {
    // Only q, k and v may have a bias (Qwen2); anything else takes the candle path.
    let other_bias = |l: &LayerTensors| [l.o, l.gate, l.up, l.down].iter().any(|lin| lin.bias().is_some());
    if decoder.layers.iter().any(other_bias) {
        return None;
    }
    // Norms and biases (f32 at load) in order, then the weight matrices (f32, bf16 or f16).
    let mut vectors = vec![Locked::new(decoder.norm)?];
    // The embedding's rows are only read (widened), never multiplied.
    let mut matrices = vec![Locked::weight(decoder.embed, false)?];
    for l in &decoder.layers {
        for t in [l.ln1, l.ln2] {
            vectors.push(Locked::new(t)?);
        }
        for lin in [l.q, l.k, l.v, l.o, l.gate, l.up, l.down] {
            matrices.push(Locked::weight(lin.weight(), lin.bf16_products())?);
            if let Some(bias) = lin.bias() {
                vectors.push(Locked::new(bias)?);
            }
        }
    }
    let mut vectors = vectors.iter().map(Locked::slice);
    let mut vector = || vectors.next().expect("one slice per locked vector");
    let mut matrices = matrices.iter().map(Locked::weights);
    let mut matrix = || matrices.next().expect("one slice per locked matrix");
    let (embed, norm) = (matrix(), vector());
    let layers = decoder
        .layers
        .iter()
        .map(|l| {
            let (ln1, ln2) = (vector(), vector());
            let mut linear = |lin: &Linear| (matrix(), lin.bias().map(|_| vector()));
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
    Some(f(&weights))
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
    /// A joined pass's attention outputs, every sequence's rows ([`joined`]).
    attended: Vec<f32>,
    /// A joined pass's q|k|v rows of one sequence that shares a prefix ([`shared`]).
    gathered: Vec<f32>,
    mlp: Vec<f32>,
    keys_t: Vec<f32>,
    key_pairs: attention::Bf16Keys,
    head: HeadScratch,
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
    prefix: Option<&Prefix>,
) -> (Vec<f32>, KvRows) {
    let t = ids.len() / b;
    let p = prefix.map_or(0, |x| x.len);
    let total = p + t;
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
    let kv_len = kv_heads * total * head_dim;
    let prefix_len = kv_heads * p * head_dim;
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
    let valid_of = |bi: usize| mask.valid.as_deref().map(|v| &v[bi * total..][..total]);
    let real_len: Vec<usize> = (0..b)
        .map(|bi| match valid_of(bi) {
            Some(v) if !want_cache => real_length(&v[p..], read.map(|r| r[bi].as_slice())),
            _ => t,
        })
        .collect();
    let work = outs
        .into_iter()
        .zip(shares)
        .enumerate()
        .map(|(bi, (out, cache))| {
            let real = real_len[bi];
            Work {
                ids: &ids[bi * t..][..real],
                valid: valid_of(bi).map(|v| &v[..p + real]),
                read: read.map(|r| r[bi].as_slice()),
                before: prefix.map_or(Vec::new(), |x| {
                    x.layers
                        .iter()
                        .map(|(k, v)| (&k[bi * prefix_len..][..prefix_len], &v[bi * prefix_len..][..prefix_len]))
                        .collect()
                }),
                out: if read.is_none() { &mut out[..real * hidden] } else { out },
                cache,
            }
        })
        .collect();
    run_sequences(w, p, work);
    (out, cache)
}

/// The new positions a sequence runs when its pass keeps no cache: its trailing padding (a batch
/// of mixed lengths, right-padded) is skipped, as those positions are masked out of every real one
/// and their output rows stay zero; unless a row to be read lies in it. `valid`: which of its new
/// positions are real tokens.
fn real_length(valid: &[bool], read: Option<&[usize]>) -> usize {
    let real = valid.len() - valid.iter().rev().take_while(|&&real| !real).count();
    if read.is_some_and(|r| r.iter().any(|&i| i >= real)) {
        valid.len()
    } else {
        real
    }
}

/// One sequence's share of a forward pass.
struct Work<'a> {
    /// Its new tokens.
    ids: &'a [u32],
    /// Which of its positions (cached, then new) are real tokens (`None`: all are).
    valid: Option<&'a [bool]>,
    /// The new positions whose hidden states are wanted (`None`: all).
    read: Option<&'a [usize]>,
    /// Per layer, the keys and values of its cached positions.
    before: Vec<(&'a [f32], &'a [f32])>,
    /// Its output rows.
    out: &'a mut [f32],
    /// Per layer, where its keys and values go (empty: nowhere).
    cache: Vec<(&'a mut [f32], &'a mut [f32])>,
}

/// Runs every sequence of a pass (each after `p` cached positions) through [`sequence`]: one
/// sequence per thread when there are enough of them, or when this pass already runs on a pool
/// thread (its siblings are busy with passes of their own); else the threads share each sequence.
fn run_sequences(w: &Weights, p: usize, work: Vec<Work>) {
    let job = |item: Work, shared: bool| {
        let Work {
            ids,
            valid,
            read,
            before,
            out,
            cache,
        } = item;
        let seq = Sequence {
            ids,
            prefix: p,
            before: &before,
            valid,
            read,
        };
        with_scratch(|scratch| sequence(w, &seq, out, cache, scratch, shared))
    };
    let b = work.len();
    if b >= rayon::current_num_threads() || rayon::current_thread_index().is_some() {
        // Longest first, each taken by the next free thread, so the pass ends on a short one
        // (a static split of mixed lengths left a thread idle for most of a long sequence).
        let mut work = work;
        work.sort_by_key(|item| std::cmp::Reverse(item.ids.len()));
        let queue = std::sync::Mutex::new(work.into_iter());
        let next = || queue.lock().unwrap_or_else(|e| e.into_inner()).next();
        rayon::scope(|scope| {
            for _ in 0..rayon::current_num_threads().min(b) {
                scope.spawn(|_| {
                    while let Some(item) = next() {
                        job(item, false);
                    }
                });
            }
        });
    } else {
        for item in work {
            job(item, true);
        }
    }
}

/// One sequence's input to [`sequence`].
struct Sequence<'a> {
    /// Its new tokens.
    ids: &'a [u32],
    /// Positions already encoded before them.
    prefix: usize,
    /// Per layer, the keys and values of those positions (`[kv, prefix, d]` each; empty when
    /// there are none).
    before: &'a [(&'a [f32], &'a [f32])],
    /// Which of the `prefix + t` positions are real tokens (`None`: all are).
    valid: Option<&'a [bool]>,
    /// The new positions whose hidden states are wanted (`None`: all).
    read: Option<&'a [usize]>,
}

/// One sequence through every layer. `out` receives the hidden states of every new position
/// (`[t, hidden]`), or with `read` those of the positions listed (`[read.len(), hidden]`: the
/// last layer then runs its queries, MLP and norm for those rows only). `cache` (empty, or one
/// `([kv, prefix + t, d], [kv, prefix + t, d])` pair per layer) receives the keys and values.
/// `shared`: the threads work on this sequence together.
fn sequence(
    w: &Weights,
    seq: &Sequence,
    out: &mut [f32],
    mut cache: Vec<(&mut [f32], &mut [f32])>,
    s: &mut Scratch,
    shared: bool,
) {
    let Sequence {
        ids,
        prefix: p,
        before,
        valid,
        read,
    } = *seq;
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
    let total = p + t;
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
        w.embed.slice(id as usize * h..(id as usize + 1) * h).widen_into(row);
    }
    let parallelism = if shared {
        gemm::Parallelism::Rayon(rayon::current_num_threads())
    } else {
        gemm::Parallelism::None
    };
    s.normed.resize(t * h, 0.0);
    // q|k|v rows of every position: the prefix's keys and values are copied in per layer.
    s.qkv.resize(total * qkv_w, 0.0);
    s.mlp.resize(t * 2 * dims.intermediate, 0.0);
    s.queries.clear();
    s.queries.extend(p..total);
    let read_at: Option<Vec<usize>> = read.map(|r| r.iter().map(|&i| p + i).collect());
    let last = w.layers.len() - 1;
    for (li, l) in w.layers.iter().enumerate() {
        rms_norm_rows(x, l.ln1, eps, &mut s.normed);
        project_qkv(w, l, p, s, parallelism);
        if let Some((k, v)) = before.get(li) {
            for (c, src) in [(heads * d, k), ((heads + kv_heads) * d, v)] {
                for (g, head) in src.chunks_exact(p * d).enumerate() {
                    for (i, row) in head.chunks_exact(d).enumerate() {
                        s.qkv[i * qkv_w + c + g * d..][..d].copy_from_slice(row);
                    }
                }
            }
        }
        if let Some((k, v)) = cache.get_mut(li) {
            for (c, dst) in [(heads * d, &mut **k), ((heads + kv_heads) * d, &mut **v)] {
                for (g, head) in dst.chunks_exact_mut(total * d).enumerate() {
                    for (i, row) in head.chunks_exact_mut(d).enumerate() {
                        row.copy_from_slice(&s.qkv[i * qkv_w + c + g * d..][..d]);
                    }
                }
            }
        }
        // Products in bf16 for a model multiplied in bf16 (its weights bf16, the CPU able).
        let bf16 = sgemm::multiplies_in_bf16(&l.qkv[0].0);
        let attend = |queries: &[usize], s: &mut Scratch| {
            let keys = (&mut s.keys_t, &mut s.key_pairs);
            let (head, attn) = (&mut s.head, &mut s.attn);
            attention(&s.qkv, total, queries, dims, valid, keys, head, attn, shared, bf16);
        };
        match (read, selected.as_deref_mut()) {
            (Some(rows), Some(sel)) if li == last => {
                // Only the rows read go on: their residuals move to `out`.
                attend(read_at.as_deref().unwrap_or(rows), s);
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

/// The new positions' query, key and value rows of layer `l` (after `p` cached positions), from
/// the normed residuals in `s.normed` into `s.qkv`, biases added and rotary positions applied.
fn project_qkv(w: &Weights, l: &LayerWeights, p: usize, s: &mut Scratch, parallelism: gemm::Parallelism) {
    qkv_products(w, l, p, s, parallelism);
    let dims = w.dims;
    let (d, qkv_w) = (dims.head_dim, dims.qkv_width());
    let half = d / 2;
    rotate(
        &mut s.qkv[p * qkv_w..],
        qkv_w,
        (dims.heads + dims.kv_heads) * d,
        d,
        &w.cos[p * half..],
        &w.sin[p * half..],
    );
}

/// [`project_qkv`]'s products and biases, without the rotary positions.
fn qkv_products(w: &Weights, l: &LayerWeights, p: usize, s: &mut Scratch, parallelism: gemm::Parallelism) {
    let dims = w.dims;
    let (h, qkv_w) = (dims.hidden, dims.qkv_width());
    let new_rows = &mut s.qkv[p * qkv_w..];
    let mut col = 0;
    for (weight, bias) in l.qkv {
        let n = weight.len() / h;
        if let Some(bias) = bias {
            for row in new_rows.chunks_exact_mut(qkv_w) {
                row[col..col + n].copy_from_slice(bias);
            }
        }
        let dst = Rows::new(&mut new_rows[col..], qkv_w, n);
        matmul_t(dst, &s.normed, h, weight, bias.is_some(), parallelism);
        col += n;
    }
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
