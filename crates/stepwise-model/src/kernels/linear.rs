//! Dense layers `y = x·wᵀ + b`, with a weight-streaming kernel for the few-row products of
//! decoding.
//!
//! A general matmul packs its right-hand side into cache-sized panels before multiplying. For the
//! 1–16 rows of a decoding step that packing is a full copy of every weight matrix per token, and
//! it costs more than the multiplication (a profile of 0.5B-shaped decoding spent most of its time
//! there). Here each weight row is read once, straight from where it is stored, and dotted with
//! every input row while it is in L1; the inputs stay in cache throughout. Many rows (scoring,
//! training, prefill) go to candle's matmul as before.

use super::simd::{self, Kernel, LANES};
use super::weights::WeightSlice;
use candle_core::{CpuStorage, CustomOp2, DType, Layout, Shape, Tensor};
use half::bf16;
use rayon::prelude::*;

/// Inputs with at most this many rows take the weight-streaming kernel...
pub const MAX_STREAMED_ROWS: usize = 16;
/// ...when their rows are at least this long (below it, summing each dot product's lanes costs
/// more than the packing it saves, and candle's matmul is faster).
pub const MIN_STREAMED_DEPTH: usize = 256;

/// A dense layer: weight `[out, in]` (PyTorch's layout) and an optional bias `[out]`.
#[derive(Clone, Debug)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
    bf16_products: bool,
}

impl Linear {
    /// From a weight `[out, in]` and an optional bias `[out]`; a bf16 weight multiplies in bf16
    /// where the CPU can ([`Linear::set_bf16_products`]).
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Self {
        Linear {
            weight,
            bias,
            bf16_products: true,
        }
    }

    /// Whether a bf16 weight multiplies in bf16 (with f32 sums) on CPUs with AVX512_BF16
    /// (`true`, as built), or is widened to f32 for its products (`false`: the numbers of the
    /// weight converted to f32, at bf16's memory). Part of the loaded model's
    /// [`crate::Precision`].
    pub fn set_bf16_products(&mut self, on: bool) {
        self.bf16_products = on;
    }

    /// See [`Linear::set_bf16_products`].
    pub fn bf16_products(&self) -> bool {
        self.bf16_products
    }

    /// The weight `[out, in]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The bias `[out]`, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// `weight` `[out, in]` (and `bias` `[out]` when `bias`) under `vb`, initialised as candle's
    /// `linear` does when `vb` creates variables.
    pub fn load(vb: candle_nn::VarBuilder, in_dim: usize, out_dim: usize, bias: bool) -> candle_core::Result<Self> {
        let l = if bias {
            candle_nn::linear(in_dim, out_dim, vb)?
        } else {
            candle_nn::linear_no_bias(in_dim, out_dim, vb)?
        };
        Ok(Linear::new(l.weight().clone(), l.bias().cloned()))
    }

    /// `x·wᵀ + b` for `x` `[.., in]`. `differentiable` (training) always takes candle's matmul,
    /// which records a backward pass; the weight-streaming kernel records none.
    pub fn forward(&self, x: &Tensor, differentiable: bool) -> candle_core::Result<Tensor> {
        let (out, inp) = self.weight.dims2()?;
        let lead = &x.dims()[..x.rank() - 1];
        let rows: usize = lead.iter().product();
        // Inference on f32 rows on the CPU: the product ops below apply.
        let ops = !differentiable && x.device().is_cpu() && x.dtype() == DType::F32;
        let narrow = matches!(self.weight.dtype(), DType::BF16 | DType::F16);
        let streamed = ops
            && rows <= MAX_STREAMED_ROWS
            && inp >= MIN_STREAMED_DEPTH
            && (narrow || self.weight.dtype() == DType::F32);
        let y2 = if streamed {
            x.reshape((rows, inp))?
                .contiguous()?
                .apply_op2_no_bwd(
                    &self.weight.contiguous()?,
                    &StreamedMatmul {
                        bf16_products: self.bf16_products,
                    },
                )?
        } else if ops && narrow && super::sgemm::available() {
            // More rows than the streaming kernel takes, with a bf16/f16 weight: the AVX-512
            // tiles, which read it as it is held (never a widened copy of the whole matrix).
            x.reshape((rows, inp))?
                .contiguous()?
                .apply_op2_no_bwd(
                    &self.weight.contiguous()?,
                    &TiledMatmul {
                        bf16_products: self.bf16_products,
                    },
                )?
        } else {
            // A weight held in bf16/f16 is widened for this product only.
            let w = self.weight.to_dtype(x.dtype())?;
            x.reshape((rows, inp))?.matmul(&w.t()?)?
        };
        let y2 = match &self.bias {
            Some(b) => super::add_bias(&y2, b)?,
            None => y2,
        };
        let mut shape = lead.to_vec();
        shape.push(out);
        y2.reshape(shape)
    }
}

