//! `dst (+)= a · wᵀ` for the inference path, in AVX-512 register tiles.
//!
//! Both operands come as the model holds them: `a` is row-major activations `[m, k]`, `w` a
//! weight `[n, k]` in PyTorch's layout, so `k` is contiguous in both. A tile is 32 rows of `a`
//! (two vectors along `m`) by 12 rows of `w`, 24 accumulators: per step of `k` it loads two
//! vectors of `a` and broadcasts twelve weights. The weights are read where they lie (a
//! broadcast needs one value from each row), so nothing of the model is copied or cached and a
//! weight changed by training is read as it is; only a block of `a` is packed, 32 rows
//! interleaved per step of `k`, which costs `m · k` moves against `m · n · k` multiply-adds.
//!
//! Every output sums its `k` products in order with one fused multiply-add chain (then block by
//! block into `dst`), so a row's result does not depend on which tile or thread computed it.
//!
//! A bf16 weight on a CPU with AVX512_BF16 multiplies in bf16 instead ([`bf16_products_available`]): the
//! activations are rounded to bf16 as they are packed (pairs of neighbouring steps of `k` side
//! by side), each weight row's pairs are broadcast straight from where the weight lies, and one
//! `vdpbf16ps` adds two steps' exact products to f32 sums, twice the multiply-adds of an f32 fused
//! multiply-add per instruction. What it costs is bf16's rounding of the activations (a relative
//! 2⁻⁹ per value), the arithmetic of PyTorch's and vLLM's bf16 inference.

use super::weights::WeightSlice;
#[cfg(target_arch = "x86_64")]
use pack::transpose16;
use pack::{pack, pack_pairs};
use half::bf16;
use std::cell::RefCell;

/// Rows of `a` in a tile: two AVX-512 vectors.
const PANEL: usize = 32;
/// Rows of `w` in a tile.
const COLS: usize = 12;
/// Steps of `k` per block: the packed block of a sequence's 256 rows (1 MiB) stays in L2.
const DEPTH: usize = 1024;
/// Columns of `dst` (weight rows) per chunk: every panel runs over a chunk before the next.
const CHUNK: usize = 16 * COLS;
/// Columns of a block of a product split by columns: whole tiles of [`COLS`] and of AMX's 16.
const BLOCK_COLS: usize = 4 * COLS;

