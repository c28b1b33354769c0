//! Causal attention of [`super::Cpu`], forward and backward, on the thread pool: the forward
//! one task per sequence and query head, the backward one per sequence and key/value head (the
//! query heads that share its keys and values in turn, its keys' and values' gradients summed
//! in the task). Each task's products are the CPU backend's ([`product_f32`]) in bf16 where the
//! CPU can (AMX or AVX512_BF16 tiles), each operand read where it lies (as rows, or transposed):
//! queries, keys, values, the softmax's probabilities and the scores' gradient in bf16, every
//! sum f32, as PyTorch's bf16 attention ([`super::Reference`] keeps the probabilities f32); the
//! softmax in the vector kernels. A task runs its query rows in blocks of [`ROWS`], each over
//! the keys it sees (the causal half of the `[len, len]` scores and a triangle a block, not the
//! whole square), holding `[ROWS, len]` of them at a time (1 MiB of f32 at 4,096 tokens) in buffers
//! its thread keeps, and writes its rows of the output straight into it.

use super::cpu::product_f32;
use super::cpu_elementwise::round_into;
use crate::kernels::sgemm::{transposed_u16, Bf16Rows};
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

    /// Every (sequence, head) pair for `heads` heads: `(first row, length, head)`, the tasks.
    fn tasks(&self, heads: usize) -> Vec<(usize, usize, usize)> {
        let per_seq = |&(start, len): &(usize, usize)| (0..heads).map(move |h| (start, len, h));
        self.seqs.iter().flat_map(per_seq).collect()
    }

    /// The rows the sequences cover: `0..rows`.
    fn rows(&self) -> usize {
        self.seqs.last().map_or(0, |&(s, l)| s + l)
    }
}

/// Columns `col..col + d` of rows `start..start + len` of `m` (rows of `width`), then zero rows
/// up to [`padded`]`(len)`: `[padded(len), d]`.
fn columns16(m: &[u16], width: usize, (start, len): (usize, usize), col: usize, d: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(padded(len) * d);
    for r in start..start + len {
        out.extend_from_slice(&m[r * width + col..][..d]);
    }
    out.resize(padded(len) * d, 0);
    out
}

/// A sequence's length rounded up to whole AMX steps (32): its tasks run on that many rows, the
/// rows past its end zero (their keys and values add nothing, their queries' output and
/// gradients are dropped), so that every product's depth is whole tiles.
fn padded(len: usize) -> usize {
    len.next_multiple_of(32)
}

/// A task's buffers, reused block after block and kept by its thread for its next task (grown,
/// never shrunk): a block's f32 probabilities and their gradient (`[ROWS, len]` at most), their
/// bf16 roundings, a product's transposed `[d, ROWS]` output, and `[len, d]` sums: a head's
/// output or its queries' gradient, its keys' and its values' gradients.
#[derive(Default)]
struct Scratch {
    p: Vec<f32>,
    ds: Vec<f32>,
    p16: Vec<u16>,
    ds16: Vec<u16>,
    t: Vec<f32>,
    out: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::Cell<Scratch> = std::cell::Cell::default();
}

impl Scratch {
    /// Runs `f` on this thread's buffers, each at least as long as a task of `n` rows of heads
    /// of `d` needs. (Taken out of the thread's cell while `f` runs: a task this thread picks up
    /// while waiting inside a product gets buffers of its own, not these.)
    fn with<T>(n: usize, d: usize, f: impl FnOnce(&mut Scratch) -> T) -> T {
        let mut s = SCRATCH.take();
        let most = ROWS.min(n) * n;
        for v in [&mut s.p, &mut s.ds] {
            v.resize(v.len().max(most), 0.0);
        }
        for v in [&mut s.p16, &mut s.ds16] {
            v.resize(v.len().max(most), 0);
        }
        s.t.resize(s.t.len().max(d * ROWS), 0.0);
        for v in [&mut s.out, &mut s.dk, &mut s.dv] {
            v.resize(v.len().max(n * d), 0.0);
        }
        let result = f(&mut s);
        SCRATCH.set(s);
        result
    }
}