/// `x [m, k] · w [n, k]ᵀ → [m, n]`, streaming `w` once (a bf16 `w` in bf16 products when
/// `bf16_products` and the CPU can).
struct StreamedMatmul {
    bf16_products: bool,
}

/// Weight rows of an f16 weight widened to f32 at a time by the streaming kernel (they stay in L2
/// while every input row is dotted with them).
const WIDENED_ROWS: usize = 16;

/// Dot products of a block of weight rows (f32 or bf16) with every input row, written as
/// `[rows of w, m]`.
struct Dots<'a> {
    x: &'a [f32],
    w: WeightSlice<'a>,
    k: usize,
    out: &'a mut [f32],
}

/// Two weight rows against four input rows: eight accumulators, six loads per eight
/// multiply-adds. Portable build (the compiler's own vectorisation).
#[inline(always)]
fn dot_2x4_portable<W: Weight>(w: [&[W]; 2], x: [&[f32]; 4]) -> [[f32; 4]; 2] {
    let k = w[0].len();
    let full = k / LANES * LANES;
    let mut acc = [[[0f32; LANES]; 4]; 2];
    for c in (0..full).step_by(LANES) {
        for (a, wr) in acc.iter_mut().zip(&w) {
            for (ar, xr) in a.iter_mut().zip(&x) {
                for l in 0..LANES {
                    ar[l] += wr[c + l].widen() * xr[c + l];
                }
            }
        }
    }
    finish(w, x, full, acc)
}

/// Sums the lane accumulators and adds the products past the last whole lane.
#[inline(always)]
fn finish<W: Weight>(w: [&[W]; 2], x: [&[f32]; 4], full: usize, acc: [[[f32; LANES]; 4]; 2]) -> [[f32; 4]; 2] {
    let mut out = [[0f32; 4]; 2];
    for (j, wr) in w.iter().enumerate() {
        for (i, xr) in x.iter().enumerate() {
            let tail: f32 = (full..wr.len()).map(|c| wr[c].widen() * xr[c]).sum();
            out[j][i] = simd::sum(&acc[j][i]) + tail;
        }
    }
    out
}

/// [`dot_2x4_portable`] with AVX2 + FMA intrinsics (the compiler does not keep eight vector
/// accumulators in registers on its own); bf16 rows are widened in registers, eight values per
/// 16-byte load (half the bytes read, the same sums in the same order as the rows widened first).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_2x4_avx2<W: Weight>(w: [&[W]; 2], x: [&[f32]; 4]) -> [[f32; 4]; 2] {
    use std::arch::x86_64::*;
    let k = w[0].len();
    assert!(w[1].len() == k && x.iter().all(|r| r.len() == k));
    let full = k / LANES * LANES;
    let mut acc = [_mm256_setzero_ps(); 8];
    let mut c = 0;
    while c < full {
        // SAFETY: every row has k ≥ c + LANES elements.
        unsafe {
            let w0 = W::load8(w[0].as_ptr().add(c));
            let w1 = W::load8(w[1].as_ptr().add(c));
            for i in 0..4 {
                let xv = _mm256_loadu_ps(x[i].as_ptr().add(c));
                acc[i] = _mm256_fmadd_ps(w0, xv, acc[i]);
                acc[4 + i] = _mm256_fmadd_ps(w1, xv, acc[4 + i]);
            }
        }
        c += LANES;
    }
    let mut lanes = [[[0f32; LANES]; 4]; 2];
    for (n, a) in acc.iter().enumerate() {
        // SAFETY: the destination holds exactly LANES f32.
        unsafe { _mm256_storeu_ps(lanes[n / 4][n % 4].as_mut_ptr(), *a) };
    }
    finish(w, x, full, lanes)
}