thread_local! {
    /// This thread's packed block of `a`.
    static PACKED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// This thread's chunk of bf16/f16 weight rows widened to f32 (`CHUNK × DEPTH`, 768 KiB).
    static WIDENED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// This thread's packed block of `a` in bf16 pairs (for [`bf16_products_available`]).
    static PACKED_PAIRS: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// Whether this CPU multiplies bf16 weights in bf16 (AVX-512F with AVX512_BF16): where a model
/// asks for it ([`crate::Precision::bf16_products`]), its bf16 weights then multiply in bf16
/// with f32 sums, as PyTorch and vLLM compute bf16 inference (up to twice as fast); elsewhere,
/// or when it does not ask, they are widened to f32 inside the kernels.
pub fn bf16_products_available() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            available() && std::arch::is_x86_feature_detected!("avx512bf16")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// The shortest `k` the tiles are used for. Below it the tile's fixed costs (packing, the
/// transposed write of each result) weigh more: at `k = 64` (the fixtures) gemm's kernels were as
/// fast or faster, at `k = 896` (Qwen2.5-0.5B) the tiles were 15–45% faster.
pub(crate) const MIN_DEPTH: usize = 512;

/// Whether [`matmul_t`] can run here (the CPU has AVX-512F).
pub(crate) fn available() -> bool {
    super::simd::has_avx512()
}

/// Whether [`matmul_t`] is the one to use for products with `w` over `k` steps: it can run here
/// and `k` reaches [`MIN_DEPTH`], or `w` is bf16 and multiplies in bf16 (which only it does).
pub(crate) fn suits(k: usize, w: &WeightSlice) -> bool {
    available() && (k >= MIN_DEPTH || multiplies_in_bf16(w))
}

/// Whether products with `w` run in bf16 (a bf16 weight of a model multiplied in bf16, on a CPU
/// that can: [`WeightSlice::Bf16Products`]).
pub(crate) fn multiplies_in_bf16(w: &WeightSlice) -> bool {
    matches!(w, WeightSlice::Bf16Products(_))
}

/// `dst[i][j] = Σ_k a[i][k] · w[j][k]` (or `+=` when `accumulate`) for `m` rows of `a`
/// (`a_stride` apart) and of `dst` (`dst_stride` apart, `n` wide), `w` `[n, k]`. A bf16/f16
/// weight is widened to f32 a chunk of rows by a block of `k` at a time, once for all the
/// panels that read it (the same arithmetic as the weight widened whole, without its copy),
/// unless it multiplies in bf16 ([`bf16_products_available`]).
///
/// # Panics
/// When the CPU lacks AVX-512F (check [`available`]) or a slice is too short for the sizes.
pub(crate) fn matmul_t(
    dst: &mut [f32],
    dst_stride: usize,
    a: &[f32],
    a_stride: usize,
    w: WeightSlice,
    (m, n, k): (usize, usize, usize),
    accumulate: bool,
) {
    assert!(available(), "sgemm::matmul_t needs AVX-512F");
    if m == 0 || n == 0 {
        return;
    }
    assert_fits(a, a_stride, &w, Some((dst.len(), dst_stride)), (m, n, k));
    if k == 0 {
        if !accumulate {
            dst.chunks_mut(dst_stride).take(m).for_each(|row| row[..n].fill(0.0));
        }
        return;
    }
    let dst = Dst {
        at: dst.as_mut_ptr(),
        stride: dst_stride,
    };
    // SAFETY: the sizes were checked above.
    unsafe { matmul_t_into(dst, a, a_stride, w, (m, n, k), accumulate) }
}

/// Asserts that a product of `m` rows of `a` (`a_stride` apart) by a weight `[n, k]` can run
/// here and that its slices hold it, the output's too when given (its length and row stride);
/// `m, n > 0`.
fn assert_fits(
    a: &[f32],
    a_stride: usize,
    w: &WeightSlice,
    dst: Option<(usize, usize)>,
    (m, n, k): (usize, usize, usize),
) {
    assert!(available(), "sgemm::matmul_t needs AVX-512F");
    assert!(w.len() >= n * k, "weight of {} values for [{n}, {k}]", w.len());
    assert!(
        a.len() >= (m - 1) * a_stride + k && a_stride >= k,
        "activations too short"
    );
    if let Some((len, stride)) = dst {
        assert!(len >= (m - 1) * stride + n && stride >= n, "output too short");
    }
}

/// Where a product's output goes: rows `stride` values apart from `at`, f32 values or (as
/// [`Dst16`]) bf16 bits. Tasks given windows of one output write disjoint blocks of its columns.
#[derive(Clone, Copy)]
struct Dst<T = f32> {
    at: *mut T,
    stride: usize,
}

/// A bf16 output (bits).
type Dst16 = Dst<u16>;

// SAFETY: a `Dst` is only shared between tasks writing disjoint blocks of columns.
unsafe impl<T> Send for Dst<T> {}
// SAFETY: as for `Send`.
unsafe impl<T> Sync for Dst<T> {}

impl<T> Dst<T> {
    /// The window of this output whose first column is its column `j`.
    fn past_columns(self, j: usize) -> Dst<T> {
        Dst {
            at: self.at.wrapping_add(j),
            ..self
        }
    }
}

/// [`matmul_t`] into `dst`, past its checks (with `m, n, k > 0`).
///
/// # Safety
/// `available()` holds; `m` rows of `n` values from `dst.at` are writable (and readable when
/// `accumulate`); `a` and `w` hold what [`matmul_t`] asserts.
unsafe fn matmul_t_into(
    dst: Dst,
    a: &[f32],
    a_stride: usize,
    w: WeightSlice,
    (m, n, k): (usize, usize, usize),
    accumulate: bool,
) {
    match w {
        WeightSlice::Bf16Products(w) => matmul_t_bf16(dst, a, a_stride, w, (m, n, k), accumulate),
        w => matmul_t_widened(dst, a, a_stride, w, (m, n, k), accumulate),
    }
}

/// [`matmul_t`] as `tasks` parallel tasks, each taking a block of the weight's rows (output
/// columns) and writing its block of `dst`: every value is what one thread's tiles compute. For
/// products with too few rows to split by rows (short prompts, decoding batches past the
/// streaming kernel's 16 rows).
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_t_by_columns(
    dst: &mut [f32],
    dst_stride: usize,
    a: &[f32],
    a_stride: usize,
    w: WeightSlice,
    (m, n, k): (usize, usize, usize),
    accumulate: bool,
    tasks: usize,
) {
    if m == 0 || n == 0 || k == 0 {
        // No step to split: `matmul_t` writes the zeros or leaves `dst` as it is.
        return matmul_t(dst, dst_stride, a, a_stride, w, (m, n, k), accumulate);
    }
    assert_fits(a, a_stride, &w, Some((dst.len(), dst_stride)), (m, n, k));
    let dst = Dst {
        at: dst.as_mut_ptr(),
        stride: dst_stride,
    };
    // SAFETY: the sizes were checked above.
    unsafe { by_columns(dst, a, a_stride, w, (m, n, k), accumulate, tasks) }
}

/// `a [m, k] · wᵀ` as a new `[m, n]`, as [`matmul_t_by_columns`] computes it (into nothing
/// zeroed first: every value is written once, by its block's tiles).
pub(crate) fn matmul_t_by_columns_new(
    a: &[f32],
    a_stride: usize,
    w: WeightSlice,
    (m, n, k): (usize, usize, usize),
    tasks: usize,
) -> Vec<f32> {
    if m == 0 || n == 0 || k == 0 {
        return vec![0.0; m * n];
    }
    assert_fits(a, a_stride, &w, None, (m, n, k));
    let mut y: Vec<f32> = Vec::with_capacity(m * n);
    let dst = Dst {
        at: y.as_mut_ptr(),
        stride: n,
    };
    // SAFETY: the sizes were checked above; `y` has room for `m × n` values, and written over
    // (not accumulated), the tiles write every one of them before any is read.
    unsafe {
        by_columns(dst, a, a_stride, w, (m, n, k), false, tasks);
        y.set_len(m * n);
    }
    y
}

/// The blocks of columns of `a · wᵀ` (whole tiles each, `tasks` of them at most), each computed
/// by one task into its block of `dst`, written over or (`accumulate`) added to it.
///
/// # Safety
/// As for [`matmul_t_into`].
unsafe fn by_columns(
    dst: Dst,
    a: &[f32],
    a_stride: usize,
    w: WeightSlice,
    (m, n, k): (usize, usize, usize),
    accumulate: bool,
    tasks: usize,
) {
    use rayon::prelude::*;
    // In bf16 products every task reads the same panels: packed here, once.
    if let WeightSlice::Bf16Products(w) = w {
        // SAFETY: as this function's.
        return unsafe { columns_bf16(dst, &pack_all_pairs(a, a_stride, m, k), w, (m, n, k), accumulate, tasks) };
    }
    let block = column_block(n, tasks);
    (0..n.div_ceil(block)).into_par_iter().for_each(|b| {
        let cols = block.min(n - b * block);
        let w = w.slice(b * block * k..(b * block + cols) * k);
        // SAFETY: as this function's; the block's columns are this task's alone.
        unsafe { matmul_t_into(dst.past_columns(b * block), a, a_stride, w, (m, cols, k), accumulate) }
    });
}

/// Columns a task of a product split by columns takes: whole tiles of the AVX-512 kernels and
/// of AMX's (so each column is computed by the kernel that computes it in one pass).
fn column_block(n: usize, tasks: usize) -> usize {
    n.div_ceil(tasks.max(1)).next_multiple_of(BLOCK_COLS)
}

/// The bf16 tiles of `dst = packed · wᵀ` (or `+=` with `accumulate`) for activations packed
/// in pairs (`packed`: one buffer a depth chunk of [`DEPTH`]), in `tasks` parallel blocks of
/// the weight's rows.
///
/// # Safety
/// As for [`matmul_t_bf16`]; `packed` holds the panels of `m` rows of every depth chunk of `k`.
unsafe fn columns_bf16(
    dst: Dst,
    packed: &[Vec<u32>],
    w: &[bf16],
    (m, n, k): (usize, usize, usize),
    accumulate: bool,
    tasks: usize,
) {
    use rayon::prelude::*;
    let block = column_block(n, tasks);
    (0..n.div_ceil(block)).into_par_iter().for_each(|b| {
        let cols = block.min(n - b * block);
        let (dst, w) = (dst.past_columns(b * block), &w[b * block * k..(b * block + cols) * k]);
        for (chunk, panels) in packed.iter().enumerate() {
            let k0 = chunk * DEPTH;
            // SAFETY: as this function's; the block's columns are this task's alone.
            unsafe { tiles_bf16(dst, panels, w, (m, cols, k), k0, accumulate || k0 > 0) };
        }
    });
}

/// [`matmul_t`] in f32 products, a bf16/f16 weight widened a chunk at a time.
///
/// # Safety
/// As for [`matmul_t_into`].
unsafe fn matmul_t_widened(
    dst: Dst,
    a: &[f32],
    a_stride: usize,
    w: WeightSlice,
    (m, n, k): (usize, usize, usize),
    accumulate: bool,
) {
    let with_packed = |packed: &mut Vec<f32>, widened: &mut Vec<f32>| {
        for k0 in (0..k).step_by(DEPTH) {
            let depth = DEPTH.min(k - k0);
            pack(a, a_stride, m, k0, depth, packed);
            let add = accumulate || k0 > 0;
            // A band of `dst` (a panel's rows × a chunk's columns) stays in cache while the
            // chunk's tiles fill it; the chunk's weights stay in L2 across the panels.
            for c0 in (0..n).step_by(CHUNK) {
                let chunk_end = n.min(c0 + CHUNK);
                // The chunk's weight rows as f32: where they lie, or widened into `widened`
                // (rows `depth` apart from column `k0`).
                let (rows_of, stride, start): (&[f32], usize, usize) = match w {
                    WeightSlice::F32(w) => (w, k, c0 * k + k0),
                    narrow => {
                        widened.resize((chunk_end - c0) * depth, 0.0);
                        for (r, row) in widened.chunks_exact_mut(depth).enumerate() {
                            let at = (c0 + r) * k + k0;
                            narrow.slice(at..at + depth).widen_into(row);
                        }
                        (widened, depth, 0)
                    }
                };
                for_each_tile((m, n), c0..chunk_end, (dst, add), |p, j0, out| {
                    let panel = &packed[p * PANEL * depth..][..PANEL * depth];
                    // Past the last weight row the tile repeats it; those columns are dropped.
                    let w_rows: [&[f32]; COLS] =
                        std::array::from_fn(|c| &rows_of[start + (j0 - c0 + c.min(out.cols - 1)) * stride..][..depth]);
                    // SAFETY: `available()` was asserted; the panel and every weight row hold
                    // `depth` steps; `out` covers rows < m and columns < n of `dst`.
                    unsafe { tile(depth, panel, &w_rows, out) };
                });
            }
        }
    };
    PACKED.with(|p| {
        WIDENED.with(|w| match (p.try_borrow_mut(), w.try_borrow_mut()) {
            (Ok(mut packed), Ok(mut widened)) => with_packed(&mut packed, &mut widened),
            _ => with_packed(&mut Vec::new(), &mut Vec::new()),
        })
    });
}

/// [`matmul_t`] in bf16 products: `a` packed in bf16 pairs a block of `k` at a time, the weight
/// read where it lies (a broadcast takes one row's pair of neighbouring values).
///
/// # Safety
/// As for [`matmul_t_into`], with [`bf16_products_available`] holding.
unsafe fn matmul_t_bf16(
    dst: Dst,
    a: &[f32],
    a_stride: usize,
    w: &[bf16],
    (m, n, k): (usize, usize, usize),
    accumulate: bool,
) {
    let with_packed = |packed: &mut Vec<u32>| {
        for k0 in (0..k).step_by(DEPTH) {
            pack_pairs(a, a_stride, m, k0, DEPTH.min(k - k0), packed);
            // SAFETY: as this function's.
            unsafe { tiles_bf16(dst, packed, w, (m, n, k), k0, accumulate || k0 > 0) };
        }
    };
    PACKED_PAIRS.with(|p| match p.try_borrow_mut() {
        Ok(mut packed) => with_packed(&mut packed),
        Err(_) => with_packed(&mut Vec::new()),
    });
}

/// `a`'s `m` rows packed as bf16 pairs ([`pack_pairs`]), one buffer per depth chunk of
/// [`DEPTH`]: packed once for every task of a product split by columns.
fn pack_all_pairs(a: &[f32], a_stride: usize, m: usize, k: usize) -> Vec<Vec<u32>> {
    (0..k)
        .step_by(DEPTH)
        .map(|k0| {
            let mut packed = Vec::new();
            pack_pairs(a, a_stride, m, k0, DEPTH.min(k - k0), &mut packed);
            packed
        })
        .collect()
}

/// The tiles of [`matmul_t_bf16`] for the depth chunk from `k0`, over its packed panels
/// `packed`: written over `dst` or (`add`) added to it.
///
/// # Safety
/// As for [`matmul_t_bf16`]; `packed` holds the chunk's panels of `a`'s `m` rows.
unsafe fn tiles_bf16(dst: Dst, packed: &[u32], w: &[bf16], (m, n, k): (usize, usize, usize), k0: usize, add: bool) {
    let depth = DEPTH.min(k - k0);
    let pairs = depth.div_ceil(2);
    // On AMX the whole tiles of 32 steps of the weight's whole 16-row blocks; their steps past
    // those added here; every other column (all of them without AMX) here.
    let steps = amx::whole_steps(depth);
    let done = match steps {
        0 => 0,
        // SAFETY: as this function's; `steps` is `amx::whole_steps(depth)`, within the panels.
        _ => unsafe { amx::tiles(dst, packed, pairs, w, (m, n, k), (k0, steps), add) },
    };
    let panels = Panels { packed, pairs };
    if done > 0 && steps < depth {
        // SAFETY: as this function's, for columns below `done ≤ n` and steps within the chunk.
        unsafe { tiles_bf16_steps(dst, panels, w, (m, k), 0..done, (k0 + steps, depth - steps), true) };
    }
    // SAFETY: as this function's.
    unsafe { tiles_bf16_steps(dst, panels, w, (m, k), done..n, (k0, depth), add) };
}

/// A depth chunk's packed panels: each `pairs` pair steps of [`PANEL`] rows.
#[derive(Clone, Copy)]
struct Panels<'a> {
    packed: &'a [u32],
    pairs: usize,
}