/// Rows that parallel tasks write disjoint parts of.
#[derive(Clone, Copy)]
struct Shared<T> {
    at: *mut T,
    len: usize,
}

// SAFETY: tasks write disjoint parts ([`Shared::part`]'s contract); T moves between threads.
unsafe impl<T: Send> Send for Shared<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Shared<T> {}

impl<T> Shared<T> {
    fn new(v: &mut [T]) -> Self {
        Shared { at: v.as_mut_ptr(), len: v.len() }
    }

    /// `len` values from `from`.
    ///
    /// # Safety
    /// No other task reads or writes them while the slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn part(&self, from: usize, len: usize) -> &mut [T] {
        assert!(from + len <= self.len, "a part past the rows' end");
        // SAFETY: within the buffer (asserted); exclusive by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.at.add(from), len) }
    }
}

/// A block of a head's query rows, `first..first + rows`: the causal half's scores of those rows
/// run over keys `0..keys` (`keys = first + rows`) only, `[rows, keys]`, so a task computes the
/// lower triangle and one triangle a block of the `[len, len]` scores, and holds `ROWS · len`
/// of them at a time.
#[derive(Clone, Copy)]
struct Block {
    first: usize,
    rows: usize,
}

impl Block {
    /// The blocks of `len` query rows, `ROWS` each (the last fewer).
    fn all(len: usize) -> impl Iterator<Item = Block> {
        (0..len).step_by(ROWS).map(move |first| Block { first, rows: ROWS.min(len - first) })
    }

    /// The keys the block's rows see: `0..keys`.
    fn keys(self) -> usize {
        self.first + self.rows
    }

    /// Values in a `[rows, keys]` matrix of the block.
    fn size(self) -> usize {
        self.rows * self.keys()
    }
}

/// Query rows a block takes (a multiple of the AMX tiles' 32 steps, the depth of the keys' and
/// values' gradient products).
const ROWS: usize = 64;

/// `a · wᵀ` into `y` on this thread (the tasks run in parallel already).
fn times(y: &mut [f32], a: Bf16Rows, w: &[u16], dims: (usize, usize, usize), add: bool) -> Result<()> {
    product_f32(y, a, w, dims, add, 1)
}

/// `t` `[d, rows]` transposed into rows `out` `[rows, d]`.
fn untranspose(t: &[f32], out: &mut [f32], d: usize) {
    let rows = out.len() / d;
    for (i, row) in out.chunks_exact_mut(d).enumerate() {
        row.iter_mut().enumerate().for_each(|(c, y)| *y = t[c * rows + i]);
    }
}

/// The attention probabilities `[rows, keys]` of the block's queries (`q` from its first row,
/// `[., d]`) over the keys `k` (`[keys, d]`), into `p`: row `i` the softmax of its scaled scores
/// over keys `0..=first + i`, zero past it.
fn probabilities(p: &mut [f32], q: &[u16], k: &[u16], b: Block, d: usize) -> Result<()> {
    let scale = 1.0 / (d as f32).sqrt();
    let p = &mut p[..b.size()];
    times(p, Bf16Rows::Rows(q, d), k, (b.rows, b.keys(), d), false)?;
    simd::dispatch(CausalSoftmax { p, b, scale });
    Ok(())
}

/// Each row `i` of a block's `[rows, keys]` scores made the softmax of its first `first + i + 1`
/// values scaled by `scale`, zero past them, in the vector kernels ([`simd::dispatch`]).
struct CausalSoftmax<'a> {
    p: &'a mut [f32],
    b: Block,
    scale: f32,
}

impl simd::Kernel for CausalSoftmax<'_> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        for (i, row) in self.p.chunks_exact_mut(self.b.keys()).enumerate() {
            let (seen, future) = row.split_at_mut(self.b.first + i + 1);
            seen.iter_mut().for_each(|s| *s *= self.scale);
            let inv = 1.0 / simd::exp_sub_sum_one_pass::<FMA>(seen, simd::max(seen));
            seen.iter_mut().for_each(|s| *s *= inv);
            future.fill(0.0);
        }
    }
}