/// A weight value the streaming kernels read as f32: f32 itself, or bf16 (an f32's top half,
/// widened in registers).
trait Weight: Copy {
    /// One value as f32.
    fn widen(self) -> f32;
    /// Eight values from `p`, as f32.
    ///
    /// # Safety
    /// AVX2; `p` points at eight readable values.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
    /// Sixteen values from `p`, as f32.
    ///
    /// # Safety
    /// AVX-512F; `p` points at sixteen readable values.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;
}

impl Weight for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        // SAFETY: forwarded to the caller.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const f32) -> std::arch::x86_64::__m512 {
        // SAFETY: forwarded to the caller.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(p) }
    }
}

impl Weight for bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load8(p: *const bf16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: forwarded to the caller; eight bf16 are 16 bytes.
        unsafe {
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(
                p.cast(),
            ))))
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const bf16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: forwarded to the caller; sixteen bf16 are 32 bytes.
        unsafe {
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
                p.cast(),
            ))))
        }
    }
}

/// Two weight rows (f32, or bf16 widened in registers: half the bytes read) against four input
/// rows in sixteen lanes: the kernel of CPUs with AVX-512, where the AVX2 one is bound by its
/// eight-lane multiply-adds. An f32 weight and the same values held in bf16 give the same bits.
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dot_2x4_avx512<W: Weight>(w: [&[W]; 2], x: [&[f32]; 4]) -> [[f32; 4]; 2] {
    use std::arch::x86_64::*;
    let k = w[0].len();
    assert!(w[1].len() == k && x.iter().all(|r| r.len() == k));
    let full = k / 16 * 16;
    let mut acc = [_mm512_setzero_ps(); 8];
    let mut c = 0;
    while c < full {
        // The weight rows two pairs on (where a matrix's rows follow each other), fetched
        // while these are multiplied: the rows are streamed from memory once, and without the
        // hint each pair's first loads wait for it; one pair ahead was too close (the 0.5B
        // shape's decoding products: 30-32 ms a step against 27; a prefetch of an address past
        // the matrix is a no-op, never a fault).
        _mm_prefetch::<_MM_HINT_T0>(w[0].as_ptr().wrapping_add(4 * k + c).cast());
        _mm_prefetch::<_MM_HINT_T0>(w[1].as_ptr().wrapping_add(4 * k + c).cast());
        // SAFETY: every row has k ≥ c + 16 elements.
        unsafe {
            let w0 = W::load16(w[0].as_ptr().add(c));
            let w1 = W::load16(w[1].as_ptr().add(c));
            for i in 0..4 {
                let xv = _mm512_loadu_ps(x[i].as_ptr().add(c));
                acc[i] = _mm512_fmadd_ps(w0, xv, acc[i]);
                acc[4 + i] = _mm512_fmadd_ps(w1, xv, acc[4 + i]);
            }
        }
        c += 16;
    }
    let mut out = [[0f32; 4]; 2];
    for (j, wr) in w.iter().enumerate() {
        for (i, xr) in x.iter().enumerate() {
            let tail: f32 = wr[full..].iter().zip(&xr[full..]).map(|(a, b)| a.widen() * b).sum();
            out[j][i] = _mm512_reduce_add_ps(acc[4 * j + i]) + tail;
        }
    }
    out
}

#[inline(always)]
fn dot_2x4<const FMA: bool, W: Weight>(w: [&[W]; 2], x: [&[f32]; 4]) -> [[f32; 4]; 2] {
    #[cfg(target_arch = "x86_64")]
    if FMA {
        // SAFETY: `FMA` builds run only where `simd::dispatch` found AVX2 and FMA.
        return unsafe { dot_2x4_avx2(w, x) };
    }
    dot_2x4_portable(w, x)
}