/// The AVX512_BF16 tiles of [`tiles_bf16`] for the columns `cols` and the `depth` steps from
/// `from` (an even step into the chunk that starts at the panels' first), written over `dst` or
/// (`add`) added to it.
///
/// # Safety
/// As for [`tiles_bf16`]; `cols` lies within the weight's rows and the steps within the chunk.
unsafe fn tiles_bf16_steps(
    dst: Dst,
    Panels { packed, pairs }: Panels,
    w: &[bf16],
    (m, k): (usize, usize),
    cols: std::ops::Range<usize>,
    (from, depth): (usize, usize),
    add: bool,
) {
    // The panels' pair step where `from` lies (the chunk starts at a multiple of DEPTH).
    let skip = (from % DEPTH) / 2;
    let steps = depth.div_ceil(2);
    for c0 in cols.clone().step_by(CHUNK) {
        let chunk_end = cols.end.min(c0 + CHUNK);
        for_each_tile((m, cols.end), c0..chunk_end, (dst, add), |p, j0, out| {
            let panel = &packed[(p * pairs + skip) * PANEL..][..PANEL * steps];
            let w_rows: [&[bf16]; COLS] = std::array::from_fn(|c| &w[(j0 + c.min(out.cols - 1)) * k + from..][..depth]);
            // SAFETY: a `Bf16Products` weight exists only where `bf16_products_available()`
            // holds (AVX-512F and AVX512_BF16); the panel holds `steps` pair steps and every
            // weight row `depth` values; `out` covers rows < m and columns below `cols.end` of
            // `dst`. A last panel of 16 rows or fewer computes only them. The first panel's
            // tiles read the weights from memory; each asks for the next tile's rows as it
            // runs. Later panels find them in cache.
            let ahead = if p == 0 { COLS * k } else { 0 };
            unsafe {
                if out.rows <= HALF_PANEL {
                    tile_bf16::<1>(depth, panel, &w_rows, ahead, out)
                } else {
                    tile_bf16::<2>(depth, panel, &w_rows, ahead, out)
                }
            };
        });
    }
}