/// A block's scores' gradient from its probabilities `p` and their gradient `dp` (`[rows,
/// keys]`, in place): `dS = P ∘ (dP − Σⱼ P·dP) · scale`, row by row, zero past the diagonal.
struct ScoresGradient<'a> {
    p: &'a [f32],
    dp: &'a mut [f32],
    b: Block,
    scale: f32,
}

impl simd::Kernel for ScoresGradient<'_> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        let keys = self.b.keys();
        let rows = self.p.chunks_exact(keys).zip(self.dp.chunks_exact_mut(keys));
        for (i, (p, dp)) in rows.enumerate() {
            let seen = self.b.first + i + 1;
            let (p, (seen, future)) = (&p[..seen], dp.split_at_mut(seen));
            let mean = simd::dot::<FMA>(p, seen);
            seen.iter_mut().zip(p).for_each(|(g, &pr)| *g = pr * (*g - mean) * self.scale);
            future.fill(0.0);
        }
    }
}

/// One head's attention over one sequence, block by block (a block's `Oᵀ = Vᵀ · Pᵀ`: `V` read
/// transposed where it lies, `P` as rows), rounded into its rows and columns of `out`.
fn head_forward(qkv: &[u16], out: Shared<u16>, shape: &Shape, (start, len, h): (usize, usize, usize)) -> Result<()> {
    let (width, d) = (shape.width(), shape.d);
    let (kc, vc) = shape.key_value(h);
    let q = columns16(qkv, width, (start, len), h * d, d);
    let k = columns16(qkv, width, (start, len), kc, d);
    let v = columns16(qkv, width, (start, len), vc, d);
    let n = padded(len);
    Scratch::with(n, d, |s| {
        for b in Block::all(n) {
            probabilities(&mut s.p, &q[b.first * d..], &k, b, d)?;
            round_into(&s.p[..b.size()], &mut s.p16[..b.size()]);
            let t = &mut s.t[..d * b.rows];
            times(t, Bf16Rows::Columns(&v, d), &s.p16, (d, b.rows, b.keys()), false)?;
            untranspose(t, &mut s.out[b.first * d..b.keys() * d], d);
        }
        for (i, row) in s.out.chunks_exact(d).take(len).enumerate() {
            // SAFETY: row `start + i`'s head `h` columns are this task's alone.
            round_into(row, unsafe { out.part((start + i) * shape.heads * d + h * d, d) });
        }
        Ok(())
    })
}

/// Causal attention of every row over its own sequence's rows, into `out` (`[rows, heads · d]`).
pub(super) fn forward(qkv: &[u16], out: &mut [u16], shape: &Shape) -> Result<()> {
    let rows = shape.rows();
    ensure!(qkv.len() >= rows * shape.width() && out.len() >= rows * shape.heads * shape.d, "a buffer too short");
    let out = Shared::new(out);
    shape.tasks(shape.heads).into_par_iter().try_for_each(|task| head_forward(qkv, out, shape, task))
}