impl Dots<'_> {
    /// Every pair of weight rows of `w` against every four input rows, by `dot`.
    #[inline(always)]
    fn each<T>(self, w: &[T], dot: impl Fn([&[T]; 2], [&[f32]; 4]) -> [[f32; 4]; 2]) {
        each_pair(w, self.k, self.x, self.k, self.out, dot)
    }
}

/// Every pair of the rows of `w` (`k` values each) against every four rows of `x` (`kx` values
/// each), by `dot`, into `out` as `[rows of w, rows of x]`.
#[inline(always)]
fn each_pair<T, X>(
    w: &[T],
    k: usize,
    x: &[X],
    kx: usize,
    out: &mut [f32],
    dot: impl Fn([&[T]; 2], [&[X]; 4]) -> [[f32; 4]; 2],
) {
    let m = x.len() / kx;
    let xrow = |i: usize| &x[i.min(m - 1) * kx..][..kx];
    let n = w.len() / k;
    let wrow = |j: usize| &w[j.min(n - 1) * k..][..k];
    for j in (0..n).step_by(2) {
        for i in (0..m).step_by(4) {
            let d = dot([wrow(j), wrow(j + 1)], [xrow(i), xrow(i + 1), xrow(i + 2), xrow(i + 3)]);
            for (jj, dj) in d.iter().enumerate().take(n - j) {
                for (ii, v) in dj.iter().enumerate().take(m - i) {
                    out[(j + jj) * m + i + ii] = *v;
                }
            }
        }
    }
}

/// Two bf16 weight rows against four input rows rounded to bf16 (as pairs of neighbouring
/// values, see [`super::tiles::to_bf16_pairs`]): one `vdpbf16ps` per 32 values of a weight row
/// and an input row, f32 sums; the weight rows are read as they lie, never widened. (Eight
/// input rows a pass, each weight row loaded once for a decoding step's eight rows, was slower:
/// the 0.5B shape's products took 32-33 ms a step instead of 27, `cargo bench -p
/// stepwise-model -- decode`.)
///
/// # Safety
/// The CPU must support AVX-512F and AVX512_BF16; every `x[i]` holds `⌈k / 2⌉` pairs for rows
/// of `k` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn dot_2x4_bf16(w: [&[half::bf16]; 2], x: [&[u32]; 4]) -> [[f32; 4]; 2] {
    use std::arch::x86_64::*;
    let k = w[0].len();
    assert!(w[1].len() == k && x.iter().all(|r| r.len() == k.div_ceil(2)));
    let bh = |v: __m512i| -> __m512bh {
        // SAFETY: both are 64 bytes of plain bits.
        unsafe { std::mem::transmute(v) }
    };
    let full = k / 32 * 32;
    let mut acc = [[_mm512_setzero_ps(); 4]; 2];
    let mut c = 0;
    while c < full {
        // The rows two pairs on, as in `dot_2x4_avx512`.
        _mm_prefetch::<_MM_HINT_T0>(w[0].as_ptr().wrapping_add(4 * k + c).cast());
        _mm_prefetch::<_MM_HINT_T0>(w[1].as_ptr().wrapping_add(4 * k + c).cast());
        // SAFETY: weight rows hold k ≥ c + 32 values, input rows k / 2 ≥ c / 2 + 16 pairs.
        unsafe {
            let w0 = bh(_mm512_loadu_si512(w[0].as_ptr().add(c).cast()));
            let w1 = bh(_mm512_loadu_si512(w[1].as_ptr().add(c).cast()));
            for i in 0..4 {
                let xv = bh(_mm512_loadu_si512(x[i].as_ptr().add(c / 2).cast()));
                acc[0][i] = _mm512_dpbf16_ps(acc[0][i], w0, xv);
                acc[1][i] = _mm512_dpbf16_ps(acc[1][i], w1, xv);
            }
        }
        c += 32;
    }
    let value = |pairs: &[u32], c: usize| half::bf16::from_bits((pairs[c / 2] >> (16 * (c % 2))) as u16).to_f32();
    let mut out = [[0f32; 4]; 2];
    for (j, wr) in w.iter().enumerate() {
        for (i, xr) in x.iter().enumerate() {
            let tail: f32 = (full..k).map(|c| wr[c].to_f32() * value(xr, c)).sum();
            out[j][i] = _mm512_reduce_add_ps(acc[j][i]) + tail;
        }
    }
    out
}