/// `tile(p, j0, out)` for every panel `p` of [`PANEL`] rows of the `m` and every tile of
/// [`COLS`] columns from `j0` in the chunk `cols` (of `n`): `out` is the tile's window of the
/// output `dst`, written over or (`add`) added to.
fn for_each_tile(
    (m, n): (usize, usize),
    cols: std::ops::Range<usize>,
    (dst, add): (Dst, bool),
    mut tile: impl FnMut(usize, usize, Out),
) {
    for p in 0..m.div_ceil(PANEL) {
        for j0 in cols.clone().step_by(COLS) {
            let out = Out {
                // SAFETY: row `p · PANEL` < m and column `j0` < n lie inside the output, whose
                // size the product's callers asserted.
                at: unsafe { dst.at.add(p * PANEL * dst.stride + j0) },
                stride: dst.stride,
                rows: PANEL.min(m - p * PANEL),
                cols: COLS.min(n - j0),
                add,
            };
            tile(p, j0, out);
        }
    }
}

/// Where a tile's results go: `rows` × `cols` values from `at`, rows `stride` apart, written
/// over or (`add`) added to what is there.
struct Out {
    at: *mut f32,
    stride: usize,
    rows: usize,
    cols: usize,
    add: bool,
}

/// One tile: `Σ_s panel[s][r] · w[c][s]` over `depth` steps for the panel's rows `r` and the
/// twelve weight rows `c`, into `out`.
///
/// # Safety
/// The CPU must have AVX-512F; `panel` holds `depth · PANEL` values and every `w[c]` `depth`;
/// `out.rows` rows of `out.cols` values from `out.at` (`out.stride` apart) are writable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tile(depth: usize, panel: &[f32], w: &[&[f32]; COLS], out: Out) {
    use std::arch::x86_64::*;
    debug_assert!(panel.len() >= depth * PANEL && w.iter().all(|r| r.len() >= depth));
    let p = panel.as_ptr();
    let wp: [*const f32; COLS] = std::array::from_fn(|c| w[c].as_ptr());
    let mut acc = [[_mm512_setzero_ps(); 2]; COLS];
    for s in 0..depth {
        // SAFETY: `s < depth`, within `panel` and every weight row.
        unsafe {
            let x0 = _mm512_loadu_ps(p.add(s * PANEL));
            let x1 = _mm512_loadu_ps(p.add(s * PANEL + 16));
            for c in 0..COLS {
                let b = _mm512_set1_ps(*wp[c].add(s));
                acc[c][0] = _mm512_fmadd_ps(x0, b, acc[c][0]);
                acc[c][1] = _mm512_fmadd_ps(x1, b, acc[c][1]);
            }
        }
    }
    // SAFETY: as this function's.
    unsafe { store(&acc, out) }
}