/// One query head's gradients through its attention, block by block of query rows: its queries'
/// (`dQᵀ = Kᵀ · dSᵀ`, a block's rows its own) into `s.out`, and added to `s.dk` and `s.dv` those
/// of the keys and values it reads (`dK += dSᵀ · Q`, `dV += Pᵀ · dO`, each block for the keys it
/// sees). The `[rows, keys]` operands (the probabilities and the scores' gradient, rounded to
/// bf16) are read where they lie, as rows or transposed; only a block's `[rows, d]` queries and
/// output gradient are transposed.
fn query_head_backward(s: &mut Scratch, q: &[u16], d_o: &[u16], (k, v): (&[u16], &[u16]), d: usize) -> Result<()> {
    let (n, scale) = (q.len() / d, 1.0 / (d as f32).sqrt());
    for b in Block::all(n) {
        let (keys, mine) = (b.keys(), b.first * d..b.keys() * d);
        probabilities(&mut s.p, &q[b.first * d..], k, b, d)?;
        // dP = dO · Vᵀ; dS = P ∘ (dP − Σⱼ P·dP) · scale, row by row (zero past the diagonal).
        let (p, ds) = (&s.p[..b.size()], &mut s.ds[..b.size()]);
        times(ds, Bf16Rows::Rows(&d_o[b.first * d..], d), v, (b.rows, keys, d), false)?;
        simd::dispatch(ScoresGradient { p, dp: ds, b, scale });
        round_into(p, &mut s.p16[..b.size()]);
        round_into(ds, &mut s.ds16[..b.size()]);
        let t = &mut s.t[..d * b.rows];
        times(t, Bf16Rows::Columns(k, d), &s.ds16, (d, b.rows, keys), false)?;
        untranspose(t, &mut s.out[mine.clone()], d);
        let (q_t, d_ot) = (transposed_u16(&q[mine.clone()], b.rows, d), transposed_u16(&d_o[mine], b.rows, d));
        times(&mut s.dk[..keys * d], Bf16Rows::Columns(&s.ds16, keys), &q_t, (keys, d, b.rows), true)?;
        times(&mut s.dv[..keys * d], Bf16Rows::Columns(&s.p16, keys), &d_ot, (keys, d, b.rows), true)?;
    }
    Ok(())
}

/// A sequence's gradients through the attention of key/value head `g`'s query heads, written
/// into their columns of its rows of `d_qkv`: each query head's `dq`, and `g`'s `dk` and `dv`
/// summed over them.
fn group_backward(
    qkv: &[u16],
    d_out: &[u16],
    d_qkv: Shared<f32>,
    shape: &Shape,
    (start, len, g): (usize, usize, usize),
) -> Result<()> {
    let (width, d, per) = (shape.width(), shape.d, shape.heads / shape.kv_heads);
    let (kc, vc) = shape.key_value(g * per);
    let k = columns16(qkv, width, (start, len), kc, d);
    let v = columns16(qkv, width, (start, len), vc, d);
    let n = padded(len);
    let write = |col: usize, from: &[f32]| {
        for (i, row) in from.chunks_exact(d).take(len).enumerate() {
            // SAFETY: row `start + i`'s columns of query heads `g · per..(g + 1) · per` and of
            // key/value head `g` are this task's alone.
            unsafe { d_qkv.part((start + i) * width + col, d) }.copy_from_slice(row);
        }
    };
    Scratch::with(n, d, |s| {
        s.dk[..n * d].fill(0.0);
        s.dv[..n * d].fill(0.0);
        for h in g * per..(g + 1) * per {
            let q = columns16(qkv, width, (start, len), h * d, d);
            let d_o = columns16(d_out, shape.heads * d, (start, len), h * d, d);
            query_head_backward(s, &q, &d_o, (&k, &v), d)?;
            write(h * d, &s.out[..n * d]);
        }
        write(kc, &s.dk[..n * d]);
        write(vc, &s.dv[..n * d]);
        Ok(())
    })
}

/// Through [`forward`]: `d_qkv = [dq | dk | dv]` (written; a key/value head's gradients summed
/// over the query heads that share it) for the gradient `d_out` of its output.
pub(super) fn backward(qkv: &[u16], d_out: &[u16], d_qkv: &mut [f32], shape: &Shape) -> Result<()> {
    let (width, rows) = (shape.width(), shape.rows());
    ensure!(
        qkv.len() >= rows * width && d_out.len() >= rows * shape.heads * shape.d && d_qkv.len() >= rows * width,
        "a buffer too short"
    );
    // Rows in no sequence (offsets may skip some) get zero gradients; every other is written.
    d_qkv[..rows * width].par_chunks_mut(1 << 16).for_each(|c| c.fill(0.0));
    let d_qkv = Shared::new(&mut d_qkv[..rows * width]);
    shape
        .tasks(shape.kv_heads)
        .into_par_iter()
        .try_for_each(|task| group_backward(qkv, d_out, d_qkv, shape, task))
}