impl Kernel for Dots<'_> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        #[cfg(target_arch = "x86_64")]
        if FMA && simd::has_avx512() {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return match self.w {
                WeightSlice::F32(w) => self.each(w, |w, x| unsafe { dot_2x4_avx512(w, x) }),
                WeightSlice::Bf16(w) | WeightSlice::Bf16Products(w) => {
                    self.each(w, |w, x| unsafe { dot_2x4_avx512(w, x) })
                }
                WeightSlice::F16(_) => unreachable!("f16 rows are widened before they reach Dots"),
            };
        }
        match self.w {
            WeightSlice::F32(w) => self.each(w, dot_2x4::<FMA, f32>),
            WeightSlice::Bf16(w) | WeightSlice::Bf16Products(w) => self.each(w, dot_2x4::<FMA, bf16>),
            WeightSlice::F16(_) => unreachable!("f16 rows are widened before they reach Dots"),
        }
    }
}

impl CustomOp2 for StreamedMatmul {
    fn name(&self) -> &'static str {
        "streamed-matmul"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, w, (m, n, k)) = operands(self.name(), (xs, xl), (ws, wl), self.bf16_products)?;
        Ok((CpuStorage::F32(streamed_matmul(x, (m, n, k), w)), Shape::from((m, n))))
    }
}

/// A product op's operands: `x` `[m, k]` in f32, a contiguous weight `[n, k]`, and `(m, n, k)`.
type Operands<'a> = (&'a [f32], WeightSlice<'a>, (usize, usize, usize));

/// The operands of a product op (a bf16 weight in bf16 products when `bf16_products` and the
/// CPU can); errors name the op (`name`).
fn operands<'a>(
    name: &str,
    (xs, xl): (&'a CpuStorage, &Layout),
    (ws, wl): (&'a CpuStorage, &Layout),
    bf16_products: bool,
) -> candle_core::Result<Operands<'a>> {
    let x = super::f32_slice(xs, xl, name)?;
    let w = WeightSlice::from_storage(ws, wl, bf16_products)
        .ok_or_else(|| candle_core::Error::Msg(format!("{name}: the weight must be contiguous f32, bf16 or f16")))?;
    let (m, k) = xl.shape().dims2()?;
    let (n, k2) = wl.shape().dims2()?;
    if k != k2 {
        candle_core::bail!("{name}: inner sizes differ ({k} vs {k2})");
    }
    Ok((x, w, (m, n, k)))
}