/// Writes a tile's accumulators (`acc[c][h]`: column `c` of rows `16h..16h + 16`) into `out`.
///
/// # Safety
/// The CPU must have AVX-512F; `out.rows` rows of `out.cols` values from `out.at`
/// (`out.stride` apart) are writable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn store(acc: &[[std::arch::x86_64::__m512; 2]; COLS], out: Out) {
    use std::arch::x86_64::*;
    // Each half's accumulators hold a column per vector; transposed, a row per vector.
    let lanes: __mmask16 = (1u16 << out.cols) - 1;
    for half in 0..out.rows.div_ceil(16).min(2) {
        let mut v = [_mm512_setzero_ps(); 16];
        for (v, a) in v.iter_mut().zip(acc) {
            *v = a[half];
        }
        transpose16(&mut v);
        for (r, row) in v.iter().enumerate().take(out.rows.saturating_sub(half * 16)) {
            // SAFETY: row `half · 16 + r` < `out.rows`, columns below `out.cols` (the mask).
            unsafe {
                let at = out.at.add((half * 16 + r) * out.stride);
                let sum = if out.add {
                    _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, at), *row)
                } else {
                    *row
                };
                _mm512_mask_storeu_ps(at, lanes, sum);
            }
        }
    }
}

/// Rows of a panel in one vector of f32: a tile of `VECS = 1` computes only them.
const HALF_PANEL: usize = PANEL / 2;

