//! Vectorisable inner loops for the fused kernels, and the switch that runs them with AVX2 + FMA
//! when the CPU has them (the crate is built for baseline x86-64, so without the switch LLVM may
//! only use SSE2 and never fuses multiply-adds).
//!
//! Each loop is written over fixed-width lanes (`[f32; LANES]` accumulators) so that LLVM turns it
//! into vector code without fast-math: the order of floating-point operations is fixed by the
//! source, which also keeps results identical from run to run.

/// Lanes of the accumulators (one AVX register of f32).
pub const LANES: usize = 8;

/// `a · b + c`, fused when `FMA` (compiled only where the CPU has FMA).
#[inline(always)]
pub fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// `eˣ` to about 2 ulp for `x ≤ 88` (Cephes' polynomial on a range reduced by ln 2); inputs below
/// −87.3 (including −∞) give exactly 0. Branch-free, so loops over it vectorise.
#[inline(always)]
pub fn exp<const FMA: bool>(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const LO: f32 = -87.336_55;
    let xc = x.clamp(LO, 88.376_26);
    let n = madd::<FMA>(xc, LOG2E, 0.5).floor();
    let r = madd::<FMA>(n, -LN2_LO, madd::<FMA>(n, -LN2_HI, xc));
    let mut p = 1.987_569_1e-4;
    p = madd::<FMA>(p, r, 1.398_199_9e-3);
    p = madd::<FMA>(p, r, 8.333_452e-3);
    p = madd::<FMA>(p, r, 4.166_579_6e-2);
    p = madd::<FMA>(p, r, 1.666_666_5e-1);
    p = madd::<FMA>(p, r, 0.5);
    let y = madd::<FMA>(p, r * r, r) + 1.0;
    // 2ⁿ from its exponent bits; n + 127 ∈ [0, 255] is an integer, read from the mantissa of
    // 2²³ + n + 127 (a float-to-int cast would not vectorise).
    let biased = (n + (127.0 + 8_388_608.0)).to_bits() & 0x7f_ffff;
    let scale = f32::from_bits(biased << 23);
    if x < LO {
        0.0
    } else {
        y * scale
    }
}

/// Replaces each `x` of `xs` by `e^(x − max)` and returns their sum.
#[inline(always)]
pub fn exp_sub_sum<const FMA: bool>(xs: &mut [f32], max: f32) -> f32 {
    for x in xs.iter_mut() {
        *x = exp::<FMA>(*x - max);
    }
    sum(xs)
}

/// [`exp_sub_sum`] in one pass, sixteen lanes at a time (one AVX-512 register, two AVX ones);
/// the same values, summed in another order.
#[inline(always)]
pub fn exp_sub_sum_one_pass<const FMA: bool>(xs: &mut [f32], max: f32) -> f32 {
    const WIDE: usize = 16;
    let mut acc = [0f32; WIDE];
    let mut chunks = xs.chunks_exact_mut(WIDE);
    for c in &mut chunks {
        for l in 0..WIDE {
            c[l] = exp::<FMA>(c[l] - max);
            acc[l] += c[l];
        }
    }
    let mut tail = 0.0;
    for x in chunks.into_remainder() {
        *x = exp::<FMA>(*x - max);
        tail += *x;
    }
    sum(&acc) + tail
}