/// `x [m, k] · w [n, k]ᵀ` as `[m, n]` by the weight-streaming kernels: each weight row read once
/// and dotted with every row of `x` (few rows: decoding, short prompts).
pub(crate) fn streamed_matmul(x: &[f32], (m, n, k): (usize, usize, usize), w: WeightSlice) -> Vec<f32> {
    // `[n, m]` first (each task owns whole weight rows), then transposed to `[m, n]`.
    let mut yt = vec![0f32; n * m];
    // A block of weight rows against every input row: bf16 rows widened in registers, f16
    // rows WIDENED_ROWS at a time (reading half the bytes of f32 is what makes them faster).
    // In bf16 products (a `Bf16Products` weight): the input rows as bf16 pairs, once.
    let pairs: Option<Vec<u32>> = matches!(w, WeightSlice::Bf16Products(_)).then(|| {
        let mut pairs = vec![0u32; m * k.div_ceil(2)];
        for (row, dst) in x.chunks_exact(k).zip(pairs.chunks_exact_mut(k.div_ceil(2))) {
            // SAFETY: a `Bf16Products` weight exists only with AVX-512F and AVX512_BF16; `dst`
            // holds ⌈k / 2⌉.
            unsafe { super::tiles::to_bf16_pairs(row, dst) };
        }
        pairs
    });
    let dots = |out: &mut [f32], w: WeightSlice| match (w, &pairs) {
        #[cfg(target_arch = "x86_64")]
        (WeightSlice::Bf16Products(w), Some(pairs)) => {
            // SAFETY: `pairs` exist only for a `Bf16Products` weight (AVX512_BF16); rows of
            // ⌈k / 2⌉ pairs.
            each_pair(w, k, pairs, k.div_ceil(2), out, |w, x| unsafe { dot_2x4_bf16(w, x) })
        }
        (WeightSlice::F32(_) | WeightSlice::Bf16(_) | WeightSlice::Bf16Products(_), _) => {
            simd::dispatch(Dots { x, w, k, out })
        }
        (WeightSlice::F16(_), _) => w.for_each_f32_block(w.len() / k, WIDENED_ROWS, |first, w| {
            let rows = w.len() / k;
            simd::dispatch(Dots {
                x,
                w: WeightSlice::F32(w),
                k,
                out: &mut out[first * m..(first + rows) * m],
            })
        }),
    };
    let mut y = vec![0f32; m * n];
    // Each task transposes its own block of columns into `y` (a pass over the whole output on
    // one thread was a sequential share of every decoding step).
    let place = |first: usize, block: &[f32], y: Output| {
        for (j, col) in block.chunks_exact(m).enumerate() {
            for (i, &v) in col.iter().enumerate() {
                // SAFETY: `i < m` and `first + j < n` lie in `y`; tasks own disjoint columns.
                unsafe { *y.0.add(i * n + first + j) = v };
            }
        }
    };
    let out = Output(y.as_mut_ptr());
    if m * n * k < super::PARALLEL_MIN_WORK {
        dots(&mut yt, w);
        place(0, &yt, out);
    } else {
        let block = 64.max(n.div_ceil(8 * rayon::current_num_threads()).next_multiple_of(2));
        yt.par_chunks_mut(block * m).enumerate().for_each(|(i, part)| {
            dots(part, w.slice(i * block * k..((i + 1) * block).min(n) * k));
            place(i * block, part, out);
        });
    }
    y
}

/// The output of [`streamed_matmul`], written by its tasks at disjoint positions.
#[derive(Clone, Copy)]
struct Output(*mut f32);
// SAFETY: the tasks write disjoint elements (their own columns) of one live allocation, which
// outlives them (`for_each` returns only after every task).
unsafe impl Send for Output {}
unsafe impl Sync for Output {}

/// `x [m, k] · w [n, k]ᵀ → [m, n]` in [`super::sgemm`]'s tiles (AVX-512), a block of weight
/// rows per task: for a narrow (bf16/f16) weight and more rows than [`StreamedMatmul`] takes (a
/// bf16 weight in bf16 products when `bf16_products` and the CPU can).
struct TiledMatmul {
    bf16_products: bool,
}