/// Pairs of bf16 values in a 64-byte cache line.
const PAIRS_PER_LINE: usize = 16;

/// [`tile`] in bf16 products: `Σ_s panel[s][r] · (w[c][2s], w[c][2s + 1])` over `depth` steps
/// (`depth / 2` pairs, an odd last step paired with zero), two steps per `vdpbf16ps`.
///
/// # Safety
/// The CPU must have AVX-512F and AVX512_BF16; `panel` holds `⌈depth / 2⌉ · PANEL` pairs and every
/// `w[c]` `depth` values; `out` as for [`tile`], with at most [`HALF_PANEL`] rows when `VECS`
/// is 1 (the panel's first vector of rows, all a decoding batch's last panel may hold: a whole
/// panel's products for them were up to half wasted).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn tile_bf16<const VECS: usize>(depth: usize, panel: &[u32], w: &[&[bf16]; COLS], ahead: usize, out: Out) {
    use std::arch::x86_64::*;
    let pairs = depth.div_ceil(2);
    debug_assert!(panel.len() >= pairs * PANEL && w.iter().all(|r| r.len() >= depth));
    let p = panel.as_ptr();
    let wp: [*const half::bf16; COLS] = std::array::from_fn(|c| w[c].as_ptr());
    let mut acc = [[_mm512_setzero_ps(); 2]; COLS];
    let bh = |v: __m512i| -> __m512bh {
        // SAFETY: both are 64 bytes of plain bits.
        unsafe { std::mem::transmute(v) }
    };
    for s in 0..depth / 2 {
        if ahead > 0 && s % PAIRS_PER_LINE == 0 {
            // The next tile's weights, `ahead` values on in memory, asked for a line at a time
            // while this one computes (a prefetch never faults, past the end included).
            for row in wp {
                _mm_prefetch::<_MM_HINT_T1>(row.wrapping_add(ahead + 2 * s).cast());
            }
        }
        // SAFETY: `s < pairs`, within `panel`; values `2s, 2s + 1` lie within every weight row
        // (read unaligned: a row of odd length starts mid-word).
        unsafe {
            let x0 = bh(_mm512_loadu_si512(p.add(s * PANEL).cast()));
            let x1 = bh(_mm512_loadu_si512(p.add(s * PANEL + HALF_PANEL).cast()));
            for c in 0..COLS {
                let pair = wp[c].add(2 * s).cast::<i32>().read_unaligned();
                let b = bh(_mm512_set1_epi32(pair));
                acc[c][0] = _mm512_dpbf16_ps(acc[c][0], x0, b);
                if VECS == 2 {
                    acc[c][1] = _mm512_dpbf16_ps(acc[c][1], x1, b);
                }
            }
        }
    }
    if depth % 2 == 1 {
        let s = depth / 2;
        // SAFETY: the last pair step is within `panel`, the last value within every row.
        unsafe {
            let x0 = bh(_mm512_loadu_si512(p.add(s * PANEL).cast()));
            let x1 = bh(_mm512_loadu_si512(p.add(s * PANEL + HALF_PANEL).cast()));
            for c in 0..COLS {
                let b = bh(_mm512_set1_epi32(i32::from((*wp[c].add(2 * s)).to_bits())));
                acc[c][0] = _mm512_dpbf16_ps(acc[c][0], x0, b);
                if VECS == 2 {
                    acc[c][1] = _mm512_dpbf16_ps(acc[c][1], x1, b);
                }
            }
        }
    }
    // SAFETY: as this function's.
    unsafe { store(&acc, out) }
}

/// Never called: [`available`] is false off x86-64.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn tile(_: usize, _: &[f32], _: &[&[f32]; COLS], _: Out) {
    unreachable!("sgemm::available() is false off x86-64")
}

/// Never called: [`bf16_products_available`] is false off x86-64.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn tile_bf16<const VECS: usize>(_: usize, _: &[u32], _: &[&[bf16]; COLS], _: usize, _: Out) {
    unreachable!("no `Bf16Products` weight exists off x86-64")
}

pub(crate) mod amx;
mod few;
mod pack;
mod pairs;
pub(crate) use pairs::{matmul_t_bf16_rows, matmul_t_bf16_rows_to_bf16, Bf16Rows};
mod transpose;
pub(crate) use transpose::transposed_u16;

#[cfg(test)]
mod tests;