/// The sum of `xs` in lane-wise partial sums (so it vectorises).
#[inline(always)]
pub fn sum(xs: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for l in 0..LANES {
            acc[l] += c[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `Σ x²` in lane-wise partial sums (so it vectorises).
#[inline(always)]
pub fn sum_of_squares<const FMA: bool>(xs: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().map(|x| x * x).sum();
    for c in chunks {
        for l in 0..LANES {
            acc[l] = madd::<FMA>(c[l], c[l], acc[l]);
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// The largest element of `xs` (−∞ when empty).
#[inline(always)]
pub fn max(xs: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks.remainder().iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    for c in chunks {
        for l in 0..LANES {
            // A plain comparison (one vector max); f32::max's NaN handling costs a blend.
            acc[l] = if c[l] > acc[l] { c[l] } else { acc[l] };
        }
    }
    acc.iter().fold(tail, |m, &x| m.max(x))
}

/// `Σ a[i] · b[i]` over the shorter of the two, in fixed lanes.
#[inline(always)]
pub fn dot<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (ca, cb) = (a[..n].chunks_exact(LANES), b[..n].chunks_exact(LANES));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    let mut acc = [0f32; LANES];
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] = madd::<FMA>(x[l], y[l], acc[l]);
        }
    }
    sum(&acc) + tail
}

/// `y += a · x`.
#[inline(always)]
pub fn axpy<const FMA: bool>(a: f32, x: &[f32], y: &mut [f32]) {
    for (yv, xv) in y.iter_mut().zip(x) {
        *yv = madd::<FMA>(a, *xv, *yv);
    }
}

/// `y += a₀·x₀ + a₁·x₁ + a₂·x₂ + a₃·x₃` (one load and store of `y` for four products).
///
/// Sixteen values at a time, then eight, in loops of fixed width that the compiler keeps in
/// vector registers however short `y` is (one loop over all of `y` was vectorised for long rows
/// only, and ran a value at a time on a decoding step's few dozen keys); the same arithmetic per
/// value whichever loop computes it.
#[inline(always)]
pub fn axpy4<const FMA: bool>(a: [f32; 4], x: [&[f32]; 4], y: &mut [f32]) {
    let n = y.len();
    let x = x.map(|r| &r[..n]);
    let sixteens = axpy4_fixed::<FMA, 16>(a, x, y, 0);
    let eights = axpy4_fixed::<FMA, 8>(a, x, y, sixteens);
    axpy4_fixed::<FMA, 1>(a, x, y, eights);
}

/// [`axpy4`] over whole chunks of `W` values from `from`; returns where they end.
#[inline(always)]
fn axpy4_fixed<const FMA: bool, const W: usize>(a: [f32; 4], x: [&[f32]; 4], y: &mut [f32], from: usize) -> usize {
    let end = from + (y.len() - from) / W * W;
    for (i, ys) in (from..end).step_by(W).zip(y[from..end].chunks_exact_mut(W)) {
        let ys: &mut [f32; W] = ys.try_into().expect("W values");
        let xs: [[f32; W]; 4] = x.map(|r| *<&[f32; W]>::try_from(&r[i..i + W]).expect("W values"));
        // In registers: no store to `y` between the loads of `x`.
        let mut acc = *ys;
        for (x, a) in xs.iter().zip(a) {
            for l in 0..W {
                acc[l] = madd::<FMA>(a, x[l], acc[l]);
            }
        }
        *ys = acc;
    }
    end
}

/// `y = Σⱼ pⱼ · rowⱼ(v)` for rows of `D` values (`y` is overwritten). Two independent sets of
/// accumulators held in registers, so consecutive rows do not wait on each other.
#[inline(always)]
pub fn weighted_rows<const FMA: bool, const D: usize>(p: &[f32], v: &[f32], y: &mut [f32]) {
    let (mut even, mut odd) = ([0f32; D], [0f32; D]);
    let mut pairs = p.chunks_exact(2).zip(v.chunks_exact(2 * D));
    for (pp, vv) in &mut pairs {
        for c in 0..D {
            even[c] = madd::<FMA>(pp[0], vv[c], even[c]);
            odd[c] = madd::<FMA>(pp[1], vv[D + c], odd[c]);
        }
    }
    if p.len() % 2 == 1 {
        let (last, row) = (p[p.len() - 1], &v[(p.len() - 1) * D..][..D]);
        for c in 0..D {
            even[c] = madd::<FMA>(last, row[c], even[c]);
        }
    }
    for c in 0..D {
        y[c] = even[c] + odd[c];
    }
}

/// `y = Σⱼ pⱼ · rowⱼ(v)` for rows of `y.len()` values, with the row width fixed at compile time
/// for the usual head sizes.
#[inline(always)]
pub fn weighted_sum<const FMA: bool>(p: &[f32], v: &[f32], y: &mut [f32]) {
    match y.len() {
        16 => weighted_rows::<FMA, 16>(p, v, y),
        32 => weighted_rows::<FMA, 32>(p, v, y),
        64 => weighted_rows::<FMA, 64>(p, v, y),
        128 => weighted_rows::<FMA, 128>(p, v, y),
        d => {
            y.fill(0.0);
            for (&pj, row) in p.iter().zip(v.chunks_exact(d)) {
                axpy::<FMA>(pj, row, y);
            }
        }
    }
}

/// A loop nest to run with the widest vector instructions this CPU has: implement `run` with
/// `#[inline(always)]`, built from the helpers above with the `FMA` it is given, and call
/// [`dispatch`].
pub trait Kernel {
    /// The work, compiled once per instruction set.
    fn run<const FMA: bool>(self);
}

/// Runs `kernel` compiled for AVX2 + FMA when this CPU has them, else for the baseline.
pub fn dispatch<K: Kernel>(kernel: K) {
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: the CPU has just been checked for AVX-512F/VL, AVX2 and FMA.
        return unsafe { run_avx512(kernel) };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has just been checked for AVX2 and FMA.
        return unsafe { run_avx2(kernel) };
    }
    kernel.run::<false>()
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_avx2<K: Kernel>(kernel: K) {
    kernel.run::<true>()
}

/// # Safety
/// The CPU must support AVX-512F/VL, AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn run_avx512<K: Kernel>(kernel: K) {
    kernel.run::<true>()
}

/// Whether this CPU runs the AVX-512 build of the kernels (AVX-512F and VL besides AVX2 + FMA).
pub(crate) fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        has_avx2_fma()
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU runs the AVX2 + FMA builds of the kernels.
fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_accurate_and_exactly_zero_far_below() {
        let mut worst = 0f32;
        for i in -8700..=8800 {
            let x = i as f32 / 100.0;
            for got in [exp::<false>(x), exp::<true>(x)] {
                let want = x.exp();
                worst = worst.max(((got - want) / want).abs());
            }
        }
        assert!(worst < 3e-7, "relative error {worst}");
        assert_eq!(exp::<false>(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp::<false>(-100.0), 0.0);
        assert_eq!(exp::<false>(0.0), 1.0);
    }

    #[test]
    fn weighted_sums_agree_for_every_width() {
        for d in [16, 32, 64, 128, 24] {
            for n in [1, 2, 7] {
                let p: Vec<f32> = (0..n).map(|j| 0.1 + j as f32).collect();
                let v: Vec<f32> = (0..n * d).map(|i| ((i * 31) % 17) as f32 - 8.0).collect();
                let mut y = vec![9f32; d];
                weighted_sum::<false>(&p, &v, &mut y);
                for c in 0..d {
                    let want: f32 = (0..n).map(|j| p[j] * v[j * d + c]).sum();
                    assert!((y[c] - want).abs() < 1e-4, "d {d} n {n}");
                }
            }
        }
    }

    #[test]
    fn reductions_match_plain_loops() {
        let xs: Vec<f32> = (0..37).map(|i| ((i * 7919) % 101) as f32 / 10.0 - 5.0).collect();
        assert_eq!(max(&xs), xs.iter().cloned().fold(f32::NEG_INFINITY, f32::max));
        let mut ys = xs.clone();
        let m = max(&xs);
        let sum = exp_sub_sum::<false>(&mut ys, m);
        let want: f32 = xs.iter().map(|x| (x - m).exp()).sum();
        assert!((sum - want).abs() < 1e-5 * want);
        for (y, x) in ys.iter().zip(&xs) {
            assert!((y - (x - m).exp()).abs() < 1e-6);
        }
        let mut zs = xs.clone();
        let one_pass = exp_sub_sum_one_pass::<false>(&mut zs, m);
        assert!((one_pass - sum).abs() < 1e-5 * sum);
        assert_eq!(zs, ys);
    }
}