impl CustomOp2 for TiledMatmul {
    fn name(&self) -> &'static str {
        "tiled-matmul"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, w, (m, n, k)) = operands(self.name(), (xs, xl), (ws, wl), self.bf16_products)?;
        let tasks = 4 * rayon::current_num_threads();
        let y = super::sgemm::matmul_t_by_columns_new(x, k, w, (m, n, k), tasks);
        Ok((CpuStorage::F32(y), Shape::from((m, n))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn streamed_rows_match_the_matmul() {
        let dev = Device::Cpu;
        for (m, k, n) in [
            (1, 256, 96),
            (3, 300, 5),
            (8, 517, 129),
            (16, 256, 1),
            (8, 64, 10),
            (5, 999, 7),
            (40, 300, 150),
            (17, 64, 3),
        ] {
            let x = Tensor::randn(0f32, 1.0, (m, k), &dev).unwrap();
            let w = Tensor::randn(0f32, 1.0, (n, k), &dev).unwrap();
            let b = Tensor::randn(0f32, 1.0, n, &dev).unwrap();
            let layer = Linear::new(w.clone(), Some(b.clone()));
            let got = layer
                .forward(&x.unsqueeze(0).unwrap(), false)
                .unwrap()
                .squeeze(0)
                .unwrap();
            let want = x.matmul(&w.t().unwrap()).unwrap().broadcast_add(&b).unwrap();
            let diff = crate::kernels::tests::close(&got, &want);
            assert!(diff < 1e-4, "m {m} k {k} n {n}: {diff}");
            // Held in bf16 or f16: the same products as the widened weight.
            for dtype in [DType::BF16, DType::F16] {
                let narrow = w.to_dtype(dtype).unwrap();
                let widened = narrow.to_dtype(DType::F32).unwrap();
                let run = |w: &Tensor| {
                    Linear::new(w.clone(), Some(b.clone()))
                        .forward(&x.unsqueeze(0).unwrap(), false)
                        .unwrap()
                };
                let streamed = k >= MIN_STREAMED_DEPTH && m <= MAX_STREAMED_ROWS;
                let tiled = m > MAX_STREAMED_ROWS || k < MIN_STREAMED_DEPTH;
                if dtype == DType::BF16 && crate::kernels::sgemm::bf16_products_available() && (streamed || tiled) {
                    // Multiplied in bf16: the inputs rounded to bf16 against the same weights.
                    let rounded = x.to_dtype(DType::BF16).unwrap().to_dtype(DType::F32).unwrap();
                    let want = rounded
                        .matmul(&widened.t().unwrap())
                        .unwrap()
                        .broadcast_add(&b)
                        .unwrap();
                    let diff = crate::kernels::tests::close(&run(&narrow).squeeze(0).unwrap(), &want);
                    assert!(diff < 1e-4, "m {m} k {k} n {n} in bf16 products: {diff}");
                    continue;
                }
                // The same products; the tiles (more rows, or short ones) sum them in their own
                // order, the streaming kernel in the widened weight's.
                let diff = crate::kernels::tests::close(&run(&narrow), &run(&widened));
                let tolerance = if tiled { 1e-4 } else { 0.0 };
                assert!(diff <= tolerance, "m {m} k {k} n {n} {dtype:?}: {diff}");
            }
        }
    }

    #[test]
    fn portable_and_vector_builds_agree() {
        let row = |n: usize, s: usize| -> Vec<f32> { (0..n).map(|i| ((i * s) % 13) as f32 - 6.0).collect() };
        let w: Vec<Vec<f32>> = (1..3).map(|s| row(43, s)).collect();
        let x: Vec<Vec<f32>> = (3..7).map(|s| row(43, s)).collect();
        let ws = [w[0].as_slice(), w[1].as_slice()];
        let xs = [x[0].as_slice(), x[1].as_slice(), x[2].as_slice(), x[3].as_slice()];
        let portable = dot_2x4_portable(ws, xs);
        for j in 0..2 {
            for i in 0..4 {
                let want: f32 = w[j].iter().zip(&x[i]).map(|(a, b)| a * b).sum();
                assert_eq!(portable[j][i], want);
            }
        }
        let mut fast = None;
        simd::dispatch(Probe(&mut fast, ws, xs));
        assert_eq!(fast.unwrap(), portable);
    }

    struct Probe<'a>(&'a mut Option<[[f32; 4]; 2]>, [&'a [f32]; 2], [&'a [f32]; 4]);
    impl Kernel for Probe<'_> {
        fn run<const FMA: bool>(self) {
            *self.0 = Some(dot_2x4::<FMA, f32>(self.1, self.2));
        }
    }

    #[test]
    fn the_differentiable_path_keeps_the_gradient() {
        let dev = Device::Cpu;
        let w = candle_core::Var::randn(0f32, 1.0, (4, 256), &dev).unwrap();
        let x = Tensor::randn(0f32, 1.0, (2, 256), &dev).unwrap();
        let y = Linear::new(w.as_tensor().clone(), None).forward(&x, true).unwrap();
        let grads = y.sum_all().unwrap().backward().unwrap();
        assert!(grads.get(w.as_tensor()).is_some());
    }
}
