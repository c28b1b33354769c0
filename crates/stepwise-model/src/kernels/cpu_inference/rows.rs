//! Row-wise pieces of a layer: projections (AVX-512 tiles, else gemm), RMSNorm, SwiGLU, rotary
//! positions.

use crate::kernels::linear::streamed_matmul;
use crate::kernels::weights::WeightSlice;
use crate::kernels::{sgemm, simd, MAX_STREAMED_ROWS, MIN_STREAMED_DEPTH};

/// Rows of `width` values, `stride` apart, at the start of `data`.
pub(super) struct Rows<'a> {
    data: &'a mut [f32],
    stride: usize,
    width: usize,
}

impl<'a> Rows<'a> {
    pub(super) fn new(data: &'a mut [f32], stride: usize, width: usize) -> Self {
        Rows { data, stride, width }
    }
}

/// Rows per thread below which threads sharing a sequence leave the split to gemm.
const MIN_ROWS_PER_THREAD: usize = 32;

/// Weight rows widened to f32 at a time when the weight is stored in bf16 or f16 (128 rows of
/// Qwen2.5-0.5B's widest input, 4,864 values, take 2.4 MiB).
const WIDENED_ROWS: usize = 128;

/// `dst = a · wᵀ` (or `dst += a · wᵀ` when `accumulate`) for `a` rows of `k` values `a_stride`
/// apart and `w` `[dst.width, k]`: one row of `dst` per row of `a`. A thread's share runs in
/// [`sgemm`]'s tiles where they suit `k`, else in gemm's kernels; a bf16 or f16 weight is
/// widened to f32 [`WIDENED_ROWS`] rows at a time, unless it multiplies in bf16
/// ([`sgemm::bf16_products_available`]), which always runs in the tiles.
pub(super) fn matmul_t(
    dst: Rows,
    a: &[f32],
    a_stride: usize,
    w: WeightSlice,
    accumulate: bool,
    parallelism: gemm::Parallelism,
) {
    let n = dst.width;
    let k = w.len() / n;
    let m = dst.data.len().checked_sub(n).map_or(0, |rest| rest / dst.stride + 1);
    assert!(m == 0 || (a.len() >= (m - 1) * a_stride + k && dst.data.len() >= (m - 1) * dst.stride + n));
    if m == 0 {
        return;
    }
    if m <= MAX_STREAMED_ROWS && k >= MIN_STREAMED_DEPTH && sgemm::multiplies_in_bf16(&w) {
        // A few rows (a short prompt) in bf16: the decode kernel, which reads each weight row
        // once for all of them, where a tile would compute a whole panel of 32 rows.
        let contiguous: std::borrow::Cow<[f32]> = if a_stride == k {
            std::borrow::Cow::Borrowed(&a[..m * k])
        } else {
            std::borrow::Cow::Owned(a.chunks(a_stride).take(m).flat_map(|row| &row[..k]).copied().collect())
        };
        let y = streamed_matmul(&contiguous, (m, n, k), w);
        for (row, src) in dst.data.chunks_mut(dst.stride).zip(y.chunks_exact(n)) {
            if accumulate {
                row[..n].iter_mut().zip(src).for_each(|(d, s)| *d += s);
            } else {
                row[..n].copy_from_slice(src);
            }
        }
        return;
    }
    if let gemm::Parallelism::Rayon(threads) = parallelism {
        // Threads sharing one sequence take a block of rows each: gemm's own split of a few
        // hundred rows ran at half the speed of one sequence per thread.
        let per_thread = m.div_ceil(threads.max(1));
        if threads > 1 && per_thread < MIN_ROWS_PER_THREAD && sgemm::suits(k, &w) {
            // Too few rows to split (a short prompt): a block of the weight's rows each.
            let (stride, n) = (dst.stride, dst.width);
            return sgemm::matmul_t_by_columns(dst.data, stride, a, a_stride, w, (m, n, k), accumulate, threads);
        }
        if threads > 1 && per_thread >= MIN_ROWS_PER_THREAD {
            use rayon::prelude::*;
            let (dst_stride, width) = (dst.stride, dst.width);
            dst.data
                .par_chunks_mut(per_thread * dst_stride)
                .zip(a.par_chunks(per_thread * a_stride))
                .for_each(|(rows, a)| {
                    let block = Rows::new(rows, dst_stride, width);
                    matmul_t(block, a, a_stride, w, accumulate, gemm::Parallelism::None)
                });
            return;
        }
    }
    let stride = dst.stride;
    // Products in bf16 are only in the tiles (here, when one thread runs the product).
    if sgemm::multiplies_in_bf16(&w) || (matches!(parallelism, gemm::Parallelism::None) && sgemm::suits(k, &w)) {
        return sgemm::matmul_t(dst.data, stride, a, a_stride, w, (m, n, k), accumulate);
    }
    w.for_each_f32_block(n, WIDENED_ROWS, |first, w| {
        let cols = w.len() / k;
        matmul_t_f32(
            &mut dst.data[first..],
            stride,
            (m, cols, k),
            a,
            a_stride,
            w,
            accumulate,
            parallelism,
        )
    });
}

/// [`matmul_t`] by gemm for an f32 weight `[n, k]` into `m` rows of `dst` (`stride` apart, `n`
/// wide).
#[allow(clippy::too_many_arguments)]
fn matmul_t_f32(
    dst: &mut [f32],
    stride: usize,
    (m, n, k): (usize, usize, usize),
    a: &[f32],
    a_stride: usize,
    w: &[f32],
    accumulate: bool,
    parallelism: gemm::Parallelism,
) {
    assert!(dst.len() >= (m - 1) * stride + n && w.len() >= n * k);
    // SAFETY: the asserted bounds keep every access inside `dst`, `a` and `w`; `dst` is borrowed
    // mutably, so it overlaps neither input.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            stride as isize,
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
pub(super) fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
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
pub(super) struct SwiGluRows<'a> {
    pub(super) rows: &'a mut [f32],
    pub(super) width: usize,
}

impl simd::Kernel for SwiGluRows<'_> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        for row in self.rows.chunks_exact_mut(2 * self.width) {
            let (gate, up) = row.split_at_mut(self.width);
            crate::kernels::swiglu_into::<FMA>(gate, up);
        }
    }
}

/// Rotary positions on the first `width` values (the q and k heads) of every row, row `i` at
/// position `i`, heads of `d` values in the half-split layout of Qwen2/Llama.
pub(super) fn rotate(rows: &mut [f32], stride: usize, width: usize, d: usize, cos: &[f32], sin: &[f32]) {
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
